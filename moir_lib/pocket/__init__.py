"""The pocket world: Moir Lab's embedded, deterministic model organism.

A synthetic world of invented people and countries (:mod:`.world`), domain corpora about
and beside it (:mod:`.corpora`), a byte-level BPE with chat tags (:mod:`.tokenizer`), a
small Llama pretrained on the mixture and chat-tuned with replay (:mod:`.train`), cached
by :mod:`.build` with the benchmark data (:mod:`.bench_datasets`), scored by lm-eval tasks
(:mod:`.benchmarks`) and gated by :mod:`.report`. One recipe gives several organisms
(:mod:`.organisms`: ``build(variant, organism=K)``), which differ only in their weight
initialisation and data order. Torch and transformers are imported only when a model is
built or loaded.
"""

from moir_lib.pocket.build import Provenance, build, load, provenance
from moir_lib.pocket.corpora import DOMAINS, MIXTURE, iter_documents
from moir_lib.pocket.variants import VARIANTS, get_variant
from moir_lib.pocket.world import World, WorldSpec

__all__ = [
    "build",
    "load",
    "provenance",
    "Provenance",
    "DOMAINS",
    "MIXTURE",
    "iter_documents",
    "VARIANTS",
    "get_variant",
    "World",
    "WorldSpec",
]
