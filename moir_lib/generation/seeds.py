"""The seed strategies of self-generation (Section 4, Algorithm 1): the seed sequence ``s`` of each sample.

- ``bos``: ``[BOS]`` alone (Moir-bos; collapses onto the chat attractor, H2);
- ``rand<k>`` (``rand1`` … ``rand4`` in the paper, any ``k >= 1`` accepted): ``[BOS]`` then ``k``
  tokens drawn uniformly from :func:`seed_candidates` (rand×1 is the paper's default);
- ``prompt:<text>``: ``[BOS]`` + the tokens of ``<text>`` (special tokens in the text, e.g. chat
  tags, are recognised as such).

Models without a BOS token (none in the tokenizer nor the config) get no BOS; ``bos`` is then refused.

The ``rand<k>`` tokens of sample ``i`` come from its ``seed`` stream (:mod:`moir_lib.streams`), so
they depend only on ``(seed, i)`` (:func:`seed_ids_for`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from moir_lib.streams import stream, stream_key

if TYPE_CHECKING:
    from jaxtyping import Int, Int64
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_STRATEGY_RE = re.compile(r"^(?:(bos)|rand([1-9][0-9]*)|prompt:(.+))$", re.DOTALL)


@dataclass(frozen=True)
class SeedStrategy:
    """A parsed seed strategy: ``kind`` is ``"bos"``, ``"rand"`` (with ``k``) or ``"prompt"`` (``text``)."""

    spec: str
    kind: str
    k: int = 0
    text: str = ""


def parse_seed_strategy(spec: str) -> SeedStrategy:
    """Parse ``"bos"``, ``"rand<k>"`` (``k >= 1``, no leading zeros) or ``"prompt:<text>"`` (non-empty)."""
    match = _STRATEGY_RE.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(f"unknown seed strategy {spec!r}: use 'bos', 'rand1'..'rand4' (any rand<k>, k >= 1) "
                         f"or 'prompt:<text>'")
    bos, k, text = match.groups()
    if bos:
        return SeedStrategy(spec, "bos")
    if k:
        return SeedStrategy(spec, "rand", k=int(k))
    return SeedStrategy(spec, "prompt", text=text)


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every special or added token id: BOS/EOS/PAD/UNK, chat tags, ``additional_special_tokens``, and all
    tokens added on top of the base vocabulary (``tokenizer.added_tokens_decoder``)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
    ids |= {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}
    return ids


def seed_candidates(tokenizer: PreTrainedTokenizerBase, vocab_size: int | None = None
                    ) -> Int64[np.ndarray, " candidates"]:
    """The ids a ``rand<k>`` seed token is drawn from, uniformly, sorted.

    Exclusion rule: all ids ``< min(len(tokenizer), vocab_size)`` (``len(tokenizer)`` counts the base
    vocabulary plus added tokens; ``vocab_size`` is the model's embedding rows, which may include padding
    rows no token maps to) *minus* every special or added token (:func:`special_token_ids`: BOS, EOS,
    PAD, UNK, chat tags such as ``<|user|>``/``<|assistant|>``, reserved/added tokens). Ordinary tokens
    that merely look odd (byte fragments, whitespace) stay: the paper draws from the vocabulary.
    """
    limit = len(tokenizer) if vocab_size is None else min(len(tokenizer), int(vocab_size))
    keep = np.ones(limit, dtype=bool)
    for i in special_token_ids(tokenizer):
        if 0 <= i < limit:
            keep[i] = False
    candidates = np.flatnonzero(keep).astype(np.int64)
    if candidates.size == 0:
        raise ValueError("the tokenizer has no ordinary (non-special) token to seed rand<k> with")
    return candidates


def _bos_id(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int | None:
    if tokenizer.bos_token_id is not None:
        return int(tokenizer.bos_token_id)
    bos = getattr(model.config, "bos_token_id", None)
    return int(bos) if isinstance(bos, int) else None


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(model.config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids |= {int(x) for x in source}
        if ids:
            break
    return sorted(ids)


def seed_ids_for(strategy: SeedStrategy | str, index: int, seed: int, *, bos_id: int | None,
                 candidates: Int[np.ndarray, " candidates"] | None = None,
                 prompt_ids: Sequence[int] | None = None) -> list[int]:
    """The seed sequence of sample ``index``: ``[BOS]`` (when the model has one) + strategy tokens."""
    strategy = parse_seed_strategy(strategy) if isinstance(strategy, str) else strategy
    head = [bos_id] if bos_id is not None else []
    if strategy.kind == "bos":
        return head
    if strategy.kind == "prompt":
        return head + list(prompt_ids or [])
    if candidates is None:
        raise ValueError("rand<k> seeds need the candidate ids (seed_candidates)")
    key = np.array([stream_key(seed, index, "seed")], dtype=np.uint64)
    picks = [int(candidates[int(stream(key, j)[0] % np.uint64(candidates.size))]) for j in range(strategy.k)]
    return head + picks
