"""Real-format editing data: CounterFact (ROME and EasyEdit formats) and ROME's knowns.

CounterFact (Meng et al., 2022) is the edit set of every experiment (appendix C.1); the
paper scores it with both the ROME/MEMIT and the EasyEdit conventions (appendix C.3). Both
file formats map to one typed record, :class:`CounterFactRecord`, with the prompt in ROME's
form (``"{} is located in"``, the subject in place of ``{}``):

* **ROME** (``counterfact.json``; also what ``moir_lib.pocket`` exports): ``case_id``,
  ``requested_rewrite{prompt, subject, relation_id, target_new{str,id}, target_true{str,id}}``,
  ``paraphrase_prompts``, ``neighborhood_prompts``, ``attribute_prompts``,
  ``generation_prompts``. Neighbourhood prompts are answered by ``target_true``. The pocket
  world adds ``neighborhood_subjects`` (the subject of each neighbourhood prompt), which lets
  NS skip the neighbours that are edited themselves (:func:`~moir_lib.evaluation.counterfact.
  evaluate_counterfact`); real CounterFact files have no such field.
* **EasyEdit / MEND flat** (``counterfact-{train,val}.json``): ``case_id``, ``prompt`` (subject
  filled in), ``subject``, ``target_new``, ``ground_truth``, ``rephrase_prompt``,
  ``locality_prompt``, ``locality_ground_truth``; KnowEdit's ``portability`` and ``locality``
  blocks are kept as they are.

ROME's ``known_1000.json`` (facts the model knows, for causal tracing, appendix C.4) loads
with :func:`load_knowns`. Every loader reports a malformed record by index and field, e.g.
``ValueError("record 17: missing field 'requested_rewrite.target_new'")``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CounterFactRecord",
    "KnownRecord",
    "detect_format",
    "load_counterfact",
    "load_knowns",
    "read_records",
]

log = logging.getLogger(__name__)

Format = Literal["rome", "easyedit"]
_MISSING = object()


@dataclass(frozen=True)
class CounterFactRecord:
    """One CounterFact edit request with its evaluation prompts (either source format).

    ``prompt`` contains ``{}`` exactly once, where ``subject`` goes. Targets carry no
    leading space (add it when tokenising, as ROME does). ``neighborhood_targets`` is
    aligned with ``neighborhood_prompts``: the true object in the ROME format, the
    ``locality_ground_truth`` in the EasyEdit format. ``neighborhood_subjects``: aligned too
    where the file names them (pocket), else empty.
    """

    case_id: int
    subject: str
    prompt: str
    relation_id: str | None
    target_new: str
    target_true: str | None
    paraphrase_prompts: tuple[str, ...]
    neighborhood_prompts: tuple[str, ...]
    neighborhood_targets: tuple[str, ...]
    attribute_prompts: tuple[str, ...] = ()
    generation_prompts: tuple[str, ...] = ()
    portability: Any = field(default=None, compare=False)
    locality: Any = field(default=None, compare=False)
    target_new_id: str | None = None
    target_true_id: str | None = None
    pararel_idx: int | None = None
    source_format: Format = "rome"
    neighborhood_subjects: tuple[str, ...] = ()

    @property
    def filled_prompt(self) -> str:
        """The prompt with the subject in place, e.g. ``"Angola is located in"``."""
        return self.prompt.replace("{}", self.subject, 1)

    def to_request(self) -> dict[str, Any]:
        """The edit request in the form ROME/MEMIT/AlphaEdit code consumes."""
        request: dict[str, Any] = {
            "case_id": self.case_id,
            "prompt": self.prompt,
            "subject": self.subject,
            "target_new": {"str": self.target_new},
        }
        if self.target_true is not None:
            request["target_true"] = {"str": self.target_true}
        return request

    def to_rome(self) -> dict[str, Any]:
        """The record in ROME's CounterFact format (round-trips through :func:`load_counterfact`)."""
        rewrite: dict[str, Any] = {
            "prompt": self.prompt,
            "relation_id": self.relation_id,
            "target_new": {"str": self.target_new, "id": self.target_new_id},
            "target_true": {"str": self.target_true, "id": self.target_true_id},
            "subject": self.subject,
        }
        record: dict[str, Any] = {"case_id": self.case_id}
        if self.pararel_idx is not None:
            record["pararel_idx"] = self.pararel_idx
        subjects = list(self.neighborhood_subjects)
        named = {"neighborhood_subjects": subjects} if subjects else {}
        record.update({
            "requested_rewrite": rewrite,
            "paraphrase_prompts": list(self.paraphrase_prompts),
            "neighborhood_prompts": list(self.neighborhood_prompts),
            **named,
            "attribute_prompts": list(self.attribute_prompts),
            "generation_prompts": list(self.generation_prompts),
        })
        return record


