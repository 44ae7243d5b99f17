"""Chapter 03, "Which corpus looks like the deployed model?": NLL, Jensen–Shannon and what C covers.

Presents the measurements of :mod:`moir_lib.analysis.alignment` — the per-document NLL (eq. (nll)) of
every corpus, their Jensen–Shannon divergences to the pretraining and post-training references (the
divergence that bounds a C's bias, eq. (jsd-bound); the paper's Fig. 11b) and the coverage of each
domain by each C's top eigenspace (Fig. 7) — as the paper-style JSD table (:func:`jsd_wide`), the
chapter's ``summary.json`` headline (:func:`headline`) and its closing paragraph (:func:`findings`); the
mean NLL of every corpus with its Student-t interval (:func:`nll_summary`).

:func:`claims` judges the JSD ordering as the chapter's hierarchy (:data:`HIERARCHY`: the primary claim
at α, the others gatekept behind it with Holm among them, :func:`moir_lib.chapters.verdicts.judge`), a
function of the per-document NLL frame: each claim a
difference of divergences to the post-training reference with a BCa bootstrap interval over the documents
(each corpus and the reference redrawn within themselves, the reference shared by every term, the KDE
bandwidths and grid fixed from the full samples: :mod:`moir_lib.evaluation.uncertainty`). The claims are
about these corpus samples of one model: the documents vary, the generation seed and the model do not.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from moir_lib.analysis import alignment
from moir_lib.chapters.generation import OrganismSamples, organism_generations, top_domains
from moir_lib.chapters.verdicts import Claim, Hierarchy, claims_json, judge
from moir_lib.evaluation import uncertainty as unc
from moir_lib.evaluation.inference import ClaimTest

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "03_nll_jsd"


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


def nll_summary(nll: pd.DataFrame) -> pd.DataFrame:
    """Per corpus (in the table's order): ``corpus, n, mean, lo, hi`` (the mean NLL and its Student-t 95 %
    interval, ``n − 1`` df: :func:`moir_lib.evaluation.uncertainty.rate`) and the quartiles ``q25, median,
    q75``."""
    rows = []
    for corpus, g in nll.groupby("corpus", sort=False):
        est = unc.rate(g["nll"].to_numpy())
        q = g["nll"].quantile([0.25, 0.5, 0.75]).to_numpy()
        rows.append({"corpus": corpus, "n": est.n, "mean": est.value, "lo": est.lo, "hi": est.hi,
                     "q25": q[0], "median": q[1], "q75": q[2]})
    return pd.DataFrame(rows, columns=["corpus", "n", "mean", "lo", "hi", "q25", "median", "q75"])


def _claim(claim: str, measured: str, test: ClaimTest, key: str) -> Claim:
    """A claim of this chapter, its id fixed by ``key`` (the label may name what the data chose)."""
    digest = hashlib.sha256(f"{CHAPTER}: {key}".encode()).hexdigest()[:12]
    return Claim(claim, measured, test, CHAPTER, id=digest)


#: The chapter's hierarchy, fixed before any data (:func:`~moir_lib.chapters.verdicts.judge`).
HIERARCHY = Hierarchy(
    CHAPTER,
    "the Moir corpus is the closest to post-training (Fig. 11b)",
    "the chapter asks which corpus has the NLL distribution of the post-training data; Moir against the "
    "nearest other corpus, found again in every replicate, answers it in one test",
    "rand×1 samples closer to post-training than BOS samples (Fig. 3); Wikipedia farther than Moir")


def claims(nll: pd.DataFrame, jsd_tidy: pd.DataFrame, *, seed: int = 0,
           n_resamples: int = unc.N_JSD_RESAMPLES) -> list[Claim]:
    """The JSD ordering of Fig. 11b and Fig. 3 as the chapter's hierarchy (:data:`HIERARCHY`, the first
    claim the primary; without other corpora the first of the others takes its place): Moir closer to
    post-training
    than the nearest other corpus (found again in every resample,
    :func:`~moir_lib.evaluation.uncertainty.jsd_nearest_claim`), closer than Moir-bos, and Wiki farther
    than Moir (:func:`~moir_lib.evaluation.uncertainty.jsd_claim`), each a difference of divergences with
    its BCa interval over ``n_resamples`` bootstrap replicates of the documents (at least
    :data:`~moir_lib.evaluation.uncertainty.N_JSD_RESAMPLES`). ``nll``: per-document NLLs
    (``corpus``, ``nll``); ``jsd_tidy``: :func:`moir_lib.analysis.alignment.jsd`, which names the nearest
    other corpus of the point estimates in the label."""
    if n_resamples < unc.N_JSD_RESAMPLES:
        raise ValueError(f"a Jensen–Shannon claim needs at least {unc.N_JSD_RESAMPLES} bootstrap "
                         f"replicates (jsd_resamples), got {n_resamples}: with fewer its BCa limits rest on "
                         "a handful of replicates")
    docs = {c: g["nll"].to_numpy() for c, g in nll.groupby("corpus", sort=False)}
    ref = docs.get("post-training")
    if ref is None or "moir" not in docs:
        return []
    others = [c for c in docs if c not in (*alignment.REFERENCES, "moir")]
    nearest = next((c for c in _order(jsd_tidy, "post-training") if c != "moir"), None)
    out = []
    if others:
        out.append(_claim(
            "the Moir corpus is the closest to post-training (Fig. 11b)",
            f"JSD to post-training, moir − the nearest other corpus (here {nearest})",
            unc.jsd_nearest_claim(docs["moir"], [docs[c] for c in others], ref, seed=seed,
                                  n_resamples=n_resamples), "moir - nearest"))
    if "moir-bos" in docs:
        out.append(_claim(
            "rand×1 samples are closer to post-training than BOS samples (Fig. 3)",
            "JSD to post-training, moir − moir-bos",
            unc.jsd_claim(docs["moir"], docs["moir-bos"], ref, direction=-1, seed=seed,
                          n_resamples=n_resamples),
            "moir - moir-bos"))
    if "wiki" in docs:
        out.append(_claim(
            "Wikipedia is farther from post-training than Moir (the paper: 3.1×)",
            "JSD to post-training, wiki − moir",
            unc.jsd_claim(docs["wiki"], docs["moir"], ref, direction=1, seed=seed, n_resamples=n_resamples),
            "wiki - moir"))
    return judge(out[0], out[1:]) if out else []


def _order(table: pd.DataFrame, reference: str) -> list[str]:
    return table[table["reference"] == reference].sort_values("jsd")["corpus"].tolist()


def headline(jsd_tidy: pd.DataFrame, coverage: pd.DataFrame, summary: pd.DataFrame,
             angles: pd.DataFrame, judged: Sequence[Claim] = ()) -> dict[str, Any]:
    """The chapter's ``summary.json`` headline: the key orderings and numbers (the JSD and coverage tables
    go into the summary beside it, :func:`moir_lib.results.write_results`' ``summary_tables``).

    ``post_order`` / ``pre_order``: corpora by Jensen–Shannon divergence to each reference, closest
    first; ``moir_closest_to_post``, ``moir_closer_than_bos_post`` (what the point estimates order; the
    claims judge it), ``wiki_over_moir_post`` (the paper: 3.1); ``coverage_mean`` (per C, over domains and
    layers), ``moir_over_wiki_domains`` (domains where C_Moir covers more than C_Wiki), ``coverage_best`` (per
    domain, the C that covers it most), ``effective_rank`` (per C, mean over layers),
    ``angle_moir_wiki_deg`` / ``angle_moir_oracle_deg`` (mean principal angle); ``claims``: the
    ordering's claims with their intervals and verdicts (``judged``: :func:`claims`).
    """
    post = _order(jsd_tidy, "post-training")
    pre = _order(jsd_tidy, "pretraining")
    val = jsd_tidy.set_index(["corpus", "reference"])["jsd"]
    cov = alignment.coverage_mean(coverage)
    rank = summary.groupby("name", sort=False)["effective_rank"].mean()
    ang = alignment.angle_summary(angles)

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
        "claims": claims_json(judged, CHAPTER),
    }
    return out


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def findings(head: Mapping[str, Any], mixes: pd.DataFrame | None = None, model_name: str = "pocket",
             judged: Sequence[Claim] = ()) -> str:
    """The closing paragraph, from the measured numbers: which corpus is closest to each reference (point
    estimates), what the samples are made of, the paper's ordering claims with the verdicts of their family
    (``judged``: :func:`claims`), and what the coverage and effective ranks say about the C's (Fig. 7). No
    verdict is read off a point estimate: without judged claims the ordering is only described."""
    post, pre = head["post_order"], head["pre_order"]
    out = [
        f"**Closest to post-training** (point estimates): {', '.join(f'`{c}`' for c in post)} "
        f"(Jensen–Shannon divergence, closest first; the paper: moir, code, moir-bos, wiki, math, web). "
        f"**Closest to the pretraining mixture:** {', '.join(f'`{c}`' for c in pre)} (the paper: web, wiki, "
        f"code, moir, math, moir-bos).",
        f"Moir's divergence to post-training is {_f(head['moir_post_jsd'])}, Moir-bos's "
        f"{_f(head['bos_post_jsd'])}, wiki's {_f(head['wiki_post_jsd'])}"
        + (f" ({head['wiki_over_moir_post']:.1f}× Moir's; the paper: 3.1×)" if head.get("wiki_over_moir_post")
           else "") + ".",
    ]
    if mixes is not None and len(mixes):
        by = mixes.set_index(["strategy", "domain"])["share"]
        parts, chats = [], []
        for name, strategy in alignment.SELFGEN.items():
            if strategy in mixes["strategy"].values:
                chats.append(float(by.get((strategy, "chat"), 0.0)))
                parts.append(f"{name}: {top_domains(mixes, strategy)}")
        if parts:
            out.append("What the samples are (heuristic domains): " + "; ".join(parts) + "."
                       + (" The post-training reference is all chat, so a corpus that falls into the chat "
                          "template sits near it whatever else it covers." if max(chats) >= 0.5 else ""))
    if judged:
        out.append(f"**The paper's ordering, judged by bootstrap 95 % intervals over the documents** (the "
                   f"chapter's hierarchy of {len(judged)} claims: the first the primary, at α = 0.05, the "
                   f"others tested once it resolves, Holm-corrected among them; about these corpus samples "
                   f"of "
                   f"`{model_name}`): " + "; ".join(f"{c.claim} — {c.sentence(4)}" for c in judged) + ".")
    cov = head["coverage_mean"]
    if {"C_Moir", "C_Wiki"} <= set(cov):
        wins, n_dom = head["moir_over_wiki_domains"], len(head["coverage_best"])
        ranked = sorted(cov, key=cov.get, reverse=True)
        out.append(
            "**Coverage (Fig. 7).** Mean share of the domains' key energy inside each C's top-k eigenspace: "
            + ", ".join(f"{c} {cov[c]:.2f}" for c in ranked)
            + f". C_Moir covers more than C_Wiki on {len(wins)} of {n_dom} domains "
            + f"({', '.join(wins) or 'none'}); the best cover per domain: "
            + ", ".join(f"{d} → {c}" for d, c in head["coverage_best"].items())
            + ". These are point estimates of one estimate of each C, without an interval, so this chapter "
              "does not judge the paper's claim that C_Moir extends coverage into domains C_Wiki misses.")
    ranks = head["effective_rank"]
    if ranks:
        out.append("Effective ranks (mean over edit layers): "
                   + ", ".join(f"{c} {r:.0f}" for c, r in sorted(ranks.items(), key=lambda kv: -kv[1])) + ".")
    return "\n\n".join(out)


#: the JSD differences measured in every organism: label -> (a, b, claimed sign of JSD(a) − JSD(b))
ORGANISM_DIFFERENCES: dict[str, tuple[str, str, int]] = {"moir − moir-bos": ("moir", "moir-bos", -1),
                                                         "wiki − moir": ("wiki", "moir", 1)}


def organism_jsd(samples: OrganismSamples, *, n_docs: int = 300, n_reference: int = 300,
                 n_resamples: int = unc.N_JSD_RESAMPLES, done: Mapping[int, pd.DataFrame] | None = None
                 ) -> pd.DataFrame:
    """In each pocket organism of ``samples`` (each its own model of the recipe): the JSD to post-training
    of two corpora's NLL distributions, differenced as :data:`ORGANISM_DIFFERENCES`, with the chapter's BCa
    interval over ``n_resamples`` replicates of the documents
    (:func:`~moir_lib.evaluation.uncertainty.jsd_claim`). Organisms not in ``done`` (organism -> its
    per-document NLL table) generate their bos and rand×1 sequences (:func:`organism_generations`) and
    score ``n_docs`` documents of the pocket corpora and ``n_reference`` of each reference. The sampling
    seed seeds the documents and the intervals too. One row per organism × difference:
    ``organism, difference, value, lo, hi, side`` (the claimed sign), ``resolved`` (the interval excludes
    0)."""
    seed = samples.sampling.seed
    done = dict(done or {})
    for k, model, tokenizer, generations in organism_generations(samples, skip=done):
        corpora = alignment.nll_corpora(tokenizer, generations, n_docs=n_docs, n_reference=n_reference,
                                        seed=seed)
        done[k] = alignment.nll_table(model, tokenizer, corpora, progress=False)
    rows = []
    for k in samples.organisms:
        docs = {c: g["nll"].to_numpy() for c, g in done[k].groupby("corpus", sort=False)}
        for name, (a, b, side) in ORGANISM_DIFFERENCES.items():
            if {a, b, "post-training"} <= set(docs):
                est = unc.jsd_claim(docs[a], docs[b], docs["post-training"], direction=side, seed=seed,
                                    n_resamples=n_resamples).estimate
                rows.append({"organism": int(k), "difference": name, "value": est.value, "lo": est.lo,
                             "hi": est.hi, "side": side, "resolved": bool(est.lo > 0 or est.hi < 0)})
    return pd.DataFrame(rows, columns=["organism", "difference", "value", "lo", "hi", "side", "resolved"])


def organisms_text(per_organism: pd.DataFrame) -> str:
    """Whether the organisms agree: per difference, in how many organisms it has the paper's sign and in
    how many its interval excludes 0 on that side."""
    ks = sorted(per_organism["organism"].unique())
    if len(ks) < 2:
        return ""
    parts = []
    for name, g in per_organism.groupby("difference", sort=False):
        sign = g["value"] * g["side"] > 0
        parts.append(f"JSD {name}: the paper's sign in {int(sign.sum())} of {len(ks)} organisms, resolved on "
                     f"that side in {int((sign & g['resolved']).sum())}")
    return (f"**Across {len(ks)} organisms** (models of the same recipe with other initial weights and data "
            "order, each with its own generations and the same documents): " + "; ".join(parts) + ".")
