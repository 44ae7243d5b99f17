"""The methods page (``book/methods.md``, "How a claim is judged"): what the claim tests achieve, measured.

:func:`calibration_markdown` is :func:`moir_lib.evaluation.calibration.calibration_table` — the coverage of
the 95 % intervals, the rate of false verdicts and the power at the book's sample sizes — as the page
includes it (``_generated/calibration.md``), so that the page types none of the figures. The simulations
take about half a minute; their table is kept in the moir cache (:mod:`moir_lib.cache`), keyed by the
source of every module they run (:func:`engine_sources`), the numpy and scipy versions and the
simulation's settings: a book build reruns them only when the engine changes.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import logging
from pathlib import Path

import pandas as pd

__all__ = ["CALIBRATION", "calibration", "calibration_markdown", "engine_sources"]

log = logging.getLogger(__name__)

#: The engine module whose simulations the page shows, and their settings (repetitions per row,
#: bootstrap replicates per repetition, seed).
CALIBRATION: dict[str, object] = {"module": "moir_lib.evaluation.calibration", "reps": 200,
                                   "n_resamples": 1000, "seed": 0}


def _imported(path: Path) -> set[str]:
    """The ``moir_lib`` modules a source file imports (absolute imports; ``from package import module``
    names the module too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("moir_lib")}
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and node.module.startswith("moir_lib")):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def engine_sources(module: str = str(CALIBRATION["module"])) -> list[Path]:
    """The source files of ``module`` and of every ``moir_lib`` module it imports, directly or not, read
    from their import statements (names that are not modules are skipped)."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ModuleNotFoundError, ValueError):  # an attribute imported from a module
            spec = None
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        seen[name] = Path(spec.origin)
        todo += sorted(_imported(seen[name]) - set(seen))
    return sorted(seen.values())


def _key() -> dict[str, object]:
    import numpy
    import scipy

    digest = hashlib.sha256()
    for path in engine_sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {**CALIBRATION, "engine": digest.hexdigest(), "numpy": numpy.__version__,
            "scipy": scipy.__version__}


def calibration() -> pd.DataFrame:
    """:func:`~moir_lib.evaluation.calibration.calibration_table` at :data:`CALIBRATION`'s settings, read
    from the moir cache while the engine's sources are unchanged (computed and stored otherwise; a
    read-only cache computes it every time, with a warning)."""
    from moir_lib.cache import entry_dir, read_checked, write_checked
    from moir_lib.evaluation.calibration import calibration_table

    key = _key()
    path = entry_dir("calibration", key) / "calibration.json"
    if read_checked(path, key=key) is not None:
        return pd.read_json(io.StringIO(path.read_text()), orient="records")
    table = calibration_table(int(CALIBRATION["reps"]), seed=int(CALIBRATION["seed"]),
                              n_resamples=int(CALIBRATION["n_resamples"]))
    try:
        write_checked(path, lambda tmp: tmp.write_text(table.to_json(orient="records", force_ascii=False)),
                      key=key)
    except OSError as exc:
        log.warning("the calibration table is not cached (%s): it is recomputed on every build", exc)
    return table


def _n(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def calibration_markdown() -> str:
    """The methods page's table of measured calibration (:func:`calibration`), with the Monte-Carlo
    standard error of a coverage share at its repetitions."""
    table = calibration()
    rows = ["| check | scenario | interval | target | measured |", "|---|---|---|---|---|"]
    rows += [f"| {r.check} | {r.scenario} | {r.interval} | {r.target} | {r.measured:.3f} |"
             for r in table.itertuples()]
    reps = int(table["reps"].iloc[0])
    se = (0.95 * 0.05 / reps) ** 0.5
    return ("\n".join(rows) + f"\n\nEach figure is a share of {_n(reps)} simulated repetitions "
            f"({_n(int(CALIBRATION['n_resamples']))} bootstrap replicates each, seed {CALIBRATION['seed']}): "
            f"at 0.95 its Monte-Carlo standard error is {se:.3f}.\n")
