"""Build, cache and load the pocket model organism.

One build = world -> tokenizer -> pretraining -> chat SFT -> ``save_pretrained`` (model +
tokenizer) + pocket CounterFact + portability probes + benchmark datasets, written into a
temporary directory and renamed atomically to ``entry_dir("pocket", key)``, where ``key``
covers the whole :class:`~moir_lib.pocket.variants.Variant` (its training precision resolved on
this machine), the library version and the Python version (the code corpus reads the local
standard library), and for an organism ``K ≥ 1`` (:mod:`.organisms`) also ``K``; organism 0's key
is the recipe's alone. ``manifest.json`` records the key, the organism, the training precision, the
wall times and the SHA-256 of every file; an entry whose files do not match, or whose key is not the
one asked for (another build copied or moved into its folder), is rebuilt, never trusted. A build
killed mid-way leaves its temporary folder behind: the next build of that entry, under its lock,
removes it. :func:`provenance` reads what a built organism is for a provenance table, and
:func:`distinct_weights` refuses organisms that are one model.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import moir_lib
from moir_lib.cache import entry_dir, fingerprint, key_digest, sha256_file
from moir_lib.locks import exclusive, file_lock_path
from moir_lib.pocket.organisms import check, init_seed, reorder, same_weights
from moir_lib.pocket.variants import Variant, get_variant
from moir_lib.pocket.world import World

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = ["build", "load", "cache_key", "resolved", "verify", "provenance", "Provenance", "MANIFEST",
           "distinct_weights"]

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"


#: modules whose code decides what a build produces: their source is part of the cache key
RECIPE_MODULES = ("world", "corpora", "tokenizer", "train", "vocabulary", "bench_datasets")
#: modules that also decide what an organism K ≥ 1 is: their source is part of its key only
ORGANISM_MODULES = ("organisms",)


def recipe_digest(modules: tuple[str, ...] = RECIPE_MODULES) -> str:
    """SHA-256 over the syntax trees of ``modules``: a recipe change must not hit an old build, while
    comments and line wrapping do not change the key."""
    digest = hashlib.sha256()
    for name in modules:
        tree = ast.parse((Path(__file__).parent / f"{name}.py").read_text())
        digest.update(ast.dump(tree).encode())
    return digest.hexdigest()


def resolved(variant: Variant) -> Variant:
    """``variant`` with its training precision made concrete on this machine
    (:func:`moir_lib.pocket.train.resolve_precision`; ``$MOIR_POCKET_PRECISION`` forces "auto")."""
    from moir_lib.pocket.train import resolve_precision

    chosen = resolve_precision(variant.train.precision)
    return dataclasses.replace(variant, train=dataclasses.replace(variant.train, precision=chosen))


def cache_key(variant: Variant, organism: int = 0) -> dict[str, Any]:
    """Everything that decides a build of ``organism``, with the training precision resolved on this
    machine; organism 0's key holds no organism field (it is the recipe's own model)."""
    key: dict[str, Any] = {
        "variant": dataclasses.asdict(resolved(variant)),
        "recipe": recipe_digest(),
        "moir_lib": moir_lib.__version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    if check(organism):
        key.update(organism=organism, organism_recipe=recipe_digest(ORGANISM_MODULES))
    return key


def verify(entry: Path, key: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The manifest of ``entry`` if it is the build of ``key`` and every listed file exists with its
    recorded SHA-256, else ``None``.

    The manifest's key must be ``key`` (when given) and name the entry's folder (its
    :func:`~moir_lib.cache.fingerprint`): an entry copied or moved from another key's folder, its
    manifest and checksums intact, is another organism, recipe or precision, and is not trusted.
    """
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        files = manifest["files"]
        recorded = manifest["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not files:
        return None
    if fingerprint(recorded) != entry.name or (key is not None and key_digest(recorded) != key_digest(key)):
        log.warning("pocket cache entry %s holds another build (%s organism %s, recorded key %s): it is not "
                    "trusted and will be rebuilt", entry, manifest.get("variant"), manifest.get("organism"),
                    fingerprint(recorded))
        return None
    for rel, digest in files.items():
        path = entry / rel
        if not path.is_file() or sha256_file(path) != digest:
            log.warning("pocket cache entry %s: %s is missing or corrupted; it will be rebuilt", entry, rel)
            return None
    return manifest


def _train(variant: Variant, out: Path, organism: int) -> dict[str, Any]:
    """Build ``organism`` into ``out`` on the variant's fixed torch thread count; returns manifest fields."""
    import torch

    start = time.perf_counter()
    tspec = variant.train
    threads = torch.get_num_threads()
    torch.set_num_threads(tspec.threads)
    try:
        return _train_steps(variant, out, start, organism)
    finally:
        torch.set_num_threads(threads)


def _train_steps(variant: Variant, out: Path, start: float, organism: int) -> dict[str, Any]:
    import torch

    from moir_lib.pocket.bench_datasets import write_datasets
    from moir_lib.pocket.tokenizer import train_tokenizer
    from moir_lib.pocket.train import fit, labels_for, new_model, pretraining_windows, sft_windows

    tspec = variant.train
    torch.manual_seed(tspec.seed)
    world = World(variant.world)
    tokenizer = train_tokenizer(world, variant.model.vocab_size, tspec.tokenizer_docs_per_domain, tspec.seed)
    model = new_model(variant.model, tokenizer, init_seed(tspec.seed, organism))
    model.config.pocket_variant = variant.name  # lets evaluate() find the benchmark data
    if organism:  # organism 0's config.json stays the recipe's; a reader takes a missing field as 0
        model.config.pocket_organism = organism
    rows = pretraining_windows(tokenizer, world, tspec.pretrain_steps * tspec.batch_size, tspec, tspec.seed)
    rows, labels = reorder(rows, labels_for(rows, tokenizer), tspec.seed, organism, "pretrain")
    pretrain_s = fit(
        model,
        rows,
        labels,
        tspec.batch_size,
        tspec.pretrain_lr,
        tspec.warmup,
        f"pretrain {variant.name}",
        tspec.precision,
    )
    rows, labels = sft_windows(tokenizer, world, tspec.sft_steps * tspec.batch_size, tspec, tspec.seed + 7)
    rows, labels = reorder(rows, labels, tspec.seed, organism, "sft")
    sft_s = fit(
        model,
        rows,
        labels,
        tspec.batch_size,
        tspec.sft_lr,
        tspec.warmup,
        f"chat SFT {variant.name}",
        tspec.precision,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    records = world.counterfact(seed=tspec.seed)
    (out / "counterfact.json").write_text(json.dumps(records, indent=1))
    (out / "portability.json").write_text(json.dumps(world.portability(records), indent=1))
    write_datasets(world, records, variant.bench, out / "benchmarks")
    return {
        "variant": variant.name,
        "organism": organism,
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "n_facts": len(world.facts),
        "n_subjects": len(world.subjects),
        "pretrain_tokens": tspec.pretrain_steps * tspec.batch_size * tspec.seq_len,
        "timings": {"pretrain_s": pretrain_s, "sft_s": sft_s, "build_s": time.perf_counter() - start},
        "precision": tspec.precision,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }


def build(variant: str = "pocket", force: bool = False, organism: int = 0) -> Path:
    """The verified cache entry of organism ``organism`` of ``variant``, built (minutes) unless a valid one
    exists (seconds); the one entry point of every pocket build.

    The training precision is resolved on this machine (``$MOIR_POCKET_PRECISION`` forces it). Two
    processes asking for one entry (grid tasks, organisms built side by side): one builds it, the other
    waits and reuses it.
    """
    spec = resolved(get_variant(variant))
    key = cache_key(spec, check(organism))
    entry = entry_dir("pocket", key)
    name = f"{variant} organism {organism}"
    if not force and verify(entry, key) is not None:
        log.info("pocket %s: cache hit %s", name, entry)
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(file_lock_path(entry), f"the pocket {name} build", wait=True):
        if not force and verify(entry, key) is not None:  # built by the process this one waited for
            log.info("pocket %s: built meanwhile by another process, %s", name, entry)
            return entry
        _sweep(entry)
        return _build_entry(spec, key, entry, organism, name)


def _sweep(entry: Path) -> None:
    """Remove what killed builds of ``entry`` left beside it (their temporary and set-aside folders); only
    a holder of the entry's lock writes them, so with the lock held none of them is in use."""
    left = [*entry.parent.glob(f".{entry.name}.tmp-*"), *entry.parent.glob(f".{entry.name}.old-*")]
    for stale in sorted(left):
        log.info("pocket cache: removing %s, left by a build that did not finish", stale)
        shutil.rmtree(stale, ignore_errors=True)


def _build_entry(spec: Variant, key: dict[str, Any], entry: Path, organism: int, name: str) -> Path:
    """Train ``organism`` of ``spec`` into a temporary folder and swap it in for ``entry`` (its lock held)."""
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        log.info("pocket %s: building into %s (training precision %s)", name, entry, spec.train.precision)
        fields = _train(spec, tmp, organism)
        files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"key": key, **fields, "files": files}, indent=1))
        if entry.exists():  # a corrupted or forced entry: move it aside, then swap atomically
            trash = entry.parent / f".{entry.name}.old-{os.getpid()}"
            entry.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)
        tmp.rename(entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("pocket %s: built in %.0f s -> %s", name, fields["timings"]["build_s"], entry)
    return entry


def load(variant: str = "pocket", organism: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Organism ``organism`` of the pocket model (float32, eval mode) and its tokenizer; builds on first
    use."""
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    entry = build(variant, organism=organism)
    model = LlamaForCausalLM.from_pretrained(entry).eval()
    return model, PreTrainedTokenizerFast.from_pretrained(entry)


@dataclasses.dataclass(frozen=True)
class Provenance:
    """What one built organism is: a row of the provenance table."""

    variant: str
    organism: int
    weights_sha256: str  # of model.safetensors
    precision: str  # the training precision path ("float32" or "bf16"), a property of the machine
    build_s: float  # wall seconds of the whole build
    entry: Path


def provenance(variant: str = "pocket", organism: int = 0) -> Provenance | None:
    """The :class:`Provenance` of organism ``organism`` of ``variant`` as built on this machine (at its
    resolved training precision), read from the verified manifest; ``None`` when it is not built here.
    Never builds: :func:`build` does."""
    key = cache_key(get_variant(variant), check(organism))
    entry = entry_dir("pocket", key)
    manifest = verify(entry, key)
    if manifest is None:
        return None
    return Provenance(variant=variant, organism=organism,
                      weights_sha256=manifest["files"]["model.safetensors"], precision=manifest["precision"],
                      build_s=float(manifest["timings"]["build_s"]), entry=entry)


def distinct_weights(variant: str, organisms: Sequence[int], where: str) -> None:
    """Refuse (``ValueError``) two of ``organisms`` of ``variant`` built on this machine with the same weights
    (:func:`~moir_lib.pocket.organisms.same_weights`): pooled, they would count one model twice. Organisms
    not built here are not checked (and not built)."""
    built = {k: prov.weights_sha256 for k in organisms if (prov := provenance(variant, k)) is not None}
    same_weights({k: {sha} for k, sha in built.items()}, f"{where} (as built on this machine)", variant)
