"""Stage the book: the executed chapters of a run directory beside the book's sources.

:func:`collect_executed` finds each chapter's executed notebook in a run directory (never in a hidden
folder: a run's staging folder, a checkpoint) and refuses one that cannot be shown (damaged, run from
another source, failed or interrupted, without a title: not a chapter of this book, or beside a
``summary.json`` of another run: :func:`read_executed`).

:func:`stage_book` copies the book's sources and those notebooks into one folder for
jupyter-book, with the pages computed at build time: the provenance and claims tables, the pocket
model's report (:func:`generated_pages`) and the pages the chapters give (the chapter list, the pocket
model's gates: :func:`moir_lib.chapters.book_includes`, passed by ``moir book``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from moir_lib.evaluation.intervals import NOT_MEASURED, UNRESOLVED
from moir_lib.results import SUMMARY_NAME

__all__ = ["Executed", "check_executed", "claims_table", "collect_executed", "executed_notebooks",
           "generated_pages", "plain_title", "pocket_report_page", "read_executed", "stage_book",
           "toc_chapters"]

BOOK_FILES = ("_config.yml", "_toc.yml")
BOOK_DIR = "book"
GENERATED = "_generated"
#: the book's own static files (``book/_static``: its CSS), served from the staged ``_static``
STATIC = "_static"


@dataclass(frozen=True)
class Executed:
    """One executed chapter: its notebook copy, its title (math-free) and (when written) its summary."""

    chapter: str
    notebook: Path
    summary: dict[str, Any] | None
    title: str = ""


def toc_chapters(root: str | Path = ".") -> list[str]:
    """Notebook chapters listed in ``_toc.yml`` (e.g. ``notebooks/04_g_cancellation``), in order."""
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text())
    files: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(str(node["file"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return [f for f in files if f.startswith("notebooks/")]


def executed_notebooks(run_dir: Path, chapter: str) -> list[Path]:
    """Every executed copy of ``chapter`` under ``run_dir`` (sorted), none in a hidden folder (a run's
    staging folder, ``.ipynb_checkpoints``)."""
    name = Path(chapter).name + ".ipynb"
    return sorted(p for p in run_dir.rglob(name)
                  if not any(part.startswith(".") for part in p.relative_to(run_dir).parts[:-1]))


def collect_executed(run_dir: str | Path, chapters: list[str], allow_missing: bool = False) -> list[Executed]:
    """Find each chapter's executed notebook under ``run_dir`` (exactly one per chapter), checked by
    :func:`read_executed`.

    A chapter without one is an error, unless ``allow_missing`` (then it is left out).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory not found: {run_dir}")
    found, missing = [], []
    for chapter in chapters:
        name = Path(chapter).name + ".ipynb"
        hits = executed_notebooks(run_dir, chapter)
        if not hits:
            missing.append(name)
            continue
        if len(hits) > 1:
            raise ValueError(f"{len(hits)} executed copies of {name} under {run_dir}: "
                             f"{', '.join(map(str, hits))}; point --from at one run")
        found.append(read_executed(hits[0], chapter))
    if missing and not allow_missing:
        raise FileNotFoundError(f"{run_dir} lacks executed chapters: {', '.join(missing)} "
                                f"(--allow-missing builds the book without them)")
    return found


def read_executed(notebook: Path, chapter: str) -> Executed:
    """The executed ``notebook`` of ``chapter`` with its ``summary.json`` (when one lies beside it), checked
    by :func:`check_executed`; ``ValueError`` naming both when the summary is damaged or belongs to another
    run: its parameters differ from those the notebook ran with, or it was written before the notebook's
    run started (a run interrupted between the two, or files copied together by hand)."""
    title = check_executed(notebook, chapter)
    summary_path = notebook.parent / SUMMARY_NAME
    try:
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    except ValueError as exc:
        raise ValueError(f"{summary_path} is damaged ({exc}): rerun {chapter}") from None
    if summary is not None:
        _check_pair(notebook, summary_path, summary, chapter)
    return Executed(chapter, notebook, summary, title)


