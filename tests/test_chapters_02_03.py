"""Chapters 02 (self-generation by seed strategy) and 03 (NLL / JSD / C diagnostics) and their library glue.

Unit tests build tables from constructed samples (and tiny random models from ``tests/tiny.py``); the
end-to-end tests ``moir run`` each notebook on the micro pocket model with tiny sizes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from tiny import random_documents, tiny_loaded, words_tokenizer

from moir_lib.analysis import alignment, selfgen
from moir_lib.analysis.nll import NLLSettings, document_nll
from moir_lib.analysis.selfgen import StrategyGeneration
from moir_lib.chapters import generation, nll_jsd
from moir_lib.evaluation import uncertainty as unc
from moir_lib.evaluation.families import holm
from moir_lib.evaluation.intervals import NOT_MEASURED
from moir_lib.evaluation.uncertainty import REPRODUCED, REVERSED, UNRESOLVED, Z95
from moir_lib.results import read_summary, write_summary, write_tables

ROOT = Path(__file__).resolve().parents[1]
NB02 = ROOT / "notebooks" / "02_generation.ipynb"
NB03 = ROOT / "notebooks" / "03_nll_jsd.ipynb"
HEADLINE_02 = {
    "bos_top1_share",
    "rand1_top1_share",
    "bos_chat_share",
    "rand1_chat_share",
    "bos_top1_stderr",
    "rand1_top1_stderr",
    "bos_chat_stderr",
    "rand1_chat_stderr",
    "tokens_generated",
    "tokens_per_s",
    "claims",
}
CORPORA = {"moir", "moir-bos", "wiki", "web", "code", "math"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One torch thread here and in the notebook kernels (they inherit OMP_NUM_THREADS): on two busy
    cores a second thread makes decoding an order of magnitude slower."""
    old, old_env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(old)
    if old_env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = old_env


# ----------------------------------------------------------------------------- constructed samples


@pytest.fixture(scope="module")
def tok():
    return words_tokenizer()


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _generation(
    tok,
    name: str,
    texts: list[str],
    seed_texts: list[str] | None = None,
    seconds: float = 2.0,
    eos_every: int = 0,
) -> StrategyGeneration:
    recs = []
    for i, text in enumerate(texts):
        ids = _ids(tok, text)
        if eos_every and i % eos_every == 0:
            ids = ids + [tok.eos_token_id]
        seed_ids = [tok.bos_token_id] + (_ids(tok, seed_texts[i]) if seed_texts else [])
        recs.append(
            {
                "index": i,
                "seed_strategy": name,
                "seed_ids": seed_ids,
                "token_ids": ids,
                "text": ((seed_texts[i] + " ") if seed_texts else "") + text,
            }
        )
    return StrategyGeneration(
        name, Path(f"/nonexistent/{name}"), recs, sum(len(r["token_ids"]) for r in recs), seconds
    )


@pytest.fixture(scope="module")
def generations(tok):
    """BOS: 8 of 10 samples open with <|user|> (9 contain a tag); rand1: diverse, 1 of 10 has a tag."""
    bos = ["<|user|> the city is two + three <|assistant|> five"] * 8 + [
        "the city is old",
        "a <|assistant|> b",
    ]
    rand = [
        "the king was old",
        "def value ( x ) : return x",
        "one + two = three",
        "a small city",
        "he had a book",
        "the water and fire",
        "red blue green",
        "x = y + z",
        "north south <|user|> east",
        "she was first",
    ]
    return {
        "bos": _generation(tok, "bos", bos, eos_every=2),
        "rand1": _generation(tok, "rand1", rand, seed_texts=["tree"] * 10, seconds=4.0),
        "rand2": _generation(tok, "rand2", rand[:4], seed_texts=["tree stone"] * 4, seconds=1.0),
    }


def test_sample_counts():
    assert selfgen.sample_counts(["bos", "rand1", "rand3"], 100, 20) == {
        "bos": 100,
        "rand1": 100,
        "rand3": 20,
    }
    with pytest.raises(ValueError, match="n_samples_long"):
        selfgen.sample_counts(["bos", "rand1"], 10, 0)
    with pytest.raises(ValueError, match="distinct"):
        selfgen.sample_counts(["bos", "bos", "rand1"], 10, 5)
    with pytest.raises(ValueError, match="add bos and rand1"):
        selfgen.sample_counts([], 10, 5)
    with pytest.raises(ValueError, match="add rand1"):
        selfgen.sample_counts(["bos", "rand2"], 10, 5)
    with pytest.raises(ValueError, match="unknown seed strategy 'rand0'"):
        selfgen.sample_counts(["bos", "rand1", "rand0"], 10, 5)


def test_strategy_table_from_constructed_samples(tok, generations):
    table = selfgen.strategy_table(generations, tok).set_index("strategy")
    bos, rand1 = table.loc["bos"], table.loc["rand1"]
    assert bos["samples"] == 10 and bos["top1_token"] == "<|user|>"
    assert bos["top1_share"] == pytest.approx(0.8)
    assert bos["starts_with_tag"] == pytest.approx(0.8) and bos["chat_share"] == pytest.approx(0.9)
    assert bos["eos_share"] == pytest.approx(0.5)
    assert bos["main_domain"] == "chat" and bos["main_domain_share"] == pytest.approx(0.9)
    # first tokens of rand1: "the" twice, everything else once -> 9 distinct openings
    assert rand1["top1_token"] == "the" and rand1["top1_share"] == pytest.approx(0.2)
    h = -(0.2 * math.log(0.2) + 8 * 0.1 * math.log(0.1))
    assert rand1["first_token_perplexity"] == pytest.approx(math.exp(h))
    assert rand1["starts_with_tag"] == 0 and rand1["chat_share"] == pytest.approx(0.1)
    assert rand1["tokens_per_s"] == pytest.approx(generations["rand1"].n_tokens / 4.0)
    assert table.loc["rand2", "samples"] == 4
    # a chat share's standard error is that of the mean of its 0/1 outcomes: sqrt(p(1-p)/(n-1)); the top-1
    # share's, a maximum of shares, comes from a bootstrap over the sequences
    assert bos["chat_stderr"] == pytest.approx(math.sqrt(0.9 * 0.1 / 9)) and rand1["starts_stderr"] == 0
    firsts = generation.first_token_frame(generations)
    for name, row in (("bos", bos), ("rand1", rand1)):
        ids = firsts.loc[firsts.strategy == name, "first_token"]
        assert row["top1_stderr"] == pytest.approx(unc.top_share(ids).stderr)
    assert rand1["top1_stderr"] != pytest.approx(math.sqrt(0.2 * 0.8 / 9), rel=0.02)


