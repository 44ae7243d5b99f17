""":func:`evaluate_preservation`: plan the suite, run lm-eval and the HumanEval sandbox on the
in-memory model, and gather the result with ``S_p``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from moir_lib.evaluation.preservation.harness import (
    _LM_EVAL_MAX_GEN_TOKS,
    _context_window,
    _run_lm_eval,
    lm_eval_rows,
)
from moir_lib.evaluation.preservation.result import (
    PreservationResult,
    _headline,
    _items,
    _suite_score,
    _summary,
    _table,
)
from moir_lib.evaluation.preservation.suites import SuitePlan, SuiteTask, plan_suite
from moir_lib.timings import timed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from moir_lib.evaluation.humaneval import HumanEvalResult, SandboxConfig

log = logging.getLogger(__name__)


_HUMANEVAL_DEFAULTS = {"temperature": 0.2, "top_p": 0.95, "n": 1, "max_new_tokens": 512}


@timed("preservation")
def evaluate_preservation(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    suite: str = "paper",
    *,
    tasks: Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    offset: int = 0,
    batch_size: int | str = 16,
    max_length: int | None = None,
    gen_kwargs: Mapping[str, Any] | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool = False,
    add_bos_token: bool | None = None,
    humaneval: Mapping[str, Any] | None = None,
    sandbox: SandboxConfig | None = None,
    allow_code_eval: bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    pocket_variant: str | None = None,
    fingerprint: str | None = None,
) -> PreservationResult:
    """Run a preservation suite on the in-memory ``model``; tidy table + summary with ``S_p``.

    ``suite``: ``"paper"`` or ``"pocket"``; ``tasks``: a subset of the suite's keys
    (:data:`PAPER_TASKS`, :data:`POCKET_TASKS`), then ``S_p`` is ``None`` unless every
    constituent ran. ``data_dir``: original-format benchmark files instead of the hub
    (:func:`offline_task_configs`). ``limit``: documents (problems) per task, for smoke runs, from
    ``offset`` on (``[offset, offset + limit)`` of each task, MMLU's subjects each: lm-eval's ``samples``).
    ``gen_kwargs``/``num_fewshot``/``apply_chat_template``/``max_length``/``add_bos_token`` go
    to lm-eval unchanged (defaults: the built-in task settings; a change is recorded and should
    be reported). ``humaneval``: overrides of the HumanEval settings (``temperature`` 0.2,
    ``top_p`` 0.95, ``n`` 1, ``max_new_tokens`` 512, ``batch_size``, ``seed``, ``workers``).
    ``cache_dir``: keep lm-eval's request cache there, in a file keyed by the model
    fingerprint (default: no cache). ``fingerprint``: the model's, if already computed.
    """
    plan = plan_suite(suite, tasks, data_dir=data_dir, limit=limit, offset=offset,
                      allow_code_eval=allow_code_eval)
    from moir_lib.models import model_fingerprint

    start = time.perf_counter()
    warnings: list[str] = []
    if limit is not None:
        _warn(warnings, f"limit={limit}: a smoke run on {limit} documents per task from document {offset}; "
                        f"these numbers are not comparable with the paper's")
    fingerprint = fingerprint or model_fingerprint(model)
    lm_tasks = [t for t in plan.tasks if t.key != "humaneval"]
    gen_kwargs = _fitted_gen_kwargs(model, plan, lm_tasks, gen_kwargs, max_length, warnings)

    raw: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    prov: dict[str, dict[str, Any]] = {"versions": {}, "n": {}, "sources": {}, "num_fewshot": {}}
    if lm_tasks:
        raw = _run_lm_eval(model, tokenizer, plan, lm_tasks, batch_size=batch_size, max_length=max_length,
                           gen_kwargs=gen_kwargs, num_fewshot=num_fewshot,
                           apply_chat_template=apply_chat_template,
                           add_bos_token=add_bos_token, cache_dir=cache_dir, fingerprint=fingerprint,
                           pocket_variant=pocket_variant)
        rows, prov = lm_eval_rows(plan, raw)
    he_result = None
    if plan.needs_code_execution:
        he_result = _humaneval_rows(model, tokenizer, plan, humaneval, sandbox=sandbox, rows=rows, prov=prov,
                                    warnings=warnings)

    headline = _headline(plan, rows)
    score = _suite_score(plan, headline)
    table = _table(rows, plan, limit, fingerprint)
    settings = {"batch_size": batch_size, "max_length": max_length, "gen_kwargs": gen_kwargs,
                "num_fewshot_override": num_fewshot, "apply_chat_template": apply_chat_template,
                "add_bos_token": add_bos_token, "request_cache": raw.get("moir_request_cache"),
                "humaneval": he_result.settings if he_result is not None else None}
    summary = _summary(plan, score, headline, limit=limit, prov=prov, fingerprint=fingerprint,
                       settings=settings, warnings=warnings, start=start)
    log.info("preservation (%s): %s%s", plan.suite,
             {k: round(v, 4) for k, v in headline.items() if v is not None},
             f", S_p = {float(score):.4f}" if score is not None else "")
    items = _items(plan, raw.get("samples", {}), he_result)
    raw = {k: v for k, v in raw.items() if k != "samples"}
    return PreservationResult(table=table, summary=summary, score=score, humaneval=he_result, raw=raw,
                              items=items)


def _warn(warnings: list[str], msg: str) -> None:
    """Log ``msg`` as a warning and keep it for the run's summary."""
    log.warning(msg)
    warnings.append(msg)


