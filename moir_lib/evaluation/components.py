"""Variance components of a claim's per-cell difference, measured from a book's own items.

A claim's statistic is a mean over cells ``(organism o, edit sample s, C draw d)`` of a per-cell
difference (:mod:`moir_lib.evaluation.bootstrap`). Its variation is made of::

    y_osd = μ + u_o + v_os + w_od + a + b_osd

``u`` between organisms, ``v`` between edit samples of one organism, ``w`` between draws of C of one
organism (crossed with the samples: draw ``d`` is one C, used by every edit sample), ``a`` the items' part
shared by every cell (the same items are scored everywhere) and ``b`` their part specific to one cell.
:func:`estimate` reads them off one resampled claim (:class:`~moir_lib.evaluation.bootstrap.Resampled`) by
the method of moments of this random-effects model, the item parts from the replicates with the items
alone redrawn:

* ``a + b``: the mean over cells of the variance of a cell's value; ``a``: the mean covariance of two
  cells' values (they share the items' multiplicities);
* ``w``: the mean variance between the draws of one sample, less ``b``;
* ``v``: the mean variance between the sample means (over the draws) of one organism, less ``b / D`` (the
  draws' effects are the same in every sample); with one edit sample per organism it cannot be told from
  ``u`` and is reported with it (None);
* ``u``: the variance between the organism means, less ``v / S + w / D + b / (S D)``.

These are the method of moments' unbiased estimates, kept as they are (one claim's may be negative):
:func:`pool` averages them over many claims of one type and only then are they truncated at 0
(:meth:`Components.truncated`, what :meth:`Components.sd`, the power and the simulations read), so that
a small component is not inflated by averaging truncated estimates. A part the design cannot tell apart
(one organism, one edit sample, one C draw) is None and held in the level above. :func:`write` and
:func:`load` keep them in ``data/calibration/components.json`` (:data:`COMPONENTS_FILE`), with how they
were produced, for the calibration (:mod:`moir_lib.evaluation.calibration`) and the design's power
(:meth:`Components.power`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from moir_lib.evaluation.bootstrap import Resampled
from moir_lib.evaluation.power import Design, claim_power

__all__ = ["COMPONENTS_FILE", "Components", "estimate", "load", "pool", "write"]

#: The book's measured components, read by the calibration and the power of the claims.
COMPONENTS_FILE = Path(__file__).resolve().parents[2] / "data" / "calibration" / "components.json"


@dataclass(frozen=True)
class Components:
    """Variances of a per-cell difference (module docstring) at ``items`` items per preservation task
    (edit claims: per ``items`` edited records): ``organism``, ``sample``, ``draw`` (None where the design
    cannot tell them apart: held in the level above), ``shared`` (items, every cell), ``cell`` (items, one
    cell); ``claims``: how many claims they pool. Raw method-of-moments values: read them through
    :meth:`truncated`."""

    organism: float | None
    sample: float | None
    draw: float | None
    shared: float
    cell: float
    items: int = 50
    claims: int = 1

    def truncated(self) -> Components:
        """Every variance at least 0, the parts not told apart 0 (held in the level above)."""
        def floor(v: float | None) -> float:
            return max(0.0, v or 0.0)

        sample = None if self.sample is None else floor(self.sample)
        return replace(self, organism=floor(self.organism), sample=sample, draw=floor(self.draw),
                       shared=floor(self.shared), cell=floor(self.cell))

    def sd(self) -> dict[str, float | None]:
        """The standard deviations of each component (truncated at 0; None: not told apart)."""
        t = self.truncated()
        return {f: None if getattr(self, f) is None else math.sqrt(getattr(t, f))
                for f in ("organism", "sample", "draw", "shared", "cell")}

    def organism_mean_sd(self, samples: int = 1, draws: int = 1) -> float:
        """The standard deviation of an organism's mean over ``samples × draws`` cells."""
        t = self.truncated()
        return math.sqrt(t.organism + (t.sample or 0.0) / samples + t.draw / draws
                         + t.cell / (samples * draws))

    def scaled(self, factor: float) -> Components:
        """Every component's variance times ``factor`` (the calibration runs at ½ and 2 × the standard
        deviations: ``factor`` ¼ and 4)."""
        def times(v: float | None) -> float | None:
            return None if v is None else v * factor

        return replace(self, organism=times(self.organism), sample=times(self.sample), draw=times(self.draw),
                       shared=self.shared * factor, cell=self.cell * factor)

    def power(self, design: Design, delta: float, level: float) -> float:
        """The power of :func:`~moir_lib.evaluation.power.claim_power` for ``design`` at these components
        (truncated; the edit samples' part, when not told apart, taken as held in the organisms'), measured
        at :attr:`items` items per task: the item parts (``shared``, ``cell``) scale as ``1 / items``. With
        several organisms the units are the organisms (``σ_U² = organism + sample/S + draw/D +
        cell/(S·D)``); with one, its cells (``σ_U² = sample·[S > 1] + draw + cell``: a claim about that
        model)."""
        t = self.truncated()
        organism, sample, draw, shared, cell = t.organism, t.sample or 0.0, t.draw, t.shared, t.cell
        scale = self.items / design.items
        if design.organisms >= 2:
            unit = (organism + sample / design.samples + draw / design.draws
                    + cell * scale / (design.samples * design.draws))
            return claim_power(delta, math.sqrt(unit), design.organisms, shared * scale, level)
        unit = sample * (design.samples > 1) + draw + cell * scale
        return claim_power(delta, math.sqrt(unit), design.samples * design.draws, shared * scale, level)


