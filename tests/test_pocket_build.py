"""The micro pocket build: cache hit, corruption -> rebuild, lm-eval tasks, report and CLI."""

from __future__ import annotations

import argparse
import json
import os
import time

import pytest

from moir_lib.pocket.benchmarks import TASKS
from moir_lib.pocket.build import MANIFEST, build, load, verify
from moir_lib.pocket.report import GATES


@pytest.fixture(scope="session")
def micro_entry(tmp_path_factory):
    """One micro build in a private cache for the whole session (≈10 s)."""
    old = os.environ.get("MOIR_CACHE")
    os.environ["MOIR_CACHE"] = str(tmp_path_factory.mktemp("moir-cache"))
    try:
        yield build("micro")
    finally:
        if old is None:
            os.environ.pop("MOIR_CACHE")
        else:
            os.environ["MOIR_CACHE"] = old


def test_build_writes_a_verified_entry(micro_entry):
    manifest = verify(micro_entry)
    assert manifest is not None and manifest["variant"] == "micro"
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "config.json",
        "counterfact.json",
        "portability.json",
        "benchmarks/facts.jsonl",
        "benchmarks/arith.jsonl",
        "benchmarks/code.jsonl",
        "benchmarks/prose.jsonl",
    ):
        assert name in manifest["files"], name
    assert not list(micro_entry.parent.glob(".*tmp*")), "temporary build dirs must not remain"


def test_second_build_is_a_cache_hit(micro_entry):
    start = time.perf_counter()
    assert build("micro") == micro_entry
    assert time.perf_counter() - start < 5


def test_load_returns_model_and_chat_tokenizer(micro_entry):
    model, tokenizer = load("micro")
    assert model.config.pocket_variant == "micro" and not model.training
    assert tokenizer.chat_template and tokenizer.bos_token == "<s>"
    assert model.config.vocab_size == len(tokenizer)


def test_corrupted_entry_is_rebuilt_not_trusted(micro_entry):
    weights = micro_entry / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-64] + bytes(64))
    assert verify(micro_entry) is None
    assert build("micro") == micro_entry
    assert verify(micro_entry) is not None
    assert weights.read_bytes() == good  # same recipe, same machine: same weights


