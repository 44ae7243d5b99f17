"""How a CounterFact target is tokenised after its prompt (the ids every metric scores).

**Tokenisation.** A target is scored as the tokens it has *after its prompt*: the prompt and
``prompt + " " + target`` are tokenised without special tokens and the target's ids are the
suffix (:func:`encode_prompt_target`); only if the tokenizer merges across the boundary does it
fall back to tokenising the target alone (:func:`standalone_target_ids`: ``" " + target`` for
byte-level BPEs such as GPT-2's and Llama-3's, ``target`` for SentencePiece tokenizers, which
add the word-start marker themselves; counted in ``settings["n_tokenisation_fallbacks"]``).
Leading/trailing spaces of targets and trailing spaces of prompts are normalised to exactly
one separating space, so ``"Paris"`` and ``" Paris"`` score identically (the AlphaEdit code
strips BOS and spaces by hand for Llama). BOS is prepended exactly once when the tokenizer
adds one by default (Llama, OLMo-2, pocket) and never otherwise (GPT-2, Qwen3), overridable
with ``add_bos``; targets never contain it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _bos_token_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    bos = getattr(tokenizer, "bos_token_id", None)
    return int(bos) if bos is not None else None


class SpecialIds(NamedTuple):
    """The tokenizer's BOS and EOS ids and the padding id (its pad token, else EOS, else 0)."""

    bos: int | None
    eos: int | None
    pad: int


def special_ids(tokenizer: PreTrainedTokenizerBase) -> SpecialIds:
    """The :class:`SpecialIds` of ``tokenizer``."""
    eos = getattr(tokenizer, "eos_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else eos if eos is not None else 0
    return SpecialIds(_bos_token_id(tokenizer), eos, int(pad))


def tokenizer_adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``tokenizer(text)`` starts with BOS by default (Llama/OLMo-2/pocket yes, GPT-2/Qwen3 no).

    The same test as :attr:`moir_lib.models.ModelAdapter.tokenizer_adds_bos`, on the tokenizer alone.
    """
    bos = _bos_token_id(tokenizer)
    if bos is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and int(ids[0]) == bos


def _clean_target(target: str) -> str:
    text = target.strip()
    if not text:
        raise ValueError(f"target {target!r} is empty: it tokenises to zero tokens")
    return text


_ANCHOR = "a"  # a neutral one-word prompt (the same anchor as moir_lib.editing's target ids)


def standalone_target_ids(tokenizer: PreTrainedTokenizerBase, target: str) -> list[int]:
    """Ids of ``target`` as it reads after a prompt, tokenised without one (no BOS).

    The suffix of ``ids("a " + target)`` after ``ids("a")``: right for byte-level BPEs
    (GPT-2, Llama-3, pocket), which mark the word-initial space inside the token
    (``"ĠParis"``), and for SentencePiece tokenizers (Llama-2 style), which add the
    word-start marker ``"▁"`` themselves, where the naive ``ids(" " + target)`` would give a
    stray ``"▁"`` token. If even the anchor merges with the target: ``ids(target)`` when that
    starts with ``"▁"`` (SentencePiece), else ``ids(" " + target)``. Leading spaces of
    ``target`` are normalised first, so ``"Paris"`` and ``" Paris"`` give the same ids.
    """
    text = _clean_target(target)
    head, full = _ids(tokenizer, _ANCHOR), _ids(tokenizer, f"{_ANCHOR} {text}")
    if head and len(full) > len(head) and full[:len(head)] == head:
        return full[len(head):]
    plain = _ids(tokenizer, text)
    pieces = tokenizer.convert_ids_to_tokens(plain[:1]) if plain else []
    if pieces and isinstance(pieces[0], str) and pieces[0].startswith("▁"):
        return plain
    ids = _ids(tokenizer, " " + text)
    if not ids:
        raise ValueError(f"target {target!r} tokenises to zero tokens")
    return ids


@dataclass(frozen=True)
class EncodedTarget:
    """``prefix`` (BOS at most once, then the prompt) and ``target`` ids; ``fallback``: the
    suffix method failed (boundary merge) and :func:`standalone_target_ids` was used."""

    prefix: tuple[int, ...]
    target: tuple[int, ...]
    fallback: bool = False


def encode_prompt_target(tokenizer: PreTrainedTokenizerBase, prompt: str, target: str, *,
                         add_bos: bool | None = None) -> EncodedTarget:
    """Ids of ``prompt`` then ``target``, the target's ids being exactly those it has after the prompt.

    The prompt (trailing spaces removed) and ``prompt + " " + target`` are tokenised without
    special tokens; the target's ids are the suffix of the second after the first. If the
    prompt's ids are not a prefix (the tokenizer merged across the boundary), the target is
    tokenised alone (:func:`standalone_target_ids`). ``add_bos``: prepend BOS (once: not if
    the prompt already starts with it); ``None`` = what the tokenizer does by default.
    """
    if add_bos is None:
        add_bos = tokenizer_adds_bos(tokenizer)
    text = _clean_target(target)
    prompt_text = prompt.rstrip(" ")
    if not prompt_text:
        raise ValueError(f"empty prompt for target {target!r}")
    prompt_ids = _ids(tokenizer, prompt_text)
    full = _ids(tokenizer, f"{prompt_text} {text}")
    fallback = not (len(full) > len(prompt_ids) and full[:len(prompt_ids)] == prompt_ids)
    if fallback:
        log.debug("tokenizer merges %r with %r across the boundary: target tokenised alone", prompt, target)
        target_ids = standalone_target_ids(tokenizer, text)
    else:
        target_ids = full[len(prompt_ids):]
    bos = _bos_token_id(tokenizer)
    if add_bos:
        if bos is None:
            raise ValueError("add_bos=True but the tokenizer has no BOS token")
        if not prompt_ids or prompt_ids[0] != bos:
            prompt_ids = [bos, *prompt_ids]
    if not prompt_ids:
        raise ValueError(f"prompt {prompt!r} tokenises to zero tokens and there is no BOS to condition on")
    return EncodedTarget(tuple(prompt_ids), tuple(target_ids), fallback)
