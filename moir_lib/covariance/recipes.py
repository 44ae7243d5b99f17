"""The named covariances: one recipe per name, for the Lab (chapters 01/05, ``moir edit``) and chapter 03.

A name + the loaded model + its profile + :class:`CovSettings` give ``(CovarianceStats, provenance)``
(:func:`build`), and :func:`identity` gives what determines that C (part of every result key):

* ``wiki`` — C_Wiki: ``n_documents`` documents of the profile's ``covariance.wiki_corpus``
  (default ``covariance.wiki_samples``), sampled with the seed, its default split;
* ``wiki-subset`` — the encyclopedic component of the pretraining mixture (the paper's "Dolma 1.7,
  Wiki subset only"): :func:`component` of ``wiki_subset`` (pocket: ``pocket:wiki``);
* ``oracle`` — C_Oracle ``Σ_d w_d C_d`` (appendix A.2, :func:`~moir_lib.covariance.mixing.mix`) of
  the :func:`component` of every corpus of ``oracle`` (pocket: the pocket pretraining mixture);
* ``moir`` / ``moir-<strategy>`` — C_Moir (Algorithm 1): ``n_samples`` (``strategy_samples`` for
  ``moir-<strategy>``) self-generated sequences of the profile's ``generation.max_new_tokens`` with its
  seed strategy (or ``<strategy>``: ``moir-bos``, ``moir-rand2``, …), keys collected during generation,
  stored in the self-generation cache ``selfgen/<fingerprint of {model, strategy, n, max_new_tokens, seed,
  layers}>`` (:func:`selfgen_dir`); :func:`from_generation` reads such a generation from any directory;
* a name of ``files`` or a path — a saved :class:`~moir_lib.covariance.stats.CovarianceStats` file
  (:func:`from_file`).

**Prefixes.** ``<name>[<p>/<q>]`` (before a draw: ``moir[1/4]@1``) is the C of the first ``p/q`` of
``wiki``'s documents or of ``moir``'s samples (of ``n_documents`` / ``n_samples``), taken in the pass
that builds the whole (:mod:`moir_lib.covariance.prefixes`): every ``wiki`` and ``moir`` build takes the
settings' ``prefixes``, so the C's of one lab share one pass; the whole C does not depend on them.

**Stopping.** With ``until_converged``, C_Moir's generation stops once its keys' split-half gap is at
most that target (:mod:`moir_lib.generation.stopping`, checked from two batches on, doubling;
``n_samples`` the budget): the rule is part of the C's identity and of its self-generation cache entry.

**Draws.** ``<name>@<k>`` is draw ``k`` of the same recipe (``moir@1``, ``wiki@2``): another corpus
sample, another generation seed (:func:`draw_seed`); ``<name>`` is draw 0. A C is a random draw: claims
about C's rest on several draws of each (:mod:`moir_lib.evaluation.uncertainty`).

A **component** (:func:`component`) is an independent draw from C_Wiki's: seed + 1, and a pocket
domain's ``train`` split (the data the model was trained on, as the oracle of appendix A.2 uses the
pretraining corpus itself). Corpora are estimated with ``count_bos=False`` by default (the BOS key is
one fixed vector per document, a spike that would weigh with the number of documents rather than
with the text; Moir's keys exclude the seed as Algorithm 1 does); ``count_bos=True`` is the MEMIT
reference's ``layer_stats`` convention (every attended token, BOS included), an explicit option
recorded in the provenance. The C's are estimated at the profile's edit layers with its
``covariance.tokens_per_batch``. Every corpus ``C`` is cached by
:func:`~moir_lib.covariance.estimation.estimate`, every self-generation by
:func:`moir_lib.generation.self_generate`. The provenance's ``fingerprint`` identifies the recipe's
inputs: ``estimate``'s cache fingerprint for a corpus, a fingerprint of the generation's manifest for
Moir, of the components and weights for the oracle, of the file's contents for a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moir_lib.cache import entry_dir, fingerprint
from moir_lib.covariance.estimation import EstimationSettings, estimate
from moir_lib.covariance.mixing import mix
from moir_lib.covariance.prefixes import format_fraction, prefix_counts
from moir_lib.covariance.stats import CovarianceStats, read_metadata
from moir_lib.documents import load_corpus
from moir_lib.generation import (
    GenerationSettings,
    load_key_stats,
    parse_seed_strategy,
    read_manifest,
    self_generate,
)
from moir_lib.generation.shards import generation_samples
from moir_lib.models import POCKET_SPECS, model_fingerprint

__all__ = ["NAMES", "CovSettings", "Site", "build", "component", "corpus", "domain_covariances", "draw_seed",
           "file_provenance", "from_file", "from_generation", "identity", "parse_name", "prefix_name",
           "selfgen_dir", "site", "split_prefix", "stop_rule"]

#: the named C's (besides ``moir-<strategy>``, any seed strategy, and saved files).
NAMES = ("wiki", "wiki-subset", "oracle", "moir")
#: the seeds of two draws of one recipe lie this far apart (the components use seed + 1)
DRAW_STRIDE = 1000


@dataclass(frozen=True)
class CovSettings:
    """How the named C's are built: the profile's values where a field is ``None`` (:meth:`resolved`).

    ``n_samples``: self-generated sequences of C_Moir (profile: ``generation.n_samples``);
    ``strategy_samples``: of the ``moir-<strategy>`` variants (the seed ablation; default ``n_samples``);
    ``n_documents``: documents of C_Wiki and of every component (profile: ``covariance.wiki_samples``);
    ``seed``: corpus sampling and generation seed of draw 0; ``count_bos``: whether BOS keys count in
    corpus C's; ``oracle``: corpus spec -> pretraining weight (pocket: the pocket mixture);
    ``wiki_subset``: a corpus spec (pocket: the pocket encyclopedic domain); ``files``: C name -> saved
    :class:`~moir_lib.covariance.stats.CovarianceStats` (e.g. estimated on a cluster); ``prefixes``:
    fractions (``"1/4"``) of ``wiki``'s documents and ``moir``'s samples whose C's every build takes in
    its pass (module doc); ``until_converged``: C_Moir's stop rule's target gap (``None``: generate
    ``n_samples``).
    """

    n_samples: int | None = None
    strategy_samples: int | None = None
    n_documents: int | None = None
    seed: int = 0
    count_bos: bool = False
    oracle: Mapping[str, float] | None = None
    wiki_subset: str | None = None
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    prefixes: tuple[str, ...] = ()
    until_converged: float | None = None

    def __post_init__(self) -> None:
        for name in ("n_samples", "strategy_samples", "n_documents"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {v!r}")
        object.__setattr__(self, "prefixes", tuple(dict.fromkeys(format_fraction(f) for f in self.prefixes)))
        if self.until_converged is not None and not self.until_converged > 0:
            raise ValueError(f"until_converged is a positive split-half gap (e.g. 0.01) or None, got "
                             f"{self.until_converged!r}")

    def resolved(self, profile: Any) -> CovSettings:
        """These settings with every ``None`` filled from ``profile`` (pocket profiles: the pocket mixture
        as ``oracle`` and ``pocket:wiki`` as ``wiki_subset``, both of the profile's variant's world,
        :func:`~moir_lib.documents.pocket_corpus`): the one place the defaults are decided."""
        from moir_lib.documents import pocket_corpus

        variant = POCKET_SPECS.get(profile.model)
        pocket = variant is not None
        oracle = self.oracle
        if oracle is None and pocket:
            from moir_lib.pocket.corpora import MIXTURE

            oracle = {pocket_corpus(d, variant): w for d, w in MIXTURE.items()}
        n_samples = self.n_samples or profile.generation.n_samples
        return dataclasses.replace(self, n_samples=n_samples,
                                   strategy_samples=self.strategy_samples or n_samples,
                                   n_documents=self.n_documents or profile.covariance.wiki_samples,
                                   oracle=dict(oracle) if oracle else None,
                                   wiki_subset=self.wiki_subset or (pocket_corpus("wiki", variant) if pocket
                                                                    else None),
                                   files={k: str(v) for k, v in self.files.items()})

    def defines(self, name: str) -> bool:
        """Whether these (resolved) settings can build ``name`` (``oracle`` and ``wiki-subset`` need their
        corpora)."""
        base, _ = parse_name(name)
        return name in self.files or not ((base == "oracle" and not self.oracle)
                                          or (base == "wiki-subset" and not self.wiki_subset))


def parse_name(name: str) -> tuple[str, int]:
    """``("moir", 1)`` for ``"moir@1"``, ``(name, 0)`` without a draw (``ValueError`` for a bad draw)."""
    base, sep, k = str(name).rpartition("@")
    if not sep:
        return str(name), 0
    if not k.isdigit():
        raise ValueError(f"C {name!r}: a draw is <name>@<k> with k a non-negative integer (e.g. moir@1)")
    return base, int(k)


def split_prefix(base: str) -> tuple[str, str | None]:
    """``("moir", "1/4")`` for ``"moir[1/4]"`` (a name without its draw), ``(base, None)`` without a prefix
    (``ValueError`` for a bad fraction)."""
    if not (base.endswith("]") and "[" in base):
        return base, None
    head, _, fraction = base[:-1].rpartition("[")
    return head, format_fraction(fraction)


def prefix_name(name: str, fraction: str | float) -> str:
    """The name of the prefix ``fraction`` of the C ``name``: ``moir@1``, ``1/4`` → ``moir[1/4]@1``."""
    base, draw = parse_name(name)
    return f"{base}[{format_fraction(fraction)}]" + (f"@{draw}" if draw else "")


def _whole(recipe: str, draw: int) -> str:
    return recipe + (f"@{draw}" if draw else "")


def _prefixed(recipe: str) -> bool:
    return recipe == "wiki" or recipe == "moir" or recipe.startswith("moir-")


def draw_seed(seed: int, draw: int) -> int:
    """The seed of draw ``draw`` of a recipe seeded ``seed`` (draw 0: ``seed`` itself)."""
    return seed + DRAW_STRIDE * draw


def identity(name: str, profile: Any, settings: CovSettings) -> dict[str, Any]:
    """What determines the C ``name`` besides the model (part of every result key): its corpus, sample
    counts, seed and layers, or the file's content."""
    settings = settings.resolved(profile)
    layers = list(profile.edit_layers)
    if name in settings.files:
        return {"file": _file_digest(settings.files[name])}
    base, draw = parse_name(name)
    recipe, fraction = split_prefix(base)
    if fraction is not None:
        if not _prefixed(recipe):
            raise ValueError(f"C {name!r}: prefixes are taken of wiki and moir C's (one pass of a corpus or "
                             f"a generation), not of {recipe}")
        return {**identity(_whole(recipe, draw), profile, settings), "prefix": fraction}
    seed = draw_seed(settings.seed, draw)
    corpus_base = {"count_bos": settings.count_bos, "seed": seed, "layers": layers,
                   "n": settings.n_documents}
    if base == "wiki":
        return {**corpus_base, "corpus": profile.covariance.wiki_corpus}
    if base == "wiki-subset":
        return {**corpus_base, "corpus": settings.wiki_subset, "draw": "domain"}
    if base == "oracle":
        return {**corpus_base, "mixture": settings.oracle, "draw": "domain"}
    if base == "moir" or base.startswith("moir-"):
        gen = profile.generation
        out = {"strategy": _strategy(base, profile), "n": _samples(base, settings),
               "max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature, "top_p": gen.top_p,
               "seed": seed, "layers": layers}
        rule = stop_rule(profile, settings)
        return {**out, "stop": rule.to_config()} if rule is not None else out
    if Path(name).is_file():
        return {"file": _file_digest(name)}
    raise ValueError(f"unknown C {name!r}: choose wiki, wiki-subset, oracle, moir, moir-<seed strategy> "
                     f"(e.g. moir-bos, moir-rand2), a draw of one (e.g. moir@1), a saved statistics file or "
                     f"a name given in the settings' files")


