"""Exact key statistics: per-layer float64 sums ``S = Σ_i k_i k_iᵀ``, counts ``N`` (eq. (memoir_estimator)).

:class:`CovarianceStats` holds them; sums are exact to float64 rounding, so statistics of disjoint
shards :meth:`~CovarianceStats.merge` into those of one run (:func:`check_disjoint` refuses
overlaps). :meth:`~CovarianceStats.mean` is ``Ĉ = S / N``: the **per-token normalised** second
moment, the convention of ROME/MEMIT's ``layer_stats`` (``mom2.moment()``) for which MEMIT's
``λ = 15 000`` (``mom2_update_weight``) and AlphaEdit's thresholds are tuned. Saved as one
safetensors file with the JSON metadata and a SHA-256 in its header (atomic replace).

**Memory.** One ``d×d`` float64 accumulator per layer (1.6 GB at ``d = 14 336``, 9.9 GB for six
layers), on the device of the keys, plus up to ``flush_tokens`` buffered keys per layer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.cache import DamagedFile, fingerprint
from moir_lib.covariance.products import (
    PRECISIONS,
    _torch,
    symmetric,
    upper_add_float32_,
    upper_add_tf32_,
    upper_addmm_,
)
from moir_lib.files import fsync_dir, writing

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Float64

log = logging.getLogger(__name__)

FORMAT = "moir-covariance/1"
#: metadata fields that must agree for statistics to be merged or mixed.
IDENTITY_FIELDS = ("model", "key_site", "key_dim", "dtype", "precision", "tokenization")
#: byte alignment of the accumulators on CPU (torch's allocator gives it; MKL's GEMM rounds by it)
_ALIGN = 64


class CovarianceStats:
    """Per-layer float64 sums of key outer products and token counts, with metadata.

    ``layers``: the layers held; ``dim``: the key dimension ``d`` (the MLP intermediate size);
    ``metadata``: plain JSON data (model fingerprint, key site, dtype, precision, tokenization,
    corpus records …; see :data:`IDENTITY_FIELDS`); ``precision``: how batch products are formed
    (:mod:`moir_lib.covariance.products`). Accumulators are allocated lazily on the device of the first
    keys (``d×d`` float64 per layer: 1.6 GB for ``d = 14 336``).

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
        self._acc: dict[int, Float64[torch.Tensor, "d_in d_in"] | None] = dict.fromkeys(self.layers)
        self._count: dict[int, int] = dict.fromkeys(self.layers, 0)
        self.flush_tokens = int(flush_tokens)
        self._pending: dict[int, list[Float[torch.Tensor, "tokens d_in"]]] = {
            layer: [] for layer in self.layers}
        self._pending_n: dict[int, int] = dict.fromkeys(self.layers, 0)
        #: set by :func:`estimate`: whether the stats came from the cache, and the file they live in
        self.from_cache = False
        self.path: Path | None = None
        #: set by :func:`estimate` and :func:`~moir_lib.generation.load_key_stats`: the statistics of the
        #: first ``m`` documents of the same pass, by ``m`` (:mod:`moir_lib.covariance.prefixes`)
        self.prefixes: Mapping[int, CovarianceStats] = {}

    @classmethod
    def from_sums(cls, sums: Mapping[int, Any], counts: Mapping[int, int] | int,
                  metadata: Mapping[str, Any] | None = None, *, precision: str = "float64"
                  ) -> CovarianceStats:
        """Statistics holding given sums ``S_ℓ = Σ k kᵀ`` (``(d, d)`` each, any float dtype, kept as
        float64) and token counts ``N_ℓ`` (one int for every layer, or one per layer).

        Refuses (``ValueError`` naming the layer) a sum that is not square, not of the common width,
        not finite or not symmetric, and a negative count.
        """
        torch = _torch()
        if not sums:
            raise ValueError("no sums given: nothing to hold")
        per_layer = ({int(k): int(v) for k, v in counts.items()} if isinstance(counts, Mapping)
                     else {int(k): int(counts) for k in sums})
        tensors = {int(k): torch.as_tensor(v).detach().to("cpu", torch.float64, copy=True)
                   for k, v in sums.items()}
        if set(per_layer) != set(tensors):
            raise ValueError(f"counts for layers {sorted(per_layer)} but sums for layers {sorted(tensors)}")
        dim = next(iter(tensors.values())).shape[-1]
        for layer, S in tensors.items():
            if S.ndim != 2 or S.shape != (dim, dim):
                raise ValueError(f"the sum of layer {layer} has shape {tuple(S.shape)}; every sum must be "
                                 f"({dim}, {dim})")
            if not bool(torch.isfinite(S).all()):
                raise ValueError(f"the sum of layer {layer} has NaN or infinite entries")
            scale = float(S.abs().max()) or 1.0
            if float((S - S.T).abs().max()) > 1e-6 * scale:
                raise ValueError(f"the sum of layer {layer} is not symmetric: not a second moment Σ k kᵀ")
            if per_layer[layer] < 0:
                raise ValueError(f"the count of layer {layer} is negative ({per_layer[layer]})")
        stats = cls(list(tensors), dim, metadata, precision=precision)
        for layer, S in tensors.items():
            stats._acc[layer] = S
            stats._count[layer] = per_layer[layer]
        return stats

    # ------------------------------------------------------------------ accumulation

    def _accumulator(self, layer: int, device: Any) -> Float64[torch.Tensor, "d_in d_in"]:
        torch = _torch()
        acc = self._acc[layer]
        if acc is None:
            with torch.inference_mode(False):  # a normal tensor, even when called under inference_mode
                acc = torch.zeros(self.dim, self.dim, dtype=torch.float64, device=device)
            self._acc[layer] = acc
        elif acc.device.type == "cpu" and acc.data_ptr() % _ALIGN:
            # MKL's GEMM adds into a C that is not 64-byte aligned with another rounding (its rule for
            # reproducible results): a sum loaded from a file (safetensors maps it at the header's
            # offset) would continue differently from an uninterrupted run. A fresh copy is aligned.
            with torch.inference_mode(False):
                acc = acc.clone(memory_format=torch.contiguous_format)
            self._acc[layer] = acc
        return acc

    def update(self, layer: int, keys: Float[torch.Tensor, "tokens d_in"], *,
               batch: int | None = None) -> None:
        """Add ``Σ k kᵀ`` over the rows of ``keys`` (any float dtype) to ``layer``.

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

    def _add(self, layer: int, keys: Float[torch.Tensor, "tokens d_in"]) -> None:
        torch = _torch()
        acc = self._accumulator(layer, keys.device)
        if keys.device != acc.device:
            keys = keys.to(acc.device)
        with torch.inference_mode(False):
            if self.precision == "float64":
                upper_addmm_(acc, keys.to(torch.float64))
            elif self.precision == "tf32":
                upper_add_tf32_(acc, keys)
            else:
                upper_add_float32_(acc, keys)

    # ------------------------------------------------------------------ reading

    def count(self, layer: int) -> int:
        """Number of keys (token positions) accumulated for ``layer``."""
        self._check_layer(layer)
        return self._count[layer]

    @property
    def counts(self) -> dict[int, int]:
        return dict(self._count)

    def sum(self, layer: int) -> Float64[torch.Tensor, "d_in d_in"]:
        """``Σ k kᵀ`` of ``layer`` (symmetric, on the accumulator's device)."""
        torch = _torch()
        self._check_layer(layer)
        self._flush_layer(layer)
        acc = self._acc[layer]
        if acc is None:
            return torch.zeros(self.dim, self.dim, dtype=torch.float64)
        return symmetric(acc)

    def mean(self, layer: int) -> Float64[torch.Tensor, "d_in d_in"]:
        """``Ĉ = Σ k kᵀ / N``: the per-token normalised ``C`` of eq. (memoir_estimator).

        This is ``layer_stats``' ``mom2.moment()``, the matrix MEMIT's ``λ = 15 000`` multiplies.
        """
        n = self.count(layer)
        if n == 0:
            source = f" in {self.path}" if self.path is not None else ""
            raise ValueError(f"layer {layer} has no keys{source}: nothing to average (was the corpus empty, "
                             f"or the estimate interrupted before its first batch?)")
        return self.sum(layer) / n

    def means(self) -> dict[int, Float64[torch.Tensor, "d_in d_in"]]:
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
        meta = {k: v for k, v in self.metadata.items() if k in IDENTITY_FIELDS or k in KEEP_ON_MERGE}
        for k in KEEP_ON_MERGE:
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
            with writing(path, tmp):  # a full disk or a file-size limit names the file (safetensors: too)
                save_file(tensors, str(tmp), metadata={"moir": json.dumps(header, sort_keys=True)})
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        fsync_dir(path.parent)
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
        for layer in stats.layers:  # fresh (aligned) copies: see _accumulator
            stats._acc[layer] = tensors[f"layer.{layer}"].to(device or "cpu", copy=True)
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
KEEP_ON_MERGE = ("format", "model_name", "revision", "layers", "key_dim")


def _checksum(header: Mapping[str, Any], tensors: Mapping[str, Float64[torch.Tensor, "d_in d_in"]]) -> str:
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


