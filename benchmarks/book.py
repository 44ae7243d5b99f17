"""Where the book's time goes: ``moir book`` per phase, with the model cached or from nothing.

Prints measured wall times (never pass/fail): the book's phases (setup, pocket build, the chapters
and the pocket report side by side, the HTML build) and, per chapter and for the report, the
library's own phases (:mod:`moir_lib.timings`: model load, self-generation, C estimation, context
templates, z fitting, keys, solves, CounterFact scoring, Fluency generation, preservation, NLL,
distortion, causal tracing; each phase's own time, chapters running side by side overlap).

    python benchmarks/book.py                    # model cached: a new cache holding only the pocket
                                                 # model, a new run directory, this checkout's code
    python benchmarks/book.py --fresh            # from nothing: a clone of HEAD, `make setup`, an empty
                                                 # cache (the pocket build included)
    python benchmarks/book.py --jobs 1           # chapters one after another (default: one per core)
    python benchmarks/book.py --compare-jobs     # model cached, serial and side by side: both times and
                                                 # whether every results table and headline is identical
    python benchmarks/book.py --organisms 0,1,2  # the book on these pocket organisms (default: those the
                                                 # chapters name); cached: each must be built already

Run it on an idle machine: it is the machine's whole capacity that is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moir_lib.cli.args import organism_list  # noqa: E402  (the checkout's library, on the path above)


def _cached_model_cache(dest: Path, organisms: tuple[int, ...]) -> Path:
    """A new ``MOIR_CACHE`` holding only this machine's built pocket ``organisms`` (linked, not copied)."""
    from moir_lib.pocket import provenance

    (dest / "pocket").mkdir(parents=True)
    for k in organisms:
        built = provenance("pocket", k)
        if built is None:
            raise SystemExit(f"pocket organism {k} is not built here: run `moir pocket build --organism {k}` "
                             f"first (or use --fresh)")
        (dest / "pocket" / built.entry.name).symlink_to(built.entry)
    return dest


def _organisms(given: tuple[int, ...] | None) -> tuple[int, ...]:
    """The organisms the book runs: ``given``, else those its chapters name."""
    from moir_lib.book.pooled_organisms import book_organisms
    from moir_lib.book.stage import toc_chapters

    return book_organisms(ROOT, toc_chapters(ROOT), given)