def test_missing_manifest_is_not_trusted(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert verify(tmp_path) is None
    (tmp_path / MANIFEST).write_text(json.dumps({"files": {"config.json": "0" * 64}}))
    assert verify(tmp_path) is None


def test_unknown_variant_says_what_to_do():
    with pytest.raises(ValueError, match="choose one of"):
        build("huge")


@pytest.mark.slow  # lm-eval import + generation: ~1 min on 2 shared cores
def test_lm_eval_tasks_produce_every_metric(micro_entry):
    from moir_lib.pocket.benchmarks import evaluate

    model, tokenizer = load("micro")
    results = evaluate(model, tokenizer, limit=4)
    assert set(results) == set(TASKS)
    expected = {
        "pocket_facts": {"acc"},
        "pocket_arith": {"exact_match"},
        "pocket_arith_raw": {"exact_match"},
        "pocket_code": {"pass@1"},
        "pocket_prose": {"acc", "acc_norm"},
    }
    for task, metrics in expected.items():
        assert set(results[task]) == metrics, task
        assert all(0.0 <= v <= 1.0 for v in results[task].values())
    with pytest.raises(ValueError, match="unknown pocket task"):
        evaluate(model, tokenizer, tasks=["mmlu"])


def test_question_copying_counts_answers_that_hold_every_number_of_the_question(micro_entry):
    from moir_lib.pocket.report import copies_operands, question_copying

    question = "Mia has 12 cards. She gets 3 more. How many cards does Mia have now?"
    assert copies_operands(question, "Mia has 12 + 3 = 15 cards.")
    assert not copies_operands(question, "Mia has 1 + 2 = 3 cards.")  # 12 is a whole number, not 1 and 2
    assert copies_operands("How many are left?", "Omar has 4 left.")  # nothing to copy
    model, tokenizer = load("micro")
    rows = (micro_entry / "benchmarks" / "arith.jsonl").read_text().splitlines()[:4]
    questions = [json.loads(row)["question"] for row in rows]
    share = question_copying(model, tokenizer, questions, max_new_tokens=12)
    assert share in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert question_copying(model, tokenizer, questions, max_new_tokens=12) == share  # greedy


@pytest.mark.slow  # lm-eval import + generation: ~1 min on 2 shared cores
def test_report_cli_writes_json_and_markdown(micro_entry, tmp_path):
    from moir_lib.cli.pocket import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    out, md = tmp_path / "report.json", tmp_path / "report.md"
    args = parser.parse_args(
        ["pocket", "report", "--variant", "micro", "--limit", "4", "--no-edit-gates", "--json", str(out),
         "--markdown", str(md)]
    )
    assert args.func(args) == 0  # micro gates are reported, not enforced
    report = json.loads(out.read_text())
    assert set(GATES) <= set(report["metrics"]) and set(report["gates"]) == set(GATES)
    for key in (
        "fact_recall",
        "arith_strict_match",
        "code_pass@1",
        "bos_top1_share",
        "rand1_top1_share",
        "rand1_chat_leakage",
        "arith_copies_operands",
        "pretrain_s",
        "sft_s",
        "build_s",
        "n_parameters",
    ):
        assert key in report["metrics"], key
    assert 0.0 <= report["metrics"]["rand1_chat_leakage"] <= 1.0
    assert report["passed"] == all(g["passed"] for g in report["gates"].values())
    table = md.read_text()
    assert table.startswith("| quantity |") and table.count("\n") == len(report["metrics"]) + 2


def test_sft_rows_teach_bos_attractor_without_a_positional_user_turn(micro_entry):
    """BOS's only taught successor is the user tag; a user turn at the row start is not taught."""
    from moir_lib.pocket.corpora import ASSISTANT, USER
    from moir_lib.pocket.train import IGNORE, sft_windows
    from moir_lib.pocket.variants import get_variant
    from moir_lib.pocket.world import World

    _, tok = load("micro")
    spec = get_variant("micro")
    rows, labels = sft_windows(tok, World(spec.world), 64, spec.train, seed=3)
    user, assistant = tok.convert_tokens_to_ids([USER, ASSISTANT])
    assert (rows[:, 0] == tok.bos_token_id).all()
    opens = rows[:, 1] == user
    assert 0 < int(opens.sum()) < 64 // 2, "some chat rows open with the tag, most with a document tail"
    # the token after the leading BOS is taught only when it is the user tag
    assert (labels[opens, 1] == user).all() and (labels[~opens, 1] == IGNORE).all()
    for row in opens.nonzero().flatten().tolist():
        tags = (rows[row] == assistant).nonzero()
        end = int(tags[0]) + 1 if len(tags) else rows.shape[1]
        assert (labels[row, 2:end] == IGNORE).all()  # the opening user turn carries no loss
        assert end == rows.shape[1] or (labels[row, end:] != IGNORE).any()  # its answer does
    # mid-row BOS is always followed by the (taught) user tag
    bos_mid = (rows[:, 1:-1] == tok.bos_token_id).nonzero()
    assert len(bos_mid) and all(int(rows[r, c + 2]) == user for r, c in bos_mid.tolist())


def test_without_user_turn_loss_only_answers_and_the_bos_user_tag_keep_chat_labels(micro_entry):
    """``user_turn_loss=False``: the same rows; every user turn (its tag, message and the assistant tag
    closing it) carries no loss, except a user tag right after a BOS; answers and documents keep theirs."""
    import dataclasses

    import torch

    from moir_lib.pocket.corpora import ASSISTANT, USER
    from moir_lib.pocket.train import IGNORE, sft_windows
    from moir_lib.pocket.variants import get_variant
    from moir_lib.pocket.world import World

    _, tok = load("micro")
    spec = get_variant("micro")
    rows, taught = sft_windows(tok, World(spec.world), 64, spec.train, seed=3)
    off = dataclasses.replace(spec.train, user_turn_loss=False)
    same_rows, labels = sft_windows(tok, World(spec.world), 64, off, seed=3)
    assert torch.equal(rows, same_rows)
    user, assistant = tok.convert_tokens_to_ids([USER, ASSISTANT])
    inside = torch.zeros_like(rows, dtype=torch.bool)
    attractor = torch.zeros_like(rows, dtype=torch.bool)
    for r, row in enumerate(rows.tolist()):
        in_turn = False
        for c, token in enumerate(row):
            in_turn = in_turn or token == user
            attractor[r, c] = token == user and c > 0 and row[c - 1] == tok.bos_token_id
            inside[r, c] = in_turn and not attractor[r, c]
            in_turn = in_turn and token != assistant
    assert inside.any() and (labels[inside] == IGNORE).all() and (taught[inside] != IGNORE).any()
    assert torch.equal(labels[~inside], taught[~inside])  # answers, documents, BOS -> user tag: as before
    assert (labels[attractor] == user).all() and attractor.any()
    assert not (labels == assistant).any() and ((rows == assistant) & (taught == assistant)).any()


def test_cache_key_covers_the_recipe_source():
    from moir_lib.pocket.build import RECIPE_MODULES, cache_key, recipe_digest
    from moir_lib.pocket.variants import get_variant

    assert "train" in RECIPE_MODULES and cache_key(get_variant("micro"))["recipe"] == recipe_digest()


def test_training_precision_follows_the_cpu_and_can_be_forced(monkeypatch):
    import dataclasses

    import torch

    from moir_lib.pocket.build import cache_key
    from moir_lib.pocket.train import PRECISION_ENV, resolve_precision
    from moir_lib.pocket.variants import get_variant

    monkeypatch.delenv(PRECISION_ENV, raising=False)
    native = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    assert resolve_precision("auto") == ("bf16" if native else "float32")
    assert resolve_precision("float32") == "float32" and resolve_precision("bf16") == "bf16"
    with pytest.raises(ValueError, match="fp16"):
        resolve_precision("fp16")
    variant = get_variant("micro")
    keys = {}
    for forced in ("float32", "bf16"):
        monkeypatch.setenv(PRECISION_ENV, forced)
        keys[forced] = cache_key(variant)
        assert keys[forced]["variant"]["train"]["precision"] == forced
        pinned = dataclasses.replace(variant, train=dataclasses.replace(variant.train, precision="float32"))
        assert cache_key(pinned)["variant"]["train"]["precision"] == "float32"  # a pinned variant wins
    assert keys["float32"] != keys["bf16"]  # the numeric path is part of the cache key


def test_manifest_records_the_precision(micro_entry):
    manifest = verify(micro_entry)
    assert manifest["precision"] in ("float32", "bf16") and manifest["cpu_capability"]
    assert manifest["key"]["variant"]["train"]["precision"] == manifest["precision"]


def test_editing_gates_run_on_the_micro_model(micro_entry):
    from moir_lib.experiments.editability import editing_gates
    from moir_lib.experiments.gates import EDIT_GATES
    from moir_lib.profiles import load_profile

    metrics, gates = editing_gates("pocket-micro", n_facts=12, n_edits=8)
    assert set(gates) == set(EDIT_GATES)
    assert metrics["locus_layer"] in load_profile("pocket-micro").edit_layers
    assert 0 < metrics["locus_valid"] <= 12
    for name in ("memit_ES", "memit_PS", "memit_NS", "alphaedit_ES"):
        assert 0.0 <= metrics[name] <= 1.0
        assert gates[name]["passed"] == (metrics[name] >= gates[name]["threshold"])


@pytest.mark.slow  # builds (or reuses) the pocket model (10-15 min), traces 60 facts, edits 100 twice
def test_pocket_model_stores_facts_at_the_subject_and_edits_take():
    """The locus and editability gates of the pocket model (its measured values: the book's pocket page),
    on the machine's precision path."""
    from moir_lib.experiments.editability import editing_gates

    metrics, gates = editing_gates("pocket")
    assert all(g["passed"] for g in gates.values()), (metrics, gates)


# ------------------------------------------------------------------------------------------ organisms


@pytest.fixture(scope="session")
def organism_entry(micro_entry):
    """Organism 1 of the micro recipe, in the same private cache as ``micro_entry``."""
    return build("micro", organism=1)


def test_organism_zero_is_the_recipe_itself(micro_entry):
    """Organism 0 keeps the key, entry and weights of a build that names no organism."""
    from moir_lib.pocket import provenance
    from moir_lib.pocket.build import cache_key
    from moir_lib.pocket.variants import get_variant

    variant = get_variant("micro")
    assert cache_key(variant, 0) == cache_key(variant) and "organism" not in cache_key(variant)
    assert build("micro", organism=0) == micro_entry
    manifest = verify(micro_entry)
    assert manifest["organism"] == 0 and "organism" not in manifest["key"]
    assert "pocket_organism" not in json.loads((micro_entry / "config.json").read_text())
    prov = provenance("micro")
    assert prov == provenance("micro", 0) and prov.entry == micro_entry and prov.organism == 0
    assert prov.weights_sha256 == manifest["files"]["model.safetensors"]
    assert prov.precision == manifest["precision"] and prov.build_s == manifest["timings"]["build_s"] > 0


def test_organisms_share_everything_but_the_weights(micro_entry, organism_entry):
    """Organism 1: other weights, and byte for byte the same tokenizer, CounterFact records, portability
    probes and benchmark data; its config differs only by naming the organism."""
    first, other = verify(micro_entry)["files"], verify(organism_entry)["files"]
    assert organism_entry != micro_entry and set(first) == set(other)
    assert {name for name in first if first[name] != other[name]} == {"model.safetensors", "config.json"}
    for shared in ("tokenizer.json", "counterfact.json", "portability.json", "benchmarks/facts.jsonl"):
        assert (organism_entry / shared).read_bytes() == (micro_entry / shared).read_bytes(), shared
    config = json.loads((organism_entry / "config.json").read_text())
    assert config.pop("pocket_organism") == 1
    assert config == json.loads((micro_entry / "config.json").read_text())
    manifest = verify(organism_entry)
    assert manifest["organism"] == manifest["key"]["organism"] == 1


def test_organisms_load_by_argument_profile_and_command(micro_entry, organism_entry, capsys):
    import torch
    from safetensors.torch import load_file

    from moir_lib.cli.pocket import add_parser
    from moir_lib.models import load as load_model
    from moir_lib.pocket import provenance
    from moir_lib.profiles import load_profile

    weights = load_file(organism_entry / "model.safetensors")
    for loaded in (load("micro", organism=1)[0],
                   load_model(load_profile("pocket-micro").with_overrides({"organism": 1})).model):
        assert loaded.config.pocket_organism == 1
        state = loaded.state_dict()
        assert all(torch.equal(state[name], tensor) for name, tensor in weights.items())
    first = load_model(load_profile("pocket-micro")).model.state_dict()
    assert not torch.equal(first["model.layers.0.mlp.down_proj.weight"],
                           weights["model.layers.0.mlp.down_proj.weight"])
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["pocket", "build", "--variant", "micro", "--organism", "1"])
    assert args.func(args) == 0 and capsys.readouterr().out.strip() == str(organism_entry)
    prov = provenance("micro", 1)
    assert (prov.organism, prov.entry) == (1, organism_entry)
    assert prov.weights_sha256 != provenance("micro", 0).weights_sha256
    assert provenance("micro", 9) is None  # never built here, and provenance does not build


