"""How a preservation suite is run: :class:`PreservationSettings` (the request, lm-eval's settings and
HumanEval's), what :func:`~moir_lib.evaluation.preservation.evaluate_preservation` takes whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moir_lib.evaluation.humaneval.sampling_settings import PAPER_HUMANEVAL, HumanEvalSettings


@dataclass(frozen=True)
class PreservationSettings:
    """A preservation run (:func:`~moir_lib.evaluation.preservation.evaluate_preservation`).

    ``suite``: ``"paper"`` or ``"pocket"``; ``tasks``: a subset of the suite's keys (:data:`PAPER_TASKS`,
    :data:`POCKET_TASKS`; then ``S_p`` is ``None`` unless every constituent runs). ``data_dir``:
    original-format benchmark files instead of the hub (:func:`offline_task_configs`). ``limit``:
    documents (problems) per task, for smoke runs, from ``offset`` on (``[offset, offset + limit)`` of
    each task, MMLU's subjects each: lm-eval's ``samples``). ``allow_code_eval``: HumanEval's opt-in.
    ``batch_size``/``max_length``/``gen_kwargs``/``num_fewshot``/``apply_chat_template``/``add_bos_token``
    go to lm-eval unchanged (defaults: the built-in task settings; a change is recorded and should be
    reported). ``cache_dir``: keep lm-eval's request cache there, in a file keyed by the model fingerprint
    (default: no cache). ``humaneval``: the HumanEval settings (default: the paper's; a change of
    theirs is warned about).
    """

    suite: str = "paper"
    tasks: Sequence[str] | None = None
    data_dir: str | os.PathLike[str] | None = None
    limit: int | None = None
    offset: int = 0
    allow_code_eval: bool | None = None
    batch_size: int | str = 16
    max_length: int | None = None
    gen_kwargs: Mapping[str, Any] | None = None
    num_fewshot: int | None = None
    apply_chat_template: bool = False
    add_bos_token: bool | None = None
    cache_dir: str | os.PathLike[str] | None = None
    humaneval: HumanEvalSettings = PAPER_HUMANEVAL
