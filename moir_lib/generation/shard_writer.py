""":func:`self_generate`: one shard of a self-generation (Algorithm 1), locked, resumable, block by block.

The shard lock is taken, the request checked (:mod:`.plan`), the manifest created or matched and the
shard resumed (:mod:`.shards`, :mod:`.keystats`); then each block of the shard's indices is sampled
(:mod:`.decoding`, or :mod:`moir_lib.vllm_backend`), its records are appended and fsync-ed, and, when
collecting keys, the prefixes that fell in the block and the checkpoint that commits them are saved.
With a stop rule (:mod:`.stopping`), the generation is checked between blocks and stops when ``C`` has
converged. A prefix asked of a generation whose blocks are already written is taken by replaying those blocks
(the same samples, checked against the records, into fresh statistics).
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

import numpy as np

from moir_lib.generation.decoding import _decode_block, _decode_block_static, _StaticDecoder
from moir_lib.generation.keystats import (
    _load_shard_stats,
    _new_stats,
    _save_shard_stats,
    _stats_path,
    prefix_store,
)
from moir_lib.generation.plan import GenerationSettings, _manifest_config, _Plan, _validated_plan
from moir_lib.generation.seeds import seed_ids_for
from moir_lib.generation.shards import (
    DamagedShard,
    _append,
    _ensure_manifest,
    _iter_shard,
    _scan_shard,
    _seal_complete,
    _shard_name,
    generation_samples,
    record_stop,
    shard_indices,
    validate_shard,
)
from moir_lib.generation.stopping import Checker, StopRule, outcome
from moir_lib.timings import timed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from moir_lib.covariance.prefixes import PrefixTaps

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
    prefixes: Any = None  # this shard's prefix statistics by sample count (collect_layers and prefixes)

    @property
    def stopped(self) -> dict[str, Any] | None:
        """The stop rule's outcome (:func:`~moir_lib.generation.stopping.outcome`), once it decided."""
        return self.manifest.get("stopped")

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def complete(self) -> bool:
        return self.n_written + self.n_skipped == self.n_shard_samples


@timed("self-generation")
def self_generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: GenerationSettings,
                  out_dir: str | os.PathLike[str], shard: tuple[int, int] | None = None, wait: bool = False,
                  **options: Any) -> GenerationResult:
    """Generate (or resume) the ``settings.n_samples`` self-generated continuations of ``settings`` into
    ``out_dir`` (see the package doc).

    The shard is locked while it is written (:mod:`moir_lib.locks`): a second process on the same
    shard of the same ``out_dir`` is refused at once with the holder's PID and command (other
    shards of the generation may go on in parallel), or, with ``wait`` (a shared cache entry), waits for
    it and then resumes the finished shard (nothing left to generate). ``options``: those of
    :func:`_self_generate` (``stats``, ``progress``, ``engine``).
    """
    from moir_lib.locks import exclusive, file_lock_path

    i, n = validate_shard(shard)
    shard_path = Path(out_dir) / f"{_shard_name((i, n))}.jsonl"
    lock = file_lock_path(shard_path)
    created = not lock.parent.exists()
    try:
        with exclusive(lock, f"shard {i}/{n} of {out_dir}", wait=wait):
            return _self_generate(model, tokenizer, settings, out_dir, (i, n), **options)
    except Exception:  # a generation refused before writing leaves no directory behind (rmdir keeps any data)
        if created:
            with contextlib.suppress(OSError):
                lock.unlink()
                lock.parent.rmdir()
        raise


