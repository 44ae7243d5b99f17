"""Figures of the self-generation chapter (``notebooks/02_generation``, Fig. 10, Tables 8-9), fed by
:mod:`moir_lib.analysis.selfgen`: first tokens and words per seed strategy, shares, domain mixes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from moir_lib.plots.style import PALETTE, _fig, _require, _stderr_whiskers, _subplots

#: Seed strategies: BOS orange, rand×1 Moir red, longer random prefixes in paler reds (the paper's Table 2).
STRATEGY_COLOURS: dict[str, str] = {"bos": PALETTE["bos"], "rand1": PALETTE["moir"], "rand2": "#E08A7E",
                                    "rand3": "#EAAEA4", "rand4": "#F2CFC9"}


#: Domains and corpora beyond the four palette roles (web, code, math, chat, prose, other).
DOMAIN_COLOURS: dict[str, str] = {"wiki": PALETTE["wiki"], "web": "#8E6BB8", "prose": "#8E6BB8",
                                  "code": "#1FA6B8", "math": "#8C5A3C", "chat": "#3B3B3B",
                                  "post-training": "#3B3B3B", "other": "#C9C9C9"}


def _strategy_colour(strategy: str) -> str:
    return STRATEGY_COLOURS.get(strategy, PALETTE["neutral"])


def _token_label(token: object) -> str:
    """A token or word as a visible label: newlines ⏎, tabs ⇥, leading/trailing spaces ␣, empty ∅."""
    text = str(token)
    if text == "":
        return "∅"
    text = text.replace("\n", "⏎").replace("\t", "⇥")
    stripped = text.strip(" ")
    lead, trail = len(text) - len(text.lstrip(" ")), len(text) - len(text.rstrip(" "))
    return "␣" * lead + stripped + "␣" * trail if stripped else "␣" * len(text)


def first_token_bars(first_tokens: pd.DataFrame, strategies: Sequence[str] = ("bos", "rand1"),
                     k: int = 10, title: str | None = None) -> go.Figure:
    """Fig. 10 analogue: the ``k`` most frequent first generated tokens per seed strategy, one panel each.

    ``first_tokens``: ``strategy, rank, token, share`` (:func:`moir_lib.analysis.selfgen.first_tokens`).
    Bars are shares of the strategy's samples with their 95 % intervals (``stderr`` column, when given);
    the x axes are shared, so a collapse shows as one long bar.
    """
    _require(first_tokens, ["strategy", "rank", "token", "share"], "first_token_bars")
    shown = [s for s in strategies if s in set(first_tokens["strategy"])]
    if not shown:
        raise ValueError(f"first_token_bars: none of {list(strategies)} in the table")
    fig = _subplots(1, len(shown), title or "First generated token: share of samples (Fig. 10)",
                    subplot_titles=shown, shared_xaxes=True, horizontal_spacing=0.12)
    for i, strategy in enumerate(shown, 1):
        df = first_tokens[first_tokens["strategy"] == strategy].sort_values("rank").head(k)
        fig.add_bar(x=df["share"], y=[f"{r}. {_token_label(t)}" for r, t in zip(df["rank"], df["token"],
                                                                                strict=True)],
                    error_x=_stderr_whiskers(df.get("stderr")),
                    orientation="h", marker_color=_strategy_colour(strategy), name=strategy, showlegend=False,
                    hovertemplate="%{y}: %{x:.1%}<extra>" + strategy + "</extra>", row=1, col=i)
        fig.update_yaxes(autorange="reversed", row=1, col=i)
        fig.update_xaxes(tickformat=".0%", title_text="share of samples", row=1, col=i)
    fig.update_layout(height=max(320, 60 + 26 * k))
    return fig


def first_words_bars(first_words: pd.DataFrame, strategies: Sequence[str] = ("bos", "rand1"), k: int = 5,
                     title: str | None = None) -> go.Figure:
    """Fig. 10 analogue: the top-``k`` words at each of the first generated positions, one row of panels
    per seed strategy (``first_words``: ``strategy, position, rank, word, share``)."""
    _require(first_words, ["strategy", "position", "rank", "word", "share"], "first_words_bars")
    shown = [s for s in strategies if s in set(first_words["strategy"])]
    if not shown:
        raise ValueError(f"first_words_bars: none of {list(strategies)} in the table")
    positions = sorted(first_words["position"].unique())
    fig = _subplots(len(shown), len(positions), title or "First generated words by position (Fig. 10)",
                    subplot_titles=[f"{s}: word {p}" for s in shown for p in positions], shared_xaxes=True,
                    horizontal_spacing=0.08, vertical_spacing=0.12)
    for r, strategy in enumerate(shown, 1):
        for c, pos in enumerate(positions, 1):
            df = first_words.query("strategy == @strategy and position == @pos").sort_values("rank").head(k)
            fig.add_bar(x=df["share"], y=[_token_label(w) for w in df["word"]], orientation="h",
                        marker_color=_strategy_colour(strategy), showlegend=False,
                        hovertemplate="%{y}: %{x:.1%}<extra>" + f"{strategy}, word {pos}" + "</extra>",
                        row=r, col=c)
            fig.update_yaxes(autorange="reversed", row=r, col=c)
            fig.update_xaxes(tickformat=".0%", row=r, col=c)
    fig.update_layout(height=max(360, 80 + 40 * k * len(shown)))
    return fig


def seed_strategy_shares(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Collapse by seed strategy: the top-1 first-token share and the shares of samples that open with /
    contain a chat tag, one bar per strategy (``table``: :func:`moir_lib.analysis.selfgen.strategy_table`),
    with 95 % whiskers where the table has the shares' standard errors."""
    _require(table, ["strategy", "top1_share", "starts_with_tag", "chat_share"], "seed_strategy_shares")
    metrics = {"top1_share": "top-1 first token", "starts_with_tag": "opens with a chat tag",
               "chat_share": "contains a chat tag"}
    fig = _fig(title or "How much of each seed strategy is trapped", "", "share of samples",
               barmode="group")
    errors = {"top1_share": "top1_stderr", "starts_with_tag": "starts_stderr", "chat_share": "chat_stderr"}
    for _, row in table.iterrows():
        stderr = pd.Series([row.get(errors[m], np.nan) for m in metrics], dtype=float)
        fig.add_bar(x=list(metrics.values()), y=[row[m] for m in metrics], name=row["strategy"],
                    marker_color=_strategy_colour(row["strategy"]), error_y=_stderr_whiskers(stderr),
                    hovertemplate="%{x}: %{y:.1%}<extra>" + row["strategy"] + "</extra>")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    return fig


