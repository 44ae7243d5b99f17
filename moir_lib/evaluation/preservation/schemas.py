"""The original benchmark schemas mapped onto the hub schemas lm-eval's built-in prompts read.

ARC's nested ``question{stem, choices}`` becomes ``question, choices{text, label}``; MMLU's
header-less CSV with answer letters becomes ``question, subject, choices, answer`` (int);
HellaSwag, WinoGrande and GSM8K originals already carry the hub field names and are only
checked. Each mapper passes the hub schema through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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
