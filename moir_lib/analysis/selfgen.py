"""Self-generation by seed strategy: the tables behind the chapter "Self-generation" (02).

Section 4 of the paper ("Self-generation strategy", Table 2) and appendix D.1-D.2 compare the seed
sequence ``s`` of Algorithm 1: BOS alone (Moir-bos) against ``k`` uniformly random vocabulary tokens
after BOS (rand×1 … rand×4; rand×1 is Moir). Fig. 10 shows the first generated tokens/words of BOS and
rand×1 samples on OLMo-2-7B-Instruct (over 52 % of BOS samples trapped by ``<|assistant|>``; rand×1's
most frequent first token at 0.66 %), Tables 8-9 show thirty samples of each.

- :func:`generate` runs :func:`moir_lib.generation.self_generate` once per strategy into
  ``<out_dir>/<strategy>/`` (resumable; the per-strategy wall time is kept in ``timing.json`` beside the
  shards so a resumed or re-read run still reports its tokens/s); :func:`load_runs` reads such a folder
  back (chapter 03 reuses chapter 02's generations this way).
- :func:`strategy_table` (one row per strategy: top-1 first-token share, chat-template shares, domain),
  :func:`first_tokens`, :func:`first_words`, :func:`domain_mixes`, :func:`examples` (Tables 8-9) are
  tidy tables built on :mod:`moir_lib.analysis.tokens`; :func:`headline` and :func:`findings` turn them
  into the chapter's ``summary.json`` headline and its closing paragraph.
- :func:`explorer` is an ipywidgets browser of the samples for JupyterLab (a static table in a
  headless run).

"Trapped in the chat template" is measured on the *continuation* (the tokens the model chose, not the
seed): ``starts_with_tag`` = it opens with a chat tag (Fig. 10's attractor), ``chat_share`` = it contains
one anywhere (the sample is, or drifts into, a chat transcript).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from moir_lib.analysis.tokens import (
    DOMAIN_LABELS,
    chat_tag_shares,
    classify_domain,
    continuation,
    domain_mix,
    first_token_table,
    first_words_table,
)

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["STRATEGIES", "PAPER", "StrategyRun", "sample_counts", "generate", "load_runs", "strategy_table",
           "first_tokens", "first_words", "domain_mixes", "top_domains", "examples", "examples_view",
           "headline", "findings", "explorer", "write_tables"]

#: The seed strategies of the paper's Table 2, in its order of prefix length.
STRATEGIES: tuple[str, ...] = ("bos", "rand1", "rand2", "rand3", "rand4")
#: The paper's numbers this chapter compares with (OLMo-2-7B-Instruct, appendix D.1, Fig. 10).
PAPER: dict[str, float] = {"bos_trapped": 0.52, "rand1_top1_share": 0.0066}
TIMING = "timing.json"


@dataclass
class StrategyRun:
    """One strategy's self-generated corpus: its run directory, its records and what producing them cost."""

    strategy: str
    run_dir: Path
    records: list[dict[str, Any]] = field(repr=False)
    n_tokens: int  # sampled tokens in all records (a final EOS included)
    seconds: float  # generation wall time that produced them, summed over (resumed) calls; NaN if unknown

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else float("nan")


