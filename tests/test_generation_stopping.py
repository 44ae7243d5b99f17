"""Prefixes of the keys collected during generation, and generation that stops when C has converged
(moir_lib.generation.stopping) on a tiny random Llama: prefixes equal the keys of the first samples,
a generation asked for prefixes after the fact replays its blocks to the same bits, the stop rule stops
at the first check whose split-half gap meets the target, a generation interrupted anywhere resumes to
the uninterrupted one bit for bit, and the readers (the generation's corpus, its key statistics,
`moir cov estimate --corpus`) read exactly the samples that sufficed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny import make_model, make_tokenizer, raw_lines, samples

from moir_lib import generation as G
from moir_lib.documents import load_corpus
from moir_lib.generation.stopping import StopRule

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYERS = [0, 1]


@pytest.fixture(scope="module")
def tiny():
    return make_model(), make_tokenizer()


def _bits(stats) -> dict[int, bytes]:
    return {layer: stats.sum(layer).numpy().tobytes() for layer in stats.layers}


def _close(a, b, rtol: float) -> None:
    assert a.counts == b.counts
    for layer in a.layers:
        rel = float((a.sum(layer) - b.sum(layer)).norm() / b.sum(layer).norm())
        assert rel <= rtol, f"layer {layer}: {rel:.2e}"


def _gen(tiny, out, n=15, batch=4, shard=None, **settings):
    model, tok = tiny
    return G.self_generate(model, tok, G.GenerationSettings("rand1", n, 10, batch, collect_layers=LAYERS,
                                                            **settings), out, shard, progress=False)


def _prefix_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "prefixes").glob("*.safetensors"))}


def test_prefixes_are_the_keys_of_the_first_samples(tiny, tmp_path):
    plain = _gen(tiny, tmp_path / "plain")
    tapped = _gen(tiny, tmp_path / "tapped", prefixes=[5, 8, 13])
    assert _bits(plain.stats) == _bits(tapped.stats), "prefixes leave the generation's keys alone"
    assert raw_lines(tmp_path / "plain") == raw_lines(tmp_path / "tapped")
    for m in (5, 8, 13):
        short = _gen(tiny, tmp_path / f"first-{m}", n=m)  # the same samples, blocks cut at m
        pre = G.load_key_stats(tmp_path / "tapped", prefix=m)
        assert pre.metadata["prefix"]["point"] == m and pre.metadata["corpus"][0]["documents"] == m
        if m % 4 == 0:  # a block boundary: the same blocks, the same bits
            assert _bits(pre) == _bits(short.stats)
        else:  # a sample's keys round differently in another block
            _close(pre, short.stats, rtol=1e-6)
    with pytest.raises(FileNotFoundError, match="no prefix at 6 samples"):
        G.load_key_stats(tmp_path / "tapped", prefix=6)


def test_shards_prefixes_merge_into_the_first_samples_of_the_run(tiny, tmp_path):
    one = _gen(tiny, tmp_path / "one", prefixes=[7])
    for i in range(3):
        _gen(tiny, tmp_path / "sh", shard=(i, 3), prefixes=[7])
    merged = G.load_key_stats(tmp_path / "sh", prefix=7)
    assert merged.metadata["corpus"][0]["documents"] + merged.metadata["corpus"][1]["documents"] \
        + merged.metadata["corpus"][2]["documents"] == 7
    _close(merged, G.load_key_stats(tmp_path / "one", prefix=7), rtol=1e-6)
    assert one.prefixes is not None and 7 in one.prefixes


def test_prefixes_asked_of_a_written_run_are_replayed_to_the_same_bits(tiny, tmp_path, caplog):
    caplog.set_level("INFO", logger="moir_lib.generation")
    _gen(tiny, tmp_path / "fresh", prefixes=[5, 8, 13])
    _gen(tiny, tmp_path / "late")
    before = raw_lines(tmp_path / "late")
    res = _gen(tiny, tmp_path / "late", prefixes=[5, 8, 13])
    assert res.n_written == 0 and "replaying its first samples" in caplog.text
    assert raw_lines(tmp_path / "late") == before
    fresh, late = _prefix_files(tmp_path / "fresh"), _prefix_files(tmp_path / "late")
    assert sorted(late) == sorted(fresh) and late == fresh  # the same files, byte for byte


# ----------------------------------------------------------------------------- the stop rule


def _rule(target: float, first: int = 4) -> StopRule:
    return StopRule(target=target, first_check=first, tau=0.02)


def test_check_points_and_refusals(tiny, tmp_path):
    rule = _rule(0.1)
    assert rule.check_points(40) == [4, 8, 16, 32, 40]
    assert rule.prefix_points(40) == [2, 4, 8, 16, 20, 32, 40]
    model, tok = tiny
    with pytest.raises(ValueError, match="one shard"):
        _gen(tiny, tmp_path / "a", shard=(0, 2), stop=rule)
    with pytest.raises(ValueError, match="multiple of batch_size"):
        _gen(tiny, tmp_path / "b", stop=_rule(0.1, first=6))
    with pytest.raises(ValueError, match="collect_layers"):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 8, 4, 4, stop=rule), tmp_path / "c",
                        progress=False)
    with pytest.raises(ValueError, match="target gap must be positive"):
        _rule(0.0)
    _gen(tiny, tmp_path / "d", n=16, stop=_rule(1e-12))
    with pytest.raises(ValueError, match="different configuration.*stop"):
        _gen(tiny, tmp_path / "d", n=16, stop=_rule(0.5))


@pytest.fixture(scope="module")
def budget_generation(tiny, tmp_path_factory):
    """A generation whose target is never met: every check's gap, and the whole budget."""
    out = tmp_path_factory.mktemp("budget") / "gen"
    res = _gen(tiny, out, n=40, stop=_rule(1e-12))
    return out, res


