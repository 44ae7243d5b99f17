"""``moir cov estimate|merge|export|import``: C statistics of a corpus, shardable over jobs, merged
without overlap, and exchanged with the MEMIT / AlphaEdit / EasyEdit statistics caches.

Thin commands over :func:`moir_lib.covariance.estimate` (eq. (memoir_estimator); with the split-half
agreement of :mod:`moir_lib.covariance.convergence`),
:meth:`moir_lib.covariance.CovarianceStats.merge_all` (after :func:`~moir_lib.covariance.check_disjoint`)
and :mod:`moir_lib.covariance.interop`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from moir_lib.cli.args import parse_shard
from moir_lib.covariance import PRECISIONS, CovarianceStats, EstimationSettings, check_disjoint, estimate
from moir_lib.covariance.interop import FILE_PRECISIONS, FORMATS

__all__ = ["add_parser"]


def _cmd_cov_estimate(args: argparse.Namespace) -> int:
    from moir_lib.documents import load_corpus
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
    if args.target is not None and not args.target > 0:
        raise ValueError(f"--target must be a positive gap, got {args.target}")
    corpus = load_corpus(args.corpus, n=args.n, seed=args.seed, shard=shard)
    corpus.check()  # a generation directory must be what its manifest says, before the model loads
    halves = _half_points(corpus.count()) if args.split_half else ()
    loaded = load(profile, device=args.device)
    tokens_per_batch = args.tokens_per_batch or profile.covariance.tokens_per_batch
    settings = EstimationSettings(tokens_per_batch=tokens_per_batch, precision=args.precision)
    stats = estimate(loaded, corpus, list(profile.edit_layers), settings, progress=not args.quiet,
                     prefixes=halves)
    if halves:
        stats.metadata["split_half"] = _split_half(stats, halves, profile, args.target)
        print(stats.metadata["split_half"]["text"])
    stats.save(out)
    print(f"moir cov estimate: {stats.n_tokens} keys per layer at layers {list(stats.layers)} -> {out}")
    return 0


def _half_points(n_documents: int) -> tuple[int, ...]:
    """The prefixes split halves read: half the corpus, and half of that (the trend); none below 4."""
    if n_documents < 4:
        print(f"moir cov estimate: {n_documents} documents are too few for split halves", file=sys.stderr)
        return ()
    half = -(-n_documents // 2)
    return (-(-half // 2), half)


def _split_half(stats: CovarianceStats, halves: tuple[int, ...], profile: Any, target: float | None
                ) -> dict[str, Any]:
    """The split-half agreement of ``stats`` (and of its first half, the trend) at AlphaEdit's τ."""
    from moir_lib.covariance.convergence import DEFAULT_TARGET, split_half

    target = DEFAULT_TARGET if target is None else target
    a = profile.alphaedit
    quarter, half = halves
    n = int(stats.metadata["corpus"][0]["documents"])
    whole = split_half(stats, stats.prefixes[half], (half, n), tau=a.tau, tau_mode=a.tau_mode)
    record = whole.to_dict(target)
    first = split_half(stats.prefixes[half], stats.prefixes[quarter], (quarter, half), tau=a.tau,
                       tau_mode=a.tau_mode)
    record["first_half"] = first.to_dict(target)
    record["text"] += (f" In the first half alone the halves' gap was {first.gap:.4f}: 1/√n sampling "
                       f"error would bring it down by about 2× per doubling.")
    return record


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
    out = Path(args.out)
    replaced = [p for p in paths if out.exists() and p.samefile(out)]
    merged = CovarianceStats.merge_all(shards)
    merged.save(out)
    print(f"moir cov merge: {len(shards)} shards, {merged.n_tokens} keys per layer -> {out}")
    if replaced:  # the input is gone: say so where the user looks, not only in the log
        print(f"moir cov merge: note: --out {out} is the input {replaced[0]}: that file now holds the merge "
              f"of all {len(shards)} shards and its own statistics are gone (a second merge with the same "
              f"shards is refused as an overlap)", file=sys.stderr)
    return 0


def _cmd_cov_export(args: argparse.Namespace) -> int:
    from moir_lib.covariance import interop

    if args.tau is not None and args.format == "memit":
        raise ValueError("--tau writes AlphaEdit's projectors: use --format alphaedit or easyedit")
    stats = CovarianceStats.load(args.stats)
    mom2 = interop.Mom2Hparams(dataset=args.dataset, n_samples=args.n_samples, precision=args.precision)
    export = interop.export_stats(stats, args.out, model_name=args.model_name, fmt=args.format, mom2=mom2,
                                  module_template=args.module_template, layers=args.layers)
    if args.tau is not None:
        from moir_lib.editing.alphaedit import null_space_projector

        layers = export.hparams["layers"]
        projectors = {}
        for layer in layers:
            projectors[layer], info = null_space_projector(stats.mean(layer), args.tau, "absolute")
            print(f"layer {layer}: null space of dimension {info['null_dim']} of {info['d']} "
                  f"(τ = {args.tau:g})")
        path = Path(args.out) / interop.PROJECTOR_FILE
        export.projectors = interop.save_projectors(projectors, layers, path)
    for layer, path in export.files.items():
        print(f"layer {layer}: {path}")
    print("\n".join(export.lines()))
    return 0


