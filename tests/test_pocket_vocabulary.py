"""Vocabulary coverage: merge pieces exposed in replay rows, the same text in other tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moir_lib.pocket.tokenizer import train_tokenizer
from moir_lib.pocket.train import pretraining_windows, sft_windows
from moir_lib.pocket.variants import get_variant
from moir_lib.pocket.vocabulary import expose_pieces, merge_parts, split_down_to
from moir_lib.pocket.world import World


@pytest.fixture(scope="module")
def micro():
    spec = get_variant("micro")
    world = World(spec.world)
    tokenizer = train_tokenizer(world, spec.model.vocab_size, spec.train.tokenizer_docs_per_domain)
    rows = pretraining_windows(tokenizer, world, 200, spec.train, seed=1)
    return spec, world, tokenizer, rows


def test_a_split_spells_its_token_and_holds_the_piece(micro):
    _, _, tokenizer, _ = micro
    parts = merge_parts(tokenizer)
    assert len(parts) == len(tokenizer) - 256 - len(tokenizer.all_special_ids)  # every non-byte token
    for token, (left, right) in list(parts.items())[-200:]:
        for piece in (left, right, token):
            split = split_down_to(token, piece, parts)
            assert piece in split and tokenizer.decode(split) == tokenizer.decode([token])
        assert split_down_to(left, token, parts) is None  # a token is never inside its own part


def test_exposure_shows_every_hosted_piece_without_changing_the_text(micro):
    _, _, tokenizer, rows = micro
    parts = merge_parts(tokenizer)
    out = expose_pieces(rows, tokenizer, per_piece=2, seed=0)
    assert out.shape == rows.shape and (out[:, 0] == tokenizer.bos_token_id).all()
    changed = (out != rows).any(dim=1)
    assert 0 < int(changed.sum()) < len(rows)
    for row in changed.nonzero().flatten().tolist():
        assert tokenizer.decode(rows[row, 1:]).startswith(tokenizer.decode(out[row, 1:]))
    before = torch.bincount(rows.flatten(), minlength=len(tokenizer))
    after = torch.bincount(out.flatten(), minlength=len(tokenizer))
    newly = [t for t in parts if before[t] == 0 and after[t] > 0]
    assert len(newly) > 20 and int(changed.sum()) <= 2 * len(newly)  # one exposure per row, 2 per piece
    # the pieces still unseen have no seen token above them, or no room was left
    still = [t for t in parts if after[t] == 0]
    assert len(still) < len(newly) / 2
    assert torch.equal(out, expose_pieces(rows, tokenizer, per_piece=2, seed=0))
    assert not torch.equal(out, expose_pieces(rows, tokenizer, per_piece=2, seed=1))


def test_sft_replay_rows_carry_the_exposures(micro):
    spec, world, tokenizer, _ = micro
    on = dataclasses.replace(spec.train, piece_exposures=2)
    plain, _ = sft_windows(tokenizer, world, 64, spec.train, seed=3)
    exposed, labels = sft_windows(tokenizer, world, 64, on, seed=3)
    differ = (plain != exposed).any(dim=1)
    assert 0 < int(differ.sum()) <= round(64 * spec.train.replay)  # only replay rows change
    assert (labels[exposed == tokenizer.pad_token_id] == -100).all()
