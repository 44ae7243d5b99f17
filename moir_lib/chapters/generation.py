"""Chapter 02, "Which seed escapes the chat template?": self-generation by seed strategy.

Presents the measurements of :mod:`moir_lib.analysis.selfgen` (Algorithm 1's samples for each seed
sequence ``s``, eq. (memoir_estimator)) against the paper's Fig. 10 (:data:`PAPER`): the chapter's
``summary.json`` headline (:func:`headline`), its closing paragraph (:func:`findings`), the examples of
Tables 8-9 (:func:`examples`, :func:`examples_view`) and an ipywidgets browser of the samples
(:func:`explorer`; a static table in a headless run).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from moir_lib.analysis.selfgen import StrategyRun
from moir_lib.analysis.tokens import DOMAIN_LABELS, classify_domain, continuation
from moir_lib.evaluation.uncertainty import Z95

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


def examples(records: Iterable[dict[str, Any]] | StrategyRun,
             tokenizer: PreTrainedTokenizerBase | None = None, n: int = 10, start: int = 0,
             domain: str | None = None, width: int = 160) -> pd.DataFrame:
    """Tables 8-9 analogue: ``n`` samples (in index order from position ``start``, optionally only those
    of one ``domain``) as ``index, seed, domain, continuation``.

    ``seed`` is the seed sequence without BOS (``⟨bos⟩`` for BOS alone); ``continuation`` is the
    generated text with special tokens kept, newlines shown as ``⏎`` and cut to ``width`` characters.
    """
    if domain is not None and domain not in DOMAIN_LABELS:
        raise ValueError(f"unknown domain {domain!r}: choose one of {', '.join(DOMAIN_LABELS)}")
    recs = records.records if isinstance(records, StrategyRun) else records
    bos = getattr(tokenizer, "bos_token_id", None)
    rows = []
    for rec in recs:
        text = continuation(rec, tokenizer)
        label = classify_domain(text)
        if domain is not None and label != domain:
            continue
        seed_ids = [i for i in rec.get("seed_ids", []) if i != bos]
        if tokenizer is not None and seed_ids:
            seed = tokenizer.decode(seed_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        else:
            seed = "⟨bos⟩" if not seed_ids else " ".join(map(str, seed_ids))
        rows.append({"index": rec.get("index"), "seed": _visible(seed, 24), "domain": label,
                     "continuation": _visible(text, width)})
    rows = rows[start:start + n]
    return pd.DataFrame(rows, columns=["index", "seed", "domain", "continuation"])


def examples_view(table: pd.DataFrame) -> Styler:
    """An examples table for display: full cell text (no pandas truncation), left-aligned, monospace."""
    return (table.style.hide(axis="index")
            .set_properties(**{"text-align": "left", "white-space": "pre-wrap"})
            .set_properties(subset=["seed", "continuation"], **{"font-family": "monospace"})
            .set_table_styles([{"selector": "th", "props": [("text-align", "left")]}]))


def headline(runs: Mapping[str, StrategyRun], table: pd.DataFrame) -> dict[str, float]:
    """The chapter's ``summary.json`` headline: ``bos_top1_share``, ``rand1_top1_share``,
    ``bos_chat_share``, ``rand1_chat_share`` (samples containing a chat tag), each with its standard error
    (``..._stderr``), ``tokens_generated`` (all strategies) and ``tokens_per_s`` (all tokens over all
    generation time)."""
    by = table.set_index("strategy")
    missing = [s for s in ("bos", "rand1") if s not in by.index]
    if missing:
        raise ValueError(f"the headline compares bos with rand1: add {', '.join(missing)} to the strategies")
    tokens = sum(r.n_tokens for r in runs.values())
    timed = [r for r in runs.values() if math.isfinite(r.seconds) and r.seconds > 0]
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
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.095 or x == 0 else f"{100 * x:.1f} %"


def _pm(row: pd.Series, share: str) -> str:
    """`` ± x %``: half the 95 % interval of ``row``'s ``share`` (``top1``, ``chat``); empty without it."""
    se = row.get(f"{share}_stderr", math.nan)
    return f" ± {_pct(Z95 * float(se))}" if math.isfinite(float(se)) else ""


