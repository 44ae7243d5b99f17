"""Portability probes: the pocket world's two-hop questions (``portability.json``) and the
EasyEdit/KnowEdit ``portability`` fields of records, as :class:`PortabilityProbe` s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moir_lib.data import CounterFactRecord


@dataclass(frozen=True)
class PortabilityProbe:
    """A portability question: ``prompt`` answered by any of ``targets``; ``kind`` e.g. ``"two_hop"``."""

    prompt: str
    targets: tuple[str, ...]
    kind: str = "portability"


def _answers(value: Any, where: str) -> tuple[str, ...]:
    """A ground truth as a tuple of acceptable answers (a string, or nested lists of aliases)."""
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if isinstance(value, Sequence):
        return tuple(a for v in value for a in _answers(v, where))
    raise ValueError(f"{where}: a portability answer must be a string or a list of strings, got {value!r}")


def _probe(raw: Any, kind: str, where: str) -> PortabilityProbe:
    if isinstance(raw, PortabilityProbe):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: a portability probe must be an object, got {type(raw).__name__}")
    prompt = raw.get("prompt", raw.get("New Question"))
    if "target_new" in raw and "ground_truth" not in raw:  # pocket two-hop probe: the edited answer
        answers, kind = _answers(raw["target_new"], where), "two_hop"
    else:
        answers = _answers(raw.get("ground_truth", raw.get("New Answer")), where)
    if not isinstance(prompt, str) or not prompt.strip() or not answers:
        raise ValueError(f"{where}: a portability probe needs a prompt and a non-empty answer "
                         f"(keys 'prompt' + 'ground_truth' or 'target_new'), got keys {sorted(raw)}")
    return PortabilityProbe(prompt, answers, kind)


def portability_probes(record: CounterFactRecord) -> list[PortabilityProbe]:
    """The EasyEdit/KnowEdit ``portability`` probes of a record (``[]`` when it has none).

    Accepted shapes: ``{"Subject_Aliasing": [{"prompt", "ground_truth"}], "reasoning": [...], ...}``
    (KnowEdit), a single ``{"prompt", "ground_truth"}`` or ``{"New Question", "New Answer"}``
    (EasyEdit ZsRE-style), or a list of such objects. Anything else raises ``ValueError``.
    """
    raw = record.portability
    where = f"case_id {record.case_id}: portability"
    if raw is None:
        return []
    if isinstance(raw, Mapping):
        if any(k in raw for k in ("prompt", "New Question")):
            return [_probe(raw, "portability", where)]
        probes = []
        for kind, items in raw.items():
            items = [items] if isinstance(items, Mapping) else items
            if not isinstance(items, Sequence) or isinstance(items, str):
                raise ValueError(f"{where}.{kind}: expected a list of probes, got {type(items).__name__}")
            probes += [_probe(item, str(kind), f"{where}.{kind}[{j}]") for j, item in enumerate(items)]
        return probes
    if isinstance(raw, Sequence) and not isinstance(raw, str):
        return [_probe(item, "portability", f"{where}[{j}]") for j, item in enumerate(raw)]
    raise ValueError(f"{where}: unrecognised portability field of type {type(raw).__name__}")


PortabilityArg = (str | os.PathLike[str] | Sequence[Mapping[str, Any]]
                  | Mapping[int, Sequence[PortabilityProbe | Mapping[str, Any]]] | None)


def load_portability(source: str | os.PathLike[str] | Sequence[Mapping[str, Any]]
                     ) -> dict[int, list[PortabilityProbe]]:
    """Portability probes by ``case_id`` from the pocket world's ``portability.json`` (or its list).

    Each pocket probe ``{"case_id", "prompt", "hops", "target_true", "target_new"}`` asks the
    two-hop question (person -> citizenship -> capital) of a rewrite; after the edit the
    correct answer is ``target_new`` (the new country's capital).
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no portability file at {path}")
        source = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(source, Sequence):
        raise ValueError(f"portability probes must be a list of objects, got {type(source).__name__}")
    by_case: dict[int, list[PortabilityProbe]] = {}
    for j, raw in enumerate(source):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("case_id"), int):
            raise ValueError(f"portability probe {j}: needs an integer 'case_id'")
        by_case.setdefault(raw["case_id"], []).append(_probe(raw, "two_hop", f"portability probe {j}"))
    return by_case


def _portability_map(portability: PortabilityArg) -> dict[int, list[PortabilityProbe]]:
    if portability is None:
        return {}
    if isinstance(portability, Mapping):
        return {int(case): [_probe(p, "portability", f"case_id {case}: portability probe {j}")
                            for j, p in enumerate(probes)] for case, probes in portability.items()}
    return load_portability(portability)
