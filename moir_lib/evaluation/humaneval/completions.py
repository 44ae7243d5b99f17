"""HumanEval completions from an in-memory model: sampled (the paper's ``temperature=0.2, top_p=0.95``
by default) in left-padded, seeded batches, each cut at the first stop sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from moir_lib.evaluation.humaneval.problems import truncate_at_stop
from moir_lib.evaluation.humaneval.sampling_settings import PAPER_HUMANEVAL, HumanEvalSettings

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def generate_completions(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                         settings: HumanEvalSettings = PAPER_HUMANEVAL, *,
                         progress: bool = True) -> list[list[str]]:
    """``settings.n`` sampled completions per prompt, each cut at the first stop sequence.

    ``temperature=0`` decodes greedily. Sampling is seeded (``seed`` + batch index) inside
    ``torch.random.fork_rng``, so the global RNG is untouched. Prompts are left-padded in
    batches of ``batch_size`` prompts; generation of a row stops once its text holds a stop
    sequence (or EOS).
    """
    temperature, top_p, batch_size = settings.temperature, settings.top_p, settings.batch_size
    if settings.n < 1:
        raise ValueError(f"n must be >= 1, got {settings.n}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
    sampling: dict[str, Any] = {"do_sample": True, "temperature": temperature, "top_p": top_p} \
        if temperature > 0 else {"do_sample": False}
    out: list[list[str]] = []
    with _left_padding(tokenizer):
        batches = [list(prompts[i:i + batch_size]) for i in range(0, len(prompts), batch_size)]
        iterator: Iterable[tuple[int, list[str]]] = enumerate(batches)
        if progress:
            from tqdm.auto import tqdm

            iterator = tqdm(iterator, total=len(batches), desc="humaneval generation", unit="batch")
        for b, batch in iterator:
            out += _complete_batch(model, tokenizer, batch, device, settings, seed=settings.seed + b,
                                   pad_id=pad_id, sampling=sampling)
    return out


@contextlib.contextmanager
def _left_padding(tokenizer: PreTrainedTokenizerBase) -> Iterator[None]:
    """Left padding (EOS standing in for a missing pad token) while the block runs; restored after."""
    old_side, old_pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if old_pad is None:  # padding needs a pad token; EOS stands in (restored below)
        tokenizer.pad_token = tokenizer.eos_token
    try:
        yield
    finally:
        tokenizer.padding_side = old_side
        if old_pad is None:
            tokenizer.pad_token = None


def _text_after(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The decoded continuation ``new_ids`` of ``prompt_ids``."""
    # decode prompt + continuation and strip the decoded prompt: decoding the continuation alone
    # loses the leading space of SentencePiece tokens
    prefix = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    full = tokenizer.decode(prompt_ids + new_ids, skip_special_tokens=True)
    if full.startswith(prefix):
        return full[len(prefix):]
    return tokenizer.decode(new_ids, skip_special_tokens=True)


def _stop_strings(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[list[int]], width: int, n: int,
                  pad_id: int, stop: Sequence[str]) -> Any:
    """A ``StoppingCriteriaList`` ending each row once its new text holds a stop sequence."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _StopStrings(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            done = []
            for row, ids in enumerate(input_ids.tolist()):
                new = [t for t in ids[width:] if t != pad_id]
                done.append(any(s in _text_after(tokenizer, prompt_ids[row // n], new) for s in stop))
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_StopStrings()])


def _complete_batch(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch: list[str],
                    device: torch.device, settings: HumanEvalSettings, *, seed: int, pad_id: int,
                    sampling: dict[str, Any]) -> list[list[str]]:
    """``settings.n`` completions per prompt of one left-padded batch, sampled under ``seed`` (the batch's)
    in a forked RNG."""
    import torch

    n, stop = settings.n, settings.stop
    enc = tokenizer(batch, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    prompt_ids = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], mask, strict=True)]
    width = enc["input_ids"].shape[1]
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []), \
            torch.no_grad():
        torch.manual_seed(seed)
        generated = model.generate(
            input_ids=enc["input_ids"].to(device), attention_mask=mask.to(device),
            max_new_tokens=settings.max_new_tokens, num_return_sequences=n, pad_token_id=pad_id,
            stopping_criteria=_stop_strings(tokenizer, prompt_ids, width, n, pad_id, stop), **sampling,
        )
    rows = generated[:, width:].tolist()
    eos = tokenizer.eos_token_id
    out = []
    for i in range(len(batch)):
        samples = []
        for j in range(n):
            new = rows[i * n + j]
            if eos is not None and eos in new:
                new = new[:new.index(eos)]
            new = [t for t in new if t != pad_id]
            samples.append(truncate_at_stop(_text_after(tokenizer, prompt_ids[i], new), stop))
        out.append(samples)
    return out
