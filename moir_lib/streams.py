"""Counter-based random streams of self-generation: one SplitMix64 stream per (seed, sample index, purpose).

``stream_key(seed, index, purpose)`` is 64 bits of ``blake2b("moir-gen/<seed>/<index>/<purpose>")``;
output ``t`` of the stream is the SplitMix64 output function of ``key + (t + 1)·φ`` (φ the 64-bit golden
ratio). A sample's draws depend only on ``(seed, index)``, never on the batch it is decoded in or the
shard that decodes it: the sampled token at step ``t`` is the inverse CDF at ``uniforms(keys, t)``
(:mod:`moir_lib.generation`), the random seed tokens come from the ``seed`` purpose, and the vLLM
request seed from the ``vllm`` purpose (:mod:`moir_lib.vllm_backend`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = ["sample_uniforms", "splitmix64", "stream", "stream_key", "uniforms"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def stream_key(seed: int, index: int, purpose: str) -> np.uint64:
    """The key of sample ``index``'s ``purpose`` stream (``sample``, ``seed``, ``vllm``) under ``seed``."""
    digest = hashlib.blake2b(f"moir-gen/{seed}/{index}/{purpose}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def splitmix64(state: np.ndarray) -> np.ndarray:
    """The SplitMix64 output function of ``state`` (uint64 array; arithmetic wraps mod 2^64)."""
    with np.errstate(over="ignore"):
        z = state.astype(np.uint64, copy=True)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def stream(keys: np.ndarray, t: int) -> np.ndarray:
    """Output ``t`` (0-based) of the SplitMix64 streams seeded with ``keys``: ``(b,)`` uint64."""
    with np.errstate(over="ignore"):
        return splitmix64(keys + _GOLDEN * np.uint64(t + 1))


def uniforms(keys: np.ndarray, t: int) -> np.ndarray:
    """Output ``t`` of the streams ``keys`` as float64 uniforms in ``[0, 1)`` (the top 53 bits)."""
    return (stream(keys, t) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def sample_uniforms(seed: int, indices: Sequence[int], t: int) -> np.ndarray:
    """``u_{i,t}`` in ``[0, 1)`` (float64, 53 random bits) per sample index ``i``: the sampling stream."""
    return uniforms(np.array([stream_key(seed, i, "sample") for i in indices], dtype=np.uint64), t)