def test_a_target_never_met_runs_the_budget_and_says_so(budget_generation):
    out, res = budget_generation
    stopped = res.stopped
    assert stopped["converged"] is False and stopped["sufficed"] is None
    assert stopped["n_samples"] == 40 == len(samples(out))
    assert [c["n_samples"] for c in stopped["checks"]] == [4, 8, 16, 32, 40]
    assert all(c["gap"] > 0 for c in stopped["checks"])
    assert json.loads((out / "manifest.json").read_text())["stopped"] == stopped


def test_the_generation_stops_at_the_first_check_that_meets_the_target(tiny, budget_generation, tmp_path):
    _, ref = budget_generation
    gaps = {c["n_samples"]: c["gap"] for c in ref.stopped["checks"]}
    target = gaps[16]  # met at 16 at the latest
    expected = next(n for n in (4, 8, 16) if gaps[n] <= target)
    out = tmp_path / "gen"
    res = _gen(tiny, out, n=40, stop=_rule(target))
    s = res.stopped
    assert s["converged"] and s["n_samples"] == expected and s["sufficed"] == expected // 2
    assert [c["n_samples"] for c in s["checks"]][-1] == expected
    assert [c["gap"] for c in s["checks"]] == [gaps[n] for n in (4, 8, 16) if n <= expected]
    # the generation is what the manifest says: exactly those samples, sealed, and its readers read them
    assert len(samples(out)) == expected and res.complete
    assert (out / "shard-00000-of-00001.jsonl.sha256").is_file()
    G.verify_generation(out)
    assert len(list(load_corpus(out))) == expected
    keys = G.load_key_stats(out)
    assert _bits(keys) == _bits(G.load_key_stats(out, prefix=expected))
    assert keys.counts == G.load_key_stats(ref.out_dir, prefix=expected).counts
    # asked again, it has nothing to do and keeps its outcome
    again = _gen(tiny, out, n=40, stop=_rule(target))
    assert again.n_written == 0 and again.stopped == s and len(samples(out)) == expected


@pytest.mark.parametrize("where", ["samples", "checkpoint", "stop"])
def test_an_interrupted_generation_resumes_to_the_uninterrupted_one_bit_for_bit(tiny, budget_generation,
                                                                                tmp_path, monkeypatch, where):
    """Killed while writing a block's records, before its keys checkpoint, or after the deciding check
    but before its outcome is written: the resumed generation holds the same records, keys, prefixes and
    outcome as the generation that was never interrupted."""
    _, ref = budget_generation
    target = {c["n_samples"]: c["gap"] for c in ref.stopped["checks"]}[16]
    straight = tmp_path / "straight"
    _gen(tiny, straight, n=40, stop=_rule(target))
    out = tmp_path / "killed"
    name = {"samples": "_append", "checkpoint": "_save_shard_stats", "stop": "record_stop"}[where]
    real = getattr(G.shard_writer, name)
    calls = {"n": 0}

    def crash(*args, **kwargs):
        calls["n"] += 1
        if where == "stop" or calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(G.shard_writer, name, crash)
    with pytest.raises(KeyboardInterrupt):
        _gen(tiny, out, n=40, stop=_rule(target))
    monkeypatch.setattr(G.shard_writer, name, real)
    assert "stopped" not in json.loads((out / "manifest.json").read_text())
    _gen(tiny, out, n=40, stop=_rule(target))
    assert raw_lines(out) == raw_lines(straight)
    assert _bits(G.load_key_stats(out)) == _bits(G.load_key_stats(straight))
    assert _prefix_files(out) == _prefix_files(straight)
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (out, straight)]
    assert manifests[0]["stopped"] == manifests[1]["stopped"]


def test_moir_generate_until_converged_and_cov_estimate_read_what_sufficed(tmp_path, capsys):
    """The command line on the real checkpoint: `moir generate --until-converged` stops, records the count,
    and `moir cov estimate --corpus` over the generation counts exactly those samples."""
    from moir_lib.cli import main

    gen_dir = tmp_path / "gen"
    args = ["generate", "--profile", "stories260k", "--n-samples", "64", "--max-new-tokens", "8",
            "--batch-size", "4", "--until-converged", "0.9", "--check-from", "8", "--out", str(gen_dir), "-q"]
    assert main(args) == 0
    out = capsys.readouterr().out
    stopped = json.loads((gen_dir / "manifest.json").read_text())["stopped"]
    assert stopped["converged"] and stopped["n_samples"] < 64 and f"stopped at {stopped['n_samples']}" in out
    cov = tmp_path / "c.safetensors"
    assert main(["cov", "estimate", "--profile", "stories260k", "--corpus", str(gen_dir), "--out", str(cov),
                 "-q"]) == 0
    from moir_lib.covariance import read_metadata

    meta = read_metadata(cov)
    assert meta["corpus"][0]["documents"] == stopped["n_samples"]
    tokens = sum(len(r["seed_ids"]) + len(r["token_ids"]) for r in samples(gen_dir))
    assert meta["counts"][1] == tokens  # a second pass counts every position, BOS included
