"""Vocabulary coverage: teach the BPE pieces that the canonical tokenization never emits.

A byte-level BPE keeps every intermediate merge in its vocabulary, but on the pocket corpora many
of them (≈15 % of the 3 000 tokens) are always merged further and never reach the model. With tied
embeddings such tokens drift to one shared vector, so a rand×1 seed that draws one of them acts as
a single token with a single continuation (measured: a new line in 75 % of such samples in one
organism; book/pocket_log.md). Real models see (nearly) their whole vocabulary. :func:`expose_pieces`
rewrites a few occurrences of a seen token into the pieces of its merge tree, the same text in a
non-canonical tokenization (as BPE-dropout does, Provilkov et al., 2020), so that every piece is
seen before its successor in ordinary text. Byte tokens that no text contains stay unseen.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerFast

if TYPE_CHECKING:
    from jaxtyping import Int

__all__ = ["merge_parts", "split_down_to", "expose_pieces"]


def merge_parts(tokenizer: PreTrainedTokenizerFast) -> dict[int, tuple[int, int]]:
    """Token id -> the ids of the two tokens whose BPE merge makes it (byte tokens are absent)."""
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    parts = {}
    for merge in model["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        parts[vocab[left + right]] = (vocab[left], vocab[right])
    return parts


def split_down_to(token: int, piece: int, parts: dict[int, tuple[int, int]]) -> list[int] | None:
    """``token`` as a sequence of pieces of its merge tree in which ``piece`` is one item (the other
    branches stay merged); ``None`` when ``piece`` is not in the tree."""
    if token == piece:
        return [token]
    if token not in parts:
        return None
    left, right = parts[token]
    inner = split_down_to(left, piece, parts)
    if inner is not None:
        return inner + [right]
    inner = split_down_to(right, piece, parts)
    return None if inner is None else [left] + inner


def expose_pieces(
    rows: Int[torch.Tensor, "rows seq"],
    tokenizer: PreTrainedTokenizerFast,
    per_piece: int,
    seed: int,
) -> Int[torch.Tensor, "rows seq"]:
    """``rows`` where every ordinary merge piece absent from them appears up to ``per_piece`` times.

    Each exposure rewrites one occurrence of a seen token whose merge tree holds the piece into
    :func:`split_down_to` pieces, at most one per row and with room before the row's end; the row's
    tail past ``seq`` columns is dropped, so each row decodes to a prefix of its old text.
    """
    parts = merge_parts(tokenizer)
    special = set(tokenizer.all_special_ids)
    counts = torch.bincount(rows.flatten(), minlength=len(tokenizer))
    unseen = {t for t in parts if counts[t] == 0 and t not in special}
    hosts: dict[int, list[int]] = {}  # unseen piece -> the seen tokens whose merge tree holds it
    for token in sorted(t for t in parts if counts[t] > 0):
        stack, tree = list(parts[token]), set()
        while stack:
            node = stack.pop()
            tree.add(node)
            stack.extend(parts.get(node, ()))
        for node in sorted(tree & unseen):
            hosts.setdefault(node, []).append(token)
    generator = torch.Generator().manual_seed(seed)
    width = rows.shape[1]
    edits: dict[int, tuple[int, list[int]]] = {}  # row -> (column, pieces)
    for piece in sorted(hosts):
        splits = [split_down_to(token, piece, parts) for token in hosts[piece]]
        places = torch.cat([
            torch.cat([(rows == token).nonzero(), torch.full((int(counts[token]), 1), i)], dim=1)
            for i, token in enumerate(hosts[piece])
        ])  # [occurrences, (row, column, host)]
        found = 0
        for row, column, host in places[torch.randperm(len(places), generator=generator)].tolist():
            if found == per_piece:
                break
            if row not in edits and 0 < column < width - len(splits[host]):
                edits[row] = (column, splits[host])
                found += 1
    out = rows.clone()
    for row, (column, pieces) in edits.items():
        tail = rows[row, column + 1 :].tolist()
        out[row, column:] = torch.tensor((pieces + tail)[: width - column])
    return out
