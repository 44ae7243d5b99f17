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
not comparable with the paper's.

**Offline real-format data** (``data_dir``): the same built-in configs, loaded through
lm-eval's ``TaskManager``, with only their data source replaced by the original-format files
of ``data/slices/benchmarks`` (:func:`offline_task_configs`): ``dataset_path`` ``json`` /
``csv`` with ``dataset_kwargs: {data_files: ...}``, the split names of those files, and a
``process_docs`` that maps each original schema onto the hub schema the built-in prompts
read (ARC's nested ``question{stem, choices}`` → ``question, choices{text, label}``; MMLU's
header-less CSV with answer letters → ``question, subject, choices, answer`` (int);
HellaSwag, WinoGrande and GSM8K originals already carry the hub field names and are only
checked). ``doc_to_text``/``doc_to_target``/``metric_list``/filters stay the built-in ones.
Where a file has no training split, few-shot examples come from the evaluated split with the
document itself excluded (lm-eval's rule; recorded as ``fewshot_split``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.evaluation.scores import PAPER_PRESERVATION_TASKS, Score, preservation_score
from moir_lib.files import atomic_write, write_json
from moir_lib.timings import timed

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from moir_lib.evaluation.humaneval import HumanEvalResult, SandboxConfig

__all__ = [
    "SUITES",
    "SuiteTask",
    "PAPER_TASKS",
    "POCKET_TASKS",
    "TABLE_COLUMNS",
    "PreservationResult",
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

log = logging.getLogger(__name__)


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

#: Columns of the tidy table (one row per task × metric × filter).
TABLE_COLUMNS: tuple[str, ...] = ("suite", "task", "metric", "filter", "value", "stderr", "n", "version",
                                  "in_score", "score_name", "limited", "model_fingerprint")

_HUMANEVAL_DEFAULTS = {"temperature": 0.2, "top_p": 0.95, "n": 1, "max_new_tokens": 512}


# ----------------------------------------------------------------------------- original schemas


def _require(dataset: Any, fields: Sequence[str], task: str, alternative: Sequence[str] = ()) -> None:
    cols = list(dataset.column_names)
    missing = [f for f in fields if f not in cols]
    if missing:
        hint = f", or the hub schema ({', '.join(alternative)})" if alternative else ""
        raise ValueError(f"{task}: the data has columns {cols} but needs {', '.join(missing)} "
                         f"(the original file format{hint})")


def arc_docs(dataset: Any) -> Any:
    """ARC: the original AI2 jsonl (``id, question{stem, choices[{text, label}]}, answerKey``) → hub schema.

    The hub ``allenai/ai2_arc`` schema (``id, question, choices{text, label}, answerKey``)
    passes through. Labels stay as they are (some items use ``1``-``4``; the built-in target
    ``choices.label.index(answerKey)`` handles both).
    """
    cols = dataset.column_names
    if "choices" in cols and "question" in cols and dataset.features["question"].dtype == "string":
        return dataset
    _require(dataset, ("question", "answerKey"), "arc_challenge", ("question", "choices", "answerKey"))

    def convert(doc: dict[str, Any]) -> dict[str, Any]:
        q = doc["question"]
        if not isinstance(q, Mapping) or "stem" not in q or "choices" not in q:
            raise ValueError(f"arc_challenge: record {doc.get('id')!r} has no question{{stem, choices}}")
        return {"id": doc.get("id", ""), "question": q["stem"],
                "choices": {"text": [c["text"] for c in q["choices"]],
                            "label": [c["label"] for c in q["choices"]]},
                "answerKey": doc["answerKey"]}

    return dataset.map(convert, remove_columns=cols)


MMLU_CSV_COLUMNS: tuple[str, ...] = ("question", "A", "B", "C", "D", "answer")


def mmlu_docs(dataset: Any, subject: str = "") -> Any:
    """MMLU: the original header-less CSV (question, A, B, C, D, answer letter) → ``cais/mmlu`` schema.

    Returns ``question, subject, choices[4], answer`` with the answer as an index 0-3; the hub
    schema passes through.
    """
    cols = dataset.column_names
    if {"question", "choices", "answer"} <= set(cols):
        return dataset
    _require(dataset, MMLU_CSV_COLUMNS, f"mmlu_{subject}", ("question", "subject", "choices", "answer"))

    def convert(doc: dict[str, Any]) -> dict[str, Any]:
        letter = str(doc["answer"]).strip().upper()
        if letter not in "ABCD" or len(letter) != 1:
            raise ValueError(f"mmlu_{subject}: answer {doc['answer']!r} is not one of A, B, C, D")
        return {"question": str(doc["question"]), "subject": subject,
                "choices": [str(doc[c]) for c in "ABCD"], "answer": "ABCD".index(letter)}

    return dataset.map(convert, remove_columns=cols)


def hellaswag_docs(dataset: Any) -> Any:
    """HellaSwag: the original jsonl has the hub fields; check them (the built-in process_docs follows)."""
    _require(dataset, ("activity_label", "ctx_a", "ctx_b", "endings", "label"), "hellaswag")
    return dataset


def winogrande_docs(dataset: Any) -> Any:
    """WinoGrande: the original dev jsonl has the hub fields (``sentence, option1, option2, answer``).

    Answers are made strings (``"1"``/``"2"``), as on the hub.
    """
    _require(dataset, ("sentence", "option1", "option2", "answer"), "winogrande")
    if dataset.features["answer"].dtype != "string":
        import datasets

        dataset = dataset.cast_column("answer", datasets.Value("string"))
    return dataset


def gsm8k_docs(dataset: Any) -> Any:
    """GSM8K: the original jsonl matches ``openai/gsm8k`` (``question``, ``answer`` ending in ``#### N``)."""
    _require(dataset, ("question", "answer"), "gsm8k")
    return dataset


@dataclass(frozen=True)
class _Chain:
    """``process_docs`` = our schema mapping, then the built-in one (if the built-in config has one)."""

    first: Callable[[Any], Any]
    then: Callable[[Any], Any] | None = None

    def __call__(self, dataset: Any) -> Any:
        dataset = self.first(dataset)
        return self.then(dataset) if self.then is not None else dataset

    def __str__(self) -> str:
        name = getattr(self.first, "__name__", None) or repr(self.first)
        then = f" then {getattr(self.then, '__module__', '')}.{getattr(self.then, '__name__', self.then)}" \
            if self.then else ""
        return f"moir_lib.evaluation.preservation.{name}{then}"


# ----------------------------------------------------------------------------- task configs


@functools.lru_cache(maxsize=1)
def _task_manager() -> Any:
    """lm-eval's index of built-in tasks (scanning it takes seconds; read-only, so shared)."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


def builtin_task_config(name: str, manager: Any = None) -> dict[str, Any]:
    """The full built-in config of lm-eval task ``name`` (includes merged, ``!function`` resolved)."""
    manager = manager or _task_manager()
    entry = manager.task_index.get(name)
    if entry is None:
        raise ValueError(f"lm-eval has no built-in task {name!r} (lm_eval {_lm_eval_version()})")
    yaml_path = entry["yaml_path"] if isinstance(entry, Mapping) else entry.yaml_path
    if not yaml_path or str(yaml_path) == "-1":
        raise ValueError(f"lm-eval task {name!r} is not defined by a YAML file")
    try:
        from lm_eval.tasks._yaml_loader import load_yaml

        cfg = load_yaml(yaml_path, resolve_func=True)
    except ImportError:  # lm-eval < 0.4.10
        from lm_eval import utils

        cfg = utils.load_yaml_config(yaml_path, mode="full")
    cfg = dict(cfg)
    for key in ("tag", "group", "task_list"):
        cfg.pop(key, None)
    cfg["metadata"] = {**(cfg.get("metadata") or {}), "builtin_config": str(yaml_path)}
    return cfg


def benchmarks_root(data_dir: str | os.PathLike[str]) -> Path:
    """``data_dir/benchmarks`` if it exists (``--data-dir data/slices``), else ``data_dir`` itself."""
    root = Path(data_dir).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"data directory not found: {root}")
    return root / "benchmarks" if (root / "benchmarks").is_dir() else root


# original-format file of each jsonl task: (folder, glob, split name in the built-in config)
_JSONL_FILES: dict[str, tuple[str, str, str]] = {
    "gsm8k": ("gsm8k", "test*.jsonl", "test"),
    "arc_challenge": ("arc_challenge", "ARC-Challenge-Test*.jsonl", "test"),
    "hellaswag": ("hellaswag", "val*.jsonl", "validation"),
    "winogrande": ("winogrande", "dev*.jsonl", "validation"),
}
_MAPPERS: dict[str, Callable[[Any], Any]] = {
    "gsm8k": gsm8k_docs, "arc_challenge": arc_docs, "hellaswag": hellaswag_docs,
    "winogrande": winogrande_docs,
}


def _one_file(folder: Path, pattern: str, task: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        what = "no file" if not found else f"{len(found)} files ({', '.join(p.name for p in found)})"
        raise FileNotFoundError(f"{task}: expected one {pattern} in {folder}, found {what}")
    return found[0]


def _mmlu_files(root: Path) -> list[tuple[str, Path, Path | None]]:
    tests = sorted((root / "mmlu" / "test").glob("*_test.csv"))
    if not tests:
        raise FileNotFoundError(f"mmlu: no <subject>_test.csv in {root / 'mmlu' / 'test'}")
    out = []
    for test in tests:
        subject = test.name.removesuffix("_test.csv")
        dev = root / "mmlu" / "dev" / f"{subject}_dev.csv"
        out.append((subject, test, dev if dev.is_file() else None))
    return out


def _check_offline_files(root: Path, keys: Sequence[str]) -> dict[str, Any]:
    """The files each task will read; raises ``FileNotFoundError`` naming what is missing."""
    files: dict[str, Any] = {}
    for key in keys:
        if key == "mmlu":
            files[key] = {s: [str(t), str(d) if d else None] for s, t, d in _mmlu_files(root)}
        elif key == "humaneval":
            files[key] = str(_one_file(root / "humaneval", "HumanEval*.jsonl*", key))
        else:
            folder, pattern, _ = _JSONL_FILES[key]
            files[key] = str(_one_file(root / folder, pattern, key))
    return files


def offline_task_configs(data_dir: str | os.PathLike[str], tasks: Sequence[str] | None = None,
                         manager: Any = None) -> dict[str, list[dict[str, Any]]]:
    """Built-in lm-eval configs of the paper's tasks, pointed at original-format files in ``data_dir``.

    Returns task key -> configs (one per MMLU subject found in ``mmlu/test``; one otherwise).
    Only the data source, the split names and ``process_docs`` change; the task names,
    versions, prompts, few-shot counts, filters and metrics are the built-in ones.
    """
    root = benchmarks_root(data_dir)
    keys = [k for k in (tasks or [t.key for t in PAPER_TASKS]) if k != "humaneval"]
    _check_offline_files(root, keys)
    manager = manager or _task_manager()
    out: dict[str, list[dict[str, Any]]] = {}
    for key in keys:
        if key == "mmlu":
            configs = []
            for subject, test, dev in _mmlu_files(root):
                base = builtin_task_config(f"mmlu_{subject}", manager)
                data_files = {"test": str(test)}
                if dev is not None:
                    data_files["dev"] = str(dev)
                mapper = functools.partial(mmlu_docs, subject=subject)
                functools.update_wrapper(mapper, mmlu_docs)
                configs.append(_derive(base, "csv", data_files, mapper, test_split="test",
                                       fewshot_split="dev" if dev is not None else "test",
                                       csv_columns=MMLU_CSV_COLUMNS))
            out[key] = configs
            continue
        folder, pattern, split = _JSONL_FILES[key]
        path = _one_file(root / folder, pattern, key)
        base = builtin_task_config(key, manager)
        splits = {"test_split": split if split == "test" else None,
                  "validation_split": split if split == "validation" else None}
        fewshot = split if int(base.get("num_fewshot") or 0) > 0 else None
        out[key] = [_derive(base, "json", {split: str(path)}, _MAPPERS[key], fewshot_split=fewshot, **splits)]
    return out


def _derive(base: dict[str, Any], builder: str, data_files: dict[str, str], mapper: Callable[[Any], Any], *,
            test_split: str | None = None, validation_split: str | None = None,
            fewshot_split: str | None = None,
            csv_columns: Sequence[str] | None = None) -> dict[str, Any]:
    cfg = dict(base)
    kwargs: dict[str, Any] = {"data_files": data_files}
    if csv_columns is not None:
        import datasets

        # header-less, every cell a string, and no pandas NA guessing ("None" is a valid MMLU choice)
        kwargs.update(column_names=list(csv_columns), na_filter=False,
                      features=datasets.Features({c: datasets.Value("string") for c in csv_columns}))
    cfg.update(dataset_path=builder, dataset_name=None, dataset_kwargs=kwargs, training_split=None,
               test_split=test_split, validation_split=validation_split, fewshot_split=fewshot_split,
               process_docs=_Chain(mapper, base.get("process_docs")))
    cfg["metadata"] = {**cfg.get("metadata", {}), "moir_offline_files": data_files}
    return cfg


# ----------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class SuitePlan:
    """A validated request: suite, tasks, where the data comes from; made before any model work."""

    suite: str
    tasks: tuple[SuiteTask, ...]
    data_dir: Path | None
    files: dict[str, Any]
    limit: int | None
    needs_code_execution: bool

    @property
    def complete(self) -> bool:
        """Every task of the suite's ``S_p`` is planned."""
        wanted = {t.key for t in SUITES[self.suite] if t.label}
        return wanted <= {t.key for t in self.tasks}


def plan_suite(suite: str, tasks: Sequence[str] | None = None, *,
               data_dir: str | os.PathLike[str] | None = None, limit: int | None = None,
               allow_code_eval: bool | None = None) -> SuitePlan:
    """Check a request and resolve its tasks and files, cheaply (no model, no lm-eval index).

    Raises ``ValueError`` (unknown suite/task, bad limit, ``data_dir`` with the pocket suite),
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
    files: dict[str, Any] = {}
    root = None
    if data_dir is not None:
        if suite != "paper":
            raise ValueError("data_dir applies to the paper suite only (the pocket suite builds its own "
                             "data)")
        root = benchmarks_root(data_dir)
        files = _check_offline_files(root, [t.key for t in chosen])
    needs_code = suite == "paper" and any(t.key == "humaneval" for t in chosen)
    if needs_code:
        from moir_lib.evaluation.humaneval import check_code_eval_allowed

        check_code_eval_allowed(allow_code_eval)
    return SuitePlan(suite, chosen, root, files, limit, needs_code)


# ----------------------------------------------------------------------------- results


@dataclass
class PreservationResult:
    """A tidy table (one row per task × metric × filter, :data:`TABLE_COLUMNS`) and a summary.

    ``summary``: ``suite``, ``S_p`` (``None`` when the suite ran only partly), ``scores``
    (S_p name -> value), ``limited``/``limit``, ``task_versions``, ``n``, ``git_hash``,
    ``model_fingerprint``, ``lm_eval_version``, settings and ``warnings``.
    """

    table: pd.DataFrame
    summary: dict[str, Any]
    score: Score | None = None
    humaneval: HumanEvalResult | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    items: pd.DataFrame | None = None  # one row per task item: ITEM_COLUMNS of _items

    def save(self, out_dir: str | os.PathLike[str], parameters: Mapping[str, Any] | None = None) -> Path:
        """``summary.json`` (via :func:`moir_lib.results.write_summary`), ``preservation.{parquet,csv}``,
        ``humaneval_records.jsonl`` and ``lm_eval_results.json`` in ``out_dir``; returns the summary path."""
        from moir_lib.results import _jsonable, undefined_as_none, write_summary

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "preservation.parquet", lambda p: self.table.to_parquet(p, index=False))
        atomic_write(out / "preservation.csv", lambda p: self.table.to_csv(p, index=False))
        if self.humaneval is not None:
            with (out / "humaneval_records.jsonl").open("w") as fh:
                for rec in self.humaneval.records:
                    fh.write(json.dumps(rec) + "\n")
        if self.raw:
            raw = _jsonable(undefined_as_none(self.raw))
            write_json(out / "lm_eval_results.json", raw, indent=1, default=str)
        return write_summary(out, "eval", undefined_as_none(self.summary), dict(parameters or {}))


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, str):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _lm_eval_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"


def _rows_for(task: str, metrics: Mapping[str, Any], n: int | None, version: Any) -> list[dict[str, Any]]:
    rows = []
    for key, value in metrics.items():
        if "," not in key or "_stderr" in key or key == "alias":
            continue
        metric, filt = key.split(",", 1)
        rows.append({"task": task, "metric": metric, "filter": filt, "value": _number(value),
                     "stderr": _number(metrics.get(f"{metric}_stderr,{filt}")), "n": n, "version": version})
    return rows


def _aggregate_mmlu(results: Mapping[str, Any], n_samples: Mapping[str, Any]) -> dict[str, Any]:
    """lm-eval's ``mmlu`` group aggregation (size-weighted mean, pooled stderr) over the subjects that ran."""
    from lm_eval.api.metrics import aggregate_subtask_metrics, pooled_sample_stderr

    subjects = sorted(k for k in results if k.startswith("mmlu_") and k in n_samples)
    accs = [float(results[s]["acc,none"]) for s in subjects]
    sizes = [int(n_samples[s]["effective"]) for s in subjects]
    stderrs = [_number(results[s].get("acc_stderr,none")) for s in subjects]
    out: dict[str, Any] = {"acc,none": aggregate_subtask_metrics(accs, sizes, weight_by_size=True)}
    out["acc_stderr,none"] = (float(pooled_sample_stderr(stderrs, sizes))
                              if all(s is not None for s in stderrs) and sum(sizes) > len(sizes) else None)
    return {"metrics": out, "n": sum(sizes), "subjects": subjects}


# ----------------------------------------------------------------------------- the runner


@timed("preservation")
def evaluate_preservation(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    suite: str = "paper",
    *,
    tasks: Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    limit: int | None = None,
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
    (:func:`offline_task_configs`). ``limit``: documents (problems) per task, for smoke runs.
    ``gen_kwargs``/``num_fewshot``/``apply_chat_template``/``max_length``/``add_bos_token`` go
    to lm-eval unchanged (defaults: the built-in task settings; a change is recorded and should
    be reported). ``humaneval``: overrides of the HumanEval settings (``temperature`` 0.2,
    ``top_p`` 0.95, ``n`` 1, ``max_new_tokens`` 512, ``batch_size``, ``seed``, ``workers``).
    ``cache_dir``: keep lm-eval's request cache there, in a file keyed by the model
    fingerprint (default: no cache). ``fingerprint``: the model's, if already computed.
    """
    plan = plan_suite(suite, tasks, data_dir=data_dir, limit=limit, allow_code_eval=allow_code_eval)
    from moir_lib.models import model_fingerprint

    start = time.perf_counter()
    warnings: list[str] = []
    if limit is not None:
        _warn(warnings, f"limit={limit}: a smoke run on the first {limit} documents per task; these numbers "
                        f"are not comparable with the paper's")
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
        he_result = _humaneval_rows(model, tokenizer, plan, humaneval, limit=limit, sandbox=sandbox,
                                    rows=rows, prov=prov, warnings=warnings)

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


#: Columns of :attr:`PreservationResult.items`: the task key, its ``S_p`` label (None: reported only), the
#: item id (``<lm-eval task>/<doc_id>``) and its headline score (0/1 for accuracy, exact match, pass@1).
ITEM_COLUMNS: tuple[str, ...] = ("task", "label", "item", "value")


def _items(plan: SuitePlan, samples: Mapping[str, Sequence[Mapping[str, Any]]],
           humaneval: HumanEvalResult | None) -> pd.DataFrame:
    """Per-item headline scores from lm-eval's logged samples (MMLU: every subject's items) and the
    HumanEval sandbox's records."""
    import pandas as pd

    rows = []
    for t in plan.tasks:
        if t.key == "humaneval":
            for i, rec in enumerate(humaneval.records if humaneval is not None else []):
                value = rec.get("passed", rec.get("pass@1"))
                rows.append({"task": t.key, "label": t.label, "item": f"humaneval/{rec.get('task_id', i)}",
                             "value": _number(value)})
            continue
        names = sorted(k for k in samples if k == t.key or (t.key == "mmlu" and k.startswith("mmlu_")))
        for name in names:
            for s in samples[name]:
                if s.get("filter") == t.filter and t.metric in s:
                    rows.append({"task": t.key, "label": t.label, "item": f"{name}/{s['doc_id']}",
                                 "value": _number(s[t.metric])})
    return pd.DataFrame(rows, columns=list(ITEM_COLUMNS))


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
                    humaneval: Mapping[str, Any] | None, *, limit: int | None, sandbox: SandboxConfig | None,
                    rows: list[dict[str, Any]], prov: dict[str, dict[str, Any]],
                    warnings: list[str]) -> HumanEvalResult:
    """Run HumanEval in the sandbox; append its pass@1 row to ``rows`` and its provenance to ``prov``."""
    from moir_lib.evaluation.humaneval import run_humaneval

    settings = {**_HUMANEVAL_DEFAULTS, **dict(humaneval or {})}
    if any(settings[k] != v for k, v in _HUMANEVAL_DEFAULTS.items()):
        changed = {k: settings[k] for k in _HUMANEVAL_DEFAULTS if settings[k] != _HUMANEVAL_DEFAULTS[k]}
        _warn(warnings, f"HumanEval settings differ from the paper's (T=0.2, top_p=0.95, n=1, 512 new "
                        f"tokens): {changed}")
    problems_src = plan.files.get("humaneval")
    he_result = run_humaneval(model, tokenizer, problems_src, limit=limit, sandbox=sandbox,
                              allow_code_eval=True, **settings)
    rows.append({"task": "humaneval", "metric": "pass@1", "filter": "none", "value": he_result.pass_at_1,
                 "stderr": he_result.stderr, "n": he_result.n_problems, "version": "moir-sandbox-1"})
    prov["versions"]["humaneval"] = "moir-sandbox-1"
    prov["n"]["humaneval"] = he_result.n_problems
    prov["sources"]["humaneval"] = problems_src or "openai/openai_humaneval"
    prov["num_fewshot"]["humaneval"] = 0
    return he_result


def _headline(plan: SuitePlan, rows: list[dict[str, Any]]) -> dict[str, float]:
    """The headline value per score label; marks each row's ``in_score`` and ``score_name``."""
    by_task = {t.key: t for t in plan.tasks}
    headline: dict[str, float] = {}
    for row in rows:
        t = by_task.get(row["task"])
        row["in_score"] = bool(t and t.label and (row["metric"], row["filter"]) == (t.metric, t.filter))
        row["score_name"] = t.label if row["in_score"] and t is not None else None
        if row["in_score"] and t is not None and t.label is not None:
            headline[t.label] = row["value"]
    return headline


def _suite_score(plan: SuitePlan, headline: dict[str, float]) -> Score | None:
    """``S_p`` (eq. (sp)) when the whole suite ran, else ``None``."""
    if plan.complete:
        expected = PAPER_PRESERVATION_TASKS if plan.suite == "paper" else None
        return preservation_score(headline, expected=expected)
    msg = f"S_p not computed: the {plan.suite} suite ran only {', '.join(t.key for t in plan.tasks)}"
    log.info(msg)
    return None


def _table(rows: list[dict[str, Any]], plan: SuitePlan, limit: int | None, fingerprint: str) -> pd.DataFrame:
    """The tidy result table (:data:`TABLE_COLUMNS`)."""
    import pandas as pd

    table = pd.DataFrame(rows)
    table["suite"] = plan.suite
    table["limited"] = limit is not None
    table["model_fingerprint"] = fingerprint
    table["version"] = table["version"].map(lambda v: None if v is None else str(v))
    return table[list(TABLE_COLUMNS)]


def _summary(plan: SuitePlan, score: Score | None, headline: dict[str, float], *, limit: int | None,
             prov: dict[str, dict[str, Any]], fingerprint: str, settings: dict[str, Any], warnings: list[str],
             start: float) -> dict[str, Any]:
    """The run's summary: ``S_p``, headline scores, provenance, settings, warnings and timing."""
    from moir_lib.results import git_hash

    return {
        "suite": plan.suite,
        "S_p": float(score) if score is not None else None,
        "scores": headline,
        "limited": limit is not None,
        "limit": limit,
        "tasks": [t.key for t in plan.tasks],
        "metrics": {t.key: t.metric_key for t in plan.tasks},
        "task_versions": prov["versions"],
        "n": prov["n"],
        "num_fewshot": prov["num_fewshot"],
        "sources": prov["sources"],
        "git_hash": git_hash(),
        "model_fingerprint": fingerprint,
        "lm_eval_version": _lm_eval_version(),
        "settings": settings,
        "warnings": warnings,
        "duration_s": round(time.perf_counter() - start, 2),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


_LM_EVAL_MAX_GEN_TOKS = 256  # HFLM's default when a task's generation_kwargs set none (GSM8K)


def _context_window(model: Any) -> int | None:
    """The model's context length as lm-eval reads it from the config (None if it declares none)."""
    config = getattr(model, "config", None)
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def lm_eval_rows(plan: SuitePlan, raw: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, dict]]:
    """Tidy rows and provenance (versions, n, sources, few-shot counts) from lm-eval's output.

    MMLU from the hub is lm-eval's ``mmlu`` group (its size-weighted aggregate); from original
    files it is the same aggregation over the subjects present (:func:`_aggregate_mmlu`). Either
    way the subject (and sub-group) rows are kept beside it.
    """
    results, n_samples = raw["results"], raw.get("n-samples", {})
    raw_versions, shots = raw.get("versions", {}), raw.get("n-shot", {})
    rows: list[dict[str, Any]] = []
    prov: dict[str, dict[str, Any]] = {"versions": {}, "n": {}, "sources": {}, "num_fewshot": {}}

    def n_of(name: str) -> int | None:
        return int(n_samples[name]["effective"]) if name in n_samples else None

    for t in plan.tasks:
        if t.key == "humaneval":
            continue
        if t.key == "mmlu":
            parts = sorted(k for k in results if k.startswith("mmlu_"))
            for part in parts:
                rows += _rows_for(part, results[part], n_of(part), raw_versions.get(part))
                prov["versions"][part] = raw_versions.get(part)
            subjects = [k for k in parts if k in n_samples]
            if not subjects:
                raise RuntimeError(f"lm-eval returned no MMLU subject results (got {sorted(results)})")
            if "mmlu" in results:  # the hub group
                metrics, version = results["mmlu"], raw_versions.get("mmlu")
            else:
                metrics = _aggregate_mmlu(results, n_samples)["metrics"]
                version = max(raw_versions.get(s, 0) for s in subjects)
            n = sum(n_of(s) or 0 for s in subjects)
            prov["num_fewshot"][t.key] = shots.get(subjects[0])
        else:
            if t.key not in results:
                raise RuntimeError(f"lm-eval returned no results for {t.key} (got {sorted(results)})")
            metrics, version, n = results[t.key], raw_versions.get(t.key), n_of(t.key)
            prov["num_fewshot"][t.key] = shots.get(t.key)
        if t.metric_key not in metrics:
            raise RuntimeError(f"lm-eval produced no {t.metric_key} for {t.key} (got "
                               f"{sorted(k for k in metrics if ',' in k)})")
        prov["versions"][t.key] = version
        prov["n"][t.key] = n
        prov["sources"][t.key] = plan.files.get(t.key) or _hub_source(raw, t.key)
        rows += _rows_for(t.key, metrics, n, version)
    return rows, prov


@contextlib.contextmanager
def _caller_rng_preserved() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's global RNG states afterwards (lm-eval seeds them all)."""
    import random

    import numpy as np
    import torch

    states = (random.getstate(), np.random.get_state())
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
        try:
            yield
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])


