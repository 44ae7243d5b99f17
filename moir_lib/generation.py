"""Self-generation (Section 4, Algorithm 1, appendix A.1 and C.2): the corpus behind C_Moir.

:func:`self_generate` samples ``n_samples`` continuations from the model itself, each seeded
with a *seed strategy*, and writes them to a sharded, append-only run directory; optionally it
accumulates the keys of the edit layers *during* generation, so ``C_Moir`` (eq.
(memoir_estimator)) needs no second pass ("no inference cost beyond the generation itself").

Seed strategies (the seed sequence ``s`` of Section 4):

- ``bos``: ``[BOS]`` alone (Moir-bos; collapses onto the chat attractor, H2);
- ``rand<k>`` (``rand1`` … ``rand4`` in the paper, any ``k >= 1`` accepted): ``[BOS]`` then ``k``
  tokens drawn uniformly from :func:`seed_candidates` (rand×1 is the paper's default);
- ``prompt:<text>``: ``[BOS]`` + the tokens of ``<text>`` (special tokens in the text, e.g. chat
  tags, are recognised as such).

Models without a BOS token (none in the tokenizer nor the config) get no BOS; ``bos`` is then refused.

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
only when ``u`` falls within that rounding error of a CDF boundary. A resumed run re-forms exactly the
same batches as an uninterrupted one, so resuming is exact even there.)

**Decode loops and backends.** ``loop="dynamic"`` grows a ``DynamicCache`` step by step;
``loop="static"`` pre-allocates a ``StaticCache`` of ``seed + max_new_tokens`` positions and, on CUDA
without key collection, replays the decode step as CUDA graphs (``torch.compile(mode="reduce-overhead")``,
one capture per batch shape). Both feed the same logits to the same sampler, so they write the same
records (tested token for token); ``"auto"`` picks the static loop where it is captured. The vLLM
backend (:mod:`moir_lib.vllm_backend`) writes the same run format with vLLM's sampler instead.

**Sharding.** ``shard=(i, n)`` generates the indices ``i, i+n, i+2n, …`` (strided, so every shard
gets a share of every part of the index range) into ``shard-0000i-of-0000n.jsonl``. Shards may run
as separate processes over the same ``out_dir``; ``shard=None`` is ``(0, 1)``. The shard count is part
of the run's configuration.

**Run directory.** ``manifest.json`` (configuration; resuming with a different one is refused,
naming the differing fields) and one ``shard-XXXXX-of-YYYYY.jsonl`` per shard, one JSON record per
line: ``{"index", "seed_strategy", "seed_ids", "token_ids", "text"}``. ``seed_ids`` include BOS;
``token_ids`` are the sampled tokens, including a final EOS when one was sampled; ``text`` decodes the
seed (without BOS) followed by the continuation (without the final EOS), keeping chat tags and any
other special token the model produced. Text does not always re-tokenize to the same ids: consumers
that need the exact sequence should use the ids.

**Crash safety.** A batch's records are appended with one ``write`` and ``fsync``-ed. On resume, a
torn last line (the process died mid-write) is truncated, every complete record is kept, its index
is skipped (no duplicates), and batches are re-formed exactly as in an uninterrupted run.

**Keys during generation** (``collect_layers``). A :class:`moir_lib.covariance.KeyCollector` hooks the
key module of each layer (the input of ``down_proj``) during the prefill and every decode step. The
counted positions are those of the sampled tokens ``x_1 … x_T`` (Algorithm 1 extracts ``φ_ℓ(x_t)`` for
``t = 1..T`` of the generated sequence, with ``n ← n + T``), including a final EOS; a token's key is
computed when it is fed back as input, so one extra decode step feeds the last tokens. Seed tokens
(BOS and the random tokens) are not counted unless ``key_positions="all"``; padding and positions after
a row's EOS are never counted. The result equals a second forward pass over ``seed_ids + token_ids``
counting positions ``len(seed_ids):`` (or all positions) — to float32 rounding, tested. Per shard,
the stats are saved to ``keys-XXXXX-of-YYYYY.safetensors`` (atomic replace) right after each batch's
records are flushed, together with the shard file length they cover; on resume, records written
after the last stats checkpoint are truncated and regenerated (identically), so no key is lost or
counted twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import moir_lib
from moir_lib.streams import stream, stream_key, uniforms
from moir_lib.timings import timed

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Int, Int64
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "GenerationResult",
    "SeedStrategy",
    "parse_seed_strategy",
    "seed_candidates",
    "special_token_ids",
    "seed_ids_for",
    "self_generate",
    "validate_shard",
    "read_samples",
    "read_manifest",
    "load_key_stats",
    "shard_indices",
    "vocabulary_fingerprint",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: manifest fields that do not have to match on resume
_INFORMATIONAL = ("created", "moir_lib", "tokenizer")
_STRATEGY_RE = re.compile(r"^(?:(bos)|rand([1-9][0-9]*)|prompt:(.+))$", re.DOTALL)


# ----------------------------------------------------------------------------- seed strategies


@dataclass(frozen=True)
class SeedStrategy:
    """A parsed seed strategy: ``kind`` is ``"bos"``, ``"rand"`` (with ``k``) or ``"prompt"`` (``text``)."""

    spec: str
    kind: str
    k: int = 0
    text: str = ""


def parse_seed_strategy(spec: str) -> SeedStrategy:
    """Parse ``"bos"``, ``"rand<k>"`` (``k >= 1``, no leading zeros) or ``"prompt:<text>"`` (non-empty)."""
    match = _STRATEGY_RE.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(f"unknown seed strategy {spec!r}: use 'bos', 'rand1'..'rand4' (any rand<k>, k >= 1) "
                         f"or 'prompt:<text>'")
    bos, k, text = match.groups()
    if bos:
        return SeedStrategy(spec, "bos")
    if k:
        return SeedStrategy(spec, "rand", k=int(k))
    return SeedStrategy(spec, "prompt", text=text)


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every special or added token id: BOS/EOS/PAD/UNK, chat tags, ``additional_special_tokens``, and all
    tokens added on top of the base vocabulary (``tokenizer.added_tokens_decoder``)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
    ids |= {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}
    return ids


def seed_candidates(tokenizer: PreTrainedTokenizerBase, vocab_size: int | None = None
                    ) -> Int64[np.ndarray, " candidates"]:
    """The ids a ``rand<k>`` seed token is drawn from, uniformly, sorted.

    Exclusion rule: all ids ``< min(len(tokenizer), vocab_size)`` (``len(tokenizer)`` counts the base
    vocabulary plus added tokens; ``vocab_size`` is the model's embedding rows, which may include padding
    rows no token maps to) *minus* every special or added token (:func:`special_token_ids`: BOS, EOS,
    PAD, UNK, chat tags such as ``<|user|>``/``<|assistant|>``, reserved/added tokens). Ordinary tokens
    that merely look odd (byte fragments, whitespace) stay: the paper draws from the vocabulary.
    """
    limit = len(tokenizer) if vocab_size is None else min(len(tokenizer), int(vocab_size))
    keep = np.ones(limit, dtype=bool)
    for i in special_token_ids(tokenizer):
        if 0 <= i < limit:
            keep[i] = False
    candidates = np.flatnonzero(keep).astype(np.int64)
    if candidates.size == 0:
        raise ValueError("the tokenizer has no ordinary (non-special) token to seed rand<k> with")
    return candidates


def _bos_id(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int | None:
    if tokenizer.bos_token_id is not None:
        return int(tokenizer.bos_token_id)
    bos = getattr(model.config, "bos_token_id", None)
    return int(bos) if isinstance(bos, int) else None


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(model.config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids |= {int(x) for x in source}
        if ids:
            break
    return sorted(ids)


def seed_ids_for(strategy: SeedStrategy | str, index: int, seed: int, *, bos_id: int | None,
                 candidates: Int[np.ndarray, " candidates"] | None = None,
                 prompt_ids: Sequence[int] | None = None) -> list[int]:
    """The seed sequence of sample ``index``: ``[BOS]`` (when the model has one) + strategy tokens."""
    strategy = parse_seed_strategy(strategy) if isinstance(strategy, str) else strategy
    head = [bos_id] if bos_id is not None else []
    if strategy.kind == "bos":
        return head
    if strategy.kind == "prompt":
        return head + list(prompt_ids or [])
    if candidates is None:
        raise ValueError("rand<k> seeds need the candidate ids (seed_candidates)")
    key = np.array([stream_key(seed, index, "seed")], dtype=np.uint64)
    picks = [int(candidates[int(stream(key, j)[0] % np.uint64(candidates.size))]) for j in range(strategy.k)]
    return head + picks


# ----------------------------------------------------------------------------- run directory


def shard_indices(n_samples: int, shard: tuple[int, int]) -> range:
    """Global sample indices of ``shard=(i, n)``: ``i, i+n, i+2n, … < n_samples``."""
    i, n = shard
    return range(i, n_samples, n)


def _shard_name(shard: tuple[int, int]) -> str:
    return f"shard-{shard[0]:05d}-of-{shard[1]:05d}"


def vocabulary_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """16 hex of SHA-256 over the vocabulary, the added tokens and the special-token map: what the ids of
    a generated sample mean (not how text is split into them; that is
    :func:`moir_lib.covariance.estimation.tokenizer_fingerprint`)."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items()), separators=(",", ":")).encode())
    added = {int(i): str(t) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    h.update(json.dumps(sorted(added.items())).encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def read_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's ``manifest.json``."""
    path = Path(run_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{run_dir} is not a self-generation run (no {MANIFEST})") from None


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _ensure_manifest(out_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Create the manifest (first process wins) or check that ``config`` matches the existing one."""
    path = out_dir / MANIFEST
    if not path.exists():
        manifest = {**config, "created": datetime.now(UTC).isoformat(timespec="seconds"),
                    "moir_lib": moir_lib.__version__}
        tmp = path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        try:
            os.link(tmp, path)  # atomic create-if-absent, even with concurrent shard processes
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(out_dir)
    existing = read_manifest(out_dir)
    keys = (set(existing) | set(config)) - set(_INFORMATIONAL)
    differing = sorted(k for k in keys if existing.get(k) != config.get(k))
    if differing:
        details = "; ".join(f"{k}: run has {existing.get(k)!r}, requested {config.get(k)!r}"
                            for k in differing)
        raise ValueError(f"{out_dir} holds a run with a different configuration ({details}); resume it with "
                         f"the same settings or choose a new out_dir")
    return existing


def _scan_shard(path: Path, keep_bytes: int | None = None) -> tuple[list[int], int]:
    """Indices of the complete records of a shard file, truncating a torn tail (or past ``keep_bytes``)."""
    if not path.exists():
        if keep_bytes:
            raise RuntimeError(f"{path} is missing but the key statistics cover {keep_bytes} bytes of it")
        return [], 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if keep_bytes is not None:
        if keep_bytes > end:
            raise RuntimeError(f"{path} has {end} complete bytes but its key statistics cover {keep_bytes}: "
                               f"the shard file was damaged; delete the shard and its keys file to redo it")
        end = keep_bytes
    if end != len(data):
        log.warning("%s: truncating %d bytes after the last committed record", path.name, len(data) - end)
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    indices = []
    for n, line in enumerate(data[:end].splitlines(), 1):
        try:
            indices.append(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"{path}: line {n} is not a valid record ({exc}); the file is damaged") \
                from exc
    if len(set(indices)) != len(indices):
        raise RuntimeError(f"{path}: duplicate sample indices; the file is damaged")
    return indices, end


def _iter_shard(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):  # a torn tail of a killed (or running) writer
                break
            yield json.loads(line)


def read_samples(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the records of every shard of ``run_dir`` in index order (complete records only).

    A run still in progress or interrupted yields what has been written so far.
    """
    run_dir = Path(run_dir)
    read_manifest(run_dir)
    shards = sorted(run_dir.glob("shard-*-of-*.jsonl"))
    yield from heapq.merge(*(_iter_shard(p) for p in shards), key=lambda r: r["index"])


def _stats_path(out_dir: Path, shard: tuple[int, int]) -> Path:
    return out_dir / f"keys-{shard[0]:05d}-of-{shard[1]:05d}.safetensors"


def _load_shard_stats(path: Path) -> tuple[Any, int, int]:
    """(stats, shard bytes covered, records covered) of a keys checkpoint."""
    from moir_lib.covariance.stats import CovarianceStats

    stats = CovarianceStats.load(path)
    meta = stats.metadata.get("generation", {})
    return stats, int(meta.get("shard_bytes", 0)), int(meta.get("n_records", 0))


def load_key_stats(run_dir: str | os.PathLike[str], require_complete: bool = True) -> Any:
    """The key statistics of a run collected during generation, all shards merged (a ``CovarianceStats``).

    ``require_complete``: raise unless every shard's stats cover all its samples.
    """
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if not manifest.get("collect_layers"):
        raise ValueError(f"{run_dir} was generated without collect_layers: no key statistics to load")
    n_shards, n_samples = int(manifest["n_shards"]), int(manifest["n_samples"])
    merged = None
    for i in range(n_shards):
        path = _stats_path(run_dir, (i, n_shards))
        expected = len(shard_indices(n_samples, (i, n_shards)))
        if not path.exists():
            if require_complete and expected:
                raise FileNotFoundError(f"{path.name} is missing: shard {i} of {n_shards} has not run")
            continue
        stats, _, n_records = _load_shard_stats(path)
        if require_complete and n_records != expected:
            raise ValueError(f"shard {i} of {n_shards} covers {n_records} of {expected} samples: "
                             f"resume it first")
        merged = stats if merged is None else merged.merge(stats)
    if merged is None:
        raise FileNotFoundError(f"{run_dir} has no key statistics yet")
    return merged


# ----------------------------------------------------------------------------- sampling


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


def _decode_block(model: PreTrainedModel, seeds: list[list[int]], indices: list[int], seed: int,
                  max_new_tokens: int, eos_ids: list[int], pad_id: int, collector: Any,
                  count_rows: list[bool], count_seed: bool) -> tuple[list[list[int]], int]:
    """Sample continuations for one batch with a KV cache and left padding.

    Returns the sampled ids per row (a final EOS included) and the number of forward positions run.
    ``collector.set_mask`` gets, before each forward pass, which input positions count as keys.
    """
    import torch
    from transformers import DynamicCache

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
    keys = np.array([stream_key(seed, i, "sample") for i in indices], dtype=np.uint64)
    eos = torch.tensor(eos_ids or [-1], device=device)
    cache = DynamicCache()
    if collector is not None:
        counted = mask.bool() & rows[:, None] if count_seed else torch.zeros_like(mask, dtype=torch.bool)
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


def _decode_block_static(decoder: _StaticDecoder, seeds: list[list[int]], indices: list[int], seed: int,
                         max_new_tokens: int, eos_ids: list[int], pad_id: int, collector: Any,
                         count_rows: list[bool], count_seed: bool) -> tuple[list[list[int]], int]:
    """:func:`_decode_block` with a pre-allocated KV cache of ``width + max_new_tokens`` positions.

    The same tokens as :func:`_decode_block` (the same logits up to the rounding of attention over a
    longer, masked cache, and the same ``u_{i,t}``); sampled tokens stay on the device until the block
    ends, and the uniforms of all steps are sent to it once.
    """
    import torch

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
    keys = np.array([stream_key(seed, i, "sample") for i in indices], dtype=np.uint64)
    draws = torch.from_numpy(np.stack([uniforms(keys, t) for t in range(max_new_tokens)])).to(device)
    eos = torch.tensor(eos_ids or [-1], device=device)
    cache = decoder.cache(b, total)
    if collector is not None:
        counted = (mask.bool().to(device) & rows[:, None] if count_seed
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


# ----------------------------------------------------------------------------- the public entry point


@dataclass
class GenerationResult:
    """What one :func:`self_generate` call did (for its shard)."""

    out_dir: Path
    shard: tuple[int, int]
    shard_path: Path
    n_shard_samples: int  # indices this shard owns
    n_written: int  # records appended by this call
    n_skipped: int  # records found on disk (resumed)
    n_tokens: int  # sampled tokens in the records written by this call
    n_positions: int  # forward positions run (incl. seeds, padding, finished rows, regenerated rows)
    seconds: float
    manifest: dict[str, Any] = field(default_factory=dict)
    stats: Any = None  # this shard's CovarianceStats when collect_layers was given

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def complete(self) -> bool:
        return self.n_written + self.n_skipped == self.n_shard_samples


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


def validate_shard(shard: tuple[int, int] | None) -> tuple[int, int]:
    """``(i, n)`` with ``0 <= i < n`` (``None``: the whole run, ``(0, 1)``); ``ValueError`` otherwise."""
    if shard is None:
        return (0, 1)
    try:
        i, n = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}")
    return (i, n)


def _max_positions(model: PreTrainedModel) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@timed("self-generation")
def self_generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, seed_strategy: str,
                  n_samples: int, max_new_tokens: int, batch_size: int, out_dir: str | os.PathLike[str],
                  seed: int = 0, shard: tuple[int, int] | None = None, **options: Any) -> GenerationResult:
    """Generate (or resume) ``n_samples`` self-generated continuations into ``out_dir`` (see the module doc).

    The shard is locked while it is written (:mod:`moir_lib.locks`): a second process on the same
    shard of the same ``out_dir`` is refused at once with the holder's PID and command (other
    shards of the run may go on in parallel). ``options``: those of :func:`_self_generate`
    (``collect_layers``, ``stats``, ``progress``, ``key_positions``, ``loop``, ``backend``, ``engine``).
    """
    from moir_lib.locks import exclusive, file_lock_path

    i, n = validate_shard(shard)
    shard_path = Path(out_dir) / f"{_shard_name((i, n))}.jsonl"
    lock = file_lock_path(shard_path)
    created = not lock.parent.exists()
    try:
        with exclusive(lock, f"shard {i}/{n} of {out_dir}"):
            return _self_generate(model, tokenizer, seed_strategy, n_samples, max_new_tokens, batch_size,
                                  out_dir, seed=seed, shard=(i, n), **options)
    except Exception:  # a run refused before writing leaves no directory behind (rmdir keeps any data)
        if created:
            with contextlib.suppress(OSError):
                lock.unlink()
                lock.parent.rmdir()
        raise


def _self_generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, seed_strategy: str,
                   n_samples: int, max_new_tokens: int, batch_size: int, out_dir: str | os.PathLike[str],
                   seed: int = 0, shard: tuple[int, int] | None = None,
                   collect_layers: Sequence[int] | None = None, stats: Any = None, progress: bool = True,
                   key_positions: str = "generated", loop: str = "auto", backend: str = "torch",
                   engine: Any = None) -> GenerationResult:
    """Generate (or resume) ``n_samples`` continuations into ``out_dir``, the shard lock held.

    ``model``/``tokenizer``: as from :func:`moir_lib.models.load`. ``seed_strategy``: ``"bos"``,
    ``"rand<k>"`` or ``"prompt:<text>"``. ``max_new_tokens``: sampled tokens per sample at most (the
    paper: 256). ``batch_size``: rows decoded together (does not change the output). ``seed``: the global
    seed. ``shard``: ``(i, n)``: generate indices ``i, i+n, …`` only. ``collect_layers``: accumulate the
    keys of these layers during generation (``key_positions``: ``"generated"`` = the sampled tokens, as in
    Algorithm 1, or ``"all"`` = seed tokens too); ``stats``: a ``CovarianceStats`` to add to (only for a
    fresh shard; on resume the checkpoint is the state). ``loop``: ``"dynamic"`` (a growing KV cache, one
    kernel launch per op and step), ``"static"`` (a pre-allocated KV cache; on CUDA, without
    ``collect_layers``, the decode step is captured as CUDA graphs) or ``"auto"`` (``"static"`` where it
    is captured, else ``"dynamic"``); both loops give the same tokens. ``backend``: ``"torch"`` (this
    module's sampler) or ``"vllm"`` (:mod:`moir_lib.vllm_backend`: GPU only, per-sample seeds, no
    ``collect_layers``; ``engine``: a ``vllm.LLM`` to use, default built from the model's source).
    Bad arguments raise ``ValueError`` (a missing vLLM or GPU ``RuntimeError``) before any model work.
    Returns a :class:`GenerationResult`; the records are read back with :func:`read_samples`.
    """
    plan = _validated_plan(model, tokenizer, seed_strategy, n_samples, max_new_tokens, batch_size, seed,
                           shard, collect_layers, key_positions, loop, backend, engine)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _manifest_config(model, tokenizer, plan)
    manifest = _ensure_manifest(out_dir, config)

    shard_path = out_dir / f"{_shard_name(plan.shard)}.jsonl"
    stats_path = _stats_path(out_dir, plan.shard)
    stats, done, owned = _resume(plan, shard_path, stats_path, stats)
    todo = [i for i in owned if i not in done]
    if done:
        log.info("%s: resuming, %d of %d samples already written", shard_path.name, len(done), len(owned))
    log.info("self-generation %s: %d samples (shard %d/%d), ≤%d new tokens, batch %d -> %s",
             plan.strategy.spec, len(todo), plan.shard[0], plan.shard[1], max_new_tokens, batch_size, out_dir)

    # --- generate, block by block (blocks are fixed chunks of the shard's index list)
    start = time.perf_counter()
    if plan.layers is not None and stats is None:
        stats = _new_stats(plan.adapter, plan.layers, config, plan.shard)
    static = _StaticDecoder(model, plan.capture) if plan.loop == "static" and todo else None
    if plan.backend == "vllm" and todo and engine is None:
        from moir_lib import vllm_backend

        engine = vllm_backend.engine_for(model)
    n_written, n_tokens, n_positions = _write_blocks(
        model, tokenizer, plan, owned, done, len(todo), shard_path=shard_path, stats_path=stats_path,
        stats=stats, static=static, engine=engine, progress=progress, start=start)
    seconds = time.perf_counter() - start
    log.info("self-generation %s: wrote %d samples, %d tokens in %.1f s (%.0f tokens/s)", plan.strategy.spec,
             n_written, n_tokens, seconds, n_tokens / seconds if seconds else float("nan"))
    return GenerationResult(out_dir, plan.shard, shard_path, len(owned), n_written, len(done), n_tokens,
                            n_positions, seconds, manifest, stats)


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


def _validated_plan(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, seed_strategy: str,
                    n_samples: int, max_new_tokens: int, batch_size: int, seed: int,
                    shard: tuple[int, int] | None, collect_layers: Sequence[int] | None, key_positions: str,
                    loop: str, backend: str, engine: Any) -> _Plan:
    """Check every argument of :func:`_self_generate` (``ValueError``; a missing vLLM or GPU
    ``RuntimeError``) before any model work, and resolve the seed tokens, loop and special ids."""
    from moir_lib import vllm_backend
    from moir_lib.models import ModelAdapter

    strategy = parse_seed_strategy(seed_strategy)
    sizes = (("n_samples", n_samples), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size))
    for name, value in sizes:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if key_positions not in ("generated", "all"):
        raise ValueError(f"key_positions must be 'generated' or 'all', got {key_positions!r}")
    shard = validate_shard(shard)
    adapter = ModelAdapter.for_model(model, tokenizer)
    layers = adapter.check_layers(collect_layers) if collect_layers is not None else None
    loop, capture = _resolve_loop(model, loop, backend, layers is not None)
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


def _manifest_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     plan: _Plan) -> dict[str, Any]:
    """The run's configuration as the manifest records it (every shard of a run must agree on it)."""
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
        "tokenizer_fingerprint": vocabulary_fingerprint(tokenizer),  # key kept: existing run directories
        "bos_id": plan.bos,
        "eos_ids": plan.eos_ids,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": None,
                     "method": ("inverse-CDF, SplitMix64 stream per sample index" if plan.backend == "torch"
                                else vllm_backend.SAMPLING_METHOD)},
        "collect_layers": plan.layers,
        "key_positions": plan.key_positions if plan.layers is not None else None,
    }


