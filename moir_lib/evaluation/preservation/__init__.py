"""Preservation suites through lm-eval on the in-memory model, and ``S_p`` (eq. (sp), appendix C.3).

Two suites, one runner (:func:`evaluate_preservation`):

* ``paper``: the paper's six benchmarks with the metrics of table "metric_desc": MMLU
  (``acc``), GSM8K (``exact_match`` under the ``strict-match`` filter), HellaSwag and
  ARC-Challenge (``acc_norm``), WinoGrande (``acc``), all through lm-eval's **built-in** task
  configurations (prompts, few-shot counts, filters and metrics exactly as installed), and
  HumanEval pass@1 with one sample per problem at ``temperature=0.2, top_p=0.95`` through the
  execution sandbox of :mod:`moir_lib.evaluation.humaneval` (opt-in required).
* ``pocket``: the pocket world's lm-eval tasks (``data/tasks/``, from
  :mod:`moir_lib.pocket.benchmarks`); ``S_p`` over the paper's analogues (facts ≈ MMLU,
  arithmetic ≈ GSM8K, code ≈ HumanEval, prose cloze ≈ HellaSwag); the raw-format arithmetic
  task is reported beside them but not counted (it measures the same skill in another format).

``S_p = HM(MMLU, GSM8K, HellaSwag, WinoGrande, ARC-C, HumanEval)`` (eq. (sp)) is
:func:`moir_lib.evaluation.scores.preservation_score`.

The model is scored as it is in memory (``HFLM(pretrained=<model>)``), so an edited model is
evaluated without saving it. lm-eval's request cache is never shared between differently
edited weights: by default it is off; with ``cache_dir`` the cache file is keyed by the model
fingerprint (:func:`moir_lib.models.model_fingerprint`). Every result records the task
versions, the git hash and the fingerprint. ``limit`` (documents per task) is for smoke runs:
the summary then says ``"limited": true`` and a warning is logged, because such numbers are
not comparable with the paper's. ``offset`` moves those documents past the first ones (another
sample of items from the same tasks, e.g. to select the editors' τ and λ on items no chapter scores).

One module per concept:

- :mod:`.suites`: the suites' tasks (:data:`PAPER_TASKS`, :data:`POCKET_TASKS`) and :func:`plan_suite`;
- :mod:`.suite_settings`: :class:`PreservationSettings`, what one run is asked to do;
- :mod:`.data_files`: the original-format benchmark files of ``data_dir`` (:func:`benchmarks_root`);
- :mod:`.schemas`: original schemas onto the hub schemas (:func:`arc_docs`, :func:`mmlu_docs` …);
- :mod:`.configs`: lm-eval's built-in task configs, offline ones (:func:`offline_task_configs`);
- :mod:`.harness`: running lm-eval and its tidy rows (:func:`lm_eval_rows`);
- :mod:`.summary`: :class:`PreservationResult`: table, ``S_p``, summary, per-item scores;
- :mod:`.evaluate_suite`: :func:`evaluate_preservation`.
"""

from moir_lib.evaluation.preservation.configs import builtin_task_config, offline_task_configs
from moir_lib.evaluation.preservation.data_files import benchmarks_root
from moir_lib.evaluation.preservation.evaluate_suite import PAPER_PRESERVATION, evaluate_preservation
from moir_lib.evaluation.preservation.harness import lm_eval_rows
from moir_lib.evaluation.preservation.schemas import (
    MMLU_CSV_COLUMNS,
    arc_docs,
    gsm8k_docs,
    hellaswag_docs,
    mmlu_docs,
    winogrande_docs,
)
from moir_lib.evaluation.preservation.suite_settings import PreservationSettings
from moir_lib.evaluation.preservation.suites import (
    PAPER_TASKS,
    POCKET_TASKS,
    SUITES,
    SuitePlan,
    SuiteTask,
    plan_suite,
)
from moir_lib.evaluation.preservation.summary import ITEM_COLUMNS, TABLE_COLUMNS, PreservationResult

__all__ = [
    "SUITES",
    "SuiteTask",
    "PAPER_TASKS",
    "POCKET_TASKS",
    "TABLE_COLUMNS",
    "ITEM_COLUMNS",
    "MMLU_CSV_COLUMNS",
    "PreservationResult",
    "PreservationSettings",
    "PAPER_PRESERVATION",
    "SuitePlan",
    "plan_suite",
    "benchmarks_root",
    "offline_task_configs",
    "builtin_task_config",
    "evaluate_preservation",
    "lm_eval_rows",
    "arc_docs",
    "mmlu_docs",
    "hellaswag_docs",
    "winogrande_docs",
    "gsm8k_docs",
]
