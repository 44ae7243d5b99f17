"""``moir eval``: a preservation suite on a profile's model, written to a run directory.

``moir eval --profile P --suite pocket|paper [--tasks a,b] [--data-dir data/slices]
[--limit N] [--out DIR] [--allow-code-eval]`` checks every argument (profile, suite, tasks,
data files, the code-execution opt-in, the output directory) before the model is loaded,
then runs :func:`moir_lib.evaluation.preservation.evaluate_preservation` and writes
``summary.json`` (``headline`` = the suite summary with ``S_p``), ``preservation.parquet`` /
``preservation.csv`` (the tidy table), ``humaneval_records.jsonl`` and
``lm_eval_results.json`` into ``--out`` (default ``runs/eval/<profile>-<suite>/<timestamp>``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import logging
import sys
from pathlib import Path
from typing import Any

from moir_lib.cli.args import add_model_arguments, positive_int
from moir_lib.locks import writable_dir

__all__ = ["add_parser"]

log = logging.getLogger(__name__)

_SUITES = ("pocket", "paper")  # = preservation.SUITES, repeated so `moir --help` imports nothing heavy


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="preservation suite (lm-eval + HumanEval sandbox) on a profile's model; S_p (eq. (sp))",
        description="Score a profile's model on the pocket or the paper's preservation suite and write "
                    "summary.json and a tidy table. Arguments and data files are checked before the model "
                    "loads.")
    add_model_arguments(p)
    p.add_argument("--suite", required=True, choices=_SUITES,
                   help="pocket tasks or the paper's six benchmarks")
    p.add_argument("--tasks", help="comma-separated subset of the suite's tasks (S_p needs them all)")
    p.add_argument("--data-dir", help="paper suite only: original-format benchmark files "
                                      "(e.g. data/slices) instead of the Hugging Face hub")
    p.add_argument("--limit", type=positive_int, help="documents per task: a smoke run, marked as such")
    p.add_argument("--out", help="run directory (default runs/eval/<profile>-<suite>/<timestamp>)")
    p.add_argument("--batch-size", default="16", help="lm-eval batch size (an integer or 'auto')")
    p.add_argument("--allow-code-eval", action="store_true",
                   help="run model-written code (HumanEval) in the sandbox; same as MOIR_ALLOW_CODE_EVAL=1")
    p.add_argument("--max-gen-toks", type=positive_int, help="override lm-eval's max_gen_toks (recorded)")
    p.add_argument("--humaneval-max-new-tokens", type=positive_int,
                   help="override HumanEval's 512 (recorded)")
    p.add_argument("--num-fewshot", type=int, help="override every task's few-shot count (recorded)")
    p.add_argument("--chat-template", action="store_true", help="lm-eval's apply_chat_template")
    p.add_argument("--cache-dir", help="keep lm-eval's request cache here, keyed by the model fingerprint")
    p.set_defaults(func=_cmd_eval)


def _batch_size(text: str) -> int | str:
    if text == "auto" or text.startswith("auto:"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--batch-size: expected an integer or 'auto', got {text!r}") from None
    if value < 1:
        raise ValueError(f"--batch-size must be >= 1, got {value}")
    return value


def _out_dir(args: argparse.Namespace, profile_name: str) -> Path:
    if args.out:
        out = Path(args.out).expanduser()
    else:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / "eval" / f"{profile_name}-{args.suite}" / stamp
    return writable_dir(out, "--out")


def _check_built_pocket_data(profile: Any, plan: Any) -> None:
    """The pocket build's benchmark files, checked before the model loads when the build exists (a fresh
    build is checked after it is made, before lm-eval runs)."""
    from moir_lib.evaluation.preservation.file_checks import check_pocket_files, pocket_task_files
    from moir_lib.models import POCKET_SPECS
    from moir_lib.pocket.benchmarks import TASKS_DIR
    from moir_lib.pocket.build import provenance

    variant = POCKET_SPECS.get(profile.model)
    built = provenance(variant, organism=getattr(profile, "organism", 0)) if variant else None
    if built is not None:
        files = pocket_task_files(TASKS_DIR, [t.key for t in plan.tasks])
        check_pocket_files(built.entry / "benchmarks", files)


def _cmd_eval(args: argparse.Namespace) -> int:
    from moir_lib.evaluation.humaneval import CodeExecutionNotAllowed
    from moir_lib.evaluation.preservation import plan_suite
    from moir_lib.profiles import load_profile

    # ---- everything is checked before the model is loaded
    profile = load_profile(args.profile)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    allow = True if args.allow_code_eval else None
    try:
        plan = plan_suite(args.suite, tasks, data_dir=args.data_dir, limit=args.limit, allow_code_eval=allow)
    except CodeExecutionNotAllowed as exc:
        raise ValueError(str(exc)) from None
    if plan.suite == "pocket":
        _check_built_pocket_data(profile, plan)
    batch_size = _batch_size(args.batch_size)
    out = _out_dir(args, profile.name)
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise ValueError(f"--num-fewshot must be >= 0, got {args.num_fewshot}")

    from moir_lib.evaluation.humaneval import PAPER_HUMANEVAL, HumanEvalSettings
    from moir_lib.evaluation.preservation import PreservationSettings, evaluate_preservation
    from moir_lib.models import load

    log.info("moir eval: %s suite (%s) on %s -> %s", plan.suite, ", ".join(t.key for t in plan.tasks),
             profile.model, out)
    model, tokenizer, _ = load(profile, device=args.device)
    gen_kwargs = {"max_gen_toks": args.max_gen_toks} if args.max_gen_toks else None
    humaneval = (HumanEvalSettings(max_new_tokens=args.humaneval_max_new_tokens)
                 if args.humaneval_max_new_tokens else PAPER_HUMANEVAL)
    settings = PreservationSettings(
        args.suite, tasks=tasks, data_dir=args.data_dir, limit=args.limit, allow_code_eval=allow,
        batch_size=batch_size, gen_kwargs=gen_kwargs, num_fewshot=args.num_fewshot,
        apply_chat_template=args.chat_template, cache_dir=args.cache_dir, humaneval=humaneval,
    )
    result = evaluate_preservation(model, tokenizer, settings)
    parameters = {"profile": profile.name, "model": profile.model, "suite": args.suite, "tasks": tasks,
                  "data_dir": args.data_dir, "limit": args.limit, "batch_size": batch_size,
                  "device": args.device, "max_gen_toks": args.max_gen_toks,
                  "humaneval_max_new_tokens": args.humaneval_max_new_tokens, "num_fewshot": args.num_fewshot,
                  "chat_template": args.chat_template, "cache_dir": args.cache_dir}
    summary_path = result.save(out, parameters)
    shown = result.table[["task", "metric", "filter", "value", "stderr", "n", "in_score"]]
    print(shown.to_string(index=False))
    s_p = result.summary["S_p"]
    flag = "  (LIMITED smoke run: not comparable with the paper)" if result.summary["limited"] else ""
    print(f"S_p = {s_p:.4f}{flag}" if s_p is not None else f"S_p not computed (partial suite){flag}")
    print(f"wrote {summary_path}", file=sys.stderr)
    return 0
