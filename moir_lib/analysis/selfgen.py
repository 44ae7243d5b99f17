"""Self-generation by seed strategy: the measurements behind chapter 02 (02_generation).

Section 4 of the paper ("Self-generation strategy", Table 2) and appendix D.1-D.2 compare the seed
sequence ``s`` of Algorithm 1: BOS alone (Moir-bos) against ``k`` uniformly random vocabulary tokens
after BOS (rand×1 … rand×4; rand×1 is Moir). Fig. 10 shows the first generated tokens/words of BOS and
rand×1 samples on OLMo-2-7B-Instruct (over 52 % of BOS samples trapped by ``<|assistant|>``; rand×1's
most frequent first token at 0.66 %), Tables 8-9 show thirty samples of each.

- :func:`generate` runs :func:`moir_lib.generation.self_generate` once per strategy into
  ``<out_dir>/<strategy>/`` (resumable; the per-strategy wall time is kept in ``timing.json`` beside the
  shards so a resumed or re-read generation still reports its tokens/s); :func:`load_generations` reads
  such a folder back (chapter 03 reuses chapter 02's generations this way).
- :func:`strategy_table` (one row per strategy: top-1 first-token share, chat-template shares, domain),
  :func:`first_tokens`, :func:`first_words` and :func:`domain_mixes` are tidy tables built on
  :mod:`moir_lib.analysis.tokens`; :mod:`moir_lib.chapters.generation` turns them into the chapter's
  headline, examples (Tables 8-9) and closing paragraph.

"Trapped in the chat template" is measured on the *continuation* (the tokens the model chose, not the
seed): ``starts_with_tag`` = it opens with a chat tag (Fig. 10's attractor), ``chat_share`` = it contains
one anywhere (the sample is, or drifts into, a chat transcript).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from moir_lib.analysis.tokens import (
    chat_tag_shares,
    domain_mix,
    first_token_table,
    first_words_table,
)
from moir_lib.evaluation.uncertainty import share, top_share

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from moir_lib.generation import GenerationSettings

__all__ = ["STRATEGIES", "SamplingSettings", "StrategyGeneration", "sample_counts", "generate",
           "load_generations", "strategy_table", "first_tokens", "first_words", "domain_mixes"]

#: The seed strategies of the paper's Table 2, in its order of prefix length.
STRATEGIES: tuple[str, ...] = ("bos", "rand1", "rand2", "rand3", "rand4")
TIMING = "timing.json"


@dataclass
class StrategyGeneration:
    """One strategy's self-generated corpus: its generation directory, its samples and what producing them
    cost."""

    strategy: str
    gen_dir: Path
    samples: list[dict[str, Any]] = field(repr=False)
    n_tokens: int  # sampled tokens in all samples (a final EOS included)
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


def _timing(gen_dir: Path) -> dict[str, float]:
    path = gen_dir / TIMING
    if path.is_file():
        return json.loads(path.read_text())
    return {"tokens": 0, "seconds": 0.0}


def _load_generation(strategy: str, gen_dir: Path) -> StrategyGeneration:
    from moir_lib.generation import read_samples

    samples = list(read_samples(gen_dir))
    timing = _timing(gen_dir)
    n_tokens = sum(len(r["token_ids"]) for r in samples)
    seconds = float(timing["seconds"]) if timing.get("tokens") == n_tokens else float("nan")
    return StrategyGeneration(strategy, gen_dir, samples, n_tokens, seconds)


@dataclass(frozen=True)
class SamplingSettings:
    """What every strategy's generation by :func:`generate` shares: at most ``max_new_tokens`` sampled
    tokens per sample, ``batch_size`` rows decoded together (changes no sample, only speed), the global
    ``seed`` and ``collect_layers``, whose keys are accumulated during generation (Algorithm 1, no second
    pass; :func:`moir_lib.generation.load_key_stats` reads them back as ``C_Moir`` / ``C_Moir-bos``)."""

    max_new_tokens: int
    batch_size: int
    seed: int = 0
    collect_layers: Sequence[int] | None = None

    def for_strategy(self, strategy: str, n_samples: int) -> GenerationSettings:
        """The :class:`~moir_lib.generation.GenerationSettings` of ``n_samples`` samples of ``strategy``."""
        from moir_lib.generation import GenerationSettings

        return GenerationSettings(strategy, n_samples, self.max_new_tokens, self.batch_size, seed=self.seed,
                                  collect_layers=self.collect_layers)


def generate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, n_samples: Mapping[str, int],
             out_dir: str | os.PathLike[str], sampling: SamplingSettings, *, progress: bool = True
             ) -> dict[str, StrategyGeneration]:
    """Self-generate ``n_samples[strategy]`` samples per strategy into ``<out_dir>/<strategy>/``, each
    generation under ``sampling`` (:class:`SamplingSettings`).

    Resumes a generation directory that holds the same configuration (and refuses one with a different
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
    generations: dict[str, StrategyGeneration] = {}
    for strategy, n in n_samples.items():
        gen_dir = out / strategy.replace(":", "_").replace("/", "_")
        settings = sampling.for_strategy(strategy, n)
        result = self_generate(model, tokenizer, settings, gen_dir, progress=progress)
        timing = _timing(gen_dir)
        if result.n_written:
            timing = {"tokens": timing["tokens"] + result.n_tokens,
                      "seconds": timing["seconds"] + result.seconds}
            (gen_dir / TIMING).write_text(json.dumps(timing) + "\n")
        generations[strategy] = _load_generation(strategy, gen_dir)
    return generations


def load_generations(generation_dir: str | os.PathLike[str], strategies: Sequence[str] | None = None
              ) -> dict[str, StrategyGeneration]:
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
    return {s: _load_generation(s, found[s]) for s in wanted}


# ----------------------------------------------------------------------------- tables


def _entropy(counter: Counter) -> float:
    n = sum(counter.values())
    return -sum(c / n * math.log(c / n) for c in counter.values() if c)


def strategy_table(generations: Mapping[str, StrategyGeneration],
                   tokenizer: PreTrainedTokenizerBase | None = None) -> pd.DataFrame:
    """One row per strategy.

    Columns: ``strategy, samples, tokens, mean_tokens, eos_share`` (samples that stopped at EOS),
    ``top1_token, top1_share`` (the most frequent first generated token), ``first_token_perplexity``
    (``exp`` of the first-token entropy: the effective number of distinct openings), ``starts_with_tag``,
    ``chat_share`` (see the module doc), ``main_domain, main_domain_share`` (:func:`domain_mixes`),
    ``tokens_per_s``; ``top1_stderr``, ``starts_stderr`` and ``chat_stderr``: the standard errors of the
    three shares over the strategy's samples (the top-1 share, a maximum of shares, by a bootstrap over the
    sequences: :func:`moir_lib.evaluation.uncertainty.top_share`; the others as rates of 0/1 outcomes:
    :func:`~moir_lib.evaluation.uncertainty.share`).
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    rows = []
    for name, gen in generations.items():
        recs = gen.samples
        if not recs:
            raise ValueError(f"{name}: no samples in {gen.gen_dir}")
        top = first_token_table(recs, tokenizer, k=1).iloc[0]
        chat = chat_tag_shares(recs, tokenizer)
        mix = domain_mix(recs, tokenizer, use_seed=False).sort_values("share", ascending=False, kind="stable")
        firsts = Counter(int(r["token_ids"][0]) if r["token_ids"] else -1 for r in recs)
        rows.append({
            "strategy": name, "samples": len(recs), "tokens": gen.n_tokens,
            "mean_tokens": gen.n_tokens / len(recs),
            "eos_share": sum(bool(r["token_ids"]) and r["token_ids"][-1] == eos for r in recs) / len(recs),
            "top1_token": top["token"], "top1_share": float(top["share"]),
            "first_token_perplexity": math.exp(_entropy(firsts)),
            "starts_with_tag": chat["starts_with_tag"], "chat_share": chat["contains_tag"],
            "main_domain": mix["domain"].iloc[0], "main_domain_share": float(mix["share"].iloc[0]),
            "tokens_per_s": gen.tokens_per_s,
            "top1_stderr": top_share(list(firsts.elements())).stderr,
            "starts_stderr": share(round(chat["starts_with_tag"] * len(recs)), len(recs)).stderr,
            "chat_stderr": share(round(chat["contains_tag"] * len(recs)), len(recs)).stderr,
        })
    return pd.DataFrame(rows)


def first_tokens(generations: Mapping[str, StrategyGeneration],
                 tokenizer: PreTrainedTokenizerBase | None = None, k: int = 20) -> pd.DataFrame:
    """Top-``k`` first generated tokens per strategy (Fig. 10): ``strategy, rank, token_id, token, count,
    share, stderr`` (shares of each strategy's samples, with their standard errors)."""
    parts = []
    for name, gen in generations.items():
        part = first_token_table(gen.samples, tokenizer, k=k).assign(strategy=name)
        part["stderr"] = [share(int(c), len(gen.samples)).stderr for c in part["count"]]
        parts.append(part)
    table = pd.concat(parts, ignore_index=True)
    return table[["strategy", "rank", "token_id", "token", "count", "share", "stderr"]]


def first_words(generations: Mapping[str, StrategyGeneration],
                tokenizer: PreTrainedTokenizerBase | None = None, n_words: int = 3, k: int = 10
                ) -> pd.DataFrame:
    """Top-``k`` words at positions 1..``n_words`` of the continuation per strategy (Fig. 10's "first
    three generated words"): ``strategy, position, rank, word, count, share``."""
    parts = [first_words_table(gen.samples, tokenizer, n_words=n_words, k=k).assign(strategy=name)
             for name, gen in generations.items()]
    table = pd.concat(parts, ignore_index=True)
    return table[["strategy", "position", "rank", "word", "count", "share"]]


def domain_mixes(generations: Mapping[str, StrategyGeneration],
                 tokenizer: PreTrainedTokenizerBase | None = None) -> pd.DataFrame:
    """Domain mix of each strategy's continuations (:func:`moir_lib.analysis.tokens.classify_domain`, a
    heuristic): ``strategy, domain, count, share`` with every domain label listed."""
    parts = [domain_mix(gen.samples, tokenizer, use_seed=False).assign(strategy=name)
             for name, gen in generations.items()]
    return pd.concat(parts, ignore_index=True)[["strategy", "domain", "count", "share"]]
