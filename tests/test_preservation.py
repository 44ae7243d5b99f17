"""Preservation suites: the paper's real lm-eval configs on the original-format files, S_p, provenance, CLI.

The end-to-end run uses the micro pocket model when it is already built in the cache (it is
never built here), else a tiny random Llama with a byte-level BPE, and a small ``limit``.
The original-format files are the repository's ``data/slices`` (``slices`` fixture). Every test runs
under a SIGALRM deadline so that nothing can hang the suite.
"""

from __future__ import annotations

import contextlib
import csv
import json
import signal
from pathlib import Path

import datasets
import pandas as pd
import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from moir_lib.evaluation import preservation as P
from moir_lib.evaluation.humaneval import ALLOW_ENV, CodeExecutionNotAllowed, HumanEvalSettings
from moir_lib.evaluation.scores import PAPER_PRESERVATION_TASKS, harmonic_mean

LIMIT = 2
DEADLINE_S = 60


@contextlib.contextmanager
def deadline(seconds: int):
    def expired(signum, frame):
        raise TimeoutError(f"exceeded its {seconds} s deadline")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _deadline():
    with deadline(DEADLINE_S):
        yield


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (any text round-trips), BOS-prefixing, trained in milliseconds."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["Question: What is 2 + 3?\nAnswer: 5", "def add(a, b):\n    return a + b\n",
              "The following are multiple choice questions (with answers)."] * 30
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def tiny_llama(seed: int = 0) -> tuple[transformers.LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = byte_tokenizer()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval(), tok


def cached_micro():
    """The micro pocket model if a verified build is already cached (never builds), else None."""
    try:
        from moir_lib.cache import entry_dir
        from moir_lib.pocket import load
        from moir_lib.pocket.build import cache_key, verify
        from moir_lib.pocket.variants import get_variant
    except ImportError:
        return None
    if verify(entry_dir("pocket", cache_key(get_variant("micro")))) is None:
        return None
    return load("micro")


# --------------------------------------------------------------------------- planning (no model)


def test_plan_validates_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(ValueError, match="unknown suite 'papers'"):
        P.plan_suite("papers")
    with pytest.raises(ValueError, match=r"unknown paper task\(s\) \['mmlu_pro'\]"):
        P.plan_suite("paper", ["mmlu_pro"])
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="limit must be a positive integer"):
            P.plan_suite("paper", ["winogrande"], limit=bad)
    with pytest.raises(ValueError, match="paper suite only"):
        P.plan_suite("pocket", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="data directory not found"):
        P.plan_suite("paper", ["winogrande"], data_dir=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"arc_challenge: expected one ARC-Challenge-Test\*\.jsonl"):
        P.plan_suite("paper", ["arc_challenge"], data_dir=tmp_path)
    with pytest.raises(CodeExecutionNotAllowed):
        P.plan_suite("paper")  # HumanEval runs model-written code: opt-in first
    plan = P.plan_suite("paper", ["winogrande", "mmlu"])  # no HumanEval, no opt-in needed
    assert [t.key for t in plan.tasks] == ["mmlu", "winogrande"] and not plan.complete
    assert P.plan_suite("paper", allow_code_eval=True).complete
    assert P.plan_suite("pocket").complete and not P.plan_suite("pocket").needs_code_execution


def test_suites_match_the_paper_metrics():
    got = {(t.label, t.metric_key) for t in P.PAPER_TASKS}
    assert got == {("MMLU", "acc,none"), ("GSM8K", "exact_match,strict-match"),
                   ("HellaSwag", "acc_norm,none"), ("WinoGrande", "acc,none"), ("ARC-C", "acc_norm,none"),
                   ("HumanEval", "pass@1,none")}
    assert tuple(t.label for t in P.PAPER_TASKS) == PAPER_PRESERVATION_TASKS


# --------------------------------------------------------------------------- schema mapping


def test_arc_original_schema_maps_to_the_hub_schema():
    def item(id_, stem, labels, key):
        choices = [{"text": f"{stem}-{label}", "label": label} for label in labels]
        return {"id": id_, "question": {"stem": stem, "choices": choices}, "answerKey": key}

    original = datasets.Dataset.from_list([item("a", "Which?", "AB", "B"), item("b", "Num?", "12", "1")])
    hub = P.arc_docs(original)
    assert sorted(hub.column_names) == ["answerKey", "choices", "id", "question"]
    assert hub[0]["question"] == "Which?"
    assert hub[0]["choices"] == {"text": ["Which?-A", "Which?-B"], "label": ["A", "B"]}
    assert hub[1]["choices"]["label"].index(hub[1]["answerKey"]) == 0
    assert P.arc_docs(hub) is hub  # the hub schema passes through
    with pytest.raises(ValueError, match="needs answerKey"):
        P.arc_docs(datasets.Dataset.from_list([{"question": "q"}]))