@dataclass(frozen=True)
class KnownRecord:
    """One fact of ROME's ``known_1000.json`` (used for causal tracing, appendix C.4)."""

    known_id: int
    subject: str
    attribute: str
    template: str
    prompt: str
    relation_id: str | None
    prediction: str | None = None


# ----------------------------------------------------------------------------- reading


def read_records(path: str | os.PathLike[str]) -> list[Any]:
    """A JSON array (``.json``) or JSON-lines (``.jsonl``) file as a list of raw records."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such data file: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}): save it as "
                         f"UTF-8") from None
    try:
        if path.suffix == ".jsonl":
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
    except json.JSONDecodeError as exc:
        kind = "JSON lines" if path.suffix == ".jsonl" else "JSON (name JSON-lines files *.jsonl)"
        raise ValueError(f"{path}: not valid {kind}: {exc}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of records, got {type(data).__name__}")
    return data


def detect_format(record: Any, index: int = 0) -> Format:
    """``"rome"`` when the record has ``requested_rewrite``, ``"easyedit"`` when it has a flat
    ``prompt`` and ``target_new``; ``ValueError`` otherwise."""
    if isinstance(record, Mapping):
        if "requested_rewrite" in record:
            return "rome"
        if "prompt" in record and "target_new" in record:
            return "easyedit"
        keys = ", ".join(map(str, record))
    else:
        keys = f"(not an object: {type(record).__name__})"
    raise ValueError(
        f"record {index}: neither the ROME CounterFact format (requested_rewrite, paraphrase_prompts, "
        f"neighborhood_prompts, ...) nor the EasyEdit flat format (prompt, subject, target_new, "
        f"ground_truth, ...); its keys: {keys}"
    )


def load_counterfact(path: str | os.PathLike[str], format: Literal["auto", "rome", "easyedit"] = "auto",
                     limit: int | None = None) -> list[CounterFactRecord]:
    """Read CounterFact records from a ROME-format or EasyEdit-format file (JSON or JSONL).

    ``format="auto"`` detects it from the first record; every record must then match it.
    ``limit`` keeps the first records only. Raises ``ValueError`` naming the record index
    and the field for a malformed record, a subject missing from its prompt or from one of its
    paraphrases (a neighbourhood prompt from its named subject), or a repeated ``case_id``.
    """
    raw = read_records(path)
    if limit is not None:
        raw = raw[:limit]
    if not raw:
        raise ValueError(f"{path}: no records")
    fmt = detect_format(raw[0]) if format == "auto" else format
    if fmt not in ("rome", "easyedit"):
        raise ValueError(f"unknown format {format!r}: use 'auto', 'rome' or 'easyedit'")
    parse = _parse_rome if fmt == "rome" else _parse_easyedit
    records = [parse(rec, i) for i, rec in enumerate(raw)]
    seen: dict[int, int] = {}
    for i, rec in enumerate(records):
        if rec.case_id in seen:
            raise ValueError(f"record {i}: case_id {rec.case_id} repeats record {seen[rec.case_id]}")
        seen[rec.case_id] = i
        if rec.target_new.strip() == rec.target_true.strip():
            raise ValueError(f"record {i} (case_id {rec.case_id}): target_new equals target_true "
                             f"({rec.target_new!r}): it asks for no change")
    log.info("loaded %d CounterFact records (%s format) from %s", len(records), fmt, path)
    return records


def check_distinct_facts(records: Sequence[CounterFactRecord], source: str = "the records") -> None:
    """``ValueError`` naming two records of ``records`` that ask for the same rewrite (subject, prompt,
    new target) under different case ids: edited together they count one fact several times."""
    facts: dict[tuple[str, str, str], CounterFactRecord] = {}
    for rec in records:
        fact = (rec.subject.strip(), rec.prompt.strip(), rec.target_new.strip())
        if fact in facts:
            raise ValueError(f"{source}: case_id {rec.case_id} repeats the rewrite of case_id "
                             f"{facts[fact].case_id} (subject {rec.subject!r}, target {rec.target_new!r}): "
                             f"keep each fact once")
        facts[fact] = rec


def load_knowns(path: str | os.PathLike[str], limit: int | None = None) -> list[KnownRecord]:
    """Read ROME's ``known_1000.json`` (known_id, subject, attribute, template, prediction,
    prompt, relation_id); the subject must occur in the prompt and ``{}`` in the template."""
    raw = read_records(path)
    if limit is not None:
        raw = raw[:limit]
    knowns = []
    for i, rec in enumerate(raw):
        r = _Fields(rec, i)
        known = KnownRecord(
            known_id=r.integer("known_id"),
            subject=r.text("subject"),
            attribute=r.text("attribute"),
            template=r.text("template"),
            prompt=r.text("prompt"),
            relation_id=r.opt_text("relation_id"),
            prediction=r.opt_text("prediction"),
        )
        if "{}" not in known.template:
            raise ValueError(f"record {i}: field 'template' has no '{{}}' placeholder: {known.template!r}")
        if known.subject not in known.prompt:
            raise ValueError(f"record {i}: subject {known.subject!r} does not occur in prompt "
                             f"{known.prompt!r}")
        knowns.append(known)
    log.info("loaded %d known facts from %s", len(knowns), path)
    return knowns


# ----------------------------------------------------------------------------- parsing


class _Fields:
    """Typed access to one raw record, with errors naming the record index and dotted field."""

    def __init__(self, record: Any, index: int) -> None:
        if not isinstance(record, Mapping):
            raise ValueError(f"record {index}: expected an object, got {type(record).__name__}")
        self.record = record
        self.index = index

    def get(self, dotted: str, default: Any = _MISSING) -> Any:
        value: Any = self.record
        parts = dotted.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(value, Mapping):
                where = ".".join(parts[:depth])
                raise ValueError(f"record {self.index}: field {where!r} must be an object, "
                                 f"got {type(value).__name__}")
            if part not in value or value[part] is None:
                if default is _MISSING:
                    raise ValueError(f"record {self.index}: missing field {'.'.join(parts[:depth + 1])!r}")
                return default
            value = value[part]
        return value

    def fail(self, dotted: str, what: str, value: Any) -> ValueError:
        return ValueError(f"record {self.index}: field {dotted!r} must be {what}, got {value!r}")

    def text(self, dotted: str) -> str:
        value = self.get(dotted)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(dotted, "a non-empty string", value)
        return value

    def opt_text(self, dotted: str) -> str | None:
        value = self.get(dotted, None)
        if value is not None and not isinstance(value, str):
            raise self.fail(dotted, "a string", value)
        return value

    def integer(self, dotted: str, default: Any = _MISSING) -> int:
        value = self.get(dotted, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(dotted, "an integer", value)
        return value

    def texts(self, dotted: str, default: Any = _MISSING) -> tuple[str, ...]:
        """A list of strings; a single string counts as a list of one (EasyEdit)."""
        value = self.get(dotted, default)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
            raise self.fail(dotted, "a list of strings", value)
        return tuple(value)

    def target(self, dotted: str) -> tuple[str, str | None]:
        """ROME's ``{"str": ..., "id": ...}`` (a bare string is accepted too)."""
        value = self.get(dotted)
        if isinstance(value, str):
            return self.text(dotted), None
        return self.text(f"{dotted}.str"), self.opt_text(f"{dotted}.id")


