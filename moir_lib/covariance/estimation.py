"""Estimating ``C`` over a corpus (eq. (kfac), (memoir_estimator)): :func:`estimate`, cached, resumable.

:func:`estimate` runs a corpus through the model: every edit layer in one forward pass, documents
packed into batches by a token budget (:mod:`moir_lib.covariance.packing`), padding ignored, the
pass stopped right after the last edit layer's key is read (a private exception raised from that
layer's hook: no later layer, final norm or LM head runs), checkpointed and resumable, and cached on
disk under a fingerprint of everything that determines the result (:func:`estimate_key`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moir_lib import models
from moir_lib.cache import DamagedFile, fingerprint
from moir_lib.cache import cache_dir as _cache_root
from moir_lib.covariance.hooks import KeyCollector, base_metadata, model_dtype
from moir_lib.covariance.packing import (
    WINDOW_BATCHES,
    Doc,
    Tokenized,
    default_max_length,
    packed_windows,
    tensors,
)
from moir_lib.covariance.prefixes import PrefixStore, PrefixTaps, prefix_metadata
from moir_lib.covariance.products import _torch, resolve_precision
from moir_lib.covariance.stats import FORMAT, CovarianceStats
from moir_lib.documents import Corpus, CorpusSpec, load_corpus
from moir_lib.files import write_json
from moir_lib.locks import dir_lock_path, exclusive, writable_dir
from moir_lib.models import ModelAdapter, model_fingerprint
from moir_lib.profiles import Profile
from moir_lib.timings import timed

log = logging.getLogger(__name__)

FINAL = "stats.safetensors"
CHECKPOINT = "checkpoint.safetensors"
_EXHAUSTED = object()


def _resolve_model(model_or_loaded: Any, layers: Iterable[int] | None) -> tuple[Any, Any, ModelAdapter, Any]:
    if isinstance(model_or_loaded, (str, os.PathLike, Profile)):
        if isinstance(model_or_loaded, Profile) and layers is None:
            layers = model_or_loaded.edit_layers
        model_or_loaded = models.load(model_or_loaded)
    triple = isinstance(model_or_loaded, tuple) and len(model_or_loaded) == 3
    if isinstance(model_or_loaded, models.LoadedModel) or triple:
        model, tokenizer, adapter = model_or_loaded
    elif isinstance(model_or_loaded, ModelAdapter):
        model, tokenizer, adapter = model_or_loaded.model, model_or_loaded.tokenizer, model_or_loaded
    else:  # a bare model: token-id documents only
        model, tokenizer = model_or_loaded, None
        adapter = ModelAdapter.for_model(model)
    if layers is None:
        raise ValueError("no layers given: pass layers=[...] (or a Profile, whose edit layers are used)")
    return model, tokenizer, adapter, list(layers)


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """16 hex identifying a tokenizer's behaviour (its full ``tokenizer.json`` for fast tokenizers)."""
    if tokenizer is None:
        return None
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("truncation", None)  # call-time settings the last tokenizer(...) call left behind
        state.pop("padding", None)
        h.update(json.dumps(state, sort_keys=True).encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _corpus_identity(documents: Any, corpus_spec: Any) -> tuple[dict[str, Any] | None, str]:
    """``(fingerprint record or None, display name)`` of the documents."""
    if corpus_spec is None and isinstance(documents, Corpus):
        corpus_spec = documents
    if isinstance(corpus_spec, Corpus):
        return corpus_spec.key(), corpus_spec.spec.describe()
    if isinstance(corpus_spec, CorpusSpec):
        return corpus_spec.key(), corpus_spec.describe()
    if isinstance(corpus_spec, str):
        return {"name": corpus_spec}, corpus_spec
    if isinstance(corpus_spec, Mapping):
        return dict(corpus_spec), str(corpus_spec.get("name", "corpus"))
    if corpus_spec is not None:
        raise TypeError(f"corpus_spec must be a Corpus, CorpusSpec, str or dict, "
                        f"got {type(corpus_spec).__name__}")
    if isinstance(documents, Sequence) and not isinstance(documents, (str, bytes)):
        h = hashlib.sha256()
        for doc in documents:
            h.update(doc.encode() if isinstance(doc, str) else json.dumps([int(t) for t in doc]).encode())
            h.update(b"\x00")
        record = {"kind": "inline", "n": len(documents), "sha256": h.hexdigest()[:16]}
        return record, f"{len(documents)} documents"
    return None, "documents"


@dataclass(frozen=True)
class EstimationSettings:
    """How :func:`estimate` estimates ``C``: what decides the result (``tokens_per_batch`` … ``revision``,
    all in :func:`estimate_key`) and how its pass runs (checkpoints, early stop: not in the key, no effect
    on the result). The fields are :func:`estimate`'s arguments of the same names."""

    tokens_per_batch: int = 12_288
    max_length: int | None = None
    add_bos: bool | None = None
    count_bos: bool = True
    precision: str = "auto"
    revision: str | None = None
    checkpoint_every: int | None = 100
    checkpoint_dir: str | os.PathLike[str] | None = None
    stop_early: bool = True


def estimate_key(settings: EstimationSettings, *, model_fp: str, key_site: str, layers: Sequence[int],
                 dtype: str, tokenizer_fp: str | None, corpus: Mapping[str, Any]) -> dict[str, Any]:
    """The record :func:`estimate`'s cache fingerprint is computed from (every field matters: the token
    budget decides which documents share a batch product, and so the last bits of the sum). ``settings``:
    resolved (a concrete ``precision`` and ``max_length``)."""
    return {
        "kind": "covariance",
        "format": FORMAT,
        "model": model_fp,
        "revision": settings.revision,
        "key_site": key_site,
        "layers": sorted(int(x) for x in layers),
        "dtype": dtype,
        "precision": settings.precision,
        "tokenization": {"tokenizer": tokenizer_fp, "add_bos": settings.add_bos,
                         "count_bos": settings.count_bos, "max_length": int(settings.max_length)},
        "corpus": dict(corpus),
        "tokens_per_batch": settings.tokens_per_batch,
    }


def _checked_sizes(model: Any, settings: EstimationSettings) -> int:
    """The document length limit (default :func:`~moir_lib.covariance.packing.default_max_length`);
    ``ValueError`` for sizes that are not positive integers or a document that cannot fit a batch."""
    tokens_per_batch, max_length = settings.tokens_per_batch, settings.max_length
    checkpoint_every = settings.checkpoint_every
    if isinstance(tokens_per_batch, bool) or not isinstance(tokens_per_batch, int) or tokens_per_batch <= 0:
        raise ValueError(f"tokens_per_batch must be a positive integer, got {tokens_per_batch!r}")
    if max_length is None:
        max_length = default_max_length(model, tokens_per_batch)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    if max_length > tokens_per_batch:
        raise ValueError(f"max_length {max_length} exceeds tokens_per_batch {tokens_per_batch}: one document "
                         f"must fit a batch (raise tokens_per_batch or lower max_length)")
    if checkpoint_every is not None and checkpoint_every <= 0:
        raise ValueError(f"checkpoint_every must be positive or None, got {checkpoint_every}")
    return max_length


@dataclass
class _Job:
    """One estimate: the model, what counts, where it checkpoints (``ckpt``) and how it is identified."""

    model: Any
    tokenizer: Any
    adapter: ModelAdapter
    layers: list[int]
    settings: EstimationSettings  # resolved: a concrete precision and max_length
    model_fp: str
    key: dict[str, Any]
    fp: str
    corpus_key: dict[str, Any] | None
    corpus_name: str
    ckpt: Path | None = None

    @property
    def window_tokens(self) -> int:
        return self.settings.tokens_per_batch * WINDOW_BATCHES


@dataclass
class _Position:
    """Where an estimate stands in the corpus: documents before the current window, batches of that
    window already counted, and batches counted in all (batch numbers of error messages)."""

    docs_before_window: int = 0
    batches_done: int = 0
    global_batches: int = 0


@timed("C estimation")
def estimate(model_or_loaded: Any, documents: Iterable[Any], layers: Iterable[int] | None = None,
             settings: EstimationSettings = EstimationSettings(), *, corpus_spec: Any = None,
             cache: bool | str | os.PathLike[str] = True, progress: bool = True, prefixes: Iterable[int] = ()
             ) -> CovarianceStats:
    """Estimate ``C`` at the key site of every layer in ``layers`` over ``documents``, in one pass per batch.

    ``model_or_loaded``: a :class:`~moir_lib.models.LoadedModel` / ``(model, tokenizer, adapter)``,
    a :class:`~moir_lib.models.ModelAdapter`, a spec or :class:`~moir_lib.profiles.Profile` for
    :func:`~moir_lib.models.load` (a profile's edit layers are the default), or a bare model
    (token-id documents only). ``documents``: a :class:`moir_lib.documents.Corpus` (its spec is the
    corpus identity), a spec string for :func:`moir_lib.documents.load_corpus`, a list, or any
    iterable of ``str`` / token-id sequences, in a deterministic order. ``settings``: an
    :class:`EstimationSettings`, whose fields are these:

    ``tokens_per_batch``: padded tokens per forward pass (the paper: 12 288); documents are
    sorted by length within windows of 16 batches and packed greedily. ``max_length``: documents
    are truncated to this many tokens (default ``min(model positions, 2048, tokens_per_batch)``).
    ``add_bos``: ``None`` tokenizes like ``tokenizer(text)`` (as ``layer_stats``), ``True`` ensures
    exactly one leading BOS, ``False`` none (token-id documents are used as they are).
    ``count_bos``: whether the BOS position's key counts (:mod:`moir_lib.covariance.packing`).
    ``precision``: ``"auto"`` | ``"float64"`` | ``"float32"`` | ``"tf32"``
    (:mod:`moir_lib.covariance.products`). ``stop_early``: end each forward pass after the last
    layer's key (no effect on the result). ``checkpoint_every``, ``checkpoint_dir``: below.

    ``prefixes``: document counts ``m`` at which the statistics
    of the first ``m`` documents are taken in the same pass (:mod:`moir_lib.covariance.prefixes`): the
    result's ``prefixes``, ``{m: CovarianceStats}``.

    Caching: with ``cache`` (``True``: ``$MOIR_CACHE``; or a directory) the result is stored under
    ``covariance/<fingerprint>/`` of :func:`estimate_key` — model weights (or hub id + revision),
    layers, key site, model dtype, precision, tokenization and the corpus record (name, revision,
    n, seed, truncation, file contents) — and identical inputs load it instead of running.
    Documents without an identity (an anonymous iterator and no ``corpus_spec``) are not cached.
    A cached file is served only when its checksum verifies; a damaged one is reported by path and
    rebuilt. The entry is locked while it is built: a second process asking for the same ``C``
    waits, then reuses it. A read-only cache serves hits and otherwise runs uncached (warning).
    Prefixes go beside the result (``prefix-<m>.safetensors``: it does not depend on them); a cached
    result lacking some is not served as if it had them: the pass runs again up to the last missing.

    Checkpoints: at the end of the first window of documents (16 batches' worth) after every
    ``checkpoint_every`` batches, the statistics and the position in the corpus are saved
    atomically (in the cache entry, or ``checkpoint_dir``, which is locked); a later call with the
    same inputs resumes there without counting any document twice. Keys are summed in groups fixed
    per window, whatever the checkpoints, so a resumed estimate equals an uninterrupted one bit for
    bit. Shards merged with :meth:`CovarianceStats.merge` count the same keys, but sum them in
    another order (and a document's keys may round differently in another batch): see the README
    for the bound.

    Raises ``ValueError`` for a layer out of range (before any work), an empty corpus, or
    NaN/inf keys (naming the layer and batch).
    """
    model, tokenizer, adapter, layers = _resolve_model(model_or_loaded, layers)
    layers = sorted(adapter.check_layers(layers))
    settings = dataclasses.replace(settings, max_length=_checked_sizes(model, settings))
    points = _checked_points(prefixes)
    if isinstance(documents, (str, os.PathLike)):
        documents = load_corpus(documents)
    job = _job(model, tokenizer, adapter, layers, documents, corpus_spec, settings)
    entry, hit = _cache_entry(cache, job)
    if hit is not None and _with_prefixes(hit, job, points):
        return hit
    checkpoint_dir, checkpoint_every = settings.checkpoint_dir, settings.checkpoint_every
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else entry
    with _writer_lock(entry, ckpt_dir if checkpoint_every else None, job.corpus_name):
        store = PrefixStore(entry if entry is not None else ckpt_dir, job.fp)
        hit = _cache_hit(entry / FINAL, job.fp) if entry is not None else None
        if hit is not None and _with_prefixes(hit, job, points):
            log.info("covariance cache hit: %s (%s, layers %s)", hit.path, job.corpus_name, job.layers)
            return hit
        if checkpoint_dir is not None and job.corpus_key is None:
            raise ValueError("checkpointing needs the corpus identity: pass a Corpus or corpus_spec=... "
                             "(an anonymous iterator cannot be resumed safely)")
        if hit is not None:  # the prefixes alone: the pass again, up to the last one missing
            _accumulate(job, _fresh(job), documents, _Position(), progress=progress,
                        taps=PrefixTaps(points, _emitter(job, store), done=store), until_taps=True)
            hit.prefixes = store
            return hit
        job.ckpt = ckpt_dir / CHECKPOINT if (ckpt_dir is not None and checkpoint_every) else None
        return _run(job, documents, entry, points, store, progress=progress)


def _with_prefixes(hit: CovarianceStats, job: _Job, points: list[int]) -> bool:
    """Whether the cached ``hit`` has every prefix of ``points`` beside it (then attached to it)."""
    store = PrefixStore(hit.path.parent if hit.path is not None else None, job.fp)
    if not store.has(points):
        log.info("the cache entry %s lacks prefixes %s: they take a pass", hit.path,
                 sorted(set(points) - set(store)))
        return False
    hit.prefixes = store
    return True


def _run(job: _Job, documents: Iterable[Any], entry: Path | None, points: list[int], store: PrefixStore, *,
         progress: bool) -> CovarianceStats:
    """The pass of ``job`` (from its checkpoint, unless that is past prefixes it did not take), its
    prefixes at ``points`` into ``store``, the result stored in ``entry``."""
    stats, position = _start(job)
    if any(m <= position.docs_before_window for m in set(points) - set(store)):
        log.info("checkpoint %s is past prefixes it did not take: starting the estimate over", job.ckpt)
        stats, position = _fresh(job), _Position()
    taps = PrefixTaps(points, _emitter(job, store), done=store)
    start = time.perf_counter()
    tokens_run = _accumulate(job, stats, documents, position, progress=progress, taps=taps)
    taps.finish(stats, position.docs_before_window)
    _finish(job, stats, entry, position.docs_before_window, tokens_run, time.perf_counter() - start)
    stats.prefixes = store
    return stats


def _checked_points(prefixes: Iterable[int]) -> list[int]:
    """The prefix points, sorted; ``ValueError`` for one that is not a positive document count."""
    points = list(prefixes)
    bad = [m for m in points if isinstance(m, bool) or not isinstance(m, int) or m < 1]
    if bad:
        raise ValueError(f"prefixes are document counts ≥ 1, got {bad}")
    return sorted(set(points))


def _emitter(job: _Job, store: PrefixStore) -> Any:
    """Where a prefix of ``job`` goes: a file beside the result (or the checkpoint directory), else memory."""
    def emit(m: int, stats: CovarianceStats, documents: int) -> None:
        record = dict(job.corpus_key or {"name": job.corpus_name})
        record.setdefault("name", job.corpus_name)
        meta = prefix_metadata(stats, m, job.fp, {**record, "documents": documents})
        path = store.path(m)
        if path is None:
            held = stats.copy()
            held.metadata.update(meta)
            store.hold(m, held)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            stats.save(path, extra_metadata=meta)
            store.saved(m)
        log.info("prefix of %s: the first %d documents, %d keys per layer", job.corpus_name, documents,
                 stats.n_tokens)

    return emit


def _job(model: Any, tokenizer: Any, adapter: ModelAdapter, layers: list[int], documents: Any,
         corpus_spec: Any, settings: EstimationSettings) -> _Job:
    """The resolved precision and the identity (:func:`estimate_key`, its fingerprint) of one estimate
    (``settings.max_length`` resolved already)."""
    param = next(model.parameters())
    settings = dataclasses.replace(settings, precision=resolve_precision(settings.precision, param.device,
                                                                         param.dtype))
    corpus_key, corpus_name = _corpus_identity(documents, corpus_spec)
    model_fp = model_fingerprint(model, settings.revision)
    key = estimate_key(settings, model_fp=model_fp, key_site=adapter.key_module_template, layers=layers,
                       dtype=model_dtype(model), tokenizer_fp=tokenizer_fingerprint(tokenizer),
                       corpus=corpus_key or {})
    return _Job(model, tokenizer, adapter, layers, settings, model_fp, key, fingerprint(key), corpus_key,
                corpus_name)


def _cache_entry(cache: bool | str | os.PathLike[str], job: _Job
                 ) -> tuple[Path | None, CovarianceStats | None]:
    """``(cache entry directory or None, verified hit of a read-only cache or None)``."""
    if cache and job.corpus_key is None:
        log.warning("documents have no identity (pass a Corpus or corpus_spec=...): "
                    "the estimate is not cached")
    if not cache or job.corpus_key is None:
        return None, None
    root = _cache_root() if cache is True else Path(cache).expanduser()
    entry = root / "covariance" / job.fp
    if _writable(entry):
        return entry, None
    hit = _cache_hit(entry / FINAL, job.fp)  # a read-only cache still serves verified hits
    if hit is not None:
        log.info("covariance cache hit: %s (%s, layers %s)", hit.path, job.corpus_name, job.layers)
        return None, hit
    log.warning("the covariance cache %s is not writable: this estimate is neither cached nor "
                "checkpointed (set MOIR_CACHE to a writable directory)", root)
    return None, None


def _fresh(job: _Job) -> CovarianceStats:
    """Empty statistics of ``job`` (its identity in the metadata)."""
    s = job.settings
    meta = base_metadata(job.adapter, s.precision, s.revision, job.model_fp)
    tokenization = {"tokenizer": job.key["tokenization"]["tokenizer"], "add_bos": s.add_bos,
                    "count_bos": s.count_bos, "max_length": s.max_length}
    meta.update(tokenization=tokenization, corpus=[], fingerprint=job.fp)
    return CovarianceStats(job.layers, job.adapter.key_dim, meta, precision=s.precision)


def _start(job: _Job) -> tuple[CovarianceStats, _Position]:
    """The statistics and corpus position to continue from: ``job.ckpt``'s checkpoint, or empty ones."""
    stats = _load_checkpoint(job.ckpt) if job.ckpt is not None and job.ckpt.is_file() else None
    if stats is None:
        return _fresh(job), _Position()
    saved = stats.metadata.pop("resume", {})
    if saved.get("fingerprint") != job.fp:
        raise ValueError(f"checkpoint {job.ckpt} belongs to another estimate (fingerprint "
                         f"{saved.get('fingerprint')} vs {job.fp}): delete it or use another "
                         f"checkpoint_dir")
    if (saved.get("tokens_per_batch") != job.settings.tokens_per_batch
            or saved.get("window_tokens") != job.window_tokens):
        raise ValueError(f"checkpoint {job.ckpt} was written with "
                         f"tokens_per_batch={saved.get('tokens_per_batch')}: resume with the same "
                         f"value, or delete the checkpoint to start over")
    fields = ("docs_before_window", "batches_done", "global_batches")
    position = _Position(**{k: int(saved[k]) for k in fields})
    log.info("resuming %s from %s: %d documents done, %d batches into the current window",
             job.corpus_name, job.ckpt, position.docs_before_window, position.batches_done)
    return stats, position


def _documents_after(documents: Iterable[Any], job: _Job, position: _Position) -> Tokenized:
    """The tokenized documents not counted yet (the corpus order is deterministic: skip the counted ones)."""
    doc_iter = iter(documents)
    for _ in range(position.docs_before_window):
        if next(doc_iter, _EXHAUSTED) is _EXHAUSTED:
            raise ValueError(f"checkpoint {job.ckpt} counted {position.docs_before_window} documents but "
                             f"the corpus has fewer: it is not the same corpus (delete the checkpoint)")
    s = job.settings
    return Tokenized(doc_iter, job.tokenizer, job.adapter, s.add_bos, s.count_bos, s.max_length,
                     position.docs_before_window)


def _accumulate(job: _Job, stats: CovarianceStats, documents: Iterable[Any], position: _Position, *,
                progress: bool, taps: PrefixTaps, until_taps: bool = False) -> int:
    """Run every batch not counted yet through the model, adding its keys to ``stats`` (``position``
    advances; a checkpoint after each window once ``checkpoint_every`` batches ran) and to the prefixes
    ``taps`` takes; ``until_taps``: stop once they are all taken. Returns the keys counted by this call."""
    from tqdm.auto import tqdm

    torch = _torch()
    model, adapter = job.model, job.adapter
    device = next(model.parameters()).device
    stats.to(device)
    docs = _documents_after(documents, job, position)
    pad_id = adapter.pad_token_id if adapter.pad_token_id is not None else 0
    bar = tqdm(desc=f"C {job.corpus_name} L{job.layers[0]}-{job.layers[-1]}", unit="tok", unit_scale=True,
               disable=not progress, dynamic_ncols=True)
    since_ckpt = tokens_run = 0
    was_training = model.training
    model.eval()
    try:
        collector = KeyCollector(adapter, job.layers, stats, precision=job.settings.precision,
                                 stop_after_last=job.settings.stop_early)
        with collector, torch.no_grad():
            for w, (window, batches) in enumerate(packed_windows(docs, job.settings.tokens_per_batch)):
                if w == 0 and not batches and stats.n_tokens == 0 and position.docs_before_window == 0:
                    raise ValueError(f"empty corpus: {job.corpus_name} yielded no tokens to count")
                if until_taps and not taps:
                    break
                first = position.docs_before_window
                taps.begin(stats, range(first, first + len(window)))
                for batch in batches[position.batches_done:]:
                    collector.set_taps(taps.rows([d.index for d in batch]))
                    tokens_run += _forward(collector, model, batch, pad_id, job.settings.count_bos, device,
                                           position.global_batches)
                    bar.update(sum(d.counted for d in batch))
                    position.global_batches += 1
                    since_ckpt += 1
                position.batches_done = 0
                position.docs_before_window += len(window)
                bar.set_postfix(docs=position.docs_before_window, refresh=False)
                stats.flush()  # keys are grouped per window, whatever the checkpoints: exact resumes
                collector.set_taps()
                taps.end()  # the prefixes inside the window, before the checkpoint that passes them
                if job.ckpt is not None and since_ckpt >= job.settings.checkpoint_every:
                    save_checkpoint(stats, job.ckpt, job.fp, position.docs_before_window, 0,
                                    position.global_batches, job.settings.tokens_per_batch,
                                    job.window_tokens)
                    since_ckpt = 0
            collector.set_mask(None)
    finally:
        bar.close()
        model.train(was_training)
    return tokens_run


def _forward(collector: KeyCollector, model: Any, batch: list[Doc], pad_id: int, count_bos: bool, device: Any,
             batch_index: int) -> int:
    """One forward pass over ``batch`` with its counted positions masked in; returns the keys counted."""
    ids, attn, count = tensors(batch, pad_id, collector.adapter.bos_token_id, count_bos, device)
    collector.set_mask(count)
    kwargs = {"input_ids": ids, "use_cache": False}
    if attn is not None:
        kwargs["attention_mask"] = attn
    collector.forward(model, batch_index=batch_index, **kwargs)
    return sum(d.counted for d in batch)


def _finish(job: _Job, stats: CovarianceStats, entry: Path | None, documents: int, tokens_run: int,
            seconds: float) -> None:
    """Record the corpus in the metadata, store the result in the cache entry, drop the checkpoint."""
    if stats.n_tokens == 0:
        raise ValueError(f"empty corpus: {job.corpus_name} yielded no tokens to count")
    record = dict(job.corpus_key or {"name": job.corpus_name})
    record.setdefault("name", job.corpus_name)
    record.update(documents=documents, tokens=stats.n_tokens)
    stats.metadata["corpus"] = [record]
    stats.metadata.pop("resume", None)
    log.info("covariance %s layers %s: %d tokens this run in %.1f s (%.0f tokens/s), %d in total",
             job.corpus_name, job.layers, tokens_run, seconds,
             tokens_run / seconds if seconds else float("nan"), stats.n_tokens)
    if entry is not None:
        entry.mkdir(parents=True, exist_ok=True)
        write_json(entry / "key.json", job.key, indent=1, sort_keys=True, default=str)
        stats.path = stats.save(entry / FINAL)
    if job.ckpt is not None and job.ckpt.is_file():
        job.ckpt.unlink()


# ----------------------------------------------------------------------------- cache entries and checkpoints


def _writable(folder: Path) -> bool:
    try:
        writable_dir(folder, "covariance cache entry")
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def _writer_lock(entry: Path | None, ckpt_dir: Path | None, name: str) -> Iterator[None]:
    """Hold the cache entry (waiting for another process building it) and an explicit checkpoint
    directory (refused while another process writes there)."""
    with contextlib.ExitStack() as stack:
        if entry is not None:
            stack.enter_context(exclusive(dir_lock_path(entry), f"covariance cache entry {entry} ({name})",
                                          wait=True))
        if ckpt_dir is not None and ckpt_dir != entry:
            stack.enter_context(exclusive(dir_lock_path(ckpt_dir), f"checkpoint directory {ckpt_dir}"))
        yield


def _cache_hit(path: Path, fp: str) -> CovarianceStats | None:
    """The verified statistics cached at ``path`` for the estimate fingerprinted ``fp``; ``None`` (and the
    file removed) when absent, damaged, or another estimate's (an entry copied into this one's place)."""
    if not path.is_file():
        return None
    try:
        stats = CovarianceStats.load(path, require_checksum=True)
        recorded = stats.metadata.get("fingerprint")
        if recorded != fp:
            raise DamagedFile(f"{path} holds the estimate {recorded} (its metadata's fingerprint), not {fp}")
    except DamagedFile as exc:
        log.warning("%s: not served, it will be rebuilt", exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    stats.from_cache = True
    return stats


def _load_checkpoint(path: Path) -> CovarianceStats | None:
    """A checkpoint's statistics; ``None`` (starting over, with a warning) when it is damaged."""
    try:
        return CovarianceStats.load(path, require_checksum=True)
    except DamagedFile as exc:
        log.warning("%s: starting the estimate over", exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def save_checkpoint(stats: CovarianceStats, path: Path, fp: str, docs_before: int, batches_done: int,
                    global_batches: int, tokens_per_batch: int, window_tokens: int) -> None:
    """Save ``stats`` with the corpus position an estimate of fingerprint ``fp`` resumes from."""
    resume = {"fingerprint": fp, "docs_before_window": docs_before, "batches_done": batches_done,
              "global_batches": global_batches, "tokens_per_batch": tokens_per_batch,
              "window_tokens": window_tokens}
    stats.save(path, extra_metadata={"resume": resume})
    log.debug("checkpoint %s: window at document %d, %d batches in", path, docs_before, batches_done)
