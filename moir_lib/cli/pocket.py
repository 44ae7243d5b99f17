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
    print(build(args.variant, force=args.force))
    return 0


def _report(args: argparse.Namespace) -> int:
    from moir_lib.pocket.report import markdown_table, measure, write

    _force_precision(args)
    report = measure(args.variant, limit=args.limit)
    if args.edit_gates:
        from moir_lib.experiments.editability import add_to_report

        add_to_report(report, n_edits=args.n_edits)
    print(markdown_table(report), end="")
    write(report, args.json or Path(report["entry"]) / "report.json", args.markdown)
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
    p.add_argument("--n-edits", type=int, default=100, help="edits of the editability gate (default 100)")
    p.set_defaults(func=_report)