def test_mmlu_csv_is_read_as_strings_and_mapped(tmp_path):
    path = tmp_path / "toy_test.csv"
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([["What is 1/2?", "0.50", "2", "None", "NA", "A"],
                                  ["Pick", "a, b", "c", "d", "e", "d"]])
    cfg = P.configs._derive({"task": "mmlu_toy", "metadata": {}}, "csv", {"test": str(path)}, P.mmlu_docs,
                    test_split="test", csv_columns=P.MMLU_CSV_COLUMNS)
    raw = datasets.load_dataset(cfg["dataset_path"], **cfg["dataset_kwargs"])["test"]
    docs = cfg["process_docs"](raw)
    assert docs[0]["choices"] == ["0.50", "2", "None", "NA"], "cells must stay verbatim strings"
    assert docs[0]["answer"] == 0 and docs[1]["answer"] == 3 and docs[1]["choices"][0] == "a, b"
    bad = datasets.Dataset.from_list([{"question": "q", "A": "1", "B": "2", "C": "3", "D": "4",
                                       "answer": "E"}])
    with pytest.raises(ValueError, match="not one of A, B, C, D"):
        P.mmlu_docs(bad, subject="toy")
    with pytest.raises(ValueError, match="needs A, B, C, D"):
        P.mmlu_docs(datasets.Dataset.from_list([{"question": "q", "answer": "A"}]))


def test_other_original_files_are_checked():
    with pytest.raises(ValueError, match="hellaswag: .* needs ctx_a, ctx_b, endings"):
        P.hellaswag_docs(datasets.Dataset.from_list([{"activity_label": "x", "label": 0}]))
    with pytest.raises(ValueError, match="winogrande: .* needs option1, option2"):
        P.winogrande_docs(datasets.Dataset.from_list([{"sentence": "a _ b", "answer": "1"}]))
    ints = datasets.Dataset.from_list([{"sentence": "a _ b", "option1": "x", "option2": "y", "answer": 2}])
    assert P.winogrande_docs(ints)[0]["answer"] == "2"
    with pytest.raises(ValueError, match="gsm8k: .* needs answer"):
        P.gsm8k_docs(datasets.Dataset.from_list([{"question": "q"}]))


def test_hub_format_results_become_tidy_rows():
    """The hub path (no data_dir) reads lm-eval's own ``mmlu`` group; shaped as lm-eval 0.4 returns it."""
    raw = {
        "results": {
            "mmlu": {"acc,none": 0.6, "acc_stderr,none": 0.01, "alias": "mmlu"},
            "mmlu_stem": {"acc,none": 0.5, "acc_stderr,none": 0.02, "alias": " - stem"},
            "mmlu_anatomy": {"acc,none": 0.7, "acc_stderr,none": 0.04, "alias": "  - anatomy"},
            "mmlu_astronomy": {"acc,none": 0.5, "acc_stderr,none": 0.04, "alias": "  - astronomy"},
            "gsm8k": {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.05,
                      "exact_match,flexible-extract": 0.3, "exact_match_stderr,flexible-extract": "N/A"},
        },
        "versions": {"mmlu": 2, "mmlu_stem": 2, "mmlu_anatomy": 1.0, "mmlu_astronomy": 1.0, "gsm8k": 3.0},
        "n-shot": {"mmlu_anatomy": 0, "mmlu_astronomy": 0, "gsm8k": 5},
        "n-samples": {"mmlu_anatomy": {"original": 135, "effective": 135},
                      "mmlu_astronomy": {"original": 152, "effective": 152},
                      "gsm8k": {"original": 1319, "effective": 1319}},
        "configs": {"gsm8k": {"dataset_path": "openai/gsm8k", "dataset_name": "main"},
                    "mmlu_abstract_algebra": {"dataset_path": "cais/mmlu"}},
    }
    plan = P.plan_suite("paper", ["mmlu", "gsm8k"])
    rows, prov = P.lm_eval_rows(plan, raw)
    table = pd.DataFrame(rows)
    mmlu = table[table.task == "mmlu"].iloc[0]
    assert (mmlu.value, mmlu.stderr, mmlu.n, mmlu.version) == (0.6, 0.01, 287, 2)
    assert {"mmlu_stem", "mmlu_anatomy", "mmlu_astronomy"} <= set(table.task)
    strict = table[(table.task == "gsm8k") & (table["filter"] == "strict-match")].iloc[0]
    assert (strict.value, strict.n) == (0.25, 1319)
    flexible = table[(table.task == "gsm8k") & (table["filter"] == "flexible-extract")].iloc[0]
    assert flexible.stderr is None or pd.isna(flexible.stderr)
    assert prov["sources"] == {"mmlu": "cais/mmlu", "gsm8k": "openai/gsm8k/main"}
    assert prov["num_fewshot"] == {"mmlu": 0, "gsm8k": 5}
    del raw["results"]["gsm8k"]["exact_match,strict-match"]
    with pytest.raises(RuntimeError, match="no exact_match,strict-match for gsm8k"):
        P.lm_eval_rows(plan, raw)


