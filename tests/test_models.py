"""models.load / ModelAdapter on tiny random-weight models of every supported family.

Each model is built from its transformers config (hidden 32, intermediate 48, vocab 64),
saved with ``save_pretrained`` beside a tiny word-level tokenizer, and read back through
``load(folder)``, exactly as a hub snapshot would be.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from moir_lib import models as M
from moir_lib.profiles import load_profile

HIDDEN, INTER, VOCAB = 32, 48, 64
WORDS = "the cat sat on mat Angola is located in Africa what two plus three five answer".split()
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(add_bos: bool = True, chat: bool = True) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 1)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        chat_template=CHAT_TEMPLATE if chat else None,
    )


def tiny_config(family: str, n_layers: int = 2) -> transformers.PretrainedConfig:
    common = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    llama_like = {"hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": n_layers,
                  "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}
    gpt_like = {"n_embd": HIDDEN, "n_inner": INTER, "n_layer": n_layers, "n_head": 2, "n_positions": 64}
    if family == "llama":
        return transformers.LlamaConfig(**llama_like, **common)
    if family == "olmo2":
        return transformers.Olmo2Config(**{**llama_like, "num_key_value_heads": 2}, **common)
    if family == "qwen3":
        return transformers.Qwen3Config(**llama_like, head_dim=16, **common)
    if family == "qwen2":
        return transformers.Qwen2Config(**llama_like, **common)
    if family == "mistral":
        return transformers.MistralConfig(**llama_like, **common)
    if family == "gpt2":
        return transformers.GPT2Config(**gpt_like, **common)
    if family == "gptj":
        return transformers.GPTJConfig(**gpt_like, rotary_dim=8, **common)
    if family == "gpt_neox":
        return transformers.GPTNeoXConfig(hidden_size=HIDDEN, intermediate_size=INTER,
                                          num_hidden_layers=n_layers, num_attention_heads=2,
                                          max_position_embeddings=64, **common)
    if family == "opt":  # an architecture we do not support
        return transformers.OPTConfig(hidden_size=HIDDEN, ffn_dim=INTER, num_hidden_layers=n_layers,
                                      num_attention_heads=2, word_embed_proj_dim=HIDDEN, **common)
    raise KeyError(family)


def save_tiny(folder: Path, family: str, n_layers: int = 2, add_bos: bool = True, chat: bool = True,
              seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, n_layers))
    model.save_pretrained(folder)
    make_tokenizer(add_bos, chat).save_pretrained(folder)
    return folder


def capture_keys(loaded: M.LoadedModel, layers: list[int]) -> dict[int, tuple[torch.Size, torch.Size]]:
    """Run one forward pass; return each layer's key-module (input, output) shapes."""
    seen: dict[int, tuple[torch.Size, torch.Size]] = {}
    handles = [
        loaded.adapter.key_module(layer).register_forward_hook(
            lambda mod, args, out, layer=layer: seen.__setitem__(layer, (args[0].shape, out.shape))
        )
        for layer in layers
    ]
    try:
        ids = torch.tensor([loaded.adapter.encode("the cat sat on the mat")])
        with torch.no_grad():
            logits = loaded.model(input_ids=ids).logits
    finally:
        for h in handles:
            h.remove()
    assert logits.shape == (1, ids.shape[1], VOCAB)
    return seen


# --------------------------------------------------------------------------- families


