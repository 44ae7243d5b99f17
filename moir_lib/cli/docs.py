"""``moir docs [--check]``: regenerate what the documentation takes from the package.

The generated files and how each is made: :mod:`moir_lib.docs`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parser"]


def _cmd_docs(args: argparse.Namespace) -> int:
    from moir_lib import docs

    if args.check:
        stale = docs.stale(args.root)
        for path in stale:
            print(f"out of date: {path} (run: moir docs)", file=sys.stderr)
        return 2 if stale else 0
    for path in docs.regenerate(args.root):
        print(f"wrote {path}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("docs", help="regenerate the READMEs' module maps and the shared run's notebook "
                                    "defaults from the package")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 2 when a generated file is out of date")
    p.add_argument("--root", type=Path, default=None, help="the checkout (default: this package's)")
    p.set_defaults(func=_cmd_docs)
