"""Sharded self-generation and C across jobs: `moir generate --shard`, `moir cov estimate --shard`,
`moir cov merge` equal one unsharded job, on the micro pocket model."""

from __future__ import annotations

import pytest
import torch

from moir_lib.cli import main
from moir_lib.covariance import CovarianceStats
from moir_lib.generation import read_samples

GEN = ["--profile", "pocket-micro", "--n-samples", "12", "--max-new-tokens", "8", "--batch-size", "5", "-q"]


@pytest.fixture(scope="module")
def generations(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    assert main(["generate", *GEN, "--out", str(root / "one")]) == 0
    for i in range(3):
        assert main(["generate", *GEN, "--shard", f"{i}/3", "--out", str(root / "three")]) == 0
    return root


def test_three_generation_shards_equal_one_unsharded_generation(generations):
    one = [(r["index"], r["token_ids"], r["text"]) for r in read_samples(generations / "one")]
    three = [(r["index"], r["token_ids"], r["text"]) for r in read_samples(generations / "three")]
    assert len(one) == 12
    assert one == three


def test_three_covariance_shards_merge_to_one_unsharded_estimate(generations, tmp_path):
    corpus = str(generations / "one")
    args = ["cov", "estimate", "--profile", "pocket-micro", "--corpus", corpus,
            "--tokens-per-batch", "256", "-q"]
    assert main([*args, "--out", str(tmp_path / "all.safetensors")]) == 0
    for i in range(3):
        assert main([*args, "--shard", f"{i}/3", "--out", str(tmp_path / f"s{i}.safetensors")]) == 0
    shards = [str(tmp_path / f"s{i}.safetensors") for i in range(3)]
    assert main(["cov", "merge", *shards, "--out", str(tmp_path / "merged.safetensors")]) == 0
    whole = CovarianceStats.load(tmp_path / "all.safetensors")
    merged = CovarianceStats.load(tmp_path / "merged.safetensors")
    assert merged.counts == whole.counts and whole.n_tokens > 0
    for layer in whole.layers:
        a, b = whole.sum(layer), merged.sum(layer)
        assert torch.linalg.norm(a - b) <= 1e-12 * torch.linalg.norm(a)


def test_mismatched_shards_are_refused_with_the_reason(generations, tmp_path, capsys):
    args = ["cov", "estimate", "--profile", "pocket-micro", "--tokens-per-batch", "256", "-q"]
    assert main([*args, "--corpus", str(generations / "one"), "--out", str(tmp_path / "a.safetensors")]) == 0
    other = CovarianceStats.load(tmp_path / "a.safetensors")
    other.metadata["model"] = "0" * 16  # the model fingerprint field
    other.save(tmp_path / "b.safetensors")
    code = main(["cov", "merge", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"),
                 "--out", str(tmp_path / "m.safetensors")])
    err = capsys.readouterr().err
    assert code == 2 and "b.safetensors" in err and "model:" in err
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("shard", ["3/3", "1-3", "x/2"])
def test_bad_shard_is_refused_before_loading(shard, capsys):
    assert main(["generate", *GEN, "--shard", shard, "--out", "/nonexistent/never"]) == 2
    assert "shard" in capsys.readouterr().err