@pytest.mark.parametrize("family", sorted(M.FAMILIES))
def test_every_family_loads_from_a_folder(tmp_path: Path, family: str) -> None:
    folder = save_tiny(tmp_path / family, family, n_layers=3)
    loaded = M.load(folder)
    model, tok, ad = loaded  # unpacks
    assert ad.family.name == family
    assert ad.n_layers == 3 and len(ad.layers) == 3
    assert (ad.hidden_size, ad.key_dim, ad.out_dim) == (HIDDEN, INTER, HIDDEN)
    assert ad.vocab_size == VOCAB
    assert ad.key_module_name(2) == ad.key_module_template.format(2)
    assert ad.key_module(2) is model.get_submodule(ad.key_module_name(2))
    assert ad.lm_head is model.get_output_embeddings()
    assert ad.embed_tokens is model.get_input_embeddings()
    assert ad.final_norm.weight.shape == (HIDDEN,)
    assert not model.training

    seen = capture_keys(loaded, [0, 1, 2])
    for layer in range(3):
        k_shape, out_shape = seen[layer]
        assert k_shape[-1] == ad.key_dim and out_shape[-1] == ad.out_dim

    # weight_of is (d_out, d_in) for every family: out = k @ W.T + b
    k = torch.randn(5, ad.key_dim)
    module = ad.key_module(1)
    w = ad.weight_of(1)
    assert w.shape == (ad.out_dim, ad.key_dim)
    bias = module.bias if getattr(module, "bias", None) is not None else 0.0
    with torch.no_grad():
        torch.testing.assert_close(module(k), k @ w.T + bias)
    described = ad.describe()
    assert described["family"] == family and described["key_dim"] == INTER and described["n_layers"] == 3


def test_gpt2_conv1d_is_transposed_and_apply_delta_edits_the_model(tmp_path: Path) -> None:
    ad = M.load(save_tiny(tmp_path / "g", "gpt2")).adapter
    module = ad.key_module(0)
    assert type(module).__name__ == "Conv1D" and ad.weight_transposed
    assert module.weight.shape == (INTER, HIDDEN)  # stored (d_in, d_out)
    before = module.weight.detach().clone()
    delta = torch.randn(HIDDEN, INTER, dtype=torch.float64)
    ad.apply_delta(0, delta)
    torch.testing.assert_close(module.weight.detach(), before + delta.T.float())
    with pytest.raises(ValueError, match=r"does not match W_out of layer 0: \(d_out, d_in\) = \(32, 48\)"):
        ad.apply_delta(0, delta.T)


def test_linear_apply_delta_and_view_semantics(tmp_path: Path) -> None:
    ad = M.load(save_tiny(tmp_path / "l", "llama")).adapter
    assert not ad.weight_transposed
    assert ad.weight_of(1) is ad.key_module(1).weight
    before = ad.weight_of(1).detach().clone()
    ad.apply_delta(1, torch.ones(HIDDEN, INTER, dtype=torch.float64))
    torch.testing.assert_close(ad.weight_of(1).detach(), before + 1)


# --------------------------------------------------------------------------- paper profiles

PAPER = {"olmo2-7b-instruct": "olmo2", "llama3.1-8b-instruct": "llama", "qwen3-8b": "qwen3"}


@pytest.mark.parametrize("profile_name", sorted(PAPER))
def test_paper_profiles_against_tiny_models_of_their_architecture(tmp_path: Path, profile_name: str) -> None:
    profile = load_profile(profile_name)
    n_layers = max(profile.edit_layers) + 2
    folder = save_tiny(tmp_path / profile_name, PAPER[profile_name], n_layers=n_layers)
    loaded = M.load(profile.with_overrides({"model": str(folder)}))
    ad = loaded.adapter
    assert ad.family.name == PAPER[profile_name]
    assert next(loaded.model.parameters()).dtype == torch.float16  # the profile's dtype
    assert ad.check_layers(profile.edit_layers) == list(profile.edit_layers)
    for layer in profile.edit_layers:
        assert ad.key_module_name(layer) == f"model.layers.{layer}.mlp.down_proj"
        assert isinstance(ad.key_module(layer), torch.nn.Linear)
    seen = capture_keys(loaded, list(profile.edit_layers))
    assert sorted(seen) == list(profile.edit_layers)
    assert all(k[-1] == ad.key_dim == INTER for k, _ in seen.values())


def test_profile_layers_out_of_range_fail_before_weights_are_read(tmp_path: Path, monkeypatch) -> None:
    profile = load_profile("olmo2-7b-instruct")
    folder = save_tiny(tmp_path / "short", "olmo2", n_layers=4)

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read before the layer check")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(ValueError, match=r"^layer 9 out of range: .*short has 4 layers \(0-3\)$"):
        M.load(profile.with_overrides({"model": str(folder)}))


