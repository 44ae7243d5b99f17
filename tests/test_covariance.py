"""moir_lib.covariance on tiny random models: exactness, padding, merge, resume, cache, mix, diagnostics.

Every comparison is against an independent computation (keys captured by our own hooks and
summed with numpy) or between runs that must agree, at float64 rounding tolerances.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import random_documents, tiny_loaded

from moir_lib import covariance as C
from moir_lib.covariance.estimation import save_checkpoint
from moir_lib.documents import load_corpus

TESTS = Path(__file__).resolve().parent


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


class ForwardCounter:
    """Counts forward passes of a model (to prove cache hits and resumes skip work)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *args):
        self.n += 1

    def close(self):
        self.handle.remove()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: thread start-up costs more than it saves (and the machine may be busy)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llama():
    return tiny_loaded("llama", n_layers=4, seed=0)


@pytest.fixture(scope="module")
def docs():
    return random_documents(40, seed=1)


# --------------------------------------------------------------------------- one pass, exact sums


def capture_reference(loaded, layers, fn):
    """Run ``fn()`` while independent hooks capture each layer's key-module input and the model's
    attention mask; return {layer: Σ k kᵀ over non-padding positions} computed with numpy float64."""
    inputs, masks = {layer: [] for layer in layers}, []

    def model_hook(module, args, kwargs):
        ids = kwargs["input_ids"]
        masks.append(kwargs.get("attention_mask", torch.ones_like(ids)).bool())

    handles = [loaded.model.register_forward_pre_hook(model_hook, with_kwargs=True)]
    for layer in layers:
        handles.append(loaded.adapter.key_module(layer).register_forward_pre_hook(
            lambda m, a, layer=layer: inputs[layer].append(a[0].detach().clone())))
    try:
        result = fn()
    finally:
        for h in handles:
            h.remove()
    ref = {}
    for layer in layers:
        total = np.zeros((loaded.adapter.key_dim,) * 2)
        for x, mask in zip(inputs[layer], masks, strict=True):
            k = x[mask].numpy().astype(np.float64)
            total += k.T @ k
        ref[layer] = torch.from_numpy(total)
    return result, ref, sum(int(m.sum()) for m in masks)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_one_pass_equals_per_layer_passes_and_an_independent_sum(family, docs):
    loaded = tiny_loaded(family, n_layers=4, seed=2)
    layers = [0, 1, 3]
    counter = ForwardCounter(loaded.model)
    one, ref, n_tokens = capture_reference(
        loaded, layers,
        lambda: C.estimate(loaded, docs, layers, C.EstimationSettings(tokens_per_batch=96), cache=False,
                           progress=False))
    batches_one_pass = counter.n
    for layer in layers:
        assert one.count(layer) == n_tokens
        assert rel(one.sum(layer), ref[layer]) <= 1e-10
        single = C.estimate(loaded, docs, [layer], C.EstimationSettings(tokens_per_batch=96), cache=False,
                            progress=False)
        assert single.count(layer) == one.count(layer)
        assert rel(single.sum(layer), one.sum(layer)) <= 1e-10
    counter.close()
    assert batches_one_pass == counter.n / (1 + len(layers))  # one pass served every layer
    # every token of the tokenized text counts (layer_stats' convention): BOS + words per document
    assert one.count(0) == sum(len(loaded.tokenizer(d)["input_ids"]) for d in docs)
    torch.testing.assert_close(one.mean(1), one.sum(1) / one.count(1))
    assert torch.equal(one.sum(1), one.sum(1).T)


def test_forward_stops_after_the_last_edit_layer_and_the_model_still_works(llama, docs):
    ran = []
    handles = [llama.adapter.layers[i].register_forward_pre_hook(lambda m, a, i=i: ran.append(i))
               for i in range(4)]
    head = llama.adapter.lm_head.register_forward_pre_hook(lambda m, a: ran.append("head"))
    probe = torch.tensor([[1, 5, 6, 7]])
    before = llama.model(probe).logits
    ran.clear()
    try:
        C.estimate(llama, docs[:3], [0, 1], C.EstimationSettings(tokens_per_batch=4096), cache=False,
                   progress=False)
        assert ran == [0, 1]  # one batch; layers 2, 3 and the LM head never ran
        ran.clear()
        C.estimate(llama, docs[:3], [0, 1], C.EstimationSettings(tokens_per_batch=4096, stop_early=False),
                   cache=False, progress=False)
        assert ran == [0, 1, 2, 3, "head"]
    finally:
        for h in [*handles, head]:
            h.remove()
    assert torch.equal(llama.model(probe).logits, before)


