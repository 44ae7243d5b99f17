"""Keys collected during generation (Algorithm 1's ``φ_ℓ(x_t)`` summed into eq. (memoir_estimator)):
the per-shard checkpoints and their merge.

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

**Prefixes.** Asked for points ``m`` (global sample counts), a shard also saves the keys of its samples of
index below ``m`` (:mod:`moir_lib.covariance.prefixes`) as ``prefixes/keys-XXXXX-of-YYYYY.prefix-<m>
.safetensors``, before the checkpoint that passes them; the shards' prefixes at ``m`` merge into the keys
of the generation's first ``m`` samples (:func:`load_key_stats` with ``prefix``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from moir_lib.generation.shards import (
    generation_fingerprint,
    generation_samples,
    read_manifest,
    shard_indices,
)

#: the folder of a generation holding its shards' prefix statistics
PREFIXES = "prefixes"


class GenerationPrefixes(Mapping[int, Any]):
    """The prefix statistics of a generation by sample count ``m``: every shard's at ``m``, merged when read
    (:func:`load_key_stats` with ``prefix``); the points every shard has taken."""

    def __init__(self, gen_dir: str | os.PathLike[str]) -> None:
        self.gen_dir = Path(gen_dir)
        manifest = read_manifest(self.gen_dir)
        n = int(manifest["n_shards"])
        stores = [prefix_store(self.gen_dir, (i, n), manifest) for i in range(n)]
        self._points = sorted(set.intersection(*(set(s) for s in stores)))

    def __getitem__(self, m: int) -> Any:
        if m not in self._points:
            raise KeyError(m)
        return load_key_stats(self.gen_dir, prefix=m)

    def __contains__(self, m: object) -> bool:
        return m in self._points

    def __iter__(self) -> Iterator[int]:
        return iter(self._points)

    def __len__(self) -> int:
        return len(self._points)


def _stats_path(out_dir: Path, shard: tuple[int, int]) -> Path:
    return out_dir / f"keys-{shard[0]:05d}-of-{shard[1]:05d}.safetensors"


def prefix_store(out_dir: str | os.PathLike[str], shard: tuple[int, int], manifest: dict[str, Any]) -> Any:
    """The prefix statistics of one shard of a generation
    (a :class:`~moir_lib.covariance.prefixes.PrefixStore`)."""
    from moir_lib.covariance.prefixes import PrefixStore

    name = f"keys-{shard[0]:05d}-of-{shard[1]:05d}.prefix-{{m}}.safetensors"
    return PrefixStore(Path(out_dir) / PREFIXES, generation_fingerprint(manifest), name)


def _new_stats(adapter: Any, layers: list[int], config: dict[str, Any], shard: tuple[int, int]) -> Any:
    from moir_lib.covariance.hooks import base_metadata
    from moir_lib.covariance.stats import CovarianceStats

    meta = base_metadata(adapter, model_fp=config["model_fingerprint"])
    meta["tokenization"] = "self-generated token ids"
    meta["corpus"] = [{"name": f"selfgen:{config['seed_strategy']}", "seed": config["seed"],
                       "n_samples": config["n_samples"], "max_new_tokens": config["max_new_tokens"],
                       "shard": list(shard), "key_positions": config["key_positions"]}]
    return CovarianceStats(layers, adapter.key_dim, meta)


def _save_shard_stats(path: Path, stats: Any, shard_bytes: int, n_done: int) -> None:
    """Checkpoint: ``stats`` covering the first ``shard_bytes`` bytes (``n_done`` samples) of the shard."""
    stats.save(path, extra_metadata={"generation": {"shard_bytes": shard_bytes, "n_records": n_done}})


def _load_shard_stats(path: Path) -> tuple[Any, int, int]:
    """(stats, shard bytes covered, records covered) of a keys checkpoint."""
    from moir_lib.covariance.stats import CovarianceStats

    stats = CovarianceStats.load(path)
    meta = stats.metadata.pop("generation", {})  # the checkpoint's bookkeeping, not the keys' identity
    return stats, int(meta.get("shard_bytes", 0)), int(meta.get("n_records", 0))


def load_key_stats(gen_dir: str | os.PathLike[str], require_complete: bool = True,
                   prefix: int | None = None) -> Any:
    """The key statistics collected during a generation, all shards merged (a ``CovarianceStats``):
    of the samples the generation holds (:func:`~moir_lib.generation.shards.generation_samples`), or with
    ``prefix`` of its first ``prefix`` samples (every shard must have taken that prefix).

    ``require_complete``: raise unless every shard's stats cover all its samples.
    """
    gen_dir = Path(gen_dir)
    manifest = read_manifest(gen_dir)
    if not manifest.get("collect_layers"):
        raise ValueError(f"{gen_dir} was generated without collect_layers: no key statistics to load")
    n_shards, n_samples = int(manifest["n_shards"]), generation_samples(manifest)
    if prefix is not None:
        parts = []
        for i in range(n_shards):
            store = prefix_store(gen_dir, (i, n_shards), manifest)
            if prefix not in store:
                raise FileNotFoundError(f"{gen_dir}: shard {i} of {n_shards} has no prefix at {prefix} "
                                        f"samples (generate it with prefixes={prefix}, which takes it)")
            parts.append(store[prefix])
        return parts[0].merge_all(parts)
    merged = None
    for i in range(n_shards):
        path = _stats_path(gen_dir, (i, n_shards))
        expected = len(shard_indices(n_samples, (i, n_shards)))
        if not path.exists():
            if require_complete and expected:
                raise FileNotFoundError(f"{path.name} is missing: shard {i} of {n_shards} has not run")
            continue
        stats, _, n_done = _load_shard_stats(path)
        if require_complete and n_done != expected:
            raise ValueError(f"shard {i} of {n_shards} covers {n_done} of {expected} samples: "
                             f"resume it first")
        merged = stats if merged is None else merged.merge(stats)
    if merged is None:
        raise FileNotFoundError(f"{gen_dir} has no key statistics yet")
    merged.prefixes = GenerationPrefixes(gen_dir)
    return merged
