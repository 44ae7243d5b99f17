"""Output files written atomically: a temporary file beside the target, flushed to disk, then renamed.

A write that fails half-way (disk full, a file-size limit, a kill) leaves the previous file whole and
no partial one: readers see the old content or the new, never a truncated table.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "write_text", "write_json", "fsync_dir"]


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (the rename) to disk, where the OS allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` to a temporary path beside ``path``, flush it, then rename it over ``path``.

    On any error the temporary file is removed and ``path`` keeps its previous content (or stays
    absent); the error is re-raised.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return path


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``path`` holds ``text`` (UTF-8), written atomically."""
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: str | os.PathLike[str], data: Any, **dumps: Any) -> Path:
    """``path`` holds ``json.dumps(data, **dumps)`` and a final newline, written atomically."""
    return write_text(path, json.dumps(data, **dumps) + "\n")