def test_padding_is_ignored(llama, docs):
    layers = [1, 2]
    runs = [C.estimate(llama, docs, layers, C.EstimationSettings(tokens_per_batch=tpb), cache=False,
                       progress=False)
            for tpb in (48, 200, 4096)]
    # per-document reference: no padding at all
    keys = {layer: torch.zeros(llama.adapter.key_dim, llama.adapter.key_dim, dtype=torch.float64)
            for layer in layers}
    def add(module, args, layer):
        k = args[0][0].double()
        keys[layer].add_(k.T @ k)  # (a pre-hook returning a value would replace the input)

    hooks = [llama.adapter.key_module(layer).register_forward_pre_hook(
        lambda m, a, layer=layer: add(m, a, layer)) for layer in layers]
    with torch.no_grad():
        for d in docs:
            llama.model(torch.tensor([llama.tokenizer(d)["input_ids"]]))
    for h in hooks:
        h.remove()
    n_tokens = sum(len(llama.tokenizer(d)["input_ids"]) for d in docs)
    for layer in layers:
        for run in runs:
            assert run.count(layer) == n_tokens
            assert rel(run.sum(layer), keys[layer]) <= 1e-6


def test_bos_flags(llama, docs):
    base = C.estimate(llama, docs, [1], C.EstimationSettings(tokens_per_batch=256), cache=False,
                      progress=False)
    no_bos = C.estimate(llama, docs, [1], C.EstimationSettings(tokens_per_batch=256, count_bos=False),
                        cache=False, progress=False)
    assert no_bos.count(1) == base.count(1) - len(docs)
    # the BOS key at position 0 is the same in every document: the difference is rank one
    diff = base.sum(1) - no_bos.sum(1)
    eig = torch.linalg.eigvalsh(diff)
    assert eig[-1] > 0 and abs(eig[:-1]).max() <= 1e-6 * eig[-1]
    plain = C.estimate(llama, docs, [1], C.EstimationSettings(tokens_per_batch=256, add_bos=False),
                       cache=False, progress=False)
    assert plain.count(1) == base.count(1) - len(docs)
    forced = C.estimate(llama, docs, [1], C.EstimationSettings(tokens_per_batch=256, add_bos=True),
                        cache=False, progress=False)
    assert forced.count(1) == base.count(1) and rel(forced.sum(1), base.sum(1)) <= 1e-10
    ids = [llama.tokenizer(d)["input_ids"] for d in docs[:5]]  # token-id documents are used as given
    from_ids = C.estimate(llama, ids, [1], C.EstimationSettings(tokens_per_batch=256), cache=False,
                          progress=False)
    from_text = C.estimate(llama, docs[:5], [1], C.EstimationSettings(tokens_per_batch=256), cache=False,
                           progress=False)
    assert rel(from_ids.sum(1), from_text.sum(1)) <= 1e-10


def test_truncation_to_max_length(llama):
    long_docs = random_documents(6, seed=5, min_words=30, max_words=40)
    stats = C.estimate(llama, long_docs, [0], C.EstimationSettings(max_length=8, tokens_per_batch=64),
                       cache=False, progress=False)
    assert stats.count(0) == 6 * 8
    with pytest.raises(ValueError, match="max_length 100 exceeds tokens_per_batch 64"):
        C.estimate(llama, long_docs, [0], C.EstimationSettings(max_length=100, tokens_per_batch=64),
                   cache=False, progress=False)


# --------------------------------------------------------------------------- incremental decoding


def test_key_collector_on_incremental_decoding_matches_one_forward(llama):
    from transformers import DynamicCache

    torch.manual_seed(0)
    seqs = torch.randint(4, llama.adapter.vocab_size, (3, 9))
    prefix = 4
    finished_after = {0: 9, 1: 6, 2: 5}  # row r counts positions < finished_after[r]
    full_mask = torch.zeros(3, 9, dtype=torch.bool)
    for r, stop in finished_after.items():
        full_mask[r, :stop] = True
    reference = C.KeyCollector(llama.adapter, [1, 3])
    with reference, torch.no_grad():
        reference.set_mask(full_mask)
        llama.model(seqs)
    steps = C.KeyCollector(llama.adapter, [1, 3])
    with steps, torch.inference_mode():  # as generation runs it
        cache = DynamicCache()
        steps.set_mask(full_mask[:, :prefix])
        llama.model(seqs[:, :prefix], past_key_values=cache, use_cache=True)
        for t in range(prefix, 9):
            steps.set_mask(full_mask[:, t : t + 1])
            llama.model(seqs[:, t : t + 1], past_key_values=cache, use_cache=True)
    assert steps.batch_index == 9 - prefix  # one batch per forward
    for layer in (1, 3):
        assert steps.stats.count(layer) == reference.stats.count(layer) == int(full_mask.sum())
        assert rel(steps.stats.sum(layer), reference.stats.sum(layer)) <= 1e-5
    # the accumulators are ordinary tensors: usable after inference_mode
    steps.stats.mean(1).add_(0)