def _mean_var(groups: Iterable[np.ndarray]) -> float | None:
    """The mean of the sample variances (ddof 1) of the groups with two or more finite values."""
    vs = [float(np.var(g[np.isfinite(g)], ddof=1)) for g in groups if np.isfinite(g).sum() >= 2]
    return float(np.mean(vs)) if vs else None


def estimate(res: Resampled) -> Components | None:
    """The raw components of one resampled claim (module docstring); None when it has no two cells."""
    cells = res.cells  # (O, S, D)
    reps = res.cell_item_replicates  # (R, O, S, D)
    ok = np.isfinite(cells)
    if ok.sum() < 2:
        return None
    flat = reps[:, ok]  # (R, cells)
    flat = flat[np.isfinite(flat).all(axis=1)]
    cov = np.cov(flat, rowvar=False)
    n = cov.shape[0]
    shared = float((cov.sum() - np.trace(cov)) / (n * (n - 1)))
    cell = float(np.mean(np.diag(cov))) - shared
    o, s, _ = cells.shape
    within_draws = _mean_var(cells[i, j] for i in range(o) for j in range(s))
    draw = None if within_draws is None else within_draws - cell
    draws = max(1.0, float(np.mean(ok.sum(axis=2)[ok.any(axis=2)])))
    samples = max(1.0, float(np.mean(ok.any(axis=2).sum(axis=1)[ok.any(axis=(1, 2))])))
    with np.errstate(invalid="ignore"):
        sample_means = np.nanmean(np.where(ok, cells, np.nan), axis=2)  # (O, S)
    within_samples = _mean_var(sample_means[i] for i in range(o)) if s > 1 else None
    sample = None if within_samples is None else within_samples - cell / draws
    between = _mean_var([np.nanmean(sample_means, axis=1)]) if o > 1 else None
    organism = None if between is None else (between - (sample or 0.0) / samples - (draw or 0.0) / draws
                                             - cell / (samples * draws))
    items = int(round(res.n_items / max(1, len(res.strata))))
    return Components(organism, sample, draw, shared, cell, items)


def pool(parts: Iterable[Components]) -> Components | None:
    """The mean of each raw variance over ``parts`` (one claim type's claims; a part not told apart in a
    claim left out of its mean, None where no claim tells it apart); None when there are none."""
    parts = list(parts)
    if not parts:
        return None

    def mean(name: str) -> float | None:
        values = [getattr(p, name) for p in parts if getattr(p, name) is not None]
        return float(np.mean(values)) if values else None

    return Components(mean("organism"), mean("sample"), mean("draw"), float(mean("shared")),
                      float(mean("cell")), int(round(np.mean([p.items for p in parts]))),
                      sum(p.claims for p in parts))


def write(components: Mapping[str, Components], how: Mapping[str, Any], path: str | Path = COMPONENTS_FILE
          ) -> Path:
    """Write the components of each claim type with ``how`` they were produced (``source``,
    ``provisional``, …) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    def rounded(d: Mapping[str, Any]) -> dict[str, Any]:
        return {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in d.items()}

    data = {**how, "types": {k: {**rounded(asdict(c)), "sd": rounded(c.sd())} for k, c in components.items()}}
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return path


def load(path: str | Path = COMPONENTS_FILE) -> tuple[dict[str, Components], dict[str, Any]]:
    """The components of each claim type in ``path`` and the rest of the file (how they were produced);
    a ``ValueError`` naming the file and the key when it cannot be read."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        names = {f.name for f in fields(Components)}
        types = {k: Components(**{f: v[f] for f in names if f in v}) for k, v in data["types"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"variance components {path}: {type(exc).__name__} {exc}: write it with "
                         "`moir components RUN_DIR` (a book's run directory)") from None
    return types, {k: v for k, v in data.items() if k != "types"}
