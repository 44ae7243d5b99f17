"""Distributional alignment of the candidate C corpora: the measurements behind chapter 03 (03_nll_jsd).

The paper asks which corpus matches the model's *operative* distribution (Section 4 "Distributional
analysis", Fig. 3; appendix D.3, Fig. 11) and what that does to ``C`` (Section 6, Fig. 7 "knowledge
coverage"; appendix A.2, the oracle mixture):

- per-document NLL (eq. (nll), :func:`moir_lib.analysis.nll.document_nll`) of Moir (rand×1
  self-generations), Moir-bos, and the wiki/web/code/math corpora, against two references: the
  *pretraining mixture* (documents of the pretraining domains in the pretraining proportions) and the
  *post-training* reference (held-out SFT transcripts; the paper pools Tulu SFT and DPO responses);
- the Jensen–Shannon table of Fig. 11b (:func:`moir_lib.analysis.divergence.jsd_table`: the
  divergence, which is what Fig. 11b's numbers behave like, and the distance);
- the covariance diagnostics of ``C_Wiki``, ``C_Moir``, ``C_Moir-bos`` and the oracle mixture ``C_Oracle =
  Σ_d w_d C_d`` (:func:`moir_lib.covariance.mix`): spectra, effective ranks, principal angles and the
  domain coverage ``tr(U_kᵀ C_d U_k) / tr(C_d)`` of each domain's keys by each ``C``'s top-``k``
  eigenspace (:func:`moir_lib.covariance.diagnose`).

**Documents.** On the pocket world the NLL documents are drawn from the ``validation`` split of each
domain (held out from pretraining; the post-training reference is ``pocket:chat``'s validation split, as
:mod:`moir_lib.pocket.corpora` designates) and the domain covariances from the ``train`` split (the data
the model was trained on, as the oracle of appendix A.2 uses the pretraining corpus itself). The
pretraining-mixture reference draws documents of each domain in proportion to ``w_d / L_d`` (the
mixture weights are shares of *tokens*; ``L_d`` is the domain's mean document length), from a different
seed than the per-domain corpora. Self-generated documents are scored on their exact token ids with the
seed as context only (BOS and the random seed tokens are not targets: the model did not choose them);
chat tags are never targets ("excluding chat templates").

**Keys.** ``C_Moir`` and ``C_Moir-bos`` are the keys collected *during* generation when it did so
for the edit layers (Algorithm 1: the sampled tokens ``x_1..x_T``; no second pass), else one pass over
the samples. Every other ``C`` is :func:`moir_lib.covariance.estimate` with ``count_bos=False`` (the
recipes of :mod:`moir_lib.covariance.recipes`, shared with ``moir edit`` and the Lab): the BOS key is one
fixed vector per document (position 0, same token), a spike that would otherwise weigh with the number
of documents rather than with the text. Coverage is measured on *probe* covariances of other,
held-out documents of each domain (and of post-training), not on the documents C_Wiki or the oracle's
components were estimated from.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moir_lib.analysis.divergence import jsd_table
from moir_lib.analysis.nll import NLLSettings, document_nll, tokenize_documents

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float

    from moir_lib.analysis.selfgen import StrategyGeneration
    from moir_lib.covariance import CovarianceStats, Diagnosis
    from moir_lib.covariance.diagnostics import CovarianceLike

__all__ = ["POCKET_DOMAINS", "POCKET_REFERENCE", "SELFGEN", "REFERENCES", "C_NAMES", "PAPER_JSD",
           "nll_spec", "mixture_counts", "CorpusSpecs", "Corpora", "nll_corpora", "nll_table", "jsd",
           "Covariances", "covariances", "diagnostics", "coverage_mean", "angle_summary"]

log = logging.getLogger(__name__)

#: The pocket stand-ins for the paper's corpora (appendix D.3): Wikipedia, DCLM web, the-stack, Proof-Pile.
POCKET_DOMAINS: dict[str, str] = {"wiki": "pocket:wiki", "web": "pocket:web", "code": "pocket:code",
                                  "math": "pocket:math"}
#: The post-training distribution: the pocket chat SFT data (the paper: Tulu-3 SFT + OLMo-2 DPO responses).
POCKET_REFERENCE = "pocket:chat"
#: The self-generated corpora and the seed strategy of each.
SELFGEN: dict[str, str] = {"moir": "rand1", "moir-bos": "bos"}
REFERENCES: tuple[str, str] = ("pretraining", "post-training")
#: The covariances compared (Fig. 7 and Table 1 of the paper).
C_NAMES: tuple[str, ...] = ("C_Wiki", "C_Moir", "C_Moir-bos", "C_Oracle")
#: Fig. 11b of the paper (OLMo-2-7B-Instruct): corpus -> (vs pretraining, vs post-training).
PAPER_JSD: dict[str, tuple[float, float]] = {
    "moir": (0.2160, 0.0350), "code": (0.0869, 0.0505), "moir-bos": (0.3646, 0.0978),
    "wiki": (0.0462, 0.1080), "math": (0.2660, 0.1553), "web": (0.0015, 0.1572),
}


def nll_spec(spec: str) -> str:
    """The spec NLL documents are drawn from: a pocket domain's ``validation`` split unless a split is
    given (held out from training); any other spec unchanged."""
    if not spec.startswith("pocket:") or "split=" in spec:
        return spec
    return spec + ("&" if "?" in spec else "?") + "split=validation"


def mixture_counts(weights: Mapping[str, float], mean_tokens: Mapping[str, float], n: int) -> dict[str, int]:
    """Documents per domain for ``n`` documents whose *tokens* follow ``weights``: ``∝ w_d / L_d``.

    Rounded by largest remainder; every domain with a positive weight gets at least one document.
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    raw = {d: w / mean_tokens[d] for d, w in weights.items() if w > 0}
    if not raw:
        raise ValueError(f"the mixture has no positive weight: {dict(weights)}")
    if len(raw) > n:
        raise ValueError(f"{n} documents cannot cover {len(raw)} mixture domains")
    total = sum(raw.values())
    exact = {d: n * v / total for d, v in raw.items()}
    counts = {d: max(1, int(math.floor(x))) for d, x in exact.items()}
    order = sorted(raw, key=lambda d: (counts[d] - exact[d], d))  # most under-served first
    i = 0
    while sum(counts.values()) < n:
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts.values()) > n:  # only when the at-least-one rule overshoots
        d = max((d for d in counts if counts[d] > 1), key=lambda d: counts[d] - exact[d])
        counts[d] -= 1
    return counts


