"""Helpers for the pocket lm-eval tasks: dataset loading from the built cache entry, prompts, code execution.

The datasets are generated at build time (``moir_lib.pocket.bench_datasets.write_datasets``); the
directory reaches these functions as the task metadata ``pocket_data``, which
``moir_lib.pocket.benchmarks.evaluate`` sets. This file is imported by lm-eval by path, so it
depends on nothing but the standard library and ``datasets``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import datasets

USER, ASSISTANT = "<|user|>", "<|assistant|>"
CODE_TIMEOUT_S = 5.0


def _load(name: str, pocket_data: str | None) -> datasets.DatasetDict:
    if pocket_data is None:
        raise ValueError(
            "pocket tasks need metadata={'pocket_data': <cache entry>/benchmarks}: "
            "run them through moir_lib.pocket.benchmarks.evaluate"
        )
    path = Path(pocket_data) / f"{name}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def load_facts(pocket_data: str | None = None, **_: object) -> datasets.DatasetDict:
    return _load("facts", pocket_data)


def load_arith(pocket_data: str | None = None, **_: object) -> datasets.DatasetDict:
    return _load("arith", pocket_data)


def load_code(pocket_data: str | None = None, **_: object) -> datasets.DatasetDict:
    return _load("code", pocket_data)


def load_prose(pocket_data: str | None = None, **_: object) -> datasets.DatasetDict:
    return _load("prose", pocket_data)


def arith_chat_prompt(doc: dict) -> str:
    """The question as one user turn, ready for the assistant's answer (BOS is added by HFLM)."""
    return f"{USER}\n{doc['question']}\n{ASSISTANT}\n"


def run_tests(program: str, timeout: float = CODE_TIMEOUT_S) -> bool:
    """Whether ``program`` exits 0 in a separate, isolated Python process within ``timeout`` seconds.

    ``-I -S``: no user site, environment or site-packages (the programs need the standard library
    only), which also starts the process about three times faster."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", "-c", program],
                cwd=tmp,
                capture_output=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def code_pass(doc: dict, results: list[str]) -> dict[str, float]:
    """pass@1 of one greedy completion: prompt + completion + the task's asserts."""
    program = f"{doc['prompt']}{results[0]}\n\n{doc['test']}"
    return {"pass@1": float(run_tests(program))}
