"""Token statistics of self-generated samples (appendix D.1, Fig. 10; Tables 8-9).

- :func:`first_token_table`: the most frequent *first generated* tokens and their shares
  (the paper: over 52 % of BOS-seeded OLMo-2 samples open with ``<|assistant|>``; rand×1 brings the
  top share down to 0.66 %); :func:`top1_share` is the top share alone.
- :func:`first_words_table`: the most frequent words at positions 1..3 of the continuation (Fig. 10's
  "first three generated words"; whitespace-split, chat tags count as words).
- :func:`chat_tag_shares`: the share of samples whose continuation *starts* with a chat tag and the
  share that *contains* one anywhere ("trapped in the chat template").
- :func:`classify_domain` / :func:`domain_mix`: a heuristic classifier for the pocket domains
  (``chat``, ``math``, ``code``, ``wiki``, ``prose``, else ``other``) for "the domain mix of the
  generations".

Samples are the records of :func:`moir_lib.generation.read_samples` (``token_ids`` = the
continuation, ``text`` = seed + continuation) or plain strings (taken as the continuation).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["CHAT_TAGS", "DOMAIN_LABELS", "continuation", "first_token_table", "top1_share",
           "first_words_table", "chat_tag_shares", "classify_domain", "domain_mix"]

CHAT_TAGS: tuple[str, ...] = ("<|user|>", "<|assistant|>")
DOMAIN_LABELS: tuple[str, ...] = ("chat", "math", "code", "wiki", "prose", "other")

Sample = Mapping[str, Any] | str


def _eos(tokenizer: PreTrainedTokenizerBase | None) -> int | None:
    return None if tokenizer is None else tokenizer.eos_token_id


def continuation(sample: Sample, tokenizer: PreTrainedTokenizerBase | None = None) -> str:
    """The generated part of a sample as text: ``token_ids`` decoded (special tokens kept, a final EOS
    dropped) when a tokenizer is given, else the record's ``text`` (which includes the seed), or the
    string itself."""
    if isinstance(sample, str):
        return sample
    if tokenizer is not None and "token_ids" in sample:
        ids = list(sample["token_ids"])
        if ids and ids[-1] == _eos(tokenizer):
            ids = ids[:-1]
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return str(sample["text"])


def _ranked(counter: Counter, n: int, k: int | None) -> list[tuple[Any, int, float]]:
    items = sorted(counter.items(), key=lambda kv: (-kv[1], str(kv[0])))  # ties: deterministic
    return [(key, c, c / n) for key, c in (items if k is None else items[:k])]


def first_token_table(samples: Iterable[Sample], tokenizer: PreTrainedTokenizerBase | None = None,
                      k: int | None = 20) -> pd.DataFrame:
    """Top-``k`` first generated tokens: ``rank, token_id, token, count, share`` (share of all samples).

    Records use ``token_ids[0]`` (``token`` is its decoded string when a tokenizer is given); strings
    use their first whitespace-separated word (``token_id`` = -1). Empty continuations count as ``""``.
    """
    counter: Counter = Counter()
    n = 0
    for sample in samples:
        n += 1
        if isinstance(sample, str):
            words = sample.split()
            counter[(-1, words[0] if words else "")] += 1
        else:
            ids = list(sample["token_ids"])
            tid = int(ids[0]) if ids else -1
            text = (tokenizer.decode([tid], skip_special_tokens=False) if tokenizer is not None and tid >= 0
                    else ("" if tid < 0 else str(tid)))
            counter[(tid, text)] += 1
    if n == 0:
        raise ValueError("no samples")
    rows = [{"rank": r, "token_id": key[0], "token": key[1], "count": c, "share": s}
            for r, (key, c, s) in enumerate(_ranked(counter, n, k), 1)]
    return pd.DataFrame(rows, columns=["rank", "token_id", "token", "count", "share"])


def top1_share(samples: Iterable[Sample], tokenizer: PreTrainedTokenizerBase | None = None) -> float:
    """Share of the most frequent first generated token (the paper: >52 % for BOS, 0.66 % for rand×1)."""
    return float(first_token_table(samples, tokenizer, k=1)["share"].iloc[0])


def first_words_table(samples: Iterable[Sample], tokenizer: PreTrainedTokenizerBase | None = None,
                      n_words: int = 3, k: int | None = 10) -> pd.DataFrame:
    """Top-``k`` words at each position ``1..n_words`` of the continuation (whitespace-split; a sample
    shorter than a position counts as ``""`` there): ``position, rank, word, count, share``."""
    if n_words <= 0:
        raise ValueError(f"n_words must be positive, got {n_words}")
    counters = [Counter() for _ in range(n_words)]
    n = 0
    for sample in samples:
        n += 1
        words = continuation(sample, tokenizer).split()
        for p in range(n_words):
            counters[p][words[p] if p < len(words) else ""] += 1
    if n == 0:
        raise ValueError("no samples")
    rows = [{"position": p + 1, "rank": r, "word": w, "count": c, "share": s}
            for p in range(n_words) for r, (w, c, s) in enumerate(_ranked(counters[p], n, k), 1)]
    return pd.DataFrame(rows, columns=["position", "rank", "word", "count", "share"])


def chat_tag_shares(samples: Iterable[Sample], tokenizer: PreTrainedTokenizerBase | None = None,
                    tags: Sequence[str] = CHAT_TAGS) -> dict[str, float]:
    """``{"n", "starts_with_tag", "contains_tag"}``: shares of samples whose continuation starts with /
    contains one of ``tags``. With a tokenizer and records, the test is on token ids (tags are single
    special tokens); otherwise on the text (leading whitespace ignored)."""
    tag_ids: set[int] = set()
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        tag_ids = {int(vocab[t]) for t in tags if t in vocab}
    n = starts = contains = 0
    for sample in samples:
        n += 1
        if tag_ids and not isinstance(sample, str) and "token_ids" in sample:
            ids = list(sample["token_ids"])
            starts += bool(ids) and ids[0] in tag_ids
            contains += any(i in tag_ids for i in ids)
        else:
            text = continuation(sample, tokenizer)
            starts += text.lstrip().startswith(tuple(tags))
            contains += any(t in text for t in tags)
    if n == 0:
        raise ValueError("no samples")
    return {"n": n, "starts_with_tag": starts / n, "contains_tag": contains / n}


# ----------------------------------------------------------------------------- domain classifier

_MATH = (re.compile(r"####"), re.compile(r"\b(?:Question|Answer):"),
         re.compile(r"\d+\s*[-+*/]\s*\d+\s*=\s*\d+"), re.compile(r"\bhow many\b", re.I))
_MATH_WEIGHTS = (3, 2, 2, 1)
_CODE = (re.compile(r"^\s*def \w+\s*\(", re.M), re.compile(r"^\s*return\b", re.M), re.compile(r'"""|\'\'\''),
         re.compile(r"^\s*(?:import|from)\s+[\w.]+", re.M), re.compile(r"\bself\.\w"),
         re.compile(r"^(?: {4}|\t)+\S", re.M), re.compile(r"[:(\[]\s*$", re.M), re.compile(r"[=!<>]=|\+=|->"),
         re.compile(r"\b(?:if|for|while|elif|else|try|except|with|class)\b[^\n]*:\s*$", re.M),
         re.compile(r"\w+\([^()\n]*\)"), re.compile(r"\b(?:None|True|False|lambda|isinstance|len)\b"))
