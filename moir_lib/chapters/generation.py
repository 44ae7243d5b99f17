"""Chapter 02, "Which seed escapes the chat template?": self-generation by seed strategy.

Presents the measurements of :mod:`moir_lib.analysis.selfgen` (Algorithm 1's samples for each seed
sequence ``s``, eq. (memoir_estimator)) against the paper's Fig. 10 (:data:`PAPER`): the shares with their
95 % intervals (:func:`shares`), the paper's claims judged as the chapter's hierarchy (:func:`claims`), its
``summary.json`` headline (:func:`headline`), its closing paragraph (:func:`findings`), the examples of
Tables 8-9 (:func:`examples`, :func:`examples_view`) and an ipywidgets browser of the samples
(:func:`explorer`; a static table in a headless run).

The claims are functions of two frames, the strategy table (:func:`moir_lib.analysis.selfgen.strategy_table`)
and the first generated token of every sequence (:func:`first_token_frame`): a share against a bound
(Wilson, the score test), two shares (Newcombe's hybrid score interval) and two top-1 shares (a bootstrap
over the sequences), :mod:`moir_lib.evaluation.uncertainty`; the primary claim at α, the others gatekept
behind it with Holm among them (:data:`HIERARCHY`, :func:`moir_lib.chapters.verdicts.judge`). They are
about these samples of one model: the sequences vary,
the generation seed and the model do not.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from moir_lib.analysis.selfgen import SamplingSettings, StrategyGeneration
from moir_lib.analysis.tokens import DOMAIN_LABELS, classify_domain, continuation
from moir_lib.chapters.verdicts import Claim, Hierarchy, claims_json, judge
from moir_lib.evaluation import uncertainty as unc

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler
    from transformers import PreTrainedTokenizerBase

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "02_generation"
#: The paper's numbers this chapter compares with (OLMo-2-7B-Instruct, appendix D.1, Fig. 10).
PAPER: dict[str, float] = {"bos_trapped": 0.52, "rand1_top1_share": 0.0066}


def _visible(text: str, width: int) -> str:
    text = text.replace("\r", "").replace("\n", " ⏎ ")
    return text if len(text) <= width else text[: width - 1] + "…"


def examples(samples: Iterable[dict[str, Any]] | StrategyGeneration,
             tokenizer: PreTrainedTokenizerBase | None = None, n: int = 10, start: int = 0,
             domain: str | None = None, width: int = 160) -> pd.DataFrame:
    """Tables 8-9 analogue: ``n`` samples (in index order from position ``start``, optionally only those
    of one ``domain``) as ``index, seed, domain, continuation``.

    ``seed`` is the seed sequence without BOS (``⟨bos⟩`` for BOS alone); ``continuation`` is the
    generated text with special tokens kept, newlines shown as ``⏎`` and cut to ``width`` characters.
    """
    if domain is not None and domain not in DOMAIN_LABELS:
        raise ValueError(f"unknown domain {domain!r}: choose one of {', '.join(DOMAIN_LABELS)}")
    recs = samples.samples if isinstance(samples, StrategyGeneration) else samples
    bos = getattr(tokenizer, "bos_token_id", None)
    rows = []
    for rec in recs:
        text = continuation(rec, tokenizer)
        label = classify_domain(text)
        if domain is not None and label != domain:
            continue
        seed_ids = [i for i in rec.get("seed_ids", []) if i != bos]
        if tokenizer is not None and seed_ids:
            seed_text = tokenizer.decode(seed_ids, skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False)
        else:
            seed_text = "⟨bos⟩" if not seed_ids else " ".join(map(str, seed_ids))
        rows.append({"index": rec.get("index"), "seed sequence": _visible(seed_text, 24), "domain": label,
                     "continuation": _visible(text, width)})
    rows = rows[start:start + n]
    return pd.DataFrame(rows, columns=["index", "seed sequence", "domain", "continuation"])


def examples_view(table: pd.DataFrame) -> Styler:
    """An examples table for display: full cell text (no pandas truncation), left-aligned, monospace."""
    return (table.style.hide(axis="index")
            .set_properties(**{"text-align": "left", "white-space": "pre-wrap"})
            .set_properties(subset=["seed sequence", "continuation"], **{"font-family": "monospace"})
            .set_table_styles([{"selector": "th", "props": [("text-align", "left")]}]))


def first_token_frame(generations: Mapping[str, StrategyGeneration]) -> pd.DataFrame:
    """The first generated token of every sequence: ``strategy, index, first_token`` (``-1`` for an empty
    continuation), the frame :func:`shares` and :func:`claims` resample."""
    return pd.DataFrame([{"strategy": name, "index": r.get("index", i),
                          "first_token": int(r["token_ids"][0]) if r["token_ids"] else -1}
                         for name, gen in generations.items() for i, r in enumerate(gen.samples)],
                        columns=["strategy", "index", "first_token"])


#: The shares :func:`shares` reports per strategy, by the strategy table's column.
SHARES: dict[str, str] = {"top1_share": "top-1 first token", "starts_with_tag": "opens with a chat tag",
                          "chat_share": "contains a chat tag"}


def _count(row: pd.Series, column: str) -> int:
    return int(round(float(row[column]) * int(row["samples"])))


def shares(table: pd.DataFrame, firsts: pd.DataFrame, *, seed: int = 0, n_resamples: int = unc.N_RESAMPLES
           ) -> pd.DataFrame:
    """Every strategy's shares with their 95 % intervals: ``strategy, share`` (:data:`SHARES`' columns),
    ``label`` (what it counts), ``value, lo, hi, n``. The chat-tag shares are rates of 0/1 outcomes (Wilson,
    :func:`~moir_lib.evaluation.uncertainty.share`); the top-1 first-token share is a maximum of shares, a
    bootstrap over the sequences (:func:`~moir_lib.evaluation.uncertainty.top_share`)."""
    tokens = {s: g["first_token"].to_numpy() for s, g in firsts.groupby("strategy", sort=False)}
    rows = []
    for _, row in table.iterrows():
        for column in SHARES:
            est = (unc.top_share(tokens.get(row["strategy"], []), seed=seed, n_resamples=n_resamples)
                   if column == "top1_share" else unc.share(_count(row, column), int(row["samples"])))
            rows.append({"strategy": row["strategy"], "share": column, "label": SHARES[column],
                         "value": est.value, "lo": est.lo, "hi": est.hi, "n": est.n})
    return pd.DataFrame(rows, columns=["strategy", "share", "label", "value", "lo", "hi", "n"])


@dataclass(frozen=True)
class OrganismSamples:
    """The generations of the pocket organisms ``organisms`` of ``profile`` (each its own model of the
    recipe, loaded on ``device``): ``n_samples`` bos and rand×1 sequences each, drawn under ``sampling``
    (whose ``seed`` also seeds the organisms' intervals) into ``<out_dir>/organism-<k>/generations``."""

    profile: str
    organisms: Sequence[int]
    n_samples: int
    sampling: SamplingSettings
    out_dir: str | os.PathLike[str]
    device: str | None = None


def organism_generations(samples: OrganismSamples, *, skip: Iterable[int] = ()
                         ) -> Iterator[tuple[int, Any, Any, dict[str, StrategyGeneration]]]:
    """``(k, model, tokenizer, generations)`` for each pocket organism ``k`` of ``samples`` not in
    ``skip``, one model loaded at a time (:func:`moir_lib.models.load` with ``organism``), its generations
    resumed where they are. A real model with organisms other than 0 is refused before anything loads
    (:func:`moir_lib.models.check_organisms`)."""
    from moir_lib import models
    from moir_lib.analysis import selfgen
    from moir_lib.experiments.labs import organism_dir
    from moir_lib.profiles import load_profile

    base = load_profile(samples.profile)
    models.check_organisms(samples.organisms, base.model)
    n = samples.n_samples
    skip = set(skip)
    for k in samples.organisms:
        if k in skip:
            continue
        model, tokenizer, _ = models.load(base.with_overrides({"organism": int(k)}), device=samples.device)
        generations = selfgen.generate(model, tokenizer, {"bos": n, "rand1": n},
                                       Path(organism_dir(samples.out_dir, int(k))) / "generations",
                                       samples.sampling, progress=False)
        yield int(k), model, tokenizer, generations


def organism_shares(samples: OrganismSamples, *,
                    done: Mapping[int, tuple[pd.DataFrame, pd.DataFrame]] | None = None) -> pd.DataFrame:
    """:func:`shares` of bos and rand×1 in each pocket organism of ``samples``, from
    :func:`organism_generations`; ``done``: organism -> ``(table, firsts)`` already measured (the chapter's
    own model). One row per organism × strategy × share."""
    from moir_lib.analysis import selfgen

    done = dict(done or {})
    for k, _, tokenizer, generations in organism_generations(samples, skip=done):
        done[k] = (selfgen.strategy_table(generations, tokenizer), first_token_frame(generations))
    frames = []
    for k in samples.organisms:
        table, firsts = done[k]
        keep = table[table["strategy"].isin(["bos", "rand1"])]
        kept = firsts[firsts["strategy"].isin(["bos", "rand1"])]
        frames.append(shares(keep, kept, seed=samples.sampling.seed).assign(organism=int(k)))
    return pd.concat(frames, ignore_index=True)


def organisms_text(per_organism: pd.DataFrame) -> str:
    """Whether the organisms agree: in how many of them rand×1's top-1 first-token share and its share of
    samples that open with a chat tag lie below BOS's with the two intervals apart (each organism alone)."""
    ks = sorted(per_organism["organism"].unique())
    if len(ks) < 2:
        return ""
    parts = []
    for share in ("top1_share", "starts_with_tag"):
        apart = below = 0
        for _, g in per_organism[per_organism["share"] == share].groupby("organism"):
            by = g.set_index("strategy")
            if {"bos", "rand1"} <= set(by.index):
                below += by.loc["rand1", "value"] < by.loc["bos", "value"]
                apart += by.loc["rand1", "hi"] < by.loc["bos", "lo"]
        parts.append(f"{SHARES[share]}: rand×1 below BOS in {below} of {len(ks)} organisms, the two 95 % "
                     f"intervals apart in {apart}")
    return (f"**Across {len(ks)} organisms** (models of the same recipe with other initial weights and data "
            f"order, {int(per_organism['n'].max())} sequences per strategy each): " + "; ".join(parts) + ".")


def _claim_id(measured: str) -> str:
    return hashlib.sha256(f"{CHAPTER}: {measured}".encode()).hexdigest()[:12]


#: The chapter's hierarchy, fixed before any data (:func:`~moir_lib.chapters.verdicts.judge`).
HIERARCHY = Hierarchy(
    CHAPTER,
    "one random token breaks the collapse: rand×1 samples open with a chat tag less often than BOS samples "
    "(Fig. 10)",
    "the chapter asks whether a single random token after BOS breaks the chat-template attractor; the share "
    "of samples opening with a chat tag under the two seeds is that question measured directly",
    "BOS samples mostly open with a chat tag (against ½); rand×1's most frequent first token is rarer than "
    "BOS's")


def claims(table: pd.DataFrame, firsts: pd.DataFrame, *, seed: int = 0, n_resamples: int = unc.N_RESAMPLES
           ) -> list[Claim]:
    """Fig. 10's claims as the chapter's hierarchy (:data:`HIERARCHY`), judged: rand×1 samples open with a
    chat tag less often than BOS samples (two independent shares; the primary claim, returned first), BOS
    samples mostly open with a chat tag (their share against ½) and rand×1's most frequent first token is
    rarer than BOS's (two top-1 shares, sequences redrawn). ``table``:
    :func:`moir_lib.analysis.selfgen.strategy_table` (with ``bos`` and ``rand1``); ``firsts``:
    :func:`first_token_frame`."""
    by = table.set_index("strategy")
    if not {"bos", "rand1"} <= set(by.index):
        raise ValueError("the claims compare bos with rand1: add the missing strategy to the strategies")
    bos, rand1 = by.loc["bos"], by.loc["rand1"]
    n_bos, n_rand1 = int(bos["samples"]), int(rand1["samples"])
    tokens = {s: g["first_token"].to_numpy() for s, g in firsts.groupby("strategy", sort=False)}
    stated = [
        ("BOS-seeded samples fall into the chat template: over half open with a chat tag (Fig. 10: over "
         "52 % with `<|assistant|>`)", "share of BOS samples opening with a chat tag − ½",
         unc.share_claim(_count(bos, "starts_with_tag"), n_bos, 0.5)),
        ("one random token breaks the collapse: rand×1 samples open with a chat tag less often than BOS "
         "samples (Fig. 10)", "share opening with a chat tag, rand×1 − BOS",
         unc.share_difference_claim(_count(rand1, "starts_with_tag"), n_rand1, _count(bos, "starts_with_tag"),
                                    n_bos, direction=-1)),
        ("rand×1 openings are diverse: their most frequent first token is rarer than BOS's (Fig. 10: 0.66 % "
         "against over 52 %)", "top-1 first-token share, rand×1 − BOS",
         unc.top_share_claim(tokens.get("rand1", []), tokens.get("bos", []), direction=-1, seed=seed,
                             n_resamples=n_resamples)),
    ]
    bos_half, primary, top = (Claim(claim, measured, test, CHAPTER, id=_claim_id(measured))
                              for claim, measured, test in stated)
    return judge(primary, [bos_half, top])


def headline(generations: Mapping[str, StrategyGeneration], table: pd.DataFrame, judged: Sequence[Claim] = ()
             ) -> dict[str, Any]:
    """The chapter's ``summary.json`` headline: ``bos_top1_share``, ``rand1_top1_share``,
    ``bos_chat_share``, ``rand1_chat_share`` (samples containing a chat tag), each with its standard error
    (``..._stderr``), ``tokens_generated`` (all strategies), ``tokens_per_s`` (all tokens over all
    generation time) and ``claims`` (``judged``: :func:`claims`, as
    :func:`~moir_lib.chapters.verdicts.claims_json`)."""
    by = table.set_index("strategy")
    missing = [s for s in ("bos", "rand1") if s not in by.index]
    if missing:
        raise ValueError(f"the headline compares bos with rand1: add {', '.join(missing)} to the strategies")
    tokens = sum(r.n_tokens for r in generations.values())
    timed = [r for r in generations.values() if math.isfinite(r.seconds) and r.seconds > 0]
    seconds = sum(r.seconds for r in timed)
    return {
        "bos_top1_share": float(by.loc["bos", "top1_share"]),
        "rand1_top1_share": float(by.loc["rand1", "top1_share"]),
        "bos_chat_share": float(by.loc["bos", "chat_share"]),
        "rand1_chat_share": float(by.loc["rand1", "chat_share"]),
        **{f"{s}_{m}_stderr": float(by.loc[s, f"{m}_stderr"])
           for s in ("bos", "rand1") for m in ("top1", "chat") if f"{m}_stderr" in by.columns},
        "tokens_generated": int(tokens),
        "tokens_per_s": float(sum(r.n_tokens for r in timed) / seconds) if seconds > 0 else 0.0,
        "claims": claims_json(judged, CHAPTER),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.095 or x == 0 else f"{100 * x:.1f} %"


def _concentration(ratio: float) -> str:
    """``12× less concentrated``, ``1.5× more concentrated``: BOS's top-1 share over rand×1's, in words."""
    if ratio >= 1:
        return f"{ratio:.0f}× less concentrated" if ratio >= 10 else f"{ratio:.1f}× less concentrated"
    return f"{1 / ratio:.1f}× more concentrated"


def _ci(intervals: pd.DataFrame, strategy: str, share: str) -> str:
    """`` [a %, b %]``: the 95 % interval of ``strategy``'s ``share`` in ``intervals`` (:func:`shares`);
    empty where it is undefined."""
    row = intervals[(intervals["strategy"] == strategy) & (intervals["share"] == share)]
    if row.empty or not (math.isfinite(row["lo"].iloc[0]) and math.isfinite(row["hi"].iloc[0])):
        return ""
    return f" [{_pct(float(row['lo'].iloc[0]))}, {_pct(float(row['hi'].iloc[0]))}]"


def findings(table: pd.DataFrame, mixes: pd.DataFrame, intervals: pd.DataFrame, judged: Sequence[Claim] = (),
             vocab_size: int | None = None, model_name: str = "pocket") -> str:
    """The closing paragraph, written from the measured numbers: how often BOS samples open with and contain
    a chat tag, what rand×1 and the longer random prefixes change, what the samples are about, each share
    with its 95 % interval (``intervals``: :func:`shares`) — and the paper's Fig. 10 claims with the verdicts
    of their family (``judged``: :func:`claims`). No verdict is read off a point estimate."""
    by = table.set_index("strategy")
    bos, rand1 = by.loc["bos"], by.loc["rand1"]
    ratio = bos["top1_share"] / rand1["top1_share"] if rand1["top1_share"] > 0 else float("inf")
    top_token = bos["top1_token"].strip() or repr(bos["top1_token"])

    def ci(strategy: str, share: str) -> str:
        return _ci(intervals, strategy, share)

    out = [
        f"**BOS.** {_pct(bos['starts_with_tag'])}{ci('bos', 'starts_with_tag')} of the {int(bos['samples'])} "
        f"BOS-seeded samples of `{model_name}` open with a chat tag and {_pct(bos['chat_share'])}"
        f"{ci('bos', 'chat_share')} contain one; the most frequent first token, `{top_token}`, opens "
        f"{_pct(bos['top1_share'])}{ci('bos', 'top1_share')} of them (effectively "
        f"{bos['first_token_perplexity']:.1f} distinct openings). The paper found over "
        f"{_pct(PAPER['bos_trapped'])} of OLMo-2-7B-Instruct's BOS samples trapped by `<|assistant|>`.",
        f"**rand×1.** One uniformly random token after BOS leaves {_pct(rand1['chat_share'])}"
        f"{ci('rand1', 'chat_share')} of the samples with a chat tag; the most frequent first token opens "
        f"{_pct(rand1['top1_share'])}{ci('rand1', 'top1_share')} of them "
        f"({rand1['first_token_perplexity']:.1f} effective openings), {_concentration(ratio)} than BOS (the "
        f"paper: 0.66 %, about 80× less than BOS's 52 %).",
    ]
    if vocab_size and rand1["top1_share"] > PAPER["rand1_top1_share"]:
        out.append(f"An absolute share near the paper's 0.66 % is out of reach here: the vocabulary has "
                   f"{vocab_size:,} tokens and the rand×1 generation {int(rand1['samples'])} samples, so "
                   f"compare the ratio, not the share.")
    longer = [s for s in by.index if s.startswith("rand") and s != "rand1"]
    if longer:
        parts = ", ".join(f"{s} {_pct(by.loc[s, 'top1_share'])} / {_pct(by.loc[s, 'chat_share'])}"
                          for s in longer)
        out.append(f"Longer random prefixes (top first-token share / chat share): {parts}.")
    out.append(f"By domain (a heuristic classifier of the continuations): BOS samples are "
               f"{top_domains(mixes, 'bos')}; rand×1 samples are {top_domains(mixes, 'rand1')}.")
    if judged:
        out.append(f"**The paper's Fig. 10, judged by 95 % intervals** (the chapter's hierarchy of "
                   f"{len(judged)} claims: the first the primary, at α = 0.05, the others tested once it "
                   f"resolves, Holm-corrected among them; about these samples of one model): "
                   + "; ".join(f"{c.claim} — {c.sentence()}" for c in judged) + ".")
    return "\n\n".join(out)


def top_domains(mixes: pd.DataFrame, strategy: str, n: int = 3) -> str:
    """``"chat 31 %, wiki 25 %, code 17 %"``: the ``n`` largest domains of ``strategy`` in ``mixes``
    (:func:`domain_mixes`)."""
    g = mixes[(mixes["strategy"] == strategy) & (mixes["share"] > 0)]
    g = g.sort_values("share", ascending=False, kind="stable").head(n)
    return ", ".join(f"{d} {_pct(float(x))}" for d, x in zip(g["domain"], g["share"], strict=True)) or "none"


def explorer(generations: Mapping[str, StrategyGeneration],
             tokenizer: PreTrainedTokenizerBase | None = None, n: int = 15, width: int = 200) -> Any:
    """An ipywidgets browser for JupyterLab: seed strategy and domain dropdowns, a start position, and the
    matching samples as a table; a headless run (the book) shows the first table
    (:func:`moir_lib.widgets.explorer`)."""
    import ipywidgets as w

    from moir_lib.widgets import explorer as widget_explorer

    names = list(generations)
    strategy = w.Dropdown(options=names, value="rand1" if "rand1" in names else names[0],
                          description="strategy")
    domain = w.Dropdown(options=["all", *DOMAIN_LABELS], value="all", description="domain")
    start = w.BoundedIntText(value=0, min=0, max=max(len(gen.samples) for gen in generations.values()),
                             step=n, description="from")

    def table() -> Any:
        found = examples(generations[strategy.value], tokenizer, n=n, start=start.value,
                         domain=None if domain.value == "all" else domain.value, width=width)
        return examples_view(found) if len(found) else "no samples match"

    return widget_explorer([[strategy, domain, start]], table)
