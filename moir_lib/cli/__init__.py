"""The ``moir`` command: one entry point, one sub-command per job.

Every parser lives in this package: :mod:`~moir_lib.cli.args` holds the shared argument helpers,
and one module per command group registers its sub-commands through an
``add_parser(subparsers)`` function (listed in :data:`COMMANDS`). Commands are thin: parse,
check, call the library function a chapter calls, print. They keep heavy imports (torch,
transformers, papermill) inside their handlers so that ``moir --help`` and argument errors
answer instantly. No library module imports this package.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from moir_lib.files import describe_os_error
from moir_lib.locks import Busy, dir_lock_path, exclusive, file_lock_path

__all__ = ["main", "COMMANDS", "OUTPUT_LOCKS"]

#: sub-command name -> "module:function" that adds its parser and sets ``func``.
COMMANDS: dict[str, str] = {
    "run": "moir_lib.cli.runs:add_parser",
    "book": "moir_lib.cli.runs:add_book_parser",
    "nbcheck": "moir_lib.cli.runs:add_nbcheck_parser",
    "grid": "moir_lib.cli.grid:add_parser",
    "generate": "moir_lib.cli.generate:add_parser",
    "cov": "moir_lib.cli.covariance:add_parser",
    "edit": "moir_lib.cli.edit:add_parser",
    "check-reference": "moir_lib.cli.edit:add_check_reference_parser",
    "trace": "moir_lib.cli.trace:add_parser",
    "eval": "moir_lib.cli.evaluate:add_parser",
    "pocket": "moir_lib.cli.pocket:add_parser",
    "components": "moir_lib.cli.components:add_parser",
    "docs": "moir_lib.cli.docs:add_parser",
}


#: commands whose ``--out`` is locked (a directory or a file) for the whole command: a second writer
#: is refused at once, and an unwritable destination fails here, before any model is loaded.
#: ``generate`` locks its shard itself (shards of one run share ``--out``); ``grid`` its root.
OUTPUT_LOCKS: dict[str, str] = {"run": "dir", "edit": "dir", "trace": "dir", "eval": "dir",
                                "cov estimate": "file", "cov merge": "file", "cov export": "dir",
                                "cov import": "file"}


@contextlib.contextmanager
def _output_lock(args: argparse.Namespace) -> Iterator[None]:
    """Hold the lock of ``args.out`` for the commands of :data:`OUTPUT_LOCKS` (others: nothing)."""
    name = " ".join(filter(None, (args.command, getattr(args, "cov_command", None))))
    kind, out = OUTPUT_LOCKS.get(name), getattr(args, "out", None)
    if kind is None or out is None:
        yield
        return
    out = Path(out).expanduser()
    if kind == "dir" and out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    if kind == "file" and out.is_dir():
        raise ValueError(f"--out {out} is a directory: name a file")
    folder = out if kind == "dir" else out.parent
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    lock = dir_lock_path(out) if kind == "dir" else file_lock_path(out)
    new_lock = not lock.exists()
    done = False
    try:
        with exclusive(lock, f"--out {out}"):
            yield
            done = True
    finally:
        if not done and new_lock:  # a refused command leaves nothing behind: no lock, no empty folders
            with contextlib.suppress(OSError):
                lock.unlink()
            for p in created:
                with contextlib.suppress(OSError):
                    p.rmdir()


def build_parser() -> argparse.ArgumentParser:
    """The ``moir`` parser with every sub-command of :data:`COMMANDS` registered."""
    parser = argparse.ArgumentParser(
        prog="moir", description="Moir Lab: run chapters, build the book, and the jobs behind them."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for target in COMMANDS.values():
        module, func = target.split(":")
        getattr(importlib.import_module(module), func)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``moir`` command; user errors print one line and return 2."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # papermill logs every notebook it opens; keep the console readable
        logging.getLogger("papermill").setLevel(logging.WARNING)
    try:
        with _output_lock(args):
            return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, Busy) as err:  # user errors: one clear line, no trace
        print(f"moir {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the environment (disk full, file-size limit, permissions): one line too
        print(f"moir {args.command}: error: {describe_os_error(err)}", file=sys.stderr)
        return 1
    except Exception as err:
        if type(err).__name__ != "SafetensorError":  # safetensors' wrapper of a failed read or write
            raise
        print(f"moir {args.command}: error: {err}", file=sys.stderr)
        return 1