def test_key_collector_mask_shape_is_checked(llama):
    with C.KeyCollector(llama.adapter, [0]) as kc, torch.no_grad():
        kc.set_mask(torch.tensor([[True, False, True]]))
        with pytest.raises(ValueError, match=r"mask of shape \(1, 3\) does not match the key input \(1, 4\)"):
            llama.model(torch.tensor([[1, 5, 6, 7]]))


# --------------------------------------------------------------------------- merge, save, load


def test_merge_of_three_shards_equals_one_run(llama, tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    docs = random_documents(30, seed=7, min_words=20, max_words=38)
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    # tokens_per_batch < twice the shortest document: one document per batch, so every key is
    # computed identically in the shards and in the single run; sums differ only by float64 order
    kw = {"settings": C.EstimationSettings(tokens_per_batch=40), "cache": False, "progress": False}
    whole = C.estimate(llama, load_corpus(folder, seed=3), [0, 2], **kw)
    shards = [C.estimate(llama, load_corpus(folder, seed=3, shard=(i, 3)), [0, 2], **kw) for i in range(3)]
    merged = C.CovarianceStats.merge_all(shards)
    for layer in (0, 2):
        assert merged.count(layer) == whole.count(layer)
        assert rel(merged.sum(layer), whole.sum(layer)) <= 1e-12
        assert rel(merged.mean(layer), whole.mean(layer)) <= 1e-12
    assert [c["shard"] for c in merged.metadata["corpus"]] == [[0, 3], [1, 3], [2, 3]]
    assert sum(c["documents"] for c in merged.metadata["corpus"]) == 30


def test_merge_is_exact_on_synthetic_keys_and_refuses_mismatches():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(3000, 48, generator=g, dtype=torch.float32) * torch.linspace(0.1, 5, 48)
    meta = {"model": "m1", "key_site": "x.{}.down", "dtype": "float32", "tokenization": {"max_length": 8}}
    one = C.CovarianceStats([3, 4], 48, meta)
    parts = [C.CovarianceStats([3, 4], 48, meta) for _ in range(3)]
    for i, chunk in enumerate(keys.split(700)):  # 5 batches into one, spread over 3 shards
        one.update(3, chunk, batch=i)
        parts[i % 3].update(3, chunk, batch=i)
    merged = C.CovarianceStats.merge_all(parts)
    ref = torch.from_numpy(keys.numpy().astype(np.float64).T @ keys.numpy().astype(np.float64))
    assert merged.count(3) == one.count(3) == 3000 and merged.count(4) == 0
    assert rel(merged.sum(3), one.sum(3)) <= 1e-12 and rel(one.sum(3), ref) <= 1e-12

    other = C.CovarianceStats([3, 4], 48, {**meta, "model": "m2", "dtype": "bfloat16"})
    with pytest.raises(ValueError, match=r"differ in model: 'm1' vs 'm2'; dtype: 'float32' vs 'bfloat16'"):
        one.merge(other)
    with pytest.raises(ValueError, match=r"layers: \[3, 4\] vs \[3\]"):
        one.merge(C.CovarianceStats([3], 48, meta))
    assert one.merge(other, strict=False).count(3) == 3000
    wide = C.CovarianceStats([3, 4], 1500)  # the blocked upper-triangle path (d > 1024)
    k = torch.randn(64, 1500, generator=g)
    wide.update(3, k)
    torch.testing.assert_close(wide.sum(3), (k.double().T @ k.double()), rtol=1e-12, atol=1e-10)


def test_small_updates_are_buffered_and_flushed_on_read():
    g = torch.Generator().manual_seed(2)
    keys = torch.randn(700, 40, generator=g)
    direct = C.CovarianceStats([0], 40, flush_tokens=1)
    buffered = C.CovarianceStats([0], 40, flush_tokens=256)
    for chunk in keys.split(3):  # decoding-sized updates
        direct.update(0, chunk)
        buffered.update(0, chunk)
        assert buffered.count(0) == direct.count(0)
    assert 0 < buffered._pending_n[0] < 256
    ref = keys.double().T @ keys.double()
    assert rel(buffered.sum(0), ref) <= 1e-12 and rel(direct.sum(0), ref) <= 1e-12
    assert buffered._pending_n[0] == 0  # reading flushed
    view = keys[:5].clone()
    buffered.update(0, view)
    view.zero_()  # the caller reuses its buffer: the pending keys were copied
    assert rel(buffered.sum(0), ref + keys[:5].double().T @ keys[:5].double()) <= 1e-12


def test_float32_precision_mode():
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(500, 1100, generator=g)
    exact = C.CovarianceStats([0], 1100)
    fast = C.CovarianceStats([0], 1100, precision="float32")
    for chunk in keys.split(128):
        exact.update(0, chunk)
        fast.update(0, chunk)
    assert fast.metadata["precision"] == "float32"
    assert 0 < rel(fast.sum(0), exact.sum(0)) <= 1e-6
    assert "precision" in " ".join(exact.identity_differences(fast))


def test_save_load_roundtrip(tmp_path, llama, docs):
    stats = C.estimate(llama, docs[:10], [1, 3], C.EstimationSettings(tokens_per_batch=128), cache=False,
                       progress=False)
    path = stats.save(tmp_path / "c" / "stats.safetensors", extra_metadata={"note": "hello"})
    assert sorted(p.name for p in path.parent.iterdir()) == ["stats.safetensors"]  # no temp files left
    back = C.CovarianceStats.load(path)
    assert back.layers == (1, 3) and back.counts == stats.counts and back.precision == "float64"
    for layer in (1, 3):
        assert torch.equal(back.sum(layer), stats.sum(layer))
    assert back.metadata["note"] == "hello" and back.metadata["model"] == stats.metadata["model"]
    meta = C.read_metadata(path)
    assert meta["counts"] == {1: stats.count(1), 3: stats.count(3)} and meta["key_site"].endswith("down_proj")
    with pytest.raises(ValueError, match="would count documents twice"):  # the same corpus twice
        back.merge(stats)


# --------------------------------------------------------------------------- errors


def test_nan_keys_name_the_layer_and_batch(llama):
    docs = random_documents(12, seed=9, min_words=10, max_words=10)  # 11 tokens each: one per batch
    docs[5] = " ".join(docs[5].split()[:4] + ["zzz-unknown"] + docs[5].split()[5:])
    with torch.no_grad():
        saved = llama.adapter.embed_tokens.weight[3].clone()  # <unk>
        llama.adapter.embed_tokens.weight[3] = float("nan")
    try:
        with pytest.raises(ValueError, match=r"non-finite keys \(NaN/inf\) at layer 1, batch 5: "):
            C.estimate(llama, docs, [1, 2], C.EstimationSettings(tokens_per_batch=11), cache=False,
                       progress=False)
    finally:
        with torch.no_grad():
            llama.adapter.embed_tokens.weight[3] = saved
    stats = C.CovarianceStats([0], 4)
    with pytest.raises(ValueError, match="at layer 0, batch 7: 1 of 2 key vectors"):
        stats.update(0, torch.tensor([[1.0, 2, 3, 4], [1, float("inf"), 0, 0]]), batch=7)
    assert stats.count(0) == 0


def test_empty_corpus_and_bad_layers_fail_before_any_forward(llama):
    counter = ForwardCounter(llama.model)

    def never():
        raise AssertionError("documents were read before the layer check")
        yield ""

    try:
        for empty in ([], ["", "   ", "\n"]):
            with pytest.raises(ValueError, match="empty corpus"):
                C.estimate(llama, empty, [0], cache=False, progress=False)
        with pytest.raises(ValueError, match=r"^layer 9 out of range: tiny-llama has 4 layers \(0-3\)$"):
            C.estimate(llama, never(), [1, 9], progress=False)
        with pytest.raises(ValueError, match="repeated layer"):
            C.estimate(llama, never(), [1, 1], progress=False)
        assert counter.n == 0
    finally:
        counter.close()
    with pytest.raises(ValueError, match="no layers given"):
        C.estimate(llama, ["a"], progress=False)


# --------------------------------------------------------------------------- cache


def write_corpus(folder: Path, docs: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return folder


def test_cache_hit_on_identical_inputs_and_miss_on_any_change(tmp_path, llama):
    folder = write_corpus(tmp_path / "corpus", random_documents(16, seed=11))
    cache = tmp_path / "cache"
    settings = C.EstimationSettings(tokens_per_batch=128)
    kw = {"settings": settings, "progress": False, "cache": cache}
    counter = ForwardCounter(llama.model)
    first = C.estimate(llama, load_corpus(folder, n=10, seed=0), [1, 2], **kw)
    ran = counter.n
    again = C.estimate(llama, load_corpus(folder, n=10, seed=0), [1, 2], **kw)
    assert not first.from_cache and again.from_cache and counter.n == ran  # a hit runs nothing
    assert again.path == first.path and torch.equal(again.sum(1), first.sum(1))
    assert json.loads((first.path.parent / "key.json").read_text())["layers"] == [1, 2]

    def corpus(**changes):
        return load_corpus(folder, **{"n": 10, "seed": 0, **changes})

    variants = {  # field -> (corpus changes, estimate changes)
        "layers": ({}, {"layers": [1]}),
        "n": ({"n": 9}, {}),
        "seed": ({"seed": 1}, {}),
        "truncation": ({"max_chars": 30}, {}),
        "max_length": ({}, {"max_length": 20}),
        "count_bos": ({}, {"count_bos": False}),
        "add_bos": ({}, {"add_bos": False}),
        "precision": ({}, {"precision": "float32"}),
        "revision": ({}, {"revision": "v2"}),
    }
    paths = {first.path}
    for field, (corpus_changes, changes) in variants.items():
        layers = changes.get("layers", [1, 2])
        varied = dataclasses.replace(settings, **{k: v for k, v in changes.items() if k != "layers"})
        result = C.estimate(llama, corpus(**corpus_changes), layers, varied, progress=False, cache=cache)
        assert not result.from_cache, field
        paths.add(result.path)
    # corpus content (the same file name, edited), weights, dtype
    write_corpus(folder, random_documents(16, seed=12))
    paths.add(C.estimate(llama, load_corpus(folder, n=10, seed=0), [1, 2], **kw).path)
    other = tiny_loaded("llama", n_layers=4, seed=1)
    paths.add(C.estimate(other, load_corpus(folder, n=10, seed=0), [1, 2], **kw).path)
    half = tiny_loaded("llama", n_layers=4, seed=0, dtype=torch.float64)
    paths.add(C.estimate(half, load_corpus(folder, n=10, seed=0), [1, 2], **kw).path)
    assert len(paths) == 1 + len(variants) + 3
    # the tokenizer calls of other runs (other truncation) leave the fingerprint alone: still a hit
    assert C.estimate(other, load_corpus(folder, n=10, seed=0), [1, 2], **kw).from_cache
    counter.close()


def test_estimate_key_covers_every_fingerprint_field():
    from moir_lib.cache import fingerprint

    settings = C.EstimationSettings(max_length=2048, precision="float64")
    base = {"model_fp": "abc", "key_site": "model.layers.{}.mlp.down_proj", "layers": [3, 4],
            "dtype": "float16", "tokenizer_fp": "t1",
            "corpus": {"kind": "hf", "name": "wikimedia/wikipedia", "n": 100, "seed": 0}}
    changes = {"model_fp": "abd", "key_site": "transformer.h.{}.mlp.c_proj", "layers": [3],
               "dtype": "bfloat16", "tokenizer_fp": "t2", "corpus": {**base["corpus"], "n": 101}}
    setting_changes = {"revision": "main", "precision": "float32", "add_bos": True, "count_bos": False,
                       "max_length": 1024, "tokens_per_batch": 128}
    ref = fingerprint(C.estimate_key(settings, **base))
    assert fingerprint(C.estimate_key(settings, **{**base, "layers": [4, 3]})) == ref  # order does not matter
    for name, value in changes.items():
        assert fingerprint(C.estimate_key(settings, **{**base, name: value})) != ref, name
    def varied(**change):
        return fingerprint(C.estimate_key(dataclasses.replace(settings, **change), **base))

    for name, value in setting_changes.items():
        assert varied(**{name: value}) != ref, name
    for name, value in {"checkpoint_every": 7, "checkpoint_dir": "/tmp/x", "stop_early": False}.items():
        assert varied(**{name: value}) == ref, name  # how the pass runs: not in the key


def test_anonymous_iterators_are_not_cached(llama, tmp_path, caplog):
    stats = C.estimate(llama, iter(random_documents(5, seed=1)), [0], cache=tmp_path, progress=False)
    assert stats.path is None and "not cached" in caplog.text
    assert not (tmp_path / "covariance").exists()


# --------------------------------------------------------------------------- kill and resume

CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from tiny import random_documents, tiny_loaded
from moir_lib import covariance as C
lm = tiny_loaded("llama", n_layers=4, seed=0)
lm.adapter.layers[0].register_forward_pre_hook(lambda *a: time.sleep(0.03))  # slow it down, not its result
C.estimate(lm, random_documents(120, seed=4), [1, 3],
           C.EstimationSettings(tokens_per_batch=48, checkpoint_every=1), corpus_spec="resume-test",
           cache={cache!r}, progress=False)
print("finished")
"""


def test_sigkilled_estimate_resumes_without_double_counting(tmp_path, llama):
    cache = tmp_path / "cache"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(TESTS), cache=str(cache)))
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    killed_at = None
    try:
        while time.monotonic() < deadline and child.poll() is None:
            ckpts = list(cache.glob("covariance/*/checkpoint.safetensors"))
            if ckpts:
                try:
                    resume = C.read_metadata(ckpts[0])["resume"]
                except Exception:  # mid-replace on a slow file system: look again
                    resume = None
                if resume and resume["docs_before_window"] > 0:  # checkpoints fall on window ends
                    child.send_signal(signal.SIGKILL)
                    child.wait()
                    killed_at = resume
                    break
            time.sleep(0.02)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    out, err = child.communicate()
    assert killed_at is not None, f"the child was not killed mid-way: {out.decode()} {err.decode()[-2000:]}"
    assert child.returncode == -signal.SIGKILL
    entry = next(cache.glob("covariance/*"))
    assert not (entry / "stats.safetensors").exists() and (entry / "checkpoint.safetensors").exists()

    docs = random_documents(120, seed=4)
    counter = ForwardCounter(llama.model)
    resumed = C.estimate(llama, docs, [1, 3], C.EstimationSettings(tokens_per_batch=48, checkpoint_every=1),
                         corpus_spec="resume-test", cache=cache, progress=False)
    resumed_batches = counter.n
    counter.n = 0
    straight = C.estimate(llama, docs, [1, 3], C.EstimationSettings(tokens_per_batch=48), cache=False,
                          progress=False)
    counter.close()
    assert 0 < resumed_batches <= counter.n - killed_at["global_batches"]  # it resumed, not restarted
    for layer in (1, 3):
        assert resumed.count(layer) == straight.count(layer)
        assert torch.equal(resumed.sum(layer), straight.sum(layer))  # bit for bit
    assert not (entry / "checkpoint.safetensors").exists() and (entry / "stats.safetensors").exists()
    assert resumed.metadata["corpus"][0]["documents"] == 120 and "resume" not in resumed.metadata


def test_checkpoint_with_other_batching_is_refused(llama, tmp_path):
    docs = random_documents(60, seed=4)
    stats = C.estimate(llama, docs, [1],
                       C.EstimationSettings(tokens_per_batch=48, checkpoint_dir=tmp_path, checkpoint_every=2),
                       cache=False, corpus_spec="x", progress=False)
    assert stats.count(1) > 0 and not (tmp_path / "checkpoint.safetensors").exists()  # removed when done
    # forge an interrupted run: a checkpoint written with another tokens_per_batch
    partial = C.CovarianceStats([1], llama.adapter.key_dim, stats.metadata)
    fp = stats.metadata["fingerprint"]
    save_checkpoint(partial, tmp_path / "checkpoint.safetensors", fp, 0, 3, 3, 64, 64 * 16)
    with pytest.raises(ValueError, match="written with tokens_per_batch=64: resume with the same value"):
        C.estimate(llama, docs, [1], C.EstimationSettings(tokens_per_batch=48, checkpoint_dir=tmp_path),
                   cache=False, corpus_spec="x", progress=False)


# --------------------------------------------------------------------------- mixtures


def synthetic(n: int, scale: torch.Tensor, seed: int, meta=None) -> tuple[C.CovarianceStats, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, scale.numel(), generator=g, dtype=torch.float64) * scale + 0.3 * seed
    stats = C.CovarianceStats([0, 1], scale.numel(), meta or {"model": "m"})
    for layer in (0, 1):
        stats.update(layer, keys * (layer + 1))
    return stats, keys


def test_mix_is_linear_in_the_distribution():
    d = 12
    a, ka = synthetic(600, torch.linspace(0.5, 3, d), seed=1)
    b, kb = synthetic(200, torch.linspace(3, 0.5, d), seed=2)
    c, kc = synthetic(400, torch.ones(d), seed=3)
    # sample counts proportional to the weights: the mixture equals the pooled estimate
    mixed = C.mix({a: 0.5, b: 1 / 6, c: 1 / 3})
    pooled = C.CovarianceStats.merge_all([a, b, c])
    keys = torch.cat([ka, kb, kc])
    for layer in (0, 1):
        assert rel(mixed.mean(layer), pooled.mean(layer)) <= 1e-12
        ref = (keys * (layer + 1)).T @ (keys * (layer + 1)) / len(keys)
        assert rel(mixed.mean(layer), ref) <= 1e-12
    assert mixed.count(0) == 1200 and [m["weight"] for m in mixed.metadata["mixture"]] == pytest.approx(
        [0.5, 1 / 6, 1 / 3])
    # weights are normalised, and means (not raw sums) are mixed
    assert rel(C.mix({a: 3, b: 1, c: 2}).mean(0), mixed.mean(0)) <= 1e-12
    equal = C.mix({a: 1, b: 1})
    assert rel(equal.mean(0), (a.mean(0) + b.mean(0)) / 2) <= 1e-12
    assert rel(equal.mean(0), a.merge(b).mean(0)) > 1e-3
    # tensors and {layer: tensor} mappings
    assert rel(C.mix([(a.mean(1), 1), (b.mean(1), 3)]), 0.25 * a.mean(1) + 0.75 * b.mean(1)) <= 1e-12
    per_layer = C.mix([(a.means(), 1), (b.means(), 1)])
    assert rel(per_layer[1], (a.mean(1) + b.mean(1)) / 2) <= 1e-12
    with pytest.raises(ValueError, match="weights must be finite, non-negative"):
        C.mix({a: -1, b: 2})
    with pytest.raises(ValueError, match="cannot merge a mixture"):
        mixed.merge(a)
    other, _ = synthetic(10, torch.ones(d), seed=4, meta={"model": "other"})
    with pytest.raises(ValueError, match="cannot mix covariance statistics that differ in model"):
        C.mix({a: 1, other: 1})


# --------------------------------------------------------------------------- diagnostics


def rotation(d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q


def test_spectrum_effective_rank_participation_ratio():
    q = rotation(6)
    lam = torch.tensor([5.0, 3, 1, 1, 0, 0], dtype=torch.float64)
    c = q @ torch.diag(lam) @ q.T
    torch.testing.assert_close(C.spectrum(c), lam, rtol=0, atol=1e-12)
    assert C.effective_rank(torch.eye(7)) == pytest.approx(7)
    assert C.participation_ratio(torch.eye(7)) == pytest.approx(7)
    assert C.effective_rank(torch.diag(torch.tensor([2.0, 2, 0, 0]))) == pytest.approx(2)
    p = lam / lam.sum()
    p = p[p > 0]
    assert C.effective_rank(c) == pytest.approx(math.exp(-float((p * p.log()).sum())), rel=1e-10)
    assert C.participation_ratio(c) == pytest.approx(10**2 / (25 + 9 + 1 + 1), rel=1e-10)


def test_principal_angles_and_coverage_on_constructed_matrices():
    d, theta = 6, 0.3
    e = torch.eye(d, dtype=torch.float64)
    a = torch.diag(torch.tensor([4.0, 3, 1, 0.5, 0.2, 0.1], dtype=torch.float64))  # top-2: span(e0, e1)
    v = math.cos(theta) * e[:, 1] + math.sin(theta) * e[:, 2]
    b = 5 * torch.outer(e[:, 0], e[:, 0]) + 4 * torch.outer(v, v) + 0.01 * torch.eye(d)  # top-2: span(e0, v)
    angles = C.principal_angles(a, b, 2)
    torch.testing.assert_close(angles, torch.tensor([0.0, theta], dtype=torch.float64), atol=1e-7, rtol=0)
    q = rotation(d, 3)  # invariant under a common rotation
    torch.testing.assert_close(C.principal_angles(q @ a @ q.T, q @ b @ q.T, 2), angles, atol=1e-7, rtol=0)
    domain = torch.diag(torch.tensor([1.0, 0, 0, 3, 0, 0], dtype=torch.float64))
    assert C.coverage(a, domain, 2) == pytest.approx(0.25)
    assert C.coverage(a, domain, 4) == pytest.approx(1.0)
    inside_v = torch.outer(v, v)  # energy along v: cos²θ of it lies in span(e0, e1)
    assert C.coverage(a, inside_v, 2) == pytest.approx(math.cos(theta) ** 2)
    assert C.coverage(b, inside_v, 2) == pytest.approx(1.0)


def test_diagnose_tables():
    d, theta = 6, 0.3
    e = torch.eye(d, dtype=torch.float64)
    a = torch.diag(torch.tensor([4.0, 3, 1, 0.5, 0.2, 0.1], dtype=torch.float64))
    v = math.cos(theta) * e[:, 1] + math.sin(theta) * e[:, 2]
    b = 5 * torch.outer(e[:, 0], e[:, 0]) + 4 * torch.outer(v, v) + 0.01 * torch.eye(d)
    stats = C.CovarianceStats([7], d)
    stats.update(7, torch.linalg.cholesky(a).T * math.sqrt(d))  # d keys with Σ k kᵀ = d·a: mean = a
    domains = {"math": {7: torch.diag(e[3])}, "wiki": {7: torch.diag(e[0])}}
    dg = C.diagnose({"A": stats, "B": {7: b}}, domains=domains, k=[2, 4])
    assert set(dg.tables()) == {"spectrum", "summary", "angles", "coverage"}
    assert len(dg.spectrum) == 2 * d
    assert dg.spectrum.groupby("name")["share"].sum().tolist() == pytest.approx([1, 1])
    summary = dg.summary.set_index("name")
    assert summary.loc["A", "tokens"] == d and summary.loc["A", "trace"] == pytest.approx(8.8)
    assert summary.loc["A", "effective_rank"] == pytest.approx(C.effective_rank(a))
    assert summary.loc["A", "k90"] == 3  # 4+3+1 = 8 of 8.8 = 91 %
    angles = dg.angles.query("k == 2").sort_values("index")
    assert angles["angle_rad"].tolist() == pytest.approx([0, theta], abs=1e-7)
    cov = dg.coverage.set_index(["name", "domain", "k"])["coverage"]
    assert cov["A", "math", 2] == pytest.approx(0) and cov["A", "math", 4] == pytest.approx(1)
    assert cov["A", "wiki", 2] == pytest.approx(1) and cov["B", "wiki", 2] == pytest.approx(1)
    assert (dg.coverage["random"] == dg.coverage["k"] / d).all()
    cross = C.diagnose({"A": a, "B": b}, k=2)  # domains default to the covariances themselves
    assert len(cross.coverage) == 4 and cross.summary["layer"].isna().all()



# --------------------------------------------------------------------------- the pocket model


@pytest.mark.slow
def test_pocket_micro_domains_oracle_and_diagnostics(tmp_path):
    """End to end on the real (micro) pocket model and corpora; builds the model on first use (minutes)."""
    from moir_lib import pocket
    from moir_lib.models import load

    loaded = load("pocket-micro")
    layers = [0, 1]
    parts = {d: C.estimate(loaded, load_corpus(f"pocket:{d}", n=24), layers, cache=tmp_path, progress=False)
             for d in pocket.MIXTURE}
    again = C.estimate(loaded, load_corpus("pocket:wiki", n=24), layers, cache=tmp_path, progress=False)
    assert again.from_cache and torch.equal(again.sum(0), parts["wiki"].sum(0))
    oracle = C.mix({parts[d]: w for d, w in pocket.MIXTURE.items()})
    expected = sum(w * parts[d].mean(1) for d, w in pocket.MIXTURE.items()) / sum(pocket.MIXTURE.values())
    assert rel(oracle.mean(1), expected) <= 1e-12
    pooled = C.CovarianceStats.merge_all(parts.values())
    assert pooled.count(0) == sum(p.count(0) for p in parts.values())
    k = 8
    dg = C.diagnose({"wiki": parts["wiki"], "oracle": oracle}, domains=parts, k=k)
    cov = dg.coverage
    assert len(cov) == 2 * len(parts) * len(layers)
    assert ((cov["coverage"] >= 0) & (cov["coverage"] <= 1 + 1e-9)).all()
    assert (cov.query("name == 'wiki' and domain == 'wiki'")["coverage"] > k / loaded.adapter.key_dim).all()
    assert (dg.summary["effective_rank"] <= loaded.adapter.key_dim).all()
    assert set(dg.angles["k"]) == {k} and len(dg.angles) == k * len(layers)