def _self_generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: GenerationSettings,
                   out_dir: str | os.PathLike[str], shard: tuple[int, int] | None = None, *,
                   stats: Any = None, progress: bool = True, engine: Any = None) -> GenerationResult:
    """Generate (or resume) the continuations of ``settings`` (:class:`~.plan.GenerationSettings`) into
    ``out_dir``, the shard lock held.

    ``model``/``tokenizer``: as from :func:`moir_lib.models.load`. ``shard``: ``(i, n)``: generate indices
    ``i, i+n, …`` only. ``stats``: a ``CovarianceStats`` to add the collected keys to (only for a fresh
    shard; on resume the checkpoint is the state). ``engine``: a ``vllm.LLM`` to use with
    ``backend="vllm"`` (default built from the model's source).
    Bad arguments raise ``ValueError`` (a missing vLLM or GPU ``RuntimeError``) before any model work.
    Returns a :class:`GenerationResult`; the records are read back with :func:`read_samples`.
    """
    stop = settings.stop
    plan = _validated_plan(model, tokenizer, settings, shard, engine)
    points = _checked_prefixes(plan, settings.prefixes, stop)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _manifest_config(model, tokenizer, plan)
    if stop is not None:
        config["stop"] = stop.to_config()
    manifest = _ensure_manifest(out_dir, config)

    shard_path = out_dir / f"{_shard_name(plan.shard)}.jsonl"
    stats_path = _stats_path(out_dir, plan.shard)
    n_total = generation_samples(manifest)
    points = [m for m in points if m <= n_total]
    stats, done, owned = _resume(plan, shard_path, stats_path, stats, n_total)
    store = prefix_store(out_dir, plan.shard, manifest) if points else None
    behind = [m for m in points if m not in store and any(i >= m for i in done)] if points else []
    if behind:
        _replay_prefixes(model, plan, _Replay(shard_path, owned, config, store), behind)
    todo = [i for i in owned if i not in done]
    if done:
        log.info("%s: resuming, %d of %d samples already written", shard_path.name, len(done), len(owned))
    log.info("self-generation %s: %d samples (shard %d/%d), ≤%d new tokens, batch %d -> %s",
             plan.strategy.spec, len(todo), plan.shard[0], plan.shard[1], plan.max_new_tokens,
             plan.batch_size, out_dir)

    # --- generate, block by block (blocks are fixed chunks of the shard's index list)
    start = time.perf_counter()
    if plan.layers is not None and stats is None:
        stats = _new_stats(plan.adapter, plan.layers, config, plan.shard)
    static = _StaticDecoder(model, plan.capture) if plan.loop == "static" and todo else None
    if plan.backend == "vllm" and todo and engine is None:
        from moir_lib import vllm_backend

        engine = vllm_backend.engine_for(model)
    from moir_lib.covariance.prefixes import PrefixTaps  # here: the covariance package reads generation

    checker = Checker(stop, plan.n_samples, store) if stop is not None and "stopped" not in manifest else None
    taps = _Taps(PrefixTaps(points, _emitter(store, plan.shard), done=store or ()), checker, n_total)
    n_written, n_tokens, n_positions = _write_blocks(
        model, tokenizer, plan, _Shard(shard_path, stats_path, owned, done, stats), _Decoders(static, engine),
        taps, progress=progress, start=start)
    if taps.checker is not None and taps.checker.checks:
        manifest = record_stop(out_dir, outcome(stop, taps.checker.checks, plan.n_samples))
        owned = shard_indices(generation_samples(manifest), plan.shard)
        log.info("%s", manifest["stopped"]["text"])
    _seal_complete(shard_path, len(done) + n_written, owned)
    seconds = time.perf_counter() - start
    log.info("self-generation %s: wrote %d samples, %d tokens in %.1f s (%.0f tokens/s)", plan.strategy.spec,
             n_written, n_tokens, seconds, n_tokens / seconds if seconds else float("nan"))
    return GenerationResult(out_dir, plan.shard, shard_path, len(owned), n_written, len(done & set(owned)),
                            n_tokens, n_positions, seconds, manifest, stats, store)


def _checked_prefixes(plan: _Plan, prefixes: Sequence[int], stop: StopRule | None) -> list[int]:
    """The prefix points of a request (its own and the stop rule's); ``ValueError`` where they cannot be
    taken."""
    points = sorted({int(m) for m in prefixes} | set(stop.prefix_points(plan.n_samples) if stop else ()))
    if not points:
        return []
    if plan.layers is None:
        raise ValueError("prefixes and a stop rule read the keys collected during generation: pass "
                         "collect_layers (moir generate --collect-keys)")
    bad = [m for m in prefixes if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1]
    if bad:
        raise ValueError(f"prefixes are sample counts ≥ 1, got {bad}")
    if stop is not None and plan.shard[1] != 1:
        raise ValueError(f"a stop rule judges the whole generation's samples: generate it as one shard, not "
                         f"{plan.shard[1]}")
    if stop is not None and stop.first_check % plan.batch_size:
        raise ValueError(f"the first check ({stop.first_check} samples) must be a multiple of batch_size "
                         f"{plan.batch_size}: checks fall between blocks")
    return [m for m in points if m <= plan.n_samples]


