"""A self-generation request checked before any model work, and the configuration its manifest records.

:class:`GenerationSettings` is what a generation is asked for; :func:`_validated_plan` resolves it, with the
model and the shard of :func:`moir_lib.generation.self_generate` (the seed tokens, the decode loop, the
special ids), into one :class:`_Plan`, or raises ``ValueError``
(a missing vLLM or GPU ``RuntimeError``) saying what to change; :func:`_manifest_config` is what
every shard of a generation must agree on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from moir_lib.generation.decoding import _resolve_loop, _Sampling
from moir_lib.generation.seeds import SeedStrategy, _bos_id, _eos_ids, parse_seed_strategy, seed_candidates
from moir_lib.generation.shards import FORMAT_VERSION, validate_shard, vocabulary_fingerprint

if TYPE_CHECKING:
    from jaxtyping import Int64
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from moir_lib.generation.stopping import StopRule


@dataclass(frozen=True)
class GenerationSettings:
    """One self-generation (Algorithm 1) as :func:`~moir_lib.generation.self_generate` takes it: what
    is sampled, the keys collected during generation, the decode loop (every shard of a generation has the
    same).

    ``seed_strategy``: ``"bos"``, ``"rand<k>"`` or ``"prompt:<text>"``. ``max_new_tokens``: sampled tokens
    per sample at most (the paper: 256). ``batch_size``: rows decoded together (does not change the output).
    ``seed``: the global seed. ``collect_layers``: accumulate the keys of these layers during generation
    (``key_positions``: ``"generated"`` = the sampled tokens, as in Algorithm 1, or ``"all"`` = seed
    tokens too). ``prefixes``: global sample counts ``m`` at which the keys of the samples below ``m`` are
    saved too (:mod:`.keystats`; needs ``collect_layers``). ``stop``: a
    :class:`~moir_lib.generation.stopping.StopRule` (one shard, ``collect_layers``, its first check a
    multiple of ``batch_size``): the generation ends at the first check where ``C`` has converged, and its
    manifest records the outcome. ``loop``: ``"dynamic"`` (a growing KV cache, one kernel launch per op and
    step), ``"static"`` (a pre-allocated KV cache; on CUDA, without ``collect_layers``, the decode step is
    captured as CUDA graphs) or ``"auto"`` (``"static"`` where it is captured, else ``"dynamic"``); both
    loops give the same tokens. ``backend``: ``"torch"`` (:mod:`.decoding`'s sampler) or ``"vllm"``
    (:mod:`moir_lib.vllm_backend`: GPU only, per-sample seeds, no ``collect_layers``).
    """

    seed_strategy: str
    n_samples: int
    max_new_tokens: int
    batch_size: int
    seed: int = 0
    collect_layers: Sequence[int] | None = None
    key_positions: str = "generated"
    prefixes: Sequence[int] = ()
    stop: StopRule | None = None
    loop: str = "auto"
    backend: str = "torch"


@dataclass(frozen=True)
class _Plan:
    """A validated :func:`_self_generate` request: what the manifest records and the block loop needs."""

    strategy: SeedStrategy
    seed: int
    n_samples: int
    max_new_tokens: int
    batch_size: int
    shard: tuple[int, int]
    adapter: Any  # moir_lib.models.ModelAdapter
    layers: list[int] | None  # collect_layers, checked
    key_positions: str
    loop: str
    capture: bool
    backend: str
    bos: int | None
    eos_ids: list[int]
    pad_id: int
    candidates: Int64[np.ndarray, " candidates"] | None  # rand<k>: the seed-token candidates
    prompt_ids: list[int] | None  # prompt:<text>: its token ids

    @property
    def sampling(self) -> _Sampling:
        """What the torch decode loops sample a block with."""
        return _Sampling(self.seed, self.max_new_tokens, self.eos_ids, self.pad_id,
                         count_seed=self.key_positions == "all")


#: bytes of bookkeeping per sample of a shard (its index in the owned list and the done set)
_BYTES_PER_SAMPLE = 128


def _check_fits_memory(n_samples: int, shard: tuple[int, int]) -> None:
    """``ValueError`` before any file is written when a shard's sample bookkeeping alone would take more
    than half of this machine's memory."""
    owned = -(-(int(n_samples) - shard[0]) // shard[1])
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf here: nothing to compare with
        return
    need = owned * _BYTES_PER_SAMPLE
    if need > total // 2:
        raise ValueError(f"n_samples {n_samples:,}: the {owned:,} samples of shard {shard[0]}/{shard[1]} "
                         f"need ≈{need / 2**30:,.0f} GiB of memory for their bookkeeping alone, more than "
                         f"half of this machine's {total / 2**30:,.0f} GiB: generate fewer samples, or split "
                         f"the generation into shards")


def _validated_plan(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: GenerationSettings,
                    shard: tuple[int, int] | None, engine: Any) -> _Plan:
    """Check ``settings`` and the other arguments of :func:`_self_generate` (``ValueError``; a missing vLLM
    or GPU ``RuntimeError``) before any model work, and resolve the seed tokens, loop and special ids."""
    from moir_lib import vllm_backend
    from moir_lib.models import ModelAdapter

    s = settings
    n_samples, max_new_tokens, batch_size, seed = s.n_samples, s.max_new_tokens, s.batch_size, s.seed
    key_positions, backend = s.key_positions, s.backend
    strategy = parse_seed_strategy(s.seed_strategy)
    sizes = (("n_samples", n_samples), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size))
    for name, value in sizes:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if key_positions not in ("generated", "all"):
        raise ValueError(f"key_positions must be 'generated' or 'all', got {key_positions!r}")
    shard = validate_shard(shard)
    _check_fits_memory(n_samples, shard)
    adapter = ModelAdapter.for_model(model, tokenizer)
    layers = adapter.check_layers(s.collect_layers) if s.collect_layers is not None else None
    loop, capture = _resolve_loop(model, s.loop, backend, layers is not None)
    if backend == "vllm":
        vllm_backend.check_available(build_engine=engine is None)
    bos = _bos_id(model, tokenizer)
    if strategy.kind == "bos" and bos is None:
        raise ValueError(f"seed strategy 'bos' needs a BOS token, and {adapter.name} has none: use rand<k> "
                         f"or prompt:<text>")
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    candidates = seed_candidates(tokenizer, adapter.vocab_size) if strategy.kind == "rand" else None
    prompt_ids = None
    if strategy.kind == "prompt":
        prompt_ids = list(tokenizer(strategy.text, add_special_tokens=False)["input_ids"])
        if not prompt_ids:
            raise ValueError(f"prompt {strategy.text!r} encodes to no tokens")
    seed_len = (bos is not None) + (strategy.k if strategy.kind == "rand" else len(prompt_ids or []))
    _check_room(model, seed_len, max_new_tokens, bos)
    return _Plan(strategy, seed, n_samples, max_new_tokens, batch_size, shard, adapter, layers, key_positions,
                 loop, capture, backend, bos, eos_ids, pad_id, candidates, prompt_ids)


def _check_room(model: PreTrainedModel, seed_len: int, max_new_tokens: int, bos: int | None) -> None:
    """A seed of ``seed_len`` tokens plus ``max_new_tokens`` must fit the model's positions."""
    limit = _max_positions(model)
    if limit is not None and seed_len >= limit:
        longest = limit - 1 - (bos is not None)
        raise ValueError(f"a seed of {seed_len} tokens leaves no room in the model's {limit} positions: use "
                         f"a shorter seed (rand<k> with k <= {longest}, or a shorter prompt)")
    if limit is not None and seed_len + max_new_tokens > limit:
        raise ValueError(f"a seed of {seed_len} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
                         f"{limit} positions: lower max_new_tokens to at most {limit - seed_len}")


def _max_positions(model: PreTrainedModel) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _manifest_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     plan: _Plan) -> dict[str, Any]:
    """The generation's configuration as the manifest records it (every shard of a generation must agree
    on it)."""
    from moir_lib import vllm_backend
    from moir_lib.models import model_fingerprint

    return {
        "format": FORMAT_VERSION,
        "seed_strategy": plan.strategy.spec,
        "seed": int(plan.seed),
        "n_samples": int(plan.n_samples),
        "max_new_tokens": int(plan.max_new_tokens),
        "n_shards": plan.shard[1],
        "model_fingerprint": model_fingerprint(model),
        "tokenizer": str(getattr(tokenizer, "name_or_path", "")),
        "tokenizer_fingerprint": vocabulary_fingerprint(tokenizer),  # key kept: existing generation dirs
        "bos_id": plan.bos,
        "eos_ids": plan.eos_ids,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": None,
                     "method": ("inverse-CDF, SplitMix64 stream per sample index" if plan.backend == "torch"
                                else vllm_backend.SAMPLING_METHOD)},
        "collect_layers": plan.layers,
        "key_positions": plan.key_positions if plan.layers is not None else None,
    }
