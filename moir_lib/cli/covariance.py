"""``moir cov estimate|merge``: C statistics of a corpus, shardable over jobs, merged without overlap.

Thin commands over :func:`moir_lib.covariance.estimate` (eq. (memoir_estimator)) and
:meth:`moir_lib.covariance.CovarianceStats.merge_all` (after :func:`~moir_lib.covariance.check_disjoint`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moir_lib.cli.args import parse_shard
from moir_lib.covariance import PRECISIONS, CovarianceStats, check_disjoint, estimate

__all__ = ["add_parser"]


def _cmd_cov_estimate(args: argparse.Namespace) -> int:
    from moir_lib.corpora import load_corpus
    from moir_lib.models import load
    from moir_lib.profiles import load_profile

    for name, value in (("--tokens-per-batch", args.tokens_per_batch), ("--n", args.n)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise ValueError(f"--out must name a .safetensors file, got {out}")
    profile = load_profile(args.profile)
    shard = parse_shard(args.shard)
    corpus = load_corpus(args.corpus, n=args.n, seed=args.seed, shard=shard)
    loaded = load(profile, device=args.device)
    stats = estimate(loaded, corpus, list(profile.edit_layers),
                     tokens_per_batch=args.tokens_per_batch or profile.covariance.tokens_per_batch,
                     progress=not args.quiet, precision=args.precision)
    stats.save(out)
    print(f"moir cov estimate: {stats.n_tokens} keys per layer at layers {list(stats.layers)} -> {out}")
    return 0


def _cmd_cov_merge(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.shards]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"shard file(s) not found: {', '.join(missing)}")
    shards = [CovarianceStats.load(p) for p in paths]
    bad = [f"{p}: {'; '.join(d)}" for p, s in zip(paths[1:], shards[1:], strict=True)
           if (d := shards[0].identity_differences(s))]
    if bad:
        listing = "\n  ".join(bad)
        raise ValueError(f"shards differ from {paths[0]} and cannot be merged exactly:\n  {listing}")
    check_disjoint(shards, [str(p) for p in paths])
    merged = CovarianceStats.merge_all(shards)
    merged.save(args.out)
    print(f"moir cov merge: {len(shards)} shards, {merged.n_tokens} keys per layer -> {args.out}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``moir cov estimate|merge``: C statistics of a corpus, shardable over jobs, merged without overlap."""
    p = sub.add_parser("cov", help="estimate C statistics (shardable) and merge disjoint shards")
    cov = p.add_subparsers(dest="cov_command", required=True, metavar="ACTION")
    e = cov.add_parser("estimate", help="C at a profile's edit layers over a corpus (or one shard of it)")
    e.add_argument("--profile", required=True, help="data/profiles/<NAME>.yaml or a YAML path")
    e.add_argument("--device", default=None, help="e.g. cuda, cpu, auto (default: where the model loads)")
    e.add_argument("--corpus", required=True,
                   help="corpus spec: HF dataset (org/name:config), local file/folder, pocket:<domain>, "
                        "or a `moir generate` run directory")
    e.add_argument("--n", type=int, help="documents to use (default: all)")
    e.add_argument("--seed", type=int, default=0, help="document sampling seed")
    e.add_argument("--shard", help="i/n: documents i, i+n, ... only (merge the n shards afterwards)")
    e.add_argument("--tokens-per-batch", type=int, help="default: the profile's (paper: 12 288)")
    e.add_argument("--precision", choices=["auto", *PRECISIONS], default="auto",
                   help="batch products: float64, float32, or tf32 (exact products of half-precision keys, "
                        "float32 within a batch); auto: tf32 for half-precision models on CUDA, else float64")
    e.add_argument("--out", required=True, help="statistics file (.safetensors)")
    e.add_argument("-q", "--quiet", action="store_true")
    e.set_defaults(func=_cmd_cov_estimate)
    m = cov.add_parser("merge",
                       help="sum shard statistics (float64); refuses mismatched or overlapping shards")
    m.add_argument("shards", nargs="+", help="statistics files from `moir cov estimate --shard`")
    m.add_argument("--out", required=True)
    m.set_defaults(func=_cmd_cov_merge)
