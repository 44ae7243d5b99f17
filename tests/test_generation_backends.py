"""moir_lib.generation's decode loops and backends on the tiny random models of test_generation: the
static-cache loop gives exactly the dynamic loop's tokens and keys; the vLLM backend (a fake engine and
a fake ``vllm`` module here, test doubles only: vLLM needs a GPU) builds seeded requests and writes the
torch backend's run format, resumably; missing vLLM or GPU is refused before any work."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import BOS, EOS, PAD, make_model, make_tokenizer, raw_lines, reference_sample, samples

from moir_lib import generation as G
from moir_lib import vllm_backend as V
from moir_lib.documents import load_corpus

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return make_model(), make_tokenizer()


# --------------------------------------------------------------------------- the static-cache loop


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("seeds", [
    [[BOS, 7], [BOS, 9, 10, 11, 12], [8], [BOS, 20, 21]],  # ragged: left padding and a mask
    [[BOS, 7], [BOS, 9], [BOS, 8], [BOS, 20]],  # equal lengths: no mask
])
def test_static_loop_gives_the_tokens_of_the_dynamic_loop(family, seeds) -> None:
    model = make_model(family=family)
    indices = [3, 0, 11, 5]
    decoder = G.decoding._StaticDecoder(model, capture=False)
    args = (G.decoding._Sampling(42, 20, [EOS], PAD, count_seed=False), seeds, indices, None, [True] * 4)
    with torch.inference_mode():
        dynamic, n_dynamic = G.decoding._decode_block(model, *args)
        static, n_static = G.decoding._decode_block_static(decoder, *args)
        again, _ = G.decoding._decode_block_static(decoder, *args)
    assert static == dynamic and n_static == n_dynamic
    assert again == static  # the reused (reset) cache gives the same block again
    assert static[0] == reference_sample(model, seeds[0], indices[0], 42, 20)
    assert any(len(s) < 20 for s in static)  # a row stopped at EOS mid-block: finished rows are carried


def test_static_loop_generations_are_byte_identical_to_dynamic_ones(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    G.self_generate(model, tok, G.GenerationSettings("rand1", 22, 14, 8, seed=5, loop="dynamic"),
                    tmp_path / "dynamic", progress=False)
    base = raw_lines(tmp_path / "dynamic")
    for bs in (8, 5):  # 22 = 8+8+6 and 5*4+2: a smaller last block gets its own cache
        G.self_generate(model, tok, G.GenerationSettings("rand1", 22, 14, bs, seed=5, loop="static"),
                        tmp_path / f"static{bs}", progress=False)
        assert raw_lines(tmp_path / f"static{bs}") == base
    # a run interrupted under one loop resumes under the other (the manifest does not name the loop)
    shard = tmp_path / "static5" / "shard-00000-of-00001.jsonl"
    shard.write_bytes(b"".join(shard.read_bytes().splitlines(keepends=True)[:9]))
    res = G.self_generate(model, tok, G.GenerationSettings("rand1", 22, 14, 5, seed=5, loop="dynamic"),
                          tmp_path / "static5", progress=False)
    assert res.n_skipped == 9 and res.n_written == 13
    assert raw_lines(tmp_path / "static5") == base


def test_auto_loop_is_dynamic_on_cpu_and_static_needs_support(tiny, monkeypatch) -> None:
    model, _ = tiny
    assert G.decoding._resolve_loop(model, "auto", "torch", False) == ("dynamic", False)
    assert G.decoding._resolve_loop(model, "static", "torch", False) == ("static", False)  # CPU: no capture
    with pytest.raises(ValueError, match="unknown loop 'graph'"):
        G.decoding._resolve_loop(model, "graph", "torch", False)
    monkeypatch.setattr(type(model), "_can_compile_fullgraph", False)
    assert G.decoding._resolve_loop(model, "auto", "torch", False) == ("dynamic", False)
    with pytest.raises(ValueError, match="static-cache support"):
        G.decoding._resolve_loop(model, "static", "torch", False)


def test_static_loop_collects_the_keys_of_the_dynamic_loop(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    keys = {"collect_layers": [0, 1], "key_positions": "all"}
    dynamic = G.self_generate(model, tok, G.GenerationSettings("rand2", 13, 9, 4, loop="dynamic", **keys),
                              tmp_path / "d", progress=False)
    static = G.self_generate(model, tok, G.GenerationSettings("rand2", 13, 9, 4, loop="static", **keys),
                             tmp_path / "s", progress=False)
    assert raw_lines(tmp_path / "s") == raw_lines(tmp_path / "d")
    assert static.stats.counts == dynamic.stats.counts
    for layer in (0, 1):
        a, b = static.stats.sum(layer), dynamic.stats.sum(layer)
        assert float((a - b).norm() / b.norm()) <= 1e-6  # float32 keys; attention over a longer, masked cache


# --------------------------------------------------------------------------- the vLLM backend (test doubles)


class FakeSamplingParams:
    """Stands in for ``vllm.SamplingParams``: keeps its keyword arguments."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeEngine:
    """``generate`` like ``vllm.LLM``: per-request draws from ``params.seed`` only, stopping at EOS."""

    def __init__(self, vocab: int = 56):
        self.vocab = vocab
        self.requests: list[tuple[list[int], FakeSamplingParams]] = []

    def generate(self, prompts, params, use_tqdm=True):
        assert use_tqdm is False and len(prompts) == len(params)
        outputs = []
        for prompt, p in zip(prompts, params, strict=True):
            self.requests.append((prompt["prompt_token_ids"], p))
            rng = np.random.default_rng(p.seed)
            toks = []
            while len(toks) < p.max_tokens:
                stop = rng.random() < 0.1
                toks.append(int(rng.choice(p.stop_token_ids)) if stop else int(rng.integers(6, self.vocab)))
                if toks[-1] in p.stop_token_ids:
                    break
            reason = "stop" if toks[-1] in p.stop_token_ids else "length"
            completion = types.SimpleNamespace(token_ids=toks, finish_reason=reason, stop_reason=None)
            outputs.append(types.SimpleNamespace(outputs=[completion]))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_vllm_requests_carry_the_seed_sequences_and_per_sample_seeds(fake_vllm) -> None:
    prompts, params = V.requests([[BOS, 7], [BOS, 9]], [4, 17], 3, 256, [EOS, 5])
    assert prompts == [{"prompt_token_ids": [BOS, 7]}, {"prompt_token_ids": [BOS, 9]}]
    for p, i in zip(params, [4, 17], strict=True):
        assert p.seed == V.sample_seed(3, i) and 0 <= p.seed < 2**63
        assert (p.n, p.temperature, p.top_p, p.max_tokens, p.stop_token_ids) == (1, 1.0, 1.0, 256, [EOS, 5])
        assert p.ignore_eos is False and p.detokenize is False and not hasattr(p, "top_k")  # no truncation
    seeds = {V.sample_seed(0, i) for i in range(1000)}
    assert len(seeds) == 1000 and V.sample_seed(0, 7) == V.sample_seed(0, 7) != V.sample_seed(1, 7)