def _check_pair(notebook: Path, summary_path: Path, summary: dict[str, Any], chapter: str) -> None:
    """Refuse a ``summary.json`` that is not the record of the run of ``notebook``."""
    import datetime as dt

    import nbformat

    from moir_lib.runs import executed_parameters

    ran = executed_parameters(notebook)
    recorded = summary.get("parameters") or {}
    for name in sorted(set(recorded) & set(ran)):
        if ran[name] is not None and _canonical(ran[name]) != _canonical(recorded[name]):
            raise ValueError(f"{summary_path} does not belong to the executed notebook {notebook}: its "
                             f"parameter {name!r} is {recorded[name]!r}, the notebook ran with "
                             f"{ran[name]!r}; rerun {chapter} (moir run {chapter}.ipynb --out "
                             f"{notebook.parent})")
    meta = nbformat.read(str(notebook), as_version=4).metadata.get("papermill") or {}
    try:
        started = dt.datetime.fromisoformat(meta["start_time"])
        created = dt.datetime.fromisoformat(summary["created"])
    except (KeyError, TypeError, ValueError):
        return  # a run without both times (written by hand, or before papermill recorded them)
    if created.microsecond == 0:  # a summary kept to the second: compare at its precision
        started = started.replace(microsecond=0)
    if created.tzinfo is not None and started.tzinfo is not None and created < started:
        raise ValueError(f"{summary_path} does not belong to the executed notebook {notebook}: it was "
                         f"written at {summary['created']}, before the notebook's run started "
                         f"({meta['start_time']}), so it is an earlier run's; rerun {chapter} (moir run "
                         f"{chapter}.ipynb --out {notebook.parent})")


def _canonical(value: Any) -> str:
    """``value`` as canonical JSON (tuples as lists, keys sorted), to compare a parameter across files."""
    return json.dumps(value, sort_keys=True, default=str)


def check_executed(notebook: Path, chapter: str) -> str:
    """The title of the executed ``notebook`` of ``chapter``; ``ValueError`` naming it when it cannot be
    read (truncated), was executed from another chapter's source (papermill records the input), failed
    (a cell raised), did not run to its end (a code cell never executed: an interrupted run) or has no
    title (the first heading a chapter opens with: a notebook without one is
    not a chapter of this book, and the book could not link to it): the book shows only chapters that
    ran to their end."""
    import nbformat

    try:
        nb = nbformat.read(str(notebook), as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable notebook is damage
        raise ValueError(f"executed notebook {notebook} is damaged ({type(exc).__name__}): rerun "
                         f"{chapter} (moir run {chapter}.ipynb)") from None
    source = (nb.metadata.get("papermill") or {}).get("input_path")
    if source and Path(source).stem != Path(chapter).name:
        raise ValueError(f"executed notebook {notebook} was run from {source}, not {chapter}: point --from "
                         f"at a run of this book's chapters")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    failed = (nb.metadata.get("papermill") or {}).get("exception") or any(
        o.get("output_type") == "error" for o in outputs)
    if failed:
        raise ValueError(f"executed notebook {notebook} holds a failed run (a cell raised): rerun {chapter} "
                         f"before building the book from it")
    title = _title(nb)
    if title is None:
        summary = (notebook.parent / SUMMARY_NAME).is_file()
        lacks = "" if summary else f", and no {SUMMARY_NAME} lies beside it"
        raise ValueError(f"executed notebook {notebook} has no title (no markdown cell opens with a '# ' "
                         f"heading){lacks}: it is not a run of {chapter}; run it (moir run {chapter}.ipynb) "
                         f"or point --from at a run of this book's chapters")
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    skipped = [i for i, c in enumerate(code, 1) if c.get("execution_count") is None]
    if skipped:
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise ValueError(f"executed notebook {notebook} did not run to its end: its code cell {skipped[0]} "
                         f"of {len(code)}{more} never executed, so the run was interrupted; rerun {chapter} "
                         f"(moir run {chapter}.ipynb) before building the book from it")
    return plain_title(title)


_HEADING = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.M)


