"""What one experiment is (:class:`ExperimentSpec`), how its points are scored (:class:`EvalSettings`), how
its
edits are made (:class:`EditSettings`; its C's: :class:`moir_lib.covariance.recipes.CovSettings`), and
grids of experiments."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moir_lib.editing.editors import EDITORS
from moir_lib.experiments.rows import NONE

if TYPE_CHECKING:
    from moir_lib.profiles import Profile

#: edited records scored per point unless told otherwise: the chapters, ``moir edit`` and the
#: editability gate of the pocket report score the same records, so they share their points
N_EVAL = 100
#: items per preservation task of the book's points (the pocket tasks' first 50): the chapters and the
#: editability gate share it, and it also sets which records are edited (the first ones are the facts
#: task's items), so a point computed by one is served to the others
PRES_LIMIT = 50
_REGIMES = ("batch", "sequential")


@dataclass(frozen=True)
class EvalSettings:
    """How every scored point is evaluated (all of it is part of the cache key).

    ``n_eval``: edited records scored for the CounterFact metrics (evenly spaced; ``None``: all,
    as the paper). ``fluency``/``max_gen_tokens``/``fluency_prompts``: Fluency* continuations
    (greedy) per record. ``pres_limit``: documents per preservation task (``None``: the full
    tasks); ``pres_offset``: the first of them (documents ``[pres_offset, pres_offset + pres_limit)``
    of each task: the selection of τ and λ scores the ones after the chapters'). ``suite``:
    ``"pocket"`` | ``"paper"`` (default: pocket for pocket profiles).
    ``data_dir``/``allow_code_eval``: the paper suite's offline data and HumanEval opt-in.
    ``nll_docs``: held-out documents per pocket domain for the NLL deltas (0: none).
    ``neighbours``: ``"unedited"`` leaves the neighbourhood prompts about subjects edited in the
    same experiment out of NS where the records name their neighbours (pocket CounterFact; ``NS_all``
    keeps every prompt), ``"all"`` scores them all as MEMIT's evaluation code does (see
    :mod:`moir_lib.evaluation.counterfact`). Real CounterFact names no neighbour: both are equal.
    """

    n_eval: int | None = N_EVAL
    fluency: bool = True
    max_gen_tokens: int = 16
    fluency_prompts: int | None = 1
    pres_limit: int | None = PRES_LIMIT
    pres_offset: int = 0
    suite: str | None = None
    data_dir: str | None = None
    allow_code_eval: bool | None = None
    nll_docs: int = 16
    batch_size: int = 32
    neighbours: str = "unedited"

    def __post_init__(self) -> None:
        for name in ("n_eval", "pres_limit", "fluency_prompts"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {v!r}")
        offset = self.pres_offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"pres_offset must be an integer >= 0, got {self.pres_offset!r}")
        if self.pres_offset and self.pres_limit is None:
            raise ValueError("pres_offset needs pres_limit: the documents after the offset are counted by it")
        if self.nll_docs < 0 or self.max_gen_tokens < 1 or self.batch_size < 1:
            raise ValueError("nll_docs must be >= 0, max_gen_tokens and batch_size >= 1")
        if self.suite not in (None, "pocket", "paper"):
            raise ValueError(f"suite must be 'pocket', 'paper' or None, got {self.suite!r}")
        if self.neighbours not in ("unedited", "all"):
            raise ValueError(f"neighbours must be 'unedited' or 'all', got {self.neighbours!r}")

    def key(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("batch_size")  # changes speed, not results
        d.pop("allow_code_eval")
        if not d["pres_offset"]:  # the chapters' points keep the keys they had before the offset existed
            d.pop("pres_offset")
        return d


@dataclass(frozen=True)
class EditSettings:
    """How a lab's edits are made beyond the profile (part of every key that depends on them).

    ``context_templates``: prefixes sampled from the model besides the plain prompt, for every editor
    (``None``: each editor's own, ``memit.context_templates`` / ``alphaedit.context_templates``; the
    authors' code: 5); ``seq_batch_size``: edits per batch in the sequential regime (the paper: 1).
    """

    context_templates: int | None = None
    seq_batch_size: int = 1

    def __post_init__(self) -> None:
        if self.context_templates is not None and self.context_templates < 0:
            raise ValueError(f"context_templates must be >= 0, got {self.context_templates}")
        if self.seq_batch_size < 1:
            raise ValueError(f"seq_batch_size must be >= 1, got {self.seq_batch_size}")


@dataclass(frozen=True)
class ExperimentSpec:
    """One experiment: ``editor × regime × C × N × edit sample`` (plus optional λ / τ).

    ``n_edits``: the batch size N (batch) or the last milestone (sequential). ``milestones``:
    the cumulative edit counts scored in the sequential regime (``n_edits`` is added). The
    unedited model is ``ExperimentSpec("none", "none", "none", 0)`` (:meth:`unedited`). ``cov``: a C name
    (:mod:`moir_lib.covariance.recipes`; ``<name>@<k>`` is draw ``k``); ``edit_sample``: which random
    draw of the edited records (:mod:`moir_lib.experiments.records`).
    """

    editor: str
    regime: str
    cov: str
    n_edits: int
    milestones: tuple[int, ...] = ()
    edit_sample: int = 0
    lambda_: float | None = None
    tau: float | None = None

    def __post_init__(self) -> None:
        if self.editor == NONE:
            if (self.regime, self.cov, self.n_edits) != (NONE, NONE, 0):
                raise ValueError("the unedited model is ExperimentSpec.unedited() (editor, regime, C: none; "
                                 "N = 0)")
            return
        if self.editor not in EDITORS:
            raise ValueError(f"unknown editor {self.editor!r}: choose {' or '.join(EDITORS)}")
        if self.regime not in _REGIMES:
            raise ValueError(f"unknown regime {self.regime!r}: choose {' or '.join(_REGIMES)}")
        if isinstance(self.n_edits, bool) or not isinstance(self.n_edits, int) or self.n_edits < 1:
            raise ValueError(f"n_edits must be a positive integer, got {self.n_edits!r}")
        ms = tuple(int(m) for m in self.milestones)
        if self.regime == "batch" and ms:
            raise ValueError("milestones belong to the sequential regime")
        if self.regime == "sequential":
            if any(m < 1 for m in ms) or any(b <= a for a, b in zip(ms, ms[1:], strict=False)):
                raise ValueError(f"milestones must be strictly increasing positive integers, got {ms}")
            ms = tuple(m for m in ms if m < self.n_edits) + (self.n_edits,)
        object.__setattr__(self, "milestones", ms)
        if self.lambda_ is not None and not self.lambda_ > 0:
            raise ValueError(f"λ must be > 0, got {self.lambda_}")
        if self.tau is not None and not self.tau > 0:
            raise ValueError(f"τ must be > 0, got {self.tau}")

    @classmethod
    def unedited(cls, edit_sample: int = 0) -> ExperimentSpec:
        """The unedited model (its CounterFact scores on the records of ``edit_sample``)."""
        return cls(NONE, NONE, NONE, 0, edit_sample=edit_sample)

    @property
    def points(self) -> tuple[int, ...]:
        """The edit counts this experiment scores."""
        if self.editor == NONE:
            return (0,)
        return self.milestones if self.regime == "sequential" else (self.n_edits,)

    def at(self, n: int) -> ExperimentSpec:
        """The same experiment scored at ``n`` edits (the cache identity of one point)."""
        if self.regime != "sequential":
            return self
        return dataclasses.replace(self, n_edits=n, milestones=tuple(m for m in self.milestones if m < n))


def grid_specs(editors: Sequence[str], regimes: Sequence[str], covs: Sequence[str], *,
               batch_counts: Mapping[str, Sequence[int]] | Sequence[int], milestones: Sequence[int],
               edit_samples: Sequence[int] = (0,), curve_edit_samples: Sequence[int] | None = None,
               strengths: Mapping[str, Mapping[str, float]] | None = None) -> list[ExperimentSpec]:
    """The Cartesian grid of experiments: batch counts per editor (a mapping) or shared; one sequential one
    per editor × C × edit sample scored at ``milestones``; ``strengths``: editor -> C -> its λ (MEMIT) or τ
    (AlphaEdit), e.g. the values :func:`moir_lib.experiments.selection.select` chose (missing: the
    profile's).

    ``edit_samples`` apply to each editor's largest batch N, the cells the claims compare;
    ``curve_edit_samples`` (default: ``edit_samples``) to the smaller batch counts and the sequential runs."""
    curve = list(edit_samples if curve_edit_samples is None else curve_edit_samples)
    specs = []
    for sample in dict.fromkeys([*edit_samples, *curve]):
        for editor in editors:
            for regime in regimes:
                for cov in covs:
                    value = ((strengths or {}).get(editor) or {}).get(cov)
                    lam = value if editor == "memit" else None
                    tau = value if editor == "alphaedit" else None
                    if regime == "batch":
                        counts = batch_counts[editor] if isinstance(batch_counts, Mapping) else batch_counts
                        specs += [ExperimentSpec(editor, "batch", cov, int(n), edit_sample=sample,
                                                 lambda_=lam,
                                          tau=tau)
                                  for n in counts if sample in (edit_samples if n == max(counts) else curve)]
                    elif milestones and sample in curve:
                        ms = sorted(int(m) for m in milestones)
                        specs.append(ExperimentSpec(editor, "sequential", cov, ms[-1], tuple(ms),
                                                    edit_sample=sample,
                                             lambda_=lam, tau=tau))
    return specs


def profile_counts(profile: Profile, memit: Sequence[int] | None, alphaedit: Sequence[int] | None,
                   milestones: Sequence[int] | None) -> tuple[dict[str, list[int]], list[int]]:
    """Batch counts per editor and sequential milestones: the given lists, or the profile's
    ``editing`` values where ``None`` (the paper-scale grid of a real profile)."""
    e = profile.editing
    counts = {"memit": list(memit if memit is not None else e.batch_sizes_memit),
              "alphaedit": list(alphaedit if alphaedit is not None else e.batch_sizes_alphaedit)}
    return counts, list(milestones if milestones is not None else e.sequential_milestones)
