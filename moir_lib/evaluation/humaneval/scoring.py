"""pass@k (the unbiased estimator of Chen et al. 2021) and the HumanEval evaluation: execute every
completion against its problem's tests, pass@1 over the problems (:func:`run_humaneval`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from moir_lib.evaluation.humaneval.completions import generate_completions
from moir_lib.evaluation.humaneval.limits import SandboxConfig
from moir_lib.evaluation.humaneval.opt_in import check_code_eval_allowed
from moir_lib.evaluation.humaneval.problems import build_program, load_problems
from moir_lib.evaluation.humaneval.sampling_settings import PAPER_HUMANEVAL, HumanEvalSettings
from moir_lib.evaluation.humaneval.sandbox import execute_many

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): ``1 - C(n-c, k) / C(n, k)`` for ``n`` samples, ``c`` correct."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class HumanEvalResult:
    """pass@1 over the problems, its standard error, and one row per sample (``per_sample``)."""

    pass_at_1: float
    stderr: float | None
    n_problems: int
    n_samples: int
    per_sample: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def evaluate_completions(problems: Sequence[Mapping[str, Any]], completions: Sequence[Sequence[str]],
                         config: SandboxConfig | None = None, *, workers: int = 1,
                         allow_code_eval: bool | None = None) -> HumanEvalResult:
    """Execute every completion against its problem's tests; pass@1 and one row per sample."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completion lists")
    programs, owners = [], []
    for i, (problem, samples) in enumerate(zip(problems, completions, strict=True)):
        for j, completion in enumerate(samples):
            programs.append(build_program(problem, completion))
            owners.append((i, j, completion))
    results = execute_many(programs, config, workers=workers, allow_code_eval=allow_code_eval,
                           progress=len(programs) > 20)
    per_sample = []
    correct = [0] * len(problems)
    for (i, j, completion), res in zip(owners, results, strict=True):
        correct[i] += res.passed
        per_sample.append({"task_id": problems[i]["task_id"], "sample": j, "completion": completion,
                           "passed": res.passed, "status": res.status, "returncode": res.returncode,
                           "duration_s": round(res.duration_s, 4),
                           "error": res.stderr[-500:] if not res.passed else ""})
    scores = [pass_at_k(len(s), c, 1) for s, c in zip(completions, correct, strict=True) if len(s)]
    mean = sum(scores) / len(scores) if scores else 0.0
    stderr = (math.sqrt(sum((x - mean) ** 2 for x in scores) / (len(scores) - 1) / len(scores))
              if len(scores) > 1 else None)
    cfg = config or SandboxConfig()
    settings = {"sandbox": {**dataclasses.asdict(cfg),
                            "isolation_used": results[0].isolation if results else None,
                            "limits": results[0].limits if results else None}}
    return HumanEvalResult(pass_at_1=mean, stderr=stderr, n_problems=len(scores), n_samples=len(programs),
                           per_sample=per_sample, settings=settings)


def run_humaneval(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  problems: Sequence[Mapping[str, Any]] | str | os.PathLike[str] | None = None,
                  settings: HumanEvalSettings = PAPER_HUMANEVAL, *, limit: int | None = None,
                  allow_code_eval: bool | None = None) -> HumanEvalResult:
    """HumanEval pass@1 of an in-memory model under ``settings`` (default: the paper's, ``n=1``, T=0.2,
    top_p=0.95).

    ``problems``: a list of problem dicts, a path for :func:`load_problems`, or ``None`` (hub
    copy). ``limit``: the first ``limit`` problems only (smoke runs; the result says so in
    ``settings["limit"]``). The opt-in is checked before anything is generated.
    """
    check_code_eval_allowed(allow_code_eval)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if not isinstance(problems, Sequence) or isinstance(problems, str):
        problems = load_problems(problems)
    problems = list(problems)[:limit] if limit is not None else list(problems)
    start = time.perf_counter()
    completions = generate_completions(model, tokenizer, [p["prompt"] for p in problems], settings)
    gen_s = time.perf_counter() - start
    result = evaluate_completions(problems, completions, settings.sandbox, workers=settings.workers,
                                  allow_code_eval=True)
    result.settings.update({"temperature": settings.temperature, "top_p": settings.top_p, "n": settings.n,
                            "max_new_tokens": settings.max_new_tokens, "stop": list(settings.stop),
                            "seed": settings.seed,
                            "limit": limit, "generation_s": round(gen_s, 2),
                            "total_s": round(time.perf_counter() - start, 2)})
    log.info("humaneval: pass@1 = %.4f over %d problems (%d samples)", result.pass_at_1, result.n_problems,
             result.n_samples)
    return result
