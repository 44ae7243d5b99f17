"""Exclusive locks on output directories, files and cache entries (one writer at a time).

A lock is ``fcntl.flock`` on a small lock file that records its holder (PID, command line, host,
start time) while held and is emptied on release. The kernel releases a ``flock`` when its holder
dies, even after ``kill -9``, so a record left in an unlocked file belongs to a dead process: the
next writer takes the lock over (and says so in the log). A live holder makes :func:`exclusive`
raise :class:`Busy` at once, naming its PID and command; ``wait=True`` (cache entries: one
process builds, the others wait, then reuse) blocks instead, logging whom it waits for.

Lock files: ``<dir>/.moir.lock`` for a directory (:func:`dir_lock_path`), ``.<name>.lock``
beside a file (:func:`file_lock_path`). A ``flock`` conflicts between two opens of the same file
even within one process, so a process must not lock the same path twice.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["Busy", "exclusive", "dir_lock_path", "file_lock_path", "holder", "writable_dir",
           "writable_file"]

log = logging.getLogger(__name__)

DIR_LOCK = ".moir.lock"


class Busy(RuntimeError):
    """Another live process holds the lock."""


def dir_lock_path(folder: str | os.PathLike[str]) -> Path:
    """The lock file of a directory (``<folder>/.moir.lock``)."""
    return Path(folder) / DIR_LOCK


def file_lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file of a file (``.<name>.lock`` beside it)."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


def holder(lock_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The lock file's record of its holder: ``pid``, ``command``, ``host``, ``since`` (``{}`` if free)."""
    try:
        return json.loads(Path(lock_path).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _describe(info: dict[str, Any]) -> str:
    if not info:
        return "another process"
    return (f"PID {info.get('pid')} on {info.get('host')} ({info.get('command')!r}, "
            f"since {info.get('since')})")


@contextlib.contextmanager
def exclusive(lock_path: str | os.PathLike[str], what: str, *, wait: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on ``lock_path`` (created with its parents) for the ``with`` block.

    ``what`` names the protected thing in messages (e.g. ``"run directory runs/x"``). Raises
    :class:`Busy` naming the holder when another live process has it (``wait=False``), or waits
    for it (``wait=True``). Raises ``ValueError`` when the lock file cannot be created (an
    unwritable destination), before any work.
    """
    lock_path = Path(lock_path)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        where = exc.filename or lock_path
        raise ValueError(f"{what}: cannot write there ({exc.strerror}: {where})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = holder(lock_path)
            if not wait:
                raise Busy(f"{what} is in use by {_describe(info)}: wait for it to finish, or choose "
                           f"another destination (lock file {lock_path})") from None
            log.info("%s is being written by %s: waiting for it", what, _describe(info))
            fcntl.flock(fd, fcntl.LOCK_EX)
        previous = holder(lock_path)
        if previous:  # a clean release empties the file: this holder died with the lock
            log.warning("%s: taking over the lock left by %s, which is no longer running", what,
                        _describe(previous))
        command = " ".join(getattr(sys, "orig_argv", sys.argv))[:300]
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                  "since": _dt.datetime.now().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        try:
            yield lock_path
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


def writable_dir(folder: str | os.PathLike[str], what: str) -> Path:
    """Create ``folder`` (with parents) and prove it writable with a probe file; ``ValueError`` otherwise.

    A real write, not ``os.access``: root passes permission checks but not a read-only mount, and
    a path under a regular file fails only when something is created there.
    """
    folder = Path(folder).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".moir-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{what} {folder} is not a writable directory ({exc.strerror}: "
                         f"{exc.filename or folder})") from None
    return folder


def writable_file(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` if a file can be written there: not a directory, in a writable directory
    (:func:`writable_dir`, which creates it); a ``ValueError`` naming ``what`` otherwise. Checked before
    the work whose result goes there."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"{what} {path} is a directory: name a file (in it, or elsewhere)")
    writable_dir(path.parent, what)
    return path