def test_vllm_generation_has_the_torch_format_resumes_and_feeds_cov_estimate(tiny, tmp_path: Path,
                                                                       fake_vllm) -> None:
    model, tok = tiny
    engine = FakeEngine()
    kw = {"seed": 2, "backend": "vllm"}
    res = G.self_generate(model, tok, G.GenerationSettings("rand1", 17, 12, 6, **kw), tmp_path / "one",
                          engine=engine, progress=False)
    assert res.complete and len(engine.requests) == 17
    recs = samples(tmp_path / "one")
    assert [r["index"] for r in recs] == list(range(17))
    cand = G.seed_candidates(tok, 64)
    for r in recs:
        assert set(r) == {"index", "seed_strategy", "seed_ids", "token_ids", "text"}
        assert r["seed_ids"] == G.seed_ids_for("rand1", r["index"], 2, bos_id=BOS, candidates=cand)
        assert 1 <= len(r["token_ids"]) <= 12 and EOS not in r["token_ids"][:-1]
        body = r["token_ids"][:-1] if r["token_ids"][-1] == EOS else r["token_ids"]
        assert r["text"] == tok.decode(r["seed_ids"][1:] + body, skip_special_tokens=False)
    assert any(r["token_ids"][-1] == EOS for r in recs) and any(len(r["token_ids"]) == 12 for r in recs)
    assert G.read_manifest(tmp_path / "one")["sampling"]["method"] == V.SAMPLING_METHOD
    docs = list(load_corpus(str(tmp_path / "one")))  # what `moir cov estimate --corpus <run>` reads
    assert docs == [r["seed_ids"] + r["token_ids"] for r in recs]

    # per-sample seeds: other batch sizes and shards give the same records
    for i in range(2):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 17, 12, 4, **kw), tmp_path / "sharded",
                        shard=(i, 2), engine=FakeEngine(), progress=False)
    assert samples(tmp_path / "sharded") == recs

    # a crash mid-run: the resumed run requests only what is missing and ends byte-identical
    shard = tmp_path / "one" / "shard-00000-of-00001.jsonl"
    lines = shard.read_bytes().splitlines(keepends=True)
    (tmp_path / "resumed").mkdir()
    (tmp_path / "resumed" / "manifest.json").write_bytes((tmp_path / "one" / "manifest.json").read_bytes())
    (tmp_path / "resumed" / shard.name).write_bytes(b"".join(lines[:8]) + lines[8][:10])  # a torn line
    again = FakeEngine()
    res = G.self_generate(model, tok, G.GenerationSettings("rand1", 17, 12, 6, **kw), tmp_path / "resumed",
                          engine=again, progress=False)
    assert res.n_skipped == 8 and res.n_written == 9 and len(again.requests) == 9
    assert raw_lines(tmp_path / "resumed") == raw_lines(tmp_path / "one")

    # the torch sampler draws other tokens: resuming a vLLM run with it is refused
    with pytest.raises(ValueError, match="sampling"):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 17, 12, 6, seed=2), tmp_path / "one",
                        progress=False)


