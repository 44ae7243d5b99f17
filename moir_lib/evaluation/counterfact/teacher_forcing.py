"""Teacher-forced scores: the per-token log-probabilities and argmax hits of a target after its
prefix, behind ES/PS (length-normalised NLL), NS (every token the argmax) and the EasyEdit token
accuracies.

**Batching.** Teacher-forced scoring: one forward pass per batch of ``prefix + target``
sequences, right-padded (causal attention and position ids of real tokens are unaffected) and
sorted by length; identical sequences are scored once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class TargetScore:
    """Per-token log-probabilities and argmax hits of one target under teacher forcing."""

    logprobs: tuple[float, ...]
    correct: tuple[bool, ...]

    @property
    def mean_logprob(self) -> float:
        return math.fsum(self.logprobs) / len(self.logprobs)

    @property
    def nll(self) -> float:
        """Length-normalised negative log-likelihood ``-(1/T) Σ_t log P(o_t | x, o_<t)``."""
        return -self.mean_logprob

    @property
    def token_accuracy(self) -> float:
        """EasyEdit's ``(1/T) Σ_t 1[argmax = o_t]``."""
        return sum(self.correct) / len(self.correct)

    @property
    def all_correct(self) -> bool:
        """Every token the argmax (greedy decoding would produce the target)."""
        return all(self.correct)


def _model_device(model: Any) -> torch.device:
    import torch

    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _logits_of(output: Any) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output[0]


def _tqdm(iterable: Iterable[Any], *, progress: bool, desc: str, total: int | None = None) -> Iterable[Any]:
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, disable=not progress, leave=False)


def teacher_forced_scores(model: PreTrainedModel, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                          batch_size: int = 16, pad_token_id: int = 0, progress: bool = False,
                          desc: str = "teacher forcing") -> list[TargetScore]:
    """Score each ``(prefix, target)`` id pair: ``log P(target_t | prefix, target_<t)`` and argmax hits.

    One forward pass per batch of ``prefix + target`` sequences, right-padded (with an
    attention mask) and sorted by length; identical pairs are scored once. Logits are read
    in float32 at the positions that predict the target tokens.
    """
    import torch

    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    keys: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for i, (prefix, target) in enumerate(sequences):
        prefix_t, target_t = tuple(int(t) for t in prefix), tuple(int(t) for t in target)
        if not prefix_t or not target_t:
            raise ValueError(f"sequence {i}: prefix and target need ≥ 1 token each "
                             f"(got {len(prefix_t)} and {len(target_t)})")
        keys.append((prefix_t, target_t))
    unique = sorted(set(keys), key=lambda k: (-(len(k[0]) + len(k[1])), k))
    device = _model_device(model)
    scores: dict[tuple[tuple[int, ...], tuple[int, ...]], TargetScore] = {}
    batches = [unique[i:i + batch_size] for i in range(0, len(unique), batch_size)]
    with torch.inference_mode():
        for batch in _tqdm(batches, progress=progress, desc=desc):
            width = max(len(p) + len(t) for p, t in batch)
            input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            rows, cols, gold = [], [], []
            for b, (prefix, target) in enumerate(batch):
                seq = prefix + target
                input_ids[b, :len(seq)] = torch.tensor(seq)
                mask[b, :len(seq)] = 1
                n = len(prefix)
                rows += [b] * len(target)
                cols += range(n - 1, n - 1 + len(target))  # logits at position p predict token p + 1
                gold += target
            logits = _logits_of(model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                      use_cache=False))
            where = logits.device
            picked = logits[torch.tensor(rows, device=where), torch.tensor(cols, device=where)].float()
            gold_t = torch.tensor(gold, device=picked.device)
            logprobs = torch.log_softmax(picked, dim=-1).gather(1, gold_t[:, None])[:, 0].cpu().tolist()
            hits = (picked.argmax(dim=-1) == gold_t).cpu().tolist()
            start = 0
            for prefix, target in batch:
                stop = start + len(target)
                scores[(prefix, target)] = TargetScore(tuple(logprobs[start:stop]), tuple(bool(h) for h in
                                                                                          hits[start:stop]))
                start = stop
    return [scores[k] for k in keys]
