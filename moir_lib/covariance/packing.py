"""The document stream of :func:`~moir_lib.covariance.estimation.estimate` as a stream of padded batches.

Documents (text or token ids) are tokenized in chunks, grouped into windows of at least
``window_tokens`` tokens, and each window is packed greedily into batches of at most
``tokens_per_batch`` padded tokens, longest documents first. The grouping is fixed per window
(whatever the checkpoints), so a resumed estimate sums the same keys in the same order.

**Which positions count.** Like ``layer_stats`` (which counts every token of the tokenized text),
every non-padding position counts by default, BOS included when the tokenizer adds one
(``add_bos=None`` tokenizes exactly as ``tokenizer(text)`` does). BOS keys are often outliers
(attention-sink activations with a large norm), one per document: ``count_bos=False`` still
feeds BOS as context but leaves its key out of ``C``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moir_lib.covariance.products import _torch

if TYPE_CHECKING:
    from torch import Tensor

    from moir_lib.models import ModelAdapter

log = logging.getLogger(__name__)

#: documents are sorted by length within windows of this many batches' tokens
WINDOW_BATCHES = 16


def default_max_length(model: Any, tokens_per_batch: int) -> int:
    cfg = model.config
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048
    return int(min(limit, 2048, tokens_per_batch))


@dataclass
class Doc:
    index: int
    ids: list[int]
    counted: int  # positions that count (BOS may be left out)


class Tokenized:
    """Documents → token ids, tokenized in chunks (fast tokenizers batch well)."""

    def __init__(self, docs: Iterator[Any], tokenizer: Any, adapter: ModelAdapter, add_bos: bool | None,
                 count_bos: bool, max_length: int, start: int, chunk: int = 256) -> None:
        self.docs, self.tokenizer, self.adapter = docs, tokenizer, adapter
        self.add_bos, self.count_bos, self.max_length = add_bos, count_bos, max_length
        self.index, self.chunk = start, chunk
        self.bos = adapter.bos_token_id
        self.vocab = adapter.vocab_size
        self._buffer: list[Doc] = []
        self._warned_bos = False

    def __iter__(self) -> Iterator[Doc]:
        while True:
            raw = []
            for doc in self.docs:
                raw.append(doc)
                if len(raw) >= self.chunk:
                    break
            if not raw:
                return
            yield from self._encode(raw)

    def _encode(self, raw: list[Any]) -> list[Doc]:
        texts = [(i, d) for i, d in enumerate(raw) if isinstance(d, str)]
        encoded: dict[int, list[int]] = {}
        if texts:
            if self.tokenizer is None:
                raise ValueError("text documents need a tokenizer: pass a LoadedModel "
                                 "(model, tokenizer, adapter)")
            strings = [d if d.strip() else "" for _, d in texts]
            prepend = self.add_bos is True and self.bos is not None
            if self.add_bos is True and self.bos is None and not self._warned_bos:
                log.warning("%s has no BOS token: add_bos=True adds nothing", self.adapter.name)
                self._warned_bos = True
            special = self.add_bos is None
            limit = self.max_length - 1 if prepend else self.max_length
            ids = self.tokenizer(strings, add_special_tokens=special, truncation=True,
                                 max_length=limit)["input_ids"]
            for (i, d), row in zip(texts, ids, strict=True):
                row = list(row) if d.strip() else []  # blank documents carry no text
                encoded[i] = ([self.bos, *row] if prepend and row else row)
        out = []
        for i, d in enumerate(raw):
            if i in encoded:
                ids = encoded[i]
            else:
                try:
                    ids = [int(t) for t in d][: self.max_length]
                except TypeError:
                    raise TypeError(f"document {self.index + i} is a {type(d).__name__}: documents must "
                                    f"be str or sequences of token ids") from None
                if ids and (min(ids) < 0 or max(ids) >= self.vocab):
                    raise ValueError(f"document {self.index + i} has token ids outside the vocabulary "
                                     f"(0-{self.vocab - 1}): were they produced by another tokenizer?")
            counted = len(ids)
            if ids and not self.count_bos and self.bos is not None and ids[0] == self.bos:
                counted -= 1
            out.append(Doc(self.index + i, ids, counted))
        self.index += len(raw)
        return out


def windows(docs: Iterable[Doc], window_tokens: int) -> Iterator[list[Doc]]:
    """Consecutive groups of documents holding at least ``window_tokens`` tokens (the last may hold fewer)."""
    window: list[Doc] = []
    tokens = 0
    for doc in docs:
        window.append(doc)
        tokens += len(doc.ids)
        if tokens >= window_tokens:
            yield window
            window, tokens = [], 0
    if window:
        yield window


def pack(window: list[Doc], tokens_per_batch: int) -> list[list[Doc]]:
    """Batches of a window: longest documents first, each batch's padded size ≤ ``tokens_per_batch``."""
    live = sorted((d for d in window if d.counted > 0), key=lambda d: -len(d.ids))  # stable: ties keep order
    batches: list[list[Doc]] = []
    cur: list[Doc] = []
    width = 0
    for doc in live:
        w = max(width, len(doc.ids))
        if cur and (len(cur) + 1) * w > tokens_per_batch:
            batches.append(cur)
            cur, w = [], len(doc.ids)
        cur.append(doc)
        width = w
    if cur:
        batches.append(cur)
    return batches


def tensors(batch: list[Doc], pad_id: int, bos: int | None, count_bos: bool, device: Any
             ) -> tuple[Tensor, Tensor | None, Tensor]:
    torch = _torch()
    width = max(len(d.ids) for d in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for r, d in enumerate(batch):
        ids[r, : len(d.ids)] = torch.tensor(d.ids, dtype=torch.long)
        attn[r, : len(d.ids)] = 1
    count = attn.bool()
    if not count_bos and bos is not None:
        count[:, 0] &= ids[:, 0] != bos
    full = bool(attn.all())
    return ids.to(device), (None if full else attn.to(device)), count.to(device)




def packed_windows(docs: Iterable[Doc], tokens_per_batch: int) -> Iterator[tuple[list[Doc], list[list[Doc]]]]:
    """``(window, its batches)`` for consecutive windows of ``WINDOW_BATCHES`` batches' tokens."""
    for window in windows(docs, tokens_per_batch * WINDOW_BATCHES):
        yield window, pack(window, tokens_per_batch)
