"""The methods page (``book/methods.md``, "How a claim is judged"): what the claim tests achieve, measured.

:func:`calibration_markdown` is :func:`moir_lib.evaluation.calibration.calibration_table` — the coverage of
the 95 % intervals, the rate of false verdicts and the power at the book's design and its measured noise —
as the page includes it (``_generated/calibration.md``), so that the page types none of the figures. The
simulations take a minute or two; their table is kept in the moir cache (:mod:`moir_lib.cache`), keyed by
the source of every module they run (:func:`engine_sources`), the components file they read, the numpy and
scipy versions and the simulation's settings: a book build reruns them only when one changes.

:func:`measured_components` reads a book's variance components off its run directory (every claim's
``components`` in its chapters' ``summary.json``), pooled per kind of claim; ``moir components`` writes
them to the repository's file (:data:`~moir_lib.evaluation.components.COMPONENTS_FILE`), which
:func:`components_markdown` shows and :func:`power_markdown` turns into the power table of the designs.
:func:`hierarchy_markdown` lists every chapter's hierarchy (:func:`hierarchies`), from the chapters' code.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["CALIBRATION", "DESIGNS", "HOLM_FAMILY", "calibration", "calibration_markdown",
           "components_markdown",
           "engine_sources", "hierarchies", "hierarchy_markdown", "measured_components", "power_markdown"]

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

    from moir_lib.evaluation.components import COMPONENTS_FILE

    digest = hashlib.sha256()
    for path in [*engine_sources(), COMPONENTS_FILE]:
        digest.update(path.name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
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
    rows += [f"| {r.check} | {r.scenario} | {r.interval} | {r.target} | "
             f"{'—' if r.measured != r.measured else f'{r.measured:.3f}'} |" for r in table.itertuples()]
    reps = int(table["reps"].max())
    se = (0.95 * 0.05 / reps) ** 0.5
    return ("\n".join(rows) + f"\n\nEach figure is a share of {_n(reps)} simulated repetitions "
            f"({_n(int(CALIBRATION['n_resamples']))} bootstrap replicates each, seed {CALIBRATION['seed']}): "
            f"at 0.95 its Monte-Carlo standard error is {se:.3f}.\n")


# ----------------------------------------------------------------------------- variance components, power


def measured_components(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The variance components of a book's claims (:mod:`moir_lib.evaluation.components`), pooled per kind
    (``S_p``, ``task``, ``edit``, ``total``, ``control``) over every claim that recorded them in a
    ``summary.json`` under ``run_dir`` (a claim two chapters judge counted once), and how they were
    produced (the run directory, its commits and chapters, the claims per kind)."""
    from moir_lib.evaluation.components import Components, pool

    run_dir = Path(run_dir)
    summaries = sorted(run_dir.rglob("summary.json"))
    if not summaries:
        raise FileNotFoundError(f"{run_dir} holds no summary.json: give a book's run directory "
                                "(moir book's --run-dir, or runs/<name>)")
    seen, by_kind, commits, chapters = set(), {}, set(), set()
    names = {f for f in Components.__dataclass_fields__}
    for path in summaries:
        data = json.loads(path.read_text())
        for c in (data.get("headline") or {}).get("claims") or []:
            if c.get("id") in seen or not c.get("components") or not c.get("kind"):
                continue
            seen.add(c.get("id"))
            by_kind.setdefault(c["kind"], []).append(Components(**{k: v for k, v in c["components"].items()
                                                                    if k in names}))
            commits.add(str(data.get("git_hash", "unknown"))[:12])
            chapters.add(str(data.get("chapter", path.parent.name)))
    if not by_kind:
        raise ValueError(f"no claim under {run_dir} recorded its variance components: the run predates "
                         "them; run the book again (moir book)")
    pooled = {k: pool(v) for k, v in sorted(by_kind.items())}
    how = {"provisional": False, "source": str(run_dir), "commits": sorted(commits),
           "chapters": sorted(chapters), "claims": {k: len(v) for k, v in sorted(by_kind.items())},
           "produced_by": f"moir components {run_dir}",
           "method": "method of moments of a nested random-effects model on each claim's per-cell "
                     "differences, the items' parts from the replicates with the items alone redrawn "
                     "(moir_lib.evaluation.components), variances averaged per kind of claim"}
    return pooled, how


#: The designs of the power table (the book's first): organisms × edit samples × C draws × items per task.
DESIGNS: tuple[tuple[int, int, int, int], ...] = (
    (3, 1, 1, 50), (3, 1, 2, 50), (6, 1, 1, 50), (3, 2, 1, 50), (4, 1, 2, 50), (5, 1, 2, 50), (6, 1, 2, 50),
    (3, 1, 4, 50), (8, 1, 1, 50), (9, 1, 1, 50), (10, 1, 1, 50), (12, 1, 1, 50), (8, 1, 2, 50),
    (3, 1, 2, 100), (6, 1, 1, 100), (6, 1, 1, 25), (12, 1, 1, 25))