def _title(nb: Any) -> str | None:
    """The first level-1 heading of ``nb``'s markdown cells, as written."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            hit = _HEADING.search(cell.source)
            if hit:
                return hit.group(1)
    return None


_MATH = re.compile(r"\$([^$]+)\$")
_TEXT_COMMAND = re.compile(r"\\(?:text|textrm|mathrm|mathit|mathbf|mathsf|mathcal|operatorname)\s*"
                           r"\{([^{}]*)\}")
_COMMAND = re.compile(r"\\([A-Za-z]+)")


def plain_title(title: str) -> str:
    """``title`` with its ``$...$`` math as plain text (``$C_\\text{Moir}$`` -> ``C_Moir``), for a link's
    text, where no math is typeset."""

    def plain(math: re.Match[str]) -> str:
        text = _TEXT_COMMAND.sub(r"\1", math.group(1))
        return _COMMAND.sub(r"\1", text).replace("{", "").replace("}", "").strip()

    return _MATH.sub(plain, title)


def _drop_chapters(node: Any, keep: set[str]) -> Any:
    """``_toc.yml`` without the notebook entries not in ``keep`` (and parts left empty)."""
    if isinstance(node, list):
        items = [_drop_chapters(n, keep) for n in node]
        return [n for n in items if n is not None]
    if isinstance(node, dict):
        if str(node.get("file", "")).startswith("notebooks/") and node["file"] not in keep:
            return None
        out = {k: _drop_chapters(v, keep) for k, v in node.items()}
        if "chapters" in node and not out["chapters"] and "file" not in node:
            return None
        return out
    return node


def _shown(path: Path, root: Path) -> str:
    """``path`` as the book shows it: relative to the repository when inside it."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _provenance_table(root: Path, run_dir: Path, executed: list[Executed], chapters: list[str],
                      commit: str) -> str:
    """The chapters' provenance (Markdown): each one's profile, commit (and those of the runs it merged),
    when it ran; a chapter that ran at another commit than the book's ``commit`` is marked."""
    from moir_lib.book.commits import foreign, merged_sources

    others = foreign(executed, commit)
    rows = ["| chapter | profile | commit | run at | summary |", "|---|---|---|---|---|"]
    for chapter in sorted(set(chapters) - {e.chapter for e in executed}):
        rows.append(f"| {Path(chapter).name} | — | — | not run | left out of this build |")
    for e in executed:
        s = e.summary or {}
        profile = (s.get("parameters") or {}).get("profile", "—")
        shown = f"`{s.get('git_hash', 'unknown')[:12]}`"
        sources = merged_sources(e.notebook.parent)
        if sources:
            shown += " (merged from runs at " + ", ".join(dict.fromkeys(
                f"`{r.get('git_hash', 'unknown')[:12]}`" for r in sources)) + ")"
        if e.chapter in others:
            shown += " — **not this book's commit**"
        rows.append(f"| {Path(e.chapter).name} | {profile} | {shown} | {s.get('created', '—')} "
                    f"| {'yes' if s else 'missing'} |")
    note = ("; the chapters marked ran at another commit, so their numbers are what that code computed"
            if others else "")
    return (f"Numbers in this build come from the run directory `{_shown(run_dir, root)}`; the book is built "
            f"at commit `{commit[:12]}`{note}:\n\n" + "\n".join(rows) + "\n")


def claims_table(executed: list[Executed]) -> str:
    """The book's claims table (Markdown): every claim a chapter judged (its ``summary.json`` headline's
    ``claims``: :func:`moir_lib.chapters.verdicts.claims_json`), one row per measurement (two chapters
    judging one measurement give its ``id`` twice: one row, both chapters), each as its chapter's hierarchy
    judged it: the value with its marginal 95 % interval (named), the marginal p-value, its place in the
    hierarchy with the adjusted p-value and the verdict about the recipe (each chapter's where they
    differ), the verdict about these organisms (each one resolved on its own: intersection-union), the
    power of its test against its minimal effect, what it generalises over and links to the chapters, named
    by their math-free titles (:func:`plain_title`). The null controls follow apart, each with what its
    verdict must read. Generated from the runs, never typed."""
    uses: dict[str, list[tuple[Executed, dict[str, Any]]]] = {}
    for e in executed:
        for i, c in enumerate(((e.summary or {}).get("headline") or {}).get("claims") or []):
            uses.setdefault(c.get("id") or f"{e.chapter}#{i}", []).append((e, c))
    if not uses:
        return "*No chapter of this build judged a claim.*\n"
    head = ("| claim of the paper | pocket measurement: value [marginal 95 % interval] (which interval) | p "
            "| about the recipe: place in the hierarchy, adjusted p, verdict | about these organisms (each "
            "resolves: intersection-union) | power | generalises over | chapter |")
    rows = [head, "|---|---|---|---|---|---|---|---|"]
    controls = [head.replace("| power |", "|"), "|---|---|---|---|---|---|---|"]
    for group in uses.values():
        c = group[0][1]
        links = ", ".join(dict.fromkeys(_doc_link(e) for e, _ in group))
        cells = [c["claim"], _measured(c), _p(c.get("p")), _recipe(group), _organisms(c)]
        if c.get("control"):
            controls.append("| " + " | ".join([*cells, _generalises(c), links]) + " |")
        else:
            rows.append("| " + " | ".join([*cells, _power(c), _generalises(c), links]) + " |")
    text = "\n".join(rows) + "\n"
    if len(controls) > 2:
        text += ("\n**Null controls**, each judged alone at α = 0.05 and apart from the claims (nothing "
                 "differs but the draws of one C, so each must read *not resolved*):\n\n"
                 + "\n".join(controls) + "\n")
    return (text + "\nEach chapter's claims form a hierarchy fixed before the data: its primary claim tested "
            "at α = 0.05, the others only once it resolves, Holm-corrected among them (the adjusted p-value "
            "decides the word); the power is that of the claim's test at its level against the minimal "
            "effect of its kind. How the intervals are computed and which test decides each claim: "
            "{doc}`/book/methods`.\n")


