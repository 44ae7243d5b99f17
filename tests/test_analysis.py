"""moir_lib.analysis: per-document NLL against a hand computation, the KDE-grid Jensen–Shannon
(identity, symmetry, bounds, scipy cross-check, the Fig. 11b noise-floor argument), token
statistics on constructed samples, and the pocket domain classifier on labelled pocket documents."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from moir_lib.analysis import divergence as D
from moir_lib.analysis import nll as N
from moir_lib.analysis import tokens as T

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]
WORDS = [f"w{i}" for i in range(40)]
BOS, EOS, USER, ASSISTANT = 1, 2, 4, 5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=["<|user|>", "<|assistant|>"])


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=32, bos_token_id=BOS, eos_token_id=EOS,
                                      pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval(), make_tokenizer()


# --------------------------------------------------------------------------- NLL


def hand_nll(model, docs: list[list[int]], window: int, exclude: set[int]) -> list[tuple[int, float]]:
    """Eq. (nll) by hand: each window alone, -log softmax at every counted target, mean per document."""
    out = []
    for ids in docs:
        total, count = 0.0, 0
        for s in range(0, len(ids), window):
            chunk = ids[s:s + window]
            if len(chunk) < 2:
                continue
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=torch.tensor([chunk])).logits[0].double(), -1)
            for t in range(len(chunk) - 1):
                if chunk[t + 1] not in exclude:
                    total -= float(logp[t, chunk[t + 1]])
                    count += 1
        out.append((count, total / count if count else math.nan))
    return out


def test_nll_equals_a_hand_computation(tiny) -> None:
    model, tok = tiny
    rng = np.random.default_rng(0)
    docs = [[BOS, *rng.integers(6, 46, n).tolist()] for n in (3, 11, 25, 1)]
    docs[2][5] = USER  # a chat tag inside a document: context, never a target
    docs[2][9] = ASSISTANT
    docs.append([BOS, USER, ASSISTANT])  # nothing left to count
    for window in (32, 7):
        frame = N.document_nll(model, tok, docs, "toy", N.NLLSettings(window=window, batch_size=3),
                               progress=False)
        assert list(frame.columns) == ["corpus", "doc", "n_tokens", "nll"]
        assert (frame["corpus"] == "toy").all() and frame["doc"].tolist() == list(range(5))
        expected = hand_nll(model, docs, window, {0, 1, 2, 3, 4, 5})
        assert frame["n_tokens"].tolist() == [c for c, _ in expected]
        np.testing.assert_allclose(frame["nll"].to_numpy(), [v for _, v in expected], rtol=1e-5,
                                   equal_nan=True)
    assert frame["n_tokens"].tolist() == [3, 10, 20, 1, 0]  # window 7 on 26 tokens: 6+6+6+4 targets - 2 tags
    # batching does not change the result; counting every target does
    one = N.document_nll(model, tok, docs, settings=N.NLLSettings(window=7, batch_size=1), progress=False)
    np.testing.assert_allclose(one["nll"], frame["nll"], rtol=1e-6, equal_nan=True)
    all_targets = N.document_nll(model, tok, docs, settings=N.NLLSettings(window=7, exclude_ids=()),
                                 progress=False)
    assert all_targets["n_tokens"].tolist()[2] == 22
    first = N.document_nll(model, tok, docs, settings=N.NLLSettings(window=7, max_windows=1), progress=False)
    assert first["n_tokens"].tolist()[2] == 5  # 6 targets of the first window, minus the tag at position 5


def test_nll_of_text_documents_prepends_bos_and_uses_the_model_context(tiny) -> None:
    model, tok = tiny
    assert N.default_window(model) == 32  # min(1024, context)
    frame = N.document_nll(model, tok, ["w1 w2 w3", "<|user|> w4 <|assistant|> w5 w6"], progress=False)
    expected = hand_nll(model, [[BOS, 7, 8, 9], [BOS, USER, 10, ASSISTANT, 11, 12]], 32, {0, 1, 2, 3, 4, 5})
    assert frame["n_tokens"].tolist() == [3, 3]
    np.testing.assert_allclose(frame["nll"], [v for _, v in expected], rtol=1e-5)
    with pytest.raises(ValueError, match="window must be at least 2"):
        N.document_nll(model, tok, ["w1"], settings=N.NLLSettings(window=1))
    with pytest.raises(ValueError, match="has no documents"):
        N.document_nll(model, tok, [], progress=False)


# --------------------------------------------------------------------------- Jensen–Shannon


def test_jsd_identity_symmetry_bounds_and_units() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(2.0, 0.5, 800), rng.gamma(4.0, 0.6, 600)
    same = D.jensen_shannon(a, a)
    assert same.jsd == pytest.approx(0.0, abs=1e-12) and same.distance == pytest.approx(0.0, abs=1e-6)
    ab, ba = D.jensen_shannon(a, b), D.jensen_shannon(b, a)
    assert ab.jsd == pytest.approx(ba.jsd, rel=1e-12) and (ab.n_p, ab.n_q) == (ba.n_q, ba.n_p)
    assert 0 < ab.jsd < math.log(2)
    assert ab.jsd_bits == pytest.approx(ab.jsd / math.log(2))
    assert ab.distance == pytest.approx(math.sqrt(ab.jsd))
    assert ab.distance_bits == pytest.approx(math.sqrt(ab.jsd_bits))
    far = D.jensen_shannon(rng.normal(0, 1, 500), rng.normal(100, 1, 500))  # disjoint supports: the bound
    assert far.jsd == pytest.approx(math.log(2), rel=1e-3) and far.jsd <= math.log(2)
    assert far.jsd_bits == pytest.approx(1.0, rel=1e-3) and far.distance_bits <= 1.0


def test_jsd_matches_scipy_on_the_paper_grid() -> None:
    from scipy.spatial.distance import jensenshannon
    from scipy.stats import gaussian_kde

    rng = np.random.default_rng(2)
    a, b = rng.lognormal(0.8, 0.3, 1000), rng.lognormal(0.9, 0.35, 1500)
    lo, hi = np.percentile(np.concatenate([a, b]), [0.5, 99.5])
    grid = np.linspace(lo, hi, 512)
    p, q = gaussian_kde(a, "scott")(grid), gaussian_kde(b, "scott")(grid)
    result = D.jensen_shannon(a, b)
    assert (result.lo, result.hi) == pytest.approx((lo, hi))
    assert result.distance == pytest.approx(jensenshannon(p, q), rel=1e-9)  # scipy normalises p, q itself
    assert result.distance_bits == pytest.approx(jensenshannon(p, q, base=2), rel=1e-9)


def test_fig11b_noise_floor() -> None:
    """Two independent samples of one distribution at the paper's sizes: divergence ~5e-4, distance ~0.02.

    Fig. 11b's smallest entry (.0015, web vs a mixture that is 95 % web) is therefore a divergence: as
    a distance it would be ~15× below what sampling noise alone produces (see divergence.py).
    """
    rng = np.random.default_rng(3)
    runs = [D.jensen_shannon(rng.gamma(6, 0.4, 3000), rng.gamma(6, 0.4, 6000)) for _ in range(4)]
    jsd = np.mean([r.jsd for r in runs])
    distance = np.mean([r.distance for r in runs])
    assert 1e-4 < jsd < 1.5e-3  # .0015 is reachable as a divergence of near-identical corpora ...
    assert distance > 0.01  # ... but not as a distance
    assert min(r.distance for r in runs) > 10 * 0.0015


def test_jsd_table_and_bad_samples() -> None:
    rng = np.random.default_rng(4)
    samples = {"moir": rng.normal(2, 0.4, 300), "wiki": rng.normal(3, 0.5, 300)}
    refs = {"pre": rng.normal(3, 0.5, 400), "post": rng.normal(2, 0.4, 400)}
    table = D.jsd_table(samples, refs)
    assert list(table.columns) == ["corpus", "reference", "jsd", "jsd_bits", "distance", "distance_bits",
                                   "n_corpus", "n_reference"]
    assert len(table) == 4
    wide = table.pivot(index="corpus", columns="reference", values="jsd")
    assert wide.loc["moir", "post"] < wide.loc["moir", "pre"]
    assert wide.loc["wiki", "pre"] < wide.loc["wiki", "post"]
    with_nan = np.concatenate([samples["moir"], [np.nan, np.inf]])
    assert D.jensen_shannon(with_nan, refs["pre"]).n_p == 300  # non-finite values dropped
    with pytest.raises(ValueError, match="at least 2 finite values"):
        D.jensen_shannon([1.0], refs["pre"])
    with pytest.raises(ValueError, match="all 5 values are equal"):
        D.jensen_shannon(np.ones(5), refs["pre"])
    with pytest.raises(ValueError, match="at least one sample"):
        D.jsd_table({}, refs)


# --------------------------------------------------------------------------- token statistics


def rec(seed_ids: list[int], token_ids: list[int], text: str = "") -> dict:
    return {"index": 0, "seed_strategy": "x", "seed_ids": seed_ids, "token_ids": token_ids, "text": text}


def test_first_token_and_chat_tag_statistics_on_constructed_samples() -> None:
    tok = make_tokenizer()
    samples = ([rec([BOS], [USER, 10, 11, EOS])] * 6 + [rec([BOS], [ASSISTANT, 12])] * 2
               + [rec([BOS], [10, USER, 13])] + [rec([BOS], [14, 15, 16])])
    table = T.first_token_table(samples, tok, k=3)
    assert table["token"].tolist() == ["<|user|>", "<|assistant|>", "w4"]
    assert table["count"].tolist() == [6, 2, 1] and table["share"].tolist() == [0.6, 0.2, 0.1]
    assert T.top1_share(samples, tok) == 0.6
    shares = T.chat_tag_shares(samples, tok)
    assert shares == {"n": 10, "starts_with_tag": 0.8, "contains_tag": 0.9}
    texts = ["<|user|> w4 w5", "  <|assistant|> w6", "w4 <|user|>", "w8 w9"]  # strings: text rules
    assert T.chat_tag_shares(texts) == {"n": 4, "starts_with_tag": 0.5, "contains_tag": 0.75}
    words = T.first_words_table(samples, tok, n_words=3, k=2)
    first = words[words["position"] == 1]
    assert first["word"].tolist() == ["<|user|>", "<|assistant|>"] and first["share"].tolist() == [0.6, 0.2]
    third = words[words["position"] == 3]
    assert third["word"].tolist()[0] == "w5" and third["count"].tolist()[0] == 6  # EOS dropped, not a word
    assert ("" in words[words["position"] == 3]["word"].tolist())  # 2-token samples have no third word
    with pytest.raises(ValueError, match="no samples"):
        T.top1_share([])


def test_classify_domain_on_constructed_texts() -> None:
    cases = {
        "chat": "<|user|>\nWhat is the capital of Foo?\n<|assistant|>\nThe capital of Foo is Bar.",
        "math": "Question: Anna has 3 apples. She gets 4 more.\nAnswer: Anna has 3 + 4 = 7 apples.\n#### 7",
        "code": 'def get_total(xs):\n    """Return the sum."""\n    return sum(xs)\n',
        "wiki": "Mobrek Vipan is employed by Lovar Motors. Mobrek Vipan is a citizen of Fukrikeria.",
        "prose": "The weather was sunny and warm. Sam was tired, so he went to bed early.",
        "other": "%% ..",
    }
    for want, text in cases.items():
        assert T.classify_domain(text) == want, (want, text)
    mix = T.domain_mix(list(cases.values()) + [cases["code"]])
    assert isinstance(mix, pd.DataFrame) and mix["domain"].tolist() == list(T.DOMAIN_LABELS)
    assert mix.set_index("domain").loc["code", "count"] == 2 and mix["share"].sum() == pytest.approx(1.0)


def test_classify_domain_on_labelled_pocket_documents() -> None:
    from moir_lib.pocket.corpora import iter_documents

    labels = {"wiki": "wiki", "web": "prose", "code": "code", "math": "math", "chat": "chat"}
    for domain, want in labels.items():
        docs = list(iter_documents(domain, "validation", 60, seed=21))
        # the web's FAQ pages answer questions about the world's facts: whole, they read as encyclopedic;
        # their first 80 characters (a heading and a question) may read as either
        faq = [d.startswith("Frequently asked questions") for d in docs]
        for cut in (None, 80):  # whole documents and short, generation-like prefixes
            got = [T.classify_domain(d if cut is None else d[:cut]) for d in docs]
            wants = [({"wiki"} if cut is None else {"wiki", "prose"}) if f else {want} for f in faq]
            accuracy = np.mean([g in w for g, w in zip(got, wants, strict=True)])
            assert accuracy >= 0.95, (domain, cut, accuracy)