def _resume(plan: _Plan, shard_path: Path, stats_path: Path, stats: Any, n_total: int
            ) -> tuple[Any, set[int], range]:
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
    owned = shard_indices(n_total, plan.shard)
    done_list, _ = _scan_shard(shard_path, owned, keep_bytes)
    return stats, set(done_list), owned


@dataclass
class _Shard:
    """A shard as its block loop writes it: the records file and the keys checkpoint, the indices it owns
    and those already on disk (a prefix of them), the keys statistics to add to (when collecting)."""

    path: Path
    stats_path: Path
    owned: range
    done: set[int]
    stats: Any


@dataclass
class _Decoders:
    """What samples a generation's blocks besides the model: the ``"static"`` loop's state, the vLLM
    engine."""

    static: _StaticDecoder | None
    engine: Any


def _write_blocks(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, plan: _Plan, shard: _Shard,
                  decoders: _Decoders, taps: _Taps, *, progress: bool, start: float) -> tuple[int, int, int]:
    """Generate the missing samples block by block and append their records, each block fsync-ed (then,
    when collecting keys, the prefixes taken in it and the checkpoint that commits it), until the stop
    rule of ``taps`` stops the generation. Returns ``(n_written, n_tokens, n_positions)``."""
    from tqdm.auto import tqdm

    owned, done, shard_path = shard.owned, shard.done, shard.path
    blocks = [list(owned[s:s + plan.batch_size]) for s in range(0, len(owned), plan.batch_size)]
    n_written = n_tokens = n_positions = 0
    with contextlib.ExitStack() as stack:
        collector = None
        if plan.layers is not None:
            from moir_lib.covariance.hooks import KeyCollector

            collector = stack.enter_context(KeyCollector(plan.adapter, plan.layers, stats=shard.stats))
        fd = os.open(shard_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        stack.callback(os.close, fd)
        stack.callback(model.train, model.training)
        model.eval()
        bar = stack.enter_context(tqdm(total=len(owned) - len(done), unit="sample",
                                       desc=f"generate {plan.strategy.spec}", disable=not progress,
                                       dynamic_ncols=True))
        for b, block in enumerate(blocks):
            count_rows = [i not in done for i in block]
            if any(count_rows) and collector is not None:
                taps.prefixes.begin(collector.stats, block)
            if taps.stops_at(b * plan.batch_size):
                break
            if not any(count_rows):
                continue
            seeds = [seed_ids_for(plan.strategy, i, plan.seed, bos_id=plan.bos, candidates=plan.candidates,
                                  prompt_ids=plan.prompt_ids) for i in block]
            if collector is not None:
                collector.set_taps(taps.prefixes.rows(block))
            sampled, positions = _sample_block(model, plan, seeds, block, count_rows, collector, decoders)
            n_positions += positions
            lines, block_tokens = _record_lines(tokenizer, plan, block, seeds, sampled, count_rows)
            n_tokens += block_tokens
            _append(fd, "".join(lines).encode("utf-8"), shard_path)  # 1. the records (fsync-ed) ...
            if collector is not None:  # 2. ... the prefixes in the block, 3. the keys checkpoint
                collector.set_taps()
                taps.prefixes.end()
                _save_shard_stats(shard.stats_path, collector.stats, os.fstat(fd).st_size,
                                  len(done) + n_written + len(lines))
            n_written += len(lines)
            bar.update(len(lines))
            bar.set_postfix(tok_s=f"{n_tokens / max(time.perf_counter() - start, 1e-9):,.0f}", refresh=False)
        else:  # the last block: the points at the end, and the budget's own check
            if collector is not None and len(done) + n_written == len(owned):
                taps.prefixes.finish(collector.stats, taps.n_total)
            taps.stops_at(len(owned))
    return n_written, n_tokens, n_positions


def _sample_block(model: PreTrainedModel, plan: _Plan, seeds: list[list[int]], block: list[int],
                  count_rows: list[bool], collector: Any, decoders: _Decoders) -> tuple[list[list[int]], int]:
    """The sampled tokens of one block's rows and the forward positions run, on the plan's backend/loop."""
    if plan.backend == "vllm":
        from moir_lib import vllm_backend

        return vllm_backend.decode_block(decoders.engine, seeds, block, plan.seed, plan.max_new_tokens,
                                         plan.eos_ids, count_rows)
    import torch

    step_args = (plan.sampling, seeds, block, collector, count_rows)
    with torch.inference_mode():
        return (_decode_block_static(decoders.static, *step_args) if decoders.static is not None
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


@dataclass
class _Taps:
    """What a block loop takes besides the samples: the prefixes, and the stop rule's checks."""

    prefixes: PrefixTaps
    checker: Checker | None
    n_total: int  # the samples of the generation (its budget, or where a stop rule stopped it)

    def stops_at(self, count: int) -> bool:
        """Whether the generation stops with ``count`` samples (a check point where ``C`` has converged)."""
        return self.checker is not None and self.checker.at(count)


def _emitter(store: Any, shard: tuple[int, int]) -> Any:
    """Save a shard's prefix at ``m`` in ``store`` (its keys of the samples below ``m``)."""
    from moir_lib.covariance.prefixes import prefix_metadata

    def emit(m: int, stats: Any, documents: int) -> None:
        held = len(range(shard[0], documents, shard[1]))
        record = {**(stats.metadata.get("corpus") or [{}])[0], "documents": held}
        path = store.path(m)
        path.parent.mkdir(parents=True, exist_ok=True)
        stats.save(path, extra_metadata=prefix_metadata(stats, m, store.of, record))
        store.saved(m)
        log.info("%s: prefix at %d samples, %d keys per layer", path.name, m, stats.n_tokens)

    return emit


@dataclass
class _Replay:
    """A shard already written whose prefixes are to be taken: its file, indices, generation configuration."""

    shard_path: Path
    owned: range
    config: dict[str, Any]
    store: Any


def _replay_prefixes(model: PreTrainedModel, plan: _Plan, where: _Replay, points: list[int]) -> None:
    """Take the prefixes ``points`` of a shard whose samples are on disk: its blocks again from the first,
    into fresh statistics grouped as the generation grouped them (one block at a time, as its checkpoints
    flush), every sample checked against its record (:class:`~.shards.DamagedShard` when one differs)."""
    from moir_lib.covariance.hooks import KeyCollector
    from moir_lib.covariance.prefixes import PrefixTaps

    log.info("%s: taking prefixes %s by replaying its first samples", where.shard_path.name, points)
    written = {rec["index"]: rec["token_ids"] for rec in _iter_shard(where.shard_path)}
    stats = _new_stats(plan.adapter, plan.layers, where.config, plan.shard)
    taps = PrefixTaps(points, _emitter(where.store, plan.shard))
    static = _StaticDecoder(model, plan.capture) if plan.loop == "static" else None
    blocks = [list(where.owned[s:s + plan.batch_size]) for s in range(0, len(where.owned), plan.batch_size)]
    with contextlib.ExitStack() as stack:
        collector = stack.enter_context(KeyCollector(plan.adapter, plan.layers, stats=stats))
        stack.callback(model.train, model.training)
        model.eval()
        for block in blocks:
            taps.begin(stats, block)
            if not taps:
                break
            seeds = [seed_ids_for(plan.strategy, i, plan.seed, bos_id=plan.bos, candidates=plan.candidates,
                                  prompt_ids=plan.prompt_ids) for i in block]
            collector.set_taps(taps.rows(block))
            sampled, _ = _sample_block(model, plan, seeds, block, [True] * len(block), collector,
                                       _Decoders(static, None))
            collector.set_taps()
            differ = [i for i, toks in zip(block, sampled, strict=True) if written.get(i) != toks]
            if differ:
                raise DamagedShard(f"{where.shard_path}: replaying sample {differ[0]} gave other tokens than "
                                   f"its record (another model, or nondeterministic hardware): its prefixes "
                                   f"cannot be taken; generate it again into a new directory")
            stats.flush()  # as the checkpoint after each block flushes
            taps.end()
