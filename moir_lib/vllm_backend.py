"""Self-generation with vLLM: ``self_generate(..., backend="vllm")`` (GPU only; the ``[vllm]`` extra).

The same generation directory as the torch backend (manifest, ``shard-XXXXX-of-YYYYY.jsonl`` records with
``seed_ids``/``token_ids``/``text``, crash-safe resume), so ``moir cov estimate --corpus <out_dir>``
reads it unchanged; only the sampler differs. Each sample ``i`` is one request with the seed
sequence of :func:`moir_lib.generation.seed_ids_for` as its prompt token ids and
``SamplingParams(seed=s_i)``, ``s_i`` a 63-bit SplitMix key of ``blake2b("moir-gen/<seed>/<i>/vllm")``:
untruncated ancestral sampling (temperature 1, top-p 1, no top-k, no min-p) until an EOS id or
``max_new_tokens``. vLLM draws from a generator seeded per request, so sample ``i`` depends on
``(seed, i)`` and on its logits only; vLLM's logits are not batch-invariant, so a token may flip where
``u`` lies within rounding of a CDF boundary (as for the torch backend on a GPU). The two backends
draw different tokens for the same ``(seed, i)`` (different random streams): the manifest's
``sampling.method`` says which made a generation, and a generation cannot be resumed with the other.

Keys cannot be collected during vLLM generation (the model runs inside vLLM): estimate C in a
second pass over the generation directory.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from moir_lib.streams import stream_key

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["SAMPLING_METHOD", "check_available", "decode_block", "engine_for", "requests", "sample_seed"]

log = logging.getLogger(__name__)

SAMPLING_METHOD = "vLLM sampler, SamplingParams(seed=blake2b per sample index)"
_SEED_MASK = (1 << 63) - 1


def check_available(build_engine: bool = True) -> None:
    """Raise ``RuntimeError`` saying what to do when vLLM cannot be imported or (``build_engine``) no
    CUDA device is visible."""
    import torch

    try:
        importlib.import_module("vllm")
    except ImportError as exc:
        raise RuntimeError(f"backend='vllm' needs vLLM ({exc}): on a GPU node, install the extra, "
                           f"pip install 'moir-lab[vllm]' (it brings the CUDA torch build vLLM pins), or "
                           f"use backend='torch'") from exc
    if build_engine and not torch.cuda.is_available():
        raise RuntimeError("backend='vllm' needs a CUDA device and none is visible: run on a GPU node, or "
                           "use backend='torch'")


def engine_for(model: PreTrainedModel, *, revision: str | None = None, **engine_kwargs: Any) -> Any:
    """A ``vllm.LLM`` over the weights ``model`` was loaded from (``config._name_or_path``), in its dtype.

    ``engine_kwargs`` go to ``vllm.LLM`` (e.g. ``max_model_len``, ``gpu_memory_utilization``,
    ``tensor_parallel_size``). Models without a hub id or folder (in-memory models) are refused.
    """
    from pathlib import Path

    source = str(getattr(model.config, "_name_or_path", "") or "")
    if not source or (source.startswith((".", "/")) and not Path(source).is_dir()):
        raise ValueError(f"vLLM loads weights from a hub id or a local folder, and this model's source is "
                         f"{source!r}: save it with save_pretrained(folder) and load it from there")
    import vllm

    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    log.info("building a vLLM engine for %s (%s)", source, dtype)
    return vllm.LLM(model=source, tokenizer=source, revision=revision, dtype=dtype, seed=0, **engine_kwargs)


def sample_seed(seed: int, index: int) -> int:
    """The vLLM request seed of sample ``index``: 63 bits of ``blake2b("moir-gen/<seed>/<index>/vllm")``."""
    return int(stream_key(seed, index, "vllm")) & _SEED_MASK


def requests(seeds: Sequence[Sequence[int]], indices: Sequence[int], seed: int, max_new_tokens: int,
             eos_ids: Sequence[int]) -> tuple[list[dict[str, list[int]]], list[Any]]:
    """``(prompts, sampling_params)`` for ``vllm.LLM.generate``: token-id prompts, one seeded
    ``SamplingParams`` per sample (untruncated sampling, stop at any of ``eos_ids``)."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [int(x) for x in s]} for s in seeds]
    params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, seed=sample_seed(seed, i),
                             max_tokens=max_new_tokens, stop_token_ids=list(eos_ids), ignore_eos=False,
                             skip_special_tokens=False, detokenize=False)
              for i in indices]
    return prompts, params


def _sampled(output: Any, index: int, eos_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """The sampled ids of one ``RequestOutput`` in the record format (a final EOS kept); checked."""
    completion = output.outputs[0]
    toks = [int(x) for x in completion.token_ids]
    eos = set(eos_ids)
    stopped = [t for t, x in enumerate(toks) if x in eos]
    if (stopped and stopped[0] != len(toks) - 1) or len(toks) > max_new_tokens:
        raise RuntimeError(f"vLLM returned {len(toks)} tokens for sample {index} with an EOS at step "
                           f"{stopped[0] if stopped else None}: not a sample of at most {max_new_tokens} "
                           f"tokens ending at its first EOS")
    if completion.finish_reason == "stop" and not stopped:
        raise RuntimeError(f"vLLM stopped sample {index} without an EOS id in its token_ids "
                           f"(stop_reason {getattr(completion, 'stop_reason', None)!r}); this vLLM version "
                           f"strips stop tokens, which the record format needs")
    return toks


def decode_block(engine: Any, seeds: list[list[int]], indices: list[int], seed: int, max_new_tokens: int,
                 eos_ids: list[int], count_rows: list[bool]) -> tuple[list[list[int]], int]:
    """Sample the rows of one block that are not on disk yet (``count_rows``) with ``engine.generate``.

    Returns the sampled ids per row (``[]`` for rows not requested) and the positions run (prompt +
    sampled tokens), as :func:`moir_lib.generation.decoding._decode_block` does.
    """
    todo = [r for r, new in enumerate(count_rows) if new]
    prompts, params = requests([seeds[r] for r in todo], [indices[r] for r in todo], seed, max_new_tokens,
                               eos_ids)
    outputs = engine.generate(prompts, params, use_tqdm=False)
    if len(outputs) != len(todo):
        raise RuntimeError(f"vLLM answered {len(outputs)} of {len(todo)} requests")
    sampled: list[list[int]] = [[] for _ in seeds]
    positions = 0
    for r, output in zip(todo, outputs, strict=True):
        sampled[r] = _sampled(output, indices[r], eos_ids, max_new_tokens)
        positions += len(seeds[r]) + len(sampled[r])
    return sampled, positions
