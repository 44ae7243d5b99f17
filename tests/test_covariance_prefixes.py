"""Nested prefixes of one C pass (moir_lib.covariance.prefixes) and the split-half diagnostic
(moir_lib.covariance.convergence) on tiny random models.

A prefix is checked against an independent estimate over the first m documents alone (to float32
rounding: a document's keys round differently in another batch), the pass with prefixes against one
without (bit for bit), and the cache and resume rules: a cached C without the prefixes asked for is not
served as if it had them, and an interrupted pass resumes to the same prefixes.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny import random_documents, tiny_loaded

from moir_lib import covariance as C
from moir_lib.covariance.prefixes import (
    PrefixTaps,
    format_fraction,
    parse_fraction,
    prefix_counts,
    second_half,
)
from moir_lib.documents import load_corpus

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KW = {"settings": C.EstimationSettings(tokens_per_batch=48), "progress": False}


@pytest.fixture(scope="module")
def llama():
    return tiny_loaded("llama", n_layers=4, seed=0)


class ForwardCounter:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *args):
        self.n += 1

    def close(self):
        self.handle.remove()


def write_corpus(folder, docs):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return folder


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def test_fractions_and_counts():
    assert format_fraction(0.25) == "1/4" and format_fraction("2/16") == "1/8"
    assert prefix_counts(2000, ["1/16", 0.5]) == {"1/16": 125, "1/2": 1000}
    for bad in (0, 1, 1.5, "x", "-1/4"):
        with pytest.raises(ValueError, match="prefix fraction"):
            parse_fraction(bad)
    with pytest.raises(ValueError, match="holds no document"):
        prefix_counts(8, ["1/16"])


def test_prefixes_are_the_first_documents_and_leave_the_result_alone(llama):
    docs = random_documents(60, seed=3)
    points = [1, 7, 20, 33, 59]
    plain = C.estimate(llama, docs, [1, 3], cache=False, **KW)
    tapped = C.estimate(llama, docs, [1, 3], cache=False, prefixes=points, **KW)
    for layer in (1, 3):  # the pass with prefixes is the pass without them, bit for bit
        assert torch.equal(plain.sum(layer), tapped.sum(layer)) and plain.count(layer) == tapped.count(layer)
    assert sorted(tapped.prefixes) == points
    for m in points:
        alone = C.estimate(llama, docs[:m], [1, 3], cache=False, **KW)
        pre = tapped.prefixes[m]
        assert pre.metadata["prefix"]["point"] == m and pre.metadata["corpus"][0]["documents"] == m
        for layer in (1, 3):
            assert pre.count(layer) == alone.count(layer), m
            assert rel(pre.sum(layer), alone.sum(layer)) < 1e-6, m
    # the second half: the documents after a prefix, as their own estimate gives them
    rest = second_half(tapped, tapped.prefixes[20])
    after = C.estimate(llama, docs[20:], [1, 3], cache=False, **KW)
    assert rest.count(1) == after.count(1) and rel(rest.sum(1), after.sum(1)) < 1e-6


def test_a_point_past_the_end_holds_the_whole_corpus(llama, caplog):
    docs = random_documents(12, seed=5)
    stats = C.estimate(llama, docs, [1], cache=False, prefixes=[12, 30], **KW)
    assert torch.equal(stats.prefixes[30].sum(1), stats.sum(1)) and "past the corpus" in caplog.text
    assert stats.prefixes[30].metadata["corpus"][0]["documents"] == 12
    with pytest.raises(ValueError, match="document counts"):
        C.estimate(llama, docs, [1], cache=False, prefixes=[0], **KW)


def test_a_cached_c_without_the_prefixes_is_not_served_as_if_it_had_them(tmp_path, llama):
    folder = write_corpus(tmp_path / "corpus", random_documents(50, seed=7))
    cache = tmp_path / "cache"
    counter = ForwardCounter(llama.model)
    full = C.estimate(llama, load_corpus(folder, n=40, seed=0), [1, 2], cache=cache, **KW)
    whole_pass = counter.n
    assert dict(full.prefixes) == {}
    counter.n = 0
    again = C.estimate(llama, load_corpus(folder, n=40, seed=0), [1, 2], cache=cache, prefixes=[5, 10], **KW)
    assert again.from_cache and again.path == full.path and torch.equal(again.sum(1), full.sum(1))
    assert 0 < counter.n < whole_pass, "the pass ran again, up to the last prefix only"
    assert sorted(again.prefixes) == [5, 10] and (full.path.parent / "prefix-10.safetensors").is_file()
    counter.n = 0
    third = C.estimate(llama, load_corpus(folder, n=40, seed=0), [1, 2], cache=cache, prefixes=[10], **KW)
    assert counter.n == 0 and third.prefixes[10].metadata["prefix"]["of"] == full.metadata["fingerprint"]
    # computed fresh with its prefixes: the same files, bit for bit
    fresh = C.estimate(llama, load_corpus(folder, n=40, seed=0), [1, 2], cache=tmp_path / "other",
                       prefixes=[5, 10], **KW)
    for m in (5, 10):
        assert torch.equal(fresh.prefixes[m].sum(2), again.prefixes[m].sum(2))
    counter.close()


class Interrupt(RuntimeError):
    pass


def test_an_interrupted_pass_resumes_to_the_same_prefixes(tmp_path, llama):
    docs = random_documents(80, seed=9)
    kw = {**KW, "settings": C.EstimationSettings(tokens_per_batch=48, checkpoint_every=1),
          "corpus_spec": "prefix-resume"}
    counter = ForwardCounter(llama.model)
    straight = C.estimate(llama, docs, [1, 3], cache=tmp_path / "a", prefixes=[3, 30, 61], **kw)
    counter.close()
    calls = {"n": 0}

    def stop(*args):  # dies two thirds of the way, past the first window's checkpoint
        calls["n"] += 1
        if calls["n"] == 2 * counter.n // 3:
            raise Interrupt

    handle = llama.model.register_forward_pre_hook(stop)
    try:
        with pytest.raises(Interrupt):
            C.estimate(llama, docs, [1, 3], cache=tmp_path / "b", prefixes=[3, 30, 61], **kw)
    finally:
        handle.remove()
    entry = next((tmp_path / "b").glob("covariance/*"))
    assert (entry / "checkpoint.safetensors").is_file() and (entry / "prefix-3.safetensors").is_file()
    resumed = C.estimate(llama, docs, [1, 3], cache=tmp_path / "b", prefixes=[3, 30, 61], **kw)
    for layer in (1, 3):
        assert torch.equal(resumed.sum(layer), straight.sum(layer))
        for m in (3, 30, 61):
            assert torch.equal(resumed.prefixes[m].sum(layer), straight.prefixes[m].sum(layer)), m


def test_taps_of_a_strided_shard_hold_its_rows_below_the_point():
    """Units of non-contiguous indices (a generation shard's blocks): a point falls at a unit's start or
    inside it, and each row counts below the points above its index."""
    got = {}
    taps = PrefixTaps([4, 9], lambda m, stats, docs: got.setdefault(m, (stats.n_tokens, docs)))
    running = C.CovarianceStats([0], 2)
    for unit in ([1, 4, 7], [10, 13]):  # shard 1 of 3
        taps.begin(running, unit)
        for stats, rows in taps.rows(unit):
            keys = torch.ones(int(rows.sum()), 2)
            stats.update(0, keys)
        running.update(0, torch.ones(len(unit), 2))
        taps.end()
    assert got == {4: (1, 4), 9: (3, 9)}


# ----------------------------------------------------------------------------- split halves


def _lines(n: int, start: int = 0) -> list[str]:
    from pathlib import Path

    raw = Path(__file__).resolve().parents[1] / "data/slices/benchmarks/wikitext2/wiki.test.raw"
    lines = [x.strip() for x in raw.read_text(encoding="utf-8").splitlines() if len(x.strip()) > 200]
    return lines[start:start + n]


def test_cov_estimate_split_half_on_a_corpus_whose_second_half_repeats_the_first(tmp_path, capsys):
    """The known answer: the second half repeats the first, so the halves give the same C (to the rounding
    of a document's keys in another batch) and half the corpus sufficed; independent halves do not agree so
    well. The diagnostic is printed and stored in the statistics' metadata."""
    from moir_lib.cli import main

    first = _lines(30)
    runs = {"repeated": first + first, "independent": first + _lines(30, start=30)}
    found = {}
    for name, docs in runs.items():
        corpus = write_corpus(tmp_path / name, docs)
        out = tmp_path / f"{name}.safetensors"
        assert main(["cov", "estimate", "--profile", "stories260k", "--corpus", str(corpus), "--out",
                     str(out), "--seed", "none", "-q"]) == 0
        printed = capsys.readouterr().out
        record = C.read_metadata(out)["split_half"]
        assert record["text"] in printed and "Split halves: the first 30 and the last 30 documents" in printed
        assert [h["documents"] for h in record["layers"]] == [[30, 30]] * 3
        assert record["first_half"]["layers"][0]["documents"] == [15, 15]
        found[name] = record
    rep, ind = found["repeated"], found["independent"]
    assert rep["gap"] < 1e-9 and rep["sufficed"] == 30 and "half the documents (30) already" in rep["text"]
    assert all(h["frobenius"] < 1e-6 and h["null_dims"][0] == h["null_dims"][1] for h in rep["layers"])
    assert ind["gap"] > 1e3 * max(rep["gap"], 1e-12) and ind["gap"] > 1e-3
    stats = C.CovarianceStats.load(tmp_path / "repeated.safetensors")
    alone = C.estimate(tiny_loaded_reference(), first, [1, 2, 3], C.EstimationSettings(tokens_per_batch=2048),
                       cache=False, progress=False)
    assert rel(stats.mean(2), alone.mean(2)) < 1e-6, "the whole is the first half's C again"


def tiny_loaded_reference():
    from moir_lib import models
    from moir_lib.profiles import load_profile

    return models.load(load_profile("stories260k"))