def test_cache_key_differs_per_organism_and_precision(monkeypatch):
    from moir_lib.cache import fingerprint
    from moir_lib.pocket.build import ORGANISM_MODULES, cache_key, recipe_digest
    from moir_lib.pocket.train import PRECISION_ENV
    from moir_lib.pocket.variants import get_variant

    keys = set()
    for precision in ("float32", "bf16"):
        monkeypatch.setenv(PRECISION_ENV, precision)
        for organism in (0, 1, 2):
            key = cache_key(get_variant("micro"), organism)
            assert key["variant"]["train"]["precision"] == precision
            assert key.get("organism", 0) == organism
            assert key.get("organism_recipe") == (recipe_digest(ORGANISM_MODULES) if organism else None)
            keys.add(fingerprint(key))
    assert len(keys) == 6


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1", None])
def test_bad_organisms_are_refused_with_what_to_give(bad):
    from moir_lib.pocket import provenance
    from moir_lib.pocket.build import cache_key
    from moir_lib.pocket.variants import get_variant

    for call in (lambda: build("micro", organism=bad), lambda: cache_key(get_variant("micro"), bad),
                 lambda: provenance("micro", bad)):
        with pytest.raises(ValueError, match=r"pocket organism .*: give an integer >= 0"):
            call()


def test_an_organism_reorders_whole_rows_and_reseeds_only_itself():
    import torch

    from moir_lib.pocket.organisms import init_seed, reorder

    rows = torch.arange(40).view(10, 4)
    labels = rows + 100
    assert init_seed(5, 0) == 5 and len({init_seed(5, k) for k in (0, 1, 2)} | {init_seed(6, 1)}) == 4
    same = reorder(rows, labels, 5, 0, "pretrain")
    assert same[0] is rows and same[1] is labels
    orders = {}
    for organism, stage in ((1, "pretrain"), (1, "sft"), (2, "pretrain")):
        moved, moved_labels = reorder(rows, labels, 5, organism, stage)
        assert torch.equal(moved_labels, moved + 100)  # labels travel with their rows
        assert torch.equal(moved[moved[:, 0].argsort()], rows)  # the same rows, another order
        assert torch.equal(moved, reorder(rows, labels, 5, organism, stage)[0])  # deterministic
        orders[organism, stage] = tuple(moved[:, 0].tolist())
    assert len(set(orders.values())) == 3


