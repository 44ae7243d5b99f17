"""Covariance estimation speed: one pass for all edit layers vs forward alone vs one pass per layer.

Prints measured numbers (never pass/fail):

(a) ``forward + accumulate`` over all edit layers ÷ ``forward alone`` (goal ≤ 1.15). Both passes
    stop at the last edit layer's key (that is where :func:`moir_lib.covariance.estimate` stops),
    so the ratio is the cost of forming ``Σ k kᵀ``. It has a floor set by arithmetic: per token,
    accumulation costs ``≈ d_ff² / 2`` multiply-adds per edit layer (the upper triangle and the
    diagonal blocks), against ``≈ 2 h² + 2 h·h_kv + 3 h·d_ff`` (projections) ``+ 2·ctx·h``
    (attention) per layer run. The script prints that FLOP estimate beside the measurement. On a
    CPU the few tokens this script can afford per product (128) make every product pay the
    ``d_ff²`` accumulator's memory traffic, so the CPU ratio overstates what 12 288-token batches
    cost; the float32 mode only pays off at large batches or on a GPU.
(b) our one-pass estimate ÷ a one-pass-*per-layer* estimate of the same layers, as ROME/MEMIT's
    ``layer_stats`` runs it (one pass per layer, stopped at that layer, float32 accumulation; goal
    ≥ 3× for 6 layers).
(c) tokens/s of the estimate.

Models: the built pocket model (``moir_lib.pocket``; never built here: skipped with a message,
and a random model of its shape is measured instead), and a randomly initialised model with
Llama-3.1-8B's layer shapes (hidden 4096, intermediate 14336, 32 heads, 8 KV heads) truncated to
its first 9 layers so that layers 3-8 (the paper's Llama edit layers) are the edit layers, in
bfloat16 on CPU with 128 tokens (64 with ``--quick``; ≈ 2 minutes on 2 busy cores). Its vocabulary
is cut to 32k rows by default (the estimate never runs the LM head; ``--vocab 128256`` for the real one). Six
float64 ``14336²`` accumulators take 9.9 GB: with less memory available the script measures
fewer edit layers and says so.

    python benchmarks/covariance.py            # pocket + 8B-shaped (CPU)
    python benchmarks/covariance.py --quick    # fewer tokens
    python benchmarks/covariance.py --device cuda --n-layers 32 --tokens 49152   # a full 8B shape
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Stop(Exception):
    pass


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str, repeat: int = 1) -> float:
    """Best wall time of ``repeat`` calls of ``fn`` (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def _available_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def measure(model, adapter, batches, layers, device, label, repeat=1, precisions=("float64", "float32"),
            full=True):
    """Time forward-alone, one pass (each precision) and per-layer passes over ``batches``; print them.

    Accumulators are allocated (and their pages touched) before the clock starts: that one-time cost
    does not grow with the corpus. Buffered keys are flushed inside the timed region.
    """
    import torch

    from moir_lib.covariance import CovarianceStats, KeyCollector

    last = max(layers)
    tokens = sum(int(b.numel()) for b in batches)

    def stop_hook(*_):
        raise _Stop

    def forward_alone():
        h = adapter.key_module(last).register_forward_pre_hook(stop_hook)
        try:
            with torch.no_grad():
                for ids in batches:
                    try:
                        model(input_ids=ids, use_cache=False)
                    except _Stop:
                        pass
        finally:
            h.remove()

    def full_forward():
        with torch.no_grad():
            for ids in batches:
                model(input_ids=ids, use_cache=False)

    def allocated(which, precision):
        stats = CovarianceStats(which, adapter.key_dim, {"model": "bench"}, precision=precision)
        for layer in which:  # allocate and touch the accumulator (and the float32 scratch)
            stats.update(layer, torch.zeros(stats.flush_tokens, adapter.key_dim, device=device))
        return stats.flush()

    def one_pass(stats):
        collector = KeyCollector(adapter, stats.layers, stats=stats, stop_after_last=True)
        with collector, torch.no_grad():
            for ids in batches:
                collector.forward(model, input_ids=ids, use_cache=False)
        stats.flush()

    def timed_pass(precision):
        stats = allocated(layers, precision)
        t = _timed(lambda s=stats: one_pass(s), device)
        del stats
        gc.collect()
        return t

    def timed_per_layer(precision):
        total = 0.0
        for layer in layers:  # one accumulator at a time, as layer_stats holds one
            stats = allocated([layer], precision)
            total += _timed(lambda stats=stats: one_pass(stats), device)
            del stats
            gc.collect()
        return total

    with torch.no_grad():  # warm-up: kernels, allocator
        try:
            h = adapter.key_module(last).register_forward_pre_hook(stop_hook)
            model(input_ids=batches[0][:1, :16], use_cache=False)
        except _Stop:
            pass
        finally:
            h.remove()
    t_fwd = _timed(forward_alone, device, repeat)
    t_full = _timed(full_forward, device, repeat) if full else None
    t_one = {p: min(timed_pass(p) for _ in range(repeat)) for p in precisions}
    t_per = timed_per_layer("float32")

    cfg = model.config
    h_, f_ = cfg.hidden_size, cfg.intermediate_size
    kv = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads) * (h_ // cfg.num_attention_heads)
    seq = batches[0].shape[1]
    # projections + attention scores and values at the mean causal context (seq / 2), per token
    layer_flops = 2 * (2 * h_ * h_ + 2 * h_ * kv + 3 * h_ * f_) + 2 * 2 * (seq / 2) * h_
    block = 1024
    nb = -(-f_ // block)
    tri = min(1.0, nb * (nb + 1) / 2 / (nb * nb)) if f_ > block else 1.0
    acc_flops = 2 * f_ * f_ * tri
    floor = 1 + len(layers) * acc_flops / ((last + 1) * layer_flops)
    per_layer_flops = sum(layer + 1 for layer in layers) * layer_flops + len(layers) * acc_flops
    one_flops = (last + 1) * layer_flops + len(layers) * acc_flops

    print(f"\n== {label}: {tokens:,} tokens in {len(batches)} batch(es), edit layers {layers[0]}-{last} "
          f"({len(layers)}), {last + 1} layers run, d_ff {f_}, {next(model.parameters()).dtype}, {device}")
    row = "   {:<43}{:8.2f} s   {:10,.0f} tokens/s"
    print(row.format(f"forward alone (stopped at layer {last}'s key)", t_fwd, tokens / t_fwd))
    if t_full is not None:
        print(row.format("full forward (every layer + LM head)", t_full, tokens / t_full))
    for p, t in t_one.items():
        print(row.format(f"one pass + accumulate ({p})", t, tokens / t))
    print(row.format("per-layer passes (layer_stats, float32)", t_per, tokens / t_per))
    for p, t in t_one.items():
        print(f"   (a) one pass ({p}) / forward alone = {t / t_fwd:5.2f}   (goal <= 1.15; FLOP estimate "
              f"{floor:4.2f} at equal throughput)")
    for p, t in t_one.items():
        print(f"   (b) per-layer / one pass ({p})       = {t_per / t:5.2f}x  (goal >= 3x for 6 layers; FLOP "
              f"ratio {per_layer_flops / one_flops:4.2f})")
    rates = ", ".join(f"{tokens / t:,.0f} ({p})" for p, t in t_one.items())
    print(f"   (c) tokens/s of the estimate: {rates}")
    return {"forward": t_fwd, "one": t_one, "per_layer": t_per}


def pocket_section(args) -> None:
    import torch
    import transformers

    device = args.device
    label = None
    try:
        from moir_lib.cache import entry_dir
        from moir_lib.pocket.build import cache_key, verify
        from moir_lib.pocket.variants import get_variant

        if verify(entry_dir("pocket", cache_key(get_variant("pocket")))) is not None:
            from moir_lib.models import load

            model, tokenizer, adapter = load("pocket", device=device)
            label = "pocket model"
        else:
            print("\n(pocket model not built: skipped — build it with "
                  "`python -c 'import moir_lib.pocket as p; p.build()'`; "
                  "measuring a random model of its shape instead)")
    except Exception as exc:  # noqa: BLE001 - a benchmark reports and goes on
        print(f"\n(pocket model unavailable: {exc}; measuring a random model of its shape instead)")
    if label is None:
        from moir_lib.models import ModelAdapter

        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=6,
                                       num_attention_heads=4, num_key_value_heads=4, vocab_size=3000,
                                       max_position_embeddings=256)
        model = transformers.AutoModelForCausalLM.from_config(cfg).to(device).eval()
        tokenizer = None
        adapter = ModelAdapter(model, None, name="pocket-shape")
        label = "random pocket-shaped Llama"
    layers = [1, 2]
    n_docs = 64 if args.quick else 256
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, adapter.vocab_size, (n_docs // 16, 16 * 64), generator=g)  # 16 docs × 64 per row
    batches = [ids[i:i + 4].to(device) for i in range(0, len(ids), 4)]  # 4096 tokens per batch (the profile)
    measure(model, adapter, batches, layers, device, label, repeat=1 if args.quick else 2)

    if tokenizer is not None:  # end to end: tokenize, pack, forward, accumulate, on the pocket mixture
        from moir_lib.covariance import EstimationSettings, estimate
        from moir_lib.documents import load_corpus

        docs = [d for dom in ("wiki", "web", "code", "math")
                for d in load_corpus(f"pocket:{dom}", n=n_docs // 4)]
        t = time.perf_counter()
        stats = estimate((model, tokenizer, adapter), docs, layers, EstimationSettings(tokens_per_batch=4096),
                         cache=False, progress=False)
        dt = time.perf_counter() - t
        print(f"   (c) estimate() end to end on {len(docs)} pocket documents: {stats.n_tokens:,} tokens in "
              f"{dt:.2f} s = {stats.n_tokens / dt:,.0f} tokens/s (tokenization and packing included)")


def llama8b_section(args) -> None:
    import torch
    import transformers

    from moir_lib.models import ModelAdapter

    device, dtype = args.device, getattr(torch, args.dtype)
    layers = list(range(args.first_layer, args.first_layer + args.edit_layers))
    n_layers = args.n_layers or (32 if device.startswith("cuda") else max(layers) + 1)
    d_ff, hidden = 14336, 4096
    per_layer_params = 2 * hidden * hidden + 2 * hidden * 1024 + 3 * hidden * d_ff
    need = (n_layers * per_layer_params + 2 * args.vocab * hidden) * dtype.itemsize / 2**30
    acc = d_ff * d_ff * 8 / 2**30
    if not device.startswith("cuda"):
        avail = _available_gb()
        fit = int((avail - need - 3) // acc)
        if fit < len(layers):
            if fit < 1:
                print(f"\n(8B-shaped model skipped: {avail:.1f} GB available, the model needs {need:.1f} GB "
                      f"and each accumulator {acc:.1f} GB)")
                return
            print(f"\n({avail:.1f} GB available: measuring {fit} edit layers instead of {len(layers)}; "
                  f"each float64 {d_ff}² accumulator takes {acc:.1f} GB)")
            layers = layers[-fit:]
    print(f"\nbuilding a random Llama-3.1-8B-shaped model: {n_layers} layers, vocab {args.vocab}, "
          f"{args.dtype}, {need:.1f} GB ...", flush=True)
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=d_ff, num_hidden_layers=n_layers,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=args.vocab,
                                   max_position_embeddings=131072, rope_theta=500000.0,
                                   tie_word_embeddings=False)
    from transformers.modeling_utils import no_init_weights

    t = time.perf_counter()
    with torch.device(device), no_init_weights():  # random init of 2B weights is slow: tile a random block
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    block = (0.02 * torch.randn(1 << 20, generator=g)).to(device=device, dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim < 2:
                p.fill_(1.0)  # norm weights
                continue
            flat = p.view(-1)
            for s in range(0, flat.numel(), block.numel()):
                n = min(block.numel(), flat.numel() - s)
                flat[s:s + n].copy_(block[:n])
    adapter = ModelAdapter(model, None, name=f"llama3.1-8b-shape-{n_layers}L")
    print(f"built in {time.perf_counter() - t:.0f} s", flush=True)
    tokens = args.tokens or ((4 * 12288) if device.startswith("cuda") else (64 if args.quick else 128))
    tpb = args.tokens_per_batch or (12288 if device.startswith("cuda") else tokens)
    seq = min(tpb, 2048 if device.startswith("cuda") else 128)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (max(1, tokens // seq), seq), generator=g)
    rows = max(1, tpb // seq)
    batches = [ids[i:i + rows].to(device) for i in range(0, len(ids), rows)]
    measure(model, adapter, batches, layers, device, "random Llama-3.1-8B shape",
            full=n_layers > max(layers) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--quick", action="store_true", help="fewer tokens")
    parser.add_argument("--dtype", default="bfloat16",
                        help="8B-shaped model dtype (bfloat16 | float16 | float32)")
    parser.add_argument("--n-layers", type=int, default=None,
                        help="layers of the 8B shape (default: up to the last edit layer on CPU, 32 on CUDA)")
    parser.add_argument("--first-layer", type=int, default=3, help="first edit layer (Llama-3.1-8B: 3)")
    parser.add_argument("--edit-layers", type=int, default=6, help="number of edit layers (paper: 6)")
    parser.add_argument("--vocab", type=int, default=32768,
                        help="vocabulary rows of the 8B shape (real: 128256)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens through the 8B shape")
    parser.add_argument("--tokens-per-batch", type=int, default=None)
    parser.add_argument("--skip-pocket", action="store_true")
    parser.add_argument("--skip-8b", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    gpu = f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"device {args.device}{gpu}")
    if not args.skip_pocket:
        pocket_section(args)
    if not args.skip_8b:
        llama8b_section(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
