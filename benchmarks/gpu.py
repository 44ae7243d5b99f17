"""The paper's per-model pipeline on one GPU, with a random model of Llama-3.1-8B's exact shapes.

Prints measured numbers (never pass/fail); no download is needed:

(a) self-generation tokens/s at the paper's settings (rand×1, untruncated sampling, up to
    ``--max-new-tokens`` 256) for each backend — ``torch`` with the dynamic loop, ``torch`` with the
    static loop (CUDA-graph captured on a GPU), ``vllm`` (GPU only; random "dummy" weights of the same
    shapes) — against the compute-aware decode roofline. One decode step reads every weight once and
    the KV cache of every row, and multiplies every row through every matrix::

        t_step = max(bytes / HBM_bandwidth, FLOPs / peak_FLOP/s)
        bytes  = weight_bytes + batch × ctx × n_layers × 2 × n_kv_heads × head_dim × bytes_per_value
        FLOPs  = batch × (2 × matmul_params + 4 × n_layers × ctx × n_heads × head_dim)
        tokens/s_max = batch / t_step

    (``ctx``: the mean context over the generation; ``matmul_params``: every weight but the input
    embedding). Both bounds are printed. A random model rarely samples EOS, so every row runs to
    the full length: the worst case of the paper's ≤ 256 tokens.
(b) C estimation tokens/s for the 6 edit layers (3-8) in one pass per batch of 12 288 tokens,
    stopping after layer 8, for each precision of the batch products (float64; float32; tf32: exact
    products of the bf16 keys, float32 within a batch, float64 across), with the relative difference
    ``‖C_p − C_float64‖_F / ‖C_float64‖_F`` (worst layer) beside the speed.
(c) AlphaEdit's projector (``eigh`` of a 14 336² float64 C).
(d) MEMIT's closed-form update for a batch of 1 000 edits on the 6 layers (float64 Cholesky
    solves; the per-request z optimisation is measured by ``benchmarks/editing.py``).
(e) the projected wall time of the paper's pipeline per model — 100 000 samples × ≤ 256 tokens of
    self-generation, plus C over them — for each backend, with C at the default precision
    (``precision="auto"``) and at the fastest one, against the paper's ≈ 2 h 15 min on an A100.
    Goal: ≤ 22 min on one H100.

    python benchmarks/gpu.py --device cuda          # on a GPU node (the `device` tool here)
    python benchmarks/gpu.py --device cpu           # CPU smoke run of the same code on tiny shapes
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
#: HBM bandwidth (bytes/s) and dense bf16 tensor-core peak (FLOP/s) by device-name fragment, most
#: specific first (vendors' data sheets).
DEVICES = (("H200", 4.8e12, 989e12), ("H100 PCIe", 2.0e12, 756e12), ("H100 NVL", 3.9e12, 835e12),
           ("H100", 3.35e12, 989e12), ("A100-SXM4-80GB", 2.04e12, 312e12), ("A100", 1.56e12, 312e12))
PAPER_MINUTES = 135.0
GOAL_MINUTES = 22.0
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


def _device_limits(device: str, hbm_gbps: float | None, peak_tflops: float | None
                   ) -> tuple[float | None, float | None, str]:
    """(HBM bytes/s, peak FLOP/s, device name): the data-sheet values, or the ones given."""
    import torch

    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    bw = peak = None
    for fragment, b, p in DEVICES:
        if fragment in name:
            bw, peak = b, p
            break
    return (hbm_gbps * 1e9 if hbm_gbps else bw), (peak_tflops * 1e12 if peak_tflops else peak), name


def roofline(model, batch: int, ctx: float, bw: float | None, peak: float | None) -> dict:
    """Per decode step: bytes, FLOPs, both time bounds and the tokens/s bound (module doc)."""
    cfg = model.config
    elem = next(model.parameters()).element_size()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    n_params = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    matmul_params = n_params - (0 if tied else embedding.numel())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv = batch * ctx * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * elem
    flops = batch * (2 * matmul_params + 4 * cfg.num_hidden_layers * ctx * cfg.num_attention_heads * head_dim)
    out = {"weight_bytes": weight_bytes, "kv_bytes": kv, "flops": flops, "t_bw": None, "t_flops": None,
           "tokens_per_s": None}
    if bw:
        out["t_bw"] = (weight_bytes + kv) / bw
    if peak:
        out["t_flops"] = flops / peak
    bounds = [t for t in (out["t_bw"], out["t_flops"]) if t]
    if bounds:
        out["tokens_per_s"] = batch / max(bounds)
    return out


def _vllm_engine(model, tok, max_len: int):
    """A vLLM engine of ``model``'s shapes with random ("dummy") weights, or the reason there is none."""
    import torch

    from moir_lib.vllm_backend import check_available

    try:
        check_available()
        import vllm
    except (RuntimeError, ImportError) as exc:
        return None, str(exc)
    folder = Path(tempfile.mkdtemp(prefix="moir-vllm-"))
    model.config.save_pretrained(folder)
    tok.save_pretrained(folder)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    model.to("cpu")  # the HF copy only names the model now (fingerprint, EOS): free the GPU for vLLM
    torch.cuda.empty_cache()
    try:
        engine = vllm.LLM(model=str(folder), tokenizer=str(folder), load_format="dummy", dtype=dtype,
                          max_model_len=max_len, seed=0)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports the exact error and goes on
        return None, f"{type(exc).__name__}: {exc}"
    return engine, None