@dataclass(frozen=True)
class CorpusSpecs:
    """The corpora compared: ``domains`` (name -> corpus spec of wiki/web/code/math; default
    :data:`POCKET_DOMAINS`), the post-training ``reference`` spec (default :data:`POCKET_REFERENCE`) and the
    pretraining ``mixture`` (domain -> token share; default :data:`moir_lib.pocket.MIXTURE`). The default
    pocket corpora are written by the world of the pocket variant given to :meth:`resolved`."""

    domains: Mapping[str, str] | None = None
    reference: str | None = None
    mixture: Mapping[str, float] | None = None

    def resolved(self, variant: str | None = None) -> tuple[dict[str, str], str, dict[str, float]]:
        """``(domains, reference, mixture)`` with the defaults filled in, the pocket corpora those of
        ``variant``'s world (:func:`~moir_lib.documents.pocket_corpus`; ``None``: the book's ``pocket``);
        ``ValueError`` when a mixture domain is not among the domains."""
        from moir_lib.documents import pocket_corpus
        from moir_lib.pocket import MIXTURE

        domains = dict({d: pocket_corpus(d, variant) for d in POCKET_DOMAINS} if self.domains is None
                       else self.domains)
        mixture = dict(MIXTURE if self.mixture is None else self.mixture)
        reference = (self.reference if self.reference is not None
                     else pocket_corpus(POCKET_REFERENCE.removeprefix("pocket:"), variant))
        unknown = sorted(set(mixture) - set(domains))
        if unknown:
            raise ValueError(f"mixture domains {unknown} are not among the domain corpora {sorted(domains)}")
        return domains, reference, mixture


# ----------------------------------------------------------------------------- NLL and JSD


@dataclass
class Corpora:
    """The documents scored for the NLL figure: ``documents[name]`` (text or token ids), ``n_context[name]``
    (per document, leading tokens that are context only, or ``None``) and ``role[name]``
    (``self-generated`` | ``corpus`` | ``reference``); ``mixture[domain]`` = documents of each domain in
    the pretraining reference."""

    documents: dict[str, list[Any]] = field(default_factory=dict)
    n_context: dict[str, list[int] | None] = field(default_factory=dict)
    role: dict[str, str] = field(default_factory=dict)
    mixture: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, docs: list[Any], role: str, n_context: list[int] | None = None) -> None:
        if not docs:
            raise ValueError(f"corpus {name!r} has no documents")
        self.documents[name], self.role[name], self.n_context[name] = docs, role, n_context


def _selfgen_documents(gen: StrategyGeneration, n: int | None) -> tuple[list[list[int]], list[int]]:
    recs = gen.samples[:n] if n is not None else gen.samples
    return ([list(r["seed_ids"]) + list(r["token_ids"]) for r in recs], [len(r["seed_ids"]) for r in recs])