def findings(table: pd.DataFrame, mixes: pd.DataFrame, vocab_size: int | None = None,
             model_name: str = "pocket") -> str:
    """The closing paragraph, written from the measured numbers: is BOS trapped in the chat template, does
    rand×1 escape it, how do longer random prefixes and the domains compare — and whether that
    reproduces the paper's Fig. 10 (BOS >52 % trapped, rand×1 top first token 0.66 %).

    The verdict needs all three: BOS samples mostly open with and contain a chat tag (≥ 50 %), rand×1
    at most halves the chat share, and rand×1's top first-token share is at least 3× below BOS's.
    """
    world = "the pocket world" if model_name.startswith("pocket") else model_name
    by = table.set_index("strategy")
    bos, rand1 = by.loc["bos"], by.loc["rand1"]
    trapped = bos["chat_share"] >= 0.5 and bos["starts_with_tag"] >= 0.5
    escaped = rand1["chat_share"] <= bos["chat_share"] / 2
    diverse = rand1["top1_share"] * 3 <= bos["top1_share"]
    ratio = bos["top1_share"] / rand1["top1_share"] if rand1["top1_share"] > 0 else float("inf")
    top_token = bos["top1_token"].strip() or repr(bos["top1_token"])
    out = [
        f"**BOS.** {_pct(bos['starts_with_tag'])} of the {int(bos['samples'])} BOS-seeded samples of "
        f"`{model_name}` open with a chat tag and {_pct(bos['chat_share'])}{_pm(bos, 'chat')} contain "
        f"one; the most frequent first token, `{top_token}`, opens "
        f"{_pct(bos['top1_share'])}{_pm(bos, 'top1')} of them "
        f"(effectively {bos['first_token_perplexity']:.1f} distinct openings). The paper found over "
        f"{_pct(PAPER['bos_trapped'])} of OLMo-2-7B-Instruct's BOS samples trapped by `<|assistant|>`.",
        f"**rand×1.** One uniformly random token after BOS leaves "
        f"{_pct(rand1['chat_share'])}{_pm(rand1, 'chat')} of the samples with a chat tag; the most "
        f"frequent first token opens {_pct(rand1['top1_share'])}{_pm(rand1, 'top1')} of them "
        f"({rand1['first_token_perplexity']:.1f} effective openings), {ratio:.0f}× less concentrated than "
        f"BOS (the paper: 0.66 %, about 80× less than BOS's 52 %).",
    ]
    if vocab_size and rand1["top1_share"] > PAPER["rand1_top1_share"]:
        out.append(f"An absolute share near the paper's 0.66 % is out of reach here: the vocabulary has "
                   f"{vocab_size:,} tokens and the run {int(rand1['samples'])} samples, so compare the "
                   f"ratio, not the share.")
    longer = [s for s in by.index if s.startswith("rand") and s != "rand1"]
    if longer:
        parts = ", ".join(f"{s} {_pct(by.loc[s, 'top1_share'])} / {_pct(by.loc[s, 'chat_share'])}"
                          for s in longer)
        out.append(f"Longer random prefixes (top first-token share / chat share): {parts}.")
    out.append(f"By domain (a heuristic classifier of the continuations): BOS samples are "
               f"{top_domains(mixes, 'bos')}; rand×1 samples are {top_domains(mixes, 'rand1')}.")
    if trapped and escaped and diverse:
        verdict = (f"**Verdict: {world} reproduces the paper's Fig. 10** — BOS seeding collapses onto the "
                   f"chat template and a single random token breaks the collapse.")
    else:
        failed = [why for ok, why in ((trapped, "BOS samples are not mostly trapped in the chat template"),
                                      (escaped, "rand×1 does not halve the chat share"),
                                      (diverse, "rand×1's top first token is not 3× rarer than BOS's"))
                  if not ok]
        verdict = (f"**Verdict: {world} does not reproduce the paper's Fig. 10 here**: "
                   + "; ".join(failed) + ".")
    out.append(verdict)
    return "\n\n".join(out)


def top_domains(mixes: pd.DataFrame, strategy: str, n: int = 3) -> str:
    """``"chat 31 %, wiki 25 %, code 17 %"``: the ``n`` largest domains of ``strategy`` in ``mixes``
    (:func:`domain_mixes`)."""
    g = mixes[(mixes["strategy"] == strategy) & (mixes["share"] > 0)]
    g = g.sort_values("share", ascending=False, kind="stable").head(n)
    return ", ".join(f"{d} {_pct(float(x))}" for d, x in zip(g["domain"], g["share"], strict=True)) or "none"


def explorer(runs: Mapping[str, StrategyRun], tokenizer: PreTrainedTokenizerBase | None = None, n: int = 15,
             width: int = 200) -> Any:
    """An ipywidgets browser for JupyterLab: seed strategy and domain dropdowns, a start position, and the
    matching samples as a table; a headless run (the book) shows the first table
    (:func:`moir_lib.widgets.explorer`)."""
    import ipywidgets as w

    from moir_lib.widgets import explorer as widget_explorer

    names = list(runs)
    strategy = w.Dropdown(options=names, value="rand1" if "rand1" in names else names[0], description="seed")
    domain = w.Dropdown(options=["all", *DOMAIN_LABELS], value="all", description="domain")
    start = w.BoundedIntText(value=0, min=0, max=max(len(r.records) for r in runs.values()), step=n,
                             description="from")

    def table() -> Any:
        found = examples(runs[strategy.value], tokenizer, n=n, start=start.value,
                         domain=None if domain.value == "all" else domain.value, width=width)
        return examples_view(found) if len(found) else "no samples match"

    return widget_explorer([[strategy, domain, start]], table)
