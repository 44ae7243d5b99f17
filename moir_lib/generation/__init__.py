"""Self-generation (Section 4, Algorithm 1, appendix A.1 and C.2): the corpus behind C_Moir.

:func:`self_generate` samples ``n_samples`` continuations from the model itself, each seeded
with a *seed strategy*, and writes them to a sharded, append-only generation directory; optionally it
accumulates the keys of the edit layers *during* generation, so ``C_Moir`` (eq.
(memoir_estimator)) needs no second pass ("no inference cost beyond the generation itself").

One module per concept:

- :mod:`.seeds`: the seed strategies (``bos``, ``rand<k>``, ``prompt:<text>``) and each sample's seed tokens;
- :mod:`.decoding`: the sampler (inverse-CDF on per-index random streams) and the decode loops (dynamic,
  static);
- :mod:`.shards`: the generation directory: manifest, shard files, crash-safe appends, checksums of complete
  shards, reading the records back (:func:`verify_generation`: exactly what the manifest names);
- :mod:`.keystats`: the keys collected during generation, checkpointed per shard, merged by
  :func:`load_key_stats`;
- :mod:`.plan`: a request (:class:`GenerationSettings`) checked before any model work, and the configuration
  its manifest records;
- :mod:`.shard_writer`: :func:`self_generate`, one shard block by block, locked and resumable.
"""

from moir_lib.generation.decoding import LOOPS
from moir_lib.generation.keystats import load_key_stats
from moir_lib.generation.plan import GenerationSettings
from moir_lib.generation.seeds import (
    SeedStrategy,
    parse_seed_strategy,
    seed_candidates,
    seed_ids_for,
    special_token_ids,
)
from moir_lib.generation.shard_writer import GenerationResult, self_generate
from moir_lib.generation.shards import (
    DamagedShard,
    check_shard,
    read_manifest,
    read_samples,
    shard_indices,
    validate_shard,
    verify_generation,
    vocabulary_fingerprint,
)

__all__ = [
    "LOOPS",
    "DamagedShard",
    "GenerationResult",
    "GenerationSettings",
    "SeedStrategy",
    "parse_seed_strategy",
    "seed_candidates",
    "special_token_ids",
    "seed_ids_for",
    "self_generate",
    "validate_shard",
    "read_samples",
    "read_manifest",
    "verify_generation",
    "check_shard",
    "load_key_stats",
    "shard_indices",
    "vocabulary_fingerprint",
]
