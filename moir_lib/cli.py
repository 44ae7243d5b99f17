"""The ``moir`` command: one entry point, one sub-command per job.

Each sub-command lives in the module that owns its concept and registers itself
through an ``add_parser(subparsers)`` function (listed in :data:`COMMANDS`).
Those modules keep heavy imports (torch, transformers, papermill) inside their
handlers so that ``moir --help`` and argument errors answer instantly.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

__all__ = ["main", "COMMANDS", "positive_int"]

#: sub-command name -> "module:function" that adds its parser and sets ``func``.
COMMANDS: dict[str, str] = {
    "run": "moir_lib.runs:add_parser",
    "book": "moir_lib.runs:add_book_parser",
    "nbcheck": "moir_lib.runs:add_nbcheck_parser",
    "grid": "moir_lib.grid:add_parser",
    "generate": "moir_lib.generation:add_parser",
    "cov": "moir_lib.covariance:add_parser",
    "edit": "moir_lib.editing.cli:add_parser",
    "check-reference": "moir_lib.editing.cli:add_check_reference_parser",
    "trace": "moir_lib.tracing_cli:add_parser",
    "eval": "moir_lib.evaluation.cli:add_parser",
    "pocket": "moir_lib.pocket.cli:add_parser",
}


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """``--profile`` (required) and ``--device``: how every model-loading command picks its model."""
    p.add_argument("--profile", required=True,
                   help="model profile (data/profiles/<NAME>.yaml) or a YAML path")
    p.add_argument("--device", default=None, help="e.g. cuda, cpu, auto (default: where the model loads)")


def positive_int(text: str) -> int:
    """An argparse type: a positive integer, with a clear message otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
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
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # papermill logs every notebook it opens; keep the console readable
        logging.getLogger("papermill").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:  # user errors: one clear line, no trace
        print(f"moir {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
