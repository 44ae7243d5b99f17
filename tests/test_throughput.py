"""``benchmarks/throughput.py``: the FLOPs it counts are the model's, and its quick run reports every phase
against the GEMM peak (measured numbers are not checked: they depend on the machine)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("pretraining step", "chat SFT step", "z fitting", "preservation scoring", "self-generation")


@pytest.fixture(scope="module")
def bench():
    path = ROOT / "benchmarks" / "throughput.py"
    spec = importlib.util.spec_from_file_location("throughput_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _micro_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from moir_lib.pocket.variants import get_variant

    spec = get_variant("micro").model
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads, max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True))


@pytest.mark.parametrize("bf16", [False, True])
def test_a_training_step_counts_the_flops_worked_out_by_hand(bench, bf16):
    """Forward and backward of the micro model: every linear layer's three matmuls, the fused CPU attention
    (which torch's own table lacks) forward and backward, and the rotary product, in the precision autocast
    gives them."""
    import contextlib

    import torch

    model = _micro_llama()
    batch, seq = 4, 32
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    _, flops = bench.count_flops(step)
    assert sum(flops.values()) == bench.analytic_step_flops(model.config, batch, seq)
    if bf16:  # only the rotary angles stay float32 under autocast
        assert flops["float32"] == seq * model.config.hidden_size // model.config.num_attention_heads
        assert flops["bfloat16"] > 1000 * flops["float32"]
    else:
        assert set(flops) == {"float32"}


def test_inference_mode_counts_the_composite_ops_it_reaches(bench):
    """Under ``torch.inference_mode`` (self-generation) the dispatch mode sees ``linear``, ``matmul`` and
    ``scaled_dot_product_attention`` undecomposed: they count as their parts, as a forward with autograd."""
    import torch

    model = _micro_llama().eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, plain = bench.count_flops(lambda: model(input_ids=ids))
    with torch.inference_mode():
        _, inference = bench.count_flops(lambda: model(input_ids=ids))
    assert plain["float32"] > 0 and inference == plain


def _row(out: str, phase: str) -> list[str]:
    lines = [line for line in out.splitlines() if line.startswith(f"| {phase} |")]
    assert len(lines) == 1, (phase, out)
    return [cell.strip() for cell in lines[0].strip("|").split("|")]


def test_the_quick_run_reports_every_phase_against_the_peak(bench, tmp_path, monkeypatch, capsys):
    """``--quick`` in an empty cache: a random model of the micro config (nothing built, nothing cached),
    a GEMM table with its peaks, and each phase's wall time, FLOPs, share of the peak and reading."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MOIR_CACHE", str(cache))
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "randomly initialised model of the micro config" in out
    peak = _row(out, "**peak** (best shape)")
    assert len(peak) == 2 + len(bench.PRECISIONS) * len(bench.THREADS)
    assert all(float(c.strip("*").replace(",", "")) > 0 for c in peak[2:])
    for phase in PHASES:
        _, work, threads, wall, flops, achieved, share, reading = _row(out, phase)
        assert float(wall) > 0 and float(achieved.replace(",", "")) > 0, (phase, work)
        assert re.fullmatch(r"[\d,.]+%", share), (phase, share)
        assert reading.startswith(("near the limit", "far from it")), (phase, reading)
        assert sum(float(part.split()[0]) for part in flops.split(", ")) > 0, (phase, flops)
    for phase in PHASES[:2]:  # the counter agrees with the analytic count through the training loop itself
        assert "counted / (6·N·T + attention) = 1.0000" in _row(out, phase)[1]
    assert not (cache / "pocket").exists(), "the benchmark builds nothing"
    kept = [name for name, m in list(sys.modules.items())
            if getattr(getattr(m, "build", None), "__module__", None) == bench.__name__]
    assert not kept, f"{kept} keep the benchmark's stand-in for the pocket build"