def sample_counts(strategies: Sequence[str], n_samples: int, n_samples_long: int) -> dict[str, int]:
    """Samples per strategy: ``n_samples`` for ``bos`` and ``rand1`` (the two Fig. 10 compares and the
    two C's the later chapters use; both are required), ``n_samples_long`` for every other strategy.
    Every strategy is parsed here, so a typo fails before the model is used."""
    from moir_lib.generation import parse_seed_strategy

    for name, value in (("n_samples", n_samples), ("n_samples_long", n_samples_long)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if len(set(strategies)) != len(strategies):
        raise ValueError(f"seed strategies must be distinct, got {list(strategies)}")
    missing = [s for s in ("bos", "rand1") if s not in strategies]
    if missing:
        raise ValueError(f"the chapter compares bos with rand1: add {' and '.join(missing)} to the "
                         f"strategies (got {list(strategies)})")
    for strategy in strategies:
        parse_seed_strategy(strategy)
    return {s: n_samples if s in ("bos", "rand1") else n_samples_long for s in strategies}


def _timing(run_dir: Path) -> dict[str, float]:
    path = run_dir / TIMING
    if path.is_file():
        return json.loads(path.read_text())
    return {"tokens": 0, "seconds": 0.0}


def _run(strategy: str, run_dir: Path) -> StrategyRun:
    from moir_lib.generation import read_samples

    records = list(read_samples(run_dir))
    timing = _timing(run_dir)
    n_tokens = sum(len(r["token_ids"]) for r in records)
    seconds = float(timing["seconds"]) if timing.get("tokens") == n_tokens else float("nan")
    return StrategyRun(strategy, run_dir, records, n_tokens, seconds)


def generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, n_samples: Mapping[str, int],
             max_new_tokens: int, batch_size: int, out_dir: str | os.PathLike[str], seed: int = 0,
             collect_layers: Sequence[int] | None = None, progress: bool = True) -> dict[str, StrategyRun]:
    """Self-generate ``n_samples[strategy]`` samples per strategy into ``<out_dir>/<strategy>/``.

    ``collect_layers``: accumulate the keys of these layers during generation (Algorithm 1, no second
    pass; :func:`moir_lib.generation.load_key_stats` reads them back as ``C_Moir`` / ``C_Moir-bos``).
    Resumes a run folder that holds the same configuration (and refuses one with a different
    configuration, naming the differing fields). All arguments are checked before any generation.
    """
    from moir_lib.generation import parse_seed_strategy, self_generate

    if not n_samples:
        raise ValueError("give at least one seed strategy")
    for strategy, n in n_samples.items():
        parse_seed_strategy(strategy)
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"n_samples for {strategy} must be a positive integer, got {n!r}")
    out = Path(out_dir)
    runs: dict[str, StrategyRun] = {}
    for strategy, n in n_samples.items():
        run_dir = out / strategy.replace(":", "_").replace("/", "_")
        result = self_generate(model, tokenizer, strategy, n, max_new_tokens, batch_size, run_dir, seed=seed,
                               collect_layers=collect_layers, progress=progress)
        timing = _timing(run_dir)
        if result.n_written:
            timing = {"tokens": timing["tokens"] + result.n_tokens,
                      "seconds": timing["seconds"] + result.seconds}
            (run_dir / TIMING).write_text(json.dumps(timing) + "\n")
        runs[strategy] = _run(strategy, run_dir)
    return runs


def load_runs(generation_dir: str | os.PathLike[str], strategies: Sequence[str] | None = None
              ) -> dict[str, StrategyRun]:
    """The strategy folders of a :func:`generate` output (all of them, or ``strategies``), in order."""
    root = Path(generation_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"generation folder not found: {root.resolve()} (run chapter 02 first, or "
                                f"pass None; a relative path is relative to {Path.cwd()})")
    found = {p.name: p for p in sorted(root.iterdir()) if (p / "manifest.json").is_file()}
    wanted = list(strategies) if strategies is not None else [s for s in STRATEGIES if s in found] + sorted(
        set(found) - set(STRATEGIES))
    missing = [s for s in wanted if s not in found]
    if missing:
        raise FileNotFoundError(f"{root} has no generation for {', '.join(missing)} "
                                f"(it has: {', '.join(found) or 'nothing'})")
    return {s: _run(s, found[s]) for s in wanted}


# ----------------------------------------------------------------------------- tables


def _entropy(counter: Counter) -> float:
    n = sum(counter.values())
    return -sum(c / n * math.log(c / n) for c in counter.values() if c)


