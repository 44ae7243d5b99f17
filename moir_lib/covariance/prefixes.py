"""Nested prefixes of one pass: ``C`` of the first ``m`` documents (or samples), taken as the pass crosses.

``C`` is a sum of per-batch key products (eq. (memoir_estimator)), so the ``C`` of the first ``m``
documents of a corpus is a partial sum of the same pass: :class:`PrefixTaps` collects it for every point
``m`` asked for, unit by unit (a window of documents of :func:`~moir_lib.covariance.estimation.estimate`,
a block of samples of :func:`~moir_lib.generation.self_generate`). Where ``m`` falls at the start of a
unit, the prefix is the running sum as it stands; where it falls inside one, a copy of the running sum
at the unit's start receives, in the same forward passes, the keys of the unit's rows below ``m``
(:meth:`~moir_lib.covariance.hooks.KeyCollector.set_taps`). The running sum itself is untouched: a pass
with prefixes yields the same ``C``, bit for bit, as one without, which is why prefixes are stored beside
the full ``C`` under its own cache entry rather than under a key of their own. The prefix is the exact
sum of the first ``m`` documents' keys, grouped differently from a pass over those documents alone (the
last unit's batches hold later documents too): equal to float64 rounding.

A point is a count of documents (samples), *global*: a shard holds the rows of indices below ``m``, and the
shards' prefixes at ``m`` merge into the first ``m`` of the whole corpus. :func:`prefix_counts` turns
fractions of a corpus (``"1/16"``) into points; :func:`second_half` is ``C`` of the documents between a
prefix and the whole (the difference of the sums, exact to float64 rounding): with the prefix at half the
corpus, the split halves of :mod:`moir_lib.covariance.convergence`. **Memory**: one extra ``d×d`` float64
sum per layer for every point inside the current unit, while the unit runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.covariance.stats import CovarianceStats, read_metadata

if TYPE_CHECKING:
    import torch
    from jaxtyping import Bool

__all__ = ["PREFIX_FILE", "PrefixStore", "PrefixTaps", "format_fraction", "parse_fraction", "prefix_counts",
           "prefix_metadata", "second_half"]

log = logging.getLogger(__name__)


def parse_fraction(value: str | float | Fraction) -> Fraction:
    """A prefix fraction ``0 < f < 1`` from ``"1/4"``, ``0.25`` or a :class:`~fractions.Fraction`;
    ``ValueError`` otherwise."""
    try:
        f = Fraction(value).limit_denominator(1 << 20) if not isinstance(value, Fraction) else value
    except (TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"a prefix fraction is p/q or a number between 0 and 1 (e.g. 1/4), got {value!r}") \
            from None
    if not 0 < f < 1:
        raise ValueError(f"a prefix fraction lies strictly between 0 and 1 (the whole is the C itself), got "
                         f"{value!r}")
    return f


def format_fraction(value: str | float | Fraction) -> str:
    """``"1/4"`` for 0.25 (the form C names carry: ``moir[1/4]``)."""
    f = parse_fraction(value)
    return f"{f.numerator}/{f.denominator}"


def prefix_counts(n: int, fractions: Iterable[str | float | Fraction]) -> dict[str, int]:
    """``{fraction: ⌊n·f⌋}`` for a corpus of ``n`` documents; ``ValueError`` for a fraction that leaves no
    document."""
    out = {}
    for value in fractions:
        name = format_fraction(value)
        m = int(n * parse_fraction(value))
        if m < 1:
            raise ValueError(f"prefix {name} of {n} documents holds no document: use a larger fraction or "
                             f"more documents")
        out[name] = m
    return out


def second_half(full: CovarianceStats, prefix: CovarianceStats) -> CovarianceStats:
    """``C`` of the documents after ``prefix`` (a prefix of ``full``'s pass): ``S_full − S_prefix`` and
    ``N_full − N_prefix`` per layer."""
    if full.layers != prefix.layers or full.dim != prefix.dim:
        raise ValueError(f"a prefix holds the layers and width of its C: {list(prefix.layers)} × "
                         f"{prefix.dim} against {list(full.layers)} × {full.dim}")
    counts = {layer: full.count(layer) - prefix.count(layer) for layer in full.layers}
    if any(c < 0 for c in counts.values()):
        raise ValueError("the prefix counts more keys than the whole: it is not a prefix of this C")
    sums = {layer: full.sum(layer).cpu() - prefix.sum(layer).cpu() for layer in full.layers}
    return CovarianceStats.from_sums(sums, counts, {**full.metadata, "corpus": []}, precision=full.precision)


PREFIX_FILE = "prefix-{m}.safetensors"


class PrefixStore(Mapping[int, CovarianceStats]):
    """The prefixes of the ``C`` of fingerprint ``of`` by point ``m``: held in memory, or read on demand from
    ``folder``'s files (:data:`PREFIX_FILE`; one ``d×d`` sum per layer each, only those asked for are
    loaded, checksum verified). A file written for another ``C`` is not one of its prefixes."""

    def __init__(self, folder: Path | None, of: str | None, name: str = PREFIX_FILE) -> None:
        self.folder, self.of, self._name = folder, of, name
        self._held: dict[int, CovarianceStats] = {}
        self._points: list[int] = []
        if folder is not None and folder.is_dir():
            self._points = sorted(m for m in (_point_of(p, name) for p in folder.iterdir())
                                  if m is not None and self._belongs(folder / name.format(m=m)))

    def _belongs(self, path: Path) -> bool:
        try:
            return (read_metadata(path).get("prefix") or {}).get("of") == self.of
        except (OSError, ValueError):  # unreadable: not served (a pass writes it again)
            return False

    def path(self, m: int) -> Path | None:
        return None if self.folder is None else self.folder / self._name.format(m=int(m))

    def has(self, points: Iterable[int]) -> bool:
        """Whether every point of ``points`` is held or on file."""
        return set(int(m) for m in points) <= set(self._points)

    def hold(self, m: int, stats: CovarianceStats) -> None:
        """Keep the prefix at ``m`` in memory (no folder to write it to)."""
        self._held[int(m)] = stats
        self.saved(m)

    def saved(self, m: int) -> None:
        """The prefix at ``m`` is now held or on file."""
        self._points = sorted({*self._points, int(m)})

    def __getitem__(self, m: int) -> CovarianceStats:
        if m in self._held:
            return self._held[m]
        path = self.path(m)
        if m not in self._points or path is None or not path.is_file():
            raise KeyError(m)
        stats = CovarianceStats.load(path, require_checksum=True)
        stats.from_cache = True
        return stats

    def __contains__(self, m: object) -> bool:
        return m in self._points

    def __iter__(self) -> Iterator[int]:
        return iter(self._points)

    def __len__(self) -> int:
        return len(self._points)


def _point_of(path: Path, name: str) -> int | None:
    head, _, tail = name.partition("{m}")
    text = path.name
    if not (text.startswith(head) and text.endswith(tail)) or len(text) <= len(head) + len(tail):
        return None
    core = text[len(head):len(text) - len(tail)]
    return int(core) if core.isdigit() else None


class PrefixTaps:
    """The prefixes at ``points`` (global document / sample counts) of one pass, unit by unit.

    Call :meth:`begin` before a unit with the running statistics and the unit's global indices (in the
    order its keys are counted), :meth:`rows` for the taps of each forward pass of the unit (a batch's
    row indices), :meth:`end` after it; ``emit(m, stats, documents)`` receives each prefix once it is
    complete (``documents``: those it holds, ``m`` but at the corpus's end). ``done``: points already
    emitted (a resumed pass). :meth:`finish` emits the points at or beyond the corpus's end.
    """

    def __init__(self, points: Iterable[int], emit: Callable[[int, CovarianceStats, int], None],
                 done: Iterable[int] = ()) -> None:
        self.pending = sorted(set(int(m) for m in points) - set(int(m) for m in done))
        if any(m < 1 for m in self.pending):
            raise ValueError(f"prefix points are document counts ≥ 1, got {self.pending}")
        self.emit = emit
        self._partial: dict[int, CovarianceStats] = {}

    def __bool__(self) -> bool:
        return bool(self.pending)

    def begin(self, running: CovarianceStats, indices: Sequence[int]) -> None:
        """Before a unit of documents ``indices``: emit the points at its start (every document of the
        unit at or past ``m``: the running sum is the prefix) and open a partial sum for each point inside
        it."""
        if not indices:
            return
        lo, hi = min(indices), max(indices)
        for m in list(self.pending):
            if lo >= m:
                self._emit(m, running)
            elif hi >= m:
                self._partial[m] = running.copy()

    def rows(self, indices: Sequence[int]) -> list[tuple[CovarianceStats, Bool[torch.Tensor, " batch"]]]:
        """The taps of one forward pass over the documents ``indices`` (one per batch row)."""
        import torch

        return [(stats, torch.tensor([i < m for i in indices], dtype=torch.bool))
                for m, stats in self._partial.items()]

    def end(self) -> None:
        """After the unit: emit the prefixes that fell inside it."""
        for m, stats in list(self._partial.items()):
            self._emit(m, stats.flush())
        self._partial = {}

    def finish(self, running: CovarianceStats, documents: int) -> None:
        """At the end of the pass (``documents`` in all): the points past the last document hold them all."""
        for m in list(self.pending):
            if m > documents:
                log.warning("prefix point %d lies past the corpus's %d documents: its C is the whole "
                            "corpus's", m, documents)
            self._emit(m, running, min(m, documents))

    def _emit(self, m: int, stats: CovarianceStats, documents: int | None = None) -> None:
        self.emit(m, stats, m if documents is None else documents)
        self.pending.remove(m)
        self._partial.pop(m, None)


def prefix_metadata(stats: CovarianceStats, m: int, of: str | None, record: Mapping[str, Any]
                    ) -> dict[str, Any]:
    """The metadata a prefix carries besides its statistics': its point ``m``, the whole's fingerprint
    ``of``, its corpus ``record`` (documents and keys counted)."""
    from moir_lib.cache import fingerprint

    return {"prefix": {"point": int(m), "of": of, "tokens": stats.n_tokens},
            "corpus": [{**record, "tokens": stats.n_tokens}],
            "fingerprint": fingerprint({"of": of, "prefix": int(m)})}
