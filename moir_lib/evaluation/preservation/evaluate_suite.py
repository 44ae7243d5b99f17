""":func:`evaluate_preservation`: plan the suite, run lm-eval and the HumanEval sandbox on the
in-memory model, and gather the result with ``S_p``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from moir_lib.evaluation.preservation.harness import (
    _LM_EVAL_MAX_GEN_TOKS,
    _context_window,
    _run_lm_eval,
    lm_eval_rows,
)
from moir_lib.evaluation.preservation.suite_settings import PreservationSettings
from moir_lib.evaluation.preservation.suites import SuitePlan, SuiteTask, plan_suite
from moir_lib.evaluation.preservation.summary import (
    PreservationResult,
    _headline,
    _items,
    _suite_score,
    _summary,
    _table,
)
from moir_lib.timings import timed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from moir_lib.evaluation.humaneval import HumanEvalResult, HumanEvalSettings

log = logging.getLogger(__name__)

#: The paper's suite, all of it, from the hub.
PAPER_PRESERVATION = PreservationSettings()


@timed("preservation")
def evaluate_preservation(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                          settings: PreservationSettings = PAPER_PRESERVATION, *,
                          pocket_variant: str | None = None, fingerprint: str | None = None
                          ) -> PreservationResult:
    """Run a preservation suite on the in-memory ``model``; tidy table + summary with ``S_p``.

    ``settings``: the suite, its tasks, documents and data, and lm-eval's and HumanEval's settings
    (:class:`PreservationSettings`; default: the paper's whole suite from the hub). ``pocket_variant``:
    the pocket suite's data (default: the model's ``config.pocket_variant``). ``fingerprint``: the
    model's, if already computed.
    """
    s = settings
    plan = plan_suite(s.suite, s.tasks, data_dir=s.data_dir, limit=s.limit, offset=s.offset,
                      allow_code_eval=s.allow_code_eval)
    from moir_lib.models import model_fingerprint

    start = time.perf_counter()
    warnings: list[str] = []
    if s.limit is not None:
        _warn(warnings, f"limit={s.limit}: a smoke run on {s.limit} documents per task from document "
                        f"{s.offset}; these numbers are not comparable with the paper's")
    fingerprint = fingerprint or model_fingerprint(model)
    lm_tasks = [t for t in plan.tasks if t.key != "humaneval"]
    s = replace(s, gen_kwargs=_fitted_gen_kwargs(model, plan, lm_tasks, s.gen_kwargs, s.max_length, warnings))

    raw: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    prov: dict[str, dict[str, Any]] = {"versions": {}, "n": {}, "sources": {}, "num_fewshot": {}}
    if lm_tasks:
        raw = _run_lm_eval(model, tokenizer, plan, lm_tasks, s, fingerprint=fingerprint,
                           pocket_variant=pocket_variant)
        rows, prov = lm_eval_rows(plan, raw)
    he_result = None
    if plan.needs_code_execution:
        he_result = _humaneval_rows(model, tokenizer, plan, s.humaneval, rows=rows, prov=prov,
                                    warnings=warnings)

    headline = _headline(plan, rows)
    score = _suite_score(plan, headline)
    table = _table(rows, plan, s.limit, fingerprint)
    recorded = {"batch_size": s.batch_size, "max_length": s.max_length, "gen_kwargs": s.gen_kwargs,
                "num_fewshot_override": s.num_fewshot, "apply_chat_template": s.apply_chat_template,
                "add_bos_token": s.add_bos_token, "request_cache": raw.get("moir_request_cache"),
                "humaneval": he_result.settings if he_result is not None else None}
    summary = _summary(plan, score, headline, prov=prov, fingerprint=fingerprint, settings=recorded,
                       warnings=warnings, start=start)
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
                    settings: HumanEvalSettings, *, rows: list[dict[str, Any]],
                    prov: dict[str, dict[str, Any]], warnings: list[str]) -> HumanEvalResult:
    """Run HumanEval in the sandbox (the plan's problems ``[offset, offset + limit)``); append its pass@1 row
    to ``rows`` and its provenance to ``prov``."""
    from moir_lib.evaluation.humaneval import PAPER_HUMANEVAL, load_problems, run_humaneval
    from moir_lib.evaluation.humaneval.sampling_settings import PAPER_FIELDS

    changed = {k: getattr(settings, k) for k in PAPER_FIELDS
               if getattr(settings, k) != getattr(PAPER_HUMANEVAL, k)}
    if changed:
        _warn(warnings, f"HumanEval settings differ from the paper's (T=0.2, top_p=0.95, n=1, 512 new "
                        f"tokens): {changed}")
    limit, offset = plan.limit, plan.offset
    problems_src = plan.files.get("humaneval")
    problems: Any = problems_src
    if offset:
        problems = load_problems(problems_src)[offset:offset + limit]
        if not problems:
            raise ValueError(f"offset={offset}: HumanEval has no problem from there on; lower the offset")
    he_result = run_humaneval(model, tokenizer, problems, settings, limit=None if offset else limit,
                              allow_code_eval=True)
    he_result.settings.update({"limit": limit, "offset": offset})
    rows.append({"task": "humaneval", "metric": "pass@1", "filter": "none", "value": he_result.pass_at_1,
                 "stderr": he_result.stderr, "n": he_result.n_problems, "version": "moir-sandbox-1"})
    prov["versions"]["humaneval"] = "moir-sandbox-1"
    prov["n"]["humaneval"] = he_result.n_problems
    prov["sources"]["humaneval"] = problems_src or "openai/openai_humaneval"
    prov["num_fewshot"]["humaneval"] = 0
    return he_result