def build(name: str | os.PathLike[str], loaded: Any, profile: Any, settings: CovSettings, *,
          components: Mapping[str, CovarianceStats] | None = None, progress: bool = False
          ) -> tuple[CovarianceStats, dict[str, Any]]:
    """``(C, provenance)`` of the C ``name`` (module doc) on ``loaded``'s model.

    ``components``: corpus spec -> C already built by :func:`component` for draw 0 (e.g. a Lab's domain
    C's), used instead of building them again.
    """
    name = str(name)
    settings = settings.resolved(profile)
    if name in settings.files:
        return from_file(settings.files[name], profile)
    base, draw = parse_name(name)
    recipe, fraction = split_prefix(base)
    if fraction is not None:
        return _prefix(name, recipe, draw, fraction, loaded, profile, settings, progress)
    seed = draw_seed(settings.seed, draw)
    where = Site(loaded, profile, settings, progress)
    if base == "wiki":
        if not profile.covariance.wiki_corpus or not settings.n_documents:
            raise ValueError("C wiki needs wiki_corpus and n_documents (the profile's covariance section)")
        stats = corpus(profile.covariance.wiki_corpus, where, seed=seed,
                       prefixes=prefix_counts(settings.n_documents, settings.prefixes).values())
        return stats, _corpus_provenance(name, profile.covariance.wiki_corpus, where, seed, None, stats)
    if draw:
        components = None  # the shared components are draw 0's
    if base == "wiki-subset":
        if not settings.wiki_subset:
            raise ValueError("C wiki-subset needs wiki_subset=<corpus spec> for a non-pocket profile")
        stats = _component(settings.wiki_subset, where, seed, components)
        return stats, _corpus_provenance(name, settings.wiki_subset, where, seed + 1,
                                         _component_split(settings.wiki_subset), stats)
    if base == "oracle":
        return _oracle(name, where, seed, components)
    if base == "moir" or base.startswith("moir-"):
        return _moir(name, base, where, seed)
    return from_file(name, profile)