def _book(checkout: Path, python: str, work: Path, cache: Path, jobs: int | None,
          organisms: tuple[int, ...] | None) -> tuple[float, dict]:
    env = {**os.environ, "MOIR_CACHE": str(cache), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("MOIR_SHARED_RESULTS", None)
    cmd = [python, "-m", "moir_lib.cli", "book", "--run-dir", str(work / "runs"), "--path-output", str(work)]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    if organisms:
        cmd += ["--organisms", ",".join(map(str, organisms))]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    return wall, json.loads((work / "_build" / "timings.json").read_text())


def _short(task: str) -> str:
    """A task's column name: ``06 org 1``, ``05 helper``, ``report 2``, ``04_g_cancell``."""
    name = task.split("/")[-1]
    last = name.rsplit(" ", 1)[-1]
    if name.startswith("pocket report"):
        return "report" + (f" {last}" if "organism" in name else "")
    if " organism " in name:
        return f"{name[:2]} org {last}"
    return f"{name[:2]} {last}" if " " in name else name[:12]


def _table(title: str, wall: float, record: dict, setup: float | None = None) -> None:
    from moir_lib.timings import PHASES

    organisms = record.get("organisms") or [0]
    print(f"\n== {title}: {wall / 60:.1f} min ({wall:.0f} s), {record.get('jobs')} chapter(s) at a time, "
          f"pocket organism{'s' * (len(organisms) > 1)} {', '.join(map(str, organisms))}")
    top = {"setup (.venv)": setup, **record["phases"]}
    for name, seconds in top.items():
        if seconds is not None:
            print(f"   {name:<28} {seconds:8.1f} s")
    tasks = record["tasks"]
    reports = [c for c in tasks if c.startswith("pocket report")]
    columns = [c for c in tasks if c not in reports] + reports
    phases_of = {c: tasks[c].get("timings") or record.get("chapters", {}).get(c.split("/")[-1], {})
                 for c in columns}
    names = [p for p in PHASES if any(p in v for v in phases_of.values())]
    short = [_short(c)[:12] for c in columns]
    print("   " + f"{'phase (own seconds)':<22}" + "".join(f"{s:>13}" for s in short))
    print("   " + f"{'wall':<22}" + "".join(f"{tasks[c]['wall_s']:>13.1f}" for c in columns))
    for p in names:
        cells = [phases_of[c].get(p, {}).get("seconds") for c in columns]
        print("   " + f"{p:<22}" + "".join(f"{x:>13.1f}" if x is not None else f"{'-':>13}" for x in cells))


def _fresh(jobs: int | None, keep: bool, organisms: tuple[int, ...] | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="moir-book-fresh-"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    t0 = time.perf_counter()
    subprocess.run(["make", "setup"], cwd=clone, check=True, stdout=subprocess.DEVNULL)
    setup = time.perf_counter() - t0
    (work / "cache").mkdir()
    python = str(clone / ".venv" / "bin" / "python")
    wall, record = _book(clone, python, work, work / "cache", jobs, organisms)
    _table("make book from nothing (a clone of HEAD, an empty cache)", setup + wall, record, setup)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def _cached(jobs: int | None, keep: bool, organisms: tuple[int, ...] | None) -> Path:
    work = Path(tempfile.mkdtemp(prefix=f"moir-book-cached-j{jobs or 'auto'}-"))
    cache = _cached_model_cache(work / "cache", _organisms(organisms))
    wall, record = _book(ROOT, sys.executable, work, cache, jobs, organisms)
    _table("moir book with the pocket model cached (this checkout)", wall, record)
    if not keep:
        for sub in ("cache", "_build"):
            shutil.rmtree(work / sub, ignore_errors=True)
    return work


def _same_results(a: Path, b: Path) -> None:
    import pandas as pd

    tables = sorted(p.relative_to(a) for p in (a / "runs").rglob("results.parquet"))
    cols = ["key", "n_edits", "group", "metric"]
    for rel in tables:  # the cost rows are wall times: never equal
        x, y = ((t[t["group"] != "cost"]).sort_values(cols).reset_index(drop=True)
                for t in (pd.read_parquet(a / rel), pd.read_parquet(b / rel)))
        if not x[cols].equals(y[cols]):
            print(f"   {rel}: DIFFERENT rows")
            continue
        gap = float((x["value"] - y["value"]).abs().max()) if len(x) else 0.0
        verdict = "bit-identical" if x["value"].equals(y["value"]) else f"largest difference {gap:.1e}"
        print(f"   {rel}: {len(x)} rows, {verdict}")
    for summary in sorted((a / "runs").rglob("summary.json")):
        rel = summary.relative_to(a)
        x, y = (_untimed(json.loads(p.read_text())["headline"]) for p in (summary, b / rel))
        print(f"   {rel}: headline {'identical' if x == y else 'DIFFERENT'} (wall times left out)")


#: headline entries that are wall times or speeds, never equal between two runs
_TIMES = {"seconds", "tokens_per_s"}


def _untimed(value: object) -> object:
    """``value`` without the :data:`_TIMES` entries of its mappings, at any depth."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in _TIMES}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fresh", action="store_true", help="from nothing: clone, make setup, empty cache")
    parser.add_argument("--jobs", type=int, default=None,
                        help="chapters side by side (default: one per core)")
    parser.add_argument("--compare-jobs", action="store_true",
                        help="model cached: jobs 1 and one per core, and whether their results are identical")
    parser.add_argument("--organisms", type=organism_list, default=None, metavar="K,K,...",
                        help="pocket organisms of the book, e.g. 0,1,2 (default: those its chapters name)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary run directories")
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable)", flush=True)
    if args.fresh:
        _fresh(args.jobs, args.keep, args.organisms)
    elif args.compare_jobs:
        serial = _cached(1, True, args.organisms)
        parallel = _cached(None, True, args.organisms)
        print("\n== serial against side by side")
        _same_results(serial, parallel)
        if not args.keep:
            shutil.rmtree(serial, ignore_errors=True)
            shutil.rmtree(parallel, ignore_errors=True)
    else:
        _cached(args.jobs, args.keep, args.organisms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
