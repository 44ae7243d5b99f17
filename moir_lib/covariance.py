"""Key covariances ``C = E[k kᵀ]`` at the key site (eq. 2, Algorithm 1, eq. ``memoir_estimator``).

The key ``k = φ_ℓ(x)`` of layer ``ℓ`` is the *input* of the second MLP projection ``W_out^ℓ``
(``mlp.down_proj``; GPT-2's ``mlp.c_proj``), located by :class:`moir_lib.models.ModelAdapter`.
Closed-form editors protect the span of these keys: MEMIT regularises with ``λ·C``, AlphaEdit
projects onto the null space of ``C``.

- :class:`CovarianceStats` holds, per layer, the float64 sum ``S = Σ_i k_i k_iᵀ`` and the token
  count ``N``. Sums are exact to float64 rounding, so statistics of disjoint shards
  :meth:`~CovarianceStats.merge` into those of one run. :meth:`~CovarianceStats.mean` is
  ``Ĉ = S / N`` (eq. ``memoir_estimator``): the **per-token normalised** second moment, the
  convention of ROME/MEMIT's ``layer_stats`` (``mom2.moment()``) for which MEMIT's ``λ = 15 000``
  (``mom2_update_weight``) and AlphaEdit's thresholds are tuned. Saved as one safetensors
  file with the JSON metadata in its header (atomic replace).
- :class:`KeyCollector` hooks (forward *pre*-hooks) the key modules of all requested layers
  at once, for one forward pass over a padded batch or for incremental decoding (inputs
  ``(b, 1, d)``); :meth:`~KeyCollector.set_mask` says which positions count.
- :func:`estimate` runs a corpus through the model: every edit layer in one forward pass,
  documents packed into batches by a token budget, padding ignored, the pass stopped right
  after the last edit layer's key is read (a private exception raised from that layer's hook:
  no later layer, final norm or LM head runs), checkpointed and resumable, and cached on disk
  under a fingerprint of everything that determines the result.
- :func:`mix` composes oracle mixtures ``C = Σ_i w_i C_i`` (appendix A.2: the uncentered
  covariance is linear in the distribution); :func:`diagnose` gives eigen-spectra, effective
  ranks, principal angles and domain coverage (the paper's knowledge-coverage figure).

**Which positions count.** Like ``layer_stats`` (which counts every token of the tokenized
text), :func:`estimate` counts every non-padding position by default, BOS included when the
tokenizer adds one (``add_bos=None`` tokenizes exactly as ``tokenizer(text)`` does). BOS keys
are often outliers (attention-sink activations with a large norm), one per document:
``count_bos=False`` still feeds BOS as context but leaves its key out of ``C``.

**Precision.** ``precision="float64"`` forms each batch's ``KᵀK`` in float64.
``"float32"`` forms it in float32 (per batch, ≤ ``tokens_per_batch`` terms, as ``layer_stats``
and the paper do for the whole sum) and adds it to the float64 sum, at ~1e-7 relative error
per batch. On CUDA, float16/bfloat16 keys then go to a half-precision GEMM with float32 output
(exact products, tensor-core speed): far faster than float64 there. On CPU it only pays at
large batches (≳1k tokens per product; below that the float64 accumulator's memory traffic
dominates either way). ``"tf32"`` (float16/bfloat16 keys only) converts the keys to float32 —
exactly: TF32's 11 significant bits hold every bf16/fp16 value — and forms each block product
as a float32 GEMM with TF32 tensor cores allowed on CUDA (``torch.set_float32_matmul_precision``
is set to ``"high"`` around the product and restored): every product ``k_a k_b`` is exact, only
the float32 accumulation within one batch of ``n`` keys rounds, ``|ΔS| ≤ γ_{n-1}·|K|ᵀ|K|``
elementwise with ``γ_m = m·u/(1 - m·u)``, ``u = 2⁻²⁴`` (``2⁻²³`` where tensor cores truncate),
and the float64 sum across batches adds ``γ_B`` (float64, ``B`` batches) on top. On CPU the same
arithmetic runs as a plain float32 GEMM (tested against float64 to that bound).
``precision="auto"`` (:func:`estimate`'s default, see :func:`resolve_precision`) is ``"tf32"``
for half-precision models on CUDA and ``"float64"`` otherwise. The resolved name is recorded in
the metadata and the cache fingerprint, and statistics of different precisions are not merged.
Only the upper triangle of each product is computed (blocks of 1024 columns, about half the
arithmetic for wide keys); the full symmetric matrix is returned.

**Memory.** One ``d×d`` float64 accumulator per layer (1.6 GB at ``d = 14 336``, 9.9 GB for
six layers), on the device of the keys, plus up to ``flush_tokens`` buffered keys per layer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.cache import DamagedFile, fingerprint
from moir_lib.cache import cache_dir as _cache_root

if TYPE_CHECKING:
    import pandas as pd
    from torch import Tensor

    from moir_lib.models import ModelAdapter

__all__ = [
    "FORMAT",
    "IDENTITY_FIELDS",
    "CovarianceStats",
    "Diagnosis",
    "KeyCollector",
    "base_metadata",
    "check_disjoint",
    "coverage",
    "diagnose",
    "effective_rank",
    "estimate",
    "estimate_key",
    "mix",
    "participation_ratio",
    "principal_angles",
    "read_metadata",
    "resolve_precision",
    "spectrum",
    "tokenizer_fingerprint",
    "top_eigenspace",
]

log = logging.getLogger(__name__)

FORMAT = "moir-covariance/1"
#: metadata fields that must agree for statistics to be merged or mixed.
IDENTITY_FIELDS = ("model", "key_site", "key_dim", "dtype", "precision", "tokenization")
PRECISIONS = ("float64", "float32", "tf32")
_BLOCK = 1024
_FINAL = "stats.safetensors"
_CHECKPOINT = "checkpoint.safetensors"
_WINDOW_BATCHES = 16  # documents are sorted by length within windows of this many batches' tokens


# ============================================================================ statistics


def _torch():
    import torch

    return torch


def _upper_addmm_(acc: Tensor, k: Tensor, beta: float = 1.0) -> None:
    """``acc ← beta·acc + kᵀk`` on the block upper triangle (the upper triangle of ``acc`` is exact).

    Column blocks of ``_BLOCK``: block row ``I`` gets ``k_Iᵀ k_{I:}``, so every element on or
    above the diagonal is written and about half of the products of a full ``kᵀk`` are skipped
    for wide keys. Elements below the diagonal are meaningless; read through :func:`_symmetric`.
    """
    d = k.shape[1]
    if d <= _BLOCK:
        acc.addmm_(k.T, k, beta=beta)
        return
    for s in range(0, d, _BLOCK):
        e = min(s + _BLOCK, d)
        acc[s:e, s:].addmm_(k[:, s:e].T, k[:, s:], beta=beta)


def _upper_add_float32_(acc: Tensor, k: Tensor) -> None:
    """``acc ← acc + kᵀk`` on the block upper triangle, each block product formed in float32.

    One ``_BLOCK``-row block at a time: the float32 block is added to the float64 accumulator
    right away (no ``d×d`` float32 scratch, half the memory traffic of a full fold).
    float16/bfloat16 keys on CUDA go straight to a half-precision GEMM with float32 output
    (``torch.mm(..., out_dtype=float32)``: exact products, tensor-core speed); anything else is
    converted to float32 first.
    """
    torch = _torch()
    d = k.shape[1]
    half_on_gpu = k.is_cuda and k.dtype in (torch.float16, torch.bfloat16)
    k32 = None if half_on_gpu else k.to(torch.float32)
    # one reusable block buffer: fresh multi-MB allocations cost page faults on every batch (CPU)
    buffer = None if half_on_gpu else torch.empty(min(d, _BLOCK) * d, dtype=torch.float32, device=k.device)
    for s in range(0, d, _BLOCK):
        e = min(s + _BLOCK, d)
        block = None
        if half_on_gpu:
            try:
                block = torch.mm(k[:, s:e].T, k[:, s:], out_dtype=torch.float32)
            except (TypeError, RuntimeError):  # a torch without mm(out_dtype=...) here
                half_on_gpu, k32 = False, k.to(torch.float32)
                buffer = torch.empty(min(d, _BLOCK) * d, dtype=torch.float32, device=k.device)
        if block is None:
            block = buffer[: (e - s) * (d - s)].view(e - s, d - s)
            torch.mm(k32[:, s:e].T, k32[:, s:], out=block)
        acc[s:e, s:].add_(block)


@contextlib.contextmanager
def _tf32_allowed(enabled: bool) -> Iterator[None]:
    """Allow TF32 tensor cores for float32 matrix products inside the block (when ``enabled``)."""
    torch = _torch()
    if not enabled:
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _upper_add_tf32_(acc: Tensor, k: Tensor) -> None:
    """``acc ← acc + kᵀk`` on the block upper triangle for half-precision keys ``k (n, d)``: exact float32
    copies, each block product a float32 GEMM (TF32 tensor cores on CUDA), added to the float64 ``acc``.

    TF32 keeps 11 significant bits, bf16 8 and fp16 11, so the tensor cores see the keys unrounded and
    every product is exact; the module doc states the bound of the float32 accumulation.
    """
    torch = _torch()
    with _tf32_allowed(k.is_cuda):
        _upper_add_float32_(acc, k.to(torch.float32))


def resolve_precision(precision: str, device: Any, dtype: Any) -> str:
    """The precision :func:`estimate` uses: ``"auto"`` is ``"tf32"`` for float16/bfloat16 models on CUDA,
    else ``"float64"``; an explicit ``"tf32"`` for a model of another dtype is refused (``ValueError``)."""
    torch = _torch()
    if precision != "auto" and precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose auto or one of {', '.join(PRECISIONS)}")
    half = dtype in (torch.float16, torch.bfloat16)
    if precision == "auto":
        return "tf32" if half and torch.device(device).type == "cuda" else "float64"
    if precision == "tf32" and not half:
        raise ValueError(f"precision 'tf32' is exact only for float16/bfloat16 models, and this one is "
                         f"{dtype}: use precision 'float32' or 'float64'")
    return precision


def _symmetric(acc: Tensor) -> Tensor:
    """The full symmetric matrix whose upper triangle is ``acc``'s."""
    torch = _torch()
    return torch.triu(acc) + torch.triu(acc, 1).T


