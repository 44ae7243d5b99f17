"""Per-document negative log-likelihood, eq. (nll) of appendix D.3.

``NLL(x) = 1/(T-1) · Σ_{t=1}^{T-1} −log p_θ(x_{t+1} | x_{≤t})``: the mean next-token cross-entropy of a
document under the model. Documents are cut into contiguous, non-overlapping windows of ``window``
tokens (the paper: 1024 on the 7-8B models; the pocket model: its context length), each window is
scored on its own (its first token is context only), and a document's NLL is the mean over *all* its
counted targets across windows (``max_windows`` keeps only the first windows). Targets whose id is in
``exclude_ids`` — by default every special/added token (BOS, EOS, PAD, the chat tags
``<|user|>``/``<|assistant|>``) — are not counted ("excluding chat templates"); they stay in the
context. Multi-token template pieces made of ordinary tokens (e.g. the newline after a tag) are
ordinary text unless their ids are passed too. ``n_context`` makes the first tokens of a document
context only, e.g. the seed of a self-generated sample (BOS and a uniformly random token that the model
did not choose: scoring it would add ≈ log V nats to one target).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from moir_lib.timings import timed

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Int
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["NLLSettings", "default_window", "document_nll", "tokenize_documents"]

log = logging.getLogger(__name__)

#: The paper's window on real models.
PAPER_WINDOW = 1024


def default_window(model: PreTrainedModel) -> int:
    """``min(1024, the model's context length)`` (1024 on the paper's models, the context on pocket)."""
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return min(PAPER_WINDOW, value)
    return PAPER_WINDOW


def tokenize_documents(tokenizer: PreTrainedTokenizerBase, documents: Iterable[str | Sequence[int]],
                       add_bos: bool = True) -> list[list[int]]:
    """Token ids per document: strings are encoded (special tokens in the text are recognised, one BOS is
    prepended when ``add_bos`` and the tokenizer has one); id sequences are used as they are."""
    bos = tokenizer.bos_token_id
    out = []
    for doc in documents:
        if isinstance(doc, str):
            ids = list(tokenizer(doc, add_special_tokens=False)["input_ids"])
            out.append([bos, *ids] if add_bos and bos is not None else ids)
        else:
            out.append([int(x) for x in doc])
    return out


@dataclass(frozen=True)
class NLLSettings:
    """How :func:`document_nll` scores documents.

    ``window``: tokens per window (default :func:`default_window`). ``exclude_ids``: target ids not
    counted (default: :func:`moir_lib.generation.special_token_ids`; ``()`` counts all). ``batch_size``:
    windows per forward pass (the logits of a batch, ``batch_size × window × vocab``, are materialised).
    ``add_bos``: prepend BOS to string documents (:func:`tokenize_documents`). ``max_windows``: score only
    the first windows of each document (default: all).
    """

    window: int | None = None
    exclude_ids: Iterable[int] | None = None
    batch_size: int = 8
    add_bos: bool = True
    max_windows: int | None = None


@timed("NLL")
def document_nll(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 documents: Iterable[str | Sequence[int]], corpus: str = "corpus",
                 settings: NLLSettings = NLLSettings(), *, progress: bool = True,
                 n_context: Sequence[int] | None = None) -> pd.DataFrame:
    """Per-document NLL (eq. (nll)) as a tidy frame with columns ``corpus, doc, n_tokens, nll``.

    ``documents``: strings or token-id sequences (e.g. a self-generated record's
    ``seed_ids + token_ids``), scored under ``settings`` (:class:`NLLSettings`). ``n_tokens`` is the
    number of counted targets; a document with none gets ``nll = NaN`` (and a warning). ``doc`` is the
    document's position in ``documents``. ``n_context``: per document, how many leading tokens (after
    tokenization, BOS included) are context only: targets at positions ``< n_context[d]`` are not
    counted (default: all targets count).
    """
    from moir_lib.generation import special_token_ids

    window = default_window(model) if settings.window is None else int(settings.window)
    batch_size, max_windows, exclude_ids = settings.batch_size, settings.max_windows, settings.exclude_ids
    _check_settings(window, batch_size, max_windows)
    exclude = special_token_ids(tokenizer) if exclude_ids is None else {int(i) for i in exclude_ids}
    docs = tokenize_documents(tokenizer, documents, add_bos=settings.add_bos)
    if not docs:
        raise ValueError(f"corpus {corpus!r} has no documents")
    context = [1] * len(docs) if n_context is None else [int(c) for c in n_context]
    if len(context) != len(docs):
        raise ValueError(f"n_context has {len(context)} entries for {len(docs)} documents")

    windows = _windows(docs, window, context, max_windows)
    sums, counts = _score_windows(model, tokenizer, windows, len(docs), exclude, batch_size, corpus, progress)
    with np.errstate(invalid="ignore", divide="ignore"):
        nll = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    empty = int((counts == 0).sum())
    if empty:
        log.warning("corpus %s: %d of %d documents have no counted target token (nll = NaN)", corpus, empty,
                    len(docs))
    return pd.DataFrame({"corpus": corpus, "doc": np.arange(len(docs)), "n_tokens": counts, "nll": nll})


#: A scoring window: (document index, its tokens, index of the first counted target).
_Window = tuple[int, list[int], int]


def _check_settings(window: int, batch_size: int, max_windows: int | None) -> None:
    """Reject a window under 2 tokens, a non-positive batch size or ``max_windows``."""
    if window < 2:
        raise ValueError(f"window must be at least 2 tokens (one context + one target), got {window}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if max_windows is not None and max_windows <= 0:
        raise ValueError(f"max_windows must be positive or None, got {max_windows}")


def _windows(docs: list[list[int]], window: int, context: list[int],
             max_windows: int | None) -> list[_Window]:
    """Contiguous windows of ``window`` tokens per document (those with a target), longest first."""
    windows: list[_Window] = []
    for d, ids in enumerate(docs):
        starts = list(range(0, len(ids), window))
        if max_windows is not None:
            starts = starts[:max_windows]
        windows += [(d, ids[s:s + window], max(1, context[d] - s)) for s in starts
                    if len(ids[s:s + window]) >= 2]
    windows.sort(key=lambda w: -len(w[1]))  # similar lengths together: less padding
    return windows


def _score_windows(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, windows: list[_Window],
                   n_docs: int, exclude: set[int], batch_size: int, corpus: str,
                   progress: bool) -> tuple[Float[np.ndarray, " docs"], Int[np.ndarray, " docs"]]:
    """Per document: the summed cross-entropy of its counted targets and their count (in eval mode)."""
    import torch
    from tqdm.auto import tqdm

    sums = np.zeros(n_docs, dtype=np.float64)
    counts = np.zeros(n_docs, dtype=np.int64)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    excluded = torch.tensor(sorted(exclude), dtype=torch.long) if exclude else None
    was_training = model.training
    model.eval()
    bar = tqdm(total=len(windows), unit="window", desc=f"NLL {corpus}", disable=not progress,
               dynamic_ncols=True)
    try:
        for s in range(0, len(windows), batch_size):
            batch = windows[s:s + batch_size]
            _score_batch(model, batch, pad, excluded, device, sums, counts)
            bar.update(len(batch))
    finally:
        bar.close()
        model.train(was_training)
    return sums, counts


def _score_batch(model: PreTrainedModel, batch: list[_Window], pad: int,
                 excluded: Int[torch.Tensor, " excluded"] | None, device: torch.device,
                 sums: Float[np.ndarray, " docs"], counts: Int[np.ndarray, " docs"]) -> None:
    """One right-padded forward pass over ``batch``; adds its counted targets to ``sums`` and ``counts``."""
    import torch
    import torch.nn.functional as F

    width = max(len(c) for _, c, _ in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, (_, c, _) in enumerate(batch):
        ids[r, :len(c)] = torch.tensor(c)
        mask[r, :len(c)] = 1
    with torch.inference_mode():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        for r, (d, c, first) in enumerate(batch):
            targets = ids[r, 1:len(c)]
            keep = (~torch.isin(targets, excluded) if excluded is not None
                    else torch.ones_like(targets, dtype=torch.bool))
            keep[:first - 1] = False  # targets before the document's n_context: context only
            if not bool(keep.any()):
                continue
            ce = F.cross_entropy(logits[r, :len(c) - 1].float(), targets.to(device), reduction="none")
            sums[d] += float(ce[keep.to(device)].double().sum())
            counts[d] += int(keep.sum())