@dataclass(frozen=True)
class Site:
    """Where and how a recipe estimates: the model, its profile (edit layers, ``tokens_per_batch``, the
    generation settings), the resolved settings, progress bars."""

    loaded: Any
    profile: Any
    settings: CovSettings
    progress: bool


def corpus(spec: str, where: Site, *, seed: int, split: str | None = None, n: int | None = None,
           prefixes: Any = ()) -> CovarianceStats:
    """C of ``n`` (default ``n_documents``) documents of ``spec`` sampled with ``seed`` (cached), with the
    prefixes at the document counts ``prefixes``."""
    docs = load_corpus(spec, n=n or where.settings.n_documents, seed=seed, split=split)
    return estimate(where.loaded, docs, list(where.profile.edit_layers), _estimation(where),
                    progress=where.progress, prefixes=list(prefixes))


def _estimation(where: Site) -> EstimationSettings:
    """How ``where`` estimates a corpus C: the profile's ``tokens_per_batch``, the settings' ``count_bos``."""
    return EstimationSettings(tokens_per_batch=where.profile.covariance.tokens_per_batch,
                              count_bos=where.settings.count_bos)


def site(loaded: Any, profile: Any, settings: CovSettings, progress: bool = False) -> Site:
    """Where ``profile``'s C's are estimated, ``settings`` resolved (:func:`corpus`, :func:`component`)."""
    return Site(loaded, profile, settings.resolved(profile), progress)