# ------------------------------------------------------------------------- an entry checked against its key


def _entry_of(organism: int):
    from moir_lib.pocket.build import cache_key, entry_dir
    from moir_lib.pocket.variants import get_variant

    key = cache_key(get_variant("micro"), organism)
    return key, entry_dir("pocket", key)


def test_an_organism_s_entry_replaced_by_another_s_is_rebuilt_not_served(micro_entry, organism_entry,
                                                                        monkeypatch, caplog):
    """Organism 1's entry copied whole (manifest and checksums intact) into organism 2's folder is organism 1,
    not 2: its provenance is not read, and a build of organism 2 trains it rather than serving organism 1."""
    import importlib
    import logging
    import shutil

    from moir_lib.pocket import provenance

    build_module = importlib.import_module("moir_lib.pocket.build")
    _, entry = _entry_of(2)
    shutil.copytree(organism_entry, entry)
    try:
        with caplog.at_level(logging.WARNING):
            assert provenance("micro", 2) is None
        assert f"pocket cache entry {entry} holds another build (micro organism 1" in caplog.text
        trained = []
        monkeypatch.setattr(build_module, "_build_entry", lambda spec, key, where, organism, name:
                            trained.append((organism, where)) or where)
        assert build("micro", organism=2) == entry and trained == [(2, entry)], "trained, not served"
        assert provenance("micro", 1).entry == organism_entry, "organism 1's own entry stays valid"
    finally:
        shutil.rmtree(entry, ignore_errors=True)


