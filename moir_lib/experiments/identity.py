"""What a row's key covers besides the lab's settings (the code, the row version), and where the
machine-wide copy of a scored point lives."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

#: Version of the lab's rows (part of every key): bumped when its evaluation changes.
ROW_VERSION = 2
#: Sources whose content determines the numbers (part of every key): editors, metrics, C estimation,
#: self-generation, corpora, model loading, the NLL, the pocket tasks, and the lab's own editing and
#: evaluation loop. The chapters' tables and texts (:mod:`moir_lib.chapters`) are not: editing them keeps
#: the cache.
_CODE_FILES = ("moir_lib/experiments/lab.py", "moir_lib/experiments/editrun.py", "moir_lib/editing/*.py",
               "moir_lib/evaluation/*.py", "moir_lib/covariance/*.py", "moir_lib/streams.py",
               "moir_lib/generation.py", "moir_lib/corpora.py", "moir_lib/models.py", "moir_lib/data.py",
               "moir_lib/analysis/nll.py", "data/tasks/*")


@functools.cache
def code_identity() -> str:
    """Fingerprint of the library code that produces the numbers (see :data:`_CODE_FILES`)."""
    return files_digest(_CODE_FILES)


@functools.cache
def files_digest(patterns: tuple[str, ...]) -> str:
    """Fingerprint of the repository files matching ``patterns`` (names and contents)."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for pattern in patterns:
        for f in sorted(root.glob(pattern)):
            if f.is_file():
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def shared_path(key: str, n: int) -> Path:
    """The machine-wide copy of one scored point (``$MOIR_CACHE/experiments/...``)."""
    from moir_lib.cache import entry_dir

    return entry_dir("experiments", {"key": key, "n_edits": int(n)}) / "rows.parquet"


def shared_items_path(key: str, n: int) -> Path:
    """The machine-wide copy of one scored point's per-item scores, beside its rows."""
    return shared_path(key, n).with_name("items.parquet")
