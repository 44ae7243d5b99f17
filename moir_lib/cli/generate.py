"""``moir generate``: self-generate (a shard of) a profile's corpus, resumably (Algorithm 1).

A thin command over :func:`moir_lib.generation.self_generate` (``--backend vllm``: through
:mod:`moir_lib.vllm_backend`; ``--until-converged``: the stop rule of :mod:`moir_lib.generation.stopping`).
"""

from __future__ import annotations

import argparse

from moir_lib.cli.args import parse_shard
from moir_lib.generation import LOOPS, GenerationSettings, check_shard, parse_seed_strategy, self_generate

__all__ = ["add_parser"]


def _cmd_generate(args: argparse.Namespace) -> int:
    from moir_lib.locks import writable_dir
    from moir_lib.models import load
    from moir_lib.profiles import load_profile

    profile = load_profile(args.profile)
    g = profile.generation
    strategy = args.strategy or g.seed_strategy
    parse_seed_strategy(strategy)
    shard = parse_shard(args.shard)
    n_samples = args.n_samples if args.n_samples is not None else g.n_samples
    max_new = args.max_new_tokens if args.max_new_tokens is not None else g.max_new_tokens
    batch = args.batch_size if args.batch_size is not None else g.batch_size
    for name, value in (("--n-samples", n_samples), ("--max-new-tokens", max_new), ("--batch-size", batch)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    stop = None
    if args.until_converged is not None:
        from moir_lib.generation.stopping import StopRule

        a = profile.alphaedit
        stop = StopRule(args.until_converged, args.check_from or 2 * batch, a.tau, a.tau_mode)
    layers = list(profile.edit_layers) if args.collect_keys or stop is not None else None
    writable_dir(args.out, "--out")
    check_shard(args.out, shard or (0, 1), n_samples)  # a damaged shard is named before the model loads
    engine = None
    if args.backend == "vllm":  # the HF weights only name the model (fingerprint, EOS): keep them on the CPU
        from moir_lib import vllm_backend

        try:
            vllm_backend.check_available()
        except RuntimeError as exc:  # the command line answers in one line, as for other setup errors
            raise ValueError(str(exc)) from None
        model, tokenizer, _ = load(profile, device="cpu")
        engine = vllm_backend.engine_for(model, revision=profile.revision)
    else:
        model, tokenizer, _ = load(profile, device=args.device)
    settings = GenerationSettings(strategy, n_samples, max_new, batch, seed=args.seed, collect_layers=layers,
                                  stop=stop, loop=args.loop, backend=args.backend)
    result = self_generate(model, tokenizer, settings, args.out, shard, progress=not args.quiet,
                           engine=engine)
    print(f"moir generate: shard {result.shard[0]}/{result.shard[1]} of {args.out}: {result.n_written} new "
          f"samples ({result.n_skipped} already there), {result.n_tokens} tokens in {result.seconds:.1f} s")
    if result.stopped:
        s = result.stopped
        how = (f"converged: stopped at {s['n_samples']} samples (half of them sufficed)" if s["converged"]
               else f"the budget of {s['budget']} samples ran out before the target was met")
        print(f"moir generate: {how}; split-half gap {s['gap']:.4g} (target {s['target']:g}), checks: "
              + ", ".join(f"{c['n_samples']}: {c['gap']:.4g}" for c in s["checks"]))
        print(s["text"])
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``moir generate``: self-generate (a shard of) a profile's corpus, resumably."""
    p = sub.add_parser("generate",
                       help="self-generate samples (Algorithm 1) into a sharded generation directory",
                       description="Self-generate samples with a profile's model. Shards (--shard i/n) may "
                                   "run as separate jobs over the same --out; rerunning resumes.")
    p.add_argument("--profile", required=True, help="data/profiles/<NAME>.yaml or a YAML path")
    p.add_argument("--device", default=None, help="e.g. cuda, cpu, auto (default: where the model loads)")
    p.add_argument("--strategy", help="bos | rand1..randK | prompt:<text> (default: the profile's)")
    p.add_argument("--n-samples", type=int, help="total samples over all shards (default: the profile's)")
    p.add_argument("--max-new-tokens", type=int, help="default: the profile's")
    p.add_argument("--batch-size", type=int, help="default: the profile's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard", help="i/n: generate indices i, i+n, ... only")
    p.add_argument("--collect-keys", action="store_true",
                   help="accumulate C at the profile's edit layers during generation")
    p.add_argument("--until-converged", type=float, metavar="GAP",
                   help="stop once C has converged: the split-half gap of the keys (mean sin² of the "
                        "principal angles of the subspace AlphaEdit protects at the profile's τ; e.g. 0.01) "
                        "is at most GAP, checked at --check-from samples and each doubling, and at "
                        "--n-samples (the budget); implies --collect-keys; one shard; the outcome goes into "
                        "the manifest")
    p.add_argument("--check-from", type=int, metavar="N",
                   help="the first check of --until-converged (a multiple of --batch-size; default two "
                        "batches)")
    p.add_argument("--backend", choices=["torch", "vllm"], default="torch",
                   help="torch: our sampler (deterministic per sample index, keys collectable); vllm: vLLM "
                        "with per-sample seeds (GPU only, pip install 'moir-lab[vllm]')")
    p.add_argument("--loop", choices=list(LOOPS), default="auto",
                   help="torch decode loop: dynamic KV cache, or static (pre-allocated, CUDA-graph captured "
                        "on GPU); auto: static on CUDA unless --collect-keys (same tokens either way)")
    p.add_argument("--out", required=True, help="generation directory shared by all shards")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=_cmd_generate)
