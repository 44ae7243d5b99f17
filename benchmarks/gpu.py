"""The paper's per-model pipeline on one GPU, with a random model of Llama-3.1-8B's exact shapes.

Prints measured numbers (never pass/fail); no download is needed:

(a) self-generation tokens/s at the paper's settings (rand×1, untruncated sampling, up to
    ``--max-new-tokens`` 256) against the decode roofline. One decode step must read every weight
    once and the KV cache of every row, so with HBM bandwidth ``B`` (bytes/s)::

        tokens/s_max = batch × B / (weight_bytes + batch × ctx × n_layers × 2 × n_kv_heads × head_dim × bytes)

    (``ctx``: the mean context length over the generation; compute is ignored, so this is an
    upper bound). A random model rarely samples EOS, so every row runs to the full length: the
    worst case of the paper's ≤ 256 tokens.
(b) C estimation tokens/s for the 6 edit layers (3-8) in one pass per batch of 12 288 tokens,
    stopping after layer 8.
(c) AlphaEdit's projector (``eigh`` of a 14 336² float64 C).
(d) MEMIT's closed-form update for a batch of 1 000 edits on the 6 layers (float64 Cholesky
    solves; the per-request z optimisation is measured by ``benchmarks/editing.py``).
(e) the projected wall time of the paper's pipeline per model — 100 000 samples × ≤ 256 tokens of
    self-generation, plus C over them when it is not collected during generation — against the
    paper's ≈ 2 h 15 min on an A100 (≈ 2 h generation + ≈ 15 min C). Goal: ≤ 30 min on one H100.

    python benchmarks/gpu.py --device cuda          # on a GPU node (the `device` tool here)
    python benchmarks/gpu.py --tiny                 # CPU smoke run of the same code on tiny shapes
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LLAMA_8B = dict(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                rope_theta=500_000.0)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=10,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
EDIT_LAYERS = [3, 4, 5, 6, 7, 8]
#: HBM bandwidth (bytes/s) by device-name fragment, from the vendors' data sheets.
HBM = {"H200": 4.8e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100-SXM4-80GB": 2.04e12, "A100": 1.56e12}
PAPER_MINUTES = 135.0
#: Relative τ for (c): a random model's C is well conditioned (λ_min/λ_max ≈ 0.06 on Llama-3.1-8B
#: shapes), so the paper-style small τ would leave no null space; the timing does not depend on τ.
TAU_REL = 0.5


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>"]
    words = {w: i for i, w in enumerate(specials + [f"t{i}" for i in range(vocab - len(specials))])}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")


def _model(shapes: dict, device: str, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shapes, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def _bandwidth(device: str, override: float | None) -> tuple[float | None, str]:
    import torch

    if override:
        return override * 1e9, "given"
    if not device.startswith("cuda"):
        return None, "cpu"
    name = torch.cuda.get_device_name()
    for fragment, bw in HBM.items():
        if fragment in name:
            return bw, name
    return None, name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU smoke run)")
    ap.add_argument("--samples", type=int, default=None, help="samples generated for (a)")
    ap.add_argument("--batch", type=int, default=None, help="generation batch size")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 256 (paper); 16 with --tiny")
    ap.add_argument("--c-tokens", type=int, default=None, help="tokens for (b)")
    ap.add_argument("--collect-precision", default="float64", choices=["float64", "float32"],
                    help="precision of the key products when C is collected during generation")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="HBM bandwidth in GB/s (default: by device)")
    args = ap.parse_args()

    import torch

    from moir_lib.covariance import CovarianceStats, base_metadata, estimate
    from moir_lib.editing.alphaedit import null_space_projector
    from moir_lib.editing.memit import memit_delta
    from moir_lib.generation import self_generate
    from moir_lib.models import LoadedModel, ModelAdapter

    torch.manual_seed(0)
    dev = args.device
    shapes = TINY if args.tiny else LLAMA_8B
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    samples = args.samples or (16 if args.tiny else 1024)
    args.max_new_tokens = args.max_new_tokens or (16 if args.tiny else 256)
    batch = args.batch or (8 if args.tiny else 512)
    model = _model(shapes, dev, dtype)
    tok = _tokenizer(shapes["vocab_size"])
    adapter = ModelAdapter.for_model(model, tok, name="llama-3.1-8b-shaped (random)")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: random Llama-3.1-8B shapes{' (TINY)' if args.tiny else ''}, {n_params / 1e9:.2f} B "
          f"parameters, {dtype}, on {dev}")

    # (a) self-generation vs the decode roofline, after one untimed batch: the first pass over each
    # new KV length pays one-off kernel selection (cuDNN attention graphs), which 100K samples amortise
    with tempfile.TemporaryDirectory() as out:
        self_generate(model, tok, "rand1", batch, args.max_new_tokens, batch, out, seed=1, progress=False)
    with tempfile.TemporaryDirectory() as out:
        res = self_generate(model, tok, "rand1", samples, args.max_new_tokens, batch, out, seed=0,
                            progress=False)
        _sync(dev)
    gen_tps = res.n_tokens / res.seconds
    with tempfile.TemporaryDirectory() as out:  # the same, collecting C's keys of the edit layers as it goes
        stats = CovarianceStats(EDIT_LAYERS, shapes["intermediate_size"], base_metadata(adapter),
                                precision=args.collect_precision)
        res_c = self_generate(model, tok, "rand1", samples, args.max_new_tokens, batch, out, seed=0,
                              collect_layers=EDIT_LAYERS, stats=stats, progress=False)
        _sync(dev)
    gen_c_tps = res_c.n_tokens / res_c.seconds
    head_dim = shapes["hidden_size"] // shapes["num_attention_heads"]
    bytes_per = torch.finfo(dtype).bits // 8
    ctx = 2 + args.max_new_tokens / 2
    kv = batch * ctx * shapes["num_hidden_layers"] * 2 * shapes["num_key_value_heads"] * head_dim * bytes_per
    step_bytes = n_params * bytes_per + kv
    bw, dev_name = _bandwidth(dev, args.hbm_gbps)
    print(f"(a) self-generation: {res.n_tokens} tokens ({samples} samples, batch {batch}) in "
          f"{res.seconds:.1f} s = {gen_tps:,.0f} tokens/s")
    print("    roofline: tokens/s_max = batch × HBM_bandwidth / (weight_bytes + KV_bytes_per_step)")
    if bw:
        roof = batch * bw / step_bytes
        print(f"    {dev_name}: {bw / 1e12:.2f} TB/s, weights {n_params * bytes_per / 1e9:.1f} GB + KV "
              f"{kv / 1e9:.1f} GB per step -> {roof:,.0f} tokens/s; measured = {gen_tps / roof:.0%} of it")
    else:
        print("    (no HBM bandwidth known for this device: pass --hbm-gbps)")
    print(f"    collecting the keys of layers {EDIT_LAYERS[0]}-{EDIT_LAYERS[-1]} while generating "
          f"({args.collect_precision} products): {gen_c_tps:,.0f} tokens/s "
          f"({gen_c_tps / gen_tps:.0%} of plain generation)")

    # (b) C estimation over the 6 edit layers, one pass per batch
    c_tokens = args.c_tokens or (2048 if args.tiny else 12_288 * 8)
    seq = 512 if not args.tiny else 128
    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(3, shapes["vocab_size"], (seq,), generator=gen).tolist()
            for _ in range(c_tokens // seq)]
    loaded = LoadedModel(model, tok, adapter)
    t0 = time.perf_counter()
    stats = estimate(loaded, docs, EDIT_LAYERS, tokens_per_batch=12_288 if not args.tiny else 1024,
                     cache=False, progress=False, add_bos=False)
    _sync(dev)
    c_s = time.perf_counter() - t0
    c_tps = stats.n_tokens / c_s
    print(f"(b) C estimation, layers {EDIT_LAYERS[0]}-{EDIT_LAYERS[-1]}: {stats.n_tokens} tokens in "
          f"{c_s:.1f} s = {c_tps:,.0f} tokens/s")

    # (c) AlphaEdit projector on the key width (14 336 for Llama-3.1-8B)
    d = shapes["intermediate_size"]
    C = stats.mean(EDIT_LAYERS[0]).to(dev)
    _sync(dev)
    t0 = time.perf_counter()
    P, info = null_space_projector(C, TAU_REL, "relative")
    _sync(dev)
    print(f"(c) AlphaEdit projector (eigh, float64, {d}²): {time.perf_counter() - t0:.1f} s, "
          f"null space {info['null_dim']} of {d}")

    # (d) MEMIT closed form, 1 000 edits × 6 layers
    n_edits = 1000 if not args.tiny else 64
    K = torch.randn(d, n_edits, dtype=torch.float64, device=dev)
    R = torch.randn(shapes["hidden_size"], n_edits, dtype=torch.float64, device=dev)
    _sync(dev)
    t0 = time.perf_counter()
    for _ in EDIT_LAYERS:
        memit_delta(R, K, C, 15_000.0)
    _sync(dev)
    print(f"(d) MEMIT closed-form update, {n_edits} edits × {len(EDIT_LAYERS)} layers (float64): "
          f"{time.perf_counter() - t0:.1f} s")

    # (e) the paper's per-model pipeline
    total_tokens = 100_000 * args.max_new_tokens
    gen_min = total_tokens / gen_tps / 60
    gen_c_min = total_tokens / gen_c_tps / 60
    c_min = total_tokens / c_tps / 60
    print(f"(e) projected per-model pipeline: 100 000 samples × ≤ {args.max_new_tokens} tokens "
          f"({total_tokens / 1e6:.1f} M tokens, worst case)")
    print(f"    generation {gen_min:,.1f} min + C second pass {c_min:,.1f} min = {gen_min + c_min:,.1f} min; "
          f"with keys collected during generation: {gen_c_min:,.1f} min")
    print(f"    paper (A100): ≈ {PAPER_MINUTES:.0f} min; goal ≤ 30 min on one H100")


if __name__ == "__main__":
    main()