def component(spec: str, where: Site, seed: int | None = None) -> CovarianceStats:
    """C of one component of the pretraining mixture: an independent draw from C_Wiki's (seed + 1;
    a pocket domain's ``train`` split)."""
    seed = where.settings.seed if seed is None else seed
    return corpus(spec, where, seed=seed + 1, split=_component_split(spec))


def domain_covariances(loaded: Any, profile: Any, settings: CovSettings, progress: bool = False
                       ) -> dict[str, CovarianceStats]:
    """Pocket only: ``C_d`` of every domain's training split (:func:`component`, draw 0), chat included (the
    post-training data): the oracle's components and the distortion probes."""
    from moir_lib.documents import pocket_corpus
    from moir_lib.pocket import DOMAINS

    variant = POCKET_SPECS.get(profile.model)
    if variant is None:
        raise ValueError("per-domain covariances are defined for the pocket world only")
    where = site(loaded, profile, settings, progress)
    return {d: component(pocket_corpus(d, variant), where) for d in DOMAINS}


def _component_split(spec: str) -> str | None:
    return "train" if spec.startswith("pocket:") and "split=" not in spec else None


def _component(spec: str, where: Site, seed: int, components: Mapping[str, CovarianceStats] | None
               ) -> CovarianceStats:
    if components is not None and spec in components:
        return components[spec]
    return component(spec, where, seed)


