"""Pocket training precision on this CPU: bf16 autocast against float32, and the projected build time.

Prints measured numbers (never pass/fail): matmul GFLOP/s (1024×256 @ 256×1024, one thread) in
float32 and bf16; training tokens/s of the pocket model's shape (``ModelSpec``, random weights,
the recipe's batch and sequence length, its fixed thread count) under each precision; the
precision ``auto`` resolves to here; and the projected pretraining + SFT minutes of every gated
build (``pocket``) on each path (the build also spends ≈ 20 s on corpora and the tokenizer).
Run it on an idle machine: two torch jobs on two cores run several times slower.

    python benchmarks/pocket_precision.py [--steps 8]
"""

from __future__ import annotations

import argparse
import time


def matmul_gflops(dtype, repeats: int = 20) -> float:
    import torch

    a, b = torch.randn(1024, 256).to(dtype), torch.randn(256, 1024).to(dtype)
    a @ b  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return repeats * 2 * 1024 * 256 * 1024 / (time.perf_counter() - start) / 1e9


def train_tokens_per_s(precision: str, steps: int) -> float:
    """Tokens/s of the recipe's own training loop (``moir_lib.pocket.train.fit``) on random tokens."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from moir_lib.pocket.train import fit
    from moir_lib.pocket.variants import ModelSpec, TrainSpec

    spec, train = ModelSpec(), TrainSpec()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads, max_position_embeddings=spec.max_positions))
    rows = torch.randint(0, spec.vocab_size, ((steps + 1) * train.batch_size, train.seq_len))
    fit(model, rows[: train.batch_size], rows[: train.batch_size], train.batch_size, 1e-3, 0.0, "warm-up",
        precision)
    seconds = fit(model, rows[train.batch_size:], rows[train.batch_size:], train.batch_size, 1e-3, 0.0,
                  precision, precision)
    return steps * train.batch_size * train.seq_len / seconds


def main() -> None:
    import torch

    from moir_lib.pocket.train import resolve_precision
    from moir_lib.pocket.variants import VARIANTS, TrainSpec

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8, help="timed float32 training steps (bf16: 2)")
    args = p.parse_args()
    train = TrainSpec()
    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}; AMX tiles: "
          f"{torch.cpu._is_amx_tile_supported()}; AVX512-BF16: {torch.cpu._is_avx512_bf16_supported()}; "
          f"auto -> {resolve_precision('auto')}")
    torch.set_num_threads(1)
    f32, bf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    print(f"matmul 1024x256x1024, 1 thread: float32 {f32:.1f} GFLOP/s, bf16 {bf16:.1f} GFLOP/s "
          f"(bf16/float32 = {bf16 / f32:.2f})")
    torch.set_num_threads(train.threads)
    recipes = {name: v.train for name, v in VARIANTS.items() if v.enforce_gates}  # the gated builds
    tokens = {name: (t.pretrain_steps + t.sft_steps) * t.batch_size * t.seq_len
              for name, t in recipes.items()}
    rates = {}
    for precision in ("float32", "bf16"):
        rates[precision] = train_tokens_per_s(precision, args.steps if precision == "float32" else 2)
        print(f"training, {train.threads} threads, {precision}: {rates[precision]:,.0f} tokens/s -> "
              + "; ".join(f"{name}: pretraining + SFT of {n:,} tokens in {n / rates[precision] / 60:.1f} min"
                          for name, n in tokens.items()))
    print(f"bf16 / float32 training speed: {rates['bf16'] / rates['float32']:.2f}")


if __name__ == "__main__":
    main()
