"""Layer 4 of the sandbox (:mod:`moir_lib.evaluation.humaneval.sandbox`): network and PID namespaces
through ``unshare``, and the read-only file system outside the working directory, each probed once
per interpreter; the strongest that works is used.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from moir_lib.evaluation.humaneval.limits import _ISOLATION_MODES, SandboxConfig, _child_env

log = logging.getLogger(__name__)


# unshare prefixes, strongest first. --kill-child makes the program die with unshare (so killing
# the process group reaches it), and, the program being PID 1 of its namespace, all its descendants.
# With --user (an unprivileged user namespace) first; without it second, which works only for root and
# leaves the program root's capabilities, so it is tried only when the first is refused.
_ISOLATION_CANDIDATES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pid+net", ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child",
                 "--mount-proc")),
    ("pid+net", ("unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc")),
    ("net", ("unshare", "--user", "--map-root-user", "--net", "--mount")),
    ("net", ("unshare", "--net", "--mount")),
)


_PROBE = (
    "import json, os, socket\n"
    "print(json.dumps({'pid': os.getpid(), 'ifaces': sorted(n for _, n in socket.if_nameindex())}))\n"
)


# Makes every mount of the (private) mount namespace read-only except a bind mount of the working
# directory. Runs as root of the namespace, before the untrusted code; ctypes is imported here,
# before the guard removes it. Flags that the kernel locks in a user namespace (nosuid, nodev,
# noexec, atime) are kept, as it requires.
_READONLY_FS = r'''
def _readonly_outside(workdir):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    keep = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
    if libc.mount(workdir.encode(), workdir.encode(), None, 4096 | 16384, None) != 0:
        raise OSError(ctypes.get_errno(), "bind mount of the working directory failed")
    with open("/proc/self/mountinfo") as fh:
        points = [line.split() for line in fh]
    for fields in points:
        point = fields[4].encode().decode("unicode_escape")
        if point == workdir:
            continue
        flags = 32 | 4096 | 1  # MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in fields[5].split(","):
            flags |= keep.get(option, 0)
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"read-only remount of {point} failed")
    import os
    os.chdir(workdir)  # the old working directory is on the read-only mount below the bind
'''


_READONLY_PROBE = _READONLY_FS + r'''
import os, sys, tempfile
work = tempfile.mkdtemp(dir=sys.argv[1])
outside = os.path.join(sys.argv[1], "outside")
_readonly_outside(work)
open("inside", "w").close()
try:
    open(outside, "w").close()
except OSError:
    print("readonly")
'''


@functools.lru_cache(maxsize=32)
def _readonly_works(prefix: tuple[str, ...], interpreter: str) -> bool:
    """Whether ``prefix`` (with a mount namespace) can make everything but the working directory read-only."""
    if "--mount" not in prefix and "--mount-proc" not in prefix:
        return False
    with tempfile.TemporaryDirectory(prefix="moir-sandbox-probe-") as base:
        try:
            done = subprocess.run([*prefix, interpreter, "-I", "-c", _READONLY_PROBE, base],
                                  capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL,
                                  env=_child_env(base))
        except (OSError, subprocess.SubprocessError):
            return False
        ok = done.returncode == 0 and done.stdout.strip() == "readonly" and not Path(base, "outside").exists()
    if not ok:
        log.warning("the sandbox cannot mount the file system read-only here (%s): writes outside the "
                    "working directory are stopped by the Python guard only", done.stderr.strip()[-200:])
    return ok


def _probe(prefix: Sequence[str], interpreter: str, want_pid1: bool) -> bool:
    if shutil.which(prefix[0]) is None:
        return False
    try:
        done = subprocess.run([*prefix, interpreter, "-I", "-c", _PROBE], capture_output=True, text=True,
                              timeout=20, stdin=subprocess.DEVNULL, env=_child_env(tempfile.gettempdir()))
        info = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return False
    if not info or info["ifaces"] not in ([], ["lo"]):
        return False
    return info["pid"] == 1 if want_pid1 else True


@functools.lru_cache(maxsize=32)
def _prefix_for(mode: str, interpreter: str) -> tuple[str, ...] | None:
    """The first working ``unshare`` prefix of ``mode`` (probed once per interpreter), else None."""
    if mode == "none":
        return ()
    for candidate_mode, prefix in _ISOLATION_CANDIDATES:
        if candidate_mode == mode and _probe(prefix, interpreter, want_pid1=mode == "pid+net"):
            return prefix
    return None


def _resolve_isolation(config: SandboxConfig) -> tuple[str, tuple[str, ...]]:
    interpreter = config.interpreter or sys.executable
    if config.isolation != "auto":
        prefix = _prefix_for(config.isolation, interpreter)
        if prefix is None:
            best = next(m for m in _ISOLATION_MODES if _prefix_for(m, interpreter) is not None)
            raise ValueError(f"isolation {config.isolation!r} is not available on this machine (best: "
                             f"{best!r}); unprivileged user namespaces may be disabled (sysctl "
                             f"kernel.unprivileged_userns_clone or user.max_user_namespaces)")
        return config.isolation, prefix
    for mode in _ISOLATION_MODES:
        prefix = _prefix_for(mode, interpreter)
        if prefix is not None:
            if mode == "none":
                _warn_no_namespaces()
            return mode, prefix
    raise AssertionError("unreachable: 'none' always resolves")


@functools.lru_cache(maxsize=1)
def _warn_no_namespaces() -> None:
    log.warning("no network/PID namespace available (unshare refused): the sandbox falls back to blocking "
                "sockets inside Python and to the process-group kill")


def isolation_mode(config: SandboxConfig | None = None) -> str:
    """The namespaces :func:`execute` will use with ``config``: ``"pid+net"``, ``"net"`` or ``"none"``."""
    return _resolve_isolation(config or SandboxConfig())[0]
