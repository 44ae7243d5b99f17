"""Benchmark files checked record by record before any model work.

A file cut off mid-record, a line that is not JSON, an empty file, a record without a field a task
reads, or an answer outside the record's choices is named by task, file, line, record (index and id)
and field, with what to do, before the model loads (instead of a `datasets` or lm-eval traceback
after it has). The paper suite's original-format files (:func:`check_paper_files`: JSON lines,
MMLU's header-less CSV, HumanEval's gzipped JSON lines) and the pocket suite's task YAMLs in
``data/tasks`` and the JSON-lines files of the pocket build they read (:func:`pocket_task_files`,
:func:`check_pocket_files`) go through the same checks.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class BenchmarkFileError(ValueError):
    """A benchmark file that cannot be evaluated (the message names the task, file, line and field)."""


Record = Mapping[str, Any]


def _label_in(labels: Callable[[Record], list[Any]], field: str) -> Callable[[Record], str | None]:
    """An answer check: ``record[field]`` must be one of ``labels(record)``."""
    def check(rec: Record) -> str | None:
        choices = labels(rec)
        return None if rec[field] in choices else (f"field {field!r} is {rec[field]!r}, not one of the "
                                                   f"choices {choices}")
    return check


def _index_in(choices: str, field: str) -> Callable[[Record], str | None]:
    """An answer check: ``record[field]`` must index ``record[choices]`` (an integer or its digits)."""
    def check(rec: Record) -> str | None:
        value, n = rec[field], len(rec[choices])
        ok = not isinstance(value, bool) and str(value).strip().isdigit() and int(value) < n
        return None if ok else f"field {field!r} is {value!r}, not an index of the {n} {choices} (0-{n - 1})"
    return check


def _arc_labels(rec: Record) -> list[Any]:
    question = rec["question"]
    if isinstance(question, Mapping):  # the original AI2 file: question{stem, choices[{text, label}]}
        return [c.get("label") for c in question.get("choices") or [] if isinstance(c, Mapping)]
    choices = rec.get("choices")  # the hub schema: choices{text, label}
    return list(choices.get("label") or []) if isinstance(choices, Mapping) else []


def _gsm8k_answer(rec: Record) -> str | None:
    return None if "####" in str(rec["answer"]) else "field 'answer' has no final '#### <number>'"


@dataclass(frozen=True)
class _Schema:
    """What a task reads of each record: required fields, the id field, and a check of its answer."""

    fields: tuple[str, ...]
    id_field: str | None = None
    lists: tuple[str, ...] = ()  # fields that must be non-empty lists
    answer: Callable[[Record], str | None] | None = None


SCHEMAS: dict[str, _Schema] = {
    "gsm8k": _Schema(("question", "answer"), answer=_gsm8k_answer),
    "arc_challenge": _Schema(("question", "answerKey"), "id", answer=_label_in(_arc_labels, "answerKey")),
    "hellaswag": _Schema(("activity_label", "ctx_a", "ctx_b", "endings", "label"), "ind", ("endings",),
                         _index_in("endings", "label")),
    "winogrande": _Schema(("sentence", "option1", "option2", "answer"), "qID",
                          answer=_label_in(lambda rec: ["1", "2"], "answer")),
    "humaneval": _Schema(("task_id", "prompt", "entry_point", "test"), "task_id"),
    "facts": _Schema(("prompt", "choices", "label"), "subject", ("choices",), _index_in("choices", "label")),
    "arith": _Schema(("question", "target")),
    "code": _Schema(("prompt", "test"), "task_id"),
    "prose": _Schema(("context", "choices", "label"), None, ("choices",), _index_in("choices", "label")),
}


def _open_lines(task: str, path: Path) -> list[bytes]:
    """The lines of ``path`` (gunzipped for ``.gz``), each with its newline."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (EOFError, OSError, zlib.error) as exc:
        raise BenchmarkFileError(f"{task}: {path}: not a complete gzip file ({exc}): the file is truncated "
                                 f"or damaged; copy it again from its source") from None
    return io.BytesIO(data).readlines()


def _json_rows(task: str, path: Path) -> Iterator[tuple[int, Record]]:
    """``(line number, row)`` of every non-blank line of a JSON-lines file."""
    lines = _open_lines(task, path)
    found = False
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if n == len(lines) and not line.endswith(b"\n"):
                raise BenchmarkFileError(f"{task}: {path}:{n}: the file ends in the middle of this record "
                                         f"(it is truncated): copy it again from its source") from None
            raise BenchmarkFileError(f"{task}: {path}:{n}: not a JSON record ({exc}): correct or delete "
                                     f"this line") from None
        if not isinstance(rec, Mapping):
            raise BenchmarkFileError(f"{task}: {path}:{n}: a JSON {type(rec).__name__}, not a record (an "
                                     f"object): correct or delete this line")
        found = True
        yield n, rec
    if not found:
        raise BenchmarkFileError(f"{task}: {path} holds no records (it is empty): copy it again from its "
                                 f"source")


