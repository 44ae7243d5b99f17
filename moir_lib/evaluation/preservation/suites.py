"""The preservation suites (``paper``, ``pocket``: their tasks, metrics and ``S_p`` names) and a
checked request (:func:`plan_suite`, its data files checked record by record), made before any model
work.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moir_lib.evaluation.preservation.data_files import _check_offline_files, benchmarks_root
from moir_lib.evaluation.preservation.file_checks import check_paper_files, pocket_task_files
from moir_lib.evaluation.scores import PAPER_PRESERVATION_TASKS


@dataclass(frozen=True)
class SuiteTask:
    """One benchmark of a suite: our key, its ``S_p`` name, the lm-eval task, the headline metric."""

    key: str  # our name and the lm-eval task (or group) name; "humaneval" runs in the sandbox
    label: str | None  # name in S_p (scores.PAPER_PRESERVATION_TASKS for the paper); None: reported only
    metric: str  # lm-eval metric name, e.g. "acc_norm"
    filter: str = "none"  # lm-eval filter name, e.g. "strict-match"

    @property
    def metric_key(self) -> str:
        """lm-eval's results key, e.g. ``"exact_match,strict-match"``."""
        return f"{self.metric},{self.filter}"


#: The paper's suite (table "metric_desc"), in the order of eq. (sp).
PAPER_TASKS: tuple[SuiteTask, ...] = (
    SuiteTask("mmlu", "MMLU", "acc"),
    SuiteTask("gsm8k", "GSM8K", "exact_match", "strict-match"),
    SuiteTask("hellaswag", "HellaSwag", "acc_norm"),
    SuiteTask("winogrande", "WinoGrande", "acc"),
    SuiteTask("arc_challenge", "ARC-C", "acc_norm"),
    SuiteTask("humaneval", "HumanEval", "pass@1"),
)


assert tuple(t.label for t in PAPER_TASKS) == PAPER_PRESERVATION_TASKS


#: The pocket suite: the paper's analogues (in S_p) and the raw-format arithmetic (reported only).
POCKET_TASKS: tuple[SuiteTask, ...] = (
    SuiteTask("pocket_facts", "facts", "acc"),
    SuiteTask("pocket_arith", "arith", "exact_match", "strict-match"),
    SuiteTask("pocket_prose", "prose", "acc_norm"),
    SuiteTask("pocket_code", "code", "pass@1"),
    SuiteTask("pocket_arith_raw", None, "exact_match", "strict-match"),
)


SUITES: dict[str, tuple[SuiteTask, ...]] = {"paper": PAPER_TASKS, "pocket": POCKET_TASKS}


@dataclass(frozen=True)
class SuitePlan:
    """A validated request: suite, tasks, where the data comes from; made before any model work."""

    suite: str
    tasks: tuple[SuiteTask, ...]
    data_dir: Path | None
    files: dict[str, Any]
    limit: int | None
    needs_code_execution: bool
    offset: int = 0  # the first document scored of each task (the documents [offset, offset + limit))

    @property
    def complete(self) -> bool:
        """Every task of the suite's ``S_p`` is planned."""
        wanted = {t.key for t in SUITES[self.suite] if t.label}
        return wanted <= {t.key for t in self.tasks}


def plan_suite(suite: str, tasks: Sequence[str] | None = None, *,
               data_dir: str | os.PathLike[str] | None = None, limit: int | None = None, offset: int = 0,
               allow_code_eval: bool | None = None) -> SuitePlan:
    """Check a request and resolve its tasks and files, cheaply (no model, no lm-eval index).

    Raises ``ValueError`` (unknown suite/task, bad limit or offset, ``data_dir`` with the pocket suite; a data
    file or pocket task YAML that cannot be evaluated:
    :class:`~moir_lib.evaluation.preservation.file_checks.BenchmarkFileError`, naming file and line),
    ``FileNotFoundError`` (data files missing) or
    :class:`~moir_lib.evaluation.humaneval.CodeExecutionNotAllowed` (HumanEval without the
    opt-in).
    """
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}: choose {' or '.join(SUITES)}")
    by_key = {t.key: t for t in SUITES[suite]}
    if tasks:
        unknown = [t for t in tasks if t not in by_key]
        if unknown:
            raise ValueError(f"unknown {suite} task(s) {unknown}: choose from {', '.join(by_key)}")
        chosen = tuple(by_key[t] for t in by_key if t in set(tasks))
    else:
        chosen = SUITES[suite]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer (documents per task), got {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
    if offset and limit is None:
        raise ValueError(f"offset={offset} needs a limit: the documents [offset, offset + limit) are scored")
    files: dict[str, Any] = {}
    root = None
    if data_dir is not None:
        if suite != "paper":
            raise ValueError("data_dir applies to the paper suite only (the pocket suite builds its own "
                             "data)")
        root = benchmarks_root(data_dir)
        files = _check_offline_files(root, [t.key for t in chosen])
        check_paper_files(files)
    elif suite == "pocket":
        from moir_lib.pocket.benchmarks import TASKS_DIR

        pocket_task_files(TASKS_DIR, [t.key for t in chosen])
    needs_code = suite == "paper" and any(t.key == "humaneval" for t in chosen)
    if needs_code:
        from moir_lib.evaluation.humaneval import check_code_eval_allowed

        check_code_eval_allowed(allow_code_eval)
    return SuitePlan(suite, chosen, root, files, limit, needs_code, offset)