#: The family a single Holm correction would make of an editing chapter's claims (the power table's last
#: column: the first step of that correction, against the hierarchy's α).
HOLM_FAMILY = 8


def components_markdown() -> str:
    """The repository's variance components (per kind of claim: standard deviations of each part) and how
    they were produced, for the methods page."""
    from moir_lib.evaluation.calibration import BOOK_DESIGN as book
    from moir_lib.evaluation.components import COMPONENTS_FILE, load

    try:
        types, how = load()
    except ValueError as exc:
        return f"*No variance components: {exc}*\n"
    rows = ["| kind of claim | organisms | edit samples | C draws | items, every cell | items, one cell "
            f"| organism mean ({book.samples} × {book.draws} cells) | claims |",
            "|---|---|---|---|---|---|---|---|"]
    for kind, c in types.items():
        sd = c.sd()
        cell = {k: "—" if v is None else f"{v:.3f}" for k, v in sd.items()}
        sample = "with the organisms" if c.sample is None else cell["sample"]
        rows.append(f"| {kind} | {cell['organism']} | {sample} | {cell['draw']} | {cell['shared']} | "
                    f"{cell['cell']} | {c.organism_mean_sd(book.samples, book.draws):.3f} | {c.claims} |")
    status = ("**provisional**: " + how.get("derivation", "") if how.get("provisional")
              else f"measured from `{how.get('source', '?')}` ({', '.join(how.get('commits', []))})")
    return ("\n".join(rows) + f"\n\nStandard deviations of a per-cell difference at "
            f"{next(iter(types.values())).items} items per task, from `{COMPONENTS_FILE.name}`: {status}. "
            f"Produced by `{how.get('produced_by', 'moir components')}`.\n")


def power_markdown(designs: Sequence[tuple[int, int, int, int]] = DESIGNS, kind: str = "S_p") -> str:
    """The power table of the editing chapters' primary claims (both a ``ΔS_p`` of C's, so one row
    serves both): per design of :data:`DESIGNS`, its cells per compared setting (the chapters' compute) and
    the noncentral-t power at α against the minimal effect, at the book's components and at ½ and 2 × their
    standard deviations."""
    from moir_lib.evaluation.components import load
    from moir_lib.evaluation.intervals import ALPHA
    from moir_lib.evaluation.power import MINIMAL_EFFECT, Design

    try:
        c = load()[0][kind]
    except (ValueError, KeyError):
        return f"*No {kind} variance components: the power table needs them (moir components RUN_DIR).*\n"
    rows = ["| organisms × edit samples × C draws × items | cells per setting | power (book's noise) | "
            f"½ × its SD | 2 × its SD | in one Holm family of {HOLM_FAMILY} (its first step) |",
            "|---|---|---|---|---|---|"]
    for k, s, d, n in designs:
        design = Design(k, s, d, n)
        powers = [c.scaled(f ** 2).power(design, MINIMAL_EFFECT, ALPHA) for f in (1.0, 0.5, 2.0)]
        powers.append(c.power(design, MINIMAL_EFFECT, ALPHA / HOLM_FAMILY))
        rows.append(f"| {design.text()} | {design.cells} | " + " | ".join(f"{p:.2f}" for p in powers) + " |")
    return ("\n".join(rows) + f"\n\nPower of a primary claim, tested at α = {ALPHA:g}, against "
            f"ΔS_p = {MINIMAL_EFFECT:g} (noncentral t, `moir_lib.evaluation.power`); the edit samples' "
            "component, where a book did not tell it apart, is held in the organisms' (so more edit samples "
            "are credited only with the items' share: a C draw is used by every edit sample of an "
            "organism).\n")


def hierarchies() -> list[Any]:
    """Every chapter's ``HIERARCHY``, in the book's order."""
    from moir_lib.chapters import diagnosis, editing, generation, nll_jsd

    return [m.HIERARCHY for m in (diagnosis, generation, nll_jsd, editing)]


def hierarchy_markdown() -> str:
    """Every chapter's hierarchy (its ``HIERARCHY``, fixed in its code before any data): the primary claim,
    why, the secondaries and the null control."""
    rows = ["| chapter | primary claim (α = 0.05) | why it is the primary | secondary claims (gatekept, "
            "Holm) |", "|---|---|---|---|"]
    for h in hierarchies():
        extra = f"; null control, alone at α: {h.control}" if h.control else ""
        rows.append(f"| {h.chapter} | {h.primary} | {h.reason} | {h.secondaries}{extra} |")
    return "\n".join(rows) + "\n"
