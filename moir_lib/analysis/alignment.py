"""Distributional alignment of the candidate C corpora: the tables behind the chapter "NLL / JSD" (03).

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

**Keys.** ``C_Moir`` and ``C_Moir-bos`` are the keys collected *during* generation when the run did so
for the edit layers (Algorithm 1: the sampled tokens ``x_1..x_T``; no second pass), else one pass over
the samples. Every other ``C`` is :func:`moir_lib.covariance.estimate` with ``count_bos=False`` (the
recipes of :mod:`moir_lib.covariance.recipes`, shared with ``moir edit`` and the Lab): the BOS key is one
fixed vector per document (position 0, same token), a spike that would otherwise weigh with the number
of documents rather than with the text. Coverage is measured on *probe* covariances of other,
held-out documents of each domain (and of post-training), not on the documents C_Wiki or the oracle's
components were estimated from.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moir_lib.analysis.divergence import jsd_table
from moir_lib.analysis.nll import document_nll, tokenize_documents

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float

    from moir_lib.analysis.selfgen import StrategyRun
    from moir_lib.covariance import CovarianceStats, Diagnosis
    from moir_lib.covariance.diagnostics import CovarianceLike

__all__ = ["POCKET_DOMAINS", "POCKET_REFERENCE", "SELFGEN", "REFERENCES", "C_NAMES", "PAPER_JSD",
           "nll_spec", "mixture_counts", "Corpora", "nll_corpora", "nll_table", "jsd", "jsd_wide",
           "Covariances", "covariances", "diagnostics", "coverage_mean", "angle_summary", "headline",
           "add_tables", "findings"]

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


def _selfgen_documents(run: StrategyRun, n: int | None) -> tuple[list[list[int]], list[int]]:
    recs = run.records[:n] if n is not None else run.records
    return ([list(r["seed_ids"]) + list(r["token_ids"]) for r in recs], [len(r["seed_ids"]) for r in recs])


def nll_corpora(tokenizer: Any, runs: Mapping[str, StrategyRun], *, domains: Mapping[str, str] | None = None,
                reference: str | None = None, mixture: Mapping[str, float] | None = None, n_docs: int = 300,
                n_reference: int = 300, seed: int = 0) -> Corpora:
    """Collect the documents of Fig. 11a: the self-generated corpora (``runs`` keyed by seed strategy,
    named by :data:`SELFGEN`), ``n_docs`` documents of each domain, and ``n_reference`` documents of each
    reference (the pretraining mixture over ``mixture``'s domains, and ``reference``).

    Defaults are the pocket world's: :data:`POCKET_DOMAINS`, :data:`POCKET_REFERENCE` and
    :data:`moir_lib.pocket.MIXTURE`. Specs go through :func:`nll_spec` (held-out split).
    """
    from moir_lib.corpora import load_corpus
    from moir_lib.pocket import MIXTURE

    domains = dict(POCKET_DOMAINS if domains is None else domains)
    mixture = dict(MIXTURE if mixture is None else mixture)
    reference = POCKET_REFERENCE if reference is None else reference
    unknown = sorted(set(mixture) - set(domains))
    if unknown:
        raise ValueError(f"mixture domains {unknown} are not among the domain corpora {sorted(domains)}")
    for name, value in (("n_docs", n_docs), ("n_reference", n_reference)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 1:
            raise ValueError(f"{name} must be an integer of at least 2 (a KDE needs spread), got {value!r}")
    out = Corpora()
    for name, strategy in SELFGEN.items():
        if strategy in runs:
            docs, ctx = _selfgen_documents(runs[strategy], n_docs)
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
    parts = []
    for name, docs in corpora.documents.items():
        table = document_nll(model, tokenizer, docs, name, window=window, batch_size=batch_size,
                             progress=progress, n_context=corpora.n_context[name])
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


def jsd_wide(table: pd.DataFrame) -> pd.DataFrame:
    """The paper-style table: one row per corpus (closest to post-training first), the divergence and the
    distance against each reference, and the paper's values."""
    wide = table.pivot(index="corpus", columns="reference", values=["jsd", "distance", "paper_jsd"])
    cols = {("jsd", "pretraining"): "JSD pre", ("jsd", "post-training"): "JSD post",
            ("distance", "pretraining"): "distance pre", ("distance", "post-training"): "distance post",
            ("paper_jsd", "pretraining"): "paper pre", ("paper_jsd", "post-training"): "paper post"}
    wide = wide[list(cols)]
    wide.columns = list(cols.values())
    return wide.sort_values("JSD post")


# ----------------------------------------------------------------------------- covariances


@dataclass
class Covariances:
    """The covariances of the chapter: ``named`` (the compared C's: ``C_Wiki``, ``C_Moir``, ``C_Moir-bos``,
    ``C_Oracle``), ``components`` (the pretraining domains' C's the oracle mixes) and ``probes`` (held-out
    C's of every domain and of post-training, the domains whose coverage Fig. 7 reports)."""

    named: dict[str, CovarianceStats]
    components: dict[str, CovarianceStats]
    probes: dict[str, CovarianceStats]


def covariances(loaded: Any, layers: Sequence[int], runs: Mapping[str, StrategyRun], *,
                domains: Mapping[str, str] | None = None, reference: str | None = None,
                mixture: Mapping[str, float] | None = None, wiki_corpus: str = "pocket:wiki",
                n_docs: int = 300, seed: int = 0, tokens_per_batch: int = 4096,
                progress: bool = True) -> Covariances:
    """Build the compared C's, the oracle's components and the coverage probes (see :class:`Covariances`)
    with the recipes of :mod:`moir_lib.covariance.recipes` (those of ``moir edit`` and the Lab).

    ``C_Wiki``: ``n_docs`` documents of ``wiki_corpus`` (the profile's ``covariance.wiki_corpus``);
    ``C_Moir`` / ``C_Moir-bos``: the rand1 / bos generations of ``runs`` (keys collected during generation
    when available, :func:`~moir_lib.covariance.recipes.from_run`); ``C_Oracle``: the ``oracle`` recipe,
    :func:`moir_lib.covariance.mix` of the components (``n_docs`` documents of each domain, an independent
    draw from C_Wiki's: ``seed + 1``, a pocket domain's ``train`` split) with ``mixture``'s weights
    (appendix A.2). The probes are ``n_docs`` *other* documents of each domain and of ``reference``
    (:func:`_probe`): measuring coverage on the documents a C was estimated from would favour C_Wiki
    on wiki and the oracle everywhere. All estimates are cached by :func:`moir_lib.covariance.estimate`.
    """
    from moir_lib.covariance import recipes
    from moir_lib.pocket import MIXTURE

    domains = dict(POCKET_DOMAINS if domains is None else domains)
    mixture = dict(MIXTURE if mixture is None else mixture)
    reference = POCKET_REFERENCE if reference is None else reference
    missing = [s for s in SELFGEN.values() if s not in runs]
    if missing:
        raise ValueError(f"C_Moir and C_Moir-bos need the {' and '.join(missing)} generations")
    unknown = sorted(set(mixture) - set(domains))
    if unknown:
        raise ValueError(f"mixture domains {unknown} are not among the domain corpora {sorted(domains)}")
    settings = recipes.Settings(layers=tuple(layers), tokens_per_batch=tokens_per_batch,
                                wiki_corpus=wiki_corpus, n_documents=n_docs, seed=seed, count_bos=False,
                                oracle={domains[d]: w for d, w in mixture.items()}, progress=progress)
    components = {name: recipes.component(domains[name], loaded, settings) for name in mixture}
    named = {
        "C_Wiki": recipes.build("wiki", loaded, settings)[0],
        "C_Moir": recipes.from_run(runs[SELFGEN["moir"]].run_dir, loaded, settings)[0],
        "C_Moir-bos": recipes.from_run(runs[SELFGEN["moir-bos"]].run_dir, loaded, settings)[0],
        "C_Oracle": recipes.build("oracle", loaded, settings,
                                  components={domains[d]: c for d, c in components.items()})[0],
    }
    probes = {name: _probe(spec, loaded, settings) for name, spec in domains.items()}
    probes["post-training"] = _probe(reference, loaded, settings)
    return Covariances(named, components, probes)


def _probe(spec: str, loaded: Any, settings: Any) -> CovarianceStats:
    """A coverage probe of ``spec``: documents the compared C's were not estimated from, a pocket
    domain's validation split (:func:`nll_spec`, seed + 1), else the draw of seed + 2 (the components
    draw seed + 1)."""
    from moir_lib.covariance import recipes

    held_out = nll_spec(spec)
    seed = settings.seed + (1 if held_out != spec else 2)
    return recipes.corpus(held_out, loaded, settings, seed=seed)


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


# ----------------------------------------------------------------------------- headline and findings


def _order(table: pd.DataFrame, reference: str) -> list[str]:
    return table[table["reference"] == reference].sort_values("jsd")["corpus"].tolist()


def headline(jsd_tidy: pd.DataFrame, coverage: pd.DataFrame, summary: pd.DataFrame,
             angles: pd.DataFrame) -> dict[str, Any]:
    """The chapter's ``summary.json`` headline: the key orderings and numbers (the JSD and coverage tables
    go beside it, :func:`add_tables`).

    ``post_order`` / ``pre_order``: corpora by Jensen–Shannon divergence to each reference, closest
    first; ``moir_closest_to_post`` (the paper's claim), ``moir_closer_than_bos_post``,
    ``wiki_over_moir_post`` (the paper: 3.1); ``coverage_mean`` (per C, over domains and layers),
    ``moir_over_wiki_domains`` (domains where C_Moir covers more than C_Wiki), ``coverage_best`` (per
    domain, the C that covers it most), ``effective_rank`` (per C, mean over layers),
    ``angle_moir_wiki_deg`` / ``angle_moir_oracle_deg`` (mean principal angle).
    """
    post = _order(jsd_tidy, "post-training")
    pre = _order(jsd_tidy, "pretraining")
    val = jsd_tidy.set_index(["corpus", "reference"])["jsd"]
    cov = coverage_mean(coverage)
    rank = summary.groupby("name", sort=False)["effective_rank"].mean()
    ang = angle_summary(angles)

    def angle(a: str, b: str) -> float | None:
        rows = ang[((ang["a"] == a) & (ang["b"] == b)) | ((ang["a"] == b) & (ang["b"] == a))]
        return float(rows["mean_angle_deg"].mean()) if len(rows) else None

    def post_jsd(c: str) -> float | None:
        return float(val[c, "post-training"]) if (c, "post-training") in val.index else None

    moir, bos, wiki = post_jsd("moir"), post_jsd("moir-bos"), post_jsd("wiki")
    out: dict[str, Any] = {
        "post_order": post,
        "pre_order": pre,
        "closest_to_post": post[0],
        "closest_to_pre": pre[0],
        "moir_closest_to_post": bool(post and post[0] == "moir"),
        "moir_closer_than_bos_post": bool(moir is not None and bos is not None and moir < bos),
        "moir_post_jsd": moir,
        "bos_post_jsd": bos,
        "wiki_post_jsd": wiki,
        "wiki_over_moir_post": (wiki / moir) if wiki is not None and moir else None,
        "coverage_mean": {c: float(cov.loc[c].mean()) for c in cov.index},
        "moir_over_wiki_domains": ([d for d in cov.columns if cov.loc["C_Moir", d] > cov.loc["C_Wiki", d]]
                                   if {"C_Moir", "C_Wiki"} <= set(cov.index) else []),
        "coverage_best": {d: str(cov[d].idxmax()) for d in cov.columns},
        "effective_rank": {c: float(r) for c, r in rank.items()},
        "angle_moir_wiki_deg": angle("C_Moir", "C_Wiki"),
        "angle_moir_oracle_deg": angle("C_Moir", "C_Oracle"),
    }
    return out


def add_tables(out_dir: str | os.PathLike[str], **tables: pd.DataFrame) -> Path:
    """Add tables to the chapter's ``summary.json`` as top-level lists of records (``name: [{column:
    value}, …]``, NaN as null), beside the ``headline`` that :func:`moir_lib.results.write_summary` wrote.
    Rewritten atomically; returns the path."""
    from moir_lib.results import SUMMARY_NAME, read_summary

    summary = read_summary(out_dir)
    for name, table in tables.items():
        if name in {"chapter", "headline", "parameters", "git_hash", "moir_version", "created"}:
            raise ValueError(f"{name!r} is a summary field, not a table name")
        clean = table.astype(object).where(pd.notna(table), None)
        summary[name] = [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                         for row in clean.to_dict("records")]
    path = Path(out_dir) / SUMMARY_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def findings(head: Mapping[str, Any], mixes: pd.DataFrame | None = None, model_name: str = "pocket") -> str:
    """The closing paragraph, from the measured numbers: which corpus is closest to each reference, whether
    Moir is closest to post-training (the paper's Fig. 11b claim) and closer than Moir-bos, what the
    samples are made of, and what the coverage and effective ranks say about the C's (Fig. 7)."""
    world = "the pocket world" if model_name.startswith("pocket") else f"`{model_name}`"
    post, pre = head["post_order"], head["pre_order"]
    out = [
        f"**Closest to post-training:** {', '.join(f'`{c}`' for c in post)} (Jensen–Shannon divergence, "
        f"closest first; the paper: moir, code, moir-bos, wiki, math, web). **Closest to the pretraining "
        f"mixture:** {', '.join(f'`{c}`' for c in pre)} (the paper: web, wiki, code, moir, math, moir-bos).",
        f"Moir's divergence to post-training is {_f(head['moir_post_jsd'])}, Moir-bos's "
        f"{_f(head['bos_post_jsd'])}, wiki's {_f(head['wiki_post_jsd'])}"
        + (f" ({head['wiki_over_moir_post']:.1f}× Moir's; the paper: 3.1×)" if head.get("wiki_over_moir_post")
           else "") + ".",
    ]
    if mixes is not None and len(mixes):
        by = mixes.set_index(["strategy", "domain"])["share"]
        from moir_lib.analysis.selfgen import top_domains

        parts, chats = [], []
        for name, strategy in SELFGEN.items():
            if strategy in mixes["strategy"].values:
                chats.append(float(by.get((strategy, "chat"), 0.0)))
                parts.append(f"{name}: {top_domains(mixes, strategy)}")
        if parts:
            out.append("What the samples are (heuristic domains): " + "; ".join(parts) + "."
                       + (" The post-training reference is all chat, so a corpus that falls into the chat "
                          "template sits near it whatever else it covers." if max(chats) >= 0.5 else ""))
    if head["moir_closest_to_post"]:
        verdict = (f"**Verdict: {world} reproduces the paper's ordering** — Moir (rand×1) is the corpus "
                   f"closest to the post-training distribution.")
    else:
        verdict = (f"**Verdict: {world} does not reproduce the paper's ordering** — the corpus closest to "
                   f"post-training is `{head['closest_to_post']}`, not Moir"
                   + (" (Moir is still closer than Moir-bos)." if head["moir_closer_than_bos_post"]
                      else "; Moir-bos is closer than Moir too, the reverse of the paper's Fig. 3."))
    out.append(verdict)
    cov = head["coverage_mean"]
    if {"C_Moir", "C_Wiki"} <= set(cov):
        wins, n_dom = head["moir_over_wiki_domains"], len(head["coverage_best"])
        ranked = sorted(cov, key=cov.get, reverse=True)
        holds = len(wins) > n_dom / 2
        out.append(
            "**Coverage (Fig. 7).** Mean share of the domains' key energy inside each C's top-k eigenspace: "
            + ", ".join(f"{c} {cov[c]:.2f}" for c in ranked)
            + f". C_Moir covers more than C_Wiki on {len(wins)} of {n_dom} domains "
            + f"({', '.join(wins) or 'none'}); the best cover per domain: "
            + ", ".join(f"{d} → {c}" for d, c in head["coverage_best"].items())
            + ". The paper's claim that C_Moir extends coverage into domains C_Wiki misses "
            + ("holds here." if holds else "does not hold on most domains here."))
    ranks = head["effective_rank"]
    if ranks:
        out.append("Effective ranks (mean over edit layers): "
                   + ", ".join(f"{c} {r:.0f}" for c, r in sorted(ranks.items(), key=lambda kv: -kv[1])) + ".")
    return "\n\n".join(out)