def test_two_organisms_with_the_same_weights_are_refused_wherever_they_are_pooled(micro_entry, organism_entry,
                                                                                 monkeypatch):
    """Organism 2 built as organism 1's very model (its entry valid for its own key: a recipe whose organisms
    coincide) is refused by a chapter's organisms, the pocket report and the book's provenance, before any
    model loads or is measured."""
    import shutil

    from moir_lib.book import pooled_organisms as book_organisms
    from moir_lib.experiments import pocket_report
    from moir_lib.models import check_organisms

    key, entry = _entry_of(2)
    shutil.copytree(organism_entry, entry)
    manifest = json.loads((entry / MANIFEST).read_text())
    (entry / MANIFEST).write_text(json.dumps({**manifest, "key": key, "organism": 2}))
    try:
        same = r"organisms 1 and 2 of micro have the same weights \(model.safetensors SHA-256 [0-9a-f]{16}"
        with pytest.raises(ValueError, match=rf"organisms \[0, 1, 2\] \(as built on this machine\): {same}"):
            check_organisms([0, 1, 2], "pocket-micro")
        assert check_organisms([0, 2], "pocket-micro") == [0, 2]
        monkeypatch.setattr(pocket_report, "pocket_report", lambda *a, **k: pytest.fail("measured"))
        with pytest.raises(ValueError, match=rf"the pocket report of organisms 1, 2 .*{same}"):
            pocket_report.pocket_reports("micro", (1, 2))
        with pytest.raises(ValueError, match=rf"the book's provenance table: {same}"):
            book_organisms.provenance_table((0, 1, 2), "micro")
    finally:
        shutil.rmtree(entry, ignore_errors=True)


