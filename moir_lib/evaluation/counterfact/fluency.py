"""Fluency: continuations of each record's generation prompts, scored by the evaluated model
itself under teacher forcing (``f``, the mean token log-probability behind ``Fluency*``).

**Batching.** Left-padded batches through ``model.generate`` with an explicit generation config
(``use_model_defaults=False``: a model's own sampling defaults, e.g. Qwen3's, never leak into greedy
decoding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from moir_lib.data import CounterFactRecord
from moir_lib.evaluation.counterfact.scoring_settings import CounterFactSettings
from moir_lib.evaluation.counterfact.targets import SpecialIds, _ids
from moir_lib.evaluation.counterfact.teacher_forcing import _model_device, _tqdm, teacher_forced_scores
from moir_lib.timings import timed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: A fluency generation: (record index, prompt, prompt source, token prefix).
_Generation = tuple[int, str, str, tuple[int, ...]]


def _generation_plan(tokenizer: PreTrainedTokenizerBase, records: list[CounterFactRecord],
                     max_fluency_prompts: int | None, add_bos: bool, bos_id: int | None) -> list[_Generation]:
    """The fluency prompts of every record (its generation prompts, else its rewrite prompt), tokenised."""
    gen_plan: list[_Generation] = []
    for r, rec in enumerate(records):
        prompts, source = (list(rec.generation_prompts), "generation_prompts") if rec.generation_prompts \
            else ([rec.filled_prompt], "rewrite prompt")
        if max_fluency_prompts is not None:
            prompts = prompts[:max_fluency_prompts]
        for prompt in prompts:
            prefix = _ids(tokenizer, prompt.rstrip(" "))
            if add_bos and (not prefix or prefix[0] != bos_id):
                prefix = [bos_id, *prefix]
            gen_plan.append((r, prompt, source, tuple(prefix)))
    return gen_plan


def _continuations(model: PreTrainedModel, prefixes: list[tuple[int, ...]], settings: CounterFactSettings,
                   ids: SpecialIds, *, progress: bool) -> list[Any]:
    """One continuation per prefix; greedy decoding generates each distinct prefix once (deterministic)."""
    if settings.decoding == "greedy":
        distinct = list(dict.fromkeys(prefixes))
        generated = _generate(model, distinct, settings, ids, progress=progress)
        conts = dict(zip(distinct, generated, strict=True))
        return [conts[p] for p in prefixes]
    return _generate(model, prefixes, settings, ids, progress=progress)


def _generate(model: PreTrainedModel, prefixes: Sequence[Sequence[int]], settings: CounterFactSettings,
              ids: SpecialIds, *, progress: bool) -> list[tuple[int, ...]]:
    """Continuations of each prefix (left-padded batches of ``settings.batch_size``, up to
    ``settings.max_gen_tokens`` tokens under ``settings.decoding``), cut after the first stop token (kept).

    Stop tokens: ``ids.eos`` (the tokenizer's) and the model's own EOS ids (generation
    config, then config; Llama-3-Instruct lists several), so what ``generate`` stops on is
    exactly what is cut; rows are padded with ``ids.pad``.
    """
    import torch
    from transformers import GenerationConfig

    if not hasattr(model, "generate"):
        raise TypeError(f"{type(model).__name__} has no generate(): Fluency* needs a transformers causal LM "
                        f"(or pass compute_fluency=False)")
    decoding, batch_size, pad_token_id = settings.decoding, settings.batch_size, ids.pad
    stops = _stop_ids(model, ids.eos)
    config = GenerationConfig(max_new_tokens=settings.max_gen_tokens, do_sample=decoding == "sample",
                              num_beams=1, pad_token_id=pad_token_id, eos_token_id=stops or None)
    if decoding == "sample":  # plain ancestral sampling: no top-k / top-p truncation
        config.top_k = 0
        config.top_p = 1.0
        config.temperature = 1.0
    device = _model_device(model)
    out: list[tuple[int, ...]] = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        torch.manual_seed(settings.seed)
        batches = [prefixes[i:i + batch_size] for i in range(0, len(prefixes), batch_size)]
        for batch in _tqdm(batches, progress=progress, desc="fluency generation"):
            width = max(len(p) for p in batch)
            input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for b, prefix in enumerate(batch):
                input_ids[b, width - len(prefix):] = torch.tensor(list(prefix))
                mask[b, width - len(prefix):] = 1
            generated = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                       generation_config=config, use_model_defaults=False)
            for row in generated[:, width:].cpu().tolist():
                cut = next((i for i, t in enumerate(row) if t in stops), None)
                if cut is not None:
                    row = row[:cut + 1]
                out.append(tuple(int(t) for t in row))
    return out


def _stop_ids(model: Any, eos_token_id: int | None) -> list[int]:
    ids: list[int] = [] if eos_token_id is None else [int(eos_token_id)]
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        for e in eos if isinstance(eos, list | tuple) else [eos]:
            if isinstance(e, int) and e not in ids:
                ids.append(e)
    return ids


@timed("Fluency generation")
def _fluency_rows(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  records: list[CounterFactRecord], gen_plan: list[_Generation], continuations: list[Any],
                  *, batch_size: int, pad_id: int, progress: bool) -> list[dict[str, Any]]:
    """One row per generation: its continuation and mean token log-probability under the model itself."""
    scorable = [(p, c) for (*_, p), c in zip(gen_plan, continuations, strict=True) if c]
    cont_scores = iter(teacher_forced_scores(model, scorable, batch_size=batch_size, pad_token_id=pad_id,
                                             progress=progress, desc="fluency scoring"))
    gen_rows: list[dict[str, Any]] = []
    for (r, prompt, source, _), cont in zip(gen_plan, continuations, strict=True):
        lp = next(cont_scores).mean_logprob if cont else math.nan
        gen_rows.append({"case_id": records[r].case_id, "prompt": prompt, "prompt_source": source,
                         "continuation": tokenizer.decode(list(cont)), "n_tokens": len(cont),
                         "mean_logprob": lp, "_r": r})
    return gen_rows
