"""The sampler and the decode loops of self-generation (the sampling step of Algorithm 1).

Sampling is the paper's untruncated ancestral sampling (temperature 1.0, top_p 1.0, no top-k: the
full softmax), until an EOS id (the tokenizer's EOS and every id of ``generation_config.eos_token_id``)
or ``max_new_tokens``. Note that ``transformers.generate(do_sample=True)`` applies ``top_k=50`` unless
told otherwise; we do not.

**Determinism per sample index.** Sample ``i`` uses two counter-based random streams, the
outputs of SplitMix64 seeded with ``blake2b("moir-gen/<seed>/<i>/<stream>")``: the ``seed`` stream
picks the random seed tokens, the ``sample`` stream gives one uniform ``u_{i,t}`` per step ``t``, and the
token is drawn by inverse-CDF sampling, ``x_t = min{v : F(v) > u_{i,t}}`` with ``F`` the float64
cumulative softmax. No generator state is shared between rows, so sample ``i``'s text depends only on
``(seed, i)`` and the model's logits for that row — not on the batch size, on the other rows, on
sharding or on resuming. (Logits themselves are computed in batches; on CPU they are batch-invariant
in our tests. On a GPU, kernels may round differently for different batch shapes, and a token can flip
only when ``u`` falls within that rounding error of a CDF boundary. A resumed generation re-forms exactly the
same batches as an uninterrupted one, so resuming is exact even there.)

**Decode loops and backends.** ``loop="dynamic"`` grows a ``DynamicCache`` step by step;
``loop="static"`` pre-allocates a ``StaticCache`` of ``seed + max_new_tokens`` positions and, on CUDA
without key collection, replays the decode step as CUDA graphs (``torch.compile(mode="reduce-overhead")``,
one capture per batch shape). Both feed the same logits to the same sampler, so they write the same
records (tested token for token); ``"auto"`` picks the static loop where it is captured. The vLLM
backend (:mod:`moir_lib.vllm_backend`) writes the same generation format with vLLM's sampler instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from moir_lib.streams import stream_key, uniforms

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Int
    from transformers import PreTrainedModel


def _inverse_cdf(logits: Float[torch.Tensor, "batch vocab"], u: Float[np.ndarray | torch.Tensor, " batch"]
                 ) -> Int[torch.Tensor, " batch"]:
    """``min{v : F(v) > u·F(V)}`` per row of ``logits``, with ``F`` the float64 cumulative softmax."""
    import torch

    probs = torch.softmax(logits.to(torch.float64), dim=-1)
    cdf = probs.cumsum(-1)
    target = torch.as_tensor(u, dtype=torch.float64, device=cdf.device) * cdf[:, -1]
    tok = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
    return tok.clamp_(max=logits.shape[-1] - 1)


def _left_padded(seeds: list[list[int]], pad_id: int
                 ) -> tuple[Int[torch.Tensor, "batch seq"], Int[torch.Tensor, "batch seq"],
                            Int[torch.Tensor, "batch seq"]]:
    """Seeds left-padded to one width: ``ids``, ``mask`` (1 = token), ``position_ids``."""
    import torch

    width = max(len(s) for s in seeds)
    ids = torch.full((len(seeds), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seeds), width), dtype=torch.long)
    for r, s in enumerate(seeds):
        if s:
            ids[r, width - len(s):] = torch.tensor(s)
            mask[r, width - len(s):] = 1
    if not bool(mask[:, -1].all()):
        raise ValueError("every seed sequence needs at least one token (the model has no BOS: use rand<k> "
                         "or prompt:<text>)")
    return ids, mask, (mask.cumsum(-1) - 1).clamp_(min=0)


@dataclass(frozen=True)
class _Sampling:
    """How a decode loop samples a block: the global ``seed`` (row ``i`` draws from the stream of
    ``(seed, i)``), at most ``max_new_tokens`` per row, a row ending at one of ``eos_ids``, ``pad_id`` in
    the finished rows; ``count_seed``: the seed tokens' keys count too (``key_positions="all"``)."""

    seed: int
    max_new_tokens: int
    eos_ids: list[int]
    pad_id: int
    count_seed: bool