def test_a_killed_build_leaves_no_temporary_folder_behind(tmp_path, monkeypatch):
    """A build killed (SIGKILL) while it trains leaves its temporary folder in the cache; the next build of
    that entry removes it, and leaves nothing of its own."""
    import importlib
    import subprocess
    import sys
    import textwrap

    build_module = importlib.import_module("moir_lib.pocket.build")
    monkeypatch.setenv("MOIR_CACHE", str(tmp_path))
    child = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import importlib, os, signal
        build = importlib.import_module("moir_lib.pocket.build")
        def train(spec, out, organism):
            (out / "model.safetensors").write_bytes(b"half a model")
            os.kill(os.getpid(), signal.SIGKILL)
        build._train = train
        build.build("micro", organism=5)
    """)], env={**os.environ, "MOIR_CACHE": str(tmp_path)}, capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-2000:]
    _, entry = _entry_of(5)
    left = list(entry.parent.glob(f".{entry.name}.tmp-*"))
    assert left and (left[0] / "model.safetensors").is_file(), "the kill came mid-build"

    def train(spec, out, organism):
        (out / "model.safetensors").write_bytes(b"a model")
        return {"variant": spec.name, "organism": organism, "timings": {"build_s": 0.0}}

    monkeypatch.setattr(build_module, "_train", train)
    assert build("micro", organism=5) == entry and verify(entry) is not None
    assert sorted(p.name for p in entry.parent.iterdir() if p.name.startswith(".")) == [f".{entry.name}.lock"]


def test_training_logs_steps_pace_and_remaining_time_at_most_every_interval(monkeypatch, caplog):
    """A log file's sign of life during a build: a line per :data:`PROGRESS_EVERY_S` (0 here: every step
    but the last) with the step, tokens/s, elapsed and remaining time; none at the default 30 s pace
    within a fraction of a second."""
    import logging

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from moir_lib.pocket import train

    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    torch.manual_seed(0)
    rows = torch.randint(0, 32, (8, 6))
    with caplog.at_level(logging.INFO, logger=train.__name__):
        train.fit(LlamaForCausalLM(config), rows, rows.clone(), 2, 1e-3, 0.1, "toy", "float32")
    assert [r for r in caplog.messages if "step" in r and "remaining" in r] == []
    caplog.clear()
    monkeypatch.setattr(train, "PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger=train.__name__):
        train.fit(LlamaForCausalLM(config), rows, rows.clone(), 2, 1e-3, 0.1, "toy", "float32")
    lines = [r for r in caplog.messages if "remaining" in r]
    assert [line.split(" (")[0] for line in lines] == ["toy: step 1/4", "toy: step 2/4", "toy: step 3/4"]
    assert all("tokens/s" in line and "elapsed" in line and "loss" in line for line in lines)
