"""This CPU's GEMM throughput at the pocket model's shapes, and each phase's FLOP rate against it.

Prints measured numbers (never pass/fail), in two tables:

(a) GEMM throughput (GFLOP/s) at the shapes of the pocket model's matmuls, read from
    ``moir_lib.pocket.variants.VARIANTS[<variant>]``: with ``T`` = seq_len × batch tokens of a training
    step and ``W`` a weight of width hidden → ``o``, for ``o`` in {hidden, intermediate, vocab}, the
    forward ``x @ Wᵀ`` (T×hidden @ hidden×o), the input gradient ``dy @ W`` (T×o @ o×hidden) and the
    weight gradient ``dyᵀ @ x`` (o×T @ T×hidden), each in its memory layout as ``nn.Linear`` runs it; in
    bf16, float32 and float64 (the float64 key products of C), on 1 and 2 torch threads; the best of
    three timed loops of at least ``--min-time`` seconds each. The *peak* of a precision and thread
    count is its best shape: what a phase doing only these matmuls could reach.
(b) Each phase of the book as the library runs it, a few steps or batches on the real shapes: the
    pretraining and chat SFT steps (``moir_lib.pocket.train.fit`` on the recipe's windows, its
    precision and fixed thread count, from a fresh initialisation), MEMIT's z fitting
    (``compute_targets`` on one chunk of the pocket CounterFact's first records with the profile's
    context prefixes and steps), preservation
    scoring (``evaluate_preservation`` on the pocket lm-eval tasks) and self-generation
    (``self_generate`` with the profile's seed strategy, keys collected at the edit layers), the last
    three on one torch thread, as the book's workers run them. For each: its wall time, its FLOPs as
    counted by a dispatch mode over a second, identical run (the matmul formulas of
    ``torch.utils.flop_counter``, plus the CPU's fused attention kernel and the in-place ``addmm_`` of
    C's key products, which torch's table lacks: exact for what runs, attention counted over the full
    s × s square as torch counts it; the training rows check the count against ``6·N·T`` plus the
    attention worked out by hand), per precision, the
    achieved GFLOP/s and the share of the peak (the time the counted FLOPs would take at the peak of
    their precision and the phase's threads, over the wall time), and a reading: at least
    ``NEAR`` (50 %) of the peak is "near the limit: only fewer FLOPs help", below it "far from it:
    overhead to remove" (Python per-op cost, small matmuls, recomputed prefixes, padding).

The phases that need a trained model run on the variant's organism 0 where it is built here; otherwise
on a randomly initialised model of the same config, with the recipe's tokenizer and benchmark data
written into a scratch folder (the FLOP rate does not depend on the weights, though a random model's
z fitting never stops early and its generations never end early: more FLOPs, the same kind). The output
says which. Nothing is built, and nothing is written into ``$MOIR_CACHE`` (the run uses a scratch one).
Run it on an idle machine: on two cores another job halves every number. CPU only: the phases run as
the book runs them on a CPU (``gpu.py`` measures the GPU pipeline).

    python benchmarks/throughput.py              # the pocket model's shapes (a few minutes)
    python benchmarks/throughput.py --quick      # the micro model's, a smoke run of seconds
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: the share of the peak from which a phase reads "near the limit"
NEAR = 0.5
#: the GEMM precisions measured, by torch dtype name
PRECISIONS = ("bfloat16", "float32", "float64")
#: the thread counts measured
THREADS = (1, 2)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------------- (a) GEMM peak


@dataclasses.dataclass(frozen=True)
class Gemm:
    """One matmul of the model: ``a (m×k) @ b (k×n)``, ``a`` or ``b`` a transposed view where
    ``nn.Linear`` makes it one."""

    label: str
    m: int
    k: int
    n: int
    a_transposed: bool = False
    b_transposed: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n


def model_gemms(hidden: int, intermediate: int, vocab: int, tokens: int) -> list[Gemm]:
    """The forward, input-gradient and weight-gradient matmuls of a ``hidden → o`` linear layer at
    ``tokens`` tokens, for ``o`` in hidden, intermediate, vocab (``W`` stored ``o × hidden``)."""
    out = []
    for name, o in (("hidden", hidden), ("intermediate", intermediate), ("vocab", vocab)):
        out += [Gemm(f"x @ Wᵀ, {name}", tokens, hidden, o, b_transposed=True),
                Gemm(f"dy @ W, {name}", tokens, o, hidden),
                Gemm(f"dyᵀ @ x, {name}", o, tokens, hidden, a_transposed=True)]
    return out


def gemm_rate(g: Gemm, dtype: str, threads: int, min_time: float, repeats: int = 3) -> float:
    """FLOP/s of ``g`` in ``dtype`` on ``threads`` threads: the best of ``repeats`` loops of at least
    ``min_time`` seconds."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(*((g.k, g.m) if g.a_transposed else (g.m, g.k)), generator=gen).to(getattr(torch, dtype))
    b = torch.randn(*((g.n, g.k) if g.b_transposed else (g.k, g.n)), generator=gen).to(getattr(torch, dtype))
    a, b = (a.t() if g.a_transposed else a), (b.t() if g.b_transposed else b)
    best = 0.0
    with torch_threads(threads):
        torch.mm(a, b)  # warm-up
        for _ in range(repeats):
            reps, t0 = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < min_time or reps == 0:
                torch.mm(a, b)
                reps += 1
            best = max(best, g.flops * reps / elapsed)
    return best