def test_first_tokens_words_mix_and_examples(tok, generations):
    first = selfgen.first_tokens(generations, tok, k=3)
    assert list(first.columns) == ["strategy", "rank", "token_id", "token", "count", "share", "stderr"]
    n = first["strategy"].map({k: len(r.samples) for k, r in generations.items()})
    p = first["share"]
    assert first["stderr"].to_numpy() == pytest.approx(np.sqrt(p * (1 - p) / (n - 1)))
    assert first.groupby("strategy").size().to_dict() == {"bos": 3, "rand1": 3, "rand2": 3}
    top = first[(first.strategy == "bos") & (first["rank"] == 1)].iloc[0]
    assert top["token"] == "<|user|>" and top["count"] == 8
    words = selfgen.first_words(generations, tok, n_words=3, k=2)
    assert set(words["position"]) == {1, 2, 3}
    w2 = words[(words.strategy == "bos") & (words.position == 2) & (words["rank"] == 1)].iloc[0]
    assert w2["word"] == "the" and w2["share"] == pytest.approx(0.8)
    mixes = selfgen.domain_mixes(generations, tok)
    for _, g in mixes.groupby("strategy"):
        assert g["share"].sum() == pytest.approx(1.0) and len(g) == 6
    ex = generation.examples(generations["rand1"], tok, n=3, start=1)
    assert list(ex["index"]) == [1, 2, 3] and set(ex["seed sequence"]) == {"tree"}
    assert "⏎" not in ex["continuation"].iloc[0]
    only_chat = generation.examples(generations["bos"], tok, n=20, domain="chat")
    assert len(only_chat) == 9 and set(only_chat["seed sequence"]) == {"⟨bos⟩"}
    cut = generation.examples(generations["bos"], tok, n=1, width=12)
    assert len(cut["continuation"].iloc[0]) == 12 and cut["continuation"].iloc[0].endswith("…")
    with pytest.raises(ValueError, match="unknown domain"):
        generation.examples(generations["bos"], tok, domain="poetry")
    html = generation.examples_view(ex).to_html()
    assert "monospace" in html and "tree" in html


def test_headline_keys_and_values(tok, generations):
    table = selfgen.strategy_table(generations, tok)
    h = generation.headline(generations, table)
    assert set(h) == HEADLINE_02
    assert h["bos_top1_share"] == pytest.approx(0.8) and h["rand1_top1_share"] == pytest.approx(0.2)
    assert h["bos_chat_share"] == pytest.approx(0.9) and h["rand1_chat_share"] == pytest.approx(0.1)
    total = sum(r.n_tokens for r in generations.values())
    assert h["tokens_generated"] == total and h["tokens_per_s"] == pytest.approx(total / 7.0)
    with pytest.raises(ValueError, match="rand1"):
        generation.headline({"bos": generations["bos"]}, table[table.strategy == "bos"])


def _claims_02(tok, generations):
    table = selfgen.strategy_table(generations, tok)
    firsts = generation.first_token_frame(generations)
    return table, firsts, generation.claims(table, firsts)


def test_first_tokens_and_shares_carry_their_intervals(tok, generations):
    table = selfgen.strategy_table(generations, tok)
    firsts = generation.first_token_frame(generations)
    assert list(firsts.columns) == ["strategy", "index", "first_token"]
    assert firsts.groupby("strategy").size().to_dict() == {"bos": 10, "rand1": 10, "rand2": 4}
    iv = generation.shares(table, firsts).set_index(["strategy", "share"])
    assert set(iv.index.get_level_values("share")) == set(generation.SHARES)
    wilson = unc.share(9, 10)  # BOS: 9 of 10 contain a chat tag
    assert iv.loc[("bos", "chat_share"), ["lo", "hi"]].tolist() == [wilson.lo, wilson.hi]
    top = unc.top_share(firsts.loc[firsts.strategy == "rand1", "first_token"])
    assert iv.loc[("rand1", "top1_share"), ["value", "lo", "hi"]].tolist() == [top.value, top.lo, top.hi]
    assert (iv["lo"] <= iv["value"]).all() and (iv["value"] <= iv["hi"]).all()


def _gatekept(judged) -> list[float]:
    """The adjusted p-values of a hierarchy: the primary's own, then ``max(p_primary, p_Holm)``."""
    p = [c.test.p_value for c in judged]
    return [p[0], *np.maximum(holm(p[1:]), p[0])]


def test_fig10_claims_are_the_chapter_hierarchy_judged_by_their_intervals(tok, generations):
    """The primary claim: 0 of 10 rand×1 samples open with a tag against 8 of 10 BOS samples (resolved);
    then, gatekept behind it with Holm between them, BOS over ½ only at p ≈ 0.06 (not resolved) and the
    top-1 shares 0.8 and 0.2 (resolved)."""
    table, firsts, judged = _claims_02(tok, generations)
    assert [c.test.p_value for c in judged] and [c.result.family for c in judged] == [3] * 3
    assert [c.role for c in judged] == ["primary", "secondary", "secondary"]
    assert generation.HIERARCHY.primary == judged[0].claim
    assert [c.result.p_adjusted for c in judged] == pytest.approx(_gatekept(judged))
    assert [c.verdict for c in judged] == [REPRODUCED, UNRESOLVED, REPRODUCED]
    bos = judged[1].test
    assert bos.estimate.value == pytest.approx(0.8 - 0.5)
    assert bos.estimate.lo == pytest.approx(unc.share(8, 10).lo - 0.5)
    assert bos.p_value > 0.05 and bos.estimate.lo < 0  # the score test and the Wilson interval agree
    assert judged[0].test.estimate.value == pytest.approx(0.0 - 0.8) and judged[0].test.direction == -1
    assert judged[2].test.estimate.value == pytest.approx(0.2 - 0.8)
    assert len({c.id for c in judged}) == 3 and all(c.chapter == generation.CHAPTER for c in judged)
    claims = generation.headline(generations, table, judged)["claims"]
    assert [r["verdict"] for r in claims] == [c.verdict for c in judged]
    assert {"chapter", "claim", "measured", "value", "lo", "hi", "n", "direction", "gate_ok", "verdict",
            "p_adjusted", "role", "level"} <= set(claims[0])
    json.dumps(claims, allow_nan=False)  # summary-ready
    swapped = table.replace({"strategy": {"bos": "rand1", "rand1": "bos"}})
    flipped = firsts.replace({"strategy": {"bos": "rand1", "rand1": "bos"}})
    words = [c.verdict for c in generation.claims(swapped, flipped)]
    assert [words[0], words[2]] == [REVERSED, REVERSED]


