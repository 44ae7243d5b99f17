"""The book's pocket organisms: which a book runs, how its chapters get them, their builds and provenance.

A book runs every chapter that takes an ``organisms`` parameter on one list of organisms of the pocket
recipe (:mod:`moir_lib.pocket.organisms`): the list given (``moir book --organisms 0,1,2``), else every
organism the chapters' own defaults name (:func:`book_organisms`). :func:`build_organisms` builds them,
side by side where the cores allow one build per :attr:`~moir_lib.pocket.variants.TrainSpec.threads`
cores, at most ``--jobs`` at once (a build trains on that fixed thread count, so the model is the one a
lone build gives: :mod:`moir_lib.pocket.builds`);
:func:`provenance_table` lists what each one is for the book's provenance page: its weights, the
training precision of this machine and its build time. A book built from executed chapters names the
organisms they ran (:func:`ran`). Two organisms with the same weights (as built here, or as the chapters
record them) are refused wherever the book pools them (:func:`moir_lib.pocket.organisms.same_weights`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from moir_lib.runs import ORGANISMS as PARAMETER  # the chapters' parameter naming the organisms they run on

__all__ = ["PARAMETER", "VARIANT", "book_organisms", "build_organisms", "chapter_parameters", "declared",
           "executed_organisms", "pocket_variant", "provenance_table", "ran", "recorded_weights", "splits"]


#: the chapters' parameter naming run directories whose work they read back
REUSE = "reuse"
#: the pocket variant of the book's default profile (``pocket``)
VARIANT = "pocket"


def _checked(value: Any, where: str) -> tuple[int, ...]:
    """``value`` as organisms (:func:`moir_lib.pocket.organisms.check_list`), the error naming ``where``."""
    from moir_lib.pocket.organisms import check_list

    return check_list(value, f"{where}: organisms")


def declared(notebook: str | Path) -> tuple[int, ...] | None:
    """The default organisms of ``notebook``'s parameters cell, ``None`` when it takes none."""
    from moir_lib.runs import notebook_parameters

    params = notebook_parameters(notebook)
    if PARAMETER not in params:
        return None
    return _checked(ast.literal_eval(params[PARAMETER]["default"]), str(notebook))


def splits(notebook: str | Path) -> bool:
    """Whether a run of ``notebook`` per organism can be merged into one over them all without doing the
    work again: it takes ``organisms`` and reads other runs back (``reuse``)."""
    from moir_lib.runs import notebook_parameters

    return {PARAMETER, REUSE} <= set(notebook_parameters(notebook))


def chapter_parameters(notebook: str | Path, organisms: Sequence[int]) -> dict[str, Any]:
    """The parameters that run ``notebook`` on ``organisms``: ``{"organisms": [...]}``, or none when the
    chapter takes no organisms (it runs on no pocket model, or on its profile's alone)."""
    return {PARAMETER: list(organisms)} if declared(notebook) is not None else {}


def book_organisms(root: str | Path, chapters: Iterable[str], given: Sequence[int] | None = None
                   ) -> tuple[int, ...]:
    """The organisms a book runs: ``given`` (checked), else every organism the ``chapters``' defaults
    name (sorted; organism 0 when no chapter takes organisms)."""
    if given is not None:
        return _checked(list(given), "the book's organisms")
    found = set()
    for chapter in chapters:
        found |= set(declared(Path(root) / f"{chapter}.ipynb") or ())
    return tuple(sorted(found)) or (0,)


def _run_parameter(notebook: str | Path, name: str) -> Any:
    """Parameter ``name`` of the executed ``notebook`` (:func:`moir_lib.runs.executed_parameters`); ``None``
    when it has no such parameter."""
    from moir_lib.runs import executed_parameters

    return executed_parameters(notebook).get(name)


def ran(notebook: str | Path) -> tuple[int, ...] | None:
    """The organisms an executed ``notebook`` ran on, ``None`` when it takes none."""
    value = _run_parameter(notebook, PARAMETER)
    return None if value is None else _checked(value, str(notebook))


