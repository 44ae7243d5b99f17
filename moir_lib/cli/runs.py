"""``moir run``, ``moir nbcheck`` and ``moir book``: thin commands over :mod:`moir_lib.runs` and
:mod:`moir_lib.book`.

``moir run NOTEBOOK [-p NAME VALUE]... [--profile NAME] [--out DIR]`` executes one chapter into a
run directory (``runs/<chapter>/<timestamp>`` unless ``--out``) with
:func:`~moir_lib.runs.run_notebook`, after :func:`~moir_lib.runs.resolve_parameters` checks every
name against the notebook's ``parameters`` cell. ``moir nbcheck`` checks (or strips) committed
notebooks; ``moir book [--from RUN_DIR] [--organisms K,K,...]`` runs :func:`~moir_lib.book.build_book`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from moir_lib.cli.args import organism_list, positive_int
from moir_lib.results import SUMMARY_NAME
from moir_lib.runs import (
    ChapterFailed,
    notebook_problems,
    resolve_parameters,
    run_notebook,
    strip_outputs,
)

__all__ = ["add_book_parser", "add_nbcheck_parser", "add_parser"]


def _default_run_dir(notebook: Path) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / notebook.stem / stamp


def _cmd_run(args: argparse.Namespace) -> int:
    notebook = Path(args.notebook)
    params = resolve_parameters(notebook, args.param or [], profile=args.profile)
    out = Path(args.out) if args.out else _default_run_dir(notebook)
    try:
        run_notebook(notebook, out, params, progress=not args.quiet)
    except ChapterFailed as err:
        print(f"moir run: {err}", file=sys.stderr)
        return 1
    summary = out / SUMMARY_NAME
    if summary.is_file():
        print(f"moir run: done; summary at {summary}")
        print(json.dumps(json.loads(summary.read_text())["headline"], indent=2))
    else:
        print(f"moir run: done, but {notebook.name} wrote no {SUMMARY_NAME} in {out}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="execute a chapter notebook with papermill into a run directory",
                       description="Execute a chapter notebook with papermill. Parameter names are checked "
                                   "against its parameters cell before anything runs.")
    p.add_argument("notebook", help="e.g. notebooks/04_g_cancellation.ipynb")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="override a parameter of the notebook's parameters cell (repeatable)")
    p.add_argument("--profile", help="model profile (data/profiles/<NAME>.yaml); sets `profile`")
    p.add_argument("--out", help="run directory (default runs/<chapter>/<timestamp>)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-cell progress bar")
    p.set_defaults(func=_cmd_run)


def _cmd_nbcheck(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.notebooks:
        if args.strip:
            strip_outputs(path)
        for problem in notebook_problems(path):
            print(f"{path}: {problem}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


def add_nbcheck_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nbcheck", help="check committed notebooks are output-free with a parameters cell")
    p.add_argument("notebooks", nargs="+")
    p.add_argument("--strip", action="store_true", help="strip outputs and execution counts first")
    p.set_defaults(func=_cmd_nbcheck)


def _cmd_book(args: argparse.Namespace) -> int:
    from moir_lib.book import BookSettings, build_book
    from moir_lib.chapters import book_includes

    settings = BookSettings(execute=args.from_dir is None, allow_missing=args.allow_missing, jobs=args.jobs,
                            includes=book_includes(), organisms=args.organisms, same_commit=args.same_commit)
    try:
        html = build_book(".", run_dir=args.from_dir or args.run_dir, path_output=args.path_output,
                          settings=settings)
    except (ChapterFailed, RuntimeError) as err:
        print(f"moir book: {err}", file=sys.stderr)
        return 1
    print(f"moir book: open {html / 'index.html'}")
    return 0


def add_book_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("book", help="execute every chapter (or take executed runs) and build the HTML book")
    p.add_argument("--from", dest="from_dir", metavar="RUN_DIR",
                   help="build from the executed notebooks of this run directory, without executing them; "
                        "a chapter run once per pocket organism (a grid's array tasks) is merged into one "
                        "run over them all, which reads their work back")
    p.add_argument("--run-dir", default=None, help="where chapters are executed (default runs/book)")
    p.add_argument("--path-output", default=None, help="the book goes to PATH/_build/html (default .)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="chapters executed side by side, each on one torch thread (default: one per core; "
                        "results equal a serial run bit for bit); a worker with nothing left to do helps "
                        "compute the editing grid of a chapter still running. Organisms not yet built are "
                        "built first, min(N, cores // training threads) side by side, each in a process of "
                        "its own on the recipe's fixed threads (the weights of a lone build)")
    p.add_argument("--organisms", type=organism_list, default=None, metavar="K,K,...",
                   help="pocket organisms every chapter that takes them runs on, e.g. 0,1,2 (0: the quick "
                        "one-model book; default: every organism the chapters' defaults name); each is built "
                        "when needed and gets its column in the pocket report. Not with --from: that book "
                        "shows the organisms its runs hold, a chapter run once per organism merged first")
    p.add_argument("--allow-missing", action="store_true",
                   help="with --from: leave out chapters the run directory lacks (listed in the intro)")
    p.add_argument("--same-commit", action="store_true",
                   help="with --from: refuse chapters that ran at another commit than this checkout's "
                        "(default: build them, their pages and provenance rows marked with their commit)")
    p.set_defaults(func=_cmd_book)
