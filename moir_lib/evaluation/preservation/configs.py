"""lm-eval task configurations: the built-in ones, and the same pointed at original-format files.

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

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moir_lib.evaluation.preservation.data_files import (
    _JSONL_FILES,
    _check_offline_files,
    _mmlu_files,
    _one_file,
    benchmarks_root,
)
from moir_lib.evaluation.preservation.schemas import (
    MMLU_CSV_COLUMNS,
    arc_docs,
    gsm8k_docs,
    hellaswag_docs,
    mmlu_docs,
    winogrande_docs,
)
from moir_lib.evaluation.preservation.suites import PAPER_TASKS


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


_MAPPERS: dict[str, Callable[[Any], Any]] = {
    "gsm8k": gsm8k_docs, "arc_challenge": arc_docs, "hellaswag": hellaswag_docs,
    "winogrande": winogrande_docs,
}


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


def _lm_eval_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"
