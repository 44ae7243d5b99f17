"""One content-addressed cache directory for everything Moir Lab builds.

The root is ``$MOIR_CACHE`` (default ``~/.cache/moir``). Entries are keyed by a
fingerprint of *everything* that affects them (:func:`fingerprint`), so a change
of any input is a miss and identical inputs are a hit.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "fingerprint", "entry_dir"]


def cache_dir() -> Path:
    """The cache root: ``$MOIR_CACHE`` or ``~/.cache/moir`` (created on demand)."""
    root = Path(os.environ.get("MOIR_CACHE", Path.home() / ".cache" / "moir")).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


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
