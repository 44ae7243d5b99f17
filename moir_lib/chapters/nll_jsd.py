"""Chapter 03, "Which corpus looks like the deployed model?": NLL, Jensen–Shannon and what C covers.

Presents the measurements of :mod:`moir_lib.analysis.alignment` — the per-document NLL (eq. (nll)) of
every corpus, their Jensen–Shannon divergences to the pretraining and post-training references (the
divergence that bounds a C's bias, eq. (jsd-bound); the paper's Fig. 11b) and the coverage of each
domain by each C's top eigenspace (Fig. 7) — as the paper-style JSD table (:func:`jsd_wide`), the
chapter's ``summary.json`` headline (:func:`headline`) and its closing paragraph (:func:`findings`).
:func:`claims` judges the JSD ordering by paired bootstrap intervals over the documents (each corpus and
the reference resampled within themselves, the reference shared by both terms of a difference).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from moir_lib.analysis import alignment
from moir_lib.chapters.generation import top_domains
from moir_lib.chapters.verdicts import Claim, claim_records

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


def claims(nll: pd.DataFrame, jsd_tidy: pd.DataFrame, *, seed: int = 0, n_resamples: int = 200
           ) -> list[Claim]:
    """The JSD ordering of Fig. 11b as claims, each a difference of divergences to the post-training
    reference with a bootstrap 95 % interval over documents
    (:func:`moir_lib.evaluation.uncertainty.jsd_difference`): Moir closer than its nearest rival, closer
    than Moir-bos (the paper's Fig. 3), and Wiki farther than Moir. ``nll``: per-document NLLs
    (``corpus``, ``nll``); ``jsd_tidy``: :func:`moir_lib.analysis.alignment.jsd`."""
    from moir_lib.evaluation import uncertainty as unc

    docs = {c: g["nll"].to_numpy() for c, g in nll.groupby("corpus", sort=False)}
    ref = docs.get("post-training")
    order = _order(jsd_tidy, "post-training")
    if ref is None or "moir" not in docs:
        return []

    def diff(a: str, b: str) -> unc.Estimate:
        return unc.jsd_difference(docs[a], docs[b], ref, seed=seed, n_resamples=n_resamples)

    out = []
    rival = next((c for c in order if c != "moir"), None)
    if rival is not None:
        out.append(Claim("the Moir corpus is the closest to post-training (Fig. 11b)",
                         f"JSD to post-training, moir − {rival} (nearest rival)", diff("moir", rival), -1,
                         True, CHAPTER))
    if "moir-bos" in docs and rival != "moir-bos":
        out.append(Claim("rand×1 samples are closer to post-training than BOS samples (Fig. 3)",
                         "JSD to post-training, moir − moir-bos", diff("moir", "moir-bos"), -1, True,
                         CHAPTER))
    if "wiki" in docs:
        out.append(Claim("Wikipedia is farther from post-training than Moir (the paper: 3.1×)",
                         "JSD to post-training, wiki − moir", diff("wiki", "moir"), +1, True, CHAPTER))
    return out


def _order(table: pd.DataFrame, reference: str) -> list[str]:
    return table[table["reference"] == reference].sort_values("jsd")["corpus"].tolist()


def headline(jsd_tidy: pd.DataFrame, coverage: pd.DataFrame, summary: pd.DataFrame,
             angles: pd.DataFrame, judged: Sequence[Claim] = ()) -> dict[str, Any]:
    """The chapter's ``summary.json`` headline: the key orderings and numbers (the JSD and coverage tables
    go into the summary beside it, :func:`moir_lib.results.write_results`' ``records``).

    ``post_order`` / ``pre_order``: corpora by Jensen–Shannon divergence to each reference, closest
    first; ``moir_closest_to_post`` (the paper's claim), ``moir_closer_than_bos_post``,
    ``wiki_over_moir_post`` (the paper: 3.1); ``coverage_mean`` (per C, over domains and layers),
    ``moir_over_wiki_domains`` (domains where C_Moir covers more than C_Wiki), ``coverage_best`` (per
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
        "claims": claim_records(judged, CHAPTER),
    }
    return out


def _claim_sentence(c: Mapping[str, Any]) -> str:
    """One claim record as text: what is measured, the difference, its interval, the verdict."""
    if c.get("value") is None or c.get("lo") is None:
        return f"{c['measured']}: {c['verdict']}"
    text = f"{c['measured']}: {c['value']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}], {c['verdict']}"
    return text + (f" (≈{c['n_to_resolve']} documents would resolve it)" if c.get("n_to_resolve") else "")


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
        parts, chats = [], []
        for name, strategy in alignment.SELFGEN.items():
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
    if head.get("claims"):
        out.append("**Judged by bootstrap intervals over the documents (95 %).** "
                   + "; ".join(_claim_sentence(c) for c in head["claims"]) + ".")
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

