"""A chapter's labs from its notebook parameters: the one way chapters 01 and 05 open them, one per
pocket organism, and the runs their claims read (several draws of each compared C, pooled frames)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from moir_lib.covariance.recipes import CovSettings, parse_name
from moir_lib.experiments.lab import Lab
from moir_lib.experiments.records import EditRecords
from moir_lib.experiments.selection import retune
from moir_lib.experiments.specs import EditSettings, EvalSettings, ExperimentSpec
from moir_lib.experiments.store import PointStore

__all__ = ["LabSettings", "claimed_point", "cov_draws", "open_lab", "open_labs", "organism_dir",
           "pooled_frames", "with_draws"]


@dataclasses.dataclass(frozen=True)
class LabSettings:
    """How a chapter's labs compute their points beyond the profile: ``evaluation`` (how points are scored),
    ``cov_settings`` (how the named C's are built; ``None`` fields: the profile's), ``editing`` (context
    templates, the sequential step) and ``overrides``: profile settings by dotted key
    (:meth:`Profile.with_overrides <moir_lib.profiles.Profile.with_overrides>`, e.g.
    ``{"editing.validation_records": 200}``)."""

    evaluation: EvalSettings = EvalSettings()
    cov_settings: CovSettings = CovSettings()
    editing: EditSettings = EditSettings()
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def open_lab(profile: Any, out_dir: str | os.PathLike[str], settings: LabSettings | None = None, *,
             reuse: Iterable[str | os.PathLike[str]] = (), records_path: str | os.PathLike[str] | None = None,
             device: str | None = None, organism: int = 0, progress: bool = False) -> Lab:
    """The :class:`Lab` of ``profile`` (at pocket ``organism``; 0: the profile's own) with ``settings``,
    storing its points in ``out_dir`` and reading those of ``reuse`` and the machine-wide copy;
    ``records_path``: a CounterFact file (pocket profiles: the pocket CounterFact)."""
    from moir_lib.profiles import Profile, load_profile

    settings = settings or LabSettings()
    profile = profile if isinstance(profile, Profile) else load_profile(profile)
    if organism or settings.overrides:
        profile = profile.with_overrides({**settings.overrides, **({"organism": organism} if organism else
                                                                   {})})
    records = EditRecords.of(profile, settings.evaluation, records_path)
    return Lab(profile, PointStore(out_dir, reuse=reuse), evaluation=settings.evaluation,
               cov_settings=settings.cov_settings, editing=settings.editing, edit_records=records,
               device=device,
               progress=progress)


def organism_dir(out_dir: str | os.PathLike[str], organism: int) -> str:
    """Where organism ``organism``'s points of a run go: ``out_dir`` itself for organism 0 (a one-model run
    as it always was), ``<out_dir>/organism-<k>`` for the others."""
    return os.fspath(out_dir) if organism == 0 else os.path.join(os.fspath(out_dir), f"organism-{organism}")


def open_labs(profile: Any, out_dir: str | os.PathLike[str], organisms: Sequence[int] = (0,),
              settings: LabSettings | None = None, **kwargs: Any) -> list[Lab]:
    """One :func:`open_lab` per organism of ``organisms`` (in that order) with ``settings``, each storing in
    its :func:`organism_dir` of ``out_dir``; ``kwargs``: :func:`open_lab`'s keywords."""
    from moir_lib.pocket.organisms import check_list

    organisms = check_list(organisms)
    if any(organisms):
        from moir_lib.models import check_organisms
        from moir_lib.profiles import Profile, load_profile

        check_organisms(organisms, (profile if isinstance(profile, Profile) else load_profile(profile)).model)
    return [open_lab(profile, organism_dir(out_dir, k), settings, organism=k, **kwargs) for k in organisms]


def cov_draws(organisms: Sequence[int], draws: int | None = None) -> int:
    """The draws of each compared C a chapter builds: ``draws`` when given, else 1 with several organisms
    (each has its own draw, and the organisms' spread holds the draws': the methods page's power table
    credits a second draw with almost nothing) and 2 with one (a claim about one model needs two cells)."""
    if draws is None:
        return 1 if len(organisms) > 1 else 2
    if draws < 1:
        raise ValueError(f"cov_draws must be >= 1 (draws of each compared C) or None, got {draws}")
    return int(draws)


def with_draws(specs: Iterable[ExperimentSpec], draws: Iterable[int]) -> list[ExperimentSpec]:
    """Each run of ``specs`` with draw ``d`` of its C for every ``d`` of ``draws`` (``moir`` at draws
    ``range(2)``: ``moir`` and ``moir@1``; :func:`~moir_lib.covariance.recipes.parse_name`), in order,
    without repeats."""
    draws = list(draws)
    out = []
    for spec in specs:
        base = parse_name(spec.cov)[0]
        out += [dataclasses.replace(spec, cov=f"{base}@{d}" if d else base) for d in draws]
    return list(dict.fromkeys(out))


def claimed_point(lab: Lab, spec: ExperimentSpec) -> ExperimentSpec:
    """``spec`` scored at its last point only, the one a claim reads, where leaving the earlier milestones
    out leaves the run the same (its key at ``n_edits``: they cut no sequential batch); else ``spec``."""
    if len(spec.points) == 1:
        return spec
    last = dataclasses.replace(spec, milestones=())
    return last if lab.key(last) == lab.key(spec.at(spec.n_edits)) else spec


def pooled_frames(labs: Sequence[Lab], specs: Iterable[ExperimentSpec] | Sequence[Sequence[ExperimentSpec]],
                  strengths: Sequence[Mapping[str, Sequence[Any]]] | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows and per-item frames (:meth:`Lab.frames`) of ``specs`` in every lab of ``labs`` (one per
    organism), each run where its store lacks it and scored at its last point only (:func:`claimed_point`),
    concatenated: the input of claims pooled over organisms.
    ``strengths``: per lab, its organism's own τ / λ (:func:`~moir_lib.experiments.selection.
    organism_strengths`), at which its runs of ``specs`` are made (:func:`~moir_lib.experiments.selection.
    retune`); ``specs`` may also give each lab its own runs (one list per lab)."""
    specs = list(specs)
    per_lab = specs if specs and not isinstance(specs[0], ExperimentSpec) else [specs] * len(labs)
    if len(per_lab) != len(labs):
        raise ValueError(f"{len(per_lab)} lists of runs for {len(labs)} labs: give one per lab")
    if strengths is not None:
        if len(strengths) != len(labs):
            raise ValueError(f"{len(strengths)} organisms' strengths for {len(labs)} labs: give one per lab")
        per_lab = [retune(list(s), own) for s, own in zip(per_lab, strengths, strict=True)]
    parts = []
    for lab, mine in zip(labs, per_lab, strict=True):
        mine = list(dict.fromkeys(claimed_point(lab, s) for s in mine))
        lab.compute_all(mine)
        parts.append(lab.frames(mine))
    return (pd.concat([rows for rows, _ in parts], ignore_index=True),
            pd.concat([items for _, items in parts], ignore_index=True))
