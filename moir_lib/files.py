"""Output files written atomically: a temporary file beside the target, flushed to disk, then renamed.

A write that fails half-way (disk full, a file-size limit, a kill) leaves the previous file whole and
no partial one: readers see the old content or the new, never a truncated table. Such a fault is raised
as a :class:`WriteError` that names the file and what to do (:func:`writing`): the OS error of a failed
``write`` names no file, and a library's own wrapper of it (safetensors) is no ``OSError`` at all.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["WriteError", "atomic_write", "describe_os_error", "fsync_dir", "write_json", "write_text",
           "writing"]

#: what to do about an environment fault met while writing, by errno
REMEDIES = {
    errno.ENOSPC: "the disk is full: free space, then rerun; finished work is kept",
    errno.EDQUOT: "the disk quota is used up: free space, then rerun; finished work is kept",
    errno.EFBIG: "a file-size limit: raise `ulimit -f`, then rerun; finished work is kept",
    errno.EACCES: "no permission: choose a writable place",
    errno.EROFS: "a read-only file system: choose a writable place",
}


def describe_os_error(err: OSError) -> str:
    """``strerror: path (what to do)`` of an environment fault (a :class:`WriteError`: ``could not write
    path: strerror (what to do)``)."""
    reason = err.strerror or (str(err.args[0]) if err.args else type(err).__name__)
    hint = f" ({REMEDIES[err.errno]})" if err.errno in REMEDIES else ""
    if isinstance(err, WriteError):
        return f"could not write {err.filename}: {reason}{hint}"
    return f"{reason}{f': {err.filename}' if err.filename else ''}{hint}"


class WriteError(OSError):
    """An environment fault (disk full, file-size limit, permissions) met writing the file ``filename``."""

    def __str__(self) -> str:
        return describe_os_error(self)


def _fault(err: BaseException, path: Path, partial: Path | None) -> WriteError | None:
    """``err`` as a :class:`WriteError` naming ``path``, when it is an environment fault: an ``OSError``,
    a wrapper whose message carries one (``os error 28``), or any failure with the disk full or the
    half-written ``partial`` at the file-size limit; ``None`` otherwise."""
    if isinstance(err, OSError) and err.filename is not None and str(err.filename) not in (str(path),
                                                                                       str(partial)):
        return None  # a fault of another file (an input read while writing): it names that one
    code = err.errno if isinstance(err, OSError) else None
    if code is None:
        found = re.search(r"os error (\d+)|errno (\d+)", str(err), re.IGNORECASE)
        code = int(next(filter(None, found.groups()))) if found else None
    if code is None and not isinstance(err, OSError):
        with contextlib.suppress(OSError):
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            if partial is not None and limit != resource.RLIM_INFINITY and partial.stat().st_size >= limit:
                code = errno.EFBIG
            elif shutil.disk_usage(path.parent).free == 0:
                code = errno.ENOSPC
    if code is None and not isinstance(err, OSError):
        return None
    reason = os.strerror(code) if code is not None else (getattr(err, "strerror", None) or str(err))
    return WriteError(code, reason, str(path))


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], partial: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Writes to ``path`` (through ``partial``, its temporary file, if any) inside this block: an
    environment fault is raised as a :class:`WriteError` naming ``path`` and what to do; any other error
    is raised as it is."""
    try:
        yield
    except WriteError:
        raise
    except Exception as err:
        fault = _fault(err, Path(path), Path(partial) if partial is not None else None)
        if fault is None:
            raise
        raise fault from err


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
    absent); the error is re-raised (an environment fault as a :class:`WriteError` naming ``path``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with writing(path, tmp):
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
