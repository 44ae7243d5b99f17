"""``moir edit``: inputs refused before the model loads; batch and sequential runs write summary.json; a run
is the chapters' Lab run of the same point."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from tiny import LAYERS, OBJECTS, SUBJECTS, fact, facts_covariance, facts_model, facts_model_dir

from moir_lib import models
from moir_lib.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """A profile of the facts model, ROME-format records and a saved covariance."""
    root = tmp_path_factory.mktemp("edit")
    folder = facts_model_dir()
    base = yaml.safe_load((Path(__file__).parents[1] / "data" / "profiles" / "pocket-micro.yaml").read_text())
    base.update({"name": "facts", "model": str(folder), "edit_layers": LAYERS})
    base["memit"].update({"lambda": 1.0, "lambda_mode": "relative", "v_num_grad_steps": 25})
    base["alphaedit"].update({"tau": 1e-3, "tau_mode": "relative"})
    profile = root / "facts.yaml"
    profile.write_text(yaml.safe_dump(base))
    records = []
    for i, s in enumerate(SUBJECTS):
        true = fact(s, "home of")
        others = [x for x in SUBJECTS if x != s and fact(x, "home of") == true][:2]
        records.append({"case_id": i, "requested_rewrite": {
            "prompt": "home of {}", "subject": s, "relation_id": "P1",
            "target_new": {"str": OBJECTS[(OBJECTS.index(true) + 1) % len(OBJECTS)]},
            "target_true": {"str": true}},
            "paraphrase_prompts": [f"the a . home of {s}"],
            "neighborhood_prompts": [f"home of {x}" for x in others],
            "generation_prompts": [f"home of {s}"]})
    rec_path = root / "records.json"
    rec_path.write_text(json.dumps(records))
    stats = facts_covariance(facts_model(), LAYERS)
    cov = stats.save(root / "cov.safetensors")
    return {"root": root, "profile": profile, "records": rec_path, "cov": cov}


def run(setup, *extra: str, out: str = "out") -> int:
    return main(["edit", "--profile", str(setup["profile"]), "--records", str(setup["records"]),
                 "--out", str(setup["root"] / out), "--context-templates", "0", *extra])


def test_bad_inputs_are_refused_before_the_model_loads(setup, monkeypatch, capsys) -> None:
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    base = ["--editor", "memit", "--regime", "batch", "--n-edits", "4"]
    cov = str(setup["cov"])

    def refused(*args: str) -> str:
        assert run(setup, *args) == 2
        return capsys.readouterr().err

    assert "--lambda must be > 0, got 0.0" in refused(*base, "--cov", cov, "--lambda", "0")
    assert "--tau must lie in (0, ∞), got inf" in refused(*base, "--cov", cov, "--tau", "inf")
    assert "--n-edits 40 but" in refused("--editor", "memit", "--regime", "batch", "--n-edits", "40",
                                         "--cov", cov)
    assert "no such file, and not one of wiki, moir" in refused(*base, "--cov", str(setup["root"] / "nope"))
    assert "belong to --regime sequential" in refused(*base, "--cov", cov, "--batch-size", "2")
    # τ leaving an empty null space: AlphaEdit's projector is built before loading
    err = refused("--editor", "alphaedit", "--regime", "batch", "--n-edits", "4", "--cov", cov,
                  "--tau", "1e-30", "--tau-mode", "relative")
    assert "empty null space" in err and "spectrum of C" in err
    # a covariance of another width, of other layers, and a non-PSD one
    from moir_lib.covariance import CovarianceStats

    narrow = CovarianceStats(LAYERS, 64)
    for layer in LAYERS:
        narrow.update(layer, torch.randn(100, 64))
    assert "has width 64 but" in refused(*base, "--cov",
                                         str(narrow.save(setup["root"] / "narrow.safetensors")))
    other = CovarianceStats([2], 128)
    other.update(2, torch.randn(10, 128))
    assert "missing [0, 1]" in refused(*base, "--cov", str(other.save(setup["root"] / "other.safetensors")))
    bad = CovarianceStats(LAYERS, 128)
    for layer in LAYERS:
        bad.update(layer, torch.randn(300, 128))
    bad.flush()
    bad._acc[1] = bad._acc[1] - 400 * torch.eye(128, dtype=torch.float64)
    err = refused(*base, "--cov", str(bad.save(setup["root"] / "bad.safetensors")))
    assert "C of layer 1 is not positive semi-definite: smallest eigenvalue" in err
    argv = ["--editor", "memit", "--regime", "batch", "--n-edits", "4", "--cov", cov]
    assert main(["edit", "--profile", str(setup["profile"]), *argv, "--out",
                 str(setup["root"] / "o")]) == 2
    assert "--records is required" in capsys.readouterr().err


@pytest.mark.parametrize("editor", ["memit", "alphaedit"])
def test_batch_run_writes_summary_with_metrics_and_timings(setup, editor: str) -> None:
    code = run(setup, "--editor", editor, "--regime", "batch", "--n-edits", "6", "--cov", str(setup["cov"]),
               "--no-fluency", out=f"batch-{editor}")
    assert code == 0
    out = setup["root"] / f"batch-{editor}"
    summary = json.loads((out / "summary.json").read_text())
    head = summary["headline"]
    assert head["editor"] == editor and head["n_edits"] == 6 and head["regime"] == "batch"
    assert head["ES"] >= 5 / 6 and head["pre_edit"]["ES"] == 0.0
    for key in ("PS", "NS", "Efficacy", "Generalization", "Specificity", "S_e"):
        assert key in head
    assert head["timings"]["total_s"] > 0 and "edit_values_s" in head["timings"]
    assert head["edit"]["z_final_loss_mean"] < 1.0
    params = summary["parameters"]
    assert params["cov"]["cov"] == "file" and params["editor"]["editor"] == editor
    assert params["templates"][0] == ["{}"] and params["n_edits"] == 6
    if editor == "alphaedit":
        assert params["projector"]["0"]["tau_mode"] == "relative" and params["projector"]["0"]["null_dim"] > 0
    else:
        assert head["edit"]["layers"][0]["lambda_eff"] > 0
    rows = (out / "requests.csv").read_text().splitlines()
    assert rows[0].startswith("case_id,") and len(rows) == 7


def test_sequential_run_evaluates_at_milestones_and_resumes(setup) -> None:
    args = ["--editor", "memit", "--regime", "sequential", "--n-edits", "4", "--cov", str(setup["cov"]),
            "--batch-size", "1", "--milestones", "2", "--no-fluency"]
    assert run(setup, *args, out="seq") == 0
    first = json.loads((setup["root"] / "seq" / "summary.json").read_text())["headline"]
    assert [m["n_edits"] for m in first["milestones"]] == [2, 4] and first["resumed_from"] is None
    assert (setup["root"] / "seq" / "milestones.csv").is_file()
    assert run(setup, *args, out="seq") == 0  # finished: resumes from the last checkpoint, same numbers
    again = json.loads((setup["root"] / "seq" / "summary.json").read_text())["headline"]
    assert again["resumed_from"] == 4 and again["milestones"] == first["milestones"]


def test_moir_edit_scores_the_chapters_point(tmp_path) -> None:
    """``moir edit`` is the Lab's run: on the micro pocket model it edits the chapters' records with their C,
    editor and evaluation, so its headline equals the Lab's rows of the same point."""
    from moir_lib.experiments import EvalSettings, ExperimentSpec, Lab, PointStore

    out = tmp_path / "cli"
    assert main(["edit", "--profile", "pocket-micro", "--editor", "memit", "--cov", "wiki", "--regime",
                 "batch", "--n-edits", "3", "--n-eval", "2", "--max-gen-tokens", "4", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    lab = Lab("pocket-micro", PointStore(tmp_path / "lab", shared=False),
              evaluation=EvalSettings(n_eval=2, max_gen_tokens=4))
    rows = lab.compute(ExperimentSpec("memit", "batch", "wiki", 3), groups=("edit",))
    values = {m: (None if math.isnan(v) else v) for m, v in zip(rows["metric"], rows["value"], strict=True)}
    head = summary["headline"]
    shown = ("ES", "PS", "NS", "Efficacy", "Generalization", "Specificity", "Fluency*", "Portability", "S_e")
    for metric in shown:
        assert head[metric] == values[metric], metric
    assert head["n_records"] == 2 and head["pre_edit"]["n_records"] == 2  # the chapters' evenly spaced subset
    assert summary["parameters"]["evaluation"]["n_eval"] == 2
    assert (out / "counterfact_pre_metrics.json").is_file() and (out / "counterfact_metrics.json").is_file()


def test_moir_edit_ns_leaves_out_the_runs_own_subjects_unless_asked(tmp_path, capsys) -> None:
    """Pocket CounterFact names every neighbour's subject: by default NS skips the neighbours edited in the
    same run (NS_all keeps them); ``--ns-neighbours all`` scores them all, as MEMIT's evaluation code does."""
    import pandas as pd

    def edit(name: str, *flags: str) -> tuple[dict, pd.DataFrame]:
        out = tmp_path / name
        assert main(["edit", "--profile", "pocket-micro", "--editor", "memit", "--cov", "wiki", "--regime",
                     "batch", "--n-edits", "12", "--n-eval", "all", "--no-fluency", "--pres-limit", "30",
                     "--out", str(out), *flags]) == 0
        return (json.loads((out / "counterfact_metrics.json").read_text()),
                pd.read_parquet(out / "counterfact_records.parquet"))

    # beyond the facts task's first 50 records the micro world has too few for 12 edits: said up front
    assert main(["edit", "--profile", "pocket-micro", "--editor", "memit", "--cov", "wiki", "--regime",
                 "batch", "--n-edits", "12", "--out", str(tmp_path / "refused")]) == 2
    assert "a smaller --pres-limit frees more" in capsys.readouterr().err
    metrics, records = edit("default")
    assert metrics["settings"]["n_edited_subjects"] == records["subject"].nunique()
    assert records["n_neighbours_edited"].sum() > 0  # 12 edits in a 24-person world meet their neighbours
    pre = json.loads((tmp_path / "default" / "counterfact_pre_metrics.json").read_text())
    assert pre["settings"]["n_edited_subjects"] == 0  # the unedited model: every neighbour counts
    every, records_all = edit("all", "--ns-neighbours", "all")
    assert every["settings"]["n_edited_subjects"] == 0 and records_all["n_neighbours_edited"].sum() == 0
    assert records_all["NS"].equals(records_all["NS_all"]) and records_all["NS_all"].equals(records["NS_all"])


def test_set_changes_the_profile_and_bad_settings_are_refused_before_the_model_loads(
        setup, monkeypatch, capsys) -> None:
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    base = ["--editor", "alphaedit", "--regime", "batch", "--n-edits", "4", "--cov", str(setup["cov"])]
    with pytest.raises(SystemExit):
        run(setup, *base, "--set", "organism")
    assert "expected KEY=VALUE such as organism=3, got 'organism'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(setup, *base, "--set", "alphaedit.tau_grid=[0.5,")
    assert "--set alphaedit.tau_grid: the value is not YAML" in capsys.readouterr().err
    assert run(setup, *base, "--set", "nosuch.tau=1") == 2
    assert "override 'nosuch.tau': 'nosuch' is not a section" in capsys.readouterr().err
    # the profile's τ (1e-3, relative) leaves a null space; the one set here empties it, so --set reached
    # the profile that the pre-check reads
    assert run(setup, *base, "--set", "alphaedit.tau=1e-30") == 2
    assert "empty null space" in capsys.readouterr().err