def nll_corpora(tokenizer: Any, generations: Mapping[str, StrategyGeneration],
                specs: CorpusSpecs = CorpusSpecs(), *, n_docs: int = 300, n_reference: int = 300,
                seed: int = 0) -> Corpora:
    """Collect the documents of Fig. 11a: the self-generated corpora (``generations`` keyed by seed strategy,
    named by :data:`SELFGEN`), ``n_docs`` documents of each of ``specs``' domains, and ``n_reference``
    documents of each reference (the pretraining mixture over the mixture's domains, and the post-training
    reference). Specs go through :func:`nll_spec` (held-out split).
    """
    from moir_lib.documents import load_corpus

    domains, reference, mixture = specs.resolved()
    for name, value in (("n_docs", n_docs), ("n_reference", n_reference)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 1:
            raise ValueError(f"{name} must be an integer of at least 2 (a KDE needs spread), got {value!r}")
    out = Corpora()
    for name, strategy in SELFGEN.items():
        if strategy in generations:
            docs, ctx = _selfgen_documents(generations[strategy], n_docs)
            out.add(name, docs, "self-generated", ctx)
    lengths: dict[str, float] = {}
    for name, spec in domains.items():
        docs = list(load_corpus(nll_spec(spec), n=n_docs, seed=seed))
        out.add(name, docs, "corpus")
        ids = tokenize_documents(tokenizer, docs, add_bos=False)
        lengths[name] = float(np.mean([len(x) for x in ids]))
    counts = mixture_counts(mixture, lengths, n_reference)
    pre: list[Any] = []
    for name, k in counts.items():
        pre += list(load_corpus(nll_spec(domains[name]), n=k, seed=seed + 1))
    out.add("pretraining", pre, "reference")
    out.mixture = counts
    out.add("post-training", list(load_corpus(nll_spec(reference), n=n_reference, seed=seed)), "reference")
    return out


def nll_table(model: Any, tokenizer: Any, corpora: Corpora, *, window: int | None = None,
              batch_size: int = 16, progress: bool = True) -> pd.DataFrame:
    """Per-document NLL of every corpus: ``corpus, role, doc, n_tokens, nll`` (documents with no counted
    target dropped)."""
    settings = NLLSettings(window=window, batch_size=batch_size)
    parts = []
    for name, docs in corpora.documents.items():
        table = document_nll(model, tokenizer, docs, name, settings, progress=progress,
                             n_context=corpora.n_context[name])
        parts.append(table.assign(role=corpora.role[name]))
    table = pd.concat(parts, ignore_index=True).dropna(subset=["nll"])
    return table[["corpus", "role", "doc", "n_tokens", "nll"]]


def jsd(nll: pd.DataFrame) -> pd.DataFrame:
    """Fig. 11b: every non-reference corpus against each reference, tidy
    (:func:`moir_lib.analysis.divergence.jsd_table` columns), with the paper's value where it has one."""
    values = {c: g["nll"].to_numpy() for c, g in nll.groupby("corpus", sort=False)}
    refs = [r for r in REFERENCES if r in values]
    if len(refs) != len(REFERENCES):
        raise ValueError(f"the NLL table lacks the references {sorted(set(REFERENCES) - set(refs))}")
    samples = {c: v for c, v in values.items() if c not in REFERENCES}
    table = jsd_table(samples, {r: values[r] for r in refs})
    table["paper_jsd"] = [PAPER_JSD.get(c, (np.nan, np.nan))[REFERENCES.index(r)]
                          for c, r in zip(table["corpus"], table["reference"], strict=True)]
    return table


# ----------------------------------------------------------------------------- covariances


@dataclass
class Covariances:
    """The covariances of the chapter: ``named`` (the compared C's: ``C_Wiki``, ``C_Moir``, ``C_Moir-bos``,
    ``C_Oracle``), ``components`` (the pretraining domains' C's the oracle mixes) and ``probes`` (held-out
    C's of every domain and of post-training, the domains whose coverage Fig. 7 reports)."""

    named: dict[str, CovarianceStats]
    components: dict[str, CovarianceStats]
    probes: dict[str, CovarianceStats]


def covariances(loaded: Any, profile: Any, generations: Mapping[str, StrategyGeneration],
                specs: CorpusSpecs = CorpusSpecs(), *, n_docs: int = 300, seed: int = 0,
                progress: bool = True) -> Covariances:
    """Build the compared C's, the oracle's components and the coverage probes (see :class:`Covariances`)
    with the recipes of :mod:`moir_lib.covariance.recipes` (those of ``moir edit`` and the Lab).

    Every C is estimated at ``profile``'s edit layers with its ``covariance.tokens_per_batch``.
    ``C_Wiki``: ``n_docs`` documents of the profile's ``covariance.wiki_corpus``;
    ``C_Moir`` / ``C_Moir-bos``: the rand1 / bos ``generations`` (keys collected during generation when
    available, :func:`~moir_lib.covariance.recipes.from_generation`); ``C_Oracle``: the ``oracle`` recipe,
    :func:`moir_lib.covariance.mix` of the components (``n_docs`` documents of each domain, an independent
    draw from C_Wiki's: ``seed + 1``, a pocket domain's ``train`` split) with ``specs``' mixture weights
    (appendix A.2). The probes are ``n_docs`` *other* documents of each domain and of the reference
    (:func:`_probe`): measuring coverage on the documents a C was estimated from would favour C_Wiki
    on wiki and the oracle everywhere. All estimates are cached by :func:`moir_lib.covariance.estimate`.
    """
    from moir_lib.covariance import recipes
    from moir_lib.models import POCKET_SPECS

    missing = [s for s in SELFGEN.values() if s not in generations]
    if missing:
        raise ValueError(f"C_Moir and C_Moir-bos need the {' and '.join(missing)} generations")
    domains, reference, mixture = specs.resolved(POCKET_SPECS.get(profile.model))
    settings = recipes.CovSettings(n_documents=n_docs, seed=seed, count_bos=False,
                                   oracle={domains[d]: w for d, w in mixture.items()})
    where = recipes.site(loaded, profile, settings, progress)
    components = {name: recipes.component(domains[name], where) for name in mixture}
    named = {
        "C_Wiki": recipes.build("wiki", loaded, profile, settings, progress=progress)[0],
        "C_Moir": recipes.from_generation(generations[SELFGEN["moir"]].gen_dir, where)[0],
        "C_Moir-bos": recipes.from_generation(generations[SELFGEN["moir-bos"]].gen_dir, where)[0],
        "C_Oracle": recipes.build("oracle", loaded, profile, settings, progress=progress,
                                  components={domains[d]: c for d, c in components.items()})[0],
    }
    probes = {name: _probe(spec, where) for name, spec in domains.items()}
    probes["post-training"] = _probe(reference, where)
    return Covariances(named, components, probes)


def _probe(spec: str, where: Any) -> CovarianceStats:
    """A coverage probe of ``spec``: documents the compared C's were not estimated from, a pocket
    domain's validation split (:func:`nll_spec`, seed + 1), else the draw of seed + 2 (the components
    draw seed + 1)."""
    from moir_lib.covariance import recipes

    held_out = nll_spec(spec)
    seed = where.settings.seed + (1 if held_out != spec else 2)
    return recipes.corpus(held_out, where, seed=seed)


def diagnostics(named: Mapping[str, CovarianceStats | Float[torch.Tensor | np.ndarray, "d_in d_in"]],
                probes: Mapping[str, CovarianceLike], layers: Sequence[int],
                k: int | None = None) -> Diagnosis:
    """:func:`moir_lib.covariance.diagnose` of the compared C's, with the coverage of the ``probes``
    (domain C's), at one subspace size ``k`` (default ``d // 16`` of the key dimension ``d``)."""
    from moir_lib.covariance import diagnose

    first = next(iter(named.values()))
    d = first.dim if hasattr(first, "dim") else int(np.asarray(first).shape[0])
    k = max(1, d // 16) if k is None else int(k)
    if not 1 <= k <= d:
        raise ValueError(f"k must be in 1..{d} (the key dimension), got {k}")
    return diagnose(named, domains=probes, k=k, layers=list(layers))


def coverage_mean(coverage: pd.DataFrame) -> pd.DataFrame:
    """Coverage averaged over the edit layers: one row per C, one column per domain (Fig. 7's numbers)."""
    wide = coverage.groupby(["name", "domain"], sort=False)["coverage"].mean().unstack("domain")
    order = [c for c in C_NAMES if c in wide.index] + [c for c in wide.index if c not in C_NAMES]
    domains = list(dict.fromkeys(coverage["domain"]))
    return wide.loc[order, domains]


def angle_summary(angles: pd.DataFrame) -> pd.DataFrame:
    """Per pair of C's and layer: the mean cosine and mean/max angle (degrees) between their top-k
    eigenspaces (1 and 0° = the same subspace)."""
    g = angles.groupby(["a", "b", "layer", "k"], sort=False)
    return g.agg(mean_cos=("cos", "mean"), mean_angle_deg=("angle_deg", "mean"),
                 max_angle_deg=("angle_deg", "max")).reset_index()
