"""CounterFact metrics (appendix C.3) against hand computations, tokenisation and BOS handling, real files.

The hand-computed tests use a tiny Llama whose logits we set: a *bigram* model,
``logits[t] = table[token_t]``, so every probability the metrics read is one we wrote down,
and generation works through the real ``model.generate`` path. Padding/batching is checked
on an ordinary random Llama, tokenisation on three tokenizer styles built here (GPT-2
byte-level BPE, Llama-3 byte-level BPE with BOS, Llama-2 SentencePiece-style BPE with BOS).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from moir_lib.data import CounterFactRecord, load_counterfact
from moir_lib.evaluation import counterfact as CF
from moir_lib.evaluation.counterfact import (
    CounterFactResult,
    CounterFactSettings,
    encode_prompt_target,
    evaluate_counterfact,
    load_portability,
    standalone_target_ids,
    teacher_forced_scores,
    tokenizer_adds_bos,
)

torch.set_num_threads(1)  # two cores, someone else trains

# ----------------------------------------------------------------------------- a bigram Llama

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
WORDS = ("Angola is located in Africa Antarctica pole Europe belongs to the continent of a part Ghana people "
         "speak French English Paris Luanda citizen country whose capital city").split()
VOCAB = SPECIALS + WORDS
ID = {w: i for i, w in enumerate(VOCAB)}

# next-token probabilities after a token; unlisted tokens share the rest uniformly
BIGRAM = {
    "in": {"Africa": 0.5, "Antarctica": 0.3, "Europe": 0.1},
    "Antarctica": {"pole": 0.9},
    "to": {"Antarctica": 0.7, "Africa": 0.2},
    "of": {"Africa": 0.4, "Antarctica": 0.35},
    "speak": {"French": 0.5, "English": 0.35},
    "French": {"Paris": 0.5, "English": 0.3},
    "Africa": {"<eos>": 0.6},
    "Paris": {"<eos>": 0.9},
    "is": {"Paris": 0.6},
    "city": {"Luanda": 0.6, "Paris": 0.3},
    "Luanda": {"Europe": 0.7},
}


def p(prev: str, nxt: str) -> float:
    row = BIGRAM.get(prev, {})
    if nxt in row:
        return row[nxt]
    return (1 - sum(row.values())) / (len(VOCAB) - len(row))


def word_tokenizer(add_bos: bool = True) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


class BigramLlama(transformers.LlamaForCausalLM):
    """A tiny Llama whose logits at position t are ``table[token_t]`` (real forward, then overridden)."""

    def forward(self, input_ids=None, attention_mask=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        n = out.logits.shape[1]
        out.logits = self.table[input_ids[:, -n:]].to(out.logits.dtype)
        return out


def tiny_config(vocab: int, hidden: int = 16, layers: int = 1) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                    num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                                    max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                                    pad_token_id=0)


@pytest.fixture(scope="module")
def bigram() -> BigramLlama:
    torch.manual_seed(0)
    model = BigramLlama(tiny_config(len(VOCAB))).eval()
    table = torch.tensor([[math.log(p(prev, nxt)) for nxt in VOCAB] for prev in VOCAB])
    model.register_buffer("table", table)
    return model


@pytest.fixture(scope="module")
def wtok() -> PreTrainedTokenizerFast:
    return word_tokenizer()


def rec(case_id: int, subject: str, prompt: str, new: str, true: str, paraphrases=(), neighbours=(),
        neighbour_targets=None, generation=(), portability=None) -> CounterFactRecord:
    return CounterFactRecord(
        case_id=case_id, subject=subject, prompt=prompt, relation_id="P0", target_new=new, target_true=true,
        paraphrase_prompts=tuple(paraphrases), neighborhood_prompts=tuple(neighbours),
        neighborhood_targets=tuple(neighbour_targets or (true,) * len(neighbours)),
        generation_prompts=tuple(generation), portability=portability)


R1 = rec(1, "Angola", "{} is located in", "Antarctica pole", "Africa",
         paraphrases=["Angola belongs to", "Angola is a part of the continent of"],
         neighbours=["Ghana is located in", "Ghana belongs to"],
         generation=["Angola is located in", "Angola is located in"])
R2 = rec(2, "people", "{} speak", "English", "French English", neighbours=["Ghana people speak"])
PROBES = [  # the pocket world's portability.json shape
    {"case_id": 1, "prompt": "Angola is a citizen of a country whose capital is", "hops": ["..", ".."],
     "target_true": "Luanda", "target_new": "Paris"},
    {"case_id": 1, "prompt": "Angola is a citizen of a country whose capital city", "hops": ["..", ".."],
     "target_true": "Paris", "target_new": "Luanda Paris"},
    {"case_id": 99, "prompt": "not among the evaluated records", "hops": [], "target_true": "a",
     "target_new": "b"},
]


def nll(prev: str, target: list[str]) -> float:
    """Length-normalised NLL of ``target`` after a prompt ending in ``prev`` (the bigram's only context)."""
    ctx = [prev, *target[:-1]]
    return -sum(math.log(p(a, b)) for a, b in zip(ctx, target, strict=True)) / len(target)


# ----------------------------------------------------------------------------- hand computations


def test_every_metric_matches_a_hand_computation(bigram: BigramLlama, wtok: PreTrainedTokenizerFast) -> None:
    res = evaluate_counterfact(bigram, wtok, [R1, R2], CounterFactSettings(max_gen_tokens=4, batch_size=3),
                               portability=PROBES, progress=False)
    t = res.per_record.set_index("case_id")

    # record 1: NLL(o*) = -(ln .3 + ln .9)/2 = .655 < NLL(o) = -ln .5 = .693  -> ES 1
    assert t.loc[1, "nll_new"] == pytest.approx(-(math.log(0.3) + math.log(0.9)) / 2)
    assert t.loc[1, "nll_new"] == pytest.approx(nll("in", ["Antarctica", "pole"]))
    assert t.loc[1, "nll_true"] == pytest.approx(-math.log(0.5))
    assert t.loc[1, "ES"] == 1.0
    # token-level: "Antarctica" is not the argmax after "in" (Africa is), "pole" is -> partial credit 1/2
    assert t.loc[1, "Efficacy"] == 0.5 and t.loc[1, "rewrite_all_correct"] == 0.0
    # paraphrases: after "to" both tokens right (1.0), after "of" Africa wins the first (0.5);
    # NLL(o*) < NLL(o) on both
    assert nll("to", ["Antarctica", "pole"]) < nll("to", ["Africa"])
    assert nll("of", ["Antarctica", "pole"]) < nll("of", ["Africa"])
    assert t.loc[1, "PS"] == 1.0 and t.loc[1, "Generalization"] == 0.75
    # neighbours: "... located in" -> Africa right; "... belongs to" -> Antarctica is the argmax, Africa wrong
    assert t.loc[1, "NS"] == 0.5 and t.loc[1, "Specificity"] == 0.5

    # record 2: NLL(English) = -ln .35 = 1.050 > NLL("French English") = -(ln .5 + ln .3)/2 = .949 -> ES 0,
    # although the *summed* NLL (1.050 < 1.897) would say otherwise: length normalisation matters
    assert t.loc[2, "nll_new"] == pytest.approx(-math.log(0.35))
    assert t.loc[2, "nll_true"] == pytest.approx(-(math.log(0.5) + math.log(0.3)) / 2)
    assert t.loc[2, "ES"] == 0.0 and t.loc[2, "Efficacy"] == 0.0
    assert math.isnan(t.loc[2, "PS"]) and math.isnan(t.loc[2, "Generalization"])  # no paraphrases
    # NS needs *every* token: "French" right, "English" wrong after "French" (Paris is the argmax):
    # 0, not 1/2
    assert t.loc[2, "NS"] == 0.0

    # fluency: greedy continuations, scored by the model itself
    f1 = (math.log(0.5) + math.log(0.6)) / 2  # "Angola is located in" -> Africa <eos>
    f2 = (2 * math.log(0.5) + math.log(0.9)) / 3  # no generation prompts: rewrite prompt, French Paris <eos>
    assert t.loc[1, "fluency"] == pytest.approx(f1) and t.loc[2, "fluency"] == pytest.approx(f2)
    gens = res.generations
    assert list(gens["case_id"]) == [1, 1, 2]
    assert list(gens["continuation"]) == ["Africa <eos>", "Africa <eos>", "French Paris <eos>"]
    assert list(gens["prompt_source"]) == ["generation_prompts", "generation_prompts", "rewrite prompt"]
    assert list(gens["n_tokens"]) == [2, 2, 3]

    # portability: probe 1 answered (Paris is the argmax after "is"); probe 2 ("Luanda Paris") gets Luanda
    # but not Paris after Luanda (Europe) -> not answered, token accuracy 1/2
    assert t.loc[1, "Portability"] == 0.5 and t.loc[1, "portability_token_acc"] == 0.75
    assert math.isnan(t.loc[2, "Portability"]) and t.loc[2, "n_portability"] == 0

    m = res.metrics
    assert dict(res) == m and res["ES"] == m["ES"]  # a mapping of its metrics (editing's callback contract)
    assert (m["ES"], m["PS"], m["NS"]) == (0.5, 1.0, 0.25)
    assert (m["Efficacy"], m["Generalization"], m["Specificity"]) == (0.25, 0.75, 0.25)
    assert (m["n_PS"], m["n_ES"], m["n_Portability"]) == (1, 2, 1)
    assert m["fluency"] == pytest.approx((f1 + f2) / 2)
    assert m["Portability"] == 0.5 and m["portability_source"] == "given probes"
    assert m["Fluency*"] is None and m["fluency_normalised"] is False  # no baseline given
    # S_e over the available constituents, flagged
    assert m["S_e_missing"] == ["Fluency*"] and m["S_e_complete"] is False
    assert m["S_e"] == pytest.approx(4 / (1 / 0.25 + 1 / 0.75 + 1 / 0.25 + 1 / 0.5))


def test_ns_leaves_out_neighbours_edited_in_the_run(bigram: BigramLlama, wtok: PreTrainedTokenizerFast
                                                     ) -> None:
    # "Ghana is located in" -> Africa is the argmax (right); "people belongs to" -> Antarctica (wrong)
    named = dataclasses.replace(R1, neighborhood_prompts=("Ghana is located in", "people belongs to"),
                                neighborhood_subjects=("Ghana", "people"))

    def run(records, edited):
        res = evaluate_counterfact(bigram, wtok, records, CounterFactSettings(compute_fluency=False),
                                   edited_subjects=edited, progress=False)
        row = res.per_record.iloc[0]
        return row["NS"], row["NS_all"], row["n_neighbours_edited"], res

    assert run([named], ())[:3] == (0.5, 0.5, 0)
    assert run([named], {"people", "Angola"})[:3] == (1.0, 0.5, 1)  # the wrong one was edited: left out
    ns, ns_all, n, res = run([named], {"Ghana"})
    assert (ns, ns_all, n) == (0.0, 0.5, 1) and res["Specificity"] == 0.0 and res["NS_all"] == 0.5
    assert res.settings["n_edited_subjects"] == 1
    ns, _, n, res = run([named], {"Ghana", "people"})  # no neighbour left: NS undefined, not 0 or 1
    assert math.isnan(ns) and n == 2 and res["NS"] is None and res["n_NS"] == 0 and res["NS_all"] == 0.5
    # records that do not name their neighbours (real CounterFact) are scored on all of them
    assert run([R1], {"Ghana"})[:3] == (0.5, 0.5, 0)


def test_fluency_normalisation_and_its_direction(bigram: BigramLlama, wtok: PreTrainedTokenizerFast) -> None:
    base = evaluate_counterfact(bigram, wtok, [R1, R2], CounterFactSettings(max_gen_tokens=4), progress=False)
    f = base.metrics["fluency"]
    # the unedited model against itself: exactly 1
    same = evaluate_counterfact(bigram, wtok, [R1, R2], CounterFactSettings(max_gen_tokens=4), progress=False,
                                unedited_fluency=base)
    assert same.metrics["Fluency*"] == 1.0 and same.metrics["fluency_normalised"] is True
    # a baseline with lower log-probability (-2.0 < f): the evaluated model is *more* fluent -> above 1
    better = evaluate_counterfact(bigram, wtok, [R1, R2], CounterFactSettings(max_gen_tokens=4),
                                  progress=False, unedited_fluency=-2.0)
    assert better.metrics["Fluency*"] == pytest.approx(-2.0 / f) and better.metrics["Fluency*"] > 1
    assert better.metrics["fluency_ratio_literal"] == pytest.approx(f / -2.0)  # the paper's literal ratio
    assert better.metrics["S_e_missing"] == ["Portability"]
    assert better.edit_score.components["Fluency*"] == pytest.approx(-2.0 / f)
    # a more fluent baseline: below 1
    worse = evaluate_counterfact(bigram, wtok, [R1, R2], CounterFactSettings(max_gen_tokens=4),
                                 progress=False, unedited_fluency=-0.1)
    assert worse.metrics["Fluency*"] == pytest.approx(-0.1 / f) and worse.metrics["Fluency*"] < 1

    with pytest.raises(ValueError, match="negative number"):
        evaluate_counterfact(bigram, wtok, [R1], progress=False, unedited_fluency=0.7)
    with pytest.raises(ValueError, match="max_gen_tokens=4.*uses 2"):
        evaluate_counterfact(bigram, wtok, [R1, R2], CounterFactSettings(max_gen_tokens=2), progress=False,
                             unedited_fluency=base)
    with pytest.raises(ValueError, match="other records"):
        evaluate_counterfact(bigram, wtok, [R2, R1], CounterFactSettings(max_gen_tokens=4), progress=False,
                             unedited_fluency=base)


def test_generation_length_cap_and_sampling(bigram: BigramLlama, wtok: PreTrainedTokenizerFast) -> None:
    res = evaluate_counterfact(bigram, wtok, [R2], CounterFactSettings(max_gen_tokens=2), progress=False)
    assert list(res.generations["continuation"]) == ["French Paris"]  # cut before <eos>
    assert res.metrics["fluency"] == pytest.approx(math.log(0.5))
    one = evaluate_counterfact(bigram, wtok, [R1, R2],
                               CounterFactSettings(max_gen_tokens=6, decoding="sample", seed=3),
                               progress=False)
    two = evaluate_counterfact(bigram, wtok, [R1, R2],
                               CounterFactSettings(max_gen_tokens=6, decoding="sample", seed=3),
                               progress=False)
    assert one.settings["decoding"] == "sample" and one.settings["seed"] == 3
    assert len(one.generations) == 3  # sampling: the repeated prompt is sampled twice
    assert list(one.generations["continuation"]) == list(two.generations["continuation"])
    assert one.metrics["fluency"] == two.metrics["fluency"] < 0
    no_flu = evaluate_counterfact(bigram, wtok, [R1], CounterFactSettings(compute_fluency=False),
                                  progress=False)
    assert no_flu.metrics["fluency"] is None and no_flu.generations.empty
    assert no_flu.metrics["S_e_missing"] == ["Fluency*", "Portability"]
    with pytest.raises(ValueError, match="decoding"):
        evaluate_counterfact(bigram, wtok, [R1], CounterFactSettings(decoding="beam"), progress=False)


def test_portability_sources(bigram: BigramLlama, wtok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    # none given, none in the records: not available, never invented
    res = evaluate_counterfact(bigram, wtok, [R1, R2], CounterFactSettings(compute_fluency=False),
                               progress=False)
    assert res.metrics["Portability"] is None and res.metrics["n_Portability"] == 0
    assert res.metrics["portability_source"] is None and "Portability" in res.metrics["S_e_missing"]
    assert res.tidy().set_index("metric").loc["Portability", "n"] == 0

    # the pocket world's portability.json, by path
    path = tmp_path / "portability.json"
    path.write_text(json.dumps(PROBES))
    by_case = load_portability(path)
    assert sorted(by_case) == [1, 99] and by_case[1][0].targets == ("Paris",)
    assert by_case[1][0].kind == "two_hop"
    res = evaluate_counterfact(bigram, wtok, [R1, R2], CounterFactSettings(compute_fluency=False),
                               portability=path, progress=False)
    assert res.metrics["Portability"] == 0.5

    # EasyEdit/KnowEdit fields on the record: aliases, any one counts
    knowedit = {"Subject_Aliasing": [{"prompt": "Angola is a citizen of a country whose capital is",
                                      "ground_truth": [["Luanda"], ["Paris"]]}],
                "reasoning": [{"prompt": "Angola is a citizen of a country whose capital city",
                               "ground_truth": "Paris"}]}
    r1 = rec(1, "Angola", "{} is located in", "Antarctica pole", "Africa", portability=knowedit)
    res = evaluate_counterfact(bigram, wtok, [r1], CounterFactSettings(compute_fluency=False), progress=False)
    assert res.metrics["Portability"] == 0.5  # aliasing: Paris right; reasoning: Luanda is the argmax
    assert res.metrics["portability_source"] == "record portability field"
    # given probes take precedence over the record's own field
    res = evaluate_counterfact(bigram, wtok, [r1], CounterFactSettings(compute_fluency=False),
                               portability={1: [PROBES[0]]}, progress=False)
    assert res.metrics["Portability"] == 1.0
    zsre = rec(1, "Angola", "{} is located in", "Antarctica pole", "Africa",
               portability={"New Question": "Angola is a citizen of a country whose capital is",
                            "New Answer": "Paris"})
    assert CF.portability_probes(zsre)[0].targets == ("Paris",)
    with pytest.raises(ValueError, match="case_id 1: portability"):
        CF.portability_probes(rec(1, "A", "{} x", "y", "z", portability={"reasoning": [{"question": "?"}]}))


# ----------------------------------------------------------------------------- BOS and tokenisation


def test_bos_is_in_every_model_input_exactly_once(bigram: BigramLlama) -> None:
    seen: list[torch.Tensor] = []
    handle = bigram.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["input_ids"].clone()), with_kwargs=True)
    try:
        for add_bos, expected in ((True, 1), (False, 0)):
            seen.clear()
            evaluate_counterfact(bigram, word_tokenizer(add_bos), [R1, R2],
                                 CounterFactSettings(max_gen_tokens=3), portability=PROBES, progress=False)
            full = [s for s in seen if s.shape[1] > 1]  # generation steps after the first see one token
            assert full
            for batch in full:
                counts = (batch == ID["<bos>"]).sum(dim=1)
                assert counts.tolist() == [expected] * batch.shape[0]
    finally:
        handle.remove()
    # explicit override both ways
    tok = word_tokenizer(add_bos=False)
    assert not tokenizer_adds_bos(tok) and tokenizer_adds_bos(word_tokenizer())
    enc = encode_prompt_target(tok, "Angola is located in", "Africa", add_bos=True)
    assert enc.prefix[0] == ID["<bos>"] and enc.prefix.count(ID["<bos>"]) == 1
    enc = encode_prompt_target(word_tokenizer(), "<bos> Angola is located in", "Africa", add_bos=True)
    assert enc.prefix.count(ID["<bos>"]) == 1  # never twice


