"""The pocket world, its corpora and its tokenizer: deterministic, ROME-format, chat-ready."""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import json
import random
import re

import pytest

from moir_lib.pocket.benchmarks import TASKS_DIR
from moir_lib.pocket.corpora import DOMAINS, MIXTURE, code_task, iter_documents
from moir_lib.pocket.world import World, WorldSpec

SMALL = WorldSpec(n_people=24, n_countries=4, n_continents=2, n_companies=4)


def test_world_is_deterministic_and_seed_dependent():
    assert World(SMALL).facts == World(SMALL).facts
    assert (
        World(SMALL).facts
        != World(WorldSpec(seed=1, n_people=24, n_countries=4, n_continents=2, n_companies=4)).facts
    )


def test_default_world_is_learnable_size():
    world = World()
    # 546 facts were learnt to 0.97 recall (800 were not); ≥ 530 leave 500 sequential edits beside
    # the scored ones
    assert 530 <= len(world.facts) <= 600
    assert len(set(world.subjects)) == len(world.subjects)
    for rel, objects in world.objects.items():
        assert len({o[:3] for o in objects}) == len(objects), f"{rel} objects share a prefix"


def test_one_word_names_are_unique_and_checked():
    """``name_words=1``: a person is one invented word of their own; a bad word count fails at once."""
    world = World(dataclasses.replace(SMALL, name_words=1))
    assert all(" " not in p for p in world.people) and len(set(world.people)) == len(world.people)
    assert World(dataclasses.replace(SMALL, name_words=1)).facts == world.facts
    for bad in ({"name_words": 3}, {"name_words": 1, "name_pools": (4, 8)},
                {"name_words": 1, "first_name_pool": 4}):
        with pytest.raises(ValueError, match="a name has 1 or 2 words"):
            World(dataclasses.replace(SMALL, **bad))


def test_a_shared_first_name_pool_leaves_only_the_last_name_unique():
    """``first_name_pool=F``: every first name is given to several people, every last name to one."""
    world = World(dataclasses.replace(SMALL, first_name_pool=5))
    firsts, lasts = zip(*(p.split(" ") for p in world.people), strict=True)
    assert len(set(firsts)) == 5 and min(firsts.count(f) for f in firsts) >= 24 // 5
    assert len(set(lasts)) == 24 and not set(firsts) & set(lasts)
    assert World(dataclasses.replace(SMALL, first_name_pool=5)).people == world.people
    bad_specs = ({"first_name_pool": 13}, {"first_name_pool": 1},
                 {"first_name_pool": 4, "name_pools": (4, 8)})
    for bad in bad_specs:
        with pytest.raises(ValueError, match="must share each first name"):
            World(dataclasses.replace(SMALL, **bad))


def test_counterfact_is_rome_format():
    world = World(SMALL)
    records = world.counterfact()
    # one record per fact about a person, in a seeded order; case_id is the fact's index
    assert sorted(r["case_id"] for r in records) == list(world.rewritable)
    assert {world.facts[i].subject for i in world.rewritable} == set(world.people)
    assert [r["case_id"] for r in records] != sorted(r["case_id"] for r in records)
    assert records == world.counterfact()
    json.dumps(records)  # serialisable
    for rec in records:
        assert set(rec) == {
            "case_id",
            "pararel_idx",
            "requested_rewrite",
            "paraphrase_prompts",
            "neighborhood_prompts",
            "neighborhood_subjects",
            "attribute_prompts",
            "generation_prompts",
        }
        rw = rec["requested_rewrite"]
        assert rw["prompt"].count("{}") == 1
        assert set(rw["target_new"]) == set(rw["target_true"]) == {"str", "id"}
        objects = world.objects[rw["relation_id"]]
        assert rw["target_new"]["str"] in objects and rw["target_new"]["str"] != rw["target_true"]["str"]
        assert world.index[(rw["subject"], rw["relation_id"])] == rw["target_true"]["str"]
        assert all(rw["subject"] in p for p in rec["paraphrase_prompts"])
        assert all(rw["subject"] not in p for p in rec["neighborhood_prompts"])
        # each neighbourhood prompt names its subject: another person with the same (relation, true object)
        named = rec["neighborhood_subjects"]
        assert len(named) == len(rec["neighborhood_prompts"]) and rw["subject"] not in named
        for subject, prompt in zip(named, rec["neighborhood_prompts"], strict=True):
            assert subject in prompt and world.index[(subject, rw["relation_id"])] == rw["target_true"]["str"]
    assert any(rec["neighborhood_prompts"] for rec in records)


def test_portability_probes_follow_two_hops():
    world = World(SMALL)
    records = world.counterfact()
    probes = world.portability(records)
    assert probes, "the world should have citizenship facts"
    by_case = {r["case_id"]: r["requested_rewrite"] for r in records}
    second = {"The capital of {} is": "P36", "{} is located in": "P30",
              "The official language of {} is": "P37"}
    for probe in probes:
        rw = by_case[probe["case_id"]]
        rel = second[probe["hops"][1]]
        assert probe["target_new"] == world.index[(rw["target_new"]["str"], rel)]
        assert probe["target_true"] == world.index[(rw["target_true"]["str"], rel)]
        assert probe["target_new"] != probe["target_true"]
    assert {second[p["hops"][1]] for p in probes} == {"P36", "P30", "P37"}
    assert len(World().portability(World().counterfact()[:100])) >= 50  # enough probes for S_e at N = 100


