"""The named covariances: one recipe per name, for the Lab (chapters 01/04/05, ``moir edit``) and chapter 03.

A name + the loaded model + :class:`Settings` (read from a profile by :meth:`Settings.from_profile`)
give ``(CovarianceStats, provenance)`` (:func:`build`):

* ``wiki`` — C_Wiki: ``n_documents`` documents of ``wiki_corpus`` (the profile's
  ``covariance.wiki_corpus`` / ``wiki_samples``), sampled with ``seed``, its default split;
* ``wiki-subset`` — the encyclopedic component of the pretraining mixture (the paper's "Dolma 1.7,
  Wiki subset only"): :func:`component` of ``wiki_subset`` (pocket: ``pocket:wiki``);
* ``oracle`` — C_Oracle ``Σ_d w_d C_d`` (appendix A.2, :func:`~moir_lib.covariance.mixing.mix`) of
  the :func:`component` of every corpus of ``oracle`` (pocket: the pocket pretraining mixture);
* ``moir`` / ``moir-<strategy>`` — C_Moir (Algorithm 1): ``n_samples`` (``strategy_samples`` for
  ``moir-<strategy>``) self-generated sequences of ``max_new_tokens`` with the profile's seed
  strategy (or ``<strategy>``: ``moir-bos``, ``moir-rand2``, …), keys collected during generation,
  run in the self-generation cache ``selfgen/<fingerprint of {model, strategy, n, max_new_tokens,
  seed, layers}>`` (:func:`selfgen_dir`); :func:`from_run` reads such a run from any directory;
* anything else — a saved :class:`~moir_lib.covariance.stats.CovarianceStats` file (:func:`from_file`).

A **component** (:func:`component`) is an independent draw from C_Wiki's: ``seed + 1``, and a pocket
domain's ``train`` split (the data the model was trained on, as the oracle of appendix A.2 uses the
pretraining corpus itself). Corpora are estimated with ``count_bos=False`` by default (the BOS key is
one fixed vector per document, a spike that would weigh with the number of documents rather than
with the text; Moir's keys exclude the seed as Algorithm 1 does); ``count_bos=True`` is the MEMIT
reference's ``layer_stats`` convention (every attended token, BOS included), an explicit option
recorded in the provenance. Every corpus ``C`` is cached by
:func:`~moir_lib.covariance.estimation.estimate`, every self-generation by
:func:`moir_lib.generation.self_generate`. The provenance's ``fingerprint`` identifies the recipe's
inputs: ``estimate``'s cache fingerprint for a corpus, a fingerprint of the generation's manifest for
Moir, of the components and weights for the oracle, of the file's contents for a file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moir_lib.cache import entry_dir, fingerprint
from moir_lib.corpora import load_corpus
from moir_lib.covariance.estimation import estimate
from moir_lib.covariance.mixing import mix
from moir_lib.covariance.stats import CovarianceStats, read_metadata
from moir_lib.generation import load_key_stats, parse_seed_strategy, read_manifest, self_generate
from moir_lib.models import POCKET_SPECS, model_fingerprint

__all__ = ["NAMES", "Settings", "build", "component", "corpus", "file_provenance", "from_file", "from_run",
           "selfgen_dir"]

#: the named C's (besides ``moir-<strategy>``, any seed strategy, and saved files).
NAMES = ("wiki", "wiki-subset", "oracle", "moir")


@dataclass(frozen=True)
class Settings:
    """What a recipe reads besides the model.

    ``layers``: the edit layers; ``tokens_per_batch``: of :func:`~moir_lib.covariance.estimation.estimate`;
    ``wiki_corpus``, ``n_documents``: C_Wiki's corpus spec and the documents per corpus (C_Wiki and every
    component); ``seed``: corpus sampling and generation seed; ``count_bos``: whether BOS keys count in
    corpus C's; ``oracle``: corpus spec -> pretraining weight; ``wiki_subset``: a corpus spec;
    ``seed_strategy``, ``n_samples``, ``strategy_samples``, ``max_new_tokens``, ``batch_size``: the
    self-generation of ``moir`` (``strategy_samples``: of ``moir-<strategy>``).
    """

    layers: tuple[int, ...]
    tokens_per_batch: int
    wiki_corpus: str | None = None
    n_documents: int | None = None
    seed: int = 0
    count_bos: bool = False
    oracle: Mapping[str, float] | None = None
    wiki_subset: str | None = None
    seed_strategy: str | None = None
    n_samples: int | None = None
    strategy_samples: int | None = None
    max_new_tokens: int | None = None
    batch_size: int | None = None
    progress: bool = False

    @classmethod
    def from_profile(cls, profile: Any, **options: Any) -> Settings:
        """The profile's settings (pocket profiles: the pocket mixture as ``oracle``, ``pocket:wiki`` as
        ``wiki_subset``); ``options`` override fields (``None`` keeps the profile's)."""
        cfg, gen = profile.covariance, profile.generation
        pocket = POCKET_SPECS.get(profile.model) is not None
        oracle = None
        if pocket:
            from moir_lib.pocket.corpora import MIXTURE

            oracle = {f"pocket:{d}": w for d, w in MIXTURE.items()}
        fields = {"layers": tuple(profile.edit_layers), "tokens_per_batch": cfg.tokens_per_batch,
                  "wiki_corpus": cfg.wiki_corpus, "n_documents": cfg.wiki_samples, "oracle": oracle,
                  "wiki_subset": "pocket:wiki" if pocket else None, "seed_strategy": gen.seed_strategy,
                  "n_samples": gen.n_samples, "max_new_tokens": gen.max_new_tokens,
                  "batch_size": gen.batch_size}
        fields.update({k: v for k, v in options.items() if v is not None})
        fields.setdefault("strategy_samples", fields["n_samples"])
        return cls(**fields)


def build(name: str | os.PathLike[str], loaded: Any, settings: Settings, *,
          components: Mapping[str, CovarianceStats] | None = None) -> tuple[CovarianceStats, dict[str, Any]]:
    """``(C, provenance)`` of the C ``name`` (module doc) on ``loaded``'s model.

    ``components``: corpus spec -> C already built by :func:`component` (e.g. a Lab's domain C's),
    used instead of building them again.
    """
    name = str(name)
    if name == "wiki":
        if not settings.wiki_corpus or not settings.n_documents:
            raise ValueError("C wiki needs wiki_corpus and n_documents (the profile's covariance section)")
        stats = corpus(settings.wiki_corpus, loaded, settings, seed=settings.seed)
        return stats, _corpus_provenance("wiki", settings.wiki_corpus, settings, settings.seed, None, stats)
    if name == "wiki-subset":
        if not settings.wiki_subset:
            raise ValueError("C wiki-subset needs wiki_subset=<corpus spec> for a non-pocket profile")
        stats = _component(settings.wiki_subset, loaded, settings, components)
        return stats, _corpus_provenance("wiki-subset", settings.wiki_subset, settings, settings.seed + 1,
                                         _component_split(settings.wiki_subset), stats)
    if name == "oracle":
        return _oracle(loaded, settings, components)
    if name == "moir" or name.startswith("moir-"):
        return _moir(name, loaded, settings)
    return from_file(name, settings)


def corpus(spec: str, loaded: Any, settings: Settings, *, seed: int, split: str | None = None,
           n: int | None = None) -> CovarianceStats:
    """C of ``n`` (default ``n_documents``) documents of ``spec`` sampled with ``seed`` (cached)."""
    docs = load_corpus(spec, n=n or settings.n_documents, seed=seed, split=split)
    return estimate(loaded, docs, list(settings.layers), tokens_per_batch=settings.tokens_per_batch,
                    count_bos=settings.count_bos, progress=settings.progress)


def component(spec: str, loaded: Any, settings: Settings) -> CovarianceStats:
    """C of one component of the pretraining mixture: an independent draw from C_Wiki's (``seed + 1``;
    a pocket domain's ``train`` split)."""
    return corpus(spec, loaded, settings, seed=settings.seed + 1, split=_component_split(spec))


def _component_split(spec: str) -> str | None:
    return "train" if spec.startswith("pocket:") and "split=" not in spec else None


def _component(spec: str, loaded: Any, settings: Settings,
               components: Mapping[str, CovarianceStats] | None) -> CovarianceStats:
    if components is not None and spec in components:
        return components[spec]
    return component(spec, loaded, settings)


def _corpus_provenance(name: str, spec: str, settings: Settings, seed: int, split: str | None,
                       stats: CovarianceStats) -> dict[str, Any]:
    return {"cov": name, "source": spec, "n_documents": settings.n_documents, "seed": seed, "split": split,
            "count_bos": settings.count_bos, "tokens_per_batch": settings.tokens_per_batch,
            "n_tokens": stats.n_tokens, "fingerprint": stats.metadata.get("fingerprint")}


def _oracle(loaded: Any, settings: Settings, components: Mapping[str, CovarianceStats] | None
            ) -> tuple[CovarianceStats, dict[str, Any]]:
    if not settings.oracle:
        raise ValueError("C oracle needs oracle={corpus spec: weight} for a non-pocket profile (the paper: "
                         "OLMo-Mix-1124's components and proportions, appendix A.2)")
    parts = [(_component(spec, loaded, settings, components), weight)
             for spec, weight in settings.oracle.items()]
    stats = mix(parts)
    record = [[spec, stats_.metadata.get("fingerprint"), weight]
              for (spec, weight), (stats_, _) in zip(settings.oracle.items(), parts, strict=True)]
    return stats, {"cov": "oracle", "source": "mix", "mixture": dict(settings.oracle),
                   "seed": settings.seed + 1,
                   "n_documents": settings.n_documents, "count_bos": settings.count_bos,
                   "tokens_per_batch": settings.tokens_per_batch, "n_tokens": stats.n_tokens,
                   "fingerprint": fingerprint({"kind": "mixture", "components": record})}


def _moir(name: str, loaded: Any, settings: Settings) -> tuple[CovarianceStats, dict[str, Any]]:
    if name == "moir":
        strategy, n = settings.seed_strategy, settings.n_samples
    else:
        strategy, n = name.removeprefix("moir-"), settings.strategy_samples
        parse_seed_strategy(strategy)  # ValueError for a bad one
    if not strategy or not n or not settings.max_new_tokens or not settings.batch_size:
        raise ValueError(f"C {name} needs the self-generation settings (seed strategy, samples, "
                         f"max_new_tokens, batch_size: the profile's generation section)")
    run_dir = selfgen_dir(loaded.model, strategy, n, settings.max_new_tokens, settings.seed, settings.layers)
    self_generate(loaded.model, loaded.tokenizer, strategy, n, settings.max_new_tokens, settings.batch_size,
                  run_dir, seed=settings.seed, collect_layers=list(settings.layers),
                  progress=settings.progress, wait=True)  # a shared cache entry: wait for its builder
    stats, provenance = from_run(run_dir, loaded, settings)
    return stats, {**provenance, "cov": name}


def selfgen_dir(model: Any, strategy: str, n: int, max_new_tokens: int, seed: int, layers: Any) -> Path:
    """The self-generation cache entry of these settings (shared by ``moir edit``, the Lab and chapter 03)."""
    key = {"model": model_fingerprint(model), "strategy": strategy, "n": n, "max_new_tokens": max_new_tokens,
           "seed": seed, "layers": list(layers)}
    return entry_dir("selfgen", key)


def from_run(run_dir: str | os.PathLike[str], loaded: Any, settings: Settings
             ) -> tuple[CovarianceStats, dict[str, Any]]:
    """C of a self-generation run: the keys collected during generation (Algorithm 1, no second pass)
    when the run collected ``settings.layers``, else one pass over its samples (``count_bos`` as set)."""
    manifest = read_manifest(run_dir)
    collected = set(settings.layers) <= set(manifest.get("collect_layers") or [])
    if collected:
        stats = load_key_stats(run_dir)
    else:
        stats = estimate(loaded, load_corpus(str(run_dir)), list(settings.layers),
                         tokens_per_batch=settings.tokens_per_batch, count_bos=settings.count_bos,
                         progress=settings.progress)
    record = {"kind": "selfgen", "model": manifest.get("model_fingerprint"),
              "strategy": manifest["seed_strategy"], "n": manifest["n_samples"],
              "max_new_tokens": manifest["max_new_tokens"], "seed": manifest["seed"],
              "layers": sorted(settings.layers),
              "keys": "collected" if collected else stats.metadata.get("fingerprint")}
    return stats, {"cov": "moir", "source": f"self-generation {manifest['seed_strategy']}",
                   "seed_strategy": manifest["seed_strategy"], "n_samples": manifest["n_samples"],
                   "max_new_tokens": manifest["max_new_tokens"], "seed": manifest["seed"],
                   "keys": "collected during generation" if collected else "one pass over the samples",
                   "run_dir": str(run_dir), "n_tokens": stats.n_tokens, "fingerprint": fingerprint(record)}


def from_file(path: str | os.PathLike[str], settings: Settings) -> tuple[CovarianceStats, dict[str, Any]]:
    """A saved :class:`~moir_lib.covariance.stats.CovarianceStats` holding every edit layer."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"unknown C {str(path)!r}: choose wiki, wiki-subset, oracle, moir, "
                         f"moir-<seed strategy> (e.g. moir-bos, moir-rand2) or a saved statistics file")
    stats = CovarianceStats.load(path)
    absent = [x for x in settings.layers if x not in stats.layers]
    if absent:
        raise ValueError(f"C file {path} has layers {list(stats.layers)}, but the edit layers are "
                         f"{list(settings.layers)} (missing {absent})")
    return stats, file_provenance(path, stats)


def file_provenance(path: str | os.PathLike[str], stats: CovarianceStats) -> dict[str, Any]:
    """The provenance of statistics read from ``path`` (its header's SHA-256 as the fingerprint)."""
    return {"cov": "file", "source": str(path), "path": str(path), "n_tokens": stats.n_tokens,
            "fingerprint": read_metadata(path, _header=True).get("sha256")}