CORPUS = ["Angola is located in Africa", "The capital of France is Paris", "Danielle Darrieux speaks French",
          "Toko Yasuda plays the piano", "BBC One is owned by BBC",
          "Ghana is a part of the continent of Africa"]


def byte_level(bos: bool) -> PreTrainedTokenizerFast:
    """GPT-2 style (no BOS) or Llama-3 style (BOS) byte-level BPE."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 10, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def sentencepiece_style() -> PreTrainedTokenizerFast:
    """Llama-2 style: '▁' prepended and spaces replaced by the normaliser, BPE, BOS."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # train with a Metaspace pre-tokenizer so that merges stay within words, then drop it
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(CORPUS * 10, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


STYLES = {"gpt2": lambda: byte_level(False), "llama3": lambda: byte_level(True),
          "llama2": sentencepiece_style}


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("prompt, target", [("Angola is located in", "Africa"),
                                            ("The capital of France is", "Paris"),
                                            ("BBC One is owned by", "BBC"),
                                            ("Ghana is a part of the continent of", "Toko Yasuda")])
def test_target_tokens_are_those_after_the_prompt(style: str, prompt: str, target: str) -> None:
    tok = STYLES[style]()
    adds_bos = style != "gpt2"
    assert tokenizer_adds_bos(tok) is adds_bos
    enc = encode_prompt_target(tok, prompt, target)
    # exactly what the tokenizer makes of the whole sentence, BOS included where it adds one
    assert list(enc.prefix + enc.target) == tok(f"{prompt} {target}")["input_ids"]
    assert (enc.prefix + enc.target).count(tok.bos_token_id) == (1 if adds_bos else 0)
    assert tok.bos_token_id not in enc.target and not enc.fallback
    # suffix method == standalone tokenisation, with or without a leading space in the data
    assert list(enc.target) == standalone_target_ids(tok, target) == standalone_target_ids(tok, " " + target)
    assert encode_prompt_target(tok, prompt, " " + target) == enc
    assert encode_prompt_target(tok, prompt + " ", target) == enc


def test_sentencepiece_leading_space_trap_is_real_and_avoided() -> None:
    tok = sentencepiece_style()
    naive = tok(" Africa", add_special_tokens=False)["input_ids"]  # what ROME's tok(" " + target) gives
    assert tok.convert_ids_to_tokens(naive) == ["▁", "▁Africa"]  # a stray word-start token
    ours = standalone_target_ids(tok, " Africa")
    assert tok.convert_ids_to_tokens(ours) == ["▁Africa"]
    assert list(encode_prompt_target(tok, "Angola is located in", "Africa").target) == ours
    # byte-level BPE needs the space: without it the target would be a word-internal token sequence
    bpe = byte_level(True)
    assert standalone_target_ids(bpe, "Africa") == bpe(" Africa", add_special_tokens=False)["input_ids"]
    assert standalone_target_ids(bpe, "Africa") != bpe("Africa", add_special_tokens=False)["input_ids"]


def test_boundary_merge_falls_back_to_standalone_target() -> None:
    # a BPE that merges "n" + " " + "A" across the word boundary (no pre-tokenizer)
    vocab = {c: i for i, c in enumerate(["<s>", "i", "n", " ", "A", "f", "r", "c", "a", "n ", "n A"])}
    tok = Tokenizer(models.BPE(vocab, [("n", " "), ("n ", "A")]))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
    merged = hf("in Africa", add_special_tokens=False)["input_ids"]
    assert hf.convert_ids_to_tokens(merged)[:2] == ["i", "n A"]
    enc = encode_prompt_target(hf, "in", "Africa", add_bos=True)
    assert enc.fallback
    assert list(enc.prefix) == [0, vocab["i"], vocab["n"]]
    assert list(enc.target) == [vocab[c] for c in " Africa"]


def test_bad_targets_and_records_are_refused(bigram: BigramLlama, wtok: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="zero tokens"):
        encode_prompt_target(wtok, "Angola is located in", "  ")
    with pytest.raises(ValueError, match="no CounterFact records"):
        evaluate_counterfact(bigram, wtok, [], progress=False)
    with pytest.raises(TypeError, match="load_counterfact"):
        evaluate_counterfact(bigram, wtok, [R1.to_rome()], progress=False)
    with pytest.raises(ValueError, match="prefix and target"):
        teacher_forced_scores(bigram, [((1, 2), ())])


# ----------------------------------------------------------------------------- padding and batching


def test_batching_and_padding_do_not_change_scores_or_generations() -> None:
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(tiny_config(len(VOCAB), hidden=32, layers=2)).eval()
    gen = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(4, len(VOCAB), (n,), generator=gen).tolist(),
              torch.randint(4, len(VOCAB), (m,), generator=gen).tolist())
             for n, m in [(1, 1), (7, 3), (3, 5), (12, 1), (2, 2), (5, 4), (9, 2)]]
    one = teacher_forced_scores(model, pairs, batch_size=1)
    many = teacher_forced_scores(model, pairs, batch_size=4, pad_token_id=5)  # a real token as pad: masked
    for a, b in zip(one, many, strict=True):
        assert a.correct == b.correct
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    # against a direct, unpadded forward
    prefix, target = pairs[1]
    with torch.no_grad():
        logits = model(torch.tensor([prefix + target])).logits[0]
    direct = torch.log_softmax(logits[len(prefix) - 1:-1], -1)[range(len(target)), target]
    assert one[1].logprobs == pytest.approx(direct.tolist(), abs=1e-5)

    prefixes = [p for p, _ in pairs]
    ids = CF.targets.SpecialIds(bos=None, eos=None, pad=0)
    alone = CF.fluency._generate(model, prefixes, CounterFactSettings(batch_size=1, max_gen_tokens=5), ids,
                                 progress=False)
    batched = CF.fluency._generate(model, prefixes, CounterFactSettings(batch_size=7, max_gen_tokens=5), ids,
                                   progress=False)  # left padding up to 12 tokens
    assert batched == alone
    # stopped (and cut) on the model's own EOS (2) although no tokenizer EOS was given; else 5 tokens
    assert {len(c) for c in alone if c[-1] != 2} == {5} and any(c[-1] == 2 for c in alone)
    assert all(2 not in c[:-1] for c in alone)