def _share(rate: float, roof: dict) -> str:
    return f", {rate / roof['tokens_per_s']:.0%} of the roofline" if roof["tokens_per_s"] else ""


def torch_generation(args, model, tok, dev: str, roof: dict) -> dict[str, float]:
    """(a) with our sampler: tokens/s per loop (and collecting C's keys on the way), each after one
    untimed warm-up batch (kernel selection; graph capture for the static loop)."""
    from moir_lib.covariance import CovarianceStats, base_metadata, resolve_precision
    from moir_lib.generation import GenerationSettings, self_generate
    from moir_lib.models import ModelAdapter

    batch, samples, max_new = args.batch, args.samples, args.max_new_tokens
    precision = resolve_precision(args.collect_precision, dev, next(model.parameters()).dtype)
    runs = {f"torch, {loop} loop": {"loop": loop} for loop in args.loops}
    runs[f"torch, dynamic loop, collecting keys ({precision})"] = {"loop": "dynamic",
                                                                    "collect_layers": EDIT_LAYERS}
    rates: dict[str, float] = {}
    for label, gen in runs.items():
        with tempfile.TemporaryDirectory() as out:
            warm = GenerationSettings("rand1", batch, max_new, batch, seed=1, loop=gen["loop"])
            self_generate(model, tok, warm, out, progress=False)
        stats = None
        if "collect_layers" in gen:
            adapter = ModelAdapter.for_model(model, tok)
            stats = CovarianceStats(EDIT_LAYERS, adapter.key_dim, base_metadata(adapter, precision),
                                    precision=precision)
        with tempfile.TemporaryDirectory() as out:
            timed = GenerationSettings("rand1", samples, max_new, batch, seed=0, **gen)
            res = self_generate(model, tok, timed, out, progress=False, stats=stats)
            _sync(dev)
        rates[label] = res.n_tokens / res.seconds
        print(f"(a) {label}: {res.n_tokens} tokens ({samples} samples, batch {batch}) in {res.seconds:.1f} s "
              f"= {rates[label]:,.0f} tokens/s{_share(rates[label], roof)}")
    return rates


def vllm_generation(args, model, tok, dev: str, roof: dict, base: float | None) -> float | None:
    """(a) with vLLM on the same shapes (random weights), after one untimed warm-up batch."""
    from moir_lib.generation import GenerationSettings, self_generate

    engine, error = _vllm_engine(model, tok, 2 + args.max_new_tokens)
    if engine is None:
        print(f"(a) vllm: not run: {error}")
        return None
    kw = {"progress": False, "engine": engine}
    with tempfile.TemporaryDirectory() as out:
        self_generate(model, tok, GenerationSettings("rand1", args.batch, args.max_new_tokens, args.batch,
                                                     seed=1, backend="vllm"), out, **kw)
    with tempfile.TemporaryDirectory() as out:
        res = self_generate(model, tok, GenerationSettings("rand1", args.samples, args.max_new_tokens,
                                                           args.samples, seed=0, backend="vllm"), out, **kw)
        _sync(dev)
    rate = res.n_tokens / res.seconds
    ratio = f" = {rate / base:.2f}× our fastest loop" if base else ""
    print(f"(a) vllm: {res.n_tokens} tokens ({args.samples} samples, one request batch) in "
          f"{res.seconds:.1f} s = {rate:,.0f} tokens/s{ratio}{_share(rate, roof)}")
    return rate


