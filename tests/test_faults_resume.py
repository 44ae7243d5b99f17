"""Interrupted computations resume to the result of an uninterrupted run, bit for bit.

An estimate of ``C`` is stopped at several points (an exception from the model's forward pass, as
SIGINT raises), resumed from its checkpoint and compared with one uninterrupted run; a checkpoint
file's sums land at an arbitrary offset of the file, so loading must not carry that offset into
the accumulation (MKL rounds a product added into a misaligned matrix differently).
"""

from __future__ import annotations

import pytest
import torch
from tiny import random_documents, tiny_loaded

from moir_lib import covariance as C
from moir_lib.covariance.stats import _ALIGN


@pytest.fixture(scope="module")
def llama():
    return tiny_loaded("llama", n_layers=4, seed=0)


class Interrupt(KeyboardInterrupt):
    pass


def interrupted_after(lm, n_batches: int):
    """A forward pre-hook that raises :class:`Interrupt` at the ``n_batches + 1``-th forward pass."""
    calls = {"n": 0}

    def hook(*_):
        calls["n"] += 1
        if calls["n"] > n_batches:
            raise Interrupt

    return lm.adapter.layers[0].register_forward_pre_hook(hook)


def test_loaded_sums_are_aligned(tmp_path):
    stats = C.CovarianceStats([0, 1], 24)
    for pad in range(8):  # header lengths move the tensors' offsets in the file
        stats.metadata["pad"] = "x" * pad
        stats.update(0, torch.randn(5, 24))
        stats.update(1, torch.randn(5, 24))
        loaded = C.CovarianceStats.load(stats.save(tmp_path / f"s{pad}.safetensors"))
        assert all(loaded._acc[layer].data_ptr() % _ALIGN == 0 for layer in (0, 1))
        assert torch.equal(loaded.sum(0), stats.sum(0))


def test_misaligned_accumulator_is_realigned():
    keys = torch.randn(300, 24, dtype=torch.float64)
    aligned = C.CovarianceStats([0], 24)
    aligned.update(0, keys)
    buffer = torch.zeros(24 * 24 + 1, dtype=torch.float64)
    shifted = C.CovarianceStats([0], 24)
    shifted._acc[0] = buffer[1:].view(24, 24)  # 8 bytes off the allocator's alignment
    shifted._acc[0].copy_(aligned.sum(0))
    aligned.update(0, 3 * keys)
    shifted.update(0, 3 * keys)
    assert torch.equal(shifted.sum(0), aligned.sum(0))
    assert shifted._acc[0].data_ptr() % _ALIGN == 0


@pytest.mark.parametrize("tokens_per_batch", [pytest.param(128, marks=pytest.mark.slow), 512])
def test_interrupted_estimate_resumes_bit_for_bit(llama, tmp_path, tokens_per_batch):
    docs = random_documents(1500, seed=7)
    kwargs = {"settings": C.EstimationSettings(tokens_per_batch=tokens_per_batch, checkpoint_every=1),
              "corpus_spec": "resume-bits", "progress": False}
    counted = {"n": 0}
    handle = llama.adapter.layers[0].register_forward_pre_hook(lambda *_: counted.update(n=counted["n"] + 1))
    straight = C.estimate(llama, docs, [1, 3], cache=False, **kwargs)
    handle.remove()
    for i, share in enumerate((0.45, 0.7, 0.9)):  # past the first window (a checkpoint), before the end
        cache = tmp_path / f"cache-{i}"
        handle = interrupted_after(llama, int(share * counted["n"]))
        try:
            with pytest.raises(Interrupt):
                C.estimate(llama, docs, [1, 3], cache=cache, **kwargs)
        finally:
            handle.remove()
        assert list(cache.glob("covariance/*/checkpoint.safetensors")), "no checkpoint before the stop"
        resumed = C.estimate(llama, docs, [1, 3], cache=cache, **kwargs)
        for layer in (1, 3):
            assert resumed.count(layer) == straight.count(layer)
            assert torch.equal(resumed.sum(layer), straight.sum(layer)), f"stopped at {share:.0%}"