class CovarianceStats:
    """Per-layer float64 sums of key outer products and token counts, with metadata.

    ``layers``: the layers held; ``dim``: the key dimension ``d`` (the MLP intermediate size);
    ``metadata``: plain JSON data (model fingerprint, key site, dtype, precision, tokenization,
    corpus records …; see :data:`IDENTITY_FIELDS`); ``precision``: how batch products are formed
    (module doc). Accumulators are allocated lazily on the device of the first keys (``d×d``
    float64 per layer: 1.6 GB for ``d = 14 336``).

    Small updates (decoding steps: a few keys each) are buffered per layer until
    ``flush_tokens`` keys are pending, then added with one matrix product: every product reads
    and writes the ``d×d`` accumulator, which would otherwise cost more than the arithmetic.
    Reading (``sum``, ``mean``, ``save``, ``merge``…) flushes first; ``count`` includes pending keys.
    """

    def __init__(self, layers: Iterable[int], dim: int, metadata: Mapping[str, Any] | None = None, *,
                 precision: str = "float64", flush_tokens: int = 1024) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
        self.layers: tuple[int, ...] = tuple(sorted(int(x) for x in layers))
        if len(set(self.layers)) != len(self.layers) or not self.layers:
            raise ValueError(f"layers must be distinct and non-empty, got {list(layers)}")
        self.dim = int(dim)
        self.precision = precision
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.metadata.setdefault("precision", precision)
        self._acc: dict[int, Tensor | None] = dict.fromkeys(self.layers)
        self._count: dict[int, int] = dict.fromkeys(self.layers, 0)
        self.flush_tokens = int(flush_tokens)
        self._pending: dict[int, list[Tensor]] = {layer: [] for layer in self.layers}
        self._pending_n: dict[int, int] = dict.fromkeys(self.layers, 0)
        #: set by :func:`estimate`: whether the stats came from the cache, and the file they live in
        self.from_cache = False
        self.path: Path | None = None

    # ------------------------------------------------------------------ accumulation

    def _accumulator(self, layer: int, device: Any) -> Tensor:
        torch = _torch()
        acc = self._acc[layer]
        if acc is None:
            with torch.inference_mode(False):  # a normal tensor, even when called under inference_mode
                acc = torch.zeros(self.dim, self.dim, dtype=torch.float64, device=device)
            self._acc[layer] = acc
        return acc

    def update(self, layer: int, keys: Tensor, *, batch: int | None = None) -> None:
        """Add ``Σ k kᵀ`` over the rows of ``keys`` (``(n, d)``, any float dtype) to ``layer``.

        Raises ``ValueError`` naming the layer and ``batch`` when a key is NaN or infinite.
        """
        torch = _torch()
        if layer not in self._count:
            raise ValueError(f"layer {layer} is not held by these statistics (layers {list(self.layers)})")
        if keys.ndim != 2 or keys.shape[1] != self.dim:
            raise ValueError(f"keys must have shape (n, {self.dim}), got {tuple(keys.shape)} "
                             f"at layer {layer}")
        n = int(keys.shape[0])
        if n == 0:
            return
        keys = keys.detach()
        finite = torch.isfinite(keys)
        if not bool(finite.all()):
            bad_rows = int((~finite).any(dim=1).sum())
            where = f"layer {layer}, batch {batch}" if batch is not None else f"layer {layer}"
            raise ValueError(
                f"non-finite keys (NaN/inf) at {where}: {bad_rows} of {n} key vectors. Check the inputs and "
                f"the model dtype (float16 overflows: try bfloat16 or float32)"
            )
        if self.precision == "tf32" and keys.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"precision 'tf32' is exact only for float16/bfloat16 keys, got {keys.dtype} at "
                             f"layer {layer}: use precision 'float32' or 'float64'")
        self._count[layer] += n
        if n >= self.flush_tokens and not self._pending[layer]:
            self._add(layer, keys)  # large batches go straight in (no copy)
            return
        with torch.inference_mode(False):  # a private copy (activations may be reused), normal tensor
            self._pending[layer].append(keys.clone())
        self._pending_n[layer] += n
        if self._pending_n[layer] >= self.flush_tokens:
            self._flush_layer(layer)

    def _flush_layer(self, layer: int) -> None:
        torch = _torch()
        pending = self._pending[layer]
        if not pending:
            return
        keys = pending[0] if len(pending) == 1 else torch.cat(pending)
        self._pending[layer], self._pending_n[layer] = [], 0
        self._add(layer, keys)

    def flush(self) -> CovarianceStats:
        """Add every buffered key to the accumulators (reading does this by itself); returns ``self``."""
        for layer in self.layers:
            self._flush_layer(layer)
        return self

    def _add(self, layer: int, keys: Tensor) -> None:
        torch = _torch()
        acc = self._accumulator(layer, keys.device)
        if keys.device != acc.device:
            keys = keys.to(acc.device)
        with torch.inference_mode(False):
            if self.precision == "float64":
                _upper_addmm_(acc, keys.to(torch.float64))
            elif self.precision == "tf32":
                _upper_add_tf32_(acc, keys)
            else:
                _upper_add_float32_(acc, keys)

    # ------------------------------------------------------------------ reading

    def count(self, layer: int) -> int:
        """Number of keys (token positions) accumulated for ``layer``."""
        self._check_layer(layer)
        return self._count[layer]

    @property
    def counts(self) -> dict[int, int]:
        return dict(self._count)

    def sum(self, layer: int) -> Tensor:
        """``Σ k kᵀ`` of ``layer`` (float64, symmetric, on the accumulator's device)."""
        torch = _torch()
        self._check_layer(layer)
        self._flush_layer(layer)
        acc = self._acc[layer]
        if acc is None:
            return torch.zeros(self.dim, self.dim, dtype=torch.float64)
        return _symmetric(acc)

    def mean(self, layer: int) -> Tensor:
        """``Ĉ = Σ k kᵀ / N`` (float64): the per-token normalised ``C`` of eq. ``memoir_estimator``.

        This is ``layer_stats``' ``mom2.moment()``, the matrix MEMIT's ``λ = 15 000`` multiplies.
        """
        n = self.count(layer)
        if n == 0:
            source = f" in {self.path}" if self.path is not None else ""
            raise ValueError(f"layer {layer} has no keys{source}: nothing to average (was the corpus empty, "
                             f"or the estimate interrupted before its first batch?)")
        return self.sum(layer) / n

    def means(self) -> dict[int, Tensor]:
        return {layer: self.mean(layer) for layer in self.layers}

    @property
    def n_tokens(self) -> int:
        """Keys counted per layer (the same for every layer of an :func:`estimate`)."""
        return max(self._count.values())

    def _check_layer(self, layer: int) -> None:
        if layer not in self._count:
            raise ValueError(f"layer {layer} is not held by these statistics (layers {list(self.layers)})")

    def to(self, device: Any) -> CovarianceStats:
        """Move the accumulators (in place); returns ``self``."""
        self.flush()
        for layer, acc in self._acc.items():
            if acc is not None:
                self._acc[layer] = acc.to(device)
        return self

    def copy(self) -> CovarianceStats:
        self.flush()
        out = CovarianceStats(self.layers, self.dim, json.loads(json.dumps(self.metadata)),
                              precision=self.precision)
        out._acc = {k: (v.clone() if v is not None else None) for k, v in self._acc.items()}
        out._count = dict(self._count)
        return out

    # ------------------------------------------------------------------ combining

    def identity_differences(self, other: CovarianceStats) -> list[str]:
        """Human-readable list of what prevents merging ``self`` and ``other`` (empty if nothing)."""
        diffs = []
        if self.dim != other.dim:
            diffs.append(f"key_dim: {self.dim} vs {other.dim}")
        if self.layers != other.layers:
            diffs.append(f"layers: {list(self.layers)} vs {list(other.layers)}")
        for name in IDENTITY_FIELDS:
            a, b = self.metadata.get(name), other.metadata.get(name)
            if name == "key_dim" or a == b:
                continue
            diffs.append(f"{name}: {a!r} vs {b!r}")
        return diffs

    def merge(self, other: CovarianceStats, *, strict: bool = True) -> CovarianceStats:
        """Statistics of the union of both key sets (a new object): sums and counts add exactly.

        Refuses (``ValueError`` naming the fields) statistics of a different model fingerprint,
        key site, key dimension, layers, model dtype, precision or tokenization; ``strict=False``
        checks only the key dimension and the layers. Always refuses statistics that cover the same
        documents twice (:func:`check_disjoint`). Corpus records are concatenated. Mixtures
        (from :func:`mix`) cannot be merged: merge their components first.
        """
        if not isinstance(other, CovarianceStats):
            raise TypeError(f"can only merge CovarianceStats, got {type(other).__name__}")
        if "mixture" in self.metadata or "mixture" in other.metadata:
            raise ValueError("cannot merge a mixture (from mix()): merge the component statistics, then mix")
        diffs = self.identity_differences(other)
        if not strict:
            diffs = [d for d in diffs if d.startswith(("key_dim", "layers"))]
        if diffs:
            raise ValueError("cannot merge covariance statistics that differ in " + "; ".join(diffs))
        check_disjoint([self, other])
        meta = {k: v for k, v in self.metadata.items() if k in IDENTITY_FIELDS or k in _KEEP_ON_MERGE}
        for k in _KEEP_ON_MERGE:
            if k in meta and other.metadata.get(k) != meta[k]:
                del meta[k]
        meta["corpus"] = list(self.metadata.get("corpus") or []) + list(other.metadata.get("corpus") or [])
        out = CovarianceStats(self.layers, self.dim, meta, precision=self.precision)
        self.flush()
        other.flush()
        for layer in self.layers:
            a, b = self._acc[layer], other._acc[layer]
            if a is None and b is None:
                acc = None
            elif a is None:
                acc = b.clone()
            else:
                acc = a.clone() if b is None else a + b.to(a.device)
            out._acc[layer] = acc
            out._count[layer] = self._count[layer] + other._count[layer]
        return out

    @staticmethod
    def merge_all(stats: Iterable[CovarianceStats], *, strict: bool = True) -> CovarianceStats:
        """Merge several statistics (e.g. the shards of one corpus) left to right."""
        items = list(stats)
        if not items:
            raise ValueError("nothing to merge")
        out = items[0]
        for other in items[1:]:
            out = out.merge(other, strict=strict)
        return out if len(items) > 1 else out.copy()

    # ------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike[str], extra_metadata: Mapping[str, Any] | None = None) -> Path:
        """Write one safetensors file (float64 ``layer.<l>`` sums, JSON metadata in its header) atomically."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {**self.metadata, **(extra_metadata or {})}
        header = {"format": FORMAT, "layers": list(self.layers), "dim": self.dim, "precision": self.precision,
                  "counts": {str(k): v for k, v in self._count.items()}, "metadata": meta}
        tensors = {f"layer.{layer}": self.sum(layer).cpu().contiguous() for layer in self.layers}
        header["sha256"] = _checksum(header, tensors)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            save_file(tensors, str(tmp), metadata={"moir": json.dumps(header, sort_keys=True)})
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        _fsync_dir(path.parent)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], device: Any = None, *,
             require_checksum: bool = False) -> CovarianceStats:
        """Read a file written by :meth:`save` (``device``: where the sums go; default CPU).

        The SHA-256 recorded at save time is verified: a damaged file (flipped bit, truncation)
        raises :class:`moir_lib.cache.DamagedFile` naming it. A file saved before checksums
        existed loads with a warning, or raises with ``require_checksum`` (cache entries).
        """
        from safetensors import safe_open

        path = Path(path)
        header = read_metadata(path, _header=True)
        try:
            stats = cls(header["layers"], header["dim"], header["metadata"], precision=header["precision"])
            with safe_open(str(path), framework="pt", device="cpu") as f:
                tensors = {f"layer.{layer}": f.get_tensor(f"layer.{layer}") for layer in stats.layers}
            stats._count = {int(k): int(v) for k, v in header["counts"].items()}
        except Exception as exc:  # noqa: BLE001 - any unreadable content is damage
            raise DamagedFile(f"{path} is damaged ({type(exc).__name__}: {exc}): delete it and recompute "
                              f"it") from None
        recorded = header.pop("sha256", None)
        if recorded is None:
            if require_checksum:
                raise DamagedFile(f"{path} has no checksum (written by an older version): it cannot be "
                                  f"verified")
            log.warning("%s has no checksum (written by an older version): loaded unverified", path)
        elif _checksum(header, tensors) != recorded:
            raise DamagedFile(f"{path} is damaged (SHA-256 mismatch): delete it and recompute it")
        for layer in stats.layers:
            t = tensors[f"layer.{layer}"]
            stats._acc[layer] = t.to(device) if device is not None else t
        stats.path = path
        return stats

    def __repr__(self) -> str:
        corpus = ", ".join(str(c.get("name", "?")) for c in self.metadata.get("corpus") or []) or "-"
        return (f"CovarianceStats(layers={list(self.layers)}, dim={self.dim}, tokens={self.n_tokens:,}, "
                f"model={self.metadata.get('model')}, corpus={corpus}, precision={self.precision})")


def _parts(stats: CovarianceStats) -> list[tuple[str, str, tuple[int, int]]]:
    """``(source fingerprint, display name, shard (i, n))`` of each corpus record of ``stats``.

    The source is the record without its shard and counts (corpus spec, n, seed, files…); a
    record without a shard covers its whole source (``(0, 1)``).
    """
    out = []
    for record in stats.metadata.get("corpus") or []:
        rec = {k: v for k, v in dict(record).items() if k not in ("shard", "documents", "tokens")}
        shard = record.get("shard") or (0, 1)
        out.append((fingerprint(rec), str(rec.get("name", "corpus")), (int(shard[0]), int(shard[1]))))
    return out


def check_disjoint(stats: Sequence[CovarianceStats], names: Sequence[str] | None = None) -> None:
    """Refuse statistics that would count a document twice when merged (``ValueError`` naming them).

    Shard ``i/n`` holds documents ``i, i+n, …`` of its source, so shards ``i/n`` and ``j/m`` of one
    source share documents exactly when ``i ≡ j (mod gcd(n, m))``: the same shard twice, a shard
    and a merge that already holds it, or a shard and the whole corpus.
    """
    names = list(names) if names is not None else [str(s.path or f"statistics #{k + 1}")
                                                    for k, s in enumerate(stats)]
    seen: list[tuple[str, str, tuple[int, int], str]] = []
    clashes = []
    for s, name in zip(stats, names, strict=True):
        for source, label, (i, n) in _parts(s):
            for other_source, _, (j, m), other_name in seen:
                if source == other_source and (i - j) % math.gcd(n, m) == 0:
                    clashes.append(f"{label} shard {i}/{n} in {name} overlaps shard {j}/{m} in {other_name}")
            seen.append((source, label, (i, n), name))
    if clashes:
        listing = "\n  ".join(clashes)
        raise ValueError(f"merging would count documents twice:\n  {listing}\nmerge each shard once")


#: informational metadata kept by merge when both sides agree
_KEEP_ON_MERGE = ("format", "model_name", "revision", "layers", "key_dim")


def _checksum(header: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 over the header (without its ``sha256`` field) and every tensor's bytes, by name."""
    plain = {k: v for k, v in header.items() if k != "sha256"}
    h = hashlib.sha256(json.dumps(plain, sort_keys=True).encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(memoryview(t.contiguous().numpy()).cast("B"))
    return h.hexdigest()


def read_metadata(path: str | os.PathLike[str], *, _header: bool = False) -> dict[str, Any]:
    """The metadata of a saved :class:`CovarianceStats` without reading its matrices (not verified)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no covariance statistics at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("moir")
        header = json.loads(raw) if raw is not None else None
    except Exception as exc:  # noqa: BLE001 - a truncated or garbled header
        raise DamagedFile(f"{path} is damaged or not a safetensors file ({exc}): delete it and recompute "
                          f"it") from None
    if header is None:
        raise ValueError(f"{path} is a safetensors file without Moir covariance metadata")
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown covariance format {header.get('format')!r} (expected {FORMAT})")
    if _header:
        return header
    return {**header["metadata"], "counts": {int(k): v for k, v in header["counts"].items()}}


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ============================================================================ hooks


class _StopForward(Exception):
    """Raised from the last needed layer's hook to end a forward pass early (caught by KeyCollector)."""


def _model_dtype(model: Any) -> str:
    for p in model.parameters():
        return str(p.dtype).removeprefix("torch.")
    return "unknown"


def base_metadata(adapter: ModelAdapter, precision: str = "float64", revision: str | None = None,
                  model_fp: str | None = None) -> dict[str, Any]:
    """The identity metadata of statistics collected from ``adapter``'s model."""
    from moir_lib.models import model_fingerprint

    return {
        "format": FORMAT,
        "model": model_fp or model_fingerprint(adapter.model, revision),
        "model_name": adapter.name,
        "revision": revision,
        "key_site": adapter.key_module_template,
        "key_dim": adapter.key_dim,
        "dtype": _model_dtype(adapter.model),
        "precision": precision,
        "tokenization": None,
        "corpus": [],
    }


class KeyCollector:
    """Accumulate the keys of several layers from the forward passes run inside a ``with`` block.

    Registers a forward *pre*-hook on ``adapter.key_module(l)`` for every layer in ``layers``
    (the hook sees the key-module input ``(..., d)``: ``(b, t, d)`` for a padded batch,
    ``(b, 1, d)`` for a decoding step; GPT-2's ``Conv1D`` input has the same layout).
    :meth:`set_mask` selects the positions that count (``bool (b, t)``; ``None``: all). Each
    forward pass is one *batch* (numbered from 0, or as given to :meth:`forward`), used in
    error messages.

    ``stats``: an existing :class:`CovarianceStats` to add to (default: a new one with the
    model's metadata). ``stop_after_last``: end each forward pass once the last layer's keys
    are read (use :meth:`forward`, which swallows the stop; outputs are then ``None``).
    """

    def __init__(self, adapter: ModelAdapter, layers: Iterable[int], stats: CovarianceStats | None = None,
                 *, precision: str = "float64", stop_after_last: bool = False,
                 revision: str | None = None) -> None:
        self.adapter = adapter
        self.layers = sorted(adapter.check_layers(layers))
        if stats is None:
            stats = CovarianceStats(self.layers, adapter.key_dim, base_metadata(adapter, precision, revision),
                                    precision=precision)
        missing = sorted(set(self.layers) - set(stats.layers))
        if missing or stats.dim != adapter.key_dim:
            raise ValueError(f"stats hold layers {list(stats.layers)} of dimension {stats.dim}; the "
                             f"collector needs layers {self.layers} of dimension {adapter.key_dim}")
        self.stats = stats
        self.stop_after_last = stop_after_last
        self.batch_index = -1
        self._next_batch: int | None = None
        self._mask: Tensor | None = None
        self._handles: list[Any] = []
        self._first, self._last = self.layers[0], self.layers[-1]

    def set_mask(self, mask: Tensor | None) -> None:
        """Which positions of the next forward passes count: ``bool (b, t)`` (``(b,)`` or ``(b, 1)``
        for a decoding step), ``True`` = count; ``None`` = all positions."""
        torch = _torch()
        if mask is not None:
            mask = torch.as_tensor(mask)
            if mask.dtype != torch.bool:
                mask = mask.bool()
            if bool(mask.all()):  # one check here, not one per layer
                mask = None
        self._mask = mask

    def __enter__(self) -> KeyCollector:
        if self._handles:
            raise RuntimeError("KeyCollector is already active")
        try:
            for layer in self.layers:
                module = self.adapter.key_module(layer)
                hook = self._make_hook(layer)
                self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> bool:
        self._remove()
        return False

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _make_hook(self, layer: int):
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            if layer == self._first:
                self.batch_index = self._next_batch if self._next_batch is not None else self.batch_index + 1
                self._next_batch = None
            self.stats.update(layer, self._select(x, layer), batch=self.batch_index)
            if self.stop_after_last and layer == self._last:
                raise _StopForward
        return hook

    def _select(self, x: Tensor, layer: int) -> Tensor:
        d = x.shape[-1]
        mask = self._mask
        if mask is None:
            return x.reshape(-1, d)
        lead = x.shape[:-1]
        if mask.device != x.device:
            mask = self._mask = mask.to(x.device)
        if tuple(mask.shape) != tuple(lead):
            if mask.numel() != math.prod(lead):
                raise ValueError(f"mask of shape {tuple(mask.shape)} does not match the key input "
                                 f"{tuple(lead)} at layer {layer}")
            mask = mask.reshape(lead)
        return x[mask]

    def forward(self, model: Any, *args: Any, batch_index: int | None = None, **kwargs: Any) -> Any:
        """Run ``model(*args, **kwargs)`` as batch ``batch_index`` (``None`` when stopped early)."""
        self._next_batch = batch_index
        try:
            return model(*args, **kwargs)
        except _StopForward:
            return None
        finally:
            self._next_batch = None


# ============================================================================ estimation


def _resolve_model(model_or_loaded: Any, layers: Iterable[int] | None) -> tuple[Any, Any, ModelAdapter, Any]:
    from moir_lib.models import LoadedModel, ModelAdapter, load
    from moir_lib.profiles import Profile

    if isinstance(model_or_loaded, (str, os.PathLike, Profile)):
        if isinstance(model_or_loaded, Profile) and layers is None:
            layers = model_or_loaded.edit_layers
        model_or_loaded = load(model_or_loaded)
    triple = isinstance(model_or_loaded, tuple) and len(model_or_loaded) == 3
    if isinstance(model_or_loaded, LoadedModel) or triple:
        model, tokenizer, adapter = model_or_loaded
    elif isinstance(model_or_loaded, ModelAdapter):
        model, tokenizer, adapter = model_or_loaded.model, model_or_loaded.tokenizer, model_or_loaded
    else:  # a bare model: token-id documents only
        model, tokenizer = model_or_loaded, None
        adapter = ModelAdapter.for_model(model)
    if layers is None:
        raise ValueError("no layers given: pass layers=[...] (or a Profile, whose edit layers are used)")
    return model, tokenizer, adapter, list(layers)


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """16 hex identifying a tokenizer's behaviour (its full ``tokenizer.json`` for fast tokenizers)."""
    if tokenizer is None:
        return None
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("truncation", None)  # call-time settings the last tokenizer(...) call left behind
        state.pop("padding", None)
        h.update(json.dumps(state, sort_keys=True).encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _corpus_identity(documents: Any, corpus_spec: Any) -> tuple[dict[str, Any] | None, str]:
    """``(fingerprint record or None, display name)`` of the documents."""
    from moir_lib.corpora import Corpus, CorpusSpec

    if corpus_spec is None and isinstance(documents, Corpus):
        corpus_spec = documents
    if isinstance(corpus_spec, Corpus):
        return corpus_spec.key(), corpus_spec.spec.describe()
    if isinstance(corpus_spec, CorpusSpec):
        return corpus_spec.key(), corpus_spec.describe()
    if isinstance(corpus_spec, str):
        return {"name": corpus_spec}, corpus_spec
    if isinstance(corpus_spec, Mapping):
        return dict(corpus_spec), str(corpus_spec.get("name", "corpus"))
    if corpus_spec is not None:
        raise TypeError(f"corpus_spec must be a Corpus, CorpusSpec, str or dict, "
                        f"got {type(corpus_spec).__name__}")
    if isinstance(documents, Sequence) and not isinstance(documents, (str, bytes)):
        h = hashlib.sha256()
        for doc in documents:
            h.update(doc.encode() if isinstance(doc, str) else json.dumps([int(t) for t in doc]).encode())
            h.update(b"\x00")
        record = {"kind": "inline", "n": len(documents), "sha256": h.hexdigest()[:16]}
        return record, f"{len(documents)} documents"
    return None, "documents"


def estimate_key(*, model_fp: str, revision: str | None, key_site: str, layers: Sequence[int], dtype: str,
                 precision: str, tokenizer_fp: str | None, add_bos: bool | None, count_bos: bool,
                 max_length: int, corpus: Mapping[str, Any]) -> dict[str, Any]:
    """The record :func:`estimate`'s cache fingerprint is computed from (every field matters)."""
    return {
        "kind": "covariance",
        "format": FORMAT,
        "model": model_fp,
        "revision": revision,
        "key_site": key_site,
        "layers": sorted(int(x) for x in layers),
        "dtype": dtype,
        "precision": precision,
        "tokenization": {"tokenizer": tokenizer_fp, "add_bos": add_bos, "count_bos": count_bos,
                         "max_length": int(max_length)},
        "corpus": dict(corpus),
    }


def _default_max_length(model: Any, tokens_per_batch: int) -> int:
    cfg = model.config
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048
    return int(min(limit, 2048, tokens_per_batch))


@dataclass
class _Doc:
    index: int
    ids: list[int]
    counted: int  # positions that count (BOS may be left out)


class _Tokenized:
    """Documents → token ids, tokenized in chunks (fast tokenizers batch well)."""

    def __init__(self, docs: Iterator[Any], tokenizer: Any, adapter: ModelAdapter, add_bos: bool | None,
                 count_bos: bool, max_length: int, start: int, chunk: int = 256) -> None:
        self.docs, self.tokenizer, self.adapter = docs, tokenizer, adapter
        self.add_bos, self.count_bos, self.max_length = add_bos, count_bos, max_length
        self.index, self.chunk = start, chunk
        self.bos = adapter.bos_token_id
        self.vocab = adapter.vocab_size
        self._buffer: list[_Doc] = []
        self._warned_bos = False

    def __iter__(self) -> Iterator[_Doc]:
        while True:
            raw = []
            for doc in self.docs:
                raw.append(doc)
                if len(raw) >= self.chunk:
                    break
            if not raw:
                return
            yield from self._encode(raw)

    def _encode(self, raw: list[Any]) -> list[_Doc]:
        texts = [(i, d) for i, d in enumerate(raw) if isinstance(d, str)]
        encoded: dict[int, list[int]] = {}
        if texts:
            if self.tokenizer is None:
                raise ValueError("text documents need a tokenizer: pass a LoadedModel "
                                 "(model, tokenizer, adapter)")
            strings = [d if d.strip() else "" for _, d in texts]
            prepend = self.add_bos is True and self.bos is not None
            if self.add_bos is True and self.bos is None and not self._warned_bos:
                log.warning("%s has no BOS token: add_bos=True adds nothing", self.adapter.name)
                self._warned_bos = True
            special = self.add_bos is None
            limit = self.max_length - 1 if prepend else self.max_length
            ids = self.tokenizer(strings, add_special_tokens=special, truncation=True,
                                 max_length=limit)["input_ids"]
            for (i, d), row in zip(texts, ids, strict=True):
                row = list(row) if d.strip() else []  # blank documents carry no text
                encoded[i] = ([self.bos, *row] if prepend and row else row)
        out = []
        for i, d in enumerate(raw):
            if i in encoded:
                ids = encoded[i]
            else:
                try:
                    ids = [int(t) for t in d][: self.max_length]
                except TypeError:
                    raise TypeError(f"document {self.index + i} is a {type(d).__name__}: documents must "
                                    f"be str or sequences of token ids") from None
                if ids and (min(ids) < 0 or max(ids) >= self.vocab):
                    raise ValueError(f"document {self.index + i} has token ids outside the vocabulary "
                                     f"(0-{self.vocab - 1}): were they produced by another tokenizer?")
            counted = len(ids)
            if ids and not self.count_bos and self.bos is not None and ids[0] == self.bos:
                counted -= 1
            out.append(_Doc(self.index + i, ids, counted))
        self.index += len(raw)
        return out


def _windows(docs: Iterable[_Doc], window_tokens: int) -> Iterator[list[_Doc]]:
    """Consecutive groups of documents holding at least ``window_tokens`` tokens (the last may hold fewer)."""
    window: list[_Doc] = []
    tokens = 0
    for doc in docs:
        window.append(doc)
        tokens += len(doc.ids)
        if tokens >= window_tokens:
            yield window
            window, tokens = [], 0
    if window:
        yield window


def _pack(window: list[_Doc], tokens_per_batch: int) -> list[list[_Doc]]:
    """Batches of a window: longest documents first, each batch's padded size ≤ ``tokens_per_batch``."""
    live = sorted((d for d in window if d.counted > 0), key=lambda d: -len(d.ids))  # stable: ties keep order
    batches: list[list[_Doc]] = []
    cur: list[_Doc] = []
    width = 0
    for doc in live:
        w = max(width, len(doc.ids))
        if cur and (len(cur) + 1) * w > tokens_per_batch:
            batches.append(cur)
            cur, w = [], len(doc.ids)
        cur.append(doc)
        width = w
    if cur:
        batches.append(cur)
    return batches


def _tensors(batch: list[_Doc], pad_id: int, bos: int | None, count_bos: bool, device: Any
             ) -> tuple[Tensor, Tensor | None, Tensor]:
    torch = _torch()
    width = max(len(d.ids) for d in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for r, d in enumerate(batch):
        ids[r, : len(d.ids)] = torch.tensor(d.ids, dtype=torch.long)
        attn[r, : len(d.ids)] = 1
    count = attn.bool()
    if not count_bos and bos is not None:
        count[:, 0] &= ids[:, 0] != bos
    full = bool(attn.all())
    return ids.to(device), (None if full else attn.to(device)), count.to(device)


def estimate(model_or_loaded: Any, documents: Iterable[Any], layers: Iterable[int] | None = None, *,
             tokens_per_batch: int = 12_288, max_length: int | None = None, corpus_spec: Any = None,
             cache: bool | str | os.PathLike[str] = True, checkpoint_every: int | None = 100,
             checkpoint_dir: str | os.PathLike[str] | None = None, progress: bool = True,
             add_bos: bool | None = None, count_bos: bool = True, precision: str = "auto",
             revision: str | None = None, stop_early: bool = True) -> CovarianceStats:
    """Estimate ``C`` at the key site of every layer in ``layers`` over ``documents``, in one pass per batch.

    ``model_or_loaded``: a :class:`~moir_lib.models.LoadedModel` / ``(model, tokenizer, adapter)``,
    a :class:`~moir_lib.models.ModelAdapter`, a spec or :class:`~moir_lib.profiles.Profile` for
    :func:`~moir_lib.models.load` (a profile's edit layers are the default), or a bare model
    (token-id documents only). ``documents``: a :class:`moir_lib.corpora.Corpus` (its spec is the
    corpus identity), a spec string for :func:`moir_lib.corpora.load_corpus`, a list, or any
    iterable of ``str`` / token-id sequences, in a deterministic order.

    ``tokens_per_batch``: padded tokens per forward pass (the paper: 12 288); documents are
    sorted by length within windows of 16 batches and packed greedily. ``max_length``: documents
    are truncated to this many tokens (default ``min(model positions, 2048, tokens_per_batch)``).
    ``add_bos``: ``None`` tokenizes like ``tokenizer(text)`` (as ``layer_stats``), ``True`` ensures
    exactly one leading BOS, ``False`` none (token-id documents are used as they are).
    ``count_bos``: whether the BOS position's key counts (module doc). ``precision``:
    ``"auto"`` | ``"float64"`` | ``"float32"`` | ``"tf32"`` (module doc; :func:`resolve_precision`).
    ``stop_early``: end each forward pass after the last layer's key (no effect on the result).

    Caching: with ``cache`` (``True``: ``$MOIR_CACHE``; or a directory) the result is stored under
    ``covariance/<fingerprint>/`` of :func:`estimate_key` — model weights (or hub id + revision),
    layers, key site, model dtype, precision, tokenization and the corpus record (name, revision,
    n, seed, truncation, file contents) — and identical inputs load it instead of running.
    Documents without an identity (an anonymous iterator and no ``corpus_spec``) are not cached.
    A cached file is served only when its checksum verifies; a damaged one is reported by path and
    rebuilt. The entry is locked while it is built: a second process asking for the same ``C``
    waits, then reuses it. A read-only cache serves hits and otherwise runs uncached (warning).

    Checkpoints: at the end of the first window of documents (16 batches' worth) after every
    ``checkpoint_every`` batches, the statistics and the position in the corpus are saved
    atomically (in the cache entry, or ``checkpoint_dir``, which is locked); a later call with the
    same inputs resumes there without counting any document twice. Keys are summed in groups fixed
    per window, whatever the checkpoints, so a resumed estimate equals an uninterrupted one bit for
    bit. Shards merged with :meth:`CovarianceStats.merge` count the same keys, but sum them in
    another order (and a document's keys may round differently in another batch): see the README
    for the bound.

    Raises ``ValueError`` for a layer out of range (before any work), an empty corpus, or
    NaN/inf keys (naming the layer and batch).
    """
    torch = _torch()
    from tqdm.auto import tqdm

    from moir_lib.corpora import load_corpus
    from moir_lib.models import model_fingerprint

    model, tokenizer, adapter, layers = _resolve_model(model_or_loaded, layers)
    layers = sorted(adapter.check_layers(layers))
    if isinstance(tokens_per_batch, bool) or not isinstance(tokens_per_batch, int) or tokens_per_batch <= 0:
        raise ValueError(f"tokens_per_batch must be a positive integer, got {tokens_per_batch!r}")
    if max_length is None:
        max_length = _default_max_length(model, tokens_per_batch)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    if max_length > tokens_per_batch:
        raise ValueError(f"max_length {max_length} exceeds tokens_per_batch {tokens_per_batch}: one document "
                         f"must fit a batch (raise tokens_per_batch or lower max_length)")
    precision = resolve_precision(precision, next(model.parameters()).device, next(model.parameters()).dtype)
    if checkpoint_every is not None and checkpoint_every <= 0:
        raise ValueError(f"checkpoint_every must be positive or None, got {checkpoint_every}")
    if isinstance(documents, (str, os.PathLike)):
        documents = load_corpus(documents)

    corpus_key, corpus_name = _corpus_identity(documents, corpus_spec)
    model_fp = model_fingerprint(model, revision)
    key = estimate_key(model_fp=model_fp, revision=revision, key_site=adapter.key_module_template,
                       layers=layers, dtype=_model_dtype(model), precision=precision,
                       tokenizer_fp=tokenizer_fingerprint(tokenizer), add_bos=add_bos, count_bos=count_bos,
                       max_length=max_length, corpus=corpus_key or {})
    fp = fingerprint(key)
    entry: Path | None = None
    if cache and corpus_key is not None:
        root = _cache_root() if cache is True else Path(cache).expanduser()
        entry = root / "covariance" / fp
        if not _writable(entry):  # a read-only cache still serves verified hits
            hit = _cache_hit(entry / _FINAL)
            if hit is not None:
                log.info("covariance cache hit: %s (%s, layers %s)", hit.path, corpus_name, layers)
                return hit
            log.warning("the covariance cache %s is not writable: this estimate is neither cached nor "
                        "checkpointed (set MOIR_CACHE to a writable directory)", root)
            entry = None
    elif cache and corpus_key is None:
        log.warning("documents have no identity (pass a Corpus or corpus_spec=...): "
                    "the estimate is not cached")
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else entry
    with _writer_lock(entry, ckpt_dir if checkpoint_every else None, corpus_name):
        if entry is not None:
            hit = _cache_hit(entry / _FINAL)
            if hit is not None:
                log.info("covariance cache hit: %s (%s, layers %s)", hit.path, corpus_name, layers)
                return hit
        if checkpoint_dir is not None and corpus_key is None:
            raise ValueError("checkpointing needs the corpus identity: pass a Corpus or corpus_spec=... "
                             "(an anonymous iterator cannot be resumed safely)")
        ckpt = ckpt_dir / _CHECKPOINT if (ckpt_dir is not None and checkpoint_every) else None

        tokenization = {"tokenizer": key["tokenization"]["tokenizer"], "add_bos": add_bos,
                        "count_bos": count_bos, "max_length": max_length}
        window_tokens = tokens_per_batch * _WINDOW_BATCHES
        resume = {"docs_before_window": 0, "batches_done": 0, "global_batches": 0}
        stats: CovarianceStats | None = None
        if ckpt is not None and ckpt.is_file():
            stats = _load_checkpoint(ckpt)
        if stats is not None:
            saved = stats.metadata.pop("resume", {})
            if saved.get("fingerprint") != fp:
                raise ValueError(f"checkpoint {ckpt} belongs to another estimate (fingerprint "
                                 f"{saved.get('fingerprint')} vs {fp}): delete it or use another "
                                 f"checkpoint_dir")
            if (saved.get("tokens_per_batch") != tokens_per_batch
                    or saved.get("window_tokens") != window_tokens):
                raise ValueError(f"checkpoint {ckpt} was written with "
                                 f"tokens_per_batch={saved.get('tokens_per_batch')}: resume with the same "
                                 f"value, or delete the checkpoint to start over")
            resume = {k: int(saved[k]) for k in resume}
            log.info("resuming %s from %s: %d documents done, %d batches into the current window",
                     corpus_name, ckpt, resume["docs_before_window"], resume["batches_done"])
        if stats is None:
            meta = base_metadata(adapter, precision, revision, model_fp)
            meta.update(tokenization=tokenization, corpus=[], fingerprint=fp)
            stats = CovarianceStats(layers, adapter.key_dim, meta, precision=precision)
        device = next(model.parameters()).device
        stats.to(device)

        doc_iter = iter(documents)
        for _ in range(resume["docs_before_window"]):  # deterministic order: skip what is already counted
            if next(doc_iter, _EXHAUSTED) is _EXHAUSTED:
                raise ValueError(f"checkpoint {ckpt} counted {resume['docs_before_window']} documents but "
                                 f"the corpus has fewer: it is not the same corpus (delete the checkpoint)")
        docs = _Tokenized(doc_iter, tokenizer, adapter, add_bos, count_bos, max_length,
                          resume["docs_before_window"])
        pad_id = adapter.pad_token_id if adapter.pad_token_id is not None else 0
        bos = adapter.bos_token_id

        bar = tqdm(desc=f"C {corpus_name} L{layers[0]}-{layers[-1]}", unit="tok", unit_scale=True,
                   disable=not progress, dynamic_ncols=True)
        start = time.perf_counter()
        docs_before = resume["docs_before_window"]
        skip = resume["batches_done"]
        global_batch = resume["global_batches"]
        since_ckpt = 0
        tokens_run = 0
        was_training = model.training
        model.eval()
        try:
            collector = KeyCollector(adapter, layers, stats, precision=precision, stop_after_last=stop_early)
            with collector, torch.no_grad():
                first = True
                for window in _windows(docs, window_tokens):
                    batches = _pack(window, tokens_per_batch)
                    if first and not batches and stats.n_tokens == 0 and docs_before == 0:
                        raise ValueError(f"empty corpus: {corpus_name} yielded no tokens to count")
                    first = False
                    for j, batch in enumerate(batches):
                        if j < skip:
                            continue
                        ids, attn, count = _tensors(batch, pad_id, bos, count_bos, device)
                        collector.set_mask(count)
                        kwargs = {"input_ids": ids, "use_cache": False}
                        if attn is not None:
                            kwargs["attention_mask"] = attn
                        collector.forward(model, batch_index=global_batch, **kwargs)
                        global_batch += 1
                        since_ckpt += 1
                        n = sum(d.counted for d in batch)
                        tokens_run += n
                        bar.update(n)
                    skip = 0
                    docs_before += len(window)
                    bar.set_postfix(docs=docs_before, refresh=False)
                    stats.flush()  # keys are grouped per window, whatever the checkpoints: exact resumes
                    if ckpt is not None and since_ckpt >= checkpoint_every:
                        _save_checkpoint(stats, ckpt, fp, docs_before, 0, global_batch, tokens_per_batch,
                                         window_tokens)
                        since_ckpt = 0
                collector.set_mask(None)
        finally:
            bar.close()
            model.train(was_training)
        seconds = time.perf_counter() - start
        if stats.n_tokens == 0:
            raise ValueError(f"empty corpus: {corpus_name} yielded no tokens to count")
        record = dict(corpus_key or {"name": corpus_name})
        record.setdefault("name", corpus_name)
        record.update(documents=docs_before, tokens=stats.n_tokens)
        stats.metadata["corpus"] = [record]
        stats.metadata.pop("resume", None)
        log.info("covariance %s layers %s: %d tokens this run in %.1f s (%.0f tokens/s), %d in total",
                 corpus_name, layers, tokens_run, seconds, tokens_run / seconds if seconds else float("nan"),
                 stats.n_tokens)
        if entry is not None:
            entry.mkdir(parents=True, exist_ok=True)
            (entry / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True, default=str))
            stats.path = stats.save(entry / _FINAL)
        if ckpt is not None and ckpt.is_file():
            ckpt.unlink()
        return stats


_EXHAUSTED = object()


def _writable(folder: Path) -> bool:
    from moir_lib.locks import writable_dir

    try:
        writable_dir(folder, "covariance cache entry")
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def _writer_lock(entry: Path | None, ckpt_dir: Path | None, name: str) -> Iterator[None]:
    """Hold the cache entry (waiting for another process building it) and an explicit checkpoint
    directory (refused while another process writes there)."""
    from moir_lib.locks import dir_lock_path, exclusive

    with contextlib.ExitStack() as stack:
        if entry is not None:
            stack.enter_context(exclusive(dir_lock_path(entry), f"covariance cache entry {entry} ({name})",
                                          wait=True))
        if ckpt_dir is not None and ckpt_dir != entry:
            stack.enter_context(exclusive(dir_lock_path(ckpt_dir), f"checkpoint directory {ckpt_dir}"))
        yield


def _cache_hit(path: Path) -> CovarianceStats | None:
    """The verified statistics cached at ``path``; ``None`` (and the file removed) when absent or damaged."""
    if not path.is_file():
        return None
    try:
        stats = CovarianceStats.load(path, require_checksum=True)
    except DamagedFile as exc:
        log.warning("%s: not served, it will be rebuilt", exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    stats.from_cache = True
    return stats


def _load_checkpoint(path: Path) -> CovarianceStats | None:
    """A checkpoint's statistics; ``None`` (starting over, with a warning) when it is damaged."""
    try:
        return CovarianceStats.load(path, require_checksum=True)
    except DamagedFile as exc:
        log.warning("%s: starting the estimate over", exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def _save_checkpoint(stats: CovarianceStats, path: Path, fp: str, docs_before: int, batches_done: int,
                     global_batches: int, tokens_per_batch: int, window_tokens: int) -> None:
    resume = {"fingerprint": fp, "docs_before_window": docs_before, "batches_done": batches_done,
              "global_batches": global_batches, "tokens_per_batch": tokens_per_batch,
              "window_tokens": window_tokens}
    stats.save(path, extra_metadata={"resume": resume})
    log.debug("checkpoint %s: window at document %d, %d batches in", path, docs_before, batches_done)


# ============================================================================ mixtures


def mix(components: Mapping[Any, float] | Iterable[tuple[Any, float]]) -> Any:
    """The oracle mixture ``C = Σ_i w_i C_i`` (appendix A.2), with weights normalised to sum 1.

    The uncentered covariance is linear in the distribution: for ``p = Σ w_i p_i``,
    ``E_p[k kᵀ] = Σ w_i E_{p_i}[k kᵀ]``. So per-layer *means* are mixed (not raw sums, which
    would weight each component by its token count). Components are all
    :class:`CovarianceStats` (result: statistics whose ``mean`` is the mixture, ``count`` the
    pooled token count, metadata ``mixture`` lists components and weights), all tensors
    (result: a float64 tensor) or all ``{layer: tensor}`` mappings (result: such a mapping).
    """
    torch = _torch()
    items = list(components.items()) if isinstance(components, Mapping) else list(components)
    if not items:
        raise ValueError("mix() needs at least one component")
    weights = [float(w) for _, w in items]
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"mixture weights must be finite, non-negative and not all zero, got {weights}")
    total = sum(weights)
    weights = [w / total for w in weights]
    parts = [c for c, _ in items]
    if all(isinstance(c, CovarianceStats) for c in parts):
        first = parts[0]
        for other in parts[1:]:
            diffs = first.identity_differences(other)
            if diffs:
                raise ValueError("cannot mix covariance statistics that differ in " + "; ".join(diffs))
        meta = {k: v for k, v in first.metadata.items() if k in IDENTITY_FIELDS or k in _KEEP_ON_MERGE}
        meta["corpus"] = []
        meta["mixture"] = [{"weight": w, "corpus": c.metadata.get("corpus"), "tokens": c.n_tokens}
                           for c, w in zip(parts, weights, strict=True)]
        out = CovarianceStats(first.layers, first.dim, meta, precision=first.precision)
        for layer in first.layers:
            mixed = None
            for c, w in zip(parts, weights, strict=True):
                if w > 0:
                    term = w * c.mean(layer)
                    mixed = term if mixed is None else mixed + term.to(mixed.device)
            count = sum(c.count(layer) for c in parts)
            out._acc[layer] = mixed * count
            out._count[layer] = count
        return out
    if all(isinstance(c, torch.Tensor) for c in parts):
        shapes = {tuple(c.shape) for c in parts}
        if len(shapes) != 1:
            raise ValueError(f"cannot mix matrices of different shapes {sorted(shapes)}")
        return sum(w * c.to(torch.float64) for c, w in zip(parts, weights, strict=True))
    if all(isinstance(c, Mapping) for c in parts):
        keys = set(parts[0])
        if any(set(c) != keys for c in parts):
            raise ValueError("cannot mix layer mappings with different layers")
        return {layer: sum(w * c[layer].to(torch.float64) for c, w in zip(parts, weights, strict=True))
                for layer in sorted(keys)}
    raise TypeError("mix() components must be all CovarianceStats, all tensors or all "
                    "{layer: tensor} mappings")


# ============================================================================ diagnostics


def _as_matrix(c: Any) -> Tensor:
    torch = _torch()
    m = torch.as_tensor(c).to(torch.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"a covariance must be a square matrix, got shape {tuple(m.shape)}")
    return m


def _eigh(c: Any) -> tuple[Tensor, Tensor]:
    """Eigenvalues (descending) and eigenvectors (columns) of the symmetrised matrix."""
    torch = _torch()
    m = _as_matrix(c)
    vals, vecs = torch.linalg.eigh((m + m.T) / 2)
    return vals.flip(0), vecs.flip(1)


def spectrum(c: Any) -> Tensor:
    """Eigenvalues of ``C`` in descending order (float64)."""
    return _eigh(c)[0]


def _eigvals(c_or_vals: Any) -> Tensor:
    torch = _torch()
    t = torch.as_tensor(c_or_vals).to(torch.float64)
    return spectrum(t) if t.ndim == 2 else t


def effective_rank(c_or_eigenvalues: Any) -> float:
    """``exp(H(p))``, ``p_i = λ_i / Σλ`` (Roy & Vetterli's effective rank; negative rounding clipped)."""
    torch = _torch()
    lam = _eigvals(c_or_eigenvalues).clamp(min=0)
    total = lam.sum()
    if total <= 0:
        return 0.0
    p = lam / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def participation_ratio(c_or_eigenvalues: Any) -> float:
    """``(Σλ)² / Σλ²``."""
    lam = _eigvals(c_or_eigenvalues).clamp(min=0)
    sq = float((lam**2).sum())
    return float(lam.sum()) ** 2 / sq if sq > 0 else 0.0


def top_eigenspace(c: Any, k: int) -> Tensor:
    """``U_k``: orthonormal columns spanning the top-``k`` eigenspace of ``C`` (``d × k``)."""
    vals, vecs = _eigh(c)
    if not 1 <= k <= vals.shape[0]:
        raise ValueError(f"k must be in 1..{vals.shape[0]}, got {k}")
    return vecs[:, :k]


def principal_angles(a: Any, b: Any, k: int) -> Tensor:
    """Principal angles (radians, ascending) between the top-``k`` eigenspaces of ``a`` and ``b``.

    ``a``/``b`` may also be ``d × k`` orthonormal bases. ``cos θ_i`` are the singular values of
    ``U_aᵀ U_b``.
    """
    return _angles(_basis(a, k), _basis(b, k))


def _angles(ua: Tensor, ub: Tensor) -> Tensor:
    """Principal angles between the spans of two orthonormal bases (radians, ascending)."""
    torch = _torch()
    s = torch.linalg.svdvals(ua.T @ ub).clamp(-1.0, 1.0)
    return torch.arccos(s).sort().values


def _basis(x: Any, k: int) -> Tensor:
    torch = _torch()
    t = torch.as_tensor(x).to(torch.float64)
    if t.ndim == 2 and t.shape[0] == t.shape[1]:
        return top_eigenspace(t, k)
    if t.ndim == 2 and t.shape[1] == k:
        return t
    raise ValueError(f"expected a square covariance or a d×{k} basis, got shape {tuple(t.shape)}")


def coverage(c: Any, domain: Any, k: int, basis: Tensor | None = None) -> float:
    """Share of a domain's key energy inside ``C``'s top-``k`` eigenspace: ``tr(U_kᵀ C_d U_k) / tr(C_d)``.

    1 means every key of the domain lies in the directions ``C`` protects most; ``k/d`` is what
    a random subspace would cover of an isotropic domain.
    """
    cd = _as_matrix(domain)
    u = basis if basis is not None else top_eigenspace(c, k)
    total = float(cd.diagonal().sum())
    if total <= 0:
        raise ValueError("the domain covariance has zero trace")
    return float((u.T @ cd @ u).diagonal().sum()) / total


def _per_layer(x: Any, layers: Sequence[int] | None) -> dict[Any, Tensor]:
    torch = _torch()
    if isinstance(x, CovarianceStats):
        use = layers if layers is not None else x.layers
        return {layer: x.mean(layer) for layer in use if layer in x.layers}
    if isinstance(x, torch.Tensor) or hasattr(x, "__array__"):
        return {None: _as_matrix(x)}
    if isinstance(x, Mapping):
        return {layer: _as_matrix(v) for layer, v in x.items() if layers is None or layer in layers}
    raise TypeError(f"expected CovarianceStats, a matrix or {{layer: matrix}}, got {type(x).__name__}")


@dataclass
class Diagnosis:
    """Tidy tables (one row per measurement) from :func:`diagnose`.

    ``spectrum``: name, layer, index, eigenvalue, share, cumulative. ``summary``: name, layer,
    dim, tokens, trace, top_eigenvalue, effective_rank, participation_ratio, k90, k99 (eigen-
    directions holding 90 / 99 % of the trace). ``angles``: a, b, layer, k, index, angle_rad,
    angle_deg, cos. ``coverage``: name, domain, layer, k, coverage, random (``k/d``).
    """

    spectrum: pd.DataFrame
    summary: pd.DataFrame
    angles: pd.DataFrame
    coverage: pd.DataFrame

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"spectrum": self.spectrum, "summary": self.summary, "angles": self.angles,
                "coverage": self.coverage}


def diagnose(covariances: Mapping[str, Any], *, domains: Mapping[str, Any] | None = None,
             k: int | Sequence[int] | None = None, layers: Sequence[int] | None = None,
             spectrum_points: int | None = None) -> Diagnosis:
    """Spectra, effective ranks, principal angles and domain coverage of named covariances.

    ``covariances``: ``{name: CovarianceStats | matrix | {layer: matrix}}`` (statistics are read
    through :meth:`CovarianceStats.mean`). ``domains``: ``{domain: …}`` whose coverage by each
    covariance's top-``k`` eigenspace is reported (default: the covariances themselves, a
    cross-coverage table). ``k``: one or several subspace sizes (default ``d/64, d/16, d/4``).
    ``spectrum_points``: keep only this many leading eigenvalues per spectrum (default all).
    Principal angles are reported for every pair of covariances. One ``eigh`` per matrix.
    """
    import pandas as pd

    named = {name: _per_layer(c, layers) for name, c in covariances.items()}
    dom_source = domains if domains is not None else covariances
    dom = {name: _per_layer(c, layers) for name, c in dom_source.items()}
    stats_tokens = {name: c.counts for name, c in covariances.items() if isinstance(c, CovarianceStats)}
    eig: dict[tuple[str, Any], tuple[Tensor, Tensor]] = {}
    spec_rows, sum_rows, angle_rows, cov_rows = [], [], [], []
    for name, per in named.items():
        for layer, c in per.items():
            vals, vecs = _eigh(c)
            eig[name, layer] = (vals, vecs)
            lam = vals.clamp(min=0)
            total = float(lam.sum())
            share = (lam / total) if total > 0 else lam
            cum = share.cumsum(0)
            d = int(vals.shape[0])
            keep = d if spectrum_points is None else min(d, spectrum_points)
            for i in range(keep):
                spec_rows.append({"name": name, "layer": layer, "index": i, "eigenvalue": float(vals[i]),
                                  "share": float(share[i]), "cumulative": float(cum[i])})
            sum_rows.append({
                "name": name, "layer": layer, "dim": d,
                "tokens": stats_tokens.get(name, {}).get(layer),
                "trace": float(c.diagonal().sum()), "top_eigenvalue": float(vals[0]),
                "effective_rank": effective_rank(vals), "participation_ratio": participation_ratio(vals),
                "k90": int((cum < 0.9).sum()) + 1 if total > 0 else 0,
                "k99": int((cum < 0.99).sum()) + 1 if total > 0 else 0,
            })

    def ks_for(d: int) -> list[int]:
        if k is None:
            return sorted({max(1, d // 64), max(1, d // 16), max(1, d // 4)})
        return [k] if isinstance(k, int) else list(k)

    names = list(named)
    for ia, a in enumerate(names):
        for b in names[ia + 1:]:
            for layer in named[a]:
                if layer not in named[b]:
                    continue
                va, vb = eig[a, layer][1], eig[b, layer][1]
                if va.shape != vb.shape:
                    raise ValueError(f"{a} and {b} have different dimensions at layer {layer}")
                for kk in ks_for(va.shape[0]):
                    theta = _angles(va[:, :kk], vb[:, :kk])
                    for i, t in enumerate(theta.tolist()):
                        angle_rows.append({"a": a, "b": b, "layer": layer, "k": kk, "index": i,
                                           "angle_rad": t, "angle_deg": math.degrees(t), "cos": math.cos(t)})
    for name, per in named.items():
        for layer in per:
            vecs = eig[name, layer][1]
            d = vecs.shape[0]
            for dname, dper in dom.items():
                if layer not in dper:
                    continue
                for kk in ks_for(d):
                    cov_rows.append({"name": name, "domain": dname, "layer": layer, "k": kk,
                                     "coverage": coverage(None, dper[layer], kk, basis=vecs[:, :kk]),
                                     "random": kk / d})
    return Diagnosis(
        spectrum=pd.DataFrame(spec_rows,
                              columns=["name", "layer", "index", "eigenvalue", "share", "cumulative"]),
        summary=pd.DataFrame(sum_rows, columns=["name", "layer", "dim", "tokens", "trace", "top_eigenvalue",
                                                "effective_rank", "participation_ratio", "k90", "k99"]),
        angles=pd.DataFrame(angle_rows,
                            columns=["a", "b", "layer", "k", "index", "angle_rad", "angle_deg", "cos"]),
        coverage=pd.DataFrame(cov_rows, columns=["name", "domain", "layer", "k", "coverage", "random"]),
    )
