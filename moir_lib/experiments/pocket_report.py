"""The pocket model's quality report, composed in one place for ``moir pocket report`` and the book.

The report is :func:`moir_lib.pocket.report.measure`'s gates (facts, arithmetic, seeded sampling)
with the locus and editability gates of :mod:`.editability` added, saved as ``report.json`` beside
the model's cache entry. The book reads a saved report back while its
:func:`~moir_lib.experiments.editability.report_key` (editing profile, code, sizes) still matches and
measures it again otherwise; ``moir pocket report`` always measures.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from moir_lib.experiments.gates import N_EDITS

__all__ = ["pocket_report", "saved_report"]

log = logging.getLogger(__name__)


def saved_report(variant: str) -> Path:
    """Where the report of ``variant`` is saved: ``report.json`` in its model's cache entry."""
    from moir_lib.cache import entry_dir
    from moir_lib.pocket.build import cache_key
    from moir_lib.pocket.variants import get_variant

    return entry_dir("pocket", cache_key(get_variant(variant))) / "report.json"


def pocket_report(variant: str = "pocket", *, limit: int | None = None, edit_gates: bool = True,
                  n_edits: int = N_EDITS, reuse: bool = False, json_path: Path | None = None,
                  markdown_path: Path | None = None) -> dict[str, Any]:
    """The report of ``variant`` (built on first use), written to ``json_path`` (default
    :func:`saved_report`) and, when given, its table to ``markdown_path``.

    ``limit``: items per benchmark (a quick look); ``edit_gates``: add the locus and editability gates
    (``n_edits`` edits); ``reuse``: return the saved report instead when it was measured under the same
    :func:`~moir_lib.experiments.editability.report_key` (a partial one, without the editing gates or
    with a ``limit``, never is)."""
    from moir_lib.experiments import editability
    from moir_lib.pocket import report as quality

    path = Path(json_path) if json_path is not None else saved_report(variant)
    if reuse and edit_gates and path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("report_key") == editability.report_key(variant, limit, n_edits=n_edits):
            quality.write(saved, None, markdown_path)
            return saved
        log.info("the saved report %s was measured under another key: measuring again", path)
    report = quality.measure(variant, limit=limit)
    if edit_gates:
        editability.add_to_report(report, n_edits=n_edits)
    quality.write(report, path, markdown_path)
    return report