def domain_mix_bars(mixes: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Domain mix of each strategy's samples as stacked horizontal bars (``mixes``: ``strategy, domain,
    share``; :func:`moir_lib.analysis.selfgen.domain_mixes`)."""
    _require(mixes, ["strategy", "domain", "share"], "domain_mix_bars")
    strategies = list(dict.fromkeys(mixes["strategy"]))
    fig = _fig(title or "What the samples are about (heuristic domain classifier)", "share of samples", "",
               barmode="stack")
    for domain in dict.fromkeys(mixes["domain"]):
        df = mixes[mixes["domain"] == domain].set_index("strategy").reindex(strategies)
        fig.add_bar(y=strategies, x=df["share"], name=domain, orientation="h",
                    marker_color=DOMAIN_COLOURS.get(domain, PALETTE["neutral"]),
                    hovertemplate="%{y}: %{x:.1%}<extra>" + domain + "</extra>")
    fig.update_xaxes(tickformat=".0%", range=[0, 1])
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=max(300, 120 + 45 * len(strategies)),
                      legend={"orientation": "h", "x": 0, "y": -0.2})
    return fig


def organism_shares(per_organism: pd.DataFrame, title: str | None = None) -> go.Figure:
    """BOS against rand×1 in each pocket organism: the top-1 first-token share (left) and the share of
    samples that open with a chat tag (right), each with its 95 % interval (``per_organism``:
    :func:`moir_lib.chapters.generation.organism_shares`)."""
    _require(per_organism, ["organism", "strategy", "share", "value", "lo", "hi"], "organism_shares")
    panels = {"top1_share": "top-1 first token", "starts_with_tag": "opens with a chat tag"}
    fig = _subplots(1, 2, title or "Every organism: BOS against rand×1", subplot_titles=list(panels.values()))
    for col, share in enumerate(panels, start=1):
        for strategy in ("bos", "rand1"):
            g = per_organism[(per_organism["share"] == share) & (per_organism["strategy"] == strategy)]
            fig.add_scatter(x=[f"organism {k}" for k in g["organism"]], y=g["value"], mode="markers",
                            name=strategy, legendgroup=strategy, showlegend=col == 1,
                            marker={"color": _strategy_colour(strategy), "size": 10},
                            error_y={"type": "data", "symmetric": False, "array": g["hi"] - g["value"],
                                     "arrayminus": g["value"] - g["lo"]},
                            hovertemplate="%{x}: %{y:.1%}<extra>" + strategy + "</extra>", row=1, col=col)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    return fig