def strategy_table(runs: Mapping[str, StrategyRun], tokenizer: PreTrainedTokenizerBase | None = None
                   ) -> pd.DataFrame:
    """One row per strategy.

    Columns: ``strategy, samples, tokens, mean_tokens, eos_share`` (samples that stopped at EOS),
    ``top1_token, top1_share`` (the most frequent first generated token), ``first_token_perplexity``
    (``exp`` of the first-token entropy: the effective number of distinct openings), ``starts_with_tag``,
    ``chat_share`` (see the module doc), ``main_domain, main_domain_share`` (:func:`domain_mixes`),
    ``tokens_per_s``.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    rows = []
    for name, run in runs.items():
        recs = run.records
        if not recs:
            raise ValueError(f"{name}: no samples in {run.run_dir}")
        top = first_token_table(recs, tokenizer, k=1).iloc[0]
        chat = chat_tag_shares(recs, tokenizer)
        mix = domain_mix(recs, tokenizer, use_seed=False).sort_values("share", ascending=False, kind="stable")
        firsts = Counter(int(r["token_ids"][0]) if r["token_ids"] else -1 for r in recs)
        rows.append({
            "strategy": name, "samples": len(recs), "tokens": run.n_tokens,
            "mean_tokens": run.n_tokens / len(recs),
            "eos_share": sum(bool(r["token_ids"]) and r["token_ids"][-1] == eos for r in recs) / len(recs),
            "top1_token": top["token"], "top1_share": float(top["share"]),
            "first_token_perplexity": math.exp(_entropy(firsts)),
            "starts_with_tag": chat["starts_with_tag"], "chat_share": chat["contains_tag"],
            "main_domain": mix["domain"].iloc[0], "main_domain_share": float(mix["share"].iloc[0]),
            "tokens_per_s": run.tokens_per_s,
        })
    return pd.DataFrame(rows)


def first_tokens(runs: Mapping[str, StrategyRun], tokenizer: PreTrainedTokenizerBase | None = None,
                 k: int = 20) -> pd.DataFrame:
    """Top-``k`` first generated tokens per strategy (Fig. 10): ``strategy, rank, token_id, token, count,
    share`` (shares of each strategy's samples)."""
    parts = [first_token_table(run.records, tokenizer, k=k).assign(strategy=name)
             for name, run in runs.items()]
    table = pd.concat(parts, ignore_index=True)
    return table[["strategy", "rank", "token_id", "token", "count", "share"]]


def first_words(runs: Mapping[str, StrategyRun], tokenizer: PreTrainedTokenizerBase | None = None,
                n_words: int = 3, k: int = 10) -> pd.DataFrame:
    """Top-``k`` words at positions 1..``n_words`` of the continuation per strategy (Fig. 10's "first
    three generated words"): ``strategy, position, rank, word, count, share``."""
    parts = [first_words_table(run.records, tokenizer, n_words=n_words, k=k).assign(strategy=name)
             for name, run in runs.items()]
    table = pd.concat(parts, ignore_index=True)
    return table[["strategy", "position", "rank", "word", "count", "share"]]


def domain_mixes(runs: Mapping[str, StrategyRun], tokenizer: PreTrainedTokenizerBase | None = None
                 ) -> pd.DataFrame:
    """Domain mix of each strategy's continuations (:func:`moir_lib.analysis.tokens.classify_domain`, a
    heuristic): ``strategy, domain, count, share`` with every domain label listed."""
    parts = [domain_mix(run.records, tokenizer, use_seed=False).assign(strategy=name)
             for name, run in runs.items()]
    return pd.concat(parts, ignore_index=True)[["strategy", "domain", "count", "share"]]


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


# ----------------------------------------------------------------------------- headline and findings


def headline(runs: Mapping[str, StrategyRun], table: pd.DataFrame) -> dict[str, float]:
    """The chapter's ``summary.json`` headline: ``bos_top1_share``, ``rand1_top1_share``,
    ``bos_chat_share``, ``rand1_chat_share`` (samples containing a chat tag), ``tokens_generated`` (all
    strategies) and ``tokens_per_s`` (all tokens over all generation time)."""
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
        "tokens_generated": int(tokens),
        "tokens_per_s": float(sum(r.n_tokens for r in timed) / seconds) if seconds > 0 else 0.0,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.095 or x == 0 else f"{100 * x:.1f} %"


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
        f"`{model_name}` open with a chat tag and {_pct(bos['chat_share'])} contain one; the most frequent "
        f"first token, `{top_token}`, opens {_pct(bos['top1_share'])} of them "
        f"(effectively {bos['first_token_perplexity']:.1f} distinct openings). The paper found over "
        f"{_pct(PAPER['bos_trapped'])} of OLMo-2-7B-Instruct's BOS samples trapped by `<|assistant|>`.",
        f"**rand×1.** One uniformly random token after BOS leaves {_pct(rand1['chat_share'])} of the samples "
        f"with a chat tag; the most frequent first token opens {_pct(rand1['top1_share'])} of them "
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


# ----------------------------------------------------------------------------- explorer and files


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


def write_tables(out_dir: str | os.PathLike[str], **tables: pd.DataFrame) -> list[Path]:
    """Write tidy tables as ``<out_dir>/<name>.csv`` (beside ``summary.json``); returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, table in tables.items():
        path = out / f"{name}.csv"
        table.to_csv(path, index=False)
        paths.append(path)
    return paths