def _check_subject(i: int, case_id: Any, subject: str, prompt: str, fmt: Format) -> None:
    """``ValueError`` naming the record, the subject and the prompt when the subject has no place in it.

    ROME prompts hold ``{}`` exactly once where the subject goes (the code fills it in with
    ``prompt.replace("{}", subject, 1)``); EasyEdit prompts hold the subject written out. Either way the
    edit's key is read at the subject's last token, so a prompt without the subject edits nothing.
    """
    if "{}" in subject:
        raise ValueError(f"record {i}: subject {subject!r} (case_id {case_id}) holds the placeholder '{{}}': "
                         f"write the subject itself")
    if fmt == "easyedit":
        if subject not in prompt:
            raise ValueError(f"record {i}: subject {subject!r} does not occur in prompt {prompt!r} (case_id "
                             f"{case_id}): the EasyEdit format writes the subject out in the prompt; correct "
                             f"the subject or the prompt")
        return
    holes = prompt.count("{}")
    if holes == 1:
        return
    head = (f"record {i}: field 'requested_rewrite.prompt' must contain the subject placeholder '{{}}' "
            f"exactly once, got {prompt!r}")
    who = f"subject {subject!r} (case_id {case_id})"
    if holes > 1:
        raise ValueError(f"{head} with {holes} for {who}: keep one, where the subject goes")
    if subject in prompt:
        raise ValueError(f"{head}, which writes {who} out: the ROME format puts '{{}}' in its place, e.g. "
                         f"{prompt.replace(subject, '{}', 1)!r}")
    raise ValueError(f"{head}: {who} does not occur in it, so the edit would read no key of it; put '{{}}' "
                     f"where the subject goes")