def _decode_block(model: PreTrainedModel, sampling: _Sampling, seeds: list[list[int]], indices: list[int],
                  collector: Any, count_rows: list[bool]) -> tuple[list[list[int]], int]:
    """Sample continuations for one batch (the rows ``indices``, seeded ``seeds``) with a KV cache and left
    padding.

    Returns the sampled ids per row (a final EOS included) and the number of forward positions run.
    ``collector.set_mask`` gets, before each forward pass, which input positions count as keys (of the
    rows ``count_rows``).
    """
    import torch
    from transformers import DynamicCache

    max_new_tokens, pad_id = sampling.max_new_tokens, sampling.pad_id
    device = next(model.parameters()).device
    b = len(seeds)
    ids, mask, position_ids = _left_padded(seeds, pad_id)
    width = ids.shape[1]
    # Rows never interact, so without left padding no mask is needed: a finished row attends to its
    # pads, but its outputs are discarded. Dropping the mask lets SDPA use its fused GQA kernels
    # (3.6x faster decode steps for Llama-3.1-8B shapes on an H100, batch 512).
    padded = not bool(mask.all())
    ids, mask, position_ids = ids.to(device), mask.to(device), position_ids.to(device)
    rows = torch.tensor(count_rows, dtype=torch.bool, device=device)
    keys = np.array([stream_key(sampling.seed, i, "sample") for i in indices], dtype=np.uint64)
    eos = torch.tensor(sampling.eos_ids or [-1], device=device)
    cache = DynamicCache()
    if collector is not None:
        counted = (mask.bool() & rows[:, None] if sampling.count_seed
                   else torch.zeros_like(mask, dtype=torch.bool))
        collector.set_mask(counted)
    out = model(input_ids=ids, attention_mask=mask if padded else None, position_ids=position_ids,
                past_key_values=cache, use_cache=True)
    n_positions = b * width
    logits = out.logits[:, -1, :]
    next_pos = position_ids[:, -1] + 1
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    sampled: list[list[int]] = [[] for _ in range(b)]
    for t in range(max_new_tokens):
        tok = _inverse_cdf(logits, uniforms(keys, t))
        real = ~finished  # rows whose token at this step is a real sample
        tok = torch.where(real, tok, torch.full_like(tok, pad_id))
        for r, (x, ok) in enumerate(zip(tok.tolist(), real.tolist(), strict=True)):
            if ok:
                sampled[r].append(x)
        finished = finished | torch.isin(tok, eos)
        last = t == max_new_tokens - 1 or bool(finished.all())
        if last and collector is None:
            break
        # feed the sampled tokens: for the next logits, and (collecting) for their keys
        if padded:
            mask = torch.cat([mask, real.long()[:, None]], dim=1)
        if collector is not None:
            collector.set_mask((real & rows)[:, None])
        out = model(input_ids=tok[:, None], attention_mask=mask if padded else None,
                    position_ids=next_pos[:, None], past_key_values=cache, use_cache=True)
        n_positions += b
        if last:
            break
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    if collector is not None:
        collector.set_mask(None)
    return sampled, n_positions


#: ``loop=`` values of :func:`self_generate` (``"auto"``: ``"static"`` on CUDA without key collection)
LOOPS = ("auto", "dynamic", "static")


class _StaticDecoder:
    """The ``"static"`` decode loop's state across blocks: one pre-allocated KV cache per batch shape, and
    the decode step, captured as CUDA graphs (``torch.compile(mode="reduce-overhead")``) when ``capture``.

    Shapes never change within a block, so the captured step is replayed at every step with no kernel
    launches and no cache growth; a block of another size (the last one) captures its own graph.
    """

    def __init__(self, model: PreTrainedModel, capture: bool) -> None:
        import torch

        self.model = model
        self.capture = capture
        self.step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True) if capture else model
        self._caches: dict[tuple[int, int], Any] = {}

    def cache(self, batch: int, length: int) -> Any:
        """A ``transformers.StaticCache`` of ``length`` positions for ``batch`` rows (reset when reused)."""
        from transformers import StaticCache

        cache = self._caches.get((batch, length))
        if cache is None:
            cache = self._caches[batch, length] = StaticCache(config=self.model.config, max_cache_len=length)
        else:
            cache.reset()
        return cache

    def decode_step(self, **kwargs: Any) -> Any:
        import torch

        if self.capture:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        return self.step(**kwargs)


