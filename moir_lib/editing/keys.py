"""k*: the key ``k = φ_ℓ(x)`` at the last subject token, averaged over context templates.

MEMIT and AlphaEdit write a fact into ``W_out^ℓ`` (``down_proj``) through the key its
input takes at the *last token of the subject* (ROME's ``subject_last`` strategy). To make
the key a property of the subject rather than of one sentence, ROME/MEMIT average it over
*context templates*: the plain prompt ``"{}"`` plus a few short prefixes sampled from the
model itself (``"<sampled text>. {}"``). This module

* normalises edit requests (:class:`EditRequest`: a CounterFact record, ROME's request dict,
  or the EasyEdit flat form with the subject filled in);
* samples the context templates once per model and seed (:func:`context_templates`; cached
  in memory and in ``$MOIR_CACHE/context_templates``), kept in ROME/MEMIT's *groups*
  ``[["{}"], [prefixed, ...]]`` (:data:`TemplateGroups`);
* locates the last subject token of a prompt robustly from the tokenizer's character offsets
  (:func:`locate_subject`), with exactly one leading BOS as :meth:`ModelAdapter.encode` does;
* groups requests whose keys coincide (:func:`group_requests`): the key at the last subject
  token depends only on the tokens up to it, so requests about one subject whose prompts put
  the same tokens before it (``"{} is located in"``, ``"{} is a citizen of"``) share one key.
  One key cannot be mapped to two different values, so each group gets one joint target
  (:mod:`moir_lib.editing.values`) and one column of ``K``;
* computes ``K`` for an edit layer (:func:`compute_keys`): hidden activations in the model's
  dtype, read out as float32, averaged within each template group and then over the groups in
  float64, as the reference's ``compute_ks`` does (``k = ½·k("{}") + ½·mean(prefixed)`` for
  MEMIT's two groups; a flat mean over all templates is a different key).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from moir_lib.cache import entry_dir, read_checked, write_checked

if TYPE_CHECKING:
    import torch

    from moir_lib.models import ModelAdapter

__all__ = [
    "DEFAULT_SEED_WORDS",
    "TemplateGroups",
    "as_template_groups",
    "EditRequest",
    "PromptSite",
    "RequestGroup",
    "as_adapter",
    "capture_at",
    "compute_keys",
    "compute_keys_at",
    "context_templates",
    "fill_template",
    "group_requests",
    "locate_subject",
    "normalise_requests",
    "sample_templates",
    "template_mean",
]

log = logging.getLogger(__name__)

#: ROME/MEMIT's seed words for the sampled context prefixes (``get_context_templates``).
DEFAULT_SEED_WORDS: tuple[str, ...] = ("The", "Therefore", "Because", "I", "You")

_TEMPLATE_MEMORY: dict[str, list[str]] = {}

#: Context templates in ROME/MEMIT's grouping: ``[["{}"], ["<prefix>. {}", ...]]``. Keys are
#: averaged within each group, then over the groups; z's NLL is a flat mean over all of them.
TemplateGroups = list[list[str]]


# ----------------------------------------------------------------------------- requests


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


def as_adapter(model_or_adapter: Any) -> ModelAdapter:
    """A :class:`ModelAdapter` from an adapter or a :class:`~moir_lib.models.LoadedModel`."""
    from moir_lib.models import LoadedModel, ModelAdapter

    if isinstance(model_or_adapter, ModelAdapter):
        return model_or_adapter
    if isinstance(model_or_adapter, LoadedModel):
        return model_or_adapter.adapter
    raise ValueError(f"expected a ModelAdapter or a LoadedModel (models.load(...)), "
                     f"got {type(model_or_adapter).__name__}")


# ----------------------------------------------------------------------------- templates


def fill_template(template: str, request: EditRequest) -> tuple[str, int, int]:
    """``template`` (``"prefix {}"``) around the request's prompt with the subject filled in.

    Returns the text and the subject's character span ``[start, end)``.
    """
    head, _, tail = template.partition("{}")
    before, _, after = request.prompt.partition("{}")
    start = len(head) + len(before)
    text = head + before + request.subject + after + tail
    return text, start, start + len(request.subject)


def _device_of(model: Any) -> torch.device:
    return next(model.parameters()).device


def as_template_groups(templates: Sequence[Sequence[str]]) -> TemplateGroups:
    """Check and copy grouped context templates: ``[["{}"], [prefixed, ...], ...]``.

    The first group must be the plain prompt alone (as in the reference); every template holds
    ``{}`` exactly once; no group is empty. A flat list of strings is refused, because the
    grouping decides the key (see :func:`compute_keys`).
    """
    if isinstance(templates, str) or not templates or any(isinstance(g, str) for g in templates):
        raise ValueError(f"context templates must be grouped as ROME/MEMIT's [['{{}}'], [prefixed, ...]]; "
                         f"got {templates!r} (wrap a flat list as [['{{}}'], [...prefixed]])")
    groups = [list(g) for g in templates]
    if groups[0] != ["{}"]:
        raise ValueError(f"the first template group must be the plain prompt [['{{}}']], got {groups[0]!r}")
    for group in groups:
        if not group:
            raise ValueError(f"empty context-template group in {groups!r}")
        for t in group:
            if not isinstance(t, str) or t.count("{}") != 1:
                raise ValueError(f"context template {t!r} must be a string containing '{{}}' exactly once")
    return groups


def context_templates(adapter: ModelAdapter, *, seed: int = 0, seed_words: Sequence[str] = DEFAULT_SEED_WORDS,
                      n_per_word: int = 1, length: int = 10, top_k: int = 5, use_cache: bool = True
                      ) -> TemplateGroups:
    """``[["{}"], ["<prefix 1>. {}", ...]]``: the plain prompt, then one group of prefixes
    sampled from the model.

    As ROME/MEMIT's ``get_context_templates`` (``[(10, 5)]``): each of ``seed_words`` is continued
    by top-k sampling to ``length`` tokens (BOS not counted), ``n_per_word`` times; braces in the
    text become spaces and ``". {}"`` is appended. Sampling uses a private ``torch.Generator``
    seeded with ``seed``, so the templates are a function of (model weights, seed, settings);
    they are cached under that key (call this *before* editing the model: the fingerprint
    covers the weights).
    """
    prefixes = _sampled_prefixes(adapter, seed=seed, seed_words=seed_words, n_per_word=n_per_word,
                                 length=length, top_k=top_k, use_cache=use_cache)
    return [["{}"], prefixes] if prefixes else [["{}"]]


def sample_templates(adapter: ModelAdapter, k: int, seed: int) -> TemplateGroups:
    """The plain prompt and ``k`` sampled prefixes (ROME's seed words, cycled): the profile's
    ``editing.context_templates`` as every entry point samples them (``k = 5`` is MEMIT's set)."""
    if k < 0:
        raise ValueError(f"the number of context templates must be >= 0, got {k}")
    if k == 0:
        return [["{}"]]
    words = DEFAULT_SEED_WORDS[: min(k, len(DEFAULT_SEED_WORDS))]
    per_word = -(-k // len(words))
    groups = context_templates(adapter, seed=seed, seed_words=words, n_per_word=per_word)
    return [["{}"], groups[1][:k]]


def _sampled_prefixes(adapter: ModelAdapter, *, seed: int, seed_words: Sequence[str], n_per_word: int,
                      length: int, top_k: int, use_cache: bool) -> list[str]:
    import torch

    from moir_lib.cache import fingerprint
    from moir_lib.models import model_fingerprint

    if n_per_word < 0 or length < 1 or top_k < 1:
        raise ValueError(f"context templates need n_per_word >= 0, length >= 1, top_k >= 1; got "
                         f"{n_per_word}, {length}, {top_k}")
    if n_per_word == 0 or not seed_words:
        return []
    settings = {"model": model_fingerprint(adapter.model), "seed": seed, "seed_words": list(seed_words),
                "n_per_word": n_per_word, "length": length, "top_k": top_k, "v": 2}
    key = fingerprint(settings)
    if use_cache and key in _TEMPLATE_MEMORY:
        return list(_TEMPLATE_MEMORY[key])
    path = entry_dir("context_templates", settings) / "templates.json"
    found = read_checked(path) if use_cache else None
    if found is not None:
        prefixes = json.loads(found.read_text())["prefixes"]
        _TEMPLATE_MEMORY[key] = prefixes
        return list(prefixes)

    model = adapter.model
    device = _device_of(model)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    eos = adapter.eos_token_id
    add_bos = adapter.tokenizer_adds_bos
    prefixes = []
    with torch.no_grad():
        for word in seed_words:
            start = adapter.encode(word, add_bos=add_bos)
            n_start = len(adapter.encode(word, add_bos=False))
            for _ in range(n_per_word):
                ids = list(start)
                for _ in range(max(0, length - n_start)):
                    logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].float().cpu()
                    top = torch.topk(logits, min(top_k, logits.numel()))
                    probs = torch.softmax(top.values, dim=-1)
                    nxt = int(top.indices[int(torch.multinomial(probs, 1, generator=gen))])
                    ids.append(nxt)
                    if eos is not None and nxt == eos:
                        break
                text = adapter.tokenizer.decode(ids, skip_special_tokens=True)
                text = " ".join(text.replace("{", " ").replace("}", " ").split())
                prefixes.append(f"{text}. {{}}")
    log.info("sampled %d context templates (seed %d): %s", len(prefixes), seed, prefixes)
    if use_cache:
        _TEMPLATE_MEMORY[key] = prefixes
        text = json.dumps({"settings": settings, "prefixes": prefixes}, indent=1)
        try:
            write_checked(path, lambda tmp: tmp.write_text(text))
        except OSError as exc:  # a read-only cache is not an error
            log.warning("could not cache context templates at %s: %s", path, exc)
    return list(prefixes)


# ----------------------------------------------------------------------------- subject position


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
    from moir_lib.editing.values import target_token_ids

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


# ----------------------------------------------------------------------------- activations


class _Stop(Exception):
    """Raised by the last hook needed, to skip the rest of the forward pass."""


def _layer_output(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int | None, device: Any
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` (positions stay 0..n-1 per row)."""
    import torch

    width = max(len(r) for r in rows)
    pad = 0 if pad_id is None else pad_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


def capture_at(adapter: ModelAdapter, rows: Sequence[Sequence[int]], positions: Sequence[int], *,
               key_layers: Iterable[int] = (), out_layers: Iterable[int] = (), batch_size: int = 32
               ) -> dict[tuple[str, int], torch.Tensor]:
    """Activations at one position per row, as float32 ``(n_rows, d)`` tensors on the CPU.

    ``("key", ℓ)``: the input of layer ℓ's key module (``down_proj``), i.e. ``k``;
    ``("out", ℓ)``: the output of decoder layer ℓ (the residual stream after it). The forward
    pass stops after the deepest site needed.
    """
    import torch

    key_layers, out_layers = sorted(set(key_layers)), sorted(set(out_layers))
    adapter.check_layers(sorted({*key_layers, *out_layers}) or [0])
    events = [(layer, 0, "key") for layer in key_layers] + [(layer, 1, "out") for layer in out_layers]
    if not events:
        return {}
    last = max(events)
    device = _device_of(adapter.model)
    found: dict[tuple[str, int], list[torch.Tensor]] = {(kind, layer): [] for layer, _, kind in events}
    current: dict[str, torch.Tensor] = {}

    def grab(kind: str, layer: int, hidden: torch.Tensor) -> None:
        rows_idx = torch.arange(hidden.shape[0], device=hidden.device)
        found[(kind, layer)].append(hidden[rows_idx, current["pos"]].detach().float().cpu())
        if (layer, 0 if kind == "key" else 1, kind) == last:
            raise _Stop

    handles = []
    try:
        for layer in key_layers:
            handles.append(adapter.key_module(layer).register_forward_pre_hook(
                lambda mod, args, layer=layer: grab("key", layer, args[0])))
        for layer in out_layers:
            handles.append(adapter.layers[layer].register_forward_hook(
                lambda mod, args, out, layer=layer: grab("out", layer, _layer_output(out))))
        with torch.no_grad():
            for b in range(0, len(rows), batch_size):
                chunk = rows[b: b + batch_size]
                ids, mask = pad_batch(chunk, adapter.pad_token_id, device)
                current["pos"] = torch.tensor(list(positions[b: b + batch_size]), device=device)
                try:
                    adapter.model(input_ids=ids, attention_mask=mask)
                except _Stop:
                    pass
    finally:
        for h in handles:
            h.remove()
    return {k: torch.cat(v) if v else torch.empty(0) for k, v in found.items()}


def template_mean(values: torch.Tensor, group_sizes: Sequence[int]) -> torch.Tensor:
    """Average ``(n, n_templates, d)`` over templates as the reference's ``compute_ks`` does:
    within each template group, then over the groups. Returns ``(n, d)``."""
    import torch

    if sum(group_sizes) != values.shape[1]:
        raise ValueError(f"template groups of sizes {list(group_sizes)} do not cover "
                         f"{values.shape[1]} templates")
    parts = torch.split(values, list(group_sizes), dim=1)
    return torch.stack([p.mean(dim=1) for p in parts]).mean(dim=0)


def compute_keys(adapter: ModelAdapter, groups: Sequence[RequestGroup], layer: int, *,
                 out_layer: int | None = None, batch_size: int = 32
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``K`` of ``layer``: ``(d_in, n_groups)`` float64, each column the key at the last subject
    token averaged over the context templates by :func:`template_mean` (per group, then over
    groups: the reference's convention).

    With ``out_layer``, also the output of that decoder layer at the last subject token of the
    *plain* prompt (template 0), ``(d_out, n_groups)`` float64, from the same forward pass
    (MEMIT's ``cur_zs``).
    """
    got = _capture_groups(adapter, groups, [layer], [] if out_layer is None else [out_layer], batch_size)
    keys = _template_keys(got, groups, layer)
    cur = None
    if out_layer is not None:
        cur = got[("out", out_layer)].double().reshape(len(groups), len(groups[0].key_sites), -1)[:, 0]
        cur = cur.T.contiguous()
    return keys, cur


def compute_keys_at(adapter: ModelAdapter, groups: Sequence[RequestGroup], layers: Sequence[int], *,
                    batch_size: int = 32) -> dict[int, torch.Tensor]:
    """:func:`compute_keys` at several layers from one forward pass: ``{layer: (d_in, n_groups)}``."""
    got = _capture_groups(adapter, groups, layers, [], batch_size)
    return {layer: _template_keys(got, groups, layer) for layer in layers}


def _capture_groups(adapter: ModelAdapter, groups: Sequence[RequestGroup], key_layers: Sequence[int],
                    out_layers: Sequence[int], batch_size: int) -> dict[tuple[str, int], torch.Tensor]:
    if not groups:
        raise ValueError("no requests to compute keys for")
    rows = [s.ids for g in groups for s in g.key_sites]
    pos = [s.index for g in groups for s in g.key_sites]
    return capture_at(adapter, rows, pos, key_layers=key_layers, out_layers=out_layers, batch_size=batch_size)


def _template_keys(got: dict[tuple[str, int], torch.Tensor], groups: Sequence[RequestGroup], layer: int
                   ) -> torch.Tensor:
    per_template = got[("key", layer)].double().reshape(len(groups), len(groups[0].key_sites), -1)
    return template_mean(per_template, groups[0].group_sizes).T.contiguous()
