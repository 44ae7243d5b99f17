"""Self-generation throughput: batched ``self_generate`` vs a naive one-sequence-at-a-time ``generate`` loop.

Prints measured tokens/s (never pass/fail). Model: the pocket model when its cache entry is already
built (this script never starts a build), else a randomly initialised Llama of the pocket's shape
(hidden 256, 6 layers, intermediate 1024, vocab 3000). Both sides sample the same seeds (rand×1) with
the paper's untruncated sampling (temperature 1, top_p 1, ``top_k=0``: HF's default would be 50) and the
same ``max_new_tokens``; the naive loop runs at most 16 samples by default (it is slow) and generation
may stop at EOS, so tokens/s (not wall time) is compared.

With ``--device cuda`` it also prints the HBM-bandwidth roofline of the decode: every decode step
streams all weights once for the whole batch plus each row's KV cache, so

    tokens/s_max = batch × HBM_bandwidth / (weight_bytes + KV_bytes_per_step),
    KV_bytes_per_step = batch × 2 (K and V) × n_layers × n_kv_heads × head_dim × bytes × mean context,

with the mean context ``seed + max_new_tokens / 2`` (prefill and sampling are not in the bound).

    python benchmarks/generation.py --quick
    python benchmarks/generation.py --device cuda --batch-size 256 --max-new-tokens 256 --arch 1b
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

#: HBM bandwidth (GB/s) by device-name fragment, most specific first (vendor datasheets).
HBM_GBPS = (("H200", 4800.0), ("H100 SXM", 3350.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0),
            ("H100", 3350.0), ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0), ("A100", 1555.0),
            ("L40S", 864.0), ("A10G", 600.0), ("L4", 300.0), ("T4", 320.0))


def pocket_or_random(arch: str, device: str, dtype: str):
    """(model, tokenizer, description): the built pocket model, else a random Llama with a word tokenizer."""
    import torch
    import transformers

    if arch == "pocket":
        try:
            from moir_lib.cache import entry_dir
            from moir_lib.pocket.build import cache_key, verify
            from moir_lib.pocket.variants import get_variant

            if verify(entry_dir("pocket", cache_key(get_variant("pocket")))) is not None:
                from moir_lib.pocket import load

                model, tok = load("pocket")
                return model.to(device=device, dtype=getattr(torch, dtype)), tok, "pocket model"
            print("(the pocket model is not built; using a random Llama of its shape)")
        except Exception as exc:  # noqa: BLE001 - a benchmark falls back, whatever the reason
            print(f"(pocket model unavailable: {exc}; using a random Llama of its shape)")
        arch = "pocket-shape"
    shapes = {
        "pocket-shape": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=6,
                             num_attention_heads=4, num_key_value_heads=4, vocab_size=3000,
                             max_position_embeddings=512),
        "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=32000, max_position_embeddings=2048),
    }
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**shapes[arch], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=getattr(torch, dtype)).eval()
    return model, word_tokenizer(config.vocab_size), f"random Llama ({arch})"


def word_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + [f"t{i}" for i in range(vocab_size - len(specials))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def naive_loop(model, tokenizer, n_samples: int, max_new_tokens: int, seed: int) -> tuple[int, float]:
    """One ``generate`` call per sample, batch 1, the same seed sequences; returns (tokens, seconds)."""
    import torch

    from moir_lib import generation as G

    device = next(model.parameters()).device
    strategy = G.parse_seed_strategy("rand1")
    cand = G.seed_candidates(tokenizer, model.get_input_embeddings().weight.shape[0])
    tokens = 0
    sync(device)
    start = time.perf_counter()
    for i in range(n_samples):
        ids = G.seed_ids_for(strategy, i, seed, bos_id=tokenizer.bos_token_id, candidates=cand)
        torch.manual_seed(seed * 1_000_003 + i)
        out = model.generate(torch.tensor([ids], device=device), attention_mask=torch.ones(1, len(ids),
                             dtype=torch.long, device=device), do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        tokens += out.shape[1] - len(ids)
    sync(device)
    return tokens, time.perf_counter() - start


def sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


def roofline(model, batch: int, seed_len: int, max_new_tokens: int,
             gbps: float) -> tuple[float, float, float]:
    """(tokens/s bound, weight bytes, KV bytes per decode step) for the decode at ``batch`` rows."""
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    elem = next(model.parameters()).element_size()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    mean_ctx = seed_len + max_new_tokens / 2
    kv_bytes = batch * 2 * cfg.num_hidden_layers * kv_heads * head_dim * elem * mean_ctx
    return batch * gbps * 1e9 / (weight_bytes + kv_bytes), weight_bytes, kv_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--arch", default="pocket", choices=["pocket", "pocket-shape", "1b"],
                        help="pocket (if built, else pocket-shape) or a random 1B-shaped Llama (GPU)")
    parser.add_argument("--dtype", default=None,
                        help="float32 (CPU default) or bfloat16/float16 (GPU default)")
    parser.add_argument("--n-samples", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--naive-samples", type=int, default=None,
                        help="samples for the naive loop (default: min(n-samples, 16); tokens/s is compared)")
    parser.add_argument("--hbm-gbps", type=float, default=None, help="override the HBM bandwidth (GB/s)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--loop", default="auto", choices=["auto", "dynamic", "static"],
                        help="self_generate's decode loop (auto: static, captured, on CUDA; dynamic on CPU)")
    parser.add_argument("--quick", action="store_true", help="16 samples x 32 tokens, batch 16")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_samples, args.max_new_tokens, args.batch_size = 16, 32, 16
    logging.basicConfig(level=logging.WARNING)

    import torch

    from moir_lib.generation import GenerationSettings, self_generate

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda requested but no CUDA device is available", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    model, tok, what = pocket_or_random(args.arch, args.device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {what}, {n_params / 1e6:.1f}M parameters, {dtype}, device {args.device}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"workload: rand1 seeds, {args.n_samples} samples x <= {args.max_new_tokens} new tokens; "
          f"untruncated sampling")

    with tempfile.TemporaryDirectory() as tmp:  # warm-up (kernels, allocator), not timed
        self_generate(model, tok, GenerationSettings("rand1", 2, 4, 2, loop=args.loop), Path(tmp) / "warm",
                      progress=False)
        naive_loop(model, tok, 1, 4, 0)
    with tempfile.TemporaryDirectory() as tmp:
        sync(next(model.parameters()).device)
        start = time.perf_counter()
        res = self_generate(model, tok, GenerationSettings("rand1", args.n_samples, args.max_new_tokens,
                                                           args.batch_size, seed=1, loop=args.loop),
                            Path(tmp) / "run", progress=False)
        sync(next(model.parameters()).device)
        wall = time.perf_counter() - start
    batched = res.n_tokens / res.seconds
    print(f"self_generate ({args.loop} loop), batch {args.batch_size}: {res.n_tokens} tokens in "
          f"{res.seconds:.2f} s (call incl. fingerprint/manifest: {wall:.2f} s) -> {batched:,.0f} tokens/s")
    n_naive = args.naive_samples or min(args.n_samples, 16)
    tokens, seconds = naive_loop(model, tok, n_naive, args.max_new_tokens, 1)
    naive = tokens / seconds
    print(f"naive HF generate loop, batch 1 ({n_naive} samples): {tokens} tokens in {seconds:.2f} s -> "
          f"{naive:,.0f} tokens/s")
    print(f"speed-up batched / naive: {batched / naive:.1f}x")

    if args.device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        gbps = args.hbm_gbps or next((bw for frag, bw in HBM_GBPS if frag.lower() in name.lower()), None)
        if gbps is None:
            print(f"roofline: unknown HBM bandwidth for {name!r}; pass --hbm-gbps")
        else:
            bound, wbytes, kvbytes = roofline(model, args.batch_size, 2, args.max_new_tokens, gbps)
            print("roofline (decode, HBM-bound): tokens/s_max = batch x HBM_bandwidth / "
                  "(weight_bytes + KV_bytes_per_step)")
            print(f"  = {args.batch_size} x {gbps:.0f} GB/s / ({wbytes / 1e9:.3f} GB + "
                  f"{kvbytes / 1e9:.3f} GB) = {bound:,.0f} tokens/s  ({name})")
            bound1 = roofline(model, 1, 2, args.max_new_tokens, gbps)[0]
            print(f"  self_generate reaches {batched / bound:.1%} of it; the naive loop's bound at batch 1 "
                  f"is {bound1:,.0f} tokens/s ({naive / bound1:.1%} reached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
