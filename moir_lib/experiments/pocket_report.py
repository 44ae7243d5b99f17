"""The pocket model's quality report, composed in one place for ``moir pocket report`` and the book.

The report is :func:`moir_lib.pocket.report.measure`'s gates (facts, arithmetic, seeded sampling)
with the locus and editability gates of :mod:`.editability` added, for one organism of the recipe,
saved as ``report.json`` in that organism's cache entry. The book reads a saved report back while its
:func:`~moir_lib.experiments.editability.report_key` (editing profile, code, sizes) still matches and
measures it again otherwise; ``moir pocket report`` always measures.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moir_lib.experiments.gates import N_EDITS

__all__ = ["pocket_report", "pocket_reports", "saved_report"]

log = logging.getLogger(__name__)


def saved_report(variant: str, organism: int = 0) -> Path:
    """Where the report of organism ``organism`` of ``variant`` is saved: ``report.json`` in its model's
    cache entry."""
    from moir_lib.cache import entry_dir
    from moir_lib.pocket.build import cache_key
    from moir_lib.pocket.variants import get_variant

    return entry_dir("pocket", cache_key(get_variant(variant), organism)) / "report.json"


def pocket_report(variant: str = "pocket", *, organism: int = 0, limit: int | None = None,
                  edit_gates: bool = True, n_edits: int = N_EDITS, reuse: bool = False,
                  json_path: Path | None = None, markdown_path: Path | None = None) -> dict[str, Any]:
    """The report of organism ``organism`` of ``variant`` (built on first use), written to ``json_path``
    (default :func:`saved_report`) and, when given, its table to ``markdown_path``.

    ``limit``: items per benchmark (a quick look); ``edit_gates``: add the locus and editability gates
    (``n_edits`` edits); ``reuse``: return the saved report instead when it was measured under the same
    :func:`~moir_lib.experiments.editability.report_key` (a partial one, without the editing gates or
    with a ``limit``, never is)."""
    from moir_lib.experiments import editability
    from moir_lib.locks import writable_file
    from moir_lib.pocket import report as quality

    for what, given in (("the report's JSON path", json_path), ("the report's markdown path", markdown_path)):
        if given is not None:  # before the measurement, not after it
            writable_file(given, what)
    path = Path(json_path) if json_path is not None else saved_report(variant, organism)
    if reuse and edit_gates and path.is_file():
        saved = json.loads(path.read_text())
        key = editability.report_key(variant, limit, n_edits=n_edits, organism=organism)
        if saved.get("report_key") == key:
            quality.write(saved, None, markdown_path)
            return saved
        log.info("the saved report %s was measured under another key: measuring again", path)
    report = quality.measure(variant, limit=limit, organism=organism)
    if edit_gates:
        editability.add_to_report(report, n_edits=n_edits)
    quality.write(report, path, markdown_path)
    return report


def pocket_reports(variant: str = "pocket", organisms: Sequence[int] = (0,), **options: Any
                   ) -> list[dict[str, Any]]:
    """:func:`pocket_report` of each of ``organisms`` in turn (each saved in its own cache entry;
    ``options``: :func:`pocket_report`'s, ``json_path`` and ``markdown_path`` left out): the report of the
    recipe, which passes only when every organism passes. Two organisms with the same weights are refused
    (:func:`~moir_lib.pocket.organisms.same_weights`): those built already before anything is measured,
    the others once measured."""
    from moir_lib.pocket.build import distinct_weights
    from moir_lib.pocket.organisms import same_weights

    if not organisms:
        raise ValueError("no organism to report on: give at least one (0 is the recipe's own model)")
    where = f"the pocket report of organisms {', '.join(map(str, organisms))}"
    distinct_weights(variant, organisms, where)
    reports = [pocket_report(variant, organism=k, **options) for k in organisms]
    same_weights({r["organism"]: {r["metrics"]["weights_sha256"]} for r in reports}, where, variant)
    return reports
