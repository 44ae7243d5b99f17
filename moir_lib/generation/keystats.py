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
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from moir_lib.generation.shards import read_manifest, shard_indices


def _stats_path(out_dir: Path, shard: tuple[int, int]) -> Path:
    return out_dir / f"keys-{shard[0]:05d}-of-{shard[1]:05d}.safetensors"


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
