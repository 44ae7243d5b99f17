"""Context templates: the prefixes over which ROME/MEMIT average a key (appendix C.2).

To make the key a property of the subject rather than of one sentence, ROME/MEMIT average it
over *context templates*: the plain prompt ``"{}"`` plus a few short prefixes sampled from the
model itself (``"<sampled text>. {}"``). They are sampled once per model and seed
(:func:`context_templates`; cached in memory and in ``$MOIR_CACHE/context_templates``) and kept
in ROME/MEMIT's *groups* ``[["{}"], [prefixed, ...]]`` (:data:`TemplateGroups`), because the
grouping decides the key (:func:`moir_lib.editing.keys.template_mean`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from moir_lib.cache import entry_dir, read_checked, write_checked
from moir_lib.timings import timed

if TYPE_CHECKING:
    from moir_lib.models import ModelAdapter

__all__ = [
    "DEFAULT_SEED_WORDS",
    "TemplateGroups",
    "as_template_groups",
    "context_templates",
    "sample_templates",
]

log = logging.getLogger(__name__)

#: ROME/MEMIT's seed words for the sampled context prefixes (``get_context_templates``).
DEFAULT_SEED_WORDS: tuple[str, ...] = ("The", "Therefore", "Because", "I", "You")

_TEMPLATE_MEMORY: dict[str, list[str]] = {}

#: Context templates in ROME/MEMIT's grouping: ``[["{}"], ["<prefix>. {}", ...]]``. Keys are
#: averaged within each group, then over the groups; z's NLL is a flat mean over all of them.
TemplateGroups = list[list[str]]


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


@timed("context templates")
def sample_templates(adapter: ModelAdapter, k: int, seed: int) -> TemplateGroups:
    """The plain prompt and ``k`` sampled prefixes (ROME's seed words, cycled): a profile's
    ``memit.context_templates`` / ``alphaedit.context_templates`` as every entry point samples them
    (``k = 5`` is MEMIT's set)."""
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
    found = read_checked(path, key=settings) if use_cache else None
    if found is not None:
        prefixes = json.loads(found.read_text())["prefixes"]
        _TEMPLATE_MEMORY[key] = prefixes
        return list(prefixes)

    model = adapter.model
    device = next(model.parameters()).device
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
            write_checked(path, lambda tmp: tmp.write_text(text), key=settings)
        except OSError as exc:  # a read-only cache is not an error
            log.warning("could not cache context templates at %s: %s", path, exc)
    return list(prefixes)
