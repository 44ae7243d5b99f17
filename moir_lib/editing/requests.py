"""Edit requests: what to rewrite, where its subject sits in the tokens, and which requests share a key.

MEMIT and AlphaEdit read a fact's key at the *last token of the subject* (ROME's
``subject_last`` strategy). This module

* normalises edit requests (:class:`EditRequest`: a CounterFact record, ROME's request dict,
  or the EasyEdit flat form with the subject filled in);
* locates the last subject token of a prompt robustly from the tokenizer's character offsets
  (:func:`locate_subject`), with exactly one leading BOS as :meth:`ModelAdapter.encode` does;
* tokenises the new target as a continuation of the prompt (:func:`target_token_ids`);
* groups requests whose keys coincide (:func:`group_requests`): the key at the last subject
  token depends only on the tokens up to it, so requests about one subject whose prompts put
  the same tokens before it (``"{} is located in"``, ``"{} is a citizen of"``) share one key.
  One key cannot be mapped to two different values, so each group gets one joint target
  (:mod:`moir_lib.editing.values`) and one column of ``K`` (:mod:`moir_lib.editing.keys`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from moir_lib.editing.templates import as_template_groups

if TYPE_CHECKING:
    from moir_lib.models import ModelAdapter

__all__ = [
    "EditRequest",
    "PromptSite",
    "RequestGroup",
    "as_request",
    "fill_template",
    "group_requests",
    "locate_subject",
    "normalise_requests",
    "target_token_ids",
]

log = logging.getLogger(__name__)

_ANCHOR = "a"



@dataclass(frozen=True)
class EditRequest:
    """One rewrite: ``prompt`` holds ``{}`` exactly once where ``subject`` goes.

    ``target_new`` carries no leading space (it is added when tokenising, as ROME does).
    """

    case_id: Any
    prompt: str
    subject: str
    target_new: str
    target_true: str | None = None

    @property
    def filled_prompt(self) -> str:
        return self.prompt.replace("{}", self.subject, 1)

    def describe(self) -> str:
        return f"request {self.case_id!r} ({self.filled_prompt!r} -> {self.target_new!r})"


def _target_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = value.get("str")
    return value if isinstance(value, str) else None


def as_request(obj: Any, index: int = 0) -> EditRequest:
    """An :class:`EditRequest` from a :class:`~moir_lib.data.CounterFactRecord`, ROME's request
    dict (``{"prompt", "subject", "target_new": {"str"}}``), a ROME CounterFact record
    (``requested_rewrite``) or an EasyEdit flat record (subject filled into ``prompt``).

    Raises ``ValueError`` naming the request when the subject does not occur in the prompt or
    a field is missing.
    """
    if isinstance(obj, EditRequest):
        req = obj
    else:
        if hasattr(obj, "to_request") and callable(obj.to_request):
            data = obj.to_request()
        elif isinstance(obj, Mapping) and "requested_rewrite" in obj:
            data = {**obj["requested_rewrite"], "case_id": obj.get("case_id", index)}
        elif isinstance(obj, Mapping):
            data = dict(obj)
        else:
            raise ValueError(f"request {index}: expected a CounterFactRecord or a request dict, "
                             f"got {type(obj).__name__}")
        case_id = data.get("case_id", index)
        prompt, subject = data.get("prompt"), data.get("subject")
        target_new = _target_str(data.get("target_new"))
        target_true = _target_str(data.get("target_true", data.get("ground_truth")))
        for name, value in (("prompt", prompt), ("subject", subject), ("target_new", target_new)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"request {case_id!r}: missing or empty field {name!r} (got {value!r})")
        if "{}" not in prompt and subject in prompt:  # EasyEdit: the subject is filled in
            prompt = prompt.replace(subject, "{}", 1)
        req = EditRequest(case_id, prompt, subject, target_new, target_true)
    if req.prompt.count("{}") != 1:
        if "{}" not in req.prompt:
            raise ValueError(f"request {req.case_id!r}: subject {req.subject!r} does not occur in prompt "
                             f"{req.prompt!r} (and the prompt has no '{{}}' placeholder)")
        raise ValueError(f"request {req.case_id!r}: prompt {req.prompt!r} must contain '{{}}' exactly once")
    if not req.subject.strip():
        raise ValueError(f"request {req.case_id!r}: empty subject")
    return req


def normalise_requests(requests: Iterable[Any]) -> list[EditRequest]:
    """:func:`as_request` over a sequence (indices name requests without a ``case_id``)."""
    return [as_request(r, i) for i, r in enumerate(requests)]


def fill_template(template: str, request: EditRequest) -> tuple[str, int, int]:
    """``template`` (``"prefix {}"``) around the request's prompt with the subject filled in.

    Returns the text and the subject's character span ``[start, end)``.
    """
    head, _, tail = template.partition("{}")
    before, _, after = request.prompt.partition("{}")
    start = len(head) + len(before)
    text = head + before + request.subject + after + tail
    return text, start, start + len(request.subject)


def target_token_ids(tokenizer: Any, target: str, prompt: str | None = None, *,
                     what: str = "target") -> list[int]:
    """Token ids of ``target`` as it reads after a prompt (a leading space, no BOS).

    With ``prompt`` (subject filled in): the suffix of ``ids(prompt + " " + target)`` after
    ``ids(prompt)`` (prompt trailing spaces removed), as the CounterFact evaluation scores it.
    Without one, or when the tokenizer merges across that boundary: the same with the anchor
    ``"a"`` in place of the prompt (right for BPE, byte-level BPE and SentencePiece), and as a
    last resort ``ids(" " + target)`` with a stray BOS dropped. ``"Paris"`` and ``" Paris"`` give
    the same ids. Raises ``ValueError`` when the target tokenises to zero tokens.
    """
    if hasattr(tokenizer, "tokenizer") and not callable(getattr(tokenizer, "encode", None)):
        tokenizer = tokenizer.tokenizer  # a ModelAdapter
    text = target.strip()
    if not text:
        raise ValueError(f"{what} {target!r} is empty: it tokenises to zero tokens")

    def ids(s: str) -> list[int]:
        return [int(i) for i in tokenizer(s, add_special_tokens=False)["input_ids"]]

    for head in ([prompt.rstrip(" ")] if prompt and prompt.strip() else []) + [_ANCHOR]:
        head_ids, full = ids(head), ids(f"{head} {text}")
        if head_ids and len(full) > len(head_ids) and full[: len(head_ids)] == head_ids:
            return full[len(head_ids):]
    out = ids(" " + text)
    bos = getattr(tokenizer, "bos_token_id", None)
    if out and bos is not None and out[0] == bos:
        out = out[1:]
    if not out:
        raise ValueError(f"{what} {target!r} tokenises to zero tokens")
    return out



@dataclass(frozen=True)
class PromptSite:
    """A tokenised prompt (with BOS) and the index of its last subject token."""

    ids: tuple[int, ...]
    index: int

    @property
    def key_prefix(self) -> tuple[int, ...]:
        """The tokens the key at ``index`` depends on (a causal model sees nothing later)."""
        return self.ids[: self.index + 1]


def locate_subject(adapter: ModelAdapter, request: EditRequest, template: str = "{}", *,
                   add_bos: bool | None = None) -> PromptSite:
    """Tokenise ``template`` around the request's prompt and find the subject's last token.

    Fast tokenizers: the last token whose character span overlaps the subject (so a subject
    merged into a larger token still maps to that token). Slow tokenizers: the length of the
    tokenised text up to the subject's end. ``add_bos``: prepend exactly one BOS; ``None`` =
    what the tokenizer does by default (Llama, OLMo-2, pocket: yes; GPT-2, Qwen3: no), as the
    covariance estimate and the CounterFact evaluation tokenise.
    """
    tok = adapter.tokenizer
    if tok is None:
        raise ValueError(f"{adapter.name} was loaded without a tokenizer")
    text, start, end = fill_template(template, request)
    if add_bos is None:
        add_bos = adapter.tokenizer_adds_bos
    bos = adapter.bos_token_id if add_bos else None
    shift = 1 if bos is not None else 0
    index = None
    if getattr(tok, "is_fast", False):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        offsets = enc["offset_mapping"]
        for i, (a, b) in enumerate(offsets):
            if a < end and b > start and b > a:
                index = i  # keep the last token overlapping the subject
        if index is None:  # offsets unavailable for this tokenizer: fall through to prefix counting
            ids = None
    else:
        ids = None
    if index is None:
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        prefix = list(tok(text[:end], add_special_tokens=False)["input_ids"])
        index = len(prefix) - 1
    if index < 0 or index >= len(ids):
        raise ValueError(f"{request.describe()}: could not locate subject {request.subject!r} in the "
                         f"tokens of {text!r}")
    full = [bos, *ids] if bos is not None else ids
    return PromptSite(tuple(int(t) for t in full), index + shift)


@dataclass
class RequestGroup:
    """Requests whose subject keys coincide: identical tokens up to the last subject token
    under every context template. ``sites[r][t]`` is request ``r`` under the ``t``-th template of
    the flattened template groups; ``group_sizes`` are the sizes of those groups."""

    requests: list[EditRequest]
    positions: list[int]  # indices into the request list given to group_requests
    sites: list[list[PromptSite]] = field(repr=False)
    targets: list[list[int]] = field(default_factory=list, repr=False)  # target_new ids per request
    group_sizes: tuple[int, ...] = (1,)

    @property
    def subject(self) -> str:
        return self.requests[0].subject

    @property
    def key_sites(self) -> list[PromptSite]:
        """One site per template (the first request's: all requests share the key prefix)."""
        return self.sites[0]


def group_requests(adapter: ModelAdapter, requests: Sequence[Any], templates: Sequence[Sequence[str]]
                   ) -> list[RequestGroup]:
    """Normalise, locate, tokenise the targets of (``ValueError`` for a bad one) and group
    requests; groups come in order of first occurrence. ``templates``: :data:`TemplateGroups`."""
    template_groups = as_template_groups(templates)
    sizes = tuple(len(g) for g in template_groups)
    flat = [t for g in template_groups for t in g]
    reqs = normalise_requests(requests)
    add_bos = adapter.tokenizer_adds_bos
    groups: dict[tuple, RequestGroup] = {}
    for pos, req in enumerate(reqs):
        sites = [locate_subject(adapter, req, t, add_bos=add_bos) for t in flat]
        target = target_token_ids(adapter.tokenizer, req.target_new, req.filled_prompt,
                                  what=f"{req.describe()}: target_new")
        gkey = tuple(s.key_prefix for s in sites)
        if gkey in groups:
            groups[gkey].requests.append(req)
            groups[gkey].positions.append(pos)
            groups[gkey].sites.append(sites)
            groups[gkey].targets.append(target)
        else:
            groups[gkey] = RequestGroup([req], [pos], [sites], [target], sizes)
    out = list(groups.values())
    if len(out) < len(reqs):
        log.info("%d requests share subject keys: %d groups, each fitted with one joint target",
                 len(reqs), len(out))
    return out
