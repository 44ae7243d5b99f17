"""``moir pocket build`` and ``moir pocket report`` (heavy imports stay inside the handlers)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from moir_lib.cli.args import organism_list
from moir_lib.locks import writable_file

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
    from moir_lib.experiments.pocket_report import pocket_reports
    from moir_lib.files import write_json, write_text
    from moir_lib.pocket.report import reports_markdown

    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path is not None:  # before the organisms are measured, not after
            writable_file(path, flag)
    _force_precision(args)
    n_edits = N_EDITS if args.n_edits is None else args.n_edits
    one = len(args.organisms) == 1  # one organism: --json is its report; several: a list of them
    reports = pocket_reports(args.variant, args.organisms, limit=args.limit, edit_gates=args.edit_gates,
                             n_edits=n_edits, json_path=args.json if one else None)
    table = reports_markdown(reports)
    if args.json and not one:
        write_json(args.json, reports, indent=1)
    if args.markdown:
        write_text(args.markdown, table)
    print(table, end="")
    missed = [f"organism {r['organism']}: {name}" for r in reports
              for name, gate in r["gates"].items() if not gate["passed"]]
    if not missed:
        return 0
    if not reports[0]["enforced"]:
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
    p.add_argument("--organisms", type=organism_list, default=(0,), metavar="K,K,...",
                   help="organisms of the recipe to measure, e.g. 0,1,2 (default 0): each is built when "
                        "needed and gated on its own, the table has a column per organism, and the exit "
                        "status is 1 when any organism misses a gate")
    p.add_argument("--json", type=Path,
                   help="report JSON path (default: <cache entry of each organism>/report.json; with "
                        "several organisms, a list of their reports)")
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