def test_vllm_is_refused_clearly_before_any_work(tiny, tmp_path: Path, monkeypatch) -> None:
    model, tok = tiny
    monkeypatch.setattr(model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    out = tmp_path / "never"
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(RuntimeError, match=r"needs vLLM .*pip install 'moir-lab\[vllm\]'"):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 4, 4, 4, backend="vllm"), out,
                        progress=False)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 4, 4, 4, backend="vllm"), out,
                        progress=False)
    with pytest.raises(ValueError, match="cannot collect keys"):
        G.self_generate(model, tok,
                        G.GenerationSettings("rand1", 4, 4, 4, backend="vllm", collect_layers=[0]), out,
                        engine=FakeEngine(), progress=False)
    with pytest.raises(ValueError, match="applies to backend='torch' only"):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 4, 4, 4, backend="vllm", loop="static"),
                        out, engine=FakeEngine(), progress=False)
    with pytest.raises(ValueError, match="unknown backend 'tgi'"):
        G.self_generate(model, tok, G.GenerationSettings("rand1", 4, 4, 4, backend="tgi"), out,
                        progress=False)
    assert not out.exists()


def test_vllm_outputs_that_break_the_record_format_are_refused() -> None:
    def output(toks, reason):
        return types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=toks, finish_reason=reason,
                                                                    stop_reason=None)])

    assert V._sampled(output([9, 10, EOS], "stop"), 0, [EOS], 8) == [9, 10, EOS]
    assert V._sampled(output([9] * 8, "length"), 0, [EOS], 8) == [9] * 8
    with pytest.raises(RuntimeError, match="without an EOS id"):
        V._sampled(output([9, 10], "stop"), 3, [EOS], 8)  # a vLLM that strips the stop token
    with pytest.raises(RuntimeError, match="ending at its first EOS"):
        V._sampled(output([9, EOS, 10], "stop"), 3, [EOS], 8)
    with pytest.raises(RuntimeError, match="at most 8"):
        V._sampled(output([9] * 9, "length"), 3, [EOS], 8)


def test_static_loop_gives_the_tokens_of_the_dynamic_loop_on_the_micro_pocket_model(tmp_path: Path) -> None:
    from moir_lib.models import load

    model, tok, _ = load("pocket-micro")  # cached by the pocket build (built once, ≈ 2 CPU minutes)
    for strategy in ("rand1", "bos"):
        G.self_generate(model, tok, G.GenerationSettings(strategy, 24, 32, 8, seed=3, loop="dynamic"),
                        tmp_path / f"d-{strategy}", progress=False)
        G.self_generate(model, tok, G.GenerationSettings(strategy, 24, 32, 8, seed=3, loop="static"),
                        tmp_path / f"s-{strategy}", progress=False)
        assert raw_lines(tmp_path / f"s-{strategy}") == raw_lines(tmp_path / f"d-{strategy}")
        lengths = [len(r["token_ids"]) for r in samples(tmp_path / f"s-{strategy}")]
        assert min(lengths) < 32  # some samples stop at EOS inside a block: finished rows are carried