def pocket_variant(notebook: str | Path) -> str | None:
    """The pocket variant the executed ``notebook`` ran on (its profile's model), ``None`` when it ran on
    another model, on none, or on a profile this machine does not have."""
    from moir_lib.models import POCKET_SPECS
    from moir_lib.profiles import load_profile

    profile = _run_parameter(notebook, "profile")
    if not isinstance(profile, str):
        return None
    try:
        return POCKET_SPECS.get(load_profile(profile).model)
    except (OSError, ValueError):
        return None


def executed_organisms(notebooks: Iterable[str | Path]) -> tuple[str, tuple[int, ...]] | None:
    """``(variant, organisms)``: the pocket variant the executed ``notebooks`` ran on (the first found)
    and every organism they ran it on; ``None`` when none ran on a pocket model."""
    variant, organisms = None, set()
    for notebook in notebooks:
        found = pocket_variant(notebook)
        if found is None or variant not in (None, found):
            continue
        variant = found
        organisms |= set(ran(notebook) or (0,))
    return None if variant is None else (variant, tuple(sorted(organisms)))


def build_organisms(organisms: Sequence[int], jobs: int = 1, variant: str = VARIANT, cores: int | None = None
                    ) -> None:
    """Build every organism of ``variant`` not yet cached, side by side where the cores allow one build per
    :attr:`~moir_lib.pocket.variants.TrainSpec.threads` (at most ``jobs`` at once;
    :func:`moir_lib.pocket.builds.build_side_by_side`), and refuse two with the same weights."""
    from moir_lib.pocket.build import distinct_weights
    from moir_lib.pocket.builds import build_side_by_side

    build_side_by_side(variant, organisms, jobs, cores)
    distinct_weights(variant, organisms, "the book's organisms")


def recorded_weights(summaries: Iterable[Mapping[str, Any] | None]) -> dict[int, set[str]]:
    """Organism -> the SHA-256s of the weights the chapters' ``summary.json`` say they ran (a headline's
    ``organisms`` entries with ``weights_sha256``, as chapter 06 writes them)."""
    found: dict[int, set[str]] = {}
    for summary in summaries:
        for entry in ((summary or {}).get("headline") or {}).get(PARAMETER) or []:
            if isinstance(entry, Mapping) and entry.get("weights_sha256"):
                found.setdefault(int(entry["organism"]), set()).add(entry["weights_sha256"])
    return found


def provenance_table(organisms: Sequence[int], variant: str = VARIANT,
                     recorded: Mapping[int, set[str]] | None = None) -> str:
    """What each of ``organisms`` of ``variant`` is, as this machine built it (Markdown): the SHA-256 of
    its weights, its training precision and its build time. ``recorded``: the weights the chapters say they
    ran (:func:`recorded_weights`), shown for an organism not built here and flagged where they differ."""
    from moir_lib.pocket import provenance
    from moir_lib.pocket.organisms import same_weights

    builds = {k: provenance(variant, k) for k in organisms}
    known = {k: {b.weights_sha256} if b is not None else set() for k, b in builds.items()}
    same_weights({k: known[k] | set((recorded or {}).get(k, ())) for k in organisms},
                 "the book's provenance table", variant)
    rows = ["| pocket organism | weights (SHA-256 of model.safetensors) | training precision | build time |",
            "|---|---|---|---|"]
    for k in organisms:
        built, ran_ = builds[k], sorted((recorded or {}).get(k, ()))
        if built is None:
            weights = (" or ".join(f"`{w}`" for w in ran_) + " (the chapters' record; not built here)" if ran_
                       else "not built on the machine that built this book")
            rows.append(f"| {k} | {weights} | — | — |")
            continue
        other = [w for w in ran_ if w != built.weights_sha256]
        flag = f" — **the chapters ran other weights**: {', '.join(f'`{w}`' for w in other)}" if other else ""
        rows.append(f"| {k} | `{built.weights_sha256}`{flag} | {built.precision} | {built.build_s:.0f} s |")
    return (f"The chapters ran on {_count(organisms)} of the `{variant}` recipe; the training "
            f"precision follows the CPU that built each one, so a book rebuilt on another CPU may differ:\n\n"
            + "\n".join(rows) + "\n")


def _count(organisms: Sequence[int]) -> str:
    return f"organism {organisms[0]}" if len(organisms) == 1 else f"{len(organisms)} organisms"