# --------------------------------------------------------------------------- derived configs


@pytest.fixture(scope="module")
def derived(slices):
    with deadline(120):  # the first TaskManager scans ~15k built-in YAMLs
        manager = P.configs._task_manager()
        return manager, P.offline_task_configs(slices, manager=manager)


KEPT = ("task", "output_type", "doc_to_text", "doc_to_target", "doc_to_choice", "metric_list", "filter_list",
        "generation_kwargs", "num_fewshot", "target_delimiter", "fewshot_delimiter", "description")


def test_offline_configs_keep_the_builtin_definitions(derived, slices):
    manager, configs = derived
    assert set(configs) == {"mmlu", "gsm8k", "hellaswag", "winogrande", "arc_challenge"}
    assert len(configs["mmlu"]) == 4
    for cfgs in configs.values():
        for cfg in cfgs:
            builtin = P.builtin_task_config(cfg["task"], manager)
            for field in KEPT:
                assert cfg.get(field) == builtin.get(field), f"{cfg['task']}: {field} changed"
            assert cfg["dataset_path"] in ("json", "csv") and cfg["dataset_path"] != builtin["dataset_path"]
            files = cfg["dataset_kwargs"]["data_files"]
            assert all(Path(f).is_relative_to(slices.resolve()) for f in files.values())
            assert callable(cfg["process_docs"]) and cfg["training_split"] is None
    assert configs["gsm8k"][0]["fewshot_split"] == "test" and configs["gsm8k"][0]["num_fewshot"] == 5
    assert configs["mmlu"][0]["fewshot_split"] == "dev"


def test_offline_documents_render_like_the_hub_copies(derived, slices):
    from lm_eval.api.task import ConfigurableTask

    _, configs = derived
    bench = slices / "benchmarks"
    raw_arc = [json.loads(line) for line in (bench / "arc_challenge" / "ARC-Challenge-Test_100.jsonl").open()]
    arc = ConfigurableTask(config=configs["arc_challenge"][0])
    docs = list(arc.test_docs())
    assert len(docs) == len(raw_arc) == 100
    numeric = next(i for i, d in enumerate(raw_arc) if d["question"]["choices"][0]["label"] == "1")
    for i in (0, numeric):
        raw = raw_arc[i]
        assert arc.doc_to_text(docs[i]) == f"Question: {raw['question']['stem']}\nAnswer:"
        labels = [c["label"] for c in raw["question"]["choices"]]
        assert arc.doc_to_target(docs[i]) == labels.index(raw["answerKey"])
        assert arc.doc_to_choice(docs[i]) == [c["text"] for c in raw["question"]["choices"]]

    cfg = next(c for c in configs["mmlu"] if c["task"] == "mmlu_world_religions")
    mmlu = ConfigurableTask(config=cfg)
    rows = list(csv.reader((bench / "mmlu" / "test" / "world_religions_test.csv").open(newline="")))
    doc = list(mmlu.test_docs())[0]
    question, a, b, c, d, answer = rows[0]
    assert mmlu.doc_to_text(doc) == f"{question.strip()}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:"
    assert mmlu.doc_to_target(doc) == "ABCD".index(answer) and doc["subject"] == "world_religions"
    assert len(list(mmlu.fewshot_docs())) == 5  # the dev file

    hella = ConfigurableTask(config=configs["hellaswag"][0])
    raw_h = json.loads((bench / "hellaswag" / "val_100.jsonl").open().readline())
    doc = list(hella.validation_docs())[0]
    assert hella.doc_to_target(doc) == int(raw_h["label"]) and len(hella.doc_to_choice(doc)) == 4
    assert hella.doc_to_text(doc).startswith(raw_h["activity_label"] + ":")


