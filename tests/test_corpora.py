"""moir_lib.documents: every spec kind, seeded sampling, shards, fingerprints and clear refusals.

The HF kind is exercised offline through ``datasets.load_dataset`` itself: the local WikiText
slice in ``data/slices`` goes through the packaged ``text`` builder (``hf:text?data_files=``),
and hub specs are checked for the exact arguments they pass to ``load_dataset``.
"""

from __future__ import annotations

import gzip
import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from moir_lib import documents
from moir_lib.documents import CorpusSpec, iter_documents, load_corpus, parse_spec


def wikitext(slices: Path) -> Path:
    return slices / "benchmarks" / "wikitext2" / "wiki.test.raw"


def file_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline=None) as f:
        return [line for line in f.read().splitlines() if line.strip()]


# --------------------------------------------------------------------------- Hugging Face datasets


def test_wikitext_slice_through_datasets(slices):
    path = wikitext(slices)
    lines = file_lines(path)
    ordered = load_corpus(f"hf:text?data_files={path}", seed=None)
    assert ordered.spec.kind == "hf" and ordered.spec.name == "text" and ordered.spec.split == "train"
    docs = list(ordered)
    assert docs == lines and len(docs) == 2891 and docs[0] == " = Robert Boulter = "

    sample = list(iter_documents(f"hf:text?data_files={path}", n=40, seed=0))
    assert len(sample) == 40 and set(sample) <= set(lines)
    assert sample == list(iter_documents(f"hf:text?data_files={path}", n=40, seed=0))  # deterministic
    assert sample != list(iter_documents(f"hf:text?data_files={path}", n=40, seed=1))
    assert sample != lines[:40]  # shuffled (buffered shuffle: the buffer exceeds this file)
    small = list(iter_documents(f"hf:text?data_files={path}&buffer=50", n=40, seed=0))
    assert small != sample and set(small) <= set(lines[:90])  # a 50-document buffer only reaches so far

    key = load_corpus(f"hf:text?data_files={path}", n=40, seed=0).key()
    assert key["content"][0][1:] == [path.stat().st_size, documents._file_hash(path)]
    assert {key["n"], key["seed"], key["name"]} == {40, 0, "text"}


def test_hub_specs_call_load_dataset_with_their_fields(slices, monkeypatch):
    import datasets

    path = wikitext(slices)
    real = datasets.load_dataset
    calls = []

    def fake(**kwargs):  # the hub is offline: record the call, answer from the local slice
        calls.append(kwargs)
        return real("text", data_files=str(path), split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    docs = list(iter_documents("Salesforce/wikitext:wikitext-103-raw-v1@a1b2c3", n=3, seed=None))
    assert calls[-1] == {"path": "Salesforce/wikitext", "name": "wikitext-103-raw-v1", "split": "train",
                         "streaming": True, "revision": "a1b2c3"}
    assert docs == file_lines(path)[:3]
    spec = parse_spec("wikimedia/wikipedia:20231101.en?split=train&field=text")
    assert (spec.kind, spec.name, spec.config) == ("hf", "wikimedia/wikipedia", "20231101.en")
    assert spec.text_field == "text"
    list(iter_documents(spec, n=2, seed=7))
    assert calls[-1] == {"path": "wikimedia/wikipedia", "name": "20231101.en", "split": "train",
                         "streaming": True}
    with pytest.raises(ValueError, match=r"no field 'body'; fields are \['text'\]"):
        list(iter_documents("wikimedia/wikipedia:20231101.en?field=body", n=2))


def test_unreachable_hub_dataset_offline_says_what_to_do(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    corpus = load_corpus("moir-lab-tests/no-such-dataset:cfg", n=2)  # nothing is fetched until iterated
    with pytest.raises(FileNotFoundError, match="could not open HF dataset .*HF_DATASETS_OFFLINE"):
        list(corpus)


# --------------------------------------------------------------------------- local files


@pytest.fixture()
def folder(tmp_path) -> Path:
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"text": "alpha one", "id": 1}, {"text": "   ", "id": 2}, {"text": "alpha three", "id": 3}]))
    frame = pd.DataFrame({"content": ["def f(): pass", "print(1)", None, "x = 2"]})
    frame.to_parquet(root / "sub" / "b.parquet")
    with gzip.open(root / "sub" / "c.txt.gz", "wt") as f:
        f.write("line one\n\nline two\r\nline three\n")
    (root / "notes.csv").write_text("ignored,file\n")
    return root


ORDERED = ["alpha one", "alpha three", "def f(): pass", "print(1)", "x = 2",
           "line one", "line two", "line three"]