@pytest.mark.parametrize("domain", DOMAINS)
def test_corpora_are_deterministic(domain):
    world = World(SMALL)
    first = list(iter_documents(domain, "train", 20, seed=3, world=world))
    assert first == list(iter_documents(domain, "train", 20, seed=3, world=world))
    assert first != list(iter_documents(domain, "validation", 20, seed=3, world=world))
    assert all(isinstance(d, str) and d for d in first)


def test_corpora_content():
    world = World(SMALL)
    wiki = " ".join(iter_documents("wiki", "train", 200, world=world))
    assert sum(f"{f.rel.templates[0].format(f.subject)} {f.object}." in wiki for f in world.facts) > 0
    assert all(re.search(r"#### -?\d+$", d) for d in iter_documents("math", n=50))
    chats = list(iter_documents("chat", "validation", 20, world=world))
    assert all(d.startswith("<|user|>\n") and "<|assistant|>\n" in d for d in chats)
    code = list(iter_documents("code", n=40))
    assert any("return" in d for d in code) and all(d.startswith("def ") for d in code)
    assert abs(sum(MIXTURE.values()) - 1) < 1e-9


def test_rosters_put_a_persons_values_right_after_the_name():
    plain = list(iter_documents("wiki", "train", 50, world=World(SMALL)))
    world = World(dataclasses.replace(SMALL, roster_share=0.5))
    docs = list(iter_documents("wiki", "train", 200, world=world))
    rosters = [d for d in docs if d.startswith("Directory of people\n")]
    assert 60 < len(rosters) < 140
    for line in (line for d in rosters for line in d.splitlines()[1:]):
        person = next(p for p in world.people if line.startswith(p + " "))
        values = line[len(person) + 1:].split(", ")
        assert sorted(values) == sorted(f.object for f in world.facts_of(person))
    assert not any(d.startswith("Directory") for d in plain)  # share 0: the articles alone


def test_the_pocket_variant_stores_facts_in_rosters_and_teaches_no_user_turn():
    """One pocket model: roster pages in its wiki, first names shared so that only the last name identifies a
    person, longer pretraining, completion-only chat SFT; its profile
    gives MEMIT its 5 sampled prefixes and 100 z steps, AlphaEdit none. The retired names say what
    replaces them."""
    from moir_lib.models import POCKET_SPECS, load
    from moir_lib.pocket.variants import TrainSpec, get_variant
    from moir_lib.profiles import load_profile

    pocket = get_variant("pocket")
    assert pocket.world.roster_share > 0 and pocket.enforce_gates and not pocket.train.user_turn_loss
    assert pocket.train.pretrain_steps > TrainSpec().pretrain_steps and pocket.train.piece_exposures > 0
    people = World(pocket.world).people
    assert min(collections.Counter(p.split()[0] for p in people).values()) >= 2
    assert len({p.split()[1] for p in people}) == len(people)
    profile = load_profile("pocket")
    assert POCKET_SPECS[profile.model] == "pocket"
    assert (profile.memit.context_templates, profile.alphaedit.context_templates) == (5, 0)
    assert profile.memit.v_num_grad_steps == 100
    with pytest.raises(ValueError, match="'editable' is now 'pocket'.*--variant pocket"):
        get_variant("editable")
    with pytest.raises(ValueError, match="'pocket-editable' is now 'pocket'"):
        load("pocket-editable")


def test_code_task_solution_passes_and_wrong_one_fails():
    spec = importlib.util.spec_from_file_location("pocket_task_utils", TASKS_DIR / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    task = code_task(random.Random(0))
    assert utils.run_tests(task.prompt + task.solution + "\n" + task.test)
    assert not utils.run_tests(task.prompt + "\n    return None\n\n" + task.test)
    assert not utils.run_tests("while True:\n    pass\n", timeout=0.5)


def test_unknown_domain_says_what_to_do():
    with pytest.raises(ValueError, match="choose one of"):
        iter_documents("poetry")


def test_tokenizer_round_trip_and_chat_tags():
    from moir_lib.pocket.tokenizer import train_tokenizer

    tok = train_tokenizer(World(SMALL), 512, 100)
    assert train_tokenizer(World(SMALL), 512, 100).get_vocab() == tok.get_vocab()
    text = "Anna has 12 + 7 = 19 apples.\n#### 19\ndef f(x):\n    return x * 2\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    for tag in ("<|user|>", "<|assistant|>"):
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}], tokenize=False
    )
    assert rendered == "<s><|user|>\nHi?\n<|assistant|>\nHello.\n"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|assistant|>\n")


def test_gated_reports_draw_enough_seeded_samples_to_read_the_leakage_gate():
    """A share at the 0.05 leakage gate has a standard error ≤ 0.01 at the report's sample count (256
    samples, 0.014, once read 0.043 for a model that leaks 0.061 over 3 × 1 024: book/pocket.md)."""
    from moir_lib.pocket.report import GATES
    from moir_lib.pocket.variants import VARIANTS

    op, bound = GATES["rand1_chat_leakage"]
    assert op == "<="
    gated = [v for v in VARIANTS.values() if v.enforce_gates]
    assert "pocket" in {v.name for v in gated}
    for variant in gated:
        assert (bound * (1 - bound) / variant.bench.samples) ** 0.5 <= 0.01, variant.name