# --------------------------------------------------------------------------- the offline paper suite


@pytest.fixture(scope="module")
def offline_run(slices):
    torch.set_num_threads(1)  # two cores, shared with a training job
    with deadline(240):
        micro = cached_micro()
        model, tokenizer = micro if micro is not None else tiny_llama()
        settings = P.PreservationSettings("paper", data_dir=slices, limit=LIMIT, batch_size=8,
                                          gen_kwargs={"max_gen_toks": 8}, allow_code_eval=True,
                                          humaneval=HumanEvalSettings(max_new_tokens=8))
        result = P.evaluate_preservation(model, tokenizer, settings)
    return model, result


def test_offline_paper_suite_produces_every_metric(offline_run):
    _, result = offline_run
    table = result.table
    assert list(table.columns) == list(P.TABLE_COLUMNS)
    headline = table[table.in_score]
    assert sorted(headline.score_name) == sorted(PAPER_PRESERVATION_TASKS)
    for t in P.PAPER_TASKS:
        row = headline[headline.task == t.key]
        assert len(row) == 1, t.key
        assert (row.metric.item(), row["filter"].item()) == (t.metric, t.filter)
        assert 0.0 <= row.value.item() <= 1.0
        assert row.n.item() == (4 * LIMIT if t.key == "mmlu" else LIMIT)
    # every metric lm-eval defines for these tasks is in the table
    produced = set(zip(table.task, table.metric, table["filter"], strict=True))
    assert {("gsm8k", "exact_match", "flexible-extract"), ("hellaswag", "acc", "none"),
            ("arc_challenge", "acc", "none")} <= produced
    assert len(table[table.task.str.startswith("mmlu_")]) == 4
    assert table.value.notna().all() and table.limited.all()
    scores = result.summary["scores"]
    assert set(scores) == set(PAPER_PRESERVATION_TASKS)
    assert result.summary["S_p"] == pytest.approx(harmonic_mean(scores))
    assert result.score.components == scores


def test_offline_run_records_provenance_and_saves(offline_run, slices, tmp_path):
    from moir_lib.models import model_fingerprint
    from moir_lib.results import git_hash, read_summary

    model, result = offline_run
    s = result.summary
    assert s["limited"] is True and s["limit"] == LIMIT and any("limit=2" in w for w in s["warnings"])
    assert s["model_fingerprint"] == model_fingerprint(model) and s["git_hash"] == git_hash()
    assert s["task_versions"]["gsm8k"] == P.builtin_task_config("gsm8k")["metadata"]["version"]
    assert set(s["task_versions"]) >= {t.key for t in P.PAPER_TASKS}
    assert s["num_fewshot"]["gsm8k"] == 5 and s["num_fewshot"]["arc_challenge"] == 0
    assert s["sources"]["humaneval"].startswith(str(slices.resolve()))
    assert s["settings"]["request_cache"] is None
    assert s["settings"]["humaneval"]["temperature"] == 0.2 and s["settings"]["humaneval"]["top_p"] == 0.95
    assert result.humaneval is not None and len(result.humaneval.per_sample) == LIMIT

    path = result.save(tmp_path, {"note": "test"})
    saved = read_summary(tmp_path)
    assert path.name == "summary.json" and saved["chapter"] == "eval"
    assert saved["headline"]["S_p"] == pytest.approx(s["S_p"]) and saved["parameters"] == {"note": "test"}
    back = pd.read_parquet(tmp_path / "preservation.parquet")
    pd.testing.assert_frame_equal(back, result.table, check_dtype=False)
    assert len((tmp_path / "humaneval_records.jsonl").read_text().splitlines()) == LIMIT
    assert "results" in json.loads((tmp_path / "lm_eval_results.json").read_text())