def _corpus_provenance(name: str, spec: str, where: Site, seed: int, split: str | None,
                       stats: CovarianceStats) -> dict[str, Any]:
    s = where.settings
    return {"cov": name, "source": spec, "n_documents": s.n_documents, "seed": seed, "split": split,
            "count_bos": s.count_bos, "tokens_per_batch": where.profile.covariance.tokens_per_batch,
            "n_tokens": stats.n_tokens, "fingerprint": stats.metadata.get("fingerprint")}


def _oracle(name: str, where: Site, seed: int, components: Mapping[str, CovarianceStats] | None
            ) -> tuple[CovarianceStats, dict[str, Any]]:
    s = where.settings
    if not s.oracle:
        raise ValueError("C oracle needs oracle={corpus spec: weight} for a non-pocket profile (the paper: "
                         "OLMo-Mix-1124's components and proportions, appendix A.2)")
    parts = [(_component(spec, where, seed, components), weight) for spec, weight in s.oracle.items()]
    stats = mix(parts)
    record = [[spec, stats_.metadata.get("fingerprint"), weight]
              for (spec, weight), (stats_, _) in zip(s.oracle.items(), parts, strict=True)]
    return stats, {"cov": name, "source": "mix", "mixture": dict(s.oracle), "seed": seed + 1,
                   "n_documents": s.n_documents, "count_bos": s.count_bos,
                   "tokens_per_batch": where.profile.covariance.tokens_per_batch, "n_tokens": stats.n_tokens,
                   "fingerprint": fingerprint({"kind": "mixture", "components": record})}


def _prefix(name: str, recipe: str, draw: int, fraction: str, loaded: Any, profile: Any,
            settings: CovSettings, progress: bool) -> tuple[CovarianceStats, dict[str, Any]]:
    """The prefix ``fraction`` of the C ``recipe`` (draw ``draw``), from the pass that builds the whole."""
    if not _prefixed(recipe):
        raise ValueError(f"C {name!r}: prefixes are taken of wiki and moir C's (one pass of a corpus or a "
                         f"generation), not of {recipe}")
    if fraction not in settings.prefixes:
        settings = dataclasses.replace(settings, prefixes=(*settings.prefixes, fraction))
    whole, info = build(_whole(recipe, draw), loaded, profile, settings, progress=progress)
    total = settings.n_documents if recipe == "wiki" else _samples(recipe, settings)
    m = prefix_counts(total, [fraction])[fraction]
    if m not in whole.prefixes:
        held = info.get("n_samples", total)
        raise ValueError(f"C {name!r}: the first {m} of {total} samples are not in the generation "
                         f"(it holds {held}: its stop rule stopped it before; use a smaller fraction)")
    stats = whole.prefixes[m]
    size = "n_documents" if recipe == "wiki" else "n_samples"
    return stats, {**info, "cov": name, "prefix": fraction, "of": _whole(recipe, draw), size: m,
                   "n_tokens": stats.n_tokens, "fingerprint": stats.metadata.get("fingerprint")}


def stop_rule(profile: Any, settings: CovSettings) -> Any:
    """C_Moir's stop rule of ``settings.until_converged`` (first check at two batches, AlphaEdit's τ of
    the profile), or ``None``."""
    if settings.until_converged is None:
        return None
    from moir_lib.generation.stopping import StopRule

    a = profile.alphaedit
    return StopRule(float(settings.until_converged), 2 * profile.generation.batch_size, a.tau, a.tau_mode)


def _strategy(base: str, profile: Any) -> str:
    if base == "moir":
        return profile.generation.seed_strategy
    strategy = base.removeprefix("moir-")
    parse_seed_strategy(strategy)  # ValueError for a bad one
    return strategy


def _samples(base: str, settings: CovSettings) -> int | None:
    return settings.n_samples if base == "moir" else settings.strategy_samples


