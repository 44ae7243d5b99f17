"""The opt-in without which no model-written code runs.

Running generated code is dangerous, so nothing runs without an explicit opt-in, like
Hugging Face's ``HF_ALLOW_CODE_EVAL``: set ``MOIR_ALLOW_CODE_EVAL=1`` or pass
``allow_code_eval=True``; otherwise :class:`CodeExecutionNotAllowed` is raised before any
process starts.
"""

from __future__ import annotations

import os

#: Environment variable that opts in to executing model-written code (value must be ``1``).
ALLOW_ENV = "MOIR_ALLOW_CODE_EVAL"


class CodeExecutionNotAllowed(PermissionError):
    """Model-written code would run, but nobody opted in (``MOIR_ALLOW_CODE_EVAL=1``)."""


def code_eval_allowed(allow: bool | None = None) -> bool:
    """``allow`` when given, else whether ``MOIR_ALLOW_CODE_EVAL`` is ``"1"``."""
    if allow is not None:
        return bool(allow)
    return os.environ.get(ALLOW_ENV, "").strip() == "1"


def check_code_eval_allowed(allow: bool | None = None) -> None:
    """Raise :class:`CodeExecutionNotAllowed` unless code execution was opted in to."""
    if not code_eval_allowed(allow):
        raise CodeExecutionNotAllowed(
            "refusing to execute model-generated code: it may be destructive. Read the sandbox notes in "
            f"moir_lib/evaluation/humaneval/sandbox.py, then opt in with {ALLOW_ENV}=1 (or "
            "allow_code_eval=True, `moir eval --allow-code-eval`)"
        )