_PROSE = (re.compile(r",\s*so (?:he|she)\b"), re.compile(r"\b(?:was|were|had|felt|went|took|saw)\b"),
          re.compile(r"\b(?:It|The|A|Everyone|Nobody) [a-z]+ [a-z]+"))
_WORDS = re.compile(r"[A-Za-z]{2,}")
_FALLBACK_FACT_PHRASES = ("is a citizen of", "works as a", "plays the", "works for", "is employed by",
                          "native language of", "capital of", "is located in", "official language of")


#: template fragments too generic to signal a fact sentence
_GENERIC_FRAGMENTS = {"is the", "is a", "at home", "every morning", "in the evenings"}


@lru_cache(maxsize=1)
def _fact_pattern() -> re.Pattern[str]:
    """One alternation of the pocket world's relation phrases (the ``wiki`` domain), ≥ 2 words each,
    longest first, so that a sentence's phrase is counted once."""
    try:
        from moir_lib.pocket.world import RELATIONS

        templates = [t for rel in RELATIONS for t in rel.templates]
    except ImportError:  # pragma: no cover - the pocket world is part of the package
        templates = []
    phrases = set(_FALLBACK_FACT_PHRASES)
    for template in templates:
        for part in template.split("{}"):
            words = re.sub(r"[^\w ]", " ", part).split()
            if len(words) >= 2 and " ".join(words).lower() not in _GENERIC_FRAGMENTS:
                phrases.add(" ".join(words))
    alternatives = (re.escape(p).replace(r"\ ", r"\s+") for p in sorted(phrases, key=len, reverse=True))
    return re.compile(r"\b(?:" + "|".join(alternatives) + r")\b", re.I)


def _domain_scores(text: str) -> dict[str, float]:
    math_score = sum(w * len(p.findall(text)) for p, w in zip(_MATH, _MATH_WEIGHTS, strict=True))
    code_score = sum(min(len(p.findall(text)), 3) for p in _CODE)
    wiki_score = len(_fact_pattern().findall(text))
    prose_score = 2 * len(_PROSE[0].findall(text)) + 0.5 * len(_PROSE[1].findall(text)) + 0.5 * len(
        _PROSE[2].findall(text))
    return {"math": math_score, "code": code_score / 2, "wiki": wiki_score, "prose": prose_score}


def classify_domain(text: str, tags: Sequence[str] = CHAT_TAGS) -> str:
    """The pocket domain a text most resembles: ``chat`` (any chat tag), else the best-scoring of
    ``math`` (``####``, ``Question:``/``Answer:``, ``a + b = c``), ``code`` (``def``, ``return``,
    indentation, calls, operators), ``wiki`` (the world's fact sentences: relation phrases such as "is a
    citizen of"), ``prose`` (everyday narrative: ", so she …", past-tense verbs); ties go in that
    order. ``other`` when nothing scores and the text has fewer than 3 words. A heuristic for summary
    tables, not ground truth: check it against labelled documents (``tests/test_analysis.py`` does).
    """
    if any(t in text for t in tags):
        return "chat"
    scores = _domain_scores(text)
    best = max(scores.values())
    if best <= 0:
        return "prose" if len(_WORDS.findall(text)) >= 3 else "other"
    return next(d for d in ("math", "code", "wiki", "prose") if scores[d] == best)


def domain_mix(samples: Iterable[Sample], tokenizer: PreTrainedTokenizerBase | None = None,
               use_seed: bool = True) -> pd.DataFrame:
    """Counts and shares of :func:`classify_domain` labels: ``domain, count, share`` (every label listed).

    ``use_seed``: classify the record's full ``text`` (seed + continuation); else only the continuation.
    """
    counter: Counter = Counter()
    for sample in samples:
        text = sample if isinstance(sample, str) else (
            str(sample["text"]) if use_seed else continuation(sample, tokenizer))
        counter[classify_domain(text)] += 1
    n = sum(counter.values())
    if n == 0:
        raise ValueError("no samples")
    return pd.DataFrame([{"domain": d, "count": counter[d], "share": counter[d] / n} for d in DOMAIN_LABELS])
