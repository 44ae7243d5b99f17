"""Editing speed: the null-space projector by ``eigh`` vs ``svd``, and MEMIT on a batch of edits.

Prints measured numbers (never pass/fail):

(a) AlphaEdit's projector ``P = Û Ûᵀ`` from ``torch.linalg.eigh`` (ours: ``C`` is symmetric) vs
    ``torch.linalg.svd`` (the AlphaEdit code's), on the *same* ``C`` in float64: the time ratio
    svd ÷ eigh (goal ≥ 2×) and ``max |P_eigh − P_svd|``. ``C`` is a per-token normalised second
    moment ``K Kᵀ / m`` of synthetic keys with a decaying spectrum (``m = d/2`` keys, so half of
    the spectrum is a true null space); τ is relative (1e-6 · λ_max). Sizes: the pocket key
    width (1024) and 4096 as a stand-in on CPU; 11 008 (OLMo-2-7B) and 14 336 (Llama-3.1-8B)
    with ``--device cuda``.
(b) MEMIT on a batch of ``--n-edits`` (default 1000) edits on the pocket model (a random model
    of its shape when it is not built; ``--model`` for another folder), split into its phases:
    context templates, the z optimisation (the profile's steps, over the plain prompt and
    ``--context-templates`` sampled prefixes), keys, the solves. Requests are synthetic (invented
    subjects and objects: the pocket CounterFact has fewer facts than 1000).

(c) MEMIT's z fitting for the pocket profile's batch of 100 CounterFact edits (the records, context
    prefixes and z settings the chapters and the pocket report's editability gate use), in one run:
    the full loop (the whole model at every step, as MEMIT's ``compute_z``) on one thread — the
    book's loop before the upper loop existed —, the upper loop (``compute_targets(loop="upper")``)
    on one thread and on every core; the wall-time ratios, and the largest relative difference of z
    and of the step counts from the full loop's.

    python benchmarks/editing.py --z-only         # (c) only
    python benchmarks/editing.py                  # CPU: d = 1024, 4096; MEMIT 1000 edits
    python benchmarks/editing.py --quick          # CPU: d = 1024 only; MEMIT 100 edits
    python benchmarks/editing.py --device cuda    # adds d = 11008, 14336
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def synthetic_covariance(d: int, device: str, seed: int = 0):
    """``K Kᵀ / m`` with ``m = d/2`` keys whose scales decay (rank d/2, condition ~1e4 on the range)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    m = d // 2
    scales = torch.logspace(0, -2, m, dtype=torch.float64)
    K = (torch.randn(d, m, generator=g, dtype=torch.float64) * scales).to(device)
    return (K @ K.T) / m


def projector_eigh(C, tau_rel: float):
    import torch

    evals, evecs = torch.linalg.eigh(C)
    U = evecs[:, evals < tau_rel * evals[-1]]
    return U @ U.T


def projector_svd(C, tau_rel: float):
    import torch

    U, S, _ = torch.linalg.svd(C, full_matrices=False)  # as the AlphaEdit code does
    U = U[:, S < tau_rel * S[0]]
    return U @ U.T


def bench_projector(d: int, device: str, repeat: int) -> None:
    C = synthetic_covariance(d, device)
    times = {}
    out = {}
    for name, fn in (("eigh", projector_eigh), ("svd", projector_svd)):
        best = float("inf")
        for _ in range(repeat):
            _sync(device)
            t = time.perf_counter()
            out[name] = fn(C, 1e-6)
            _sync(device)
            best = min(best, time.perf_counter() - t)
        times[name] = best
    diff = float((out["eigh"] - out["svd"]).abs().max())
    rank = int(round(float(out["eigh"].trace())))
    print(f"   d = {d:>6}: eigh {times['eigh']:8.3f} s   svd {times['svd']:8.3f} s   "
          f"svd/eigh = {times['svd'] / times['eigh']:5.2f}x (goal >= 2x)   "
          f"max|P_eigh - P_svd| = {diff:.2e}   null dim {rank}", flush=True)
    del C, out


SYLLABLES = "ka lo mi nu ri sa te vo zu bra ken dol fir gam hul jor kel mor nax pel qui rus tor".split()
TEMPLATES = ["{} is a citizen of", "{} works for", "The capital of {} is", "{} is located in", "{} plays the"]


