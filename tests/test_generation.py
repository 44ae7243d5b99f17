"""moir_lib.generation on tiny random Llamas (hidden 32, vocab 64): determinism per sample index,
sharding, crash safety (SIGKILL in a subprocess), resume refusal, seed-token exclusion, keys
collected during generation vs a second pass."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import (
    BOS,
    EOS,
    PAD,
    SAMPLER_VOCAB,
    make_model,
    make_tokenizer,
    raw_lines,
    reference_sample,
    samples,
)

from moir_lib import generation as G
from moir_lib.streams import sample_uniforms

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return make_model(), make_tokenizer()


# --------------------------------------------------------------------------- seed strategies


def test_parse_seed_strategy() -> None:
    assert G.parse_seed_strategy("bos").kind == "bos"
    assert G.parse_seed_strategy("rand1") == G.SeedStrategy("rand1", "rand", k=1)
    assert G.parse_seed_strategy("rand4").k == 4
    assert G.parse_seed_strategy("rand12").k == 12  # longer prefixes are allowed (H4 ablations)
    p = G.parse_seed_strategy("prompt:<|user|> hi\nthere")
    assert p.kind == "prompt" and p.text == "<|user|> hi\nthere"
    bad_specs = ("rand0", "rand", "rand01", "rand-1", "randx", "BOS", "bos ", "prompt:", "", "rnd1", None, 3)
    for bad in bad_specs:
        with pytest.raises(ValueError, match="unknown seed strategy"):
            G.parse_seed_strategy(bad)


def test_seed_exclusion_rule() -> None:
    tok = make_tokenizer()
    cand = G.seed_candidates(tok, SAMPLER_VOCAB)
    # specials (pad/bos/eos/unk and both chat tags) and the embedding's padding rows 56..63 are out
    assert cand.tolist() == list(range(6, 56))
    assert G.special_token_ids(tok) == {0, 1, 2, 3, 4, 5}
    assert G.seed_candidates(tok, 20).tolist() == list(range(6, 20))  # a model smaller than the tokenizer
    strategy = G.parse_seed_strategy("rand3")
    draws = [G.seed_ids_for(strategy, i, 7, bos_id=BOS, candidates=cand) for i in range(3000)]
    assert all(len(d) == 4 and d[0] == BOS for d in draws)
    flat = np.array([x for d in draws for x in d[1:]])
    assert set(flat.tolist()) <= set(cand.tolist())
    counts = np.bincount(flat, minlength=56)[6:]
    expected = flat.size / cand.size  # 180 per candidate: uniform within ~5 sigma
    assert counts.min() > expected - 5 * expected**0.5 and counts.max() < expected + 5 * expected**0.5
    # per-index: the same (seed, index) gives the same seed tokens, a different one differs
    again = G.seed_ids_for(strategy, 17, 7, bos_id=BOS, candidates=cand)
    assert again == draws[17]
    assert G.seed_ids_for(strategy, 17, 8, bos_id=BOS, candidates=cand) != again
    assert G.seed_ids_for("bos", 3, 0, bos_id=BOS) == [BOS]
    assert G.seed_ids_for("prompt:x", 3, 0, bos_id=None, prompt_ids=[9, 10]) == [9, 10]


def test_uniform_streams_are_per_index() -> None:
    u = sample_uniforms(0, range(6), 3)
    assert u.shape == (6,) and ((u >= 0) & (u < 1)).all() and len(set(u.tolist())) == 6
    np.testing.assert_array_equal(sample_uniforms(0, [4, 2], 3), u[[4, 2]])
    assert not np.array_equal(sample_uniforms(1, range(6), 3), u)
    many = np.concatenate([sample_uniforms(5, range(200), t) for t in range(50)])
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.var() - 1 / 12) < 0.005


# --------------------------------------------------------------------------- sampling correctness


@pytest.mark.parametrize("seeds", [
    [[BOS, 7], [BOS, 9, 10, 11, 12], [8], [BOS, 20, 21]],  # ragged: left padding and an attention mask
    [[BOS, 7], [BOS, 9], [BOS, 8], [BOS, 20]],  # equal lengths: no mask, finished rows attend to their pads
])
def test_kv_cache_and_left_padding_match_a_naive_sampler(tiny, seeds) -> None:
    """Each row equals a sampler without cache, padding or batch, a row that stopped at EOS included:
    the batch decodes on after it (seed 3 stops row 0 early and runs row 1 to the end)."""
    model, _ = tiny
    indices = [3, 0, 11, 5]
    with torch.inference_mode():
        sampling = G.decoding._Sampling(3, 12, [EOS], PAD, count_seed=False)
        sampled, _ = G.decoding._decode_block(model, sampling, seeds, indices, None, [True] * 4)
    for s, i, got in zip(seeds, indices, sampled, strict=True):
        assert got == reference_sample(model, s, i, 3, 12)
    assert len(sampled[0]) < 12 and sampled[0][-1] == EOS and len(sampled[1]) == 12


def test_samples_format_and_stopping(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    res = G.self_generate(model, tok, G.GenerationSettings("rand2", 24, 16, 8, seed=3), tmp_path / "gen",
                          progress=False)
    assert res.complete and res.n_written == 24 and res.n_skipped == 0
    recs = samples(tmp_path / "gen")
    assert [r["index"] for r in recs] == list(range(24))
    assert res.n_tokens == sum(len(r["token_ids"]) for r in recs)
    stopped = 0
    for r in recs:
        assert set(r) == {"index", "seed_strategy", "seed_ids", "token_ids", "text"}
        assert r["seed_strategy"] == "rand2" and len(r["seed_ids"]) == 3 and r["seed_ids"][0] == BOS
        toks = r["token_ids"]
        assert 1 <= len(toks) <= 16
        assert EOS not in toks[:-1]  # nothing after an EOS
        if toks[-1] == EOS:
            stopped += 1
            body = toks[:-1]
        else:
            assert len(toks) == 16
            body = toks
        assert r["text"] == tok.decode(r["seed_ids"][1:] + body, skip_special_tokens=False)
    assert 0 < stopped < 24  # the fixture model stops early sometimes, not always
    manifest = G.read_manifest(tmp_path / "gen")
    assert manifest["seed_strategy"] == "rand2" and manifest["n_samples"] == 24 and manifest["n_shards"] == 1
    assert manifest["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": None,
                                    "method": "inverse-CDF, SplitMix64 stream per sample index"}


def test_bos_and_prompt_strategies(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    G.self_generate(model, tok, G.GenerationSettings("bos", 4, 6, 4), tmp_path / "b", progress=False)
    assert all(r["seed_ids"] == [BOS] for r in samples(tmp_path / "b"))
    G.self_generate(model, tok, G.GenerationSettings("prompt:<|user|> w3 w4", 3, 6, 2), tmp_path / "p",
                    progress=False)
    recs = samples(tmp_path / "p")
    assert all(r["seed_ids"] == [BOS, 4, 9, 10] for r in recs)
    assert all(r["text"].startswith("<|user|> w3 w4") for r in recs)
    # the same seed sequence, different indices: different continuations
    assert len({tuple(r["token_ids"]) for r in recs}) == 3


# --------------------------------------------------------------------------- determinism and shards


def test_per_index_determinism_across_batch_sizes_shards_and_lengths(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    kw = {"progress": False}
    G.self_generate(model, tok, G.GenerationSettings("rand1", 20, 14, 20, seed=11), tmp_path / "one", **kw)
    base = raw_lines(tmp_path / "one")
    for bs in (1, 3, 7):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 20, 14, bs, seed=11), tmp_path / f"bs{bs}",
                        **kw)
        assert raw_lines(tmp_path / f"bs{bs}") == base  # byte-identical records
    for i in range(3):
        res = G.self_generate(model, tok, G.GenerationSettings("rand1", 20, 14, 4, seed=11),
                              tmp_path / "sharded", shard=(i, 3), **kw)
        assert res.n_shard_samples == len(range(i, 20, 3))
    assert len(list((tmp_path / "sharded").glob("shard-*.jsonl"))) == 3
    assert samples(tmp_path / "sharded") == samples(tmp_path / "one")
    # sample i does not depend on how many samples the run has
    G.self_generate(model, tok, G.GenerationSettings("rand1", 7, 14, 5, seed=11), tmp_path / "short", **kw)
    assert samples(tmp_path / "short") == samples(tmp_path / "one")[:7]
    # ... but on the global seed
    G.self_generate(model, tok, G.GenerationSettings("rand1", 7, 14, 5, seed=12), tmp_path / "other",
                    progress=False)
    other = [r["token_ids"] for r in samples(tmp_path / "other")]
    assert other != [r["token_ids"] for r in samples(tmp_path / "short")]


def test_gpt2_family_generates_deterministically(tmp_path: Path) -> None:
    model, tok = make_model(family="gpt2"), make_tokenizer()
    G.self_generate(model, tok, G.GenerationSettings("rand1", 6, 8, 6), tmp_path / "a", progress=False)
    G.self_generate(model, tok, G.GenerationSettings("rand1", 6, 8, 2), tmp_path / "b", progress=False)
    assert raw_lines(tmp_path / "a") == raw_lines(tmp_path / "b")
    r = samples(tmp_path / "a")[0]
    assert r["token_ids"] == reference_sample(model, r["seed_ids"], 0, 0, 8)


# --------------------------------------------------------------------------- bad inputs


def test_bad_inputs_are_refused_before_any_work(tiny, tmp_path: Path, monkeypatch) -> None:
    model, tok = tiny
    monkeypatch.setattr(model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    out = tmp_path / "never"
    cases = [
        (dict(n_samples=0), "n_samples must be a positive integer"),
        (dict(n_samples=-3), "n_samples must be a positive integer"),
        (dict(n_samples=2.5), "n_samples must be a positive integer"),
        (dict(seed_strategy="rand0"), "unknown seed strategy 'rand0'"),
        (dict(seed_strategy="greedy"), "unknown seed strategy 'greedy'"),
        (dict(seed_strategy="prompt:"), "unknown seed strategy"),
        (dict(batch_size=0), "batch_size must be a positive integer"),
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(max_new_tokens=63), r"exceeds the model's 64 positions: lower max_new_tokens to at most 62"),
        (dict(shard=(3, 3)), r"shard must be \(i, n\)"),
        (dict(collect_layers=[0, 5]), r"layer 5 out of range: .* has 2 layers \(0-1\)"),
        (dict(key_positions="seed"), "key_positions must be"),
        (dict(seed=-1), "seed must be a non-negative integer"),
    ]
    for override, message in cases:
        settings = dict(seed_strategy="rand1", n_samples=4, max_new_tokens=4, batch_size=2)
        settings.update(override)
        shard = settings.pop("shard", None)
        with pytest.raises(ValueError, match=message):
            G.self_generate(model, tok, G.GenerationSettings(**settings), out, shard, progress=False)
    assert not out.exists()


def test_bos_strategy_without_a_bos_token_is_refused(tmp_path: Path) -> None:
    model, tok = make_model(), make_tokenizer()
    tok.bos_token = None
    model.config.bos_token_id = None
    with pytest.raises(ValueError, match="seed strategy 'bos' needs a BOS token"):
        G.self_generate(model, tok, G.GenerationSettings("bos", 2, 4, 2), tmp_path / "x", progress=False)
    # no BOS: the seed is 1 token
    G.self_generate(model, tok, G.GenerationSettings("rand1", 2, 4, 2), tmp_path / "y", progress=False)
    assert all(len(r["seed_ids"]) == 1 for r in samples(tmp_path / "y"))


def test_resume_with_a_changed_configuration_is_refused(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    out = tmp_path / "gen"
    G.self_generate(model, tok, G.GenerationSettings("rand1", 4, 6, 2, seed=1), out, progress=False)
    changes = [
        (dict(seed=2), r"seed: generation has 1, requested 2"),
        (dict(seed_strategy="rand2"), r"seed_strategy: generation has 'rand1', requested 'rand2'"),
        (dict(max_new_tokens=7), r"max_new_tokens: generation has 6, requested 7"),
        (dict(n_samples=5), r"n_samples: generation has 4, requested 5"),
        (dict(shard=(0, 2)), r"n_shards: generation has 1, requested 2"),
        (dict(collect_layers=[0]), r"collect_layers: generation has None, requested \[0\]"),
    ]
    for override, message in changes:
        settings = dict(seed_strategy="rand1", n_samples=4, max_new_tokens=6, batch_size=2, seed=1)
        settings.update(override)
        shard = settings.pop("shard", None)
        with pytest.raises(ValueError, match=message):
            G.self_generate(model, tok, G.GenerationSettings(**settings), out, shard, progress=False)
    with pytest.raises(ValueError, match="model_fingerprint: generation has"):
        G.self_generate(make_model(seed=5), tok, G.GenerationSettings("rand1", 4, 6, 2, seed=1), out,
                        progress=False)
    # the same configuration (another batch size) is a no-op resume
    res = G.self_generate(model, tok, G.GenerationSettings("rand1", 4, 6, 3, seed=1), out, progress=False)
    assert res.n_written == 0 and res.n_skipped == 4 and res.complete


# --------------------------------------------------------------------------- crash safety


def test_resume_after_a_crash_and_a_torn_line(tiny, tmp_path: Path, monkeypatch) -> None:
    model, tok = tiny
    G.self_generate(model, tok, G.GenerationSettings("rand1", 17, 10, 4), tmp_path / "ref", progress=False)
    out = tmp_path / "gen"
    calls = {"n": 0}
    real_append = G.shard_writer._append

    def crash_on_third_block(fd, data, path):
        calls["n"] += 1
        if calls["n"] == 3:  # die mid-write: half of the batch's bytes reach the file
            real_append(fd, data[: len(data) // 2 + 3], path)
            raise KeyboardInterrupt
        real_append(fd, data, path)

    monkeypatch.setattr(G.shard_writer, "_append", crash_on_third_block)
    with pytest.raises(KeyboardInterrupt):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 17, 10, 4), out, progress=False)
    monkeypatch.setattr(G.shard_writer, "_append", real_append)
    shard = out / "shard-00000-of-00001.jsonl"
    assert not shard.read_bytes().endswith(b"\n")  # torn
    partial = [json.loads(x)["index"] for x in shard.read_bytes().split(b"\n")[:-1]]
    assert partial[:8] == list(range(8)) and len(partial) >= 9  # two blocks + part of the third
    assert [r["index"] for r in samples(out)] == partial  # readers skip the torn tail
    res = G.self_generate(model, tok, G.GenerationSettings("rand1", 17, 10, 4), out, progress=False)
    assert res.n_skipped == len(partial) and res.n_written == 17 - len(partial)
    assert sorted(raw_lines(out)) == sorted(raw_lines(tmp_path / "ref"))  # no duplicates, no torn line
    assert samples(out) == samples(tmp_path / "ref")


CHILD = textwrap.dedent("""
    import sys, time, torch
    torch.set_num_threads(1)
    from moir_lib import generation as G
    from moir_lib.models import load
    model, tok, ad = load(sys.argv[1])
    for layer in ad.layers:  # slow the decode down so the parent can kill it mid-run
        layer.register_forward_hook(lambda *a: time.sleep(0.004))
    layers = None if sys.argv[3] == "-" else [int(x) for x in sys.argv[3].split(",")]
    G.self_generate(model, tok, G.GenerationSettings("rand1", 60, 12, 3, seed=5, collect_layers=layers),
                    sys.argv[2], progress=False)