def test_findings_give_intervals_and_only_interval_verdicts(tok, generations):
    table, firsts, judged = _claims_02(tok, generations)
    mixes = selfgen.domain_mixes(generations, tok)
    iv = generation.shares(table, firsts)
    text = generation.findings(table, mixes, iv, judged, vocab_size=3000, model_name="pocket")
    w = unc.share(9, 10)
    assert f"90 % [{100 * w.lo:.0f} %, {100 * w.hi:.0f} %] contain one" in text  # a share with its interval
    assert "Verdict" not in text and "±" not in text
    assert "4.0× less concentrated than BOS" in text  # top-1 shares 0.8 and 0.2
    assert "not resolved at this sample size" in text and text.count("reproduced (") == 2
    assert "adjusted p" in text and "the chapter's hierarchy of 3 claims" in text
    assert "BOS samples are chat 90 %" in text  # the domain sentence, from the classifier
    assert "3,000 tokens" in text  # rand1's 20 % top share is far above 0.66 %: the caveat is stated


def _few_generations(tok):
    """Five samples each, BOS barely ahead: nothing the intervals can resolve."""
    bos = ["<|user|> a b", "<|user|> c d", "<|user|> e", "the city", "a book"]
    rand = ["<|user|> x", "<|user|> y", "the king", "one + two", "red blue"]
    return {"bos": _generation(tok, "bos", bos),
            "rand1": _generation(tok, "rand1", rand, seed_texts=["tree"] * 5)}


def test_no_verdict_word_when_nothing_is_resolved(tok):
    generations = _few_generations(tok)
    table, firsts, judged = _claims_02(tok, generations)
    assert [c.verdict for c in judged] == [UNRESOLVED] * 3
    mixes = selfgen.domain_mixes(generations, tok)
    text = generation.findings(table, mixes, generation.shares(table, firsts), judged)
    assert text.count("not resolved at this sample size") == 3
    assert not any(word in text for word in ("reproduce", "reversed", "Verdict"))


def test_top_share_claim_and_share_claims_match_their_tests():
    rng = np.random.default_rng(0)
    a, b = rng.choice(200, 300), np.r_[np.zeros(250, int), rng.choice(40, 50)]
    test = unc.top_share_claim(a, b)
    assert test.estimate.value == pytest.approx(unc.top_share(a).value - unc.top_share(b).value)
    assert test.verdict() == REPRODUCED and test.estimate.hi < 0
    assert unc.top_share_claim(a, b, direction=1).verdict() == REVERSED
    assert unc.top_share_claim(a[:1], b).verdict() == NOT_MEASURED  # a single sequence
    # two shares: the p-value is the level at which Newcombe's interval touches 0, so the two agree
    for counts in [(29, 100, 17, 100), (30, 100, 20, 100), (5, 10, 0, 10), (40, 80, 40, 80)]:
        t = unc.share_difference_claim(*counts)
        assert (t.p_value < 0.05) == (t.estimate.excludes_zero() != 0), counts
    edge = unc.share_difference_claim(29, 100, 17, 100)
    lo, _ = unc._newcombe(29, 100, 17, 100, 1 - edge.p_value)
    assert lo == pytest.approx(0, abs=1e-9)
    # a share against a bound: the score test, which the Wilson interval inverts
    for count in range(55, 66):
        t = unc.share_claim(count, 100, 0.5)
        assert (t.p_value < 0.05) == (t.estimate.lo > 0), count
    with pytest.raises(ValueError, match="strictly between"):
        unc.share_claim(3, 10, 1.0)


def test_generate_resume_timing_and_load_generations(tmp_path):
    model, tok, _ = tiny_loaded("llama", n_layers=2)
    counts = {"bos": 6, "rand1": 6}
    sampling = selfgen.SamplingSettings(8, 4, collect_layers=[0, 1])
    first = selfgen.generate(model, tok, counts, tmp_path, sampling, progress=False)
    timing = json.loads((tmp_path / "rand1" / "timing.json").read_text())
    assert timing["tokens"] == first["rand1"].n_tokens > 0 and timing["seconds"] > 0
    assert (tmp_path / "bos" / "keys-00000-of-00001.safetensors").is_file()
    again = selfgen.generate(model, tok, counts, tmp_path, sampling, progress=False)
    for s in counts:  # resumed: nothing regenerated, the original speed still reported
        assert again[s].samples == first[s].samples
        assert again[s].seconds == pytest.approx(first[s].seconds)
    loaded = selfgen.load_generations(tmp_path)
    assert list(loaded) == ["bos", "rand1"]
    assert loaded["rand1"].tokens_per_s == pytest.approx(first["rand1"].tokens_per_s)
    with pytest.raises(FileNotFoundError, match="rand3"):
        selfgen.load_generations(tmp_path, ["bos", "rand3"])
    with pytest.raises(FileNotFoundError, match="chapter 02"):
        selfgen.load_generations(tmp_path / "missing")
    with pytest.raises(ValueError, match="different configuration"):
        selfgen.generate(model, tok, {"bos": 7}, tmp_path, sampling, progress=False)
    with pytest.raises(ValueError, match="unknown seed strategy"):
        selfgen.generate(model, tok, {"rand0": 3}, tmp_path / "x", sampling, progress=False)


