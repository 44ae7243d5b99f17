"""Causal tracing (moir_lib.tracing, appendix C.4): exact properties, alignment, window, CLI, chapter.

The model-level tests use tiny random Llama / GPT-2 models with a word-level tokenizer and a
large init (peaky outputs, so P_clean - P_corrupted is far from 0). They check properties that
hold exactly in any causal model: restoring the last layer at the last position reproduces the
clean run (IE = 1) and restoring anything before the subject changes nothing (IE = 0); and that
the batched restored runs equal an independent, unbatched computation.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from moir_lib import tracing
from moir_lib.chapters import causal_tracing
from moir_lib.profiles import ProfileError, load_profile

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the capital of is city river king queen music film Angola Africa Paris France located in cat "
         "sat on mat a old new north south by . ,").split()
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
PROMPTS = [
    ("the capital of France is", "France", "Paris"),
    ("Angola is located in", "Angola", "Africa"),
    ("the old king of the north is", "old king", "queen"),
    ("music by the river is", "river", "film"),
]


def make_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


def make_model(family: str = "llama", n_layers: int = 4, seed: int = 0) -> transformers.PreTrainedModel:
    common = {"vocab_size": len(SPECIALS) + len(WORDS), "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": 0, "initializer_range": 0.3}
    if family == "llama":
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                                          num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=64, **common)
    else:
        config = transformers.GPT2Config(n_embd=32, n_inner=64, n_layer=n_layers, n_head=2, n_positions=64,
                                         **common)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny forwards beside a training job on two cores: one thread is ~10x faster than two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="module")
def llama():
    return make_model("llama")


@pytest.fixture(scope="module")
def known(llama, tok) -> list[tuple[str, str, str]]:
    """PROMPTS with the model's own top-1 token as the answer (ROME traces the model's prediction)."""
    out = []
    with torch.no_grad():
        for prompt, subject, _ in PROMPTS:
            ids = torch.tensor([tok(prompt)["input_ids"]])
            out.append((prompt, subject, tok.decode([int(llama(input_ids=ids).logits[0, -1].argmax())])))
    return out


@pytest.fixture(scope="module")
def traced(llama, tok, known) -> tracing.TraceResult:
    return tracing.trace(llama, tok, known, tracing.TraceSettings(n_noise=4, seed=0), progress=False)


def _ie(result: tracing.TraceResult) -> pd.DataFrame:
    return result.scores.merge(result.prompts[["prompt_id", "n_tokens", "subject_start", "subject_end",
                                               "p_clean", "p_corrupted"]], on="prompt_id")


# ----------------------------------------------------------------------------- exact properties


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_restoring_last_layer_at_last_position_gives_ie_one(family, tok):
    model = make_model(family) if family == "gpt2" else make_model("llama", seed=1)
    res = tracing.trace(model, tok, PROMPTS, tracing.TraceSettings(n_noise=3, seed=0), progress=False)
    df = _ie(res)
    last = df[(df["layer"] == res.n_layers - 1) & (df["position"] == df["n_tokens"] - 1)]
    assert len(last) == len(PROMPTS)
    np.testing.assert_allclose(last["p_restored"], last["p_clean"], rtol=1e-5, atol=1e-7)
    moved = last[(last["p_clean"] - last["p_corrupted"]).abs() > 1e-3]
    assert len(moved) >= 2, "the noise must move the answer's probability for most prompts"
    np.testing.assert_allclose(moved["ie"], 1.0, atol=1e-3)
    # every other position of the last layer cannot reach the last position's logits
    others = df[(df["layer"] == res.n_layers - 1) & (df["position"] < df["n_tokens"] - 1)]
    np.testing.assert_allclose(others["ie"], 0.0, atol=1e-4)


def test_last_token_curve_reaches_one_at_the_last_layer(traced):
    late = traced.last_token_curve()
    assert list(late["layer"]) == list(range(traced.n_layers)) and (late["n"] == traced.n_valid).all()
    assert late["ie"].iloc[-1] == pytest.approx(1.0, abs=1e-4)
    head = causal_tracing.headline(traced, 2)
    assert head["last_token_layer_ie"] == pytest.approx(list(late["ie"]))
    assert head["layer_ie"] == pytest.approx(list(traced.layer_curve()["ie"]))


def test_positions_before_the_subject_have_no_effect(traced):
    df = _ie(traced)
    before = df[df["position"] < df["subject_start"]]
    assert len(before) >= traced.n_layers * 5, "the prompts must have tokens before their subjects"
    np.testing.assert_allclose(before["p_restored"], before["p_corrupted"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(before["ie"], 0.0, atol=1e-4)
    # and restoring the subject itself does matter somewhere
    subject = df[(df["position"] >= df["subject_start"]) & (df["position"] < df["subject_end"])]
    assert subject["ie"].abs().max() > 0.05


def test_batched_runs_match_an_independent_unbatched_computation(llama, tok, known, traced):
    """Re-derive P_corrupted and one P_restored with inputs_embeds and a single hook."""
    i, layer = 2, 1
    prompt, subject, answer = known[i]
    row = traced.prompts.iloc[i]
    s, e = int(row["subject_start"]), int(row["subject_end"])
    ids = torch.tensor([[1, *tok(prompt, add_special_tokens=False)["input_ids"]]])
    answer_id = tok(f"{prompt} {answer}", add_special_tokens=False)["input_ids"][ids.shape[1] - 1]
    assert [tok.decode([t]) for t in ids[0, s:e]] == subject.split()
    emb = llama.get_input_embeddings()
    with torch.no_grad():
        clean_h = []
        hook = llama.model.layers[layer].register_forward_hook(lambda m, a, out: clean_h.append(out.clone()))
        p_clean = torch.softmax(llama(input_ids=ids).logits[0, -1], -1)[answer_id]
        hook.remove()
        gen = torch.Generator().manual_seed(tracing._noise_seed(0, i))
        noise = traced.noise_std * 3.0 * torch.randn(4, e - s, 32, generator=gen)
        x = emb(ids).repeat(4, 1, 1)
        x[:, s:e] += noise
        p_corr = torch.softmax(llama(inputs_embeds=x).logits[:, -1], -1)[:, answer_id].mean()

        def restore(m, a, out):
            out = out.clone()
            out[:, e - 1] = clean_h[0][0, e - 1]
            return out

        hook = llama.model.layers[layer].register_forward_hook(restore)
        p_rest = torch.softmax(llama(inputs_embeds=x).logits[:, -1], -1)[:, answer_id].mean()
        hook.remove()
    assert row["p_clean"] == pytest.approx(float(p_clean), rel=1e-5)
    assert row["p_corrupted"] == pytest.approx(float(p_corr), rel=1e-4)
    got = traced.scores.query("prompt_id == @i and layer == @layer and position == @e - 1")["p_restored"]
    assert float(got.iloc[0]) == pytest.approx(float(p_rest), rel=1e-4)


def test_batch_size_and_seed(llama, tok, known, traced):
    # sigma comes from the subjects of the prompts traced: pass the full set's to compare like with like
    settings = tracing.TraceSettings(n_noise=4, seed=0, batch_size=12, noise_std=traced.noise_std)
    small = tracing.trace(llama, tok, known[:2], settings, progress=False)
    same = traced.scores[traced.scores["prompt_id"] < 2]
    np.testing.assert_allclose(small.scores["p_restored"], same["p_restored"], rtol=1e-4, atol=1e-7)
    other = tracing.trace(llama, tok, known[:1], tracing.TraceSettings(n_noise=4, seed=1), progress=False)
    assert other.prompts["p_corrupted"].iloc[0] != pytest.approx(traced.prompts["p_corrupted"].iloc[0])


def test_noise_std_sources(llama, tok, traced):
    emb = llama.get_input_embeddings().weight.detach()
    matrix = tracing.trace(llama, tok, PROMPTS[:1], tracing.TraceSettings(n_noise=2, noise_std="matrix"),
                           progress=False)
    assert matrix.noise_std == pytest.approx(float(emb.std()), rel=1e-5)
    subject_ids = [tok.convert_tokens_to_ids(w) for _, s, _ in PROMPTS for w in s.split()]
    assert traced.noise_std == pytest.approx(float(emb[subject_ids].std()), rel=1e-5)
    given = tracing.trace(llama, tok, PROMPTS[:1], tracing.TraceSettings(n_noise=2, noise_std=0.5),
                          progress=False)
    assert given.noise_std == 0.5
    with pytest.raises(ValueError, match="noise_std"):
        tracing.trace(llama, tok, PROMPTS[:1], tracing.TraceSettings(noise_std="rows"), progress=False)


def test_mlp_kind_runs_and_keeps_causality(llama, tok):
    res = tracing.trace(llama, tok, PROMPTS[:2], tracing.TraceSettings(n_noise=2, kind="mlp", window=2),
                        progress=False)
    df = _ie(res)
    assert len(df) == sum(res.prompts["n_tokens"]) * res.n_layers
    np.testing.assert_allclose(df[df["position"] < df["subject_start"]]["ie"], 0.0, atol=1e-4)
    assert tracing._window_layers(0, 6, "mlp", 4) == [0, 1]
    assert tracing._window_layers(3, 6, "mlp", 4) == [1, 2, 3, 4]
    assert tracing._window_layers(3, 6, "hidden", 4) == [3]


# ----------------------------------------------------------------------------- validity and IE


def test_indirect_effect_and_validity_filter():
    assert tracing.indirect_effect(0.3, 0.5, 0.1) == pytest.approx(0.5)
    assert tracing.indirect_effect(0.5, 0.5, 0.1) == pytest.approx(1.0)
    assert np.isnan(tracing.indirect_effect(0.2, 0.2, 0.2))
    np.testing.assert_array_equal(tracing.is_valid([0.5, 0.5, 0.5], [0.48, 0.495, 0.6]), [True, False, False])


def test_zero_noise_makes_every_prompt_invalid(llama, tok):
    res = tracing.trace(llama, tok, PROMPTS[:2], tracing.TraceSettings(n_noise=2, noise_scale=0.0),
                        progress=False)
    assert res.n_valid == 0
    np.testing.assert_allclose(res.prompts["p_corrupted"], res.prompts["p_clean"], rtol=1e-5)
    assert res.aligned().empty and res.layer_curve()["ie"].isna().all() and res.top_layers().empty
    head = causal_tracing.headline(res, 2, [0, 1])
    assert head["window"] == [] and head["peak_layer"] is None and head["agrees_with_profile"] is False
    assert "*No window.*" in causal_tracing.findings(head)


def test_valid_flag_follows_the_margin(traced):
    p = traced.prompts
    np.testing.assert_array_equal(p["valid"], (p["p_clean"] - p["p_corrupted"]) > tracing.VALID_MARGIN)


def test_aligned_table_uses_valid_prompts_only():
    prompts = pd.DataFrame({"prompt_id": [0, 1, 2], "n_tokens": [6, 4, 4], "subject_start": [1, 0, 0],
                            "subject_end": [4, 1, 1], "valid": [True, True, False]})
    rows = []
    for pid, n in ((0, 6), (1, 4), (2, 4)):
        for pos in range(n):
            rows.append((pid, 0, pos, 100.0 if pid == 2 else pid * 10 + pos))
    scores = pd.DataFrame(rows, columns=["prompt_id", "layer", "position", "ie"])
    table = tracing.aligned_table(scores, prompts).set_index("label")
    # prompt 0: subject 1..3 (first 1, middle 2, last 3); prompt 1: one-token subject at 0
    assert table.loc["-1", "ie"] == 0.0 and table.loc["-1", "n"] == 1
    assert table.loc["first subject", "ie"] == pytest.approx((1 + 10) / 2)
    assert table.loc["middle subject", "ie"] == 2.0 and table.loc["middle subject", "n"] == 1
    assert table.loc["last subject", "ie"] == pytest.approx((3 + 10) / 2)
    assert table.loc["+1", "ie"] == pytest.approx((4 + 11) / 2) and table.loc["+3", "ie"] == 13.0
    assert 100.0 not in table["ie"].to_list()


# ----------------------------------------------------------------------------- alignment and window


def test_alignment_mapping():
    labels = tracing.SLOT_LABELS
    assert len(labels) == 18 and labels[tracing.LAST_SUBJECT] == "last subject"
    got = dict((pos, []) for pos in range(12))
    for slot, pos in tracing.align_positions(12, 3, 6):
        got[pos].append(labels[slot])
    assert got == {0: ["-3"], 1: ["-2"], 2: ["-1"], 3: ["first subject"], 4: ["middle subject"],
                   5: ["last subject"], 6: ["+1"], 7: ["+2"], 8: ["+3"], 9: ["+4"], 10: ["+5"], 11: ["+6"]}
    one = tracing.align_positions(15, 0, 1)
    assert (5, 0) in one and (7, 0) in one and (6, 0) not in [(s, p) for s, p in one if s == 6]
    assert [p for s, p in one if s >= 8] == list(range(1, 11)), "only 10 positions after the subject"
    far = tracing.align_positions(10, 8, 10)
    assert [p for s, p in far if s < 5] == [3, 4, 5, 6, 7], "only 5 positions before the subject"
    assert [s for s, p in far if p == 8] == [5] and [s for s, p in far if p == 9] == [7]
    long = tracing.align_positions(8, 1, 6)
    assert [p for s, p in long if s == tracing.MIDDLE_SUBJECT] == [2, 3, 4]
    with pytest.raises(ValueError, match="not inside"):
        tracing.align_positions(5, 3, 7)


def test_best_window_on_constructed_curves():
    ie = [0.1, 0.5, 0.2, 0.9, 0.8, 0.05]
    assert tracing.best_window(ie, 2) == (3, pytest.approx(1.7))
    assert tracing.best_window(ie, 3) == (2, pytest.approx(1.9))
    assert tracing.best_window(ie, 6)[0] == 0
    assert tracing.best_window([1, 0, 0, 1], 1)[0] == 0, "ties go to the earliest window"
    assert tracing.best_window([np.nan, 0.3, 0.3, np.nan], 2)[0] == 1
    with pytest.raises(ValueError, match="does not fit"):
        tracing.best_window(ie, 7)
    with pytest.raises(ValueError, match=">= 1"):
        tracing.best_window(ie, 0)


def test_window_headline_and_top_table(traced):
    curve = traced.layer_curve()
    assert list(curve["layer"]) == list(range(traced.n_layers))
    window = traced.window(2)
    start, _ = tracing.best_window(curve["ie"].to_numpy(), 2)
    assert window == [start, start + 1]
    top = traced.top_layers(3, window)
    assert list(top["rank"]) == [1, 2, 3] and top["ie"].is_monotonic_decreasing
    head = causal_tracing.headline(traced, 2, [0, 1])
    assert head["window"] == window and head["agrees_with_profile"] == (window == [0, 1])
    assert head["peak_ie"] == pytest.approx(curve["ie"].max())
    assert head["n_prompts"] == 4 and head["n_valid"] == traced.n_valid >= 2
    assert head["max_effect_before_subject"] < 1e-6
    table = causal_tracing.paper_comparison(head, "tiny")
    assert len(table) == 4 and table.iloc[-1]["edit_target"] == f"{window[0]}–{window[1]}"
    assert table.iloc[1]["edit_target"] == "3–8" and table.iloc[-1]["valid"] == f"{traced.n_valid}/4"
    text = causal_tracing.findings(head, top)
    assert f"layer {head['peak_layer']} of {traced.n_layers}" in text


# ----------------------------------------------------------------------------- inputs


def test_inputs_are_checked_before_any_forward_pass(llama, tok):
    calls = []
    hook = llama.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"prompt 1: subject 'Paris' does not occur"):
            tracing.trace(llama, tok, [PROMPTS[0], ("Angola is located in", "Paris", "Africa")],
                          progress=False)
        with pytest.raises(ValueError, match="prompt 0: empty answer"):
            tracing.trace(llama, tok, [("the capital of France is", "France", " ")], progress=False)
        with pytest.raises(ValueError, match=r"expected \(prompt, subject, answer\)"):
            tracing.trace(llama, tok, [("the capital of France is", "France")], progress=False)
        with pytest.raises(ValueError, match="n_noise"):
            tracing.trace(llama, tok, PROMPTS, tracing.TraceSettings(n_noise=0), progress=False)
        with pytest.raises(ValueError, match="no prompts"):
            tracing.trace(llama, tok, [], progress=False)
    finally:
        hook.remove()
    assert calls == []


def test_subject_token_range(tok):
    ids, s, e = tracing.subject_token_range(tok, "the old king of the north is", "old king")
    assert [tok.decode([t]) for t in ids[s:e]] == ["old", "king"]
    ids, s, e = tracing.subject_token_range(tok, "Angola is located in", "Angola")
    assert (s, e) == (0, 1)


def test_pocket_and_knowns_prompts(slices):
    micro = tracing.pocket_prompts("pocket-micro", n=5, seed=0)
    assert len(micro) == 5 and all(p.subject in p.prompt for p in micro)
    assert micro == tracing.pocket_prompts("pocket-micro", n=5, seed=0)
    assert micro != tracing.pocket_prompts("pocket-micro", n=5, seed=1)
    assert len(tracing.pocket_prompts("pocket-micro", n=None)) > 5
    with pytest.raises(ValueError, match="not a pocket model"):
        tracing.pocket_prompts("allenai/OLMo-2-1124-7B-Instruct")
    knowns = tracing.knowns_prompts(slices / "knowns" / "known_200.json", n=3)
    assert knowns[0] == ("Vinson Massif is located in the continent of", "Vinson Massif", "Antarctica")
    profile = load_profile("olmo2-7b-instruct")
    assert tracing.prompts_for(profile, slices / "knowns" / "known_200.json", 2) == knowns[:2]


# ----------------------------------------------------------------------------- profile rewrite


def test_rewrite_edit_layers_keeps_every_other_line(tmp_path, root):
    path = tmp_path / "pocket-micro.yaml"
    shutil.copy(root / "data" / "profiles" / "pocket-micro.yaml", path)
    before = path.read_text().splitlines()
    old, new = tracing.rewrite_edit_layers(path, [1])
    after = path.read_text().splitlines()
    assert (old, new) == ([0, 1], [1])
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed == [("edit_layers: [0, 1]            # the micro model has 2 layers",
                        "edit_layers: [1]            # the micro model has 2 layers")]
    assert load_profile(path).edit_layers == (1,)


def test_rewrite_edit_layers_block_style_and_refusals(tmp_path, root):
    text = re.sub(r"(?m)^edit_layers:.*\n", "edit_layers: [1, 2]\n",
                  (root / "data" / "profiles" / "pocket.yaml").read_text(), count=1)
    assert "edit_layers: [1, 2]\n" in text, "the pocket profile names its edit layers on one line"
    block = text.replace("edit_layers: [1, 2]\n", "edit_layers:   # traced\n  - 1\n  - 2\n")
    path = tmp_path / "pocket.yaml"
    path.write_text(block)
    assert tracing.rewrite_edit_layers(path, [2, 3, 4]) == ([1, 2], [2, 3, 4])
    assert path.read_text() == text.replace("edit_layers: [1, 2]\n", "edit_layers:   [2, 3, 4] # traced\n")
    assert load_profile(path).edit_layers == (2, 3, 4)
    saved = path.read_text()
    with pytest.raises(ProfileError, match="strictly increasing"):
        tracing.rewrite_edit_layers(path, [3, 2])
    assert path.read_text() == saved, "a refused rewrite leaves the file as it was"
    assert not list(tmp_path.glob(".*")), "no temporary files remain"


# ----------------------------------------------------------------------------- CLI and chapter


def _tiny_profile(tmp_path: Path, root: Path, model, tok, known) -> tuple[Path, Path]:
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    text = (root / "data" / "profiles" / "pocket-micro.yaml").read_text()
    assert "model: pocket-micro  " in text
    text = text.replace("model: pocket-micro  ", f"model: {folder}  ")
    profile = tmp_path / "tiny.yaml"
    profile.write_text(text.replace("name: pocket-micro", "name: tiny"))
    knowns = tmp_path / "knowns.json"
    knowns.write_text(json.dumps([
        {"known_id": i, "subject": s, "attribute": a, "template": p.replace(s, "{}"), "prediction": None,
         "prompt": p, "relation_id": None} for i, (p, s, a) in enumerate(known)]))
    return profile, knowns


def test_moir_trace_writes_summary_and_profile(tmp_path, root, llama, tok, known, capsys):
    from moir_lib.cli import main

    profile, knowns = _tiny_profile(tmp_path, root, llama, tok, known)
    before = profile.read_text().splitlines()
    out = tmp_path / "run"
    code = main(["trace", "--profile", str(profile), "--knowns", str(knowns), "--n-noise", "3", "-q",
                 "--write-profile", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    head = summary["headline"]
    assert summary["chapter"] == "06_causal_tracing" and head["n_prompts"] == len(PROMPTS)
    assert len(head["window"]) == 2 and head["profile_layers"] == [0, 1]
    assert {p.name for p in out.glob("*.parquet")} == {"trace_prompts.parquet", "trace_scores.parquet",
                                                       "trace_aligned.parquet"}
    after = profile.read_text().splitlines()
    assert load_profile(profile).edit_layers == tuple(head["window"])
    assert [a for a, b in zip(before, after, strict=True) if a != b] == (
        [] if head["window"] == [0, 1] else ["edit_layers: [0, 1]            # the micro model has 2 layers"])
    printed = capsys.readouterr().out
    assert "edit_layers" in printed and str(head["window"]) in printed


def test_moir_trace_keeps_the_profile_without_valid_prompts(tmp_path, root, llama, tok, known, capsys):
    from moir_lib.cli import main

    profile, knowns = _tiny_profile(tmp_path, root, llama, tok, known)
    before = profile.read_text()
    code = main(["trace", "--profile", str(profile), "--knowns", str(knowns), "--n-noise", "2", "-q",
                 "--noise-scale", "0", "--write-profile", "--out", str(tmp_path / "run")])
    assert code == 1 and profile.read_text() == before
    assert "left unchanged" in capsys.readouterr().err
    head = json.loads((tmp_path / "run" / "summary.json").read_text())["headline"]
    assert head["n_valid"] == 0 and head["window"] == [] and head["peak_layer"] is None


def test_moir_trace_refuses_bad_input(tmp_path, capsys):
    from moir_lib.cli import main

    assert main(["trace", "--profile", "no-such-profile", "--out", str(tmp_path)]) == 2
    assert "no profile 'no-such-profile'" in capsys.readouterr().err
    assert main(["trace", "--profile", "pocket", "--n-prompts", "0", "--out", str(tmp_path)]) == 2


def test_chapter_runs_on_the_micro_pocket_model(tmp_path, root, monkeypatch):
    """`moir run` of the chapter on pocket-micro with 8 prompts (builds the micro model once, ≈10 s)."""
    from moir_lib.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel's torch: see one_thread

    out = tmp_path / "06"
    code = main(["run", str(root / "notebooks" / "06_causal_tracing.ipynb"), "-q", "--profile",
                 "pocket-micro", "-p", "n_prompts", "8", "-p", "n_noise", "3", "-p", "organisms", "[0]",
                 "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    head = summary["headline"]
    assert summary["chapter"] == "06_causal_tracing" and summary["parameters"]["profile"] == "pocket-micro"
    assert head["n_prompts"] == 8 and 0 <= head["n_valid"] <= 8
    assert head["profile_layers"] == [0, 1] and len(head["window"]) == (2 if head["n_valid"] else 0)
    assert set(head["window"]) <= {0, 1} and isinstance(head["agrees_with_profile"], bool)
    assert head["max_effect_before_subject"] < 1e-6


def test_plots(traced):
    from moir_lib import plots

    window = traced.window(2)
    aligned = traced.aligned()
    heat = plots.tracing_heatmap(aligned, tracing.SLOT_LABELS)
    assert heat.data[0].type == "heatmap" and tuple(heat.data[0].x) == tracing.SLOT_LABELS
    z = np.asarray(heat.data[0].z, dtype=float)
    assert z.shape == (traced.n_layers, 18) and np.isnan(z[:, 0]).all(), "no prompt reaches 5 tokens before"
    last = aligned[aligned["slot"] == tracing.LAST_SUBJECT].sort_values("layer")["ie"]
    np.testing.assert_allclose(z[:, tracing.LAST_SUBJECT], last)
    present = plots.tracing_heatmap(aligned)
    assert len(present.data[0].x) == aligned["slot"].nunique()
    curve = plots.tracing_layer_curve(traced.layer_curve(), window, [0, 1], traced.last_token_curve())
    assert [t.name for t in curve.data][-2:] == ["IE, last prompt token", "IE, last subject token"]
    shaded = [s for s in curve.layout.shapes if s.type == "rect"]
    assert shaded[0].x0 == window[0] - 0.5 and shaded[0].x1 == window[-1] + 0.5
    assert len(shaded) == (1 if window == [0, 1] else 2)
    empty = pd.DataFrame(columns=["layer", "slot", "label", "ie", "n"])
    assert "no valid prompt" in plots.tracing_heatmap(empty).layout.annotations[0].text
    with pytest.raises(ValueError, match="lacks columns"):
        plots.tracing_layer_curve(pd.DataFrame({"layer": [0]}), [0])