""")


def kill_midway(folder: Path, out: Path, layers: str, min_lines: int = 6) -> None:
    script = out.parent / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, str(script), str(folder), str(out), layers], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    shard = out / "shard-00000-of-00001.jsonl"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if shard.exists() and shard.read_bytes().count(b"\n") >= min_lines:
                break
            if proc.poll() is not None:
                pytest.fail(f"the child exited early: {proc.stdout.read().decode()[-2000:]}")
            time.sleep(0.02)
        else:
            pytest.fail("the child wrote no records in time")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.slow  # the default tier kills a collecting run (test_sigkill_with_key_collection_then_resume)
def test_sigkill_mid_shard_then_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    model, tok = make_model(), make_tokenizer()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    from moir_lib.models import load

    loaded = load(folder)
    G.self_generate(loaded.model, loaded.tokenizer, G.GenerationSettings("rand1", 60, 12, 3, seed=5),
                    tmp_path / "ref", progress=False)
    out = tmp_path / "killed"
    kill_midway(folder, out, "-")
    before = (out / "shard-00000-of-00001.jsonl").read_bytes()
    n_before = before.count(b"\n")
    assert 6 <= n_before < 60
    res = G.self_generate(loaded.model, loaded.tokenizer, G.GenerationSettings("rand1", 60, 12, 3, seed=5),
                          out, progress=False)
    assert res.n_skipped == n_before and res.n_written == 60 - n_before
    lines = raw_lines(out)
    assert len(lines) == len(set(lines)) == 60
    assert lines == raw_lines(tmp_path / "ref")  # byte-identical, in the same order


# --------------------------------------------------------------------------- keys during generation


def second_pass(model, recs: list[dict], layers: list[int], key_positions: str = "generated"):
    """One forward pass per saved sequence (seed_ids + token_ids), counting the same positions."""
    from moir_lib.covariance import KeyCollector
    from moir_lib.models import ModelAdapter

    adapter = ModelAdapter.for_model(model)
    with KeyCollector(adapter, layers) as kc, torch.no_grad():
        for r in recs:
            ids = torch.tensor([r["seed_ids"] + r["token_ids"]])
            mask = torch.ones_like(ids, dtype=torch.bool)
            if key_positions == "generated":
                mask[:, : len(r["seed_ids"])] = False
            kc.set_mask(mask)
            model(input_ids=ids)
    return kc.stats


def assert_stats_close(a, b, rtol: float) -> None:
    assert a.layers == b.layers and a.counts == b.counts
    for layer in a.layers:
        sa, sb = a.sum(layer), b.sum(layer)
        rel = float((sa - sb).norm() / sb.norm())
        assert rel <= rtol, f"layer {layer}: relative difference {rel:.2e} > {rtol:.0e}"


@pytest.mark.parametrize("key_positions", ["generated", "all"])
def test_keys_collected_during_generation_equal_a_second_pass(tiny, tmp_path: Path,
                                                               key_positions: str) -> None:
    model, tok = tiny
    res = G.self_generate(model, tok, G.GenerationSettings("rand2", 15, 10, 4, collect_layers=[0, 1],
                                                           key_positions=key_positions), tmp_path / "gen",
                          progress=False)
    recs = samples(tmp_path / "gen")
    n_gen = sum(len(r["token_ids"]) for r in recs)
    n_all = n_gen + sum(len(r["seed_ids"]) for r in recs)
    assert res.stats.counts == dict.fromkeys([0, 1], n_gen if key_positions == "generated" else n_all)
    reference = second_pass(model, recs, [0, 1], key_positions)
    assert_stats_close(res.stats, reference, rtol=1e-5)  # float32 keys, cached vs full attention
    assert_stats_close(G.load_key_stats(tmp_path / "gen"), reference, rtol=1e-5)
    # a wrong position rule is caught: counting the seed too (or not) changes the count
    other = second_pass(model, recs, [0, 1], "all" if key_positions == "generated" else "generated")
    assert other.counts != res.stats.counts


def test_sharded_key_stats_merge_to_the_unsharded_stats(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    one = G.self_generate(model, tok, G.GenerationSettings("rand1", 12, 8, 4, collect_layers=[1]),
                          tmp_path / "one", progress=False)
    for i in range(3):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 12, 8, 4, collect_layers=[1]),
                        tmp_path / "sh", shard=(i, 3), progress=False)
    merged = G.load_key_stats(tmp_path / "sh")
    # batches differ between the runs: equal up to float32 rounding of the keys (1e-12 on identical batches)
    assert_stats_close(merged, one.stats, rtol=1e-6)
    (tmp_path / "sh" / "keys-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="keys-00002-of-00003.safetensors is missing"):
        G.load_key_stats(tmp_path / "sh")
    G.self_generate(model, tok, G.GenerationSettings("rand1", 3, 4, 4), tmp_path / "plain", progress=False)
    with pytest.raises(ValueError, match="without collect_layers"):
        G.load_key_stats(tmp_path / "plain")


def test_crash_between_samples_and_keys_checkpoint_neither_loses_nor_double_counts(
        tiny, tmp_path: Path, monkeypatch) -> None:
    model, tok = tiny
    ref = G.self_generate(model, tok, G.GenerationSettings("rand1", 14, 9, 3, collect_layers=[0, 1]),
                          tmp_path / "ref", progress=False)
    out = tmp_path / "gen"
    real_save = G.shard_writer._save_shard_stats
    calls = {"n": 0}

    def crash_on_third_checkpoint(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the third batch's records are on disk, its keys are not
            raise KeyboardInterrupt
        real_save(*args, **kwargs)

    monkeypatch.setattr(G.shard_writer, "_save_shard_stats", crash_on_third_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 14, 9, 3, collect_layers=[0, 1]), out,
                        progress=False)
    monkeypatch.setattr(G.shard_writer, "_save_shard_stats", real_save)
    assert len(samples(out)) == 9  # three batches written, two committed
    res = G.self_generate(model, tok, G.GenerationSettings("rand1", 14, 9, 3, collect_layers=[0, 1]), out,
                          progress=False)
    assert res.n_skipped == 6 and res.n_written == 8  # the uncommitted batch was regenerated
    assert raw_lines(out) == raw_lines(tmp_path / "ref")
    assert_stats_close(res.stats, ref.stats, rtol=1e-12)
    assert_stats_close(G.load_key_stats(out), ref.stats, rtol=1e-12)


def test_sigkill_with_key_collection_then_resume(tmp_path: Path) -> None:
    model, tok = make_model(), make_tokenizer()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    from moir_lib.models import load

    loaded = load(folder)
    settings = G.GenerationSettings("rand1", 60, 12, 3, seed=5, collect_layers=[0, 1])
    ref = G.self_generate(loaded.model, loaded.tokenizer, settings, tmp_path / "ref", progress=False)
    out = tmp_path / "killed"
    kill_midway(folder, out, "0,1")
    res = G.self_generate(loaded.model, loaded.tokenizer, settings, out, progress=False)
    assert res.complete and res.n_skipped >= 3
    lines = raw_lines(out)
    assert len(lines) == len(set(lines)) == 60 and lines == raw_lines(tmp_path / "ref")
    assert_stats_close(G.load_key_stats(out), ref.stats, rtol=1e-12)
