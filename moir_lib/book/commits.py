"""The commit each page of a book ran at, against the commit the book is built at (``moir book --from``).

A chapter's ``summary.json`` records the commit its run was made at (``git_hash``); a chapter merged from
runs split by organism (:mod:`.merge`) records the runs it read and their commits (:data:`SOURCES`). A
book built from runs made at another commit than its own (typically on a GPU node, from an older
checkout) shows their numbers as that code computed them: :func:`ran_at` lists a chapter's commits,
:func:`foreign` the chapters whose commits are not the book's, :func:`page_note` the warning their pages
open with, and :func:`refuse_foreign` refuses them (``moir book --same-commit``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol


class Executed(Protocol):
    """What this module reads of an executed chapter (:class:`moir_lib.book.stage.Executed`)."""

    chapter: str
    notebook: Path
    summary: dict[str, Any] | None

__all__ = ["SOURCES", "foreign", "merged_sources", "page_note", "ran_at", "refuse_foreign"]

#: what a merged run records beside its notebook: the runs it merged (``notebook``, ``git_hash``)
SOURCES = "merged_from.json"


def merged_sources(run: Path) -> list[dict[str, str]] | None:
    """The runs the merged run in the folder ``run`` read (:data:`SOURCES`), ``None`` when it is no merge."""
    try:
        return json.loads((run / SOURCES).read_text())
    except (OSError, ValueError):
        return None


def ran_at(executed: Executed) -> list[str]:
    """The commits whose code computed ``executed``'s numbers: its run's, and those of the runs it merged."""
    own = (executed.summary or {}).get("git_hash", "unknown")
    merged = [s.get("git_hash", "unknown") for s in merged_sources(executed.notebook.parent) or []]
    return list(dict.fromkeys([own, *merged]))


def foreign(executed: Iterable[Executed], commit: str) -> dict[str, list[str]]:
    """Chapter -> its commits other than ``commit`` (the book's), for each chapter that has any."""
    found = {}
    for e in executed:
        other = [c for c in ran_at(e) if c != commit]
        if other:
            found[e.chapter] = other
    return found


def page_note(commits: list[str], commit: str) -> str:
    """The warning a page computed at ``commits`` opens with, in a book built at ``commit`` (MyST)."""
    shown = ", ".join(f"`{c[:12]}`" for c in commits)
    return (f"```{{warning}}\nThis page ran at commit {shown}, not at this book's commit `{commit[:12]}`: "
            f"its numbers are what that code computed. `moir book --same-commit` refuses such runs.\n```")


def refuse_foreign(executed: Iterable[Executed], commit: str) -> None:
    """``ValueError`` naming every chapter that ran at another commit than ``commit`` and what to do."""
    found = foreign(executed, commit)
    if found:
        listed = "; ".join(f"{Path(c).name} at {', '.join(cs)}" for c, cs in found.items())
        raise ValueError(f"--same-commit: the book is built at commit {commit}, and chapters ran at another: "
                         f"{listed}; rerun them at this commit, or build without --same-commit (their pages "
                         f"and provenance rows are then marked)")
