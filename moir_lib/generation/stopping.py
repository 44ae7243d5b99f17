"""Generation that stops when ``C`` has converged: a target split-half gap, checked at doubling sample counts.

A :class:`StopRule` checks the keys collected during generation (Algorithm 1) at the sample counts
``c_j = first_check · 2^j`` below the budget (the generation's ``n_samples``), and at the budget itself:
the split-half agreement (:mod:`moir_lib.covariance.convergence`) of the first ``c_j`` samples, their
first ``⌈c_j/2⌉`` against the rest, both taken in the same pass (:mod:`moir_lib.covariance.prefixes`).
The generation stops at the first ``c_j`` whose gap is at most ``target``: its ``C`` is the keys of those
``c_j`` samples, and half of them sufficed (two ``C``'s of ``c_j/2`` samples agree). ``first_check`` is a
multiple of the batch size, so a check falls between blocks and a stopped generation holds exactly ``c_j``
complete samples.

The checks read only files of the generation (the prefixes' key statistics), so they are deterministic
and a resumed generation decides as the uninterrupted one did; the rule is part of the generation's
configuration (its manifest's ``stop``), and the outcome goes into the manifest's ``stopped``
(:func:`outcome`): the samples the generation holds, those that sufficed, every check's gap. Readers take
the generation's size from :func:`~moir_lib.generation.shards.generation_samples`. One shard only: each
shard would judge its own samples.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Checker", "StopRule", "outcome"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopRule:
    """Stop once the split-half gap of the keys is at most ``target`` (checked from ``first_check``
    samples on, doubling); ``tau``/``tau_mode``: AlphaEdit's threshold that fixes the protected rank."""

    target: float
    first_check: int
    tau: float
    tau_mode: str = "absolute"

    def __post_init__(self) -> None:
        if not (isinstance(self.target, (int, float)) and self.target > 0):
            raise ValueError(f"the target gap must be positive (e.g. 0.01), got {self.target!r}")
        first = self.first_check
        if isinstance(first, bool) or not isinstance(first, int) or first < 2:
            raise ValueError(f"the first check must come at 2 samples or more, got {self.first_check!r}")
        if self.tau_mode not in ("absolute", "relative") or not self.tau > 0:
            raise ValueError(f"τ must be positive and its mode absolute or relative, got {self.tau!r} "
                             f"{self.tau_mode!r}")

    def check_points(self, n_samples: int) -> list[int]:
        """``first_check · 2^j`` below ``n_samples``, then ``n_samples`` (the budget's own check)."""
        points, c = [], self.first_check
        while c < n_samples:
            points.append(c)
            c *= 2
        return [*points, int(n_samples)]

    def prefix_points(self, n_samples: int) -> list[int]:
        """The prefixes the checks read: each check point and its first half."""
        return sorted({p for c in self.check_points(n_samples) for p in (c, _half(c))})

    def check(self, at: int, prefixes: Mapping[int, Any]) -> Any:
        """The :class:`~moir_lib.covariance.convergence.Agreement` of the first ``at`` samples (``prefixes``:
        the prefix statistics by sample count)."""
        from moir_lib.covariance.convergence import split_half

        return split_half(prefixes[at], prefixes[_half(at)], (_half(at), at), tau=self.tau,
                          tau_mode=self.tau_mode)

    def to_config(self) -> dict[str, Any]:
        """What the manifest records of the rule (a resume must ask for the same)."""
        return {**asdict(self), "measure": "split-half gap at AlphaEdit's protected rank"}


class Checker:
    """The checks of ``rule`` over one generation of budget ``n_samples``, in the order the generation
    reaches them (``prefixes``: the generation's prefix statistics by sample count, read when a check
    falls due)."""

    def __init__(self, rule: StopRule, n_samples: int, prefixes: Mapping[int, Any]) -> None:
        self.rule, self.prefixes = rule, prefixes
        self.points = set(rule.check_points(n_samples))
        self.checks: list[tuple[int, Any]] = []

    def at(self, count: int) -> bool:
        """Check the first ``count`` samples when ``count`` is a check point (once); whether the gap is
        within the target there."""
        if count not in self.points or any(c == count for c, _ in self.checks):
            return False
        agreement = self.rule.check(count, self.prefixes)
        self.checks.append((count, agreement))
        log.info("stop rule at %d samples: split-half gap %.4g (target %g)", count, agreement.gap,
                 self.rule.target)
        return agreement.gap <= self.rule.target


def _half(c: int) -> int:
    return -(-int(c) // 2)


def outcome(rule: StopRule, checks: Sequence[tuple[int, Any]], n_samples: int) -> dict[str, Any]:
    """The manifest's ``stopped``: ``checks`` (``(samples, agreement)`` in order, the last one deciding),
    the samples the generation holds, those that sufficed (``None`` when the budget ran out first) and why."""
    n, last = checks[-1]
    converged = last.gap <= rule.target
    return {"n_samples": int(n), "converged": bool(converged), "sufficed": _half(n) if converged else None,
            "budget": int(n_samples), "gap": last.gap, "target": rule.target,
            "checks": [{"n_samples": int(c), "gap": a.gap, "layer": a.worst.layer} for c, a in checks],
            "text": last.describe(rule.target)}