def _decode_block_static(decoder: _StaticDecoder, sampling: _Sampling, seeds: list[list[int]],
                         indices: list[int], collector: Any, count_rows: list[bool]
                         ) -> tuple[list[list[int]], int]:
    """:func:`_decode_block` with a pre-allocated KV cache of ``width + max_new_tokens`` positions.

    The same tokens as :func:`_decode_block` (the same logits up to the rounding of attention over a
    longer, masked cache, and the same ``u_{i,t}``); sampled tokens stay on the device until the block
    ends, and the uniforms of all steps are sent to it once.
    """
    import torch

    max_new_tokens, pad_id = sampling.max_new_tokens, sampling.pad_id
    model = decoder.model
    device = next(model.parameters()).device
    ids, mask, position_ids = _left_padded(seeds, pad_id)
    b, width = ids.shape
    total = width + max_new_tokens
    padded = not bool(mask.all())  # as in _decode_block: no mask at all when no row is left-padded
    full_mask = torch.zeros((b, total), dtype=torch.long)
    full_mask[:, :width] = mask
    ids, full_mask, position_ids = ids.to(device), full_mask.to(device), position_ids.to(device)
    rows = torch.tensor(count_rows, dtype=torch.bool, device=device)
    keys = np.array([stream_key(sampling.seed, i, "sample") for i in indices], dtype=np.uint64)
    draws = torch.from_numpy(np.stack([uniforms(keys, t) for t in range(max_new_tokens)])).to(device)
    eos = torch.tensor(sampling.eos_ids or [-1], device=device)
    cache = decoder.cache(b, total)
    if collector is not None:
        counted = (mask.bool().to(device) & rows[:, None] if sampling.count_seed
                   else torch.zeros_like(ids, dtype=torch.bool))
        collector.set_mask(counted)
    out = model(input_ids=ids, attention_mask=full_mask[:, :width] if padded else None,
                position_ids=position_ids, past_key_values=cache, use_cache=True,
                cache_position=torch.arange(width, device=device))
    n_positions = b * width
    logits = out.logits[:, -1, :]
    next_pos = position_ids[:, -1:] + 1  # (b, 1)
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    tokens = torch.full((b, max_new_tokens), pad_id, dtype=torch.long, device=device)
    real_steps = torch.zeros((b, max_new_tokens), dtype=torch.bool, device=device)
    steps = 0
    for t in range(max_new_tokens):
        tok = _inverse_cdf(logits, draws[t])
        real = ~finished
        tok = torch.where(real, tok, torch.full_like(tok, pad_id))
        tokens[:, t], real_steps[:, t] = tok, real
        steps = t + 1
        finished = finished | torch.isin(tok, eos)
        last = t == max_new_tokens - 1 or bool(finished.all())
        if last and collector is None:
            break
        if padded:
            full_mask[:, width + t] = real.long()
        if collector is not None:
            collector.set_mask((real & rows)[:, None])
        out = decoder.decode_step(input_ids=tok[:, None], attention_mask=full_mask if padded else None,
                                  position_ids=next_pos, past_key_values=cache, use_cache=True,
                                  cache_position=torch.tensor([width + t], device=device))
        n_positions += b
        if last:
            break
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    if collector is not None:
        collector.set_mask(None)
    toks, reals = tokens[:, :steps].tolist(), real_steps[:, :steps].tolist()
    sampled = [[x for x, ok in zip(tr, rr, strict=True) if ok] for tr, rr in zip(toks, reals, strict=True)]
    return sampled, n_positions


def _resolve_loop(model: PreTrainedModel, loop: str, backend: str, collecting: bool) -> tuple[str, bool]:
    """``(loop, capture)`` for :func:`self_generate`: ``"auto"`` resolved, the CUDA-graph capture decided."""
    if backend not in ("torch", "vllm"):
        raise ValueError(f"unknown backend {backend!r}: use 'torch' or 'vllm'")
    if loop not in LOOPS:
        raise ValueError(f"unknown loop {loop!r}: use one of {', '.join(LOOPS)}")
    if backend == "vllm":
        if collecting:
            raise ValueError("backend='vllm' cannot collect keys during generation (the model runs inside "
                             "vLLM): generate, then run `moir cov estimate --corpus <out_dir>`, or use "
                             "backend='torch'")
        if loop != "auto":
            raise ValueError(f"loop={loop!r} applies to backend='torch' only (vLLM has its own loop)")
        return "vllm", False
    static_ok = bool(getattr(type(model), "_can_compile_fullgraph", False))
    on_cuda = next(model.parameters()).device.type == "cuda"
    capture = on_cuda and not collecting  # key hooks run Python at every step: no graph capture
    if loop == "static" and not static_ok:
        raise ValueError(f"loop='static' needs a model with static-cache support; {type(model).__name__} "
                         f"has none: use loop='dynamic'")
    if loop == "auto":
        loop = "static" if capture and static_ok else "dynamic"
    return loop, capture and loop == "static"
