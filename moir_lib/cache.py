"""One content-addressed cache directory for everything Moir Lab builds.

The root is ``$MOIR_CACHE`` (default ``~/.cache/moir``). Entries are keyed by a
fingerprint of *everything* that affects them (:func:`fingerprint`), so a change
of any input is a miss and identical inputs are a hit.

Every entry carries a SHA-256 checksum verified on read, so a damaged entry (a flipped bit, a
truncated write) is reported by path and rebuilt, never served: covariance statistics embed it
in their header (:meth:`moir_lib.covariance.CovarianceStats.save`), the pocket model lists one
per file in its manifest, and other files are written with :func:`write_checked` (a
``<name>.sha256`` file beside them) and read with :func:`read_checked`.

Every entry also records the key it was built for, and a reader compares it with the key it asks
for (:func:`key_digest`): an entry copied or moved into another key's folder, its checksums
intact, is not that key's entry and is rebuilt. Covariance statistics record their fingerprint in
their metadata, the pocket model its key in its manifest, and :func:`write_checked` the key's
digest in the checksum file. Two processes building one entry take turns through
:mod:`moir_lib.locks`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moir_lib.files import writing

__all__ = ["DamagedFile", "cache_dir", "fingerprint", "entry_dir", "key_digest", "read_checked",
           "sha256_file", "write_checked"]

log = logging.getLogger(__name__)


class DamagedFile(ValueError):
    """A file's content does not match its checksum (or cannot be parsed): it must not be used."""


def cache_dir() -> Path:
    """The cache root: ``$MOIR_CACHE`` or ``~/.cache/moir`` (created on demand)."""
    root = Path(os.environ.get("MOIR_CACHE", Path.home() / ".cache" / "moir")).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        loop = _symlink_loop(root)
        if loop is not None:
            raise ValueError(f"the cache root {root} ($MOIR_CACHE or ~/.cache/moir) lies in a symlink loop: "
                             f"{loop} leads back to itself; fix the link or set MOIR_CACHE to a directory") \
                from None
        if isinstance(exc, (FileExistsError, NotADirectoryError)):
            raise ValueError(f"the cache root {root} ($MOIR_CACHE or ~/.cache/moir) is a file or lies below "
                             f"one: set MOIR_CACHE to a directory") from None
        raise
    return root


def _symlink_loop(path: Path) -> Path | None:
    """The first symbolic link on ``path`` (or its ancestors) that cannot be resolved because it loops."""
    for part in (*reversed(path.parents), path):
        if part.is_symlink():
            try:
                part.stat()
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return part
    return None


def _canonical(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and obj != obj:  # NaN has no stable identity
        raise ValueError("cannot fingerprint NaN")
    return obj


def fingerprint(obj: Any, length: int = 16) -> str:
    """Hex SHA-256 of the canonical JSON of ``obj`` (dict keys sorted), truncated."""
    text = json.dumps(_canonical(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def entry_dir(kind: str, key: Any) -> Path:
    """Directory ``<cache>/<kind>/<fingerprint(key)>`` (not created)."""
    return cache_dir() / kind / fingerprint(key)


def key_digest(key: Any) -> str:
    """The full-length :func:`fingerprint` of ``key``: what an entry records as the key it was built for."""
    return fingerprint(key, 64)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def write_checked(path: str | os.PathLike[str], write: Callable[[Path], None], *, key: Any) -> Path:
    """Write ``path`` with ``write(tmp_path)``, then its checksum file (the file's SHA-256 and the
    :func:`key_digest` of ``key``, the cache key it is written for); both replaced atomically.

    The checksum is written last: a crash in between leaves a file without a matching checksum,
    which :func:`read_checked` treats as damaged. A full disk or a file-size limit is raised naming
    ``path`` (:func:`moir_lib.files.writing`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with writing(path, tmp):
            write(tmp)
            digest = sha256_file(tmp)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    side_tmp = _sidecar(tmp)
    try:
        with writing(_sidecar(path), side_tmp):
            side_tmp.write_text(f"{digest}  {path.name}\nkey {key_digest(key)}\n")
            os.replace(side_tmp, _sidecar(path))
    finally:
        side_tmp.unlink(missing_ok=True)
    return path


def _recorded(path: Path) -> tuple[str | None, str | None]:
    """``(SHA-256, key digest)`` recorded in the checksum file of ``path`` (``None`` for what it lacks)."""
    try:
        lines = _sidecar(path).read_text().splitlines()
    except OSError:
        return None, None
    digest = lines[0].split()[0] if lines and lines[0].split() else None
    keys = [line.split()[1] for line in lines[1:] if line.startswith("key ") and len(line.split()) == 2]
    return digest, keys[0] if keys else None


def read_checked(path: str | os.PathLike[str], *, key: Any) -> Path | None:
    """``path`` if it exists, matches the checksum :func:`write_checked` wrote and was written for
    ``key``; ``None`` if absent.

    A damaged file (no checksum, or a mismatch) or one written for another key (an entry copied or
    moved into this key's place, or written before entries recorded their key) is logged by path,
    removed, and reported as absent, so the caller rebuilds it.
    """
    path = Path(path)
    if not path.is_file():
        return None
    expected, recorded_key = _recorded(path)
    if expected is None or sha256_file(path) != expected:
        why = "damaged (" + ("no checksum" if expected is None else "checksum mismatch") + ")"
    elif recorded_key != key_digest(key):
        why = ("not this key's entry (" + ("it records no key" if recorded_key is None
                                          else f"it was written for key {recorded_key[:16]}") + ")")
    else:
        return path
    log.warning("cache entry %s is %s: it is removed and will be rebuilt", path, why)
    for victim in (path, _sidecar(path)):
        try:
            victim.unlink(missing_ok=True)
        except OSError:  # a read-only cache: still never served
            pass
    return None