def _p(x: Any) -> str:
    return "—" if x is None else f"{x:.3g}"


def _measured(c: dict[str, Any]) -> str:
    """``S_p Moir − Wiki (…): +0.022 [−0.073, +0.118] (studentized ∪ t on 3 organism means (2 df))``, or what
    was not measured and why."""
    value, lo, hi = c.get("value"), c.get("lo"), c.get("hi")
    if value is None or c.get("measured_ok") is False:
        why = str(c.get("note") or "").removeprefix("not measured: ")
        return f"{c['measured']}: **not measured**" + (f" ({why})" if why else "")
    if lo is None or hi is None:
        return f"{c['measured']}: {value:+.3f}"
    text = f"{c['measured']}: {value:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    if c.get("interval"):
        text += f" ({c['interval']})"
    if c.get("degenerate"):
        text += f"; {c['degenerate']} of {c.get('cells')} cells left out (both arms' harmonic mean 0)"
    moved = [m for m in c.get("sensitivity") or [] if m.get("value") is not None]
    if moved:
        sign = (value > 0) - (value < 0)
        flips = any((m["value"] > 0) - (m["value"] < 0) != sign for m in moved)
        text += ("; " + "; ".join(f"{m['which']}: {m['value']:+.3f} [{m['lo']:+.3f}, {m['hi']:+.3f}]"
                                  for m in moved)
                 + (" — **the selection decides its sign**" if flips else ""))
    return text


def _recipe(group: list[tuple[Executed, dict[str, Any]]]) -> str:
    """The verdict of one measurement at its place in each chapter's hierarchy: the same in every chapter,
    or each chapter's; the gate, what would resolve it and, for the null control, what it must read."""
    texts = {}
    for e, c in group:
        place = {"primary": "primary", "secondary": "secondary" + ("" if c.get("tested", True) else
                                                                   ", not tested (primary unresolved)"),
                 "control": "alone"}.get(c.get("role"), "")
        about = {"model": " (about this model)", "sample": " (about this sample)"}.get(c.get("scope"), "")
        text = (f"{place}, adj. p {_p(c.get('p_adjusted'))}: {c['verdict']}{about}" if place
                else f"{c['verdict']}{about}")
        text += "" if c.get("gate_ok", True) else " (edits miss the gate)"
        if c.get("n_to_resolve"):
            text += f"; ≈{c['n_to_resolve']} items would resolve it"
        elif c.get("more_units"):
            text += f"; ≈{c['more_units']} would resolve it"
        texts[Path(e.chapter).name] = text
    verdict = (next(iter(texts.values())) if len(set(texts.values())) == 1
               else "; ".join(f"{t} ({chapter})" for chapter, t in texts.items()))
    if not group[0][1].get("control"):
        return verdict
    if all(c["verdict"] == UNRESOLVED for _, c in group):
        return f"{verdict} (null control: as it must read)"
    if all(c["verdict"] in (UNRESOLVED, NOT_MEASURED) for _, c in group):
        return f"{verdict} (null control: nothing to read)"
    return (f"{verdict} — **the null control must read *{UNRESOLVED}***: two draws of one C are called "
            "different, so the intervals of such comparisons are too narrow")


