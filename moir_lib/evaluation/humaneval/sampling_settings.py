"""How a HumanEval run generates and executes: :class:`HumanEvalSettings` (the paper's by default)."""

from __future__ import annotations

from dataclasses import dataclass

from moir_lib.evaluation.humaneval.limits import SandboxConfig
from moir_lib.evaluation.humaneval.problems import STOP_SEQUENCES

#: The fields the paper fixes (one sample per problem at ``temperature=0.2, top_p=0.95``, 512 new tokens).
PAPER_FIELDS: tuple[str, ...] = ("temperature", "top_p", "n", "max_new_tokens")


@dataclass(frozen=True)
class HumanEvalSettings:
    """The completions and their execution (:func:`~moir_lib.evaluation.humaneval.run_humaneval`).

    ``n`` completions per prompt sampled at ``temperature`` (0: greedy) and ``top_p``, at most
    ``max_new_tokens`` each, cut at the first of ``stop``; ``batch_size`` prompts per left-padded batch,
    batch ``b`` sampled under ``seed + b``. ``sandbox``: each program's limits (``None``: the default
    :class:`~moir_lib.evaluation.humaneval.SandboxConfig`), run by ``workers`` processes.
    """

    temperature: float = 0.2
    top_p: float = 0.95
    n: int = 1
    max_new_tokens: int = 512
    stop: tuple[str, ...] = STOP_SEQUENCES
    batch_size: int = 8
    seed: int = 0
    sandbox: SandboxConfig | None = None
    workers: int = 1


#: The paper's settings (:data:`PAPER_FIELDS`), the defaults of every HumanEval run.
PAPER_HUMANEVAL = HumanEvalSettings()
