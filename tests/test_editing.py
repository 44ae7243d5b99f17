"""Editing on real (tiny) transformers models: keys, targets, tokenisation, batch efficacy, restore.

The efficacy tests need a model that *knows* facts and stores them where MEMIT writes: at the
subject's last token: the facts model of ``tiny.py`` (:func:`tiny.facts_model`).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny import (
    FIXED_TEMPLATES,
    SPECIALS,
    argmax_hits,
    fact_requests,
    facts_covariance,
    facts_model,
    facts_tokenizer,
)
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from moir_lib.editing import (
    AlphaEditEditor,
    EditSetup,
    MemitEditor,
    ValueConfig,
    WeightSnapshot,
    batch,
    compute_keys,
    compute_targets,
    context_templates,
    group_requests,
    locate_subject,
    normalise_requests,
    target_token_ids,
)
from moir_lib.models import LoadedModel, ModelAdapter


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two cores, shared with a training job: more threads only contend
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def facts() -> LoadedModel:
    return facts_model()


# ----------------------------------------------------------------------------- tokenisation


def sentencepiece_like_tokenizer() -> PreTrainedTokenizerFast:
    """Llama-2 style: Metaspace ("▁" word starts, prepended), BOS added by default."""
    words = ["▁Paris", "▁is", "▁the", "▁capital", "▁of", "▁France", "▁Angola", "▁located", "▁in", "▁Africa"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>",
                                   unk_token="<unk>")


def byte_level_tokenizer(add_bos: bool = True) -> PreTrainedTokenizerFast:
    """GPT-2/Llama-3/pocket style byte-level BPE trained on a few sentences."""
    text = ["Angola is located in Africa. The capital of Angola is Luanda.",
            "Paris is the capital of France.",
            "Danielle Darrieux's mother tongue is French.", "The Eiffel Tower is in Paris."] * 20
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(text, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    if add_bos:
        bpe.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>",
                                                                            bpe.token_to_id("<bos>"))])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>",
                                   unk_token="<unk>")


def test_targets_tokenise_the_same_with_and_without_a_leading_space_llama_style() -> None:
    tok = sentencepiece_like_tokenizer()
    assert tok("Paris")["input_ids"][0] == 1  # the tokenizer adds BOS, the target must not have it
    expected = [tok.convert_tokens_to_ids("▁Paris")]
    for target in ("Paris", " Paris", "Paris "):
        assert target_token_ids(tok, target) == expected
        assert target_token_ids(tok, target, "The capital of France is") == expected
    assert tok.unk_token_id not in target_token_ids(tok, " Paris")
    try:  # the evaluation scores the same ids
        from moir_lib.evaluation.counterfact import encode_prompt_target
    except ImportError:  # pragma: no cover
        return
    assert list(encode_prompt_target(tok, "The capital of France is", " Paris").target) == expected


def test_targets_tokenise_the_same_with_and_without_a_leading_space_byte_level() -> None:
    tok = byte_level_tokenizer()
    expected = tok(" Luanda", add_special_tokens=False)["input_ids"]
    for target in ("Luanda", " Luanda"):
        assert target_token_ids(tok, target) == expected
        assert target_token_ids(tok, target, "The capital of Angola is") == expected
    try:
        from moir_lib.evaluation.counterfact import encode_prompt_target
    except ImportError:  # pragma: no cover
        return
    assert list(encode_prompt_target(tok, "The capital of Angola is", "Luanda").target) == expected


def test_target_that_tokenises_to_nothing_is_refused(facts: LoadedModel) -> None:
    for target in ("", "   "):
        with pytest.raises(ValueError, match="zero tokens"):
            target_token_ids(byte_level_tokenizer(), target)
    stripping = facts_tokenizer()
    stripping.backend_tokenizer.normalizer = normalizers.Replace("§", "")  # drops the character
    with pytest.raises(ValueError, match=r"target '§' tokenises to zero tokens"):
        target_token_ids(stripping, "§")
    adapter = ModelAdapter(facts.model, stripping, name="stripping")
    bad_target = {"case_id": 5, "prompt": "home of {}", "subject": "alba", "target_new": "§"}
    with pytest.raises(ValueError,
                       match=r"request 5 \('home of alba' -> '§'\): target_new '§' tokenises to zero"):
        group_requests(adapter, [bad_target], [["{}"]])
    bad = [{"case_id": 7, "prompt": "home of {}", "subject": "alba", "target_new": {"str": " "}}]
    with pytest.raises(ValueError, match="request 7: missing or empty field 'target_new'"):
        normalise_requests(bad)


# ----------------------------------------------------------------------------- subjects and keys


def tiny_llama(tokenizer: PreTrainedTokenizerFast, n_layers: int = 3, seed: int = 0) -> ModelAdapter:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=n_layers, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=128, bos_token_id=tokenizer.bos_token_id,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return ModelAdapter(model, tokenizer, name="tiny-bpe")


@pytest.mark.parametrize("add_bos", [True, False])
def test_last_subject_token_is_found_in_every_template(add_bos: bool) -> None:
    tok = byte_level_tokenizer(add_bos=add_bos)
    adapter = tiny_llama(tok)
    req = normalise_requests([{"case_id": 3, "prompt": "The capital of {} is", "subject": "Angola",
                               "target_new": "Paris"}])[0]
    for template in ("{}", "Paris is the capital of France. {}"):
        site = locate_subject(adapter, req, template)
        ids = list(site.ids)
        bos = tok.bos_token_id
        assert (ids[0] == bos) is add_bos and ids.count(bos) == (1 if add_bos else 0)
        body = ids[1:] if add_bos else ids
        text = template.replace("{}", "The capital of Angola is")
        assert body == tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids[: site.index + 1], skip_special_tokens=True).endswith("Angola")
        assert tok.decode(ids[site.index + 1:]) == " is"


def test_subject_merged_into_a_longer_token_maps_to_that_token() -> None:
    tok = byte_level_tokenizer()
    adapter = tiny_llama(tok)
    # "Pari" is a prefix of the single token " Paris": its last token is that token
    req = normalise_requests([{"prompt": "{}s is the capital of France", "subject": "Pari",
                               "target_new": "x"}])[0]
    site = locate_subject(adapter, req)
    assert tok.convert_ids_to_tokens(site.ids[site.index]) in ("Paris", "Pari")


def test_subject_not_in_prompt_is_refused_naming_the_request() -> None:
    with pytest.raises(ValueError, match=r"request 'cf-12': subject 'Angola' does not occur in prompt"):
        normalise_requests([{"case_id": "cf-12", "prompt": "The capital of France is", "subject": "Angola",
                             "target_new": {"str": "Paris"}}])
    # the EasyEdit form (subject filled in) is accepted
    req = normalise_requests([{"prompt": "The capital of Angola is", "subject": "Angola",
                               "target_new": "X"}])[0]
    assert req.prompt == "The capital of {} is"
    with pytest.raises(ValueError, match="exactly once"):
        normalise_requests([{"prompt": "{} and {}", "subject": "a", "target_new": "b"}])


def test_requests_sharing_a_subject_key_are_grouped(facts: LoadedModel) -> None:
    tok = byte_level_tokenizer()
    adapter = tiny_llama(tok)
    reqs = [{"case_id": 0, "prompt": "{} is located in", "subject": "Angola", "target_new": "Paris"},
            {"case_id": 1, "prompt": "{} has its capital in", "subject": "Angola", "target_new": "Paris"},
            {"case_id": 2, "prompt": "The capital of {} is", "subject": "Angola", "target_new": "Paris"},
            {"case_id": 3, "prompt": "{} is in", "subject": "France", "target_new": "Africa"}]
    groups = group_requests(adapter, reqs, [["{}"], ["Paris. {}"]])
    assert [[r.case_id for r in g.requests] for g in groups] == [[0, 1], [2], [3]]
    assert [g.positions for g in groups] == [[0, 1], [2], [3]]
    # relation-first prompts put different tokens before the subject: no grouping
    mixed = fact_requests("home of")[:2] + fact_requests("office of")[:2]
    grouped = group_requests(facts.adapter, mixed, [["{}"]])
    assert len(grouped) == 4


def test_keys_are_the_down_proj_inputs_at_the_last_subject_token_averaged(facts: LoadedModel) -> None:
    adapter = facts.adapter
    groups = group_requests(adapter, fact_requests()[:3], FIXED_TEMPLATES)
    K, cur = compute_keys(adapter, groups, 1, out_layer=2)
    assert K.shape == (adapter.key_dim, 3) and K.dtype == torch.float64
    assert cur.shape == (adapter.hidden_size, 3)
    for g, group in enumerate(groups):
        manual = []
        for t, site in enumerate(group.key_sites):
            seen = {}
            h1 = adapter.key_module(1).register_forward_pre_hook(
                lambda m, a, seen=seen: seen.__setitem__("k", a[0]))
            h2 = adapter.layers[2].register_forward_hook(lambda m, a, o, seen=seen: seen.__setitem__("o", o))
            with torch.no_grad():
                adapter.model(input_ids=torch.tensor([site.ids]))
            h1.remove()
            h2.remove()
            manual.append(seen["k"][0, site.index].double())
            if t == 0:
                out = seen["o"][0] if isinstance(seen["o"], tuple) else seen["o"]
                torch.testing.assert_close(cur[:, g], out[0, site.index].double(), rtol=1e-5, atol=1e-5)
        # the reference's grouped mean: ½·k("{}") + ½·mean(k of the prefixed templates)
        grouped = 0.5 * manual[0] + 0.5 * torch.stack(manual[1:]).mean(0)
        torch.testing.assert_close(K[:, g], grouped, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(K[:, g], torch.stack(manual).mean(0), rtol=1e-3)  # not the flat mean
    # templates matter: the plain-prompt key alone differs from the average
    K_plain, _ = compute_keys(adapter, group_requests(adapter, fact_requests()[:3], [["{}"]]), 1)
    assert not torch.allclose(K_plain, K, rtol=1e-3)


def test_template_groups_are_checked(facts: LoadedModel) -> None:
    for bad, match in ((["{}", "x. {}"], "grouped"), ([["x. {}"]], "plain prompt"), ([["{}"], []], "empty"),
                       ([["{}"], ["no placeholder"]], "exactly once")):
        with pytest.raises(ValueError, match=match):
            group_requests(facts.adapter, fact_requests()[:1], bad)


def test_context_templates_are_sampled_once_and_cached(facts: LoadedModel) -> None:
    a = context_templates(facts.adapter, seed=3)
    b = context_templates(facts.adapter, seed=3)
    c = context_templates(facts.adapter, seed=4, use_cache=False)
    assert a == b and a[0] == ["{}"] and len(a) == 2 and len(a[1]) == 5
    assert all(t.endswith(". {}") for t in a[1])
    assert a != c
    assert context_templates(facts.adapter, seed=3, use_cache=False) == a  # sampling is deterministic


# ----------------------------------------------------------------------------- targets


def test_target_optimisation_reaches_the_target_and_respects_its_bounds(facts: LoadedModel) -> None:
    adapter = facts.adapter
    groups = group_requests(adapter, fact_requests()[:4], [["{}"], ["the a . {}"]])
    zero = compute_targets(adapter, groups, 1, ValueConfig(num_steps=0))
    torch.testing.assert_close(zero.z, zero.h)
    assert zero.steps == [0, 0, 0, 0] and min(zero.nll) > 2.0  # the new objects are unlikely before
    fitted = compute_targets(adapter, groups, 1, ValueConfig(num_steps=25, chunk_size=1))
    assert max(fitted.nll) < 0.5 and all(s >= 1 for s in fitted.steps)
    assert all(f < z for f, z in zip(fitted.nll, zero.nll, strict=True))
    assert len(fitted.request_nll) == 4 and all(len(r) == 1 for r in fitted.request_nll)
    rows = fitted.per_request(groups)
    assert [r["case_id"] for r in rows] == [0, 1, 2, 3] and all("final_loss" in r for r in rows)
    # chunking groups together changes nothing but rounding (rows never interact)
    together = compute_targets(adapter, groups, 1, ValueConfig(num_steps=25, chunk_size=16))
    torch.testing.assert_close(fitted.z, together.z, rtol=1e-3, atol=1e-3)
    clamped = compute_targets(adapter, groups[:2], 1, ValueConfig(num_steps=5, clamp_norm_factor=0.05))
    assert max(clamped.delta_ratio) <= 0.05 + 1e-5 and min(clamped.delta_ratio) > 0.04
    stopped = compute_targets(adapter, groups[:2], 1, ValueConfig(num_steps=5, early_stop_loss=1e3))
    assert stopped.steps == [0, 0]
    # the reference stops before stepping at iteration num_steps - 1: 25 iterations, 24 updates
    for n, updates in ((5, 4), (1, 0)):
        run = compute_targets(adapter, groups[:2], 1, ValueConfig(num_steps=n, early_stop_loss=0.0))
        assert run.steps == [updates, updates]


# ----------------------------------------------------------------------------- batch editing


@pytest.mark.parametrize("editor", ["memit", "alphaedit"])
def test_batch_edits_change_the_argmax_and_restore_bit_exactly(facts: LoadedModel, editor: str) -> None:
    model, _, adapter = facts
    layers = [0, 1]
    reqs = fact_requests()[:6]
    others = fact_requests()[6:]
    assert argmax_hits(adapter, reqs, "target_true") == 1.0 and argmax_hits(adapter, reqs) == 0.0
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cov = facts_covariance(facts, layers)
    if editor == "memit":
        ed = MemitEditor(cov, layers, lambda_=1.0, lambda_mode="relative")
    else:
        ed = AlphaEditEditor(cov, layers, tau=1e-3, tau_mode="relative")
    result = batch(facts, ed, reqs, EditSetup(templates=FIXED_TEMPLATES), keep_deltas=True)
    assert argmax_hits(adapter, reqs) >= 5 / 6, result.outcome.summary()
    if editor == "memit":
        assert argmax_hits(adapter, others, "target_true") >= 0.5
    summary = result.summary()
    assert summary["edit"]["n_requests"] == 6 and summary["edit"]["z_final_loss_mean"] < 0.5
    for layer in layers:  # the float64 deltas were applied (to float32 rounding)
        torch.testing.assert_close(result.snapshot.delta(layer), result.outcome.deltas[layer], rtol=1e-4,
                                   atol=1e-4)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed == [f"model.layers.{layer}.mlp.down_proj.weight" for layer in layers]
    result.snapshot.restore()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert argmax_hits(adapter, reqs, "target_true") == 1.0


def test_gpt2_conv1d_weights_are_edited_through_the_transposed_view() -> None:
    from tiny import tiny_loaded

    loaded = tiny_loaded("gpt2", n_layers=3)
    adapter = loaded.adapter
    original = adapter.key_module(1).weight.detach().clone()  # stored (d_in, d_out)
    cov = {layer: torch.eye(adapter.key_dim, dtype=torch.float64) for layer in (0, 1)}
    reqs = [{"case_id": 0, "prompt": "{} is in the", "subject": "the king", "target_new": "city"}]
    ed = MemitEditor(cov, [0, 1], lambda_=1.0, values=ValueConfig(num_steps=3))
    result = batch(loaded, ed, reqs, EditSetup(templates=[["{}"]]), keep_deltas=True)
    torch.testing.assert_close(adapter.key_module(1).weight.detach() - original,
                               result.outcome.deltas[1].T.float(),
                               rtol=1e-4, atol=1e-6)
    result.snapshot.restore()
    assert torch.equal(adapter.key_module(1).weight, original)


def test_layer_and_width_mismatches_are_refused_before_editing(facts: LoadedModel) -> None:
    adapter = facts.adapter
    good = torch.eye(adapter.key_dim, dtype=torch.float64)
    with pytest.raises(ValueError, match="layer 7 out of range"):
        batch(facts, MemitEditor({7: good}, [7]), fact_requests()[:1], EditSetup(templates=[["{}"]]))
    narrow = torch.eye(adapter.key_dim - 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"C of layer 1 has shape \(127, 127\) but the model's key width"):
        batch(facts, MemitEditor({1: narrow}, [1]), fact_requests()[:1], EditSetup(templates=[["{}"]]))
    with pytest.raises(ValueError, match="n_edits = 20 but only 12 requests"):
        batch(facts, MemitEditor({1: good}, [1]), fact_requests(), n_edits=20)
    snapshot = WeightSnapshot(facts, [1])
    assert snapshot.is_original()


# ----------------------------------------------------------------------------- the micro pocket model


def test_micro_pocket_edit_writes_its_targets() -> None:
    """End to end on the micro pocket model: pocket tokenizer (byte-level BPE, BOS), pocket
    CounterFact, a covariance from the pocket wiki domain.

    The micro model has 2 layers, so z sits at layer 0 with a single layer downstream: the z
    optimisation cannot move the prediction there (its loss stays near the initial NLL), so
    no efficacy can be asked of it (see the closing note). What must hold: the update writes
    the targets at the z layer (the post-edit hidden state is close to z), and restoring
    gives back the model exactly.
    """
    from moir_lib import models
    from moir_lib.covariance import EstimationSettings, estimate
    from moir_lib.data import load_counterfact
    from moir_lib.pocket import build, iter_documents

    loaded = models.load("pocket-micro")
    records = load_counterfact(build("micro") / "counterfact.json")[:8]
    docs = list(iter_documents("wiki", "train", 60, seed=1))
    stats = estimate(loaded, docs, [0], EstimationSettings(tokens_per_batch=2048), cache=False,
                     progress=False)
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    result = batch(loaded, MemitEditor(stats, [0], lambda_=1e-2, lambda_mode="relative",
                                       values=ValueConfig(num_steps=10)), records,
                   EditSetup(templates=[["{}"]]))
    assert result.outcome.n_groups <= 8 and len(result.outcome.per_request()) == 8
    assert max(result.outcome.z_gap) < 0.25, result.outcome.z_gap
    result.snapshot.restore()
    assert all(torch.equal(v, before[k]) for k, v in loaded.model.state_dict().items())