def _hub_source(raw: Mapping[str, Any], key: str) -> str | None:
    cfg = raw.get("configs", {}).get(key if key != "mmlu" else "mmlu_abstract_algebra", {})
    path = cfg.get("dataset_path")
    return f"{path}/{cfg.get('dataset_name')}" if path and cfg.get("dataset_name") else path


def _run_lm_eval(model: Any, tokenizer: Any, plan: SuitePlan, tasks: Sequence[SuiteTask], *,
                 batch_size: int | str, max_length: int | None, gen_kwargs: Mapping[str, Any] | None,
                 num_fewshot: int | None, apply_chat_template: bool, add_bos_token: bool | None,
                 cache_dir: str | os.PathLike[str] | None, fingerprint: str,
                 pocket_variant: str | None) -> dict[str, Any]:
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    keys = [t.key for t in tasks]
    metadata: dict[str, Any] = {}
    if plan.suite == "pocket":
        from lm_eval.tasks import TaskManager

        from moir_lib.pocket.benchmarks import TASKS, TASKS_DIR
        from moir_lib.pocket.build import build

        missing = [k for k in keys if k not in TASKS]
        if missing:
            raise ValueError(f"moir_lib.pocket.benchmarks.TASKS lacks {missing}")
        variant = pocket_variant or getattr(model.config, "pocket_variant", None)
        if variant is None:
            raise ValueError("the pocket suite needs the pocket variant: this model carries no "
                             "config.pocket_variant, so pass pocket_variant='pocket' or 'micro'")
        metadata = {"pocket_data": str(build(variant) / "benchmarks")}
        manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata)
        specs: list[Any] = keys
        if add_bos_token is None:
            add_bos_token = True  # trained with BOS; pocket.benchmarks.evaluate scores it so too
    else:
        manager = _task_manager()
        if plan.data_dir is not None:
            derived = offline_task_configs(plan.data_dir, keys, manager)
            specs = [cfg for k in keys for cfg in derived[k]]
        else:
            specs = keys

    use_cache = None
    if cache_dir is not None:  # one cache file per weights: an edited model never reads another's answers
        cache_root = Path(cache_dir).expanduser() / "lm_eval"
        cache_root.mkdir(parents=True, exist_ok=True)
        use_cache = str(cache_root / f"{plan.suite}-{fingerprint}")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length,
              add_bos_token=add_bos_token)
    with _caller_rng_preserved():  # simple_evaluate reseeds random/numpy/torch globally
        out = simple_evaluate(model=lm, tasks=specs, task_manager=manager, limit=plan.limit,
                              num_fewshot=num_fewshot, gen_kwargs=dict(gen_kwargs) if gen_kwargs else None,
                              use_cache=use_cache, cache_requests=False, log_samples=True,
                              bootstrap_iters=1000, apply_chat_template=apply_chat_template)
    if out is None:
        raise RuntimeError("lm-eval returned no results")
    out = dict(out)
    out["moir_request_cache"] = use_cache
    if plan.suite == "pocket":
        out["moir_pocket_data"] = metadata.get("pocket_data")
    return out

