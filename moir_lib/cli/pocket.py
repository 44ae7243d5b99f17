"""``moir pocket build`` and ``moir pocket report`` (heavy imports stay inside the handlers)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

__all__ = ["add_parser"]

log = logging.getLogger(__name__)


def _force_precision(args: argparse.Namespace) -> None:
    """``--precision``: every build/load in this process resolves to it (through the environment)."""
    from moir_lib.pocket.train import PRECISION_ENV, resolve_precision

    if args.precision is not None:
        os.environ[PRECISION_ENV] = resolve_precision(args.precision)


def _build(args: argparse.Namespace) -> int:
    from moir_lib.pocket.build import build

    _force_precision(args)
    print(build(args.variant, force=args.force, organism=args.organism))
    return 0


def _report(args: argparse.Namespace) -> int:
    from moir_lib.experiments.gates import N_EDITS
    from moir_lib.experiments.pocket_report import pocket_report
    from moir_lib.pocket.report import markdown_table

    _force_precision(args)
    report = pocket_report(args.variant, limit=args.limit, edit_gates=args.edit_gates,
                           n_edits=N_EDITS if args.n_edits is None else args.n_edits, json_path=args.json,
                           markdown_path=args.markdown)
    print(markdown_table(report), end="")
    if report["passed"]:
        return 0
    missed = [name for name, gate in report["gates"].items() if not gate["passed"]]
    if not report["enforced"]:
        log.info("gates missed (%s) but not enforced for variant %s", ", ".join(missed), args.variant)
        return 0
    log.error("quality gates missed: %s", ", ".join(missed))
    return 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``moir pocket build|report``."""
    parser = subparsers.add_parser("pocket", help="build and check the embedded pocket model organism")
    sub = parser.add_subparsers(dest="pocket_command", required=True, metavar="ACTION")
    variant = argparse.ArgumentParser(add_help=False)
    variant.add_argument("--variant", default="pocket",
                         help="pocket (the book's model, gated) or micro (tests)")
    variant.add_argument("--precision", choices=("auto", "float32", "bf16"),
                         help="training precision (default: $MOIR_POCKET_PRECISION, else auto: bf16 on CPUs "
                              "with AMX or AVX512-BF16, float32 elsewhere); part of the cache key")

    p = sub.add_parser(
        "build", parents=[variant], help="build (or find in the cache) and print the entry path"
    )
    p.add_argument("--force", action="store_true", help="rebuild even when a valid cache entry exists")
    p.add_argument("--organism", type=int, default=0,
                   help="organism K of the recipe (default 0, the book's model): K >= 1 retrains it with "
                        "another weight initialisation and data order on the same data; cached per organism")
    p.set_defaults(func=_build)

    p = sub.add_parser(
        "report", parents=[variant], help="measure the quality gates; exit 1 when one is missed"
    )
    p.add_argument("--json", type=Path, help="report JSON path (default: <cache entry>/report.json)")
    p.add_argument(
        "--markdown",
        type=Path,
        help="also write the table as markdown here (the book includes book/_generated/pocket_report.md)",
    )
    p.add_argument("--limit", type=int, help="evaluate only the first N items per benchmark (quick look)")
    p.add_argument("--no-edit-gates", dest="edit_gates", action="store_false",
                   help="skip the locus (causal tracing) and editability (MEMIT/AlphaEdit) gates")
    p.add_argument("--n-edits", type=int,
                   help="edits of the editability gate (default: the gate's, experiments.gates.N_EDITS)")
    p.set_defaults(func=_report)
