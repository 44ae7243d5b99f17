"""The ``tf32`` precision of moir_lib.covariance (exact products of half-precision keys, float32 within a
batch, float64 across batches) against float64, to the bound the module doc states; and how
``precision="auto"`` resolves and is recorded."""

from __future__ import annotations

import pytest
import torch
from tiny import random_documents, tiny_loaded

from moir_lib import covariance as C

U32 = 2.0**-24  # float32 unit roundoff (round to nearest; tensor cores that truncate: 2**-23)
U64 = 2.0**-53


def gamma(m: int, u: float) -> float:
    """Higham's ``γ_m = m·u / (1 - m·u)``: the relative bound of a sum of ``m + 1`` terms in any order."""
    return m * u / (1 - m * u)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def keys_like_an_mlp(n: int, d: int, seed: int) -> torch.Tensor:
    """bf16 keys with SiLU-gated statistics (heavy positive tail, mean off zero, a few large columns)."""
    g = torch.Generator().manual_seed(seed)
    gate, up = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    scale = torch.ones(d)
    scale[:: max(1, d // 16)] = 8.0
    return (torch.nn.functional.silu(gate) * up * scale).to(torch.bfloat16)


@pytest.mark.parametrize("d", [96, 1100])  # one block; several 1024-column blocks (the upper-triangle path)
def test_tf32_path_is_within_the_float32_accumulation_bound_of_float64(d):
    batches = [keys_like_an_mlp(n, d, seed) for seed, n in enumerate([512, 300, 512, 77])]
    fast = C.CovarianceStats([0], d, precision="tf32", flush_tokens=1)  # one product per batch, as estimate()
    for k in batches:
        fast.update(0, k)
    keys = torch.cat(batches).double()  # bf16 values: every product k_a·k_b is exact in float64 too
    reference = keys.T @ keys
    magnitude = keys.abs().T @ keys.abs()  # Σ_t |k_ta k_tb|, the scale of every rounding error
    n_max, n_batches, n_total = max(len(k) for k in batches), len(batches), len(keys)
    # float32 within a batch + float64 across batches (ours) + float64 over all keys (the reference)
    bound = (gamma(n_max - 1, U32) * (1 + gamma(n_batches, U64)) + gamma(n_batches, U64)
             + gamma(n_total - 1, U64)) * magnitude * (1 + 1e-12)
    error = (fast.sum(0) - reference).abs()
    assert bool((error <= bound).all()), f"worst error/bound {float((error / bound).nan_to_num().max()):.3g}"
    assert float(error.max()) > 0  # the float32 accumulation did round: the path under test ran
    relative = float((fast.sum(0) - reference).norm() / reference.norm())
    assert relative <= 1e-6  # the figure the GPU benchmark reports
    assert fast.metadata["precision"] == "tf32" and fast.count(0) == n_total


def test_tf32_refuses_keys_it_would_round():
    stats = C.CovarianceStats([0], 8, precision="tf32", flush_tokens=1)
    with pytest.raises(ValueError, match="only for float16/bfloat16 keys"):
        stats.update(0, torch.randn(4, 8))
    assert stats.count(0) == 0  # refused before anything was counted
    half = torch.randn(1, 8).to(torch.float16)  # fp16 keeps 11 significant bits: TF32 holds them all
    stats.update(0, half)
    assert torch.equal(stats.sum(0), half.double().T @ half.double())  # one key: every product exact


def test_auto_precision_resolves_per_device_and_dtype():
    resolve = C.resolve_precision
    assert resolve("auto", "cuda:0", torch.bfloat16) == "tf32"
    assert resolve("auto", torch.device("cuda"), torch.float16) == "tf32"
    assert resolve("auto", "cuda", torch.float32) == "float64"
    assert resolve("auto", "cpu", torch.bfloat16) == "float64"
    assert resolve("float32", "cpu", torch.float32) == "float32"
    with pytest.raises(ValueError, match="exact only for float16/bfloat16 models"):
        resolve("tf32", "cuda", torch.float32)
    with pytest.raises(ValueError, match="unknown precision 'tf16'"):
        resolve("tf16", "cpu", torch.float32)


def test_estimate_records_the_resolved_precision_in_metadata_and_fingerprint(tmp_path):
    docs = random_documents(12, seed=3)
    loaded = tiny_loaded("llama", n_layers=3, seed=0)
    auto = C.estimate(loaded, docs, [1, 2], cache=tmp_path, corpus_spec="docs", progress=False)
    float64 = C.estimate(loaded, docs, [1, 2], C.EstimationSettings(precision="float64"), cache=tmp_path,
                         corpus_spec="docs", progress=False)
    assert auto.metadata["precision"] == "float64" and float64.from_cache  # same fingerprint on the CPU
    with pytest.raises(ValueError, match="exact only for float16/bfloat16 models"):
        C.estimate(loaded, docs, [1, 2], C.EstimationSettings(precision="tf32"), cache=False, progress=False)

    half = tiny_loaded("llama", n_layers=3, seed=0, dtype=torch.bfloat16)
    tf32 = C.estimate(half, docs, [1, 2], C.EstimationSettings(precision="tf32"), cache=tmp_path,
                      corpus_spec="docs", progress=False)
    exact = C.estimate(half, docs, [1, 2], C.EstimationSettings(precision="float64"), cache=tmp_path,
                       corpus_spec="docs", progress=False)
    assert not exact.from_cache and tf32.metadata["fingerprint"] != exact.metadata["fingerprint"]
    assert tf32.metadata["precision"] == "tf32"
    assert C.CovarianceStats.load(tf32.path).precision == "tf32"
    for layer in (1, 2):
        assert float((tf32.sum(layer) - exact.sum(layer)).norm() / exact.sum(layer).norm()) <= 1e-6
    with pytest.raises(ValueError, match="precision"):
        tf32.merge(exact)