# --------------------------------------------------------------------------- bad inputs


def test_check_layers_messages(tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / "tiny-llama", "llama", n_layers=2)
    ad = M.load(folder).adapter
    with pytest.raises(ValueError, match=r"^layer 40 out of range: .*tiny-llama has 2 layers \(0-1\)$"):
        ad.check_layers([0, 40])
    with pytest.raises(ValueError, match="layer -1 out of range"):
        ad.check_layers([-1])
    with pytest.raises(ValueError, match="not an integer"):
        ad.check_layers(["1"])
    with pytest.raises(ValueError, match="repeated layer"):
        ad.check_layers([1, 1])
    with pytest.raises(ValueError, match="layer 2 out of range"):
        ad.key_module(2)


def test_unsupported_architecture_is_refused_before_loading(tmp_path: Path, monkeypatch) -> None:
    folder = save_tiny(tmp_path / "opt", "opt")
    opt_model = transformers.AutoModelForCausalLM.from_config(tiny_config("opt"))
    supported = r"unsupported architecture OPTForCausalLM .*llama \(LlamaForCausalLM\)"
    with pytest.raises(ValueError, match=supported):
        M.ModelAdapter.for_model(opt_model)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("weights read for an unsupported architecture"))
    listing = r".*olmo2 \(Olmo2ForCausalLM\).*gpt2 \(GPT2LMHeadModel\)"
    with pytest.raises(ValueError, match=supported + listing):
        M.load(folder)


def test_unknown_hub_id_offline_fails_fast_and_clearly(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="not found locally and HF_HUB_OFFLINE=1"):
        M.load("moir-lab-tests/no-such-model-3f9c")
    assert time.perf_counter() - start < 10


def test_missing_or_incomplete_local_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        M.load(str(tmp_path / "nowhere" / "model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        M.load(tmp_path / "empty")


def test_bad_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        M.load(tmp_path, dtype="float8")


# --------------------------------------------------------------------------- tokens and chat


def test_bos_handling_with_and_without_a_bos_adding_tokenizer(tmp_path: Path) -> None:
    adds = M.load(save_tiny(tmp_path / "a", "llama", add_bos=True)).adapter
    plain = M.load(save_tiny(tmp_path / "b", "gpt2", add_bos=False, chat=False)).adapter
    assert adds.tokenizer_adds_bos and not plain.tokenizer_adds_bos
    for ad in (adds, plain):
        assert ad.bos_token_id == 1 and ad.eos_token_id == 2 and ad.pad_token_id == 0
        ids = ad.encode("the cat sat")
        assert ids[0] == 1 and ids.count(1) == 1 and len(ids) == 4
        assert ad.encode("the cat sat", add_bos=False) == ids[1:]


def test_chat_template_passthrough(tmp_path: Path) -> None:
    ad = M.load(save_tiny(tmp_path / "c", "qwen3")).adapter
    assert ad.has_chat_template
    text = ad.apply_chat_template([{"role": "user", "content": "what is two plus three"}],
                                  add_generation_prompt=True)
    assert text == "<|user|> what is two plus three <|assistant|>"
    plain = M.load(save_tiny(tmp_path / "d", "gpt_neox", chat=False)).adapter
    assert not plain.has_chat_template
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "hi"}])


# --------------------------------------------------------------------------- fingerprint and dtype


def test_model_fingerprint_tracks_weights_not_location(tmp_path: Path) -> None:
    a = save_tiny(tmp_path / "a", "llama", seed=1)
    b = tmp_path / "elsewhere"
    shutil.copytree(a, b)
    other = save_tiny(tmp_path / "c", "llama", seed=2)
    la, lb, lc = M.load(a), M.load(b), M.load(other)
    fp = M.model_fingerprint(la.model)
    assert len(fp) == 16
    assert fp == M.model_fingerprint(lb.model)
    assert fp != M.model_fingerprint(lc.model)
    sampled = M.model_fingerprint(la.model, revision="main", full_hash_max_bytes=0)
    assert sampled != M.model_fingerprint(la.model, revision="v2", full_hash_max_bytes=0)
    la.adapter.apply_delta(1, 1e-3 * torch.ones(HIDDEN, INTER, dtype=torch.float64))
    assert M.model_fingerprint(la.model) != fp
    assert M.model_fingerprint(la.model, revision="main", full_hash_max_bytes=0) != sampled