def test_write_tables(tmp_path):
    paths = write_tables(tmp_path / "out", {"a": pd.DataFrame({"x": [1, 2]})})
    assert paths == [tmp_path / "out" / "a.csv"] and pd.read_csv(paths[0])["x"].tolist() == [1, 2]
    paths = write_tables(tmp_path / "out", {"b": pd.DataFrame({"x": [3]})}, "parquet")
    assert paths == [tmp_path / "out" / "b.parquet"] and pd.read_parquet(paths[0])["x"].tolist() == [3]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.csv", "b.parquet"]  # no temporaries
    with pytest.raises(ValueError, match="table_format"):
        write_tables(tmp_path / "out", {}, "xlsx")


# ----------------------------------------------------------------------------- NLL with a context prefix


def test_document_nll_n_context_skips_the_seed_targets():
    model, tok, _ = tiny_loaded("llama", n_layers=2)
    docs = [[1, 10, 11, 12, 13, 14, 15], [1, 20, 21, 22]]
    full = document_nll(model, tok, docs, settings=NLLSettings(exclude_ids=()), progress=False)
    ctx = document_nll(model, tok, docs, settings=NLLSettings(exclude_ids=()), progress=False,
                       n_context=[2, 3])
    with torch.no_grad():
        for d, (ids, k) in enumerate(zip(docs, [2, 3], strict=True)):
            logits = model(torch.tensor([ids])).logits[0]
            ce = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
            assert full["nll"][d] == pytest.approx(float(ce.mean()), rel=1e-5)
            assert ctx["nll"][d] == pytest.approx(float(ce[k - 1 :].mean()), rel=1e-5)
            assert ctx["n_tokens"][d] == len(ids) - k
    # windows: the context prefix only applies to the first window(s) it reaches
    win = document_nll(model, tok, [list(range(4, 14))], settings=NLLSettings(exclude_ids=(), window=4),
                       progress=False, n_context=[5])
    # windows [0:4] [4:8] [8:10]: each window's first token is context; targets 5, 6, 7 and 9 count
    assert win["n_tokens"][0] == 4
    with pytest.raises(ValueError, match="n_context has 1 entries for 2 documents"):
        document_nll(model, tok, docs, progress=False, n_context=[2])


# ----------------------------------------------------------------------------- chapter 03 glue


def test_nll_spec_and_mixture_counts():
    assert alignment.nll_spec("pocket:wiki") == "pocket:wiki?split=validation"
    assert alignment.nll_spec("pocket:chat?seed=3") == "pocket:chat?seed=3&split=validation"
    assert alignment.nll_spec("pocket:chat?split=train") == "pocket:chat?split=train"
    assert alignment.nll_spec("wikimedia/wikipedia:20231101.en") == "wikimedia/wikipedia:20231101.en"
    counts = alignment.mixture_counts({"a": 0.5, "b": 0.5}, {"a": 10.0, "b": 40.0}, 100)
    assert counts == {"a": 80, "b": 20}  # equal token shares: four times as many short documents
    counts = alignment.mixture_counts(
        {"a": 0.98, "b": 0.01, "c": 0.01, "z": 0.0}, {"a": 1, "b": 1, "c": 1, "z": 1}, 10
    )
    assert sum(counts.values()) == 10 and counts["b"] == counts["c"] == 1 and "z" not in counts
    with pytest.raises(ValueError, match="cannot cover"):
        alignment.mixture_counts({"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1, "c": 1}, 2)
    with pytest.raises(ValueError, match="no positive weight"):
        alignment.mixture_counts({"a": 0.0}, {"a": 1.0}, 5)


def _nll_frame(closest: str, seed: int = 0) -> pd.DataFrame:
    """Post-training NLLs ~ N(1, .2); ``closest`` shares that distribution, the others sit further away."""
    rng = np.random.default_rng(seed)
    shifts = {"moir": 0.6, "moir-bos": 0.4, "wiki": 1.2, "web": 0.9, "code": 2.0, "math": 1.5}
    shifts[closest] = 0.0
    rows = [
        pd.DataFrame({"corpus": c, "role": "corpus", "nll": rng.normal(1 + s, 0.2, 400)})
        for c, s in shifts.items()
    ]
    rows.append(
        pd.DataFrame({"corpus": "post-training", "role": "reference", "nll": rng.normal(1, 0.2, 400)})
    )
    rows.append(
        pd.DataFrame({"corpus": "pretraining", "role": "reference", "nll": rng.normal(2.2, 0.3, 400)})
    )
    return pd.concat(rows, ignore_index=True)


def _coverage(moir_wins: bool) -> pd.DataFrame:
    rows = []
    for layer in (1, 2):
        for d in ("wiki", "web", "code", "math", "post-training"):
            base = {"C_Wiki": 0.8 if d == "wiki" else 0.3, "C_Moir": 0.6, "C_Moir-bos": 0.5, "C_Oracle": 0.7}
            if not moir_wins:  # C_Moir only beats C_Wiki on code
                base["C_Moir"] = 0.35 if d == "code" else 0.2
            for name, cov in base.items():
                rows.append(
                    {"name": name, "domain": d, "layer": layer, "k": 4, "coverage": cov, "random": 0.25}
                )
    return pd.DataFrame(rows)


def _summary() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "name": ["C_Wiki", "C_Moir", "C_Wiki", "C_Moir"],
            "layer": [1, 1, 2, 2],
            "effective_rank": [10.0, 30.0, 12.0, 34.0],
        }
    )


def _angles() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "a": ["C_Wiki"] * 4,
            "b": ["C_Moir"] * 4,
            "layer": [1, 1, 2, 2],
            "k": 2,
            "index": [0, 1, 0, 1],
            "angle_rad": np.radians([10, 50, 20, 40]),
            "angle_deg": [10.0, 50.0, 20.0, 40.0],
            "cos": np.cos(np.radians([10, 50, 20, 40])),
        }
    )