def synthetic_requests(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def name(k: int) -> str:
        return "".join(rng.choice(SYLLABLES) for _ in range(k)).capitalize()

    return [{"case_id": i, "prompt": rng.choice(TEMPLATES), "subject": f"{name(3)} {name(2)}",
             "target_new": name(2)} for i in range(n)]


def pocket_or_random(device: str, spec: str | None = None):
    """The pocket model if it is built, else a random Llama of its shape (with the pocket tokenizer when
    available, else a tiny byte-level stand-in)."""
    from moir_lib import models

    if spec:
        return models.load(spec, device=device), spec
    try:
        from moir_lib.cache import entry_dir
        from moir_lib.pocket.build import cache_key, verify
        from moir_lib.pocket.variants import get_variant

        built = verify(entry_dir("pocket", cache_key(get_variant("pocket")))) is not None
    except ImportError:
        built = False
    if built:
        loaded = models.load("pocket", device=device)
        return loaded, "pocket"
    import torch
    import transformers

    from moir_lib.pocket.variants import get_variant

    spec = get_variant("pocket").model
    tok = None
    micro = None
    try:
        micro = models.load("pocket-micro")
        tok = micro.tokenizer
    except Exception as exc:  # noqa: BLE001
        print(f"   (no pocket tokenizer available: {exc})")
    if tok is None:
        raise SystemExit("neither the pocket model nor the micro pocket tokenizer is available: build "
                         "one with `moir pocket build micro`")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=spec.hidden_size,
                                   intermediate_size=spec.intermediate_size,
                                   num_hidden_layers=spec.num_layers,
                                   num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads,
                                   max_position_embeddings=spec.max_positions, bos_token_id=tok.bos_token_id,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = transformers.LlamaForCausalLM(cfg).eval().to(device)
    return models.LoadedModel(model, tok, models.ModelAdapter(model, tok, name="random-pocket-shape")), \
        "a random model of the pocket shape (pocket not built)"


def bench_memit(n_edits: int, device: str, chunk: int, model: str | None = None,
                n_templates: int = 5) -> None:
    import torch

    from moir_lib.editing import MemitEditor, ValueConfig, context_templates
    from moir_lib.profiles import load_profile

    profile = load_profile("pocket")
    loaded, what = pocket_or_random(device, model)
    adapter = loaded.adapter
    layers = list(profile.edit_layers)
    print(f"\n== (b) MEMIT, {n_edits} edits in one batch on {what}: layers {layers}, "
          f"key width {adapter.key_dim}, {profile.memit.v_num_grad_steps} z steps (lr {profile.memit.v_lr}), "
          f"z chunks of {chunk} groups, {n_templates} sampled context templates", flush=True)
    cov = {layer: synthetic_covariance(adapter.key_dim, "cpu", seed=layer) + 1e-3 * torch.eye(
        adapter.key_dim, dtype=torch.float64) for layer in layers}
    t = time.perf_counter()
    templates = context_templates(adapter, seed=0, use_cache=False)[: n_templates + 1]
    t_templates = time.perf_counter() - t
    values = ValueConfig.from_memit(profile.memit, chunk_size=chunk)
    editor = MemitEditor(cov, layers, lambda_=profile.memit.lambda_, lambda_mode=profile.memit.lambda_mode,
                         values=values)
    reqs = synthetic_requests(n_edits)
    _sync(device)
    t = time.perf_counter()
    outcome = editor.apply(adapter, reqs, None, templates)
    _sync(device)
    total = time.perf_counter() - t
    tm = outcome.timings
    other = total - tm["values_s"] - tm["keys_s"] - tm["solve_s"]
    print(f"   context templates (sampled once per model): {t_templates:7.1f} s")
    print(f"   z optimisation ({outcome.n_groups} groups):        {tm['values_s']:7.1f} s   "
          f"({1000 * tm['values_s'] / outcome.n_groups:.0f} ms per group)")
    print(f"   keys (recomputed per layer):                {tm['keys_s']:7.1f} s")
    print(f"   solves (float64, {adapter.key_dim}x{adapter.key_dim}):            {tm['solve_s']:7.1f} s")
    print(f"   grouping, tokenising, post-edit check:      {other:7.1f} s")
    print(f"   total for {n_edits} edits:                     {total:7.1f} s   "
          f"({n_edits / total:.1f} edits/s; mean final z loss "
          f"{sum(outcome.targets.loss) / outcome.n_groups:.3f})")


def bench_z_loops(profile_name: str, n_edits: int, device: str) -> None:
    import tempfile

    import torch

    from moir_lib.editing import group_requests
    from moir_lib.editing.values import ValueConfig, compute_targets
    from moir_lib.experiments import Lab, PointStore

    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(profile_name, PointStore(tmp, shared=False), device=device)
        adapter = lab.model().adapter
        records = lab.edit_records.pool(0)[:n_edits]
        templates = lab.templates("memit", 0)
        groups = group_requests(adapter, records, templates)
        cfg = ValueConfig.from_memit(lab.profile.memit)
        layer = lab.profile.edit_layers[-1]
        print(f"\n== (c) z fitting, {n_edits} batch edits on {profile_name} ({len(groups)} groups, "
              f"{len(templates[-1]) if len(templates) > 1 else 0} context prefixes + the plain prompt, "
              f"{cfg.num_steps} steps, z at layer {layer}, chunks of {cfg.chunk_size})", flush=True)
        runs = {}
        for name, loop, threads in (("full loop, 1 thread", "full", 1), ("upper loop, 1 thread", "upper", 1),
                                    (f"upper loop, {cores} threads", "upper", cores)):
            _sync(device)
            t = time.perf_counter()
            runs[name] = compute_targets(adapter, groups, layer, cfg, loop=loop, threads=threads)
            _sync(device)
            runs[name].seconds = time.perf_counter() - t
        ref = runs["full loop, 1 thread"]
        for name, res in runs.items():
            rel = float((res.z - ref.z).norm() / ref.z.norm())
            same = sum(a == b for a, b in zip(res.steps, ref.steps, strict=True))
            print(f"   {name:<22} {res.seconds:7.1f} s   speed-up {ref.seconds / res.seconds:5.2f}x   "
                  f"|z - z_full|/|z_full| = {rel:.1e}   steps equal for {same}/{len(ref.steps)} groups   "
                  f"mean steps {sum(res.steps) / len(res.steps):.1f}", flush=True)
        torch.set_num_threads(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--quick", action="store_true", help="d = 1024 only and 100 MEMIT edits")
    parser.add_argument("--sizes", help="comma-separated projector sizes (overrides the defaults)")
    parser.add_argument("--n-edits", type=int, default=None,
                        help="MEMIT batch size (default 1000; quick 100)")
    parser.add_argument("--chunk", type=int, default=32, help="groups per z-optimisation chunk")
    parser.add_argument("--model", help="MEMIT part: a model folder or spec instead of the pocket model "
                                        "(pocket profile's layers and z settings)")
    parser.add_argument("--context-templates", type=int, default=5,
                        help="sampled prefixes besides the plain prompt (moir edit uses 0 for pocket)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--skip-projector", action="store_true")
    parser.add_argument("--skip-memit", action="store_true")
    parser.add_argument("--z-only", action="store_true", help="only (c): the z loops on the pocket profile")
    parser.add_argument("--z-profile", default="pocket", help="(c): the profile whose model and edits to use")
    parser.add_argument("--z-edits", type=int, default=100, help="(c): batch edits (default 100)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA device is available")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""), flush=True)
    if args.z_only:
        args.skip_projector = args.skip_memit = True
    if not args.skip_projector:
        if args.sizes:
            sizes = [int(x) for x in args.sizes.split(",")]
        elif args.device.startswith("cuda"):
            sizes = [1024, 4096, 11008, 14336]
        else:
            sizes = [1024] if args.quick else [1024, 4096]
        print("\n== (a) null-space projector of the same C (float64): eigh vs svd")
        for d in sizes:
            bench_projector(d, args.device, repeat=3 if d <= 1024 else 1)
    if not args.skip_memit:
        n = args.n_edits or (100 if args.quick else 1000)
        bench_memit(n, args.device, args.chunk, args.model, args.context_templates)
    bench_z_loops(args.z_profile, args.z_edits, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
