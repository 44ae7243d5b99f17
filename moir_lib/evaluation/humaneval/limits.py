"""What one sandboxed program may use: :class:`SandboxConfig`, the child's minimal environment and its
resource limits (layers 2 and 3 of :mod:`moir_lib.evaluation.humaneval.sandbox`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

_ISOLATION_MODES: tuple[str, ...] = ("pid+net", "net", "none")  # strongest first


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one program run (:mod:`moir_lib.evaluation.humaneval.sandbox` says what each layer does).

    ``isolation``: ``"auto"`` (the strongest of ``"pid+net"``, ``"net"``, ``"none"`` that
    works here), or one of them explicitly (``ValueError`` if unavailable).
    ``python_guard``: install the Python-level guard (turn off only to test the OS layers).
    """

    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_processes: int = 16
    max_open_files: int = 256
    isolation: str = "auto"
    python_guard: bool = True
    interpreter: str | None = None  # default: sys.executable

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        for name in ("memory_mb", "file_size_mb", "max_processes", "max_open_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.isolation not in ("auto", *_ISOLATION_MODES):
            raise ValueError(f"isolation {self.isolation!r}: choose auto, {', '.join(_ISOLATION_MODES)}")


#: Environment variables passed on to the child (everything else is dropped).
_KEPT_ENV = ("PATH", "LANG")


def _child_env(workdir: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in _KEPT_ENV if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update({"HOME": workdir, "TMPDIR": workdir})
    return env


def _user_process_count() -> int:
    uid = os.getuid()
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                continue
    return count


def _limits(config: SandboxConfig) -> dict[str, int | None]:
    mib = 2**20
    nproc: int | None = None
    if os.getuid() != 0 and Path("/proc").is_dir():
        nproc = _user_process_count() + config.max_processes
    return {
        "as_bytes": config.memory_mb * mib,
        "cpu_s": int(math.ceil(config.timeout_s)) + 1,
        "fsize_bytes": config.file_size_mb * mib,
        "nofile": config.max_open_files,
        "nproc": nproc,
    }
