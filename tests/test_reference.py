"""Our MEMIT/AlphaEdit against the reference implementation's golden case (data/reference),
and that folder as a real checkpoint through the commands (generate, cov estimate, edit)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from moir_lib.cli import main
from moir_lib.editing.reference import REFERENCE_DIR, TOLERANCES, editor_settings


@pytest.fixture(scope="module")
def reference() -> Path:
    return REFERENCE_DIR


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> tuple[int, list[dict]]:
    """``moir check-reference`` with no folder: the repository's case."""
    out = tmp_path_factory.mktemp("ref") / "check.json"
    code = main(["check-reference", "--json", str(out)])
    return code, json.loads(out.read_text())


def test_every_stage_meets_the_reference_tolerance(checked) -> None:
    code, rows = checked
    failed = [r for r in rows if not r["passed"]]
    assert code == 0 and not failed, failed
    assert {r["method"] for r in rows} == {"memit", "alphaedit"}
    assert {r["case"] for r in rows} == {"memit_lambda15000", "memit_lambda10", "alphaedit_tau0.0366"}
    for row in rows:
        assert set(row) == {"method", "case", "stage", "layer", "rel_err", "tolerance", "passed"}
        assert row["tolerance"] == TOLERANCES[row["method"]][row["stage"]]
    stages = {(r["case"], r["stage"], r["layer"]) for r in rows}
    for layer in (1, 2, 3):  # every layer, end to end and closed form
        for stage in ("K", "cur_zs", "resid", "dW", "closed_form_dW"):
            assert ("memit_lambda10", stage, layer) in stages
        for stage in ("projector", "rank", "cache_c", "dW"):
            assert ("alphaedit_tau0.0366", stage, layer) in stages


def test_the_full_z_loop_passes_too_and_fits_the_same_targets(reference: Path, tmp_path: Path,
                                                                checked) -> None:
    """``--z-loop full`` (the reference's own loop: the whole model at every step) passes as the suite's
    loop does, and the two loops' targets agree with the reference to within float32 rounding."""
    folder = _copy(reference, tmp_path / "ref")
    out = tmp_path / "full.json"
    assert main(["check-reference", str(folder), "--z-loop", "full", "--json", str(out)]) == 0
    full = {r["stage"]: r["rel_err"] for r in json.loads(out.read_text()) if r["layer"] in (3, None)}
    auto = {r["stage"]: r["rel_err"] for r in checked[1] if r["case"] == "memit_lambda15000"
            and r["layer"] in (3, None)}
    assert abs(full["z"] - auto["z"]) < 1e-6 and full["target_ids"] == auto["target_ids"] == 0


def _copy(reference: Path, dst: Path, cases: tuple[str, ...] = ("memit_lambda15000",)) -> Path:
    """A reference folder with only ``cases`` (the model linked, not copied)."""
    (dst / "expected").mkdir(parents=True)
    (dst / "model").symlink_to(reference / "model")
    shutil.copytree(reference / "inputs", dst / "inputs")
    for case in cases:
        shutil.copy(reference / "expected" / f"{case}.npz", dst / "expected")
    return dst


def test_a_flat_template_mean_fails_the_check(reference: Path, tmp_path: Path, capsys) -> None:
    """The check can fail: keys averaged over the six templates alike (each its own group but
    the first) are not the reference's keys, and the exit code says so."""
    folder = _copy(reference, tmp_path / "flat")
    groups = json.loads((folder / "inputs" / "templates.json").read_text())
    (folder / "inputs" / "templates.json").write_text(json.dumps([groups[0], *[[t] for t in groups[1]]]))
    out = tmp_path / "rows.json"
    assert main(["check-reference", str(folder), "--json", str(out)]) == 1
    rows = json.loads(out.read_text())
    assert not any(r["passed"] for r in rows if r["stage"] in ("K", "dW"))
    assert all(r["passed"] for r in rows if r["stage"] == "closed_form_dW")
    assert "FAILED" in capsys.readouterr().out