def _resume(plan: _Plan, shard_path: Path, stats_path: Path, stats: Any) -> tuple[Any, set[int], range]:
    """``(stats, done, owned)``: the keys checkpoint (when collecting) and the indices already on disk.

    The shard is cut back to its last complete record, or when collecting keys to the bytes the
    checkpoint covers (to nothing when it has records but no checkpoint): those records are redone.
    """
    keep_bytes = None
    if plan.layers is not None:
        if stats_path.exists():
            if stats is not None:
                log.warning("resuming %s: the keys checkpoint is the state; the stats argument is ignored",
                            stats_path.name)
            stats, keep_bytes, _ = _load_shard_stats(stats_path)
        elif shard_path.exists() and shard_path.stat().st_size > 0:
            log.warning("%s has records but no keys checkpoint: regenerating them to collect their keys",
                        shard_path.name)
            keep_bytes = 0
    done_list, _ = _scan_shard(shard_path, keep_bytes)
    done = set(done_list)
    owned = shard_indices(plan.n_samples, plan.shard)
    stray = done - set(owned)
    if stray:
        raise RuntimeError(f"{shard_path} holds indices outside shard {plan.shard}: {sorted(stray)[:5]}")
    return stats, done, owned


def _write_blocks(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, plan: _Plan, owned: range,
                  done: set[int], n_todo: int, *, shard_path: Path, stats_path: Path, stats: Any,
                  static: _StaticDecoder | None, engine: Any, progress: bool,
                  start: float) -> tuple[int, int, int]:
    """Generate the missing samples block by block and append their records, each block fsync-ed (then,
    when collecting keys, the checkpoint that commits it). Returns ``(n_written, n_tokens, n_positions)``."""
    from tqdm.auto import tqdm

    blocks = [list(owned[s:s + plan.batch_size]) for s in range(0, len(owned), plan.batch_size)]
    n_written = n_tokens = n_positions = 0
    with contextlib.ExitStack() as stack:
        collector = None
        if plan.layers is not None:
            from moir_lib.covariance.hooks import KeyCollector

            collector = stack.enter_context(KeyCollector(plan.adapter, plan.layers, stats=stats))
        fd = os.open(shard_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        stack.callback(os.close, fd)
        stack.callback(model.train, model.training)
        model.eval()
        bar = stack.enter_context(tqdm(total=n_todo, unit="sample", desc=f"generate {plan.strategy.spec}",
                                       disable=not progress, dynamic_ncols=True))
        for block in blocks:
            count_rows = [i not in done for i in block]
            if not any(count_rows):
                continue
            seeds = [seed_ids_for(plan.strategy, i, plan.seed, bos_id=plan.bos, candidates=plan.candidates,
                                  prompt_ids=plan.prompt_ids) for i in block]
            sampled, positions = _sample_block(model, plan, seeds, block, count_rows, collector, static,
                                               engine)
            n_positions += positions
            lines, block_tokens = _record_lines(tokenizer, plan, block, seeds, sampled, count_rows)
            n_tokens += block_tokens
            _append(fd, "".join(lines).encode("utf-8"))  # 1. the records (fsync-ed) ...
            if collector is not None:  # 2. ... then the keys checkpoint that commits them
                _save_shard_stats(stats_path, collector.stats, os.fstat(fd).st_size,
                                  len(done) + n_written + len(lines))
            n_written += len(lines)
            bar.update(len(lines))
            bar.set_postfix(tok_s=f"{n_tokens / max(time.perf_counter() - start, 1e-9):,.0f}", refresh=False)
    return n_written, n_tokens, n_positions


def _sample_block(model: PreTrainedModel, plan: _Plan, seeds: list[list[int]], block: list[int],
                  count_rows: list[bool], collector: Any, static: _StaticDecoder | None,
                  engine: Any) -> tuple[list[list[int]], int]:
    """The sampled tokens of one block's rows and the forward positions run, on the plan's backend/loop."""
    if plan.backend == "vllm":
        from moir_lib import vllm_backend

        return vllm_backend.decode_block(engine, seeds, block, plan.seed, plan.max_new_tokens, plan.eos_ids,
                                         count_rows)
    import torch

    step_args = (seeds, block, plan.seed, plan.max_new_tokens, plan.eos_ids, plan.pad_id, collector,
                 count_rows, plan.key_positions == "all")
    with torch.inference_mode():
        return (_decode_block_static(static, *step_args) if static is not None
                else _decode_block(model, *step_args))


def _record_lines(tokenizer: PreTrainedTokenizerBase, plan: _Plan, block: list[int], seeds: list[list[int]],
                  sampled: list[list[int]], count_rows: list[bool]) -> tuple[list[str], int]:
    """The JSON lines of a block's new records (rows not already on disk) and their sampled-token count."""
    lines = []
    n_tokens = 0
    for i, s, toks, new in zip(block, seeds, sampled, count_rows, strict=True):
        if not new:
            continue
        body = toks[:-1] if toks and toks[-1] in plan.eos_ids else toks
        text = tokenizer.decode((s[1:] if plan.bos is not None else s) + body, skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
        record = {"index": i, "seed_strategy": plan.strategy.spec, "seed_ids": s, "token_ids": toks,
                  "text": text}
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
        n_tokens += len(toks)
    return lines, n_tokens


def _append(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fsync(fd)


def _new_stats(adapter: Any, layers: list[int], config: dict[str, Any], shard: tuple[int, int]) -> Any:
    from moir_lib.covariance.hooks import base_metadata
    from moir_lib.covariance.stats import CovarianceStats

    meta = base_metadata(adapter, model_fp=config["model_fingerprint"])
    meta["tokenization"] = "self-generated token ids"
    meta["corpus"] = [{"name": f"selfgen:{config['seed_strategy']}", "seed": config["seed"],
                       "n_samples": config["n_samples"], "max_new_tokens": config["max_new_tokens"],
                       "shard": list(shard), "key_positions": config["key_positions"]}]
    return CovarianceStats(layers, adapter.key_dim, meta)


def _save_shard_stats(path: Path, stats: Any, shard_bytes: int, n_records: int) -> None:
    """Checkpoint: ``stats`` covering the first ``shard_bytes`` bytes (``n_records`` records) of the shard."""
    stats.save(path, extra_metadata={"generation": {"shard_bytes": shard_bytes, "n_records": n_records}})
