"""Where the original-format benchmark files are (``data/slices/benchmarks``) and which file
each task of the paper suite reads; a missing file is named before any model work.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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