def test_incomplete_or_mismatched_folders_are_refused_by_name(reference: Path, tmp_path: Path,
                                                               capsys) -> None:
    folder = _copy(reference, tmp_path / "no-c")
    (folder / "inputs" / "C.npz").unlink()
    assert main(["check-reference", str(folder)]) == 2
    assert "C.npz" in capsys.readouterr().err
    folder = _copy(reference, tmp_path / "no-hparams")
    (folder / "inputs" / "memit_lambda15000.json").unlink()
    assert main(["check-reference", str(folder)]) == 2
    assert "memit_lambda15000.json" in capsys.readouterr().err
    folder = _copy(reference, tmp_path / "narrow")
    with np.load(reference / "inputs" / "C.npz") as f:
        arrays = {k: f[k] for k in f.files}
    arrays["C2"] = arrays["C2"][:100, :100]
    np.savez(folder / "inputs" / "C.npz", **arrays)
    assert main(["check-reference", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "C2" in err and "172" in err


def test_reference_field_names_map_onto_our_configuration() -> None:
    hp = json.loads((REFERENCE_DIR / "inputs" / "alphaedit_tau0.0366.json").read_text())
    s = editor_settings(hp, n_layers=5)
    assert s["layers"] == [1, 2, 3] and s["lambda_"] == 15000.0 and s["tau"] == 0.0366 and s["l2"] == 10.0
    v = s["values"]
    got = (v.num_steps, v.lr, v.weight_decay, v.clamp_norm_factor, v.kl_factor)
    assert got == (25, 0.1, 0.5, 0.75, 0.0625)
    with pytest.raises(ValueError, match="v_loss_layer"):
        editor_settings(hp, n_layers=8)
    with pytest.raises(ValueError, match="fact_token"):
        editor_settings({**hp, "fact_token": "last"}, n_layers=5)


# ----------------------------------------------------------------------------- a real checkpoint


def test_real_checkpoint_runs_generate_cov_and_edit(reference: Path, tmp_path: Path) -> None:
    """stories260K through the same local-folder path as the 8B profiles: nothing in generate,
    cov estimate or edit assumes the pocket tokenizer or its sizes."""
    gen = tmp_path / "gen"
    assert main(["generate", "--profile", "stories260k", "--n-samples", "6", "--max-new-tokens", "8",
                 "--batch-size", "3", "--out", str(gen), "-q"]) == 0
    lines = [json.loads(x) for f in sorted(gen.glob("shard-*.jsonl")) for x in f.read_text().splitlines()]
    assert len(lines) == 6
    cov = tmp_path / "C.safetensors"
    assert main(["cov", "estimate", "--profile", "stories260k", "--corpus", str(gen), "--out", str(cov),
                 "-q"]) == 0
    from moir_lib.covariance import CovarianceStats

    stats = CovarianceStats.load(cov)
    assert list(stats.layers) == [1, 2, 3] and stats.dim == 172 and stats.n_tokens > 0
    requests = json.loads((reference / "inputs" / "requests.json").read_text())
    records = [{"case_id": r["case_id"], "requested_rewrite": {
        "prompt": r["prompt"], "subject": r["subject"], "target_new": {"str": r["target_new"]["str"]},
        "target_true": {"str": r["target_true"]["str"]}},
        "paraphrase_prompts": [f"Then {r['prompt'].format(r['subject'])}"],
        "neighborhood_prompts": [r["prompt"].format(other["subject"])
                                 for other in requests if other["subject"] != r["subject"]][:2]}
        for r in requests]
    rec = tmp_path / "records.json"
    rec.write_text(json.dumps(records))
    out = tmp_path / "edit"
    assert main(["edit", "--profile", "stories260k", "--editor", "memit", "--cov", str(cov),
                 "--regime", "batch", "--n-edits", "4", "--records", str(rec), "--no-fluency",
                 "--context-templates", "2", "--out", str(out)]) == 0
    head = json.loads((out / "summary.json").read_text())["headline"]
    assert head["n_edits"] == 4 and 0.0 <= head["ES"] <= 1.0
