"""Running lm-eval on the in-memory model (``simple_evaluate`` on ``HFLM(pretrained=<model>)``) and
reading its output into tidy rows with their provenance.

The request cache, when asked for, is one file per model fingerprint, so differently edited
weights never share answers; the caller's Python, NumPy and torch RNG states are restored after
lm-eval reseeds them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from moir_lib.evaluation.preservation.configs import _task_manager, offline_task_configs
from moir_lib.evaluation.preservation.file_checks import check_pocket_files, pocket_task_files
from moir_lib.evaluation.preservation.suite_settings import PreservationSettings
from moir_lib.evaluation.preservation.suites import SuitePlan, SuiteTask


def _run_lm_eval(model: Any, tokenizer: Any, plan: SuitePlan, tasks: Sequence[SuiteTask],
                 settings: PreservationSettings, *, fingerprint: str, pocket_variant: str | None
                 ) -> dict[str, Any]:
    """lm-eval's ``simple_evaluate`` of ``tasks`` on the in-memory model under ``settings``' lm-eval
    fields (the request cache, when ``settings.cache_dir`` is set, keyed by ``fingerprint``)."""
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    keys = [t.key for t in tasks]
    add_bos_token = settings.add_bos_token
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
        organism = getattr(model.config, "pocket_organism", 0)  # every organism has the same data
        metadata = {"pocket_data": str(build(variant, organism=organism) / "benchmarks")}
        check_pocket_files(metadata["pocket_data"], pocket_task_files(TASKS_DIR, keys))
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
    if settings.cache_dir is not None:  # one file per weights: an edited model never reads another's answers
        cache_root = Path(settings.cache_dir).expanduser() / "lm_eval"
        cache_root.mkdir(parents=True, exist_ok=True)
        use_cache = str(cache_root / f"{plan.suite}-{fingerprint}")
    samples = offset_samples(manager, specs, plan.offset, plan.limit) if plan.offset else None
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=settings.batch_size,
              max_length=settings.max_length, add_bos_token=add_bos_token)
    with _caller_rng_preserved():  # simple_evaluate reseeds random/numpy/torch globally
        out = simple_evaluate(model=lm, tasks=specs, task_manager=manager,
                              limit=plan.limit if samples is None else None, samples=samples,
                              num_fewshot=settings.num_fewshot,
                              gen_kwargs=dict(settings.gen_kwargs) if settings.gen_kwargs else None,
                              use_cache=use_cache, cache_requests=False, log_samples=True,
                              bootstrap_iters=1000, apply_chat_template=settings.apply_chat_template)
    if out is None:
        raise RuntimeError("lm-eval returned no results")
    out = dict(out)
    out["moir_request_cache"] = use_cache
    if plan.suite == "pocket":
        out["moir_pocket_data"] = metadata.get("pocket_data")
    return out


def offset_samples(manager: Any, specs: Sequence[Any], offset: int, limit: int) -> dict[str, list[int]]:
    """lm-eval's ``samples``: the documents ``[offset, offset + limit)`` of every task ``specs`` loads (a
    group's: each of its tasks, e.g. MMLU's subjects), fewer where a task ends before; ``ValueError`` when
    one has no document from ``offset`` on."""
    import warnings

    from lm_eval.tasks import get_task_dict

    with warnings.catch_warnings():  # deprecated in later 0.4 releases, the one loader every 0.4.x has
        warnings.simplefilter("ignore", DeprecationWarning)
        loaded = get_task_dict(list(specs), manager)
    out = {}
    for name, task in _leaf_tasks(loaded):
        n = len(task.eval_docs)
        if offset >= n:
            raise ValueError(f"offset {offset}: lm-eval task {name} has only {n} documents; lower the offset "
                             f"(the preservation items scored before it: pres_limit)")
        out[name] = list(range(offset, min(offset + limit, n)))
    return out


def _leaf_tasks(tree: Mapping[Any, Any]) -> Iterator[tuple[str, Any]]:
    """``(name, task)`` of every task of a (nested) task dict of lm-eval."""
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _leaf_tasks(value)
        else:
            yield getattr(getattr(value, "config", None), "task", None) or str(key), value


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


def _hub_source(raw: Mapping[str, Any], key: str) -> str | None:
    cfg = raw.get("configs", {}).get(key if key != "mmlu" else "mmlu_abstract_algebra", {})
    path = cfg.get("dataset_path")
    return f"{path}/{cfg.get('dataset_name')}" if path and cfg.get("dataset_name") else path


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, str):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