def test_jsd_tables_headline_and_findings_when_moir_is_closest():
    jsd = alignment.jsd(_nll_frame("moir"))
    assert len(jsd) == 12 and set(jsd["reference"]) == {"pretraining", "post-training"}
    assert (jsd["jsd"] >= 0).all() and (jsd["jsd"] <= math.log(2)).all()
    assert np.allclose(jsd["distance"], np.sqrt(jsd["jsd"]))
    row = jsd[(jsd.corpus == "web") & (jsd.reference == "post-training")].iloc[0]
    assert row["paper_jsd"] == pytest.approx(0.1572)
    wide = nll_jsd.jsd_wide(jsd)
    assert wide.index[0] == "moir" and list(wide.columns[:2]) == ["JSD pre", "JSD post"]
    assert wide.loc["moir", "paper post"] == pytest.approx(0.0350)
    h = nll_jsd.headline(jsd, _coverage(True), _summary(), _angles())
    assert h["claims"] == []
    assert h["post_order"][0] == "moir" and h["closest_to_post"] == "moir"
    assert h["moir_closest_to_post"] and h["moir_closer_than_bos_post"]
    assert h["post_order"] == list(wide.index)
    assert h["wiki_over_moir_post"] == pytest.approx(h["wiki_post_jsd"] / h["moir_post_jsd"])
    assert h["moir_over_wiki_domains"] == ["web", "code", "math", "post-training"]
    assert h["coverage_best"]["wiki"] == "C_Wiki" and h["coverage_best"]["code"] == "C_Oracle"
    assert h["effective_rank"] == {"C_Wiki": 11.0, "C_Moir": 32.0}
    assert h["angle_moir_wiki_deg"] == pytest.approx(30.0) and h["angle_moir_oracle_deg"] is None
    json.dumps(h, allow_nan=False)  # summary-ready
    text = nll_jsd.findings(h)  # no judged claims: the ordering is described, not judged
    assert "Closest to post-training** (point estimates): `moir`" in text
    assert not any(word in text for word in ("reproduce", "reversed", "Verdict", "holds here"))
    assert "C_Moir covers more than C_Wiki on 4 of 5 domains" in text and "does not judge" in text


def test_jsd_ordering_claims_are_one_family_with_enough_replicates():
    """Moir planted closest (moir-bos next, at a 0.4 shift): the ordering's three claims are reproduced;
    with moir-bos planted closest, "Moir is the closest" and "closer than moir-bos" are reversed."""
    import inspect

    assert unc.N_JSD_RESAMPLES >= 1000
    assert inspect.signature(nll_jsd.claims).parameters["n_resamples"].default == unc.N_JSD_RESAMPLES
    assert _parameters(NB03)["jsd_resamples"] >= unc.N_JSD_RESAMPLES
    nll = _nll_frame("moir")
    jsd = alignment.jsd(nll)
    with pytest.raises(ValueError, match="at least 1000"):
        nll_jsd.claims(nll, jsd, n_resamples=200)
    judged = nll_jsd.claims(nll, jsd)
    assert [c.verdict for c in judged] == [REPRODUCED] * 3
    assert [c.result.family for c in judged] == [3] * 3 and len({c.id for c in judged}) == 3
    assert [c.result.p_adjusted for c in judged] == pytest.approx(_gatekept(judged))
    assert judged[0].claim == nll_jsd.HIERARCHY.primary and judged[0].role == "primary"
    post = jsd[jsd.reference == "post-training"].set_index("corpus")["jsd"]
    nearest = judged[0]
    assert "(here moir-bos)" in nearest.measured
    assert nearest.test.estimate.value == pytest.approx(post["moir"] - post.drop("moir").min(), rel=1e-6)
    assert all(c.estimate.lo <= c.estimate.value <= c.estimate.hi for c in judged)
    h = nll_jsd.headline(jsd, _coverage(True), _summary(), _angles(), judged)
    assert [c["verdict"] for c in h["claims"]] == [REPRODUCED] * 3
    json.dumps(h, allow_nan=False)
    text = nll_jsd.findings(h, judged=judged)
    assert "judged by bootstrap 95 % intervals" in text and text.count("reproduced (") == 3
    swapped = _nll_frame("moir-bos", seed=1)
    judged = nll_jsd.claims(swapped, alignment.jsd(swapped))
    assert [c.verdict for c in judged] == [REVERSED, REVERSED, REPRODUCED]


def test_jsd_claims_of_exchangeable_corpora_say_no_verdict_word():
    """Moir, Moir-bos and wiki drawn from the post-training distribution itself: nothing to resolve, and the
    closing text then names no verdict but "not resolved"."""
    rng = np.random.default_rng(5)
    frames = [pd.DataFrame({"corpus": c, "nll": rng.normal(1, 0.2, 120)})
              for c in ("moir", "moir-bos", "wiki", "post-training")]
    frames.append(pd.DataFrame({"corpus": "pretraining", "nll": rng.normal(2, 0.3, 120)}))
    nll = pd.concat(frames, ignore_index=True)
    jsd = alignment.jsd(nll)
    judged = nll_jsd.claims(nll, jsd)
    assert [c.verdict for c in judged] == [UNRESOLVED] * 3
    h = nll_jsd.headline(jsd, _coverage(True), _summary(), _angles(), judged)
    text = nll_jsd.findings(h, judged=judged)
    assert text.count("not resolved at this sample size") == 3
    assert not any(word in text for word in ("reproduced", "reversed", "Verdict"))


def test_nll_summary_gives_t_intervals_of_the_mean():
    from scipy import stats

    nll = _nll_frame("moir").groupby("corpus", sort=False).head(16)
    summary = nll_jsd.nll_summary(nll).set_index("corpus")
    x = nll.loc[nll.corpus == "wiki", "nll"].to_numpy()
    half = stats.t.ppf(0.975, 15) * x.std(ddof=1) / math.sqrt(16)
    row = summary.loc["wiki"]
    assert row["n"] == 16 and row["mean"] == pytest.approx(x.mean())
    assert (row["lo"], row["hi"]) == pytest.approx((x.mean() - half, x.mean() + half))
    assert row["median"] == pytest.approx(np.median(x))