def gemm_table(gemms: list[Gemm], min_time: float, repeats: int) -> dict[tuple[str, str, int], float]:
    """``(label, dtype, threads) -> FLOP/s`` for every matmul, precision and thread count."""
    return {(g.label, d, t): gemm_rate(g, d, t, min_time, repeats)
            for g in gemms for d in PRECISIONS for t in THREADS}


def peaks(rates: dict[tuple[str, str, int], float]) -> dict[tuple[str, int], float]:
    """``(dtype, threads) -> FLOP/s`` of the best shape."""
    out: dict[tuple[str, int], float] = {}
    for (_, d, t), r in rates.items():
        out[d, t] = max(out.get((d, t), 0.0), r)
    return out


# ------------------------------------------------------------------------------- FLOPs that ran


def _cpu_attention(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_attention_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None,
                            **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


def _formulas() -> dict[Any, Callable[..., int]]:
    """torch's FLOP formulas by op, with the CPU's fused attention (forward and backward) and the in-place
    ``addmm_`` of C's key products added."""
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    return {**flop_registry, aten.addmm_: flop_registry[aten.addmm],
            aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward}


def count_flops(fn: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """Run ``fn`` and count the FLOPs of the matmuls and attention kernels it runs (forward and backward),
    per dtype of their first tensor input (what autocast made it); ``(fn's result, {dtype: FLOPs})``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    formulas = _formulas()
    counts: collections.Counter[str] = collections.Counter()

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            formula = formulas.get(func._overloadpacket)
            if formula is None:  # a composite op (inference mode reaches linear, matmul, sdpa): its parts
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            out = func(*args, **kwargs)
            if formula is not None:
                first = next(a for a in args if isinstance(a, torch.Tensor))
                counts[str(first.dtype).removeprefix("torch.")] += int(formula(*args, **kwargs, out_val=out))
            return out

    with Counter():
        result = fn()
    return result, dict(counts)


def analytic_step_flops(config: Any, batch: int, seq: int) -> int:
    """FLOPs of one training step (forward and backward) of a Llama ``config`` on ``batch`` × ``seq``
    tokens, counted by hand: ``6 · N · T`` for the ``N`` weights in matmuls (every layer's q, k, v, o, gate,
    up, down and the LM head; the embedding is a lookup); the attention's ``QKᵀ`` and ``PV`` over the full
    ``seq × seq`` square, 4 · b · s² · hidden per layer forward and 10 backward (the fused kernel's backward
    recomputes ``QKᵀ``: torch's ``sdpa_backward_flop_count``); and the rotary angles, one
    ``d/2 × 1 @ 1 × s`` product per forward (positions shared by the batch, no gradient)."""
    h, i, v, n_layers = (config.hidden_size, config.intermediate_size, config.vocab_size,
                         config.num_hidden_layers)
    head = h // config.num_attention_heads
    kv = head * config.num_key_value_heads
    weights = n_layers * (2 * h * h + 2 * h * kv + 3 * h * i) + v * h
    attention = 14 * n_layers * batch * seq * seq * h
    return 6 * weights * batch * seq + attention + seq * head


# ------------------------------------------------------------------------------------ the model


@dataclasses.dataclass
class Source:
    """Where the phases' model comes from: a folder laid out as a pocket build (model, tokenizer,
    ``counterfact.json``, ``benchmarks/``), the variant, its world, and what the model is, in words."""

    name: str
    entry: Path
    what: str

    @property
    def variant(self) -> Any:
        from moir_lib.pocket.variants import get_variant

        return get_variant(self.name)

    def world(self) -> Any:
        from moir_lib.pocket.world import World

        return World(self.variant.world)


def model_source(name: str, scratch: Path) -> Source:
    """Organism 0 of pocket variant ``name`` where it is built here, else a randomly initialised model of its
    config with the recipe's tokenizer, CounterFact and benchmark data written into ``scratch`` (no
    training: the data half of :func:`moir_lib.pocket.build.build`)."""
    from moir_lib.pocket import provenance
    from moir_lib.pocket.bench_datasets import write_datasets
    from moir_lib.pocket.organisms import init_seed
    from moir_lib.pocket.tokenizer import train_tokenizer
    from moir_lib.pocket.train import new_model

    built = provenance(name, 0)
    if built is not None:
        return Source(name, built.entry, f"{name} organism 0 as built here (weights "
                                         f"{built.weights_sha256[:16]})")
    source = Source(name, scratch, f"a randomly initialised model of the {name} config ({name} organism 0 is "
                                   f"not built here; the FLOP rate does not depend on the weights)")
    variant, world = source.variant, source.world()
    tspec = variant.train
    tokenizer = train_tokenizer(world, variant.model.vocab_size, tspec.tokenizer_docs_per_domain, tspec.seed)
    model = new_model(variant.model, tokenizer, init_seed(tspec.seed, 0))
    model.config.pocket_variant = name
    model.save_pretrained(scratch)
    tokenizer.save_pretrained(scratch)
    records = world.counterfact(seed=tspec.seed)
    (scratch / "counterfact.json").write_text(json.dumps(records))
    write_datasets(world, records, variant.bench, scratch / "benchmarks")
    return source


def profile_of(name: str) -> Any:
    """The profile whose model is pocket variant ``name`` (``pocket``, ``pocket-micro``)."""
    from moir_lib.models import POCKET_SPECS
    from moir_lib.profiles import load_profile

    return load_profile(next(spec for spec, variant in POCKET_SPECS.items() if variant == name))


# ---------------------------------------------------------------------------------- (b) phases


@dataclasses.dataclass
class Phase:
    name: str
    work: str
    threads: int
    wall_s: float
    flops: dict[str, int]

    def ideal_s(self, peak: dict[tuple[str, int], float]) -> float | None:
        """Seconds the counted FLOPs take at the peak of their precision on this phase's threads."""
        try:
            return sum(f / peak[d, self.threads] for d, f in self.flops.items())
        except KeyError:
            return None


def training_phase(tokenizer: Any, source: Source, steps: int, sft: bool) -> Phase:
    """``steps`` timed steps of ``fit`` (after one warm-up step) on the recipe's pretraining or SFT windows,
    from a fresh model of the recipe's config, at its precision and thread count; one more step counted."""
    from moir_lib.pocket.train import (
        fit,
        labels_for,
        new_model,
        pretraining_windows,
        resolve_precision,
        sft_windows,
    )

    variant = source.variant
    tspec, b = variant.train, variant.train.batch_size
    world, n = source.world(), (steps + 2) * b
    if sft:
        rows, labels = sft_windows(tokenizer, world, n, tspec, tspec.seed + 7)
        lr, name = tspec.sft_lr, "chat SFT step"
    else:
        rows = pretraining_windows(tokenizer, world, n, tspec, tspec.seed)
        labels, lr, name = labels_for(rows, tokenizer), tspec.pretrain_lr, "pretraining step"
    precision = resolve_precision(tspec.precision)
    model = new_model(variant.model, tokenizer, tspec.seed)

    def run(first: int, count: int, desc: str) -> float:
        part = slice(first * b, (first + count) * b)
        return fit(model, rows[part], labels[part], b, lr, tspec.warmup, desc, precision)

    with torch_threads(tspec.threads):
        run(0, 1, "warm-up")
        wall = run(1, steps, name)
        _, flops = count_flops(lambda: run(steps + 1, 1, "counted"))
    by_hand = sum(flops.values()) / analytic_step_flops(model.config, b, tspec.seq_len)
    return Phase(name, f"{steps} step{'s' * (steps != 1)} of {b} × {tspec.seq_len} tokens, {precision}; "
                       f"counted / (6·N·T + attention) = {by_hand:.4f}", tspec.threads, wall,
                 {d: f * steps for d, f in flops.items()})


def z_phase(loaded: Any, source: Source, groups_wanted: int | None) -> Phase:
    """MEMIT's z fitting (``compute_targets``, the profile's settings, one thread) for ``groups_wanted``
    groups (default: one chunk) of the pocket CounterFact's first records, timed after a two-step warm-up,
    then counted."""
    from moir_lib.editing import group_requests
    from moir_lib.editing.templates import sample_templates
    from moir_lib.editing.values import ValueConfig, compute_targets

    profile = profile_of(source.name)
    adapter, cfg = loaded.adapter, ValueConfig.from_memit(profile.memit)
    wanted = groups_wanted or cfg.chunk_size
    records = json.loads((source.entry / "counterfact.json").read_text())[:wanted]
    templates = sample_templates(adapter, profile.memit.context_templates, seed=0)
    groups = group_requests(adapter, records, templates)[:wanted]
    layer = profile.edit_layers[-1]

    def run(config: ValueConfig = cfg) -> Any:
        return compute_targets(adapter, groups, layer, config, threads=1)

    with torch_threads(1):
        run(dataclasses.replace(cfg, num_steps=2))
        t0 = time.perf_counter()
        result = run()
        wall = time.perf_counter() - t0
        _, flops = count_flops(run)
    steps = sum(result.steps) / len(result.steps)
    prefixes = len(templates[-1]) if len(templates) > 1 else 0
    return Phase("z fitting", f"{len(groups)} groups, {prefixes} prefixes + the plain prompt, {steps:.0f} of "
                              f"≤ {cfg.num_steps} steps on average, z at layer {layer}", 1, wall, flops)


@contextlib.contextmanager
def _data_from(entry: Path) -> Iterator[None]:
    """The pocket suite reads its benchmark data from ``entry`` instead of asking the cache for the build
    (which would build it where it is missing: this benchmark never builds). A module first imported inside
    the block binds the stand-in by name (``from moir_lib.pocket.build import build``): it gets the real
    ``build`` back on the way out."""
    import importlib

    pocket_build = importlib.import_module("moir_lib.pocket.build")  # the module, not the package's function
    real = pocket_build.build

    def stand_in(*args: Any, **kwargs: Any) -> Path:
        return entry

    pocket_build.build = stand_in
    try:
        yield
    finally:
        for module in list(sys.modules.values()):
            if getattr(module, "build", None) is stand_in:
                module.build = real


def preservation_phase(loaded: Any, source: Source, limit: int) -> Phase:
    """The pocket preservation suite (``evaluate_preservation``, the chapters' batch size, one thread) on
    ``limit`` items of each task, timed after a one-item warm-up (lm-eval's imports and task index), then
    counted."""
    from moir_lib.evaluation.preservation import POCKET_TASKS, PreservationSettings, evaluate_preservation
    from moir_lib.experiments.specs import EvalSettings

    batch = EvalSettings().batch_size

    def run(n: int) -> Any:
        return evaluate_preservation(loaded.model, loaded.tokenizer,
                                     PreservationSettings("pocket", limit=n, batch_size=batch),
                                     pocket_variant=source.name)

    with torch_threads(1), _data_from(source.entry), _quiet():
        run(1)
        t0 = time.perf_counter()
        run(limit)
        wall = time.perf_counter() - t0
        _, flops = count_flops(lambda: run(limit))
    work = f"{limit} item{'s' * (limit != 1)} of each of the {len(POCKET_TASKS)} pocket tasks, batch {batch}"
    return Phase("preservation scoring", work, 1, wall, flops)


def generation_phase(loaded: Any, source: Source, n_samples: int, scratch: Path) -> Phase:
    """``n_samples`` self-generated samples (``self_generate``: the profile's seed strategy, token budget and
    batch size, keys collected at the edit layers, one thread), timed after a tiny warm-up, then counted."""
    from moir_lib.generation import GenerationSettings, self_generate

    profile = profile_of(source.name)
    gen, layers = profile.generation, list(profile.edit_layers)

    def run(out: str, n: int, new_tokens: int) -> Any:
        settings = GenerationSettings(gen.seed_strategy, n, new_tokens, min(gen.batch_size, n), seed=0,
                                      collect_layers=layers)
        return self_generate(loaded.model, loaded.tokenizer, settings, scratch / out, progress=False)

    with torch_threads(1):
        run("warm-up", 2, 2)
        t0 = time.perf_counter()
        result = run("timed", n_samples, gen.max_new_tokens)
        wall = time.perf_counter() - t0
        _, flops = count_flops(lambda: run("counted", n_samples, gen.max_new_tokens))
    work = (f"{n_samples} {gen.seed_strategy} samples of ≤ {gen.max_new_tokens} tokens ({result.n_tokens} "
            f"sampled), batch {min(gen.batch_size, n_samples)}, keys of layers {layers}")
    return Phase("self-generation", work, 1, wall, flops)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """lm-eval's INFO lines and warnings off."""
    import logging

    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def run_phases(source: Source, scratch: Path, steps: int, *, z_groups: int | None, pres_limit: int,
               samples: int | None) -> list[Phase]:
    """Every phase of (b) on ``source``'s model (``samples`` default: the profile's generation batch)."""
    from moir_lib.models import load

    loaded = load(str(source.entry))
    samples = samples or profile_of(source.name).generation.batch_size
    return [training_phase(loaded.tokenizer, source, steps, sft=False),
            training_phase(loaded.tokenizer, source, steps, sft=True),
            z_phase(loaded, source, z_groups),
            preservation_phase(loaded, source, pres_limit),
            generation_phase(loaded, source, samples, scratch)]


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Environment variables set inside the block, restored after it."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ------------------------------------------------------------------------------------- report


def reading(share: float | None) -> str:
    if share is None:
        return "no peak measured for its precision"
    if share >= NEAR:
        return f"near the limit (≥ {NEAR:.0%} of the peak): only fewer FLOPs help"
    return f"far from it (< {NEAR:.0%} of the peak): overhead to remove"


def print_gemms(gemms: list[Gemm], rates: dict[tuple[str, str, int], float]) -> None:
    cols = [(d, t) for d in PRECISIONS for t in THREADS]
    print("| matmul | shape | " + " | ".join(f"{d} {t}t" for d, t in cols) + " |")
    print("|---|---|" + "---:|" * len(cols))
    for g in gemms:
        cells = " | ".join(f"{rates[g.label, d, t] / 1e9:,.1f}" for d, t in cols)
        print(f"| {g.label} | {g.m}×{g.k} @ {g.k}×{g.n} | {cells} |")
    top = peaks(rates)
    print("| **peak** (best shape) | | " + " | ".join(f"**{top[c] / 1e9:,.1f}**" for c in cols) + " |")


def print_phases(phases: list[Phase], peak: dict[tuple[str, int], float]) -> None:
    print("| phase | work | threads | wall s | GFLOP (by precision) | achieved GFLOP/s | of the peak | "
          "reading |")
    print("|---|---|---:|---:|---|---:|---:|---|")
    for p in phases:
        total = sum(p.flops.values())
        ideal = p.ideal_s(peak)
        share = ideal / p.wall_s if ideal is not None and p.wall_s > 0 else None
        split = ", ".join(f"{f / 1e9:.3g} {d}" for d, f in sorted(p.flops.items(), key=lambda kv: -kv[1]))
        shown = "—" if share is None else f"{share:.1%}"
        print(f"| {p.name} | {p.work} | {p.threads} | {p.wall_s:,.2f} | {split or 'none'} | "
              f"{total / p.wall_s / 1e9:,.2f} | {shown} | {reading(share)} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="the micro model's shapes and a few items per phase: a smoke run of seconds")
    p.add_argument("--variant", default=None, help="pocket variant whose shapes to use (default pocket; "
                                                    "--quick: micro)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed training steps per phase (default 8; quick 1)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds of each timed GEMM loop (default 0.3; quick 0.002)")
    p.add_argument("--z-groups", type=int, default=None, help="z fitting groups (default the profile's chunk "
                                                              "of 16; quick 2)")
    p.add_argument("--pres-limit", type=int, default=None, help="items per preservation task (default 16; "
                                                                "quick 1)")
    p.add_argument("--samples", type=int, default=None,
                   help="self-generated samples (default the profile's batch size; quick 2)")
    args = p.parse_args(argv)
    with _environment(TQDM_DISABLE="1"):  # no progress bars (read when tqdm is first imported)
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    quick = args.quick
    name = args.variant or ("micro" if quick else "pocket")
    steps = args.steps or (1 if quick else 8)
    min_time = args.min_time or (0.002 if quick else 0.3)

    import torch

    from moir_lib.pocket.train import resolve_precision
    from moir_lib.pocket.variants import get_variant

    variant = get_variant(name)
    spec, tspec = variant.model, variant.train
    tokens = tspec.seq_len * tspec.batch_size
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, AMX tiles "
          f"{torch.cpu._is_amx_tile_supported()}, AVX512-BF16 {torch.cpu._is_avx512_bf16_supported()}, "
          f"{len(os.sched_getaffinity(0))} cores available; training precision here: "
          f"{resolve_precision(tspec.precision)}, {tspec.threads} threads")
    print(f"\n== (a) GEMM throughput at the {name} model's shapes (GFLOP/s): hidden {spec.hidden_size}, "
          f"intermediate {spec.intermediate_size}, vocab {spec.vocab_size}, T = {tspec.seq_len} × "
          f"{tspec.batch_size} = {tokens} tokens; best of 3 loops of ≥ {min_time} s\n", flush=True)
    gemms = model_gemms(spec.hidden_size, spec.intermediate_size, spec.vocab_size, tokens)
    rates = gemm_table(gemms, min_time, repeats=1 if quick else 3)
    print_gemms(gemms, rates)
    peak = peaks(rates)

    with tempfile.TemporaryDirectory(prefix="moir-throughput-") as tmp:
        scratch = Path(tmp)
        (scratch / "entry").mkdir()
        source = model_source(name, scratch / "entry")
        print(f"\n== (b) the phases on {source.what}\n", flush=True)
        with _environment(MOIR_CACHE=str(scratch / "cache")):
            phases = run_phases(source, scratch, steps, z_groups=args.z_groups or (2 if quick else None),
                                pres_limit=args.pres_limit or (1 if quick else 16),
                                samples=args.samples or (2 if quick else None))
        print_phases(phases, peak)
    print(f"\nthe peak: the best GEMM of (a) in the phase's precision and thread count; of the peak: the "
          f"time the counted FLOPs take at that peak over the wall time (FLOPs of several precisions each at "
          f"its own); reading threshold {NEAR:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