def _moir(name: str, base: str, where: Site, seed: int) -> tuple[CovarianceStats, dict[str, Any]]:
    gen, loaded = where.profile.generation, where.loaded
    strategy, n = _strategy(base, where.profile), _samples(base, where.settings)
    if not strategy or not n or not gen.max_new_tokens or not gen.batch_size:
        raise ValueError(f"C {name} needs the self-generation settings (seed strategy, samples, "
                         f"max_new_tokens, batch_size: the profile's generation section)")
    layers = list(where.profile.edit_layers)
    rule = stop_rule(where.profile, where.settings)
    gen_dir = selfgen_dir(loaded.model, strategy, n, gen.max_new_tokens, seed, layers, stop=rule)
    settings = GenerationSettings(strategy, n, gen.max_new_tokens, gen.batch_size, seed=seed,
                                  collect_layers=layers,
                                  prefixes=list(prefix_counts(n, where.settings.prefixes).values()),
                                  stop=rule)
    self_generate(loaded.model, loaded.tokenizer, settings, gen_dir,
                  wait=True,  # a shared cache entry: wait for its builder
                  progress=where.progress)
    stats, provenance = from_generation(gen_dir, where)
    return stats, {**provenance, "cov": name}


def selfgen_dir(model: Any, strategy: str, n: int, max_new_tokens: int, seed: int, layers: Any,
                stop: Any = None) -> Path:
    """The self-generation cache entry of these settings (shared by ``moir edit``, the Lab and chapter 03);
    ``stop``: a :class:`~moir_lib.generation.stopping.StopRule` (its generation is another entry)."""
    key = {"model": model_fingerprint(model), "strategy": strategy, "n": n, "max_new_tokens": max_new_tokens,
           "seed": seed, "layers": list(layers)}
    if stop is not None:
        key["stop"] = stop.to_config()
    return entry_dir("selfgen", key)


def from_generation(gen_dir: str | os.PathLike[str], where: Site) -> tuple[CovarianceStats, dict[str, Any]]:
    """C of a self-generation: the keys collected during generation (Algorithm 1, no second pass)
    when the generation collected the edit layers, else one pass over its samples (``count_bos`` as set)."""
    manifest = read_manifest(gen_dir)
    layers = list(where.profile.edit_layers)
    collected = set(layers) <= set(manifest.get("collect_layers") or [])
    if collected:
        stats = load_key_stats(gen_dir)
    else:
        stats = estimate(where.loaded, load_corpus(str(gen_dir)), layers, _estimation(where),
                         progress=where.progress)
    n_samples = generation_samples(manifest)
    record = {"kind": "selfgen", "model": manifest.get("model_fingerprint"),
              "strategy": manifest["seed_strategy"], "n": n_samples,
              "max_new_tokens": manifest["max_new_tokens"], "seed": manifest["seed"],
              "layers": sorted(layers),
              "keys": "collected" if collected else stats.metadata.get("fingerprint")}
    return stats, {"cov": "moir", "source": f"self-generation {manifest['seed_strategy']}",
                   "seed_strategy": manifest["seed_strategy"], "n_samples": n_samples,
                   "max_new_tokens": manifest["max_new_tokens"], "seed": manifest["seed"],
                   "keys": "collected during generation" if collected else "one pass over the samples",
                   "gen_dir": str(gen_dir), "n_tokens": stats.n_tokens, "fingerprint": fingerprint(record),
                   **({"stopped": {k: manifest["stopped"][k]
                                   for k in ("converged", "sufficed", "budget", "gap")}}
                      if manifest.get("stopped") else {})}


def from_file(path: str | os.PathLike[str], profile: Any) -> tuple[CovarianceStats, dict[str, Any]]:
    """A saved :class:`~moir_lib.covariance.stats.CovarianceStats` holding every edit layer of ``profile``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"unknown C {str(path)!r}: choose wiki, wiki-subset, oracle, moir, "
                         f"moir-<seed strategy> (e.g. moir-bos, moir-rand2) or a saved statistics file")
    stats = CovarianceStats.load(path)
    layers = list(profile.edit_layers)
    absent = [x for x in layers if x not in stats.layers]
    if absent:
        raise ValueError(f"C file {path} has layers {list(stats.layers)}, but the edit layers are "
                         f"{layers} (missing {absent})")
    return stats, file_provenance(path, stats)


def file_provenance(path: str | os.PathLike[str], stats: CovarianceStats) -> dict[str, Any]:
    """The provenance of statistics read from ``path`` (its header's SHA-256 as the fingerprint)."""
    return {"cov": "file", "source": str(path), "path": str(path), "n_tokens": stats.n_tokens,
            "fingerprint": read_metadata(path, _header=True).get("sha256")}


def _file_digest(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    return {"file": str(p), "sha": hashlib.sha256(p.read_bytes()).hexdigest()[:16]}