def test_headline_and_findings_when_moir_bos_is_closest():
    jsd = alignment.jsd(_nll_frame("moir-bos", seed=1))
    h = nll_jsd.headline(jsd, _coverage(False), _summary(), _angles())
    assert h["closest_to_post"] == "moir-bos" and not h["moir_closest_to_post"]
    assert not h["moir_closer_than_bos_post"] and h["moir_over_wiki_domains"] == ["code"]
    mixes = pd.DataFrame(
        {
            "strategy": ["bos", "bos", "rand1", "rand1"],
            "domain": ["chat", "wiki", "chat", "wiki"],
            "share": [0.95, 0.05, 0.2, 0.8],
        }
    )
    text = nll_jsd.findings(h, mixes, model_name="olmo")
    assert "(point estimates): `moir-bos`" in text and "Verdict" not in text
    assert "moir-bos: chat 95 %, wiki 5.0 %" in text and "sits near it" in text
    assert "C_Moir covers more than C_Wiki on 1 of 5 domains (code)" in text


def test_coverage_mean_and_angle_summary():
    cov = _coverage(True)
    cov.loc[(cov.layer == 2) & (cov.name == "C_Moir") & (cov.domain == "math"), "coverage"] = 1.0
    mean = alignment.coverage_mean(cov)
    assert list(mean.index) == list(alignment.C_NAMES)
    assert list(mean.columns) == ["wiki", "web", "code", "math", "post-training"]
    assert mean.loc["C_Moir", "math"] == pytest.approx(0.8)
    ang = alignment.angle_summary(_angles())
    assert ang["mean_angle_deg"].tolist() == [30.0, 30.0] and ang["max_angle_deg"].tolist() == [50.0, 40.0]


def test_jsd_needs_both_references():
    frame = _nll_frame("moir")
    with pytest.raises(ValueError, match="pretraining"):
        alignment.jsd(frame[frame.corpus != "pretraining"])


def test_summary_records_sit_beside_the_headline(tmp_path):
    table = pd.DataFrame({"corpus": ["a", "b"], "jsd": [0.1, np.nan], "n": np.array([3, 4], dtype=np.int64)})
    write_summary(tmp_path, "03_nll_jsd", {"closest_to_post": "web"}, {"seed": 0},
                  summary_tables={"jsd_table": table})
    summary = read_summary(tmp_path)
    assert summary["headline"] == {"closest_to_post": "web"}
    assert summary["jsd_table"] == [{"corpus": "a", "jsd": 0.1, "n": 3}, {"corpus": "b", "jsd": None, "n": 4}]
    assert list(summary)[-1] == "jsd_table"
    with pytest.raises(ValueError, match="summary field"):
        write_summary(tmp_path, "03_nll_jsd", {}, {}, summary_tables={"headline": table})


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    """A tiny random model, two self-generated corpora with keys, and three local 'domains'."""
    root = tmp_path_factory.mktemp("world")
    loaded = tiny_loaded("llama", n_layers=3)
    generations = selfgen.generate(
        loaded.model,
        loaded.tokenizer,
        {"bos": 12, "rand1": 12},
        root / "gen",
        selfgen.SamplingSettings(10, 6, collect_layers=[1, 2]),
        progress=False,
    )
    specs = {}
    for i, name in enumerate(("a", "b", "chat")):
        path = root / f"{name}.txt"
        path.write_text("\n".join(random_documents(60, seed=i, min_words=3, max_words=5 + 15 * i)) + "\n")
        specs[name] = f"file:{path}"
    return loaded, generations, specs


def test_nll_corpora_and_table_on_a_tiny_world(tiny_world):
    loaded, generations, specs = tiny_world
    corpora = alignment.nll_corpora(
        loaded.tokenizer,
        generations,
        alignment.CorpusSpecs(
            domains={"a": specs["a"], "b": specs["b"]}, reference=specs["chat"], mixture={"a": 0.5, "b": 0.5}
        ),
        n_docs=10,
        n_reference=12,
    )
    assert list(corpora.documents) == ["moir", "moir-bos", "a", "b", "pretraining", "post-training"]
    assert corpora.role["moir"] == "self-generated" and corpora.role["pretraining"] == "reference"
    assert corpora.n_context["moir"] == [2] * 10 and corpora.n_context["moir-bos"] == [1] * 10
    assert sum(corpora.mixture.values()) == 12 and corpora.mixture["a"] > corpora.mixture["b"]  # shorter docs
    nll = alignment.nll_table(loaded.model, loaded.tokenizer, corpora, progress=False)
    assert set(nll["corpus"]) == set(corpora.documents) and (nll["nll"] > 0).all()
    moir = nll[nll.corpus == "moir"]
    special = set(loaded.tokenizer.all_special_ids)  # sampled <eos>/<pad>/<unk> are not targets
    counted = [sum(t not in special for t in r["token_ids"]) for r in generations["rand1"].samples[:10]]
    assert moir["n_tokens"].tolist() == [c for c in counted if c]
    with pytest.raises(ValueError, match="not among the domain corpora"):
        alignment.nll_corpora(
            loaded.tokenizer,
            generations,
            alignment.CorpusSpecs(
                domains={"a": specs["a"]}, reference=specs["chat"], mixture={"a": 0.5, "c": 0.5}
            ),
            n_docs=5,
            n_reference=5,
        )


