"""``moir grid GRID.yaml [--executor local|slurm]``: a thin command over :func:`moir_lib.grid.run_grid`
(the pocket organisms the runs need are built first: as a job array of their own with ``slurm``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moir_lib.cli.args import positive_int
from moir_lib.grid import INDEX_NAME, load_grid, run_grid

__all__ = ["add_parser"]


def _cmd_grid(args: argparse.Namespace) -> int:
    grid = load_grid(args.grid)
    out = Path(args.out or Path("runs") / "grids" / grid.name)
    try:
        outcomes = run_grid(grid, out, executor=args.executor, max_parallel=args.max_parallel,
                           slurm_cluster=args.slurm_cluster)
    except RuntimeError as err:  # a pocket build failed: no run was started after it
        print(f"moir grid: {err}", file=sys.stderr)
        return 1
    failed = [r["run_id"] for r in outcomes if r["status"] != "done"]
    print(f"moir grid: {len(grid.runs)} runs, {len(outcomes)} executed now, index at {out / INDEX_NAME}")
    if failed:
        print(f"moir grid: failed: {', '.join(failed)}")
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grid", help="run a parameter grid of chapter notebooks (local or slurm array)")
    p.add_argument("grid", help="grid YAML, e.g. data/grids/smoke.yaml")
    p.add_argument("--executor", choices=("local", "slurm"), default="local")
    p.add_argument("--max-parallel", type=positive_int, default=None, help="workers / array parallelism")
    p.add_argument("--out", help="run directory (default runs/grids/<name>)")
    # submitit's "debug"/"local" clusters, for tests and dry runs without slurm
    p.add_argument("--slurm-cluster", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_grid)