def print_roofline(roof: dict, batch: int, name: str) -> None:
    print(f"(a) roofline per decode step at batch {batch}: weights {roof['weight_bytes'] / 1e9:.2f} GB + KV "
          f"{roof['kv_bytes'] / 1e9:.2f} GB, {roof['flops'] / 1e12:.3f} TFLOP")
    if roof["tokens_per_s"]:
        t_bw = f"{roof['t_bw'] * 1e3:.2f} ms" if roof["t_bw"] else "unknown"
        t_fl = f"{roof['t_flops'] * 1e3:.2f} ms" if roof["t_flops"] else "unknown"
        print(f"    {name}: bandwidth bound {t_bw}, compute bound {t_fl} per step -> "
              f"{roof['tokens_per_s']:,.0f} tokens/s at most")
    else:
        print(f"    ({name}: no data-sheet bandwidth or peak: pass --hbm-gbps and --peak-tflops)")


def covariance(args, model, tok, adapter, shapes: dict, dev: str) -> tuple[dict[str, float], dict, str]:
    """(b): C tokens/s per precision and its relative difference from float64."""
    import torch

    from moir_lib.covariance import EstimationSettings, estimate, resolve_precision
    from moir_lib.models import LoadedModel

    c_tokens = args.c_tokens or (2048 if args.tiny else 12_288 * 8)
    seq = 128 if args.tiny else 512
    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(3, shapes["vocab_size"], (seq,), generator=gen).tolist()
            for _ in range(c_tokens // seq)]
    loaded = LoadedModel(model, tok, adapter)
    dtype = next(model.parameters()).dtype
    auto = resolve_precision("auto", dev, dtype)
    precisions = [p for p in args.precisions if p != "tf32" or dtype in (torch.bfloat16, torch.float16)]
    rates, stats = {}, {}
    for p in precisions:
        t0 = time.perf_counter()
        tokens_per_batch = 1024 if args.tiny else 12_288
        settings = EstimationSettings(tokens_per_batch=tokens_per_batch, add_bos=False, precision=p)
        stats[p] = estimate(loaded, docs, EDIT_LAYERS, settings, cache=False, progress=False)
        _sync(dev)
        rates[p] = stats[p].n_tokens / (time.perf_counter() - t0)
    ref = stats.get("float64")
    for p in precisions:
        err = ""
        if ref is not None and p != "float64":
            worst = max(float((stats[p].sum(l) - ref.sum(l)).norm() / ref.sum(l).norm()) for l in EDIT_LAYERS)
            err = f", relative difference from float64 {worst:.1e} (worst layer)"
        tag = f"{p} (auto)" if p == auto else p
        print(f"(b) C estimation, layers {EDIT_LAYERS[0]}-{EDIT_LAYERS[-1]}, {tag}: {stats[p].n_tokens} "
              f"tokens = {rates[p]:,.0f} tokens/s{err}")
    return rates, stats, auto


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (the default on the CPU)")
    ap.add_argument("--dtype", default="bfloat16", help="model dtype (bfloat16: the paper's half precision)")
    ap.add_argument("--samples", type=int, default=None, help="samples generated for (a)")
    ap.add_argument("--batch", type=int, default=None, help="generation batch size")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 256 (paper); 16 with --tiny")
    ap.add_argument("--c-tokens", type=int, default=None, help="tokens for (b)")
    ap.add_argument("--backends", default="torch,vllm", help="comma-separated: torch, vllm")
    ap.add_argument("--loops", default="dynamic,static", help="torch decode loops to measure")
    ap.add_argument("--precisions", default="float64,float32,tf32", help="C precisions to measure")
    ap.add_argument("--collect-precision", default="float64", choices=["auto", "float64", "float32", "tf32"],
                    help="precision of the key products when C is collected during generation")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="HBM bandwidth in GB/s (default: by device)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="dense half-precision peak in TFLOP/s (default: by device, data sheet)")
    args = ap.parse_args()
    args.backends, args.loops = args.backends.split(","), args.loops.split(",")
    args.precisions = args.precisions.split(",")

    import torch

    from moir_lib.editing.alphaedit import null_space_projector
    from moir_lib.editing.memit import memit_delta
    from moir_lib.models import ModelAdapter

    torch.manual_seed(0)
    dev = args.device
    args.tiny = args.tiny or not dev.startswith("cuda")
    shapes = TINY if args.tiny else LLAMA_8B
    dtype = getattr(torch, args.dtype)
    args.samples = args.samples or (16 if args.tiny else 1024)
    args.max_new_tokens = args.max_new_tokens or (16 if args.tiny else 256)
    args.batch = args.batch or (8 if args.tiny else 512)
    model = _model(shapes, dev, dtype)
    tok = _tokenizer(shapes["vocab_size"])
    adapter = ModelAdapter.for_model(model, tok, name="llama-3.1-8b-shaped (random)")
    n_params = sum(p.numel() for p in model.parameters())
    bw, peak, name = _device_limits(dev, args.hbm_gbps, args.peak_tflops)
    print(f"model: random Llama-3.1-8B shapes{' (TINY)' if args.tiny else ''}, {n_params / 1e9:.3f} B "
          f"parameters, {dtype}, on {dev} ({name})")

    roof = roofline(model, args.batch, 2 + args.max_new_tokens / 2, bw, peak)
    print_roofline(roof, args.batch, name)
    gen_rates = torch_generation(args, model, tok, dev, roof) if "torch" in args.backends else {}
    c_rates, stats, auto = covariance(args, model, tok, adapter, shapes, dev)

    # (c) AlphaEdit projector on the key width (14 336 for Llama-3.1-8B)
    d = shapes["intermediate_size"]
    C = stats[next(iter(stats))].mean(EDIT_LAYERS[0]).to(dev)
    _sync(dev)
    t0 = time.perf_counter()
    P, info = null_space_projector(C, TAU_REL, "relative")
    _sync(dev)
    print(f"(c) AlphaEdit projector (eigh, float64, {d}²): {time.perf_counter() - t0:.1f} s, "
          f"null space {info['null_dim']} of {d}")

    # (d) MEMIT closed form, 1 000 edits × 6 layers
    n_edits = 64 if args.tiny else 1000
    K = torch.randn(d, n_edits, dtype=torch.float64, device=dev)
    R = torch.randn(shapes["hidden_size"], n_edits, dtype=torch.float64, device=dev)
    _sync(dev)
    t0 = time.perf_counter()
    for _ in EDIT_LAYERS:
        memit_delta(R, K, C, 15_000.0)
    _sync(dev)
    print(f"(d) MEMIT closed-form update, {n_edits} edits × {len(EDIT_LAYERS)} layers (float64): "
          f"{time.perf_counter() - t0:.1f} s")
    del P, C, K, R, stats

    if "vllm" in args.backends:  # last: it takes the GPU (the HF copy moves to the CPU)
        ours = max((r for k, r in gen_rates.items() if "collecting" not in k), default=None)
        rate = vllm_generation(args, model, tok, dev, roof, ours)
        if rate:
            gen_rates["vllm"] = rate

    # (e) the paper's per-model pipeline
    total = 100_000 * args.max_new_tokens
    fastest = max(c_rates, key=c_rates.get)
    print(f"(e) projected per-model pipeline: 100 000 samples × ≤ {args.max_new_tokens} tokens "
          f"({total / 1e6:.1f} M tokens, worst case); C at {auto} (auto) / {fastest} (fastest)")
    for label, rate in gen_rates.items():
        gen_min = total / rate / 60
        if "collecting" in label:
            print(f"    {label}: {gen_min:,.1f} min in all (C needs no second pass)")
            continue
        c_auto = total / c_rates[auto] / 60 if auto in c_rates else float("nan")
        c_fast = total / c_rates[fastest] / 60
        print(f"    {label}: generation {gen_min:,.1f} min + C {c_auto:,.1f} / {c_fast:,.1f} min = "
              f"{gen_min + c_auto:,.1f} / {gen_min + c_fast:,.1f} min")
    print(f"    paper (A100): ≈ {PAPER_MINUTES:.0f} min; goal ≤ {GOAL_MINUTES:.0f} min on one H100")


if __name__ == "__main__":
    main()