def _fitted_gen_kwargs(model: Any, plan: SuitePlan, lm_tasks: Sequence[SuiteTask],
                       gen_kwargs: Mapping[str, Any] | None, max_length: int | None,
                       warnings: list[str]) -> dict[str, Any]:
    """``gen_kwargs`` with ``max_gen_toks`` halved to the context window where GSM8K would not fit it."""
    gen_kwargs = dict(gen_kwargs or {})
    if plan.suite == "paper" and any(t.key == "gsm8k" for t in lm_tasks) and "max_gen_toks" not in gen_kwargs:
        window = max_length or _context_window(model)
        if window is not None and window <= 2 * _LM_EVAL_MAX_GEN_TOKS:
            gen_kwargs["max_gen_toks"] = window // 2
            _warn(warnings, f"the model's context window ({window} tokens) cannot hold lm-eval's "
                            f"{_LM_EVAL_MAX_GEN_TOKS} generated tokens plus a GSM8K prompt: max_gen_toks set "
                            f"to {window // 2}")
    return gen_kwargs


def _humaneval_rows(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, plan: SuitePlan,
                    humaneval: Mapping[str, Any] | None, *, sandbox: SandboxConfig | None,
                    rows: list[dict[str, Any]], prov: dict[str, dict[str, Any]],
                    warnings: list[str]) -> HumanEvalResult:
    """Run HumanEval in the sandbox (the plan's problems ``[offset, offset + limit)``); append its pass@1 row
    to ``rows`` and its provenance to ``prov``."""
    from moir_lib.evaluation.humaneval import load_problems, run_humaneval

    settings = {**_HUMANEVAL_DEFAULTS, **dict(humaneval or {})}
    if any(settings[k] != v for k, v in _HUMANEVAL_DEFAULTS.items()):
        changed = {k: settings[k] for k in _HUMANEVAL_DEFAULTS if settings[k] != _HUMANEVAL_DEFAULTS[k]}
        _warn(warnings, f"HumanEval settings differ from the paper's (T=0.2, top_p=0.95, n=1, 512 new "
                        f"tokens): {changed}")
    limit, offset = plan.limit, plan.offset
    problems_src = plan.files.get("humaneval")
    problems: Any = problems_src
    if offset:
        problems = load_problems(problems_src)[offset:offset + limit]
        if not problems:
            raise ValueError(f"offset={offset}: HumanEval has no problem from there on; lower the offset")
    he_result = run_humaneval(model, tokenizer, problems, limit=None if offset else limit, sandbox=sandbox,
                              allow_code_eval=True, **settings)
    he_result.settings.update({"limit": limit, "offset": offset})
    rows.append({"task": "humaneval", "metric": "pass@1", "filter": "none", "value": he_result.pass_at_1,
                 "stderr": he_result.stderr, "n": he_result.n_problems, "version": "moir-sandbox-1"})
    prov["versions"]["humaneval"] = "moir-sandbox-1"
    prov["n"]["humaneval"] = he_result.n_problems
    prov["sources"]["humaneval"] = problems_src or "openai/openai_humaneval"
    prov["num_fewshot"]["humaneval"] = 0
    return he_result