def test_covariances_oracle_is_the_mixture_and_moir_uses_the_generation_keys(
    tiny_world, tmp_path, monkeypatch
):
    from moir_lib.generation import load_key_stats

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    from moir_lib.profiles import load_profile

    loaded, generations, specs = tiny_world
    profile = load_profile("pocket-micro").with_overrides(
        {"edit_layers": [1, 2], "covariance.tokens_per_batch": 256, "covariance.wiki_corpus": specs["a"]})
    cs = alignment.covariances(
        loaded,
        profile,
        generations,
        alignment.CorpusSpecs(
            domains={"a": specs["a"], "b": specs["b"]}, reference=specs["chat"], mixture={"a": 3.0, "b": 1.0}
        ),
        n_docs=15,
        progress=False,
    )
    assert list(cs.named) == list(alignment.C_NAMES) and list(cs.probes) == ["a", "b", "post-training"]
    for layer in (1, 2):
        expected = 0.75 * cs.components["a"].mean(layer) + 0.25 * cs.components["b"].mean(layer)
        assert torch.allclose(cs.named["C_Oracle"].mean(layer), expected, rtol=1e-12, atol=0)
        assert not torch.equal(cs.named["C_Wiki"].mean(layer), cs.components["a"].mean(layer))  # seed + 1
        moir_keys = load_key_stats(generations["rand1"].gen_dir)
        assert torch.equal(cs.named["C_Moir"].mean(layer), moir_keys.mean(layer))
        assert not torch.equal(cs.probes["a"].mean(layer), cs.components["a"].mean(layer))  # other documents
    diag = alignment.diagnostics(cs.named, cs.probes, [1, 2], k=4)
    assert set(diag.coverage["k"]) == {4} and diag.coverage["coverage"].between(0, 1).all()
    assert len(diag.angles) == 6 * 2 * 4  # 6 pairs x 2 layers x k angles
    with pytest.raises(ValueError, match="k must be in"):
        alignment.diagnostics(cs.named, cs.probes, [1, 2], k=10_000)
    with pytest.raises(ValueError, match="bos"):
        alignment.covariances(
            loaded,
            profile,
            {"rand1": generations["rand1"]},
            alignment.CorpusSpecs(domains={"a": specs["a"]}, reference=specs["chat"], mixture={"a": 1.0}),
            n_docs=5,
        )


# ----------------------------------------------------------------------------- plots


def test_plots_of_both_chapters_accept_the_tables(tok, generations):
    from moir_lib import plots

    table = selfgen.strategy_table(generations, tok)
    figs = [
        plots.first_token_bars(selfgen.first_tokens(generations, tok)),
        plots.first_words_bars(selfgen.first_words(generations, tok)),
        plots.seed_strategy_shares(table),
        plots.domain_mix_bars(selfgen.domain_mixes(generations, tok)),
    ]
    nll = _nll_frame("moir")
    jsd = alignment.jsd(nll)
    spectrum = pd.DataFrame(
        {"name": "C_Moir", "layer": 1, "index": range(5), "share": [0.5, 0.2, 0.2, 0.1, 0.0]}
    )
    figs += [
        plots.nll_distributions(nll, ["moir"]),
        plots.jsd_bars(jsd),
        plots.c_spectra(spectrum),
        plots.principal_angles_heatmap(alignment.angle_summary(_angles())),
        plots.coverage_bars(_coverage(True)),
    ]
    assert all(len(f.data) for f in figs)
    fig = plots.nll_distributions(nll, ["moir"])
    assert [t.name.split(" ")[0] for t in fig.data] == ["moir", "pretraining", "post-training"]
    assert fig.data[2].line.dash == "solid" and fig.data[1].line.dash == "dot"
    assert fig.data[0].line.color == plots.PALETTE["moir"]
    bars = plots.first_token_bars(selfgen.first_tokens(generations, tok), k=2)
    assert bars.data[0].y[0].endswith("<|user|>") and bars.data[0].x[0] == pytest.approx(0.8)
    assert bars.data[0].error_x.array[0] == pytest.approx(Z95 * math.sqrt(0.8 * 0.2 / 9))  # 95 % whiskers
    shares = plots.seed_strategy_shares(table)
    assert shares.data[0].error_y.array[0] == pytest.approx(Z95 * table["top1_stderr"].iloc[0])
    assert (
        plots.selfgen._token_label("\n") == "⏎" and plots.selfgen._token_label(" a") == "␣a"
        and plots.selfgen._token_label("") == "∅"
    )
    with pytest.raises(ValueError, match="lacks columns"):
        plots.coverage_bars(pd.DataFrame({"name": ["x"]}))


# ----------------------------------------------------------------------------- the chapters, end to end


def _moir_run(notebook: Path, out: Path, *params: str) -> Path:
    from moir_lib.cli import main

    args = ["run", str(notebook), "-q", "--profile", "pocket-micro", "--out", str(out)]
    for i in range(0, len(params), 2):
        args += ["-p", params[i], params[i + 1]]
    assert main(args) == 0, f"moir run of {notebook.name} failed"
    return out


@pytest.fixture(scope="module")
def generation_run(tmp_path_factory) -> Path:
    return _moir_run(
        NB02,
        tmp_path_factory.mktemp("run") / "02_generation",
        "n_samples",
        "24",
        "n_samples_long",
        "6",
        "max_new_tokens",
        "12",
        "n_examples",
        "3",
        "batch_size",
        "16",
        "organisms",
        "[0, 1]",
    )