def test_request_cache_is_keyed_by_the_weights(slices, tmp_path):
    from moir_lib.models import model_fingerprint

    torch.set_num_threads(1)
    model, tok = tiny_llama(seed=1)
    settings = P.PreservationSettings("paper", tasks=["winogrande"], data_dir=slices, limit=LIMIT,
                                      cache_dir=tmp_path)
    import random

    random.seed(7)
    torch.manual_seed(7)
    expected = (random.random(), torch.rand(1))
    random.seed(7)
    torch.manual_seed(7)
    first = P.evaluate_preservation(model, tok, settings)
    assert (random.random(), torch.rand(1)) == expected, "lm-eval's reseeding must not leak to the caller"
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.add_(0.5)  # "edit" the model
    second = P.evaluate_preservation(model, tok, settings)
    caches = [r.summary["settings"]["request_cache"] for r in (first, second)]
    assert caches[0] != caches[1]
    assert caches[1].endswith(model_fingerprint(model)) and first.summary["model_fingerprint"] in caches[0]
    assert len(list((tmp_path / "lm_eval").glob("paper-*.db"))) == 2
    assert first.summary["S_p"] is None and second.summary["scores"].keys() == {"WinoGrande"}


# --------------------------------------------------------------------------- moir eval


def _tiny_profile(tmp_path: Path) -> Path:
    model, tok = tiny_llama(seed=2)
    folder = tmp_path / "tiny-model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    micro = (Path(__file__).resolve().parents[1] / "data" / "profiles" / "pocket-micro.yaml").read_text()
    text = micro.replace("name: pocket-micro", "name: tiny-test").replace(
        "model: pocket-micro ", f"model: {folder} ")
    path = tmp_path / "tiny-test.yaml"
    path.write_text(text)
    return path


def test_moir_eval_validates_before_loading_the_model(tmp_path, monkeypatch, capsys):
    from moir_lib import models
    from moir_lib.cli import main

    def boom(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(models, "load", boom)
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    profile = str(_tiny_profile(tmp_path))
    cases = [
        (["--profile", "no-such-profile", "--suite", "pocket"], "no profile 'no-such-profile'"),
        (["--profile", profile, "--suite", "paper", "--tasks", "winogrande", "--data-dir",
          str(tmp_path / "x")], "data directory not found"),
        (["--profile", profile, "--suite", "paper", "--tasks", "gsm8k", "--data-dir", str(tmp_path)],
         "gsm8k: expected one test*.jsonl"),
        (["--profile", profile, "--suite", "paper"], "MOIR_ALLOW_CODE_EVAL=1"),
        (["--profile", profile, "--suite", "pocket", "--tasks", "mmlu"], "unknown pocket task"),
        (["--profile", profile, "--suite", "pocket", "--data-dir", str(tmp_path)], "paper suite only"),
        (["--profile", profile, "--suite", "pocket", "--batch-size", "zero"], "--batch-size"),
    ]
    for argv, message in cases:
        assert main(["eval", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        main(["eval", "--profile", profile, "--suite", "paper", "--limit", "0"])
    with pytest.raises(SystemExit):
        main(["eval", "--profile", profile, "--suite", "harness"])


def test_moir_eval_writes_summary_and_table(slices, tmp_path, capsys):
    from moir_lib.cli import main
    from moir_lib.results import read_summary

    torch.set_num_threads(1)
    out = tmp_path / "run"
    argv = ["eval", "--profile", str(_tiny_profile(tmp_path)), "--suite", "paper", "--tasks",
            "winogrande,arc_challenge", "--data-dir", str(slices), "--limit", str(LIMIT),
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "S_p not computed (partial suite)" in printed and "LIMITED" in printed
    summary = read_summary(out)
    assert summary["parameters"]["profile"] == "tiny-test" and summary["parameters"]["limit"] == LIMIT
    assert set(summary["headline"]["scores"]) == {"WinoGrande", "ARC-C"} and summary["headline"]["limited"]
    table = pd.read_csv(out / "preservation.csv")
    assert set(table.task) == {"winogrande", "arc_challenge"} and (table.n == LIMIT).all()


@pytest.mark.slow
def test_moir_eval_pocket_suite_on_the_micro_model(tmp_path, monkeypatch, capsys):
    """Builds the micro pocket model in a private cache (tens of seconds), then `moir eval --suite pocket`."""
    from moir_lib.cli import main
    from moir_lib.results import read_summary

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    out = tmp_path / "pocket"
    with deadline(600):
        assert main(["eval", "--profile", "pocket-micro", "--suite", "pocket", "--limit", "4", "--out",
                     str(out)]) == 0
    headline = read_summary(out)["headline"]
    assert set(headline["scores"]) == {"facts", "arith", "prose", "code"}
    assert headline["S_p"] == pytest.approx(harmonic_mean(headline["scores"]))
    table = pd.read_parquet(out / "preservation.parquet")
    assert set(table.task) == {t.key for t in P.POCKET_TASKS} and (table.n == 4).all()
    assert "S_p =" in capsys.readouterr().out

