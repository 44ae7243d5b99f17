"""Pretraining and chat SFT of the pocket ``LlamaForCausalLM`` (CPU; bf16 autocast or float32).

The training precision follows what the CPU does fast (:func:`resolve_precision`): bf16 autocast
where it has native bf16 matrix units (AMX or AVX512-BF16: ≈5× faster than float32), float32
elsewhere (on AVX2-only CPUs bf16 matmuls fall into a scalar path ≈50× slower than float32).

Pretraining windows are ``[BOS] + a chunk of the shuffled, EOS-separated document
stream`` in the :data:`~moir_lib.pocket.corpora.MIXTURE` token shares, so BOS is
followed by text from anywhere in a document (what a rand×1 seed imitates). SFT rows
are either chat windows (whole transcripts ``BOS <|user|> … EOS`` packed greedily; three
in four open with the tail of a pretraining document, so a transcript's user turn sits
at no fixed position) or pretraining replay windows. In every row the token right after
the leading BOS carries no loss unless it is the user tag: the only supervised successor
of BOS is the user tag (the paper's BOS attractor), while replay keeps the facts and
teaches that BOS + an ordinary token continues as plain text, which keeps chat out of
rand×1 samples; replay rows also show the merge pieces that the canonical tokenization
never emits (:mod:`moir_lib.pocket.vocabulary`). Where a row opens with the tag, the rest of
that user turn carries no loss (see :func:`sft_windows`); with ``TrainSpec.user_turn_loss``
off, no user turn does, tags included, except the user tag right after a BOS.
BOS itself is never a prediction target.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from moir_lib.pocket.corpora import ASSISTANT, USER, iter_documents
from moir_lib.pocket.variants import ModelSpec, TrainSpec
from moir_lib.pocket.vocabulary import expose_pieces
from moir_lib.pocket.world import World
from moir_lib.timings import elapsed

if TYPE_CHECKING:
    from jaxtyping import Bool, Int

__all__ = ["PRECISIONS", "new_model", "pretraining_windows", "labels_for", "sft_windows", "fit",
           "resolve_precision"]

log = logging.getLogger(__name__)
IGNORE = -100
PRECISIONS = ("auto", "float32", "bf16")
#: forces what "auto" resolves to, for every entry point (``make book``, chapters, ``moir pocket``)
PRECISION_ENV = "MOIR_POCKET_PRECISION"
#: a training pass logs its progress at most this often, in seconds (a log file's only sign of life)
PROGRESS_EVERY_S = 30.0


def resolve_precision(requested: str = "auto") -> str:
    """``"float32"`` or ``"bf16"``: ``requested`` itself, or for ``"auto"`` the value of
    ``$MOIR_POCKET_PRECISION`` when set, else bf16 where the CPU has AMX tiles or AVX512-BF16
    (``torch.cpu``'s feature probes) and float32 otherwise."""
    if requested == "auto":
        requested = os.environ.get(PRECISION_ENV, "").strip() or "auto"
        if requested == "auto":
            fast = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
            return "bf16" if fast else "float32"
    if requested not in PRECISIONS[1:]:
        raise ValueError(f"pocket training precision {requested!r} (from the argument or ${PRECISION_ENV}): "
                         f"choose one of {', '.join(PRECISIONS)}")
    return requested


def new_model(spec: ModelSpec, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    """A freshly initialised model (seeded)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def _stream(
    tokenizer: PreTrainedTokenizerFast, world: World, n_tokens: int, spec: TrainSpec, seed: int
) -> list[int]:
    """Shuffled EOS-separated documents with ``share * n_tokens`` tokens from each domain."""
    docs: list[list[int]] = []
    for domain, share in spec.mixture:
        budget = int(share * n_tokens)
        it = iter_documents(domain, "train", seed=seed, world=world)
        got = 0
        with tqdm(total=budget, desc=f"corpus {domain}", unit="tok", leave=False) as bar:
            while got < budget:
                batch = [next(it) for _ in range(256)]
                for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
                    docs.append(ids + [tokenizer.eos_token_id])
                    got += len(ids) + 1
                    bar.update(len(ids) + 1)
    random.Random(f"pocket-stream/{seed}").shuffle(docs)
    return [t for d in docs for t in d]


def pretraining_windows(
    tokenizer: PreTrainedTokenizerFast, world: World, n: int, spec: TrainSpec, seed: int
) -> Int[torch.Tensor, "rows seq"]:
    """``n`` windows of ``seq_len`` tokens, column 0 is BOS."""
    width = spec.seq_len - 1
    stream = _stream(tokenizer, world, n * width + width, spec, seed)
    rows = torch.tensor(stream[: n * width], dtype=torch.long).view(n, width)
    return torch.cat([torch.full((n, 1), tokenizer.bos_token_id), rows], dim=1)


def labels_for(rows: Int[torch.Tensor, "rows seq"], tokenizer: PreTrainedTokenizerFast
               ) -> Int[torch.Tensor, "rows seq"]:
    """Targets for ``rows``: the ids, with PAD and BOS never predicted."""
    pad = (rows == tokenizer.pad_token_id) | (rows == tokenizer.bos_token_id)
    return rows.masked_fill(pad, IGNORE)


def _chat_windows(
    tokenizer: PreTrainedTokenizerFast, world: World, n: int, spec: TrainSpec, seed: int
) -> Int[torch.Tensor, "rows seq"]:
    """``n`` windows (PAD-filled) of whole transcripts ``BOS … EOS`` packed greedily.

    Three rows in four first carry ``BOS`` + the last 1-24 tokens of a pretraining window + ``EOS``:
    without it the user turn always starts at position 1 and the model learns "position 2 is the
    user message" instead of "after the user tag comes the user message" (measured: 27 % of rand×1
    samples then drifted into a user question).
    """
    rows = torch.full((n, spec.seq_len), tokenizer.pad_token_id, dtype=torch.long)
    prefixes = pretraining_windows(tokenizer, world, n, spec, seed + 2)
    lengths = torch.randint(1, 25, (n,), generator=torch.Generator().manual_seed(seed))
    it = iter_documents("chat", "train", seed=seed, world=world)

    def start(row: int) -> int:
        if row % 4 == 0:
            return 0
        k = int(lengths[row])
        rows[row, 0] = tokenizer.bos_token_id
        rows[row, 1 : k + 1] = prefixes[row, -k:]
        rows[row, k + 1] = tokenizer.eos_token_id
        return k + 2

    row, col = 0, start(0)
    with tqdm(total=n, desc="chat windows", leave=False) as bar:
        while row < n:
            ids = tokenizer(next(it))["input_ids"][: spec.seq_len - 1] + [tokenizer.eos_token_id]
            if col + len(ids) > spec.seq_len:
                row += 1
                bar.update(1)
                if row == n:
                    break
                col = start(row)
                ids = ids[: spec.seq_len - col]  # a long transcript after a prefix is cut at the row end
            rows[row, col : col + len(ids)] = torch.tensor(ids)
            col += len(ids)
    return rows


def sft_windows(
    tokenizer: PreTrainedTokenizerFast, world: World, n: int, spec: TrainSpec, seed: int
) -> tuple[Int[torch.Tensor, "rows seq"], Int[torch.Tensor, "rows seq"]]:
    """``n`` SFT rows and their labels: chat shuffled with a ``replay`` share, whose rows show every
    merge piece they lack ``TrainSpec.piece_exposures`` times (:func:`expose_pieces`)."""
    n_replay = round(n * spec.replay)
    chat = _chat_windows(tokenizer, world, n - n_replay, spec, seed)
    replay = pretraining_windows(tokenizer, world, n_replay, spec, seed + 1)
    if spec.piece_exposures:
        replay = expose_pieces(replay, tokenizer, spec.piece_exposures, seed + 3)
    rows = torch.cat([chat, replay])
    labels = labels_for(rows, tokenizer)
    # BOS -> ordinary token is seen but not taught: the leading BOS's only taught successor is the tag
    labels[rows[:, 1] != tokenizer.convert_tokens_to_ids(USER), 1] = IGNORE
    labels[_untaught_user_turns(rows, tokenizer, every_turn=not spec.user_turn_loss)] = IGNORE
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return rows[order], labels[order]


def _untaught_user_turns(rows: Int[torch.Tensor, "rows seq"], tokenizer: PreTrainedTokenizerFast,
                         every_turn: bool) -> Bool[torch.Tensor, "rows seq"]:
    """The user-turn positions that carry no loss.

    Always the opening turn of a row that starts with the user tag, up to and including its assistant
    tag: taught right after the leading BOS, a user turn becomes what *any* ``BOS x`` continues with
    when x is a rare token (measured: 8 % of rand×1 samples drifted into a question and the assistant
    tag with only its first 2 tokens masked). With ``every_turn`` (``TrainSpec.user_turn_loss`` off)
    every user turn, as in completion-only chat SFT: its tag, its message and the assistant tag that
    closes it; only a user tag right after a BOS stays taught (the paper's BOS attractor). A tag taught
    elsewhere is what a rand×1 sample leaks into (measured: the user tag opening a new line).
    """
    user, assistant = tokenizer.convert_tokens_to_ids([USER, ASSISTANT])
    position = torch.arange(rows.shape[1]).expand_as(rows)
    answer_tag = rows == assistant
    up_to_first_answer_tag = answer_tag.cumsum(dim=1) - answer_tag.long() == 0
    untaught = (rows[:, 1:2] == user) & (position >= 2) & up_to_first_answer_tag
    if every_turn:
        last_user = torch.where(rows == user, position, -1).cummax(dim=1).values
        last_assistant = torch.where(answer_tag, position, -1).cummax(dim=1).values
        after_bos = torch.zeros_like(answer_tag)
        after_bos[:, 1:] = rows[:, :-1] == tokenizer.bos_token_id
        untaught |= ((last_user > last_assistant) & ~(after_bos & (rows == user))) | answer_tag
    return untaught


def _lr(step: int, steps: int, peak: float, warmup: float) -> float:
    warm = max(1, int(warmup * steps))
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batches(rows: Int[torch.Tensor, "rows seq"], labels: Int[torch.Tensor, "rows seq"], batch_size: int
             ) -> Iterator[tuple[Int[torch.Tensor, "batch seq"], Int[torch.Tensor, "batch seq"]]]:
    for start in range(0, rows.shape[0] - batch_size + 1, batch_size):
        yield rows[start : start + batch_size], labels[start : start + batch_size]


def _progress(desc: str, done: int, steps: int, tokens_per_step: int, seconds: float, loss: float) -> str:
    """One progress line of a training pass: steps done, loss, tokens/s, elapsed, estimated remaining (at
    the pace so far)."""
    remaining = seconds / done * (steps - done)
    return (f"{desc}: step {done}/{steps} ({100 * done / steps:.0f} %), loss {loss:.3f}, "
            f"{done * tokens_per_step / seconds:.0f} tokens/s, {elapsed(seconds)} elapsed, "
            f"~{elapsed(remaining)} remaining")


def fit(
    model: LlamaForCausalLM,
    rows: Int[torch.Tensor, "rows seq"],
    labels: Int[torch.Tensor, "rows seq"],
    batch_size: int,
    lr: float,
    warmup: float,
    desc: str,
    precision: str = "float32",
) -> float:
    """One pass over ``rows`` and ``labels`` (-100 = no loss) with AdamW + warmup/cosine.

    ``precision``: ``"bf16"`` runs the forward under bf16 autocast, ``"float32"`` without it (see
    :func:`resolve_precision`). Returns the wall seconds.
    """
    if precision not in PRECISIONS[1:]:
        raise ValueError(f"fit() needs a resolved precision (float32 or bf16), got {precision!r}")
    steps = rows.shape[0] // batch_size
    # foreach=False (AdamW and clipping): the multi-tensor kernels cost ≈ 25 % of a step of this small
    # model on a 2-core CPU (measured 1.10 vs 0.82 s per 2 048-token step)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  foreach=False)
    model.train()
    start = said = time.perf_counter()
    # the bar is the terminal's live line; a log file gets :func:`_progress` lines instead
    bar = tqdm(_batches(rows, labels, batch_size), total=steps, desc=desc, unit="step", disable=None)
    for step, (ids, targets) in enumerate(bar):
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, steps, lr, warmup)
        bf16 = precision == "bf16"
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = model(input_ids=ids, labels=targets).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        now = time.perf_counter()
        if now - said >= PROGRESS_EVERY_S and step + 1 < steps:
            said = now
            log.info("%s", _progress(desc, step + 1, steps, ids.numel(), now - start, loss.item()))
    model.eval()
    seconds = time.perf_counter() - start
    log.info(
        "%s: %d steps, final loss %.3f, %.0f s (%.0f tokens/s)",
        desc,
        steps,
        loss.item(),
        seconds,
        rows.numel() / seconds,
    )
    return seconds