def _check_record(task: str, schema: _Schema, path: Path, n: int, k: int, rec: Record) -> None:
    """``BenchmarkFileError`` naming line ``n`` (record ``k``) of ``path`` when ``schema`` does not hold."""
    ident = rec.get(schema.id_field) if schema.id_field else None
    where = f"{task}: {path}:{n}: record {k}{f' (id {ident!r})' if ident is not None else ''}"
    missing = [f for f in schema.fields if rec.get(f) is None]
    if missing:
        raise BenchmarkFileError(f"{where}: missing field {missing[0]!r} (the record has {sorted(rec)}): "
                                 f"correct or delete the record")
    for name in schema.lists:
        if not isinstance(rec[name], list) or not rec[name]:
            raise BenchmarkFileError(f"{where}: field {name!r} must be a non-empty list, got {rec[name]!r}")
    problem = schema.answer(rec) if schema.answer is not None else None
    if problem:
        raise BenchmarkFileError(f"{where}: {problem}: correct or delete the record")


def check_jsonl(task: str, schema_name: str, path: str | Path) -> None:
    """Check every record of a JSON-lines benchmark file against ``SCHEMAS[schema_name]``."""
    path, schema = Path(path), SCHEMAS[schema_name]
    for k, (n, rec) in enumerate(_json_rows(task, path)):
        _check_record(task, schema, path, n, k, rec)


_MMLU_ANSWERS = ("A", "B", "C", "D")


def check_mmlu_csv(task: str, path: str | Path) -> None:
    """Check MMLU's header-less CSV (question, A, B, C, D, answer letter), row by row."""
    path = Path(path)
    try:
        text = b"".join(_open_lines(task, path)).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BenchmarkFileError(f"{task}: {path}: not UTF-8 text ({exc.reason} at byte {exc.start}): save "
                                 f"it as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    k, start = -1, 1
    try:
        for k, row in enumerate(reader):
            where = f"{task}: {path}:{start}: row {k}"
            if len(row) != 6:
                raise BenchmarkFileError(f"{where} has {len(row)} fields, not 6 (question, A, B, C, D, "
                                         f"answer): correct or delete the row (a file cut off here: copy it "
                                         f"again from its source)")
            if row[5].strip().upper() not in _MMLU_ANSWERS:
                raise BenchmarkFileError(f"{where}: field 'answer' is {row[5]!r}, not one of A, B, C, D: "
                                         f"correct or delete the row")
            start = reader.line_num + 1
    except csv.Error as exc:
        raise BenchmarkFileError(f"{task}: {path}:{start}: not a CSV row ({exc}): the file is truncated or "
                                 f"damaged; copy it again from its source") from None
    if k < 0:
        raise BenchmarkFileError(f"{task}: {path} holds no rows (it is empty): copy it again from its source")


def check_paper_files(files: Mapping[str, Any]) -> None:
    """Check the original-format files of the paper suite (``{task: path}``; MMLU: ``{subject: [test,
    dev]}``), as :func:`~.data_files._check_offline_files` lists them."""
    for task, where in files.items():
        if task == "mmlu":
            for subject, paths in where.items():
                for path in filter(None, paths):
                    check_mmlu_csv(f"mmlu_{subject}", path)
        else:
            check_jsonl(task, task, where)


_DATASET = re.compile(r"^custom_dataset:\s*!function\s+utils\.load_(\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^include:\s*(\S+)\s*$", re.MULTILINE)
_TASK = re.compile(r"^task:\s*(\S+)\s*$", re.MULTILINE)


def _task_yaml(task: str, path: Path) -> str:
    """The text of a pocket task YAML that parses (lm-eval's ``!function`` tags read as strings)."""
    import yaml

    class Loader(yaml.SafeLoader):
        """Safe YAML plus lm-eval's ``!function`` tag."""

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    if not path.is_file():
        raise BenchmarkFileError(f"{task}: {path} is missing: restore data/tasks from the repository")
    text = path.read_text(encoding="utf-8")
    try:
        yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise BenchmarkFileError(f"{task}: {path}{line}: not valid YAML ({getattr(exc, 'problem', exc)}): "
                                 f"restore it from the repository") from None
    return text


def pocket_task_files(tasks_dir: Path, tasks: Sequence[str]) -> dict[str, str]:
    """``{task: data file name}`` of pocket tasks, read from their YAMLs in ``tasks_dir`` (following
    ``include``: ``custom_dataset: !function utils.load_<name>`` reads ``<name>.jsonl``, see
    ``data/tasks/utils.py``); ``BenchmarkFileError`` naming the YAML, and the line where it does not parse."""
    out = {}
    for task in tasks:
        path = tasks_dir / f"{task}.yaml"
        text = _task_yaml(task, path)
        named = _TASK.search(text)
        if named is None or named[1] != task:
            raise BenchmarkFileError(f"{task}: {path} does not define task {task!r}: restore it from the "
                                     f"repository")
        seen = {path}
        while (found := _DATASET.search(text)) is None:
            include = _INCLUDE.search(text)
            if include is None or path.parent / include[1] in seen:
                raise BenchmarkFileError(f"{task}: {path} names no custom_dataset (utils.load_<name>) and "
                                         f"includes no config that does: restore it from the repository")
            path = path.parent / include[1]
            seen.add(path)
            text = _task_yaml(task, path)
        out[task] = f"{found[1]}.jsonl"
    return out


def check_pocket_files(data_dir: str | Path, files: Mapping[str, str]) -> None:
    """Check the pocket build's JSON-lines files (``{task: file name}`` in ``data_dir``)."""
    for task, name in files.items():
        path = Path(data_dir) / name
        if not path.is_file():
            raise BenchmarkFileError(f"{task}: {path} is missing: rebuild the pocket model (`moir pocket "
                                     f"build --force` with its --variant)")
        check_jsonl(task, path.stem, path)
