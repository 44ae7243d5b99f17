""":func:`self_generate`: one shard of a self-generation run (Algorithm 1), locked, resumable, block by block.

The shard lock is taken, the request checked (:mod:`.plan`), the manifest created or matched and the
shard resumed (:mod:`.shards`, :mod:`.keystats`); then each block of the shard's indices is sampled
(:mod:`.decoding`, or :mod:`moir_lib.vllm_backend`), its records are appended and fsync-ed, and, when
collecting keys, the checkpoint that commits them is saved.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.generation.decoding import _decode_block, _decode_block_static, _StaticDecoder
from moir_lib.generation.keystats import _load_shard_stats, _new_stats, _save_shard_stats, _stats_path
from moir_lib.generation.plan import _manifest_config, _Plan, _validated_plan
from moir_lib.generation.seeds import seed_ids_for
from moir_lib.generation.shards import (
    _append,
    _ensure_manifest,
    _scan_shard,
    _seal_complete,
    _shard_name,
    shard_indices,
    validate_shard,
)
from moir_lib.timings import timed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


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


@timed("self-generation")
def self_generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, seed_strategy: str,
                  n_samples: int, max_new_tokens: int, batch_size: int, out_dir: str | os.PathLike[str],
                  seed: int = 0, shard: tuple[int, int] | None = None, wait: bool = False,
                  **options: Any) -> GenerationResult:
    """Generate (or resume) ``n_samples`` self-generated continuations into ``out_dir`` (see the package doc).

    The shard is locked while it is written (:mod:`moir_lib.locks`): a second process on the same
    shard of the same ``out_dir`` is refused at once with the holder's PID and command (other
    shards of the run may go on in parallel), or, with ``wait`` (a shared cache entry), waits for
    it and then resumes the finished shard (nothing left to generate). ``options``: those of
    :func:`_self_generate` (``collect_layers``, ``stats``, ``progress``, ``key_positions``, ``loop``,
    ``backend``, ``engine``).
    """
    from moir_lib.locks import exclusive, file_lock_path

    i, n = validate_shard(shard)
    shard_path = Path(out_dir) / f"{_shard_name((i, n))}.jsonl"
    lock = file_lock_path(shard_path)
    created = not lock.parent.exists()
    try:
        with exclusive(lock, f"shard {i}/{n} of {out_dir}", wait=wait):
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
    _seal_complete(shard_path, len(done) + n_written, owned)
    seconds = time.perf_counter() - start
    log.info("self-generation %s: wrote %d samples, %d tokens in %.1f s (%.0f tokens/s)", plan.strategy.spec,
             n_written, n_tokens, seconds, n_tokens / seconds if seconds else float("nan"))
    return GenerationResult(out_dir, plan.shard, shard_path, len(owned), n_written, len(done), n_tokens,
                            n_positions, seconds, manifest, stats)


def _resume(plan: _Plan, shard_path: Path, stats_path: Path, stats: Any) -> tuple[Any, set[int], range]:
    """``(stats, done, owned)``: the keys checkpoint (when collecting) and the indices already on disk.

    The shard is cut back to its last complete record, or when collecting keys to the bytes the
    checkpoint covers (to nothing when it has records but no checkpoint): those records are redone. A
    shard whose records are not its indices in order is refused (:class:`~.shards.DamagedShard`).
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
    owned = shard_indices(plan.n_samples, plan.shard)
    done_list, _ = _scan_shard(shard_path, owned, keep_bytes)
    return stats, set(done_list), owned


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
            _append(fd, "".join(lines).encode("utf-8"), shard_path)  # 1. the records (fsync-ed) ...
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