def _cmd_cov_import(args: argparse.Namespace) -> int:
    from moir_lib.covariance import interop

    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise ValueError(f"--out must name a .safetensors file, got {out}")
    stats = interop.import_stats(args.dir, model=args.model_name, dataset=args.dataset,
                                 precision=args.precision, n_samples=args.n_samples, layers=args.layers)
    stats.save(out)
    print(f"moir cov import: layers {list(stats.layers)}, {stats.n_tokens} tokens per layer "
          f"({stats.metadata['imported']['precision']} files) -> {out}")
    return 0


def _seed(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed must be an integer or none, got {text!r}") from None


def _layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"layers must be comma-separated integers, got {text!r}") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``moir cov estimate|merge|export|import``: C statistics of a corpus, shardable over jobs, merged
    without overlap, and exchanged with the MEMIT / AlphaEdit / EasyEdit statistics caches."""
    p = sub.add_parser("cov", help="estimate C statistics (shardable), merge disjoint shards, export/import "
                                   "MEMIT/AlphaEdit/EasyEdit statistics")
    cov = p.add_subparsers(dest="cov_command", required=True, metavar="ACTION")
    e = cov.add_parser("estimate", help="C at a profile's edit layers over a corpus (or one shard of it)")
    e.add_argument("--profile", required=True, help="data/profiles/<NAME>.yaml or a YAML path")
    e.add_argument("--device", default=None, help="e.g. cuda, cpu, auto (default: where the model loads)")
    e.add_argument("--corpus", required=True,
                   help="corpus spec: HF dataset (org/name:config), local file/folder, pocket:<domain>, "
                        "or a `moir generate` generation directory")
    e.add_argument("--n", type=int, help="documents to use (default: all)")
    e.add_argument("--seed", type=_seed, default=0,
                   help="document sampling seed; none: the source order (default 0: a seeded random order)")
    e.add_argument("--shard", help="i/n: documents i, i+n, ... only (merge the n shards afterwards)")
    e.add_argument("--tokens-per-batch", type=int, help="default: the profile's (paper: 12 288)")
    e.add_argument("--precision", choices=["auto", *PRECISIONS], default="auto",
                   help="batch products: float64, float32, or tf32 (exact products of half-precision keys, "
                        "float32 within a batch); auto: tf32 for half-precision models on CUDA, else float64")
    e.add_argument("--out", required=True, help="statistics file (.safetensors)")
    e.add_argument("--no-split-half", dest="split_half", action="store_false",
                   help="skip the convergence diagnostic (the split-half agreement of the corpus's first "
                        "and second half on the subspace AlphaEdit protects; it holds another d×d sum per "
                        "layer in memory while the pass crosses half the corpus)")
    e.add_argument("--target", type=float, help="the split-half gap (mean sin² of the principal angles) "
                                                "below which half the corpus sufficed (default 0.01)")
    e.add_argument("-q", "--quiet", action="store_true")
    e.set_defaults(func=_cmd_cov_estimate)
    m = cov.add_parser("merge",
                       help="sum shard statistics (float64); refuses mismatched or overlapping shards")
    m.add_argument("shards", nargs="+", help="statistics files from `moir cov estimate --shard`")
    m.add_argument("--out", required=True)
    m.set_defaults(func=_cmd_cov_merge)
    x = cov.add_parser("export", help="write statistics as the layer_stats cache that MEMIT, AlphaEdit and "
                                      "EasyEdit read, and print the hyper-parameter lines")
    x.add_argument("stats", help="statistics file (.safetensors)")
    x.add_argument("--format", required=True, choices=FORMATS,
                   help="memit / alphaedit: their repositories (cache under globals.yml's STATS_DIR); "
                        "easyedit: EasyEdit (cache under the hparams' stats_dir)")
    x.add_argument("--model-name", required=True,
                   help="the name the editor loads the model by (its config._name_or_path), e.g. "
                        "meta-llama/Llama-3.1-8B-Instruct")
    x.add_argument("--out", required=True, help="the statistics root (STATS_DIR / stats_dir)")
    x.add_argument("--dataset", default="moir", help="the editor's mom2_dataset (default: moir)")
    x.add_argument("--n-samples", type=int,
                   help="the editor's mom2_n_samples (default: the documents the statistics cover)")
    x.add_argument("--precision", choices=FILE_PRECISIONS, default="float64",
                   help="the editor's mom2_dtype (default float64: the sums as estimated)")
    x.add_argument("--module-template", help="key module with {} for the layer (default: the statistics' key "
                                             "site, e.g. model.layers.{}.mlp.down_proj)")
    x.add_argument("--layers", type=_layers, help="comma-separated layers (default: all held)")
    x.add_argument("--tau", type=float, help="also write AlphaEdit's null-space projectors for this absolute "
                                             "threshold τ (nullspace_threshold) as null_space_project.pt")
    x.set_defaults(func=_cmd_cov_export)
    i = cov.add_parser("import", help="read a MEMIT/AlphaEdit/EasyEdit statistics directory into a "
                                      "statistics file")
    i.add_argument("dir", help="statistics root, model folder or <dataset>_stats folder")
    i.add_argument("--out", required=True, help="statistics file (.safetensors)")
    i.add_argument("--model-name", help="only this model's folder (needed when the root holds several)")
    i.add_argument("--dataset", help="only this mom2_dataset")
    i.add_argument("--precision", choices=("float64", "float32", "float16"),
                   help="only files of this mom2_dtype")
    i.add_argument("--n-samples", type=int, help="only files of this mom2_n_samples")
    i.add_argument("--layers", type=_layers, help="comma-separated layers (default: every layer found)")
    i.set_defaults(func=_cmd_cov_import)
