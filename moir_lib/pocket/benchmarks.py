"""Pocket benchmarks: the lm-eval tasks in ``data/tasks/`` and a model's scores on them.

Stand-ins for the paper's preservation suite: ``pocket_facts`` (MMLU: multiple choice
over the relation's objects on held-out paraphrase prompts), ``pocket_arith`` /
``pocket_arith_raw`` (GSM8K: generate_until with a strict ``#### N`` match, in chat and
in raw ``Question:/Answer:`` format), ``pocket_code`` (HumanEval: pass@1 by executing
tests in a subprocess) and ``pocket_prose`` (cloze multiple choice over web-like prose).
The datasets are written at build time into the cache entry
(:func:`moir_lib.pocket.bench_datasets.write_datasets`); :func:`evaluate` points the tasks at them
through lm-eval's task metadata and scores the *in-memory* model with ``HFLM``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from moir_lib.pocket.build import build

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["TASKS", "TASKS_DIR", "evaluate"]

log = logging.getLogger(__name__)

TASKS: tuple[str, ...] = ("pocket_facts", "pocket_arith", "pocket_arith_raw", "pocket_code", "pocket_prose")
TASKS_DIR = Path(__file__).resolve().parents[2] / "data" / "tasks"


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[str] | None = None,
    limit: int | None = None,
    variant: str | None = None,
    batch_size: int = 32,
) -> dict[str, dict[str, float]]:
    """Score ``model`` on pocket tasks through lm-eval; returns task -> metric -> value.

    ``variant`` (default: ``model.config.pocket_variant``, set at build time) picks the benchmark data,
    read from the entry of the model's organism (``model.config.pocket_organism``, 0 when absent), so
    scoring an organism never builds another (every organism has the same data).
    """
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tasks = list(tasks or TASKS)
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ValueError(f"unknown pocket task(s) {unknown}: choose from {', '.join(TASKS)}")
    variant = variant or getattr(model.config, "pocket_variant", None)
    if variant is None:
        raise ValueError("this model carries no config.pocket_variant: pass variant='pocket' or 'micro'")
    data = build(variant, organism=getattr(model.config, "pocket_organism", 0)) / "benchmarks"
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, add_bos_token=True, device="cpu")
    manager = TaskManager(
        include_path=str(TASKS_DIR), include_defaults=False, metadata={"pocket_data": str(data)}
    )
    out = simple_evaluate(
        model=lm,
        tasks=tasks,
        task_manager=manager,
        limit=limit,
        log_samples=False,
        bootstrap_iters=0,
        cache_requests=False,
    )
    results: dict[str, dict[str, float]] = {}
    for task, metrics in out["results"].items():
        results[task] = {
            key.split(",")[0]: float(value)
            for key, value in metrics.items()
            if "," in key and "_stderr" not in key
        }
    log.info("pocket benchmarks: %s", results)
    return results