def _parameters(notebook: Path) -> dict:
    """The defaults of a notebook's ``parameters`` cell."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    values: dict = {}
    exec(cell.source, {}, values)
    return values


def _micro_tokenizer():
    from transformers import PreTrainedTokenizerFast

    from moir_lib.pocket import build

    return PreTrainedTokenizerFast.from_pretrained(build("micro"))


def _findings_text(executed: Path) -> str:
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    last = nb.cells[-1]
    assert "remove-input" in last.metadata.get("tags", [])
    return "".join(o.get("data", {}).get("text/markdown", "") for o in last.outputs)


def test_generation_chapter_end_to_end(generation_run):
    summary = read_summary(generation_run)
    h = summary["headline"]
    assert set(h) == HEADLINE_02
    for key in ("bos_top1_share", "rand1_top1_share", "bos_chat_share", "rand1_chat_share"):
        assert 0.0 <= h[key] <= 1.0, key
    assert h["bos_top1_share"] >= 1 / 24 and h["rand1_top1_share"] >= 1 / 24  # a share of 24 samples
    assert 0 < h["tokens_generated"] <= (2 * 24 + 3 * 6) * 12 and h["tokens_per_s"] > 0
    assert summary["parameters"]["profile"] == "pocket-micro" and summary["parameters"]["n_samples"] == 24
    gens = generation_run / "generations"
    generations = selfgen.load_generations(gens)
    assert list(generations) == ["bos", "rand1", "rand2", "rand3", "rand4"]
    assert [len(r.samples) for r in generations.values()] == [24, 24, 6, 6, 6]
    assert (gens / "rand1" / "keys-00000-of-00001.safetensors").is_file()  # collect_keys
    assert h["tokens_generated"] == sum(r.n_tokens for r in generations.values())
    table = pd.read_csv(generation_run / "strategies.csv")
    assert table["strategy"].tolist() == list(generations)
    again = generation.headline(generations, selfgen.strategy_table(generations, _micro_tokenizer()))
    assert {k: again[k] for k in HEADLINE_02 - {"tokens_per_s", "claims"}} == pytest.approx(
        {k: h[k] for k in HEADLINE_02 - {"tokens_per_s", "claims"}}
    )
    for name in ("shares", "first_tokens", "first_words", "domain_mix"):
        assert (generation_run / f"{name}.csv").is_file()
    # every organism's bos and rand1 shares, organism 0's from the chapter's own samples
    per = pd.read_csv(generation_run / "organism_shares.csv")
    assert set(per["organism"]) == {0, 1} and set(per["strategy"]) == {"bos", "rand1"}
    own = pd.read_csv(generation_run / "shares.csv")
    ours = per[per["organism"] == 0].drop(columns="organism").reset_index(drop=True)
    pd.testing.assert_frame_equal(ours, own[own["strategy"].isin(["bos", "rand1"])].reset_index(drop=True))
    assert len(selfgen.load_generations(generation_run / "organism-1" / "generations")["rand1"].samples) == 24
    assert [c["family"] for c in h["claims"]] == [3] * 3
    assert all(c["verdict"] in (REPRODUCED, REVERSED, UNRESOLVED) for c in h["claims"])
    text = _findings_text(generation_run / "02_generation.ipynb")
    assert "Verdict" not in text and "judged by 95 % intervals" in text


def test_nll_jsd_chapter_end_to_end_reusing_the_generations(generation_run, tmp_path_factory):
    out = _moir_run(
        NB03,
        tmp_path_factory.mktemp("run") / "03_nll_jsd",
        "generation_dir",
        str(generation_run / "generations"),
        "n_docs",
        "16",
        "n_reference",
        "16",
        "cov_docs",
        "16",
        "n_samples",
        "12",
        "organisms",
        "[0, 1]",
    )
    summary = read_summary(out)
    h = summary["headline"]
    assert sorted(h["post_order"]) == sorted(CORPORA) and sorted(h["pre_order"]) == sorted(CORPORA)
    assert h["closest_to_post"] == h["post_order"][0]
    assert h["moir_closest_to_post"] == (h["post_order"][0] == "moir")
    jsd = pd.DataFrame(summary["jsd_table"])
    assert len(jsd) == 12 and set(jsd["corpus"]) == CORPORA
    assert jsd["jsd"].between(0, math.log(2)).all() and np.allclose(jsd["distance"], np.sqrt(jsd["jsd"]))
    post = jsd[jsd.reference == "post-training"].sort_values("jsd")["corpus"].tolist()
    assert post == h["post_order"]
    assert h["moir_post_jsd"] == pytest.approx(
        jsd.set_index(["corpus", "reference"]).loc[("moir", "post-training"), "jsd"]
    )
    cov = pd.DataFrame(summary["coverage_table"])
    assert set(cov["name"]) == set(alignment.C_NAMES)
    assert set(cov["domain"]) == {"wiki", "web", "code", "math", "post-training"}
    assert set(cov["layer"]) == {0, 1} and set(cov["k"]) == {128 // 16}
    assert cov["coverage"].between(0, 1).all() and np.allclose(cov["random"], 8 / 128)
    assert set(h["coverage_mean"]) == set(alignment.C_NAMES) and set(h["effective_rank"]) == set(
        alignment.C_NAMES
    )
    assert all(0 < r <= 128 for r in h["effective_rank"].values())
    assert summary["parameters"]["generation_dir"] == str(generation_run / "generations")
    assert not (out / "generations").exists(), "chapter 03 must reuse chapter 02's samples, not generate"
    for name in ("nll", "nll_summary", "jsd", "c_summary", "angles", "coverage"):
        assert (out / f"{name}.csv").is_file()
    per = pd.read_csv(out / "organism_jsd.csv")  # both differences in both organisms, with intervals
    assert len(per) == 4 and set(per["organism"]) == {0, 1} and (per["lo"] <= per["hi"]).all()
    assert len(selfgen.load_generations(out / "organism-1" / "generations")["bos"].samples) == 12
    nll = pd.read_csv(out / "nll.csv")
    assert nll.groupby("corpus").size().to_dict() == {
        "moir": 16,
        "moir-bos": 16,
        "wiki": 16,
        "web": 16,
        "code": 16,
        "math": 16,
        "pretraining": 16,
        "post-training": 16,
    }
    assert summary["parameters"]["jsd_resamples"] >= unc.N_JSD_RESAMPLES
    assert [c["family"] for c in h["claims"]] == [3] * 3
    text = _findings_text(out / "03_nll_jsd.ipynb")
    assert "Verdict" not in text and "judged by bootstrap 95 % intervals" in text


@pytest.mark.slow
def test_nll_jsd_chapter_generates_its_own_samples(tmp_path):
    out = _moir_run(
        NB03,
        tmp_path / "03_nll_jsd",
        "n_samples",
        "12",
        "max_new_tokens",
        "10",
        "n_docs",
        "12",
        "n_reference",
        "12",
        "cov_docs",
        "12",
    )
    h = read_summary(out)["headline"]
    assert sorted(h["post_order"]) == sorted(CORPORA)
    assert [len(r.samples) for r in selfgen.load_generations(out / "generations").values()] == [12, 12]


def test_unknown_parameter_is_refused_before_running(tmp_path):
    from moir_lib.cli import main

    assert main(["run", str(NB03), "-q", "-p", "n_doc", "3", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