def _organisms(c: dict[str, Any]) -> str:
    """The verdict about these organisms with its adjusted intersection-union p-value (several organisms)."""
    k = int(c.get("organisms") or 0)
    if k < 2 or "verdict_organisms" not in c:
        return "—"
    return (f"{c['verdict_organisms']} (adj. p {_p(c.get('p_organisms'))}; {c.get('agreeing', 0)} of {k} "
            "resolve alone at α)")


def _power(c: dict[str, Any]) -> str:
    if c.get("power") is None:
        return "—"
    against = ("no loss" if c.get("kind") == "edit" else f"Δ = {c['minimal_effect']:g}"
               if c.get("minimal_effect") is not None else "")
    return f"{c['power']:.2f}" + (f" ({against})" if against else "")


def _generalises(c: dict[str, Any]) -> str:
    """``300 items · 3 edit samples · 2 C draws · 1 organism (about this model)``, or with several
    organisms how many agree in sign and are resolved on their own; a claim about one model's samples
    (chapters 02 and 03: ``scope`` ``"sample"``) ``n = 400 · 1 organism (about this model)``."""
    g = c.get("generalises")
    if not g:
        one_model = c.get("scope") == "sample" and c.get("n")
        return f"n = {c['n']} · 1 organism (about this model)" if one_model else "—"
    k = int(g.get("organisms", 1))
    models = ("1 organism (about this model)" if k <= 1
              else f"{k} organisms ({c.get('agreeing', 0)} of {k} agree)")
    return " · ".join([f"{g['items']} items", f"{g['samples']} edit sample{'s' * (g['samples'] != 1)}",
                       f"{g['draws']} C draw{'s' * (g['draws'] != 1)}", models])


def _doc_link(e: Executed) -> str:
    """A ``{doc}`` link to ``e``'s page showing its plain title (the page's own title may hold math)."""
    if not e.title:
        return f"{{doc}}`/{e.chapter}`"
    text = e.title.replace("`", "'").replace("|", "\\|").replace("<", "‹")
    return f"{{doc}}`{text} </{e.chapter}>`"


def stage_book(root: Path, stage: Path, run_dir: Path, executed: list[Executed],
               includes: Mapping[str, str] | None = None,
               pocket: tuple[str, tuple[int, ...]] | None = None, commit: str | None = None) -> None:
    """Copy book sources + executed notebooks into ``stage`` and write the generated includes: the
    provenance and claims tables, :func:`generated_pages` and ``includes`` (name -> markdown).
    ``pocket``: the pocket variant the chapters ran on and its organisms, listed in the provenance table
    (:func:`moir_lib.book.pooled_organisms.provenance_table`) and, for the ``pocket`` variant, in its report.
    ``commit``: the book's (default: ``root``'s checkout); a chapter that ran at another opens with a
    warning saying so (:func:`moir_lib.book.commits.page_note`), and its provenance row is marked."""
    from moir_lib.book.commits import foreign, page_note
    from moir_lib.book.pooled_organisms import VARIANT, provenance_table, recorded_weights
    from moir_lib.results import git_hash

    commit = commit or git_hash(root)
    others = foreign(executed, commit)

    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for name in BOOK_FILES:
        shutil.copy2(root / name, stage / name)
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    (stage / "_toc.yml").write_text(yaml.safe_dump(_drop_chapters(toc, {e.chapter for e in executed}),
                                                   sort_keys=False))
    shutil.copytree(root / BOOK_DIR, stage / BOOK_DIR, ignore=shutil.ignore_patterns(GENERATED, STATIC))
    if (root / BOOK_DIR / STATIC).is_dir():
        shutil.copytree(root / BOOK_DIR / STATIC, stage / STATIC)
    (stage / "notebooks").mkdir()
    for e in executed:
        note = page_note(others[e.chapter], commit) if e.chapter in others else None
        _stage_notebook(e.notebook, stage / f"{e.chapter}.ipynb", root, root / Path(e.chapter).parent, note)
    _vendor_mathjax(stage / STATIC / "mathjax")
    generated = stage / BOOK_DIR / GENERATED
    generated.mkdir()
    provenance = _provenance_table(root, run_dir, executed, toc_chapters(root), commit)
    if pocket is not None:
        recorded = recorded_weights(e.summary for e in executed)
        provenance += "\n" + provenance_table(pocket[1], pocket[0], recorded)
    (generated / "provenance.md").write_text(provenance)
    (generated / "claims.md").write_text(claims_table(executed))
    organisms = pocket[1] if pocket is not None and pocket[0] == VARIANT else (0,)
    for name, text in {**generated_pages(organisms), **(includes or {})}.items():
        (generated / name).write_text(text)


