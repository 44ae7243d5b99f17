"""Pocket benchmark datasets: the generated ``.jsonl`` data of the lm-eval tasks in ``data/tasks/``.

Written at build time into the cache entry (part of the build recipe,
:data:`moir_lib.pocket.build.RECIPE_MODULES`), each from its own seeds: ``facts`` (multiple
choice over the relation's objects on held-out paraphrase prompts), ``arith`` (problems with
step-by-step solutions), ``code`` (HumanEval-style tasks with tests) and ``prose`` (cloze
multiple choice over web-like prose). :func:`moir_lib.pocket.benchmarks.evaluate` scores a model
on them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from moir_lib.pocket.corpora import code_task, math_problem, prose_item
from moir_lib.pocket.variants import BenchSpec
from moir_lib.pocket.world import World

__all__ = ["write_datasets"]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_datasets(world: World, records: list[dict[str, Any]], spec: BenchSpec, out: Path) -> None:
    """Write the ``.jsonl`` data of every pocket task into ``out`` (deterministic, own seeds)."""
    out.mkdir(parents=True, exist_ok=True)
    facts = []
    for rec in records:
        rw = rec["requested_rewrite"]
        objects = world.objects[rw["relation_id"]]
        facts.append(
            {
                "prompt": rec["paraphrase_prompts"][0],
                "choices": [f" {o}" for o in objects],
                "label": objects.index(rw["target_true"]["str"]),
                "relation": rw["relation_id"],
                "subject": rw["subject"],
            }
        )
    _write_jsonl(out / "facts.jsonl", facts)
    rng = random.Random(f"pocket-bench/{world.spec.seed}")
    arith = [math_problem(rng) for _ in range(spec.arith)]
    _write_jsonl(
        out / "arith.jsonl",
        [{"question": p.question, "solution": p.solution, "target": str(p.answer)} for p in arith],
    )
    code = [code_task(rng) for _ in range(spec.code)]
    _write_jsonl(
        out / "code.jsonl",
        [
            {
                "task_id": f"pocket/{i}",
                "prompt": t.prompt,
                "canonical_solution": t.solution,
                "test": t.test,
                "entry_point": t.entry_point,
            }
            for i, t in enumerate(code)
        ],
    )
    prose = [prose_item(rng) for _ in range(spec.prose)]
    _write_jsonl(
        out / "prose.jsonl",
        [{"context": p.context, "choices": list(p.choices), "label": p.label} for p in prose],
    )