def test_dtype_by_name(tmp_path: Path) -> None:
    loaded = M.load(save_tiny(tmp_path / "m", "mistral"), dtype="bfloat16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.adapter.describe()["dtype"] == "bfloat16"


def test_pocket_specs_dispatch_lazily_to_moir_lib_pocket(tmp_path: Path, monkeypatch) -> None:
    """Our side of the contract only: ``load("pocket-micro")`` asks ``moir_lib.pocket.load("micro")``."""
    import sys
    import types

    folder = save_tiny(tmp_path / "p", "llama", n_layers=2)
    calls: list[str] = []

    def fake_load(variant: str, organism: int = 0):
        calls.append(variant)
        return (transformers.AutoModelForCausalLM.from_pretrained(folder),
                transformers.AutoTokenizer.from_pretrained(folder))

    monkeypatch.setitem(sys.modules, "moir_lib.pocket", types.SimpleNamespace(load=fake_load))
    loaded = M.load("pocket-micro", dtype="float64")
    assert calls == ["micro"] and loaded.adapter.name == "pocket-micro"
    assert next(loaded.model.parameters()).dtype == torch.float64 and not loaded.model.training
    micro = load_profile("pocket-micro")
    assert M.load(micro).adapter.check_layers(micro.edit_layers) == [0, 1]
    with pytest.raises(ValueError, match=r"^layer 2 out of range: pocket-micro has 2 layers \(0-1\)$"):
        M.load(micro.with_overrides({"edit_layers": [1, 2]}))
    assert calls == ["micro"] * 3


def test_organism_reaches_the_pocket_builder_and_is_refused_elsewhere(tmp_path: Path, monkeypatch) -> None:
    """A profile's organism (or ``organism=``) goes to ``moir_lib.pocket.load``; a model with one set of
    weights refuses any organism but 0 before anything is read."""
    import sys
    import types

    folder = save_tiny(tmp_path / "p", "llama", n_layers=2)
    calls: list[tuple[str, int]] = []

    def fake_load(variant: str, organism: int = 0):
        calls.append((variant, organism))
        return (transformers.AutoModelForCausalLM.from_pretrained(folder),
                transformers.AutoTokenizer.from_pretrained(folder))

    monkeypatch.setitem(sys.modules, "moir_lib.pocket", types.SimpleNamespace(load=fake_load))
    micro = load_profile("pocket-micro")
    M.load(micro)
    M.load(micro.with_overrides({"organism": 3}))
    M.load(micro.with_overrides({"organism": 3}), organism=1)  # the argument wins over the profile
    M.load("pocket", organism=2)
    assert calls == [("micro", 0), ("micro", 3), ("micro", 1), ("pocket", 2)]
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="give an integer >= 0"):
            M.load("pocket", organism=bad)
    with pytest.raises(ValueError, match=r"organism 1 needs a pocket model .* set organism to 0"):
        M.load(load_profile("qwen3-8b").with_overrides({"organism": 1}))  # not looked up: offline or not
    with pytest.raises(ValueError, match="organism 2 needs a pocket model"):
        M.load(folder, organism=2)
    # a chapter's organisms: checked at once, with what to pass instead (nothing loaded)
    assert M.check_organisms((0, 2), "pocket") == [0, 2] and M.check_organisms([0], str(folder)) == [0]
    with pytest.raises(ValueError, match=r"'Qwen/Qwen3-8B' is one model; pass organisms=\[0\]"):
        M.check_organisms([0, 1, 2], "Qwen/Qwen3-8B")
    from moir_lib.experiments import open_labs

    with pytest.raises(ValueError, match="is one model; pass organisms"):
        open_labs("qwen3-8b", tmp_path / "labs", [0, 1, 2])
    assert len(calls) == 4
    assert M.load(folder, organism=0).adapter.n_layers == 2