def _check_named(i: int, case_id: Any, field: str, prompts: tuple[str, ...], subjects: tuple[str, ...],
                 why: str) -> None:
    """``ValueError`` naming the record and the field when a prompt of ``prompts`` does not write out its
    subject (``subjects``: one for all, or one per prompt): ``why`` says what the prompt would then score."""
    for k, prompt in enumerate(prompts):
        subject = subjects[k if len(subjects) > 1 else 0]
        if subject not in prompt:
            raise ValueError(f"record {i} (case_id {case_id}): field '{field}[{k}]' does not name its "
                             f"subject {subject!r}: got {prompt!r}; {why}: correct the prompt or the subject")


def _parse_rome(rec: Any, i: int) -> CounterFactRecord:
    r = _Fields(rec, i)
    prompt = r.text("requested_rewrite.prompt")
    subject = r.text("requested_rewrite.subject")
    _check_subject(i, r.get("case_id", "missing"), subject, prompt, "rome")
    target_new, target_new_id = r.target("requested_rewrite.target_new")
    target_true, target_true_id = r.target("requested_rewrite.target_true")
    neighborhood = r.texts("neighborhood_prompts")
    neighbours = r.texts("neighborhood_subjects", ())
    if neighbours and len(neighbours) != len(neighborhood):
        raise ValueError(f"record {i}: {len(neighbours)} neighborhood_subjects for {len(neighborhood)} "
                         f"neighborhood_prompts")
    case_id = r.get("case_id", "missing")
    paraphrases = r.texts("paraphrase_prompts")
    _check_named(i, case_id, "paraphrase_prompts", paraphrases, (subject,),
                 "PS would score the edit on a prompt about another subject")
    _check_named(i, case_id, "neighborhood_prompts", neighborhood if neighbours else (), neighbours,
                 "NS would skip or keep the wrong neighbours (neighborhood_subjects names each prompt's)")
    pararel = r.get("pararel_idx", None)
    return CounterFactRecord(
        case_id=r.integer("case_id"),
        subject=subject,
        prompt=prompt,
        relation_id=r.opt_text("requested_rewrite.relation_id"),
        target_new=target_new,
        target_true=target_true,
        paraphrase_prompts=paraphrases,
        neighborhood_prompts=neighborhood,
        neighborhood_targets=(target_true,) * len(neighborhood),
        attribute_prompts=r.texts("attribute_prompts", ()),
        generation_prompts=r.texts("generation_prompts", ()),
        target_new_id=target_new_id,
        target_true_id=target_true_id,
        pararel_idx=r.integer("pararel_idx") if pararel is not None else None,
        source_format="rome",
        neighborhood_subjects=neighbours,
    )


def _parse_easyedit(rec: Any, i: int) -> CounterFactRecord:
    r = _Fields(rec, i)
    filled = r.text("prompt")
    subject = r.text("subject")
    _check_subject(i, r.get("case_id", i), subject, filled, "easyedit")
    rephrased = r.texts("rephrase_prompt", ())
    _check_named(i, r.get("case_id", i), "rephrase_prompt", rephrased, (subject,),
                 "PS would score the edit on a prompt about another subject")
    neighborhood = r.texts("locality_prompt", ())
    targets = r.texts("locality_ground_truth", ())
    if len(targets) == 1 and len(neighborhood) > 1:
        targets = targets * len(neighborhood)
    if len(targets) != len(neighborhood):
        raise ValueError(f"record {i}: {len(neighborhood)} locality_prompt(s) but {len(targets)} "
                         f"locality_ground_truth(s)")
    return CounterFactRecord(
        case_id=r.integer("case_id", i),
        subject=subject,
        prompt=filled.replace(subject, "{}", 1),
        relation_id=r.opt_text("relation_id"),
        target_new=r.text("target_new"),
        target_true=r.text("ground_truth"),
        paraphrase_prompts=rephrased,
        neighborhood_prompts=neighborhood,
        neighborhood_targets=targets,
        portability=r.get("portability", None),
        locality=r.get("locality", None),
        source_format="easyedit",
    )