def test_folder_of_jsonl_parquet_and_text(folder):
    assert list(iter_documents(folder, seed=None)) == ORDERED  # sorted files; blanks and None skipped
    assert load_corpus(folder).spec.kind == "files"
    sample = list(iter_documents(folder, n=5, seed=0))
    assert len(sample) == 5 and len(set(sample)) == 5 and set(sample) <= set(ORDERED)
    assert sample == list(iter_documents(str(folder), n=5, seed=0))
    assert sample != list(iter_documents(folder, n=5, seed=1))
    everything = list(iter_documents(folder, seed=3))
    assert sorted(everything) == sorted(ORDERED) and everything != ORDERED  # a seeded permutation
    shards = [list(iter_documents(folder, seed=3, shard=(i, 3))) for i in range(3)]
    assert shards[0] == everything[0::3] and sorted(sum(shards, [])) == sorted(ORDERED)
    assert list(iter_documents(folder, n=2, seed=None, max_chars=5)) == ["alpha", "alpha"]
    with pytest.raises(ValueError, match=r"b.parquet: no field 'nope'; fields are \['content'\]"):
        list(iter_documents(f"file:{folder / 'sub' / 'b.parquet'}?field=nope", seed=None))
    (folder / "d.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"none of the text fields .* in \['body'\]; name one with \?field="):
        list(iter_documents(folder, seed=None))


def test_text_units(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("first line\nsecond line\n\n\nthird\n")
    assert list(iter_documents(path, seed=None)) == ["first line", "second line", "third"]
    assert list(iter_documents(f"{path}?unit=paragraph", seed=None)) == ["first line\nsecond line", "third"]
    assert list(iter_documents(path, seed=None, text_unit="file")) == ["first line\nsecond line\n\n\nthird\n"]
    with pytest.raises(ValueError, match="unknown text unit 'page'"):
        load_corpus(path, text_unit="page")


def test_json_array_file(tmp_path):
    path = tmp_path / "records.json"
    path.write_text(json.dumps([{"document": "one"}, {"document": "two"}]))
    assert list(iter_documents(path, seed=None)) == ["one", "two"]


def test_fingerprint_tracks_content_and_sampling(folder):
    key = load_corpus(folder, n=4, seed=0).key()
    assert key == load_corpus(folder, n=4, seed=0).key()
    assert key["content"][0][0] == "a.jsonl" and len(key["content"]) == 3  # notes.csv is not a corpus file
    assert key != load_corpus(folder, n=5, seed=0).key()
    assert key != load_corpus(folder, n=4, seed=1).key()
    assert key != load_corpus(folder, n=4, seed=0, max_chars=10).key()
    (folder / "a.jsonl").write_text(json.dumps({"text": "changed"}) + "\n")
    assert key != load_corpus(folder, n=4, seed=0).key()


# --------------------------------------------------------------------------- pocket and self-generated


def test_pocket_domains():
    from moir_lib.pocket import iter_documents as pocket_documents
    from moir_lib.pocket.variants import get_variant
    from moir_lib.pocket.world import World

    assert list(iter_documents("pocket:math", n=3, seed=5)) == list(pocket_documents("math", n=3, seed=5))
    chat = load_corpus("pocket:chat?split=validation", n=2)
    assert chat.spec.split == "validation" and list(chat) == list(
        pocket_documents("chat", "validation", n=2, world=World(get_variant("pocket").world)))
    assert chat.key()["content"]["world"]["seed"] == 0
    with pytest.raises(ValueError, match="endless stream: give n"):
        load_corpus("pocket:wiki")
    with pytest.raises(ValueError, match="unknown pocket domain 'poetry': choose one of wiki, web, code"):
        load_corpus("pocket:poetry", n=1)


def test_pocket_domains_are_written_by_the_world_the_models_learned():
    """``pocket:<domain>`` is the world of the book's ``pocket`` variant (its rosters included), and
    ``pocket:<domain>:<variant>`` that of the variant named: a C of the pocket wiki sees the people the
    model was trained on, never the default world's."""
    import dataclasses

    from moir_lib.covariance.recipes import CovSettings
    from moir_lib.documents import pocket_corpus
    from moir_lib.pocket import iter_documents as pocket_documents
    from moir_lib.pocket.variants import get_variant
    from moir_lib.pocket.world import World
    from moir_lib.profiles import load_profile

    for spec, variant in (("pocket:wiki", "pocket"), ("pocket:wiki:micro", "micro")):
        corpus, world = load_corpus(spec, n=30, seed=3), get_variant(variant).world
        assert list(corpus) == list(pocket_documents("wiki", n=30, seed=3, world=World(world)))
        assert corpus.key()["content"]["world"] == dataclasses.asdict(world)
        assert pocket_corpus("wiki", variant) == spec
    assert load_corpus("pocket:wiki:pocket", n=1).spec == load_corpus("pocket:wiki", n=1).spec
    assert list(load_corpus("pocket:wiki", n=30)) != list(pocket_documents("wiki", n=30))  # not World()
    micro, book = (set(World(get_variant(v).world).people) for v in ("micro", "pocket"))
    text = " ".join(load_corpus("pocket:wiki:micro", n=60))
    assert any(p in text for p in micro) and not any(p in text for p in book - micro)
    with pytest.raises(ValueError, match="unknown pocket variant 'nope'"):
        parse_spec("pocket:wiki:nope")
    settings = CovSettings().resolved(load_profile("pocket-micro"))
    assert settings.wiki_subset == "pocket:wiki:micro" and all(s.endswith(":micro") for s in settings.oracle)
    assert load_profile("pocket-micro").covariance.wiki_corpus == "pocket:wiki:micro"


def write_generation(gen_dir: Path, samples: list[dict]) -> Path:
    gen_dir.mkdir(parents=True)
    manifest = {"format": 1, "seed_strategy": "rand1", "n_samples": len(samples), "n_shards": 1}
    (gen_dir / "manifest.json").write_text(json.dumps(manifest))
    (gen_dir / "shard-00000-of-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    return gen_dir


SAMPLES = [{"index": i, "seed_strategy": "rand1", "seed_ids": [1, 10 + i], "token_ids": [20, 21 + i, 2],
            "text": f"word{i} more"} for i in range(4)]


def test_generation_dir_through_generation_read_samples(tmp_path):
    gen_dir = write_generation(tmp_path / "gen", SAMPLES)
    corpus = load_corpus(gen_dir)  # a folder with manifest.json and shards is recognised
    assert corpus.spec.kind == "selfgen" and corpus.spec.seed is None
    assert list(corpus) == [[1, 10 + i, 20, 21 + i, 2] for i in range(4)]
    assert list(iter_documents(f"selfgen:{gen_dir}?ids=0", n=2)) == ["word0 more", "word1 more"]
    sample = list(iter_documents(f"selfgen:{gen_dir}", n=2, seed=0))
    assert len(sample) == 2 and sample == list(iter_documents(f"selfgen:{gen_dir}", n=2, seed=0))
    key = corpus.key()
    with open(gen_dir / "shard-00000-of-00001.jsonl", "a") as f:  # a generation that grew is another corpus
        f.write(json.dumps({**SAMPLES[0], "index": 4}) + "\n")
    assert load_corpus(gen_dir).key() != key


def test_self_generated_kind_delegates_to_read_samples(tmp_path, monkeypatch):
    gen_dir = write_generation(tmp_path / "gen", SAMPLES[:1])
    seen = []

    def read_samples(gen_dir):
        seen.append(Path(gen_dir))
        yield {"index": 0, "seed_ids": [1], "token_ids": [5, 6], "text": "hi"}

    fake = types.SimpleNamespace(read_samples=read_samples, verify_generation=lambda gen_dir: None)
    monkeypatch.setitem(sys.modules, "moir_lib.generation", fake)
    assert list(iter_documents(f"selfgen:{gen_dir}")) == [[1, 5, 6]] and seen == [gen_dir]
    with pytest.raises(FileNotFoundError, match="not a self-generation directory"):
        load_corpus(f"selfgen:{tmp_path / 'nowhere'}")


def test_estimate_on_a_generation_uses_the_token_ids(tmp_path):
    import torch
    from tiny import tiny_loaded

    from moir_lib import covariance as C

    loaded = tiny_loaded("llama", n_layers=2)
    gen_dir = write_generation(tmp_path / "gen", SAMPLES)
    stats = C.estimate(loaded, load_corpus(gen_dir), [1], cache=tmp_path / "cache", progress=False)
    assert stats.count(1) == 4 * 5 and stats.metadata["corpus"][0]["kind"] == "selfgen"
    keys = []
    h = loaded.adapter.key_module(1).register_forward_pre_hook(lambda m, a: keys.append(a[0][0].double()))
    with torch.no_grad():
        for r in SAMPLES:
            loaded.model(torch.tensor([r["seed_ids"] + r["token_ids"]]))
    h.remove()
    k = torch.cat(keys)
    torch.testing.assert_close(stats.sum(1), k.T @ k, rtol=1e-5, atol=1e-8)


# --------------------------------------------------------------------------- refusals


def test_unknown_specs_list_the_kinds(tmp_path):
    for bad in ("wikipedia", "just-a-word"):
        kinds = r"cannot tell which kind of corpus .*hf: .*files: .*pocket: .*selfgen:"
        with pytest.raises(ValueError, match=kinds):
            parse_spec(bad)
    with pytest.raises(ValueError, match="unknown corpus option 'colour'"):
        parse_spec("pocket:wiki?colour=red")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        parse_spec(str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        parse_spec("./no/such/folder")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .txt"):
        parse_spec(tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown corpus kind 'ftp'"):
        CorpusSpec("ftp", "x")
    with pytest.raises(ValueError, match=r"shard must be \(i, k\)"):
        load_corpus("pocket:wiki", n=2, shard=(3, 3))
    with pytest.raises(TypeError, match="unknown corpus option"):
        load_corpus("pocket:wiki", n=2, colour="red")
    assert "wikimedia/wikipedia" in documents.KINDS["hf"]