def _stage_notebook(src: Path, dest: Path, root: Path, cwd: Path, note: str | None = None) -> None:
    """Copy the executed notebook ``src`` to ``dest``, the paths inside the repository ``root`` among its
    injected parameters (papermill's ``injected-parameters`` cell: ``out_dir`` and any path given to the
    run) written relative to ``cwd``, the chapter's folder, where its kernel runs (as its defaults are),
    rather than where the repository happened to live on the machine that built it; ``note`` (markdown),
    when given, follows the cell that holds the page's title."""
    import nbformat

    nb = nbformat.read(str(src), as_version=4)
    inside = re.compile(r"""(["'])(""" + re.escape(str(root)) + r"""(?:/[^"'\n]*)?)\1""")

    def relative(match: re.Match[str]) -> str:
        return match.group(1) + os.path.relpath(match.group(2), cwd) + match.group(1)

    for cell in nb.cells:
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = inside.sub(relative, cell.source)
    if note is not None:
        titled = next((i for i, c in enumerate(nb.cells)
                       if c.cell_type == "markdown" and _HEADING.search(c.source)), -1)
        nb.cells.insert(titled + 1, nbformat.v4.new_markdown_cell(note))
    nbformat.write(nb, str(dest))


def _vendor_mathjax(dest: Path) -> None:
    """Copy MathJax 3 (CommonHTML + its fonts) from the ``django-static-mathjax`` wheel so the
    book typesets equations without internet; ``_config.yml`` points ``mathjax_path`` here."""
    import mathjax

    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    dest.mkdir(parents=True)
    shutil.copy2(es5 / "tex-chtml.js", dest / "tex-chtml.js")
    fonts = Path("output") / "chtml" / "fonts" / "woff-v2"
    shutil.copytree(es5 / fonts, dest / fonts)


def generated_pages(organisms: tuple[int, ...] = (0,)) -> dict[str, str]:
    """Markdown includes the book build computes itself (name -> text): ``pocket_report.md``
    (:func:`pocket_report_page` of the pocket ``organisms``). The chapters' pages
    (:func:`moir_lib.chapters.book_includes`) come from the command line, which alone imports the
    chapters."""
    return {"pocket_report.md": pocket_report_page("pocket", organisms)}


def pocket_report_page(variant: str, organisms: tuple[int, ...] = (0,)) -> str:
    """The quality report of each of ``organisms`` of the pocket model as the book shows it (one column
    per organism: :func:`moir_lib.pocket.report.reports_markdown` of
    :func:`~moir_lib.experiments.pocket_report.pocket_report`, read back while its key matches): its
    editability gate reads the editing points the chapters computed (the machine-wide results cache). An
    organism not built on this machine (a book built elsewhere from executed runs with ``--from``) says
    so instead of being trained."""
    from moir_lib.experiments.pocket_report import pocket_report
    from moir_lib.pocket.build import provenance
    from moir_lib.pocket.report import reports_markdown

    built = [k for k in organisms if provenance(variant, k) is not None]
    missing = [k for k in organisms if k not in built]
    option = "" if missing == [0] else f" --organisms {','.join(map(str, missing))}"
    note = (f"*The `{variant}` pocket model{_organisms_named(missing)} is not built on the machine that "
            f"built this book: run `moir pocket report --variant {variant}{option}` to build and measure "
            f"it.*\n")
    if not built:
        return note
    table = reports_markdown([pocket_report(variant, organism=k, reuse=True) for k in built])
    return table + ("\n" + note if missing else "")


def _organisms_named(organisms: list[int]) -> str:
    """`` (organism 1)``, `` (organisms 1, 2)``; nothing for organism 0 alone, the model of old."""
    if organisms == [0]:
        return ""
    return f" (organism{'s' if len(organisms) > 1 else ''} {', '.join(map(str, organisms))})"