def test_model_mode_is_restored(bigram: BigramLlama, wtok: PreTrainedTokenizerFast) -> None:
    bigram.train()
    try:
        evaluate_counterfact(bigram, wtok, [R1], CounterFactSettings(compute_fluency=False), progress=False)
        assert bigram.training
    finally:
        bigram.eval()


# ----------------------------------------------------------------------------- real files, pocket world


@pytest.fixture(scope="module")
def random_llama() -> tuple[transformers.LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = byte_level(True)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(tiny_config(len(tok), hidden=32, layers=2)).eval(), tok


def _check_ranges(res: CounterFactResult) -> None:
    for name in ("ES", "PS", "NS", "Efficacy", "Generalization", "Specificity", "S_e"):
        assert 0.0 <= res.metrics[name] <= 1.0, name
    assert res.metrics["fluency"] < 0
    assert res.metrics["Specificity"] == res.metrics["NS"]


@pytest.mark.parametrize("name, fmt, source", [
    ("counterfact_rome_100.json", "rome", "generation_prompts"),
    ("counterfact_easyedit_300.json", "easyedit", "rewrite prompt"),
])
def test_shared_files_end_to_end(slices: Path, random_llama, tmp_path: Path, name: str, fmt: str,
                                 source: str) -> None:
    model, tok = random_llama
    records = load_counterfact(slices / "counterfact" / name, limit=5)
    res = evaluate_counterfact(model, tok, records,
                               CounterFactSettings(max_gen_tokens=4, max_fluency_prompts=3, batch_size=8),
                               progress=False)
    _check_ranges(res)
    assert res.metrics["n_records"] == 5 and res.metrics["Portability"] is None  # neither file has probes
    assert res.metrics["S_e_missing"] == ["Fluency*", "Portability"]
    assert res.settings["n_tokenisation_fallbacks"] == 0
    t = res.per_record
    assert list(t["case_id"]) == [r.case_id for r in records]
    assert list(t["n_neighbours"]) == [len(r.neighborhood_prompts) for r in records]
    assert list(t["n_paraphrases"]) == [len(r.paraphrase_prompts) for r in records]
    assert set(res.generations["prompt_source"]) == {source}
    assert (t["source_format"] == fmt).all()
    again = evaluate_counterfact(model, tok, records,
                                 CounterFactSettings(max_gen_tokens=4, max_fluency_prompts=3, batch_size=3),
                                 progress=False, unedited_fluency=res)
    assert again.metrics["Fluency*"] == pytest.approx(1.0) and again.metrics["S_e_missing"] == ["Portability"]
    out = again.save(tmp_path)
    saved = json.loads((out / "counterfact_metrics.json").read_text())
    assert saved["metrics"]["S_e"] == pytest.approx(again.metrics["S_e"])
    assert (out / "counterfact_records.parquet").is_file()
    assert (out / "counterfact_generations.parquet").is_file()
    tidy = again.tidy().set_index("metric")
    assert tidy.loc["ES", "convention"] == "ROME/MEMIT"
    assert tidy.loc["Efficacy", "convention"] == "EasyEdit/KnowEdit"


def test_pocket_world_records_and_two_hop_probes(random_llama, tmp_path: Path) -> None:
    from moir_lib import pocket

    world = pocket.World(pocket.get_variant("micro").world)
    raw = world.counterfact()
    (tmp_path / "counterfact.json").write_text(json.dumps(raw))
    (tmp_path / "portability.json").write_text(json.dumps(world.portability(raw)))
    probes = load_portability(tmp_path / "portability.json")
    records = load_counterfact(tmp_path / "counterfact.json")
    with_probes = [r for r in records if r.case_id in probes][:3]
    without = [r for r in records if r.case_id not in probes][:3]
    assert with_probes and without
    model, tok = random_llama
    res = evaluate_counterfact(model, tok, with_probes + without,
                               CounterFactSettings(max_gen_tokens=3, max_fluency_prompts=2),
                               portability=tmp_path / "portability.json", progress=False)
    _check_ranges(res)
    assert res.metrics["n_Portability"] == len(with_probes) and 0 <= res.metrics["Portability"] <= 1
    assert res.metrics["portability_source"] == "given probes"
    assert "Portability" not in res.metrics["S_e_missing"]
    n_with_neighbours = sum(bool(r.neighborhood_prompts) for r in with_probes + without)
    assert res.metrics["n_NS"] == n_with_neighbours  # records without neighbours do not count as 0 or 1
