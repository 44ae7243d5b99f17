"""Sequential editing: state and weights persist, milestones, checkpoints, resume, reset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tiny import (
    FIXED_TEMPLATES,
    LAYERS,
    evaluate,
    facts_covariance,
    facts_model,
    facts_model_dir,
    requests,
)

from moir_lib.editing import (
    AlphaEditEditor,
    EditSetup,
    EditState,
    MemitEditor,
    SequentialSchedule,
    WeightSnapshot,
    sequential,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two cores, shared with a training job
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cov():
    return facts_covariance(facts_model(), LAYERS)


def edit_weights(loaded) -> dict[int, torch.Tensor]:
    return {layer: loaded.adapter.weight_of(layer).detach().clone() for layer in LAYERS}


def test_resume_after_a_crash_equals_the_uninterrupted_run(cov, tmp_path: Path) -> None:
    kwargs = {"schedule": SequentialSchedule(batch_size=2, milestones=[2, 4, 6], n_edits=8),
              "setup": EditSetup(templates=FIXED_TEMPLATES)}
    whole = facts_model()
    ref = sequential(whole, MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative"), requests(),
                     evaluate=evaluate, **kwargs)
    assert [m["n_edits"] for m in ref.milestones] == [2, 4, 6, 8]
    assert ref.state.n_edits == 8 and ref.state.n_batches == 4 and ref.resumed_from is None
    assert ref.milestones[-1]["efficacy"] >= 0.75

    def crash_at_6(model, tokenizer, records):
        if len(records) == 6:
            raise RuntimeError("killed")
        return evaluate(model, tokenizer, records)

    ckpt = tmp_path / "ckpt"
    with pytest.raises(RuntimeError, match="killed"):
        sequential(facts_model(), MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative"), requests(),
                   evaluate=crash_at_6, checkpoint_dir=ckpt, **kwargs)
    assert (ckpt / "LATEST").read_text().strip() == "ckpt-0000004"
    assert sorted(p.name for p in ckpt.iterdir()) == ["LATEST", "ckpt-0000004"]  # older ones pruned

    again = facts_model()
    resumed = sequential(again, MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative"), requests(),
                         evaluate=evaluate, checkpoint_dir=ckpt, **kwargs)
    assert resumed.resumed_from == 4
    assert resumed.metrics() == ref.metrics()
    for layer in LAYERS:
        assert torch.equal(again.adapter.weight_of(layer), whole.adapter.weight_of(layer))
        assert torch.equal(resumed.state.kkt_past[layer], ref.state.kkt_past[layer])
    strip = [{k: v for k, v in row.items() if k != "timings"} for row in resumed.per_request]
    assert strip == [{k: v for k, v in row.items() if k != "timings"} for row in ref.per_request]
    # a finished run resumed again does no work and reports the same
    done = sequential(facts_model(), MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative"),
                      requests(),
                      evaluate=evaluate, checkpoint_dir=ckpt, **kwargs)
    assert done.resumed_from == 8 and done.metrics() == ref.metrics()


def test_checkpoint_of_another_run_or_an_edited_model_is_refused(cov, tmp_path: Path) -> None:
    ed = MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative")
    ckpt = tmp_path / "c"
    sequential(facts_model(), ed, requests(),
               schedule=SequentialSchedule(batch_size=2, milestones=[2], n_edits=2),
               setup=EditSetup(templates=FIXED_TEMPLATES), checkpoint_dir=ckpt)
    with pytest.raises(ValueError, match=r"belongs to other edits .*batch_size"):
        sequential(facts_model(), ed, requests(),
                   schedule=SequentialSchedule(batch_size=1, milestones=[2], n_edits=2),
                   setup=EditSetup(templates=FIXED_TEMPLATES), checkpoint_dir=ckpt)
    with pytest.raises(ValueError, match=r"belongs to other edits .*editor"):
        sequential(facts_model(), MemitEditor(cov, LAYERS, lambda_=2.0, lambda_mode="relative"), requests(),
                   schedule=SequentialSchedule(batch_size=2, milestones=[2], n_edits=2),
                   setup=EditSetup(templates=FIXED_TEMPLATES), checkpoint_dir=ckpt)
    edited = facts_model()
    edited.adapter.apply_delta(0, torch.ones_like(edited.adapter.weight_of(0), dtype=torch.float64))
    with pytest.raises(ValueError, match=r"original_weights"):
        sequential(edited, ed, requests(),
                   schedule=SequentialSchedule(batch_size=2, milestones=[2], n_edits=2),
                   setup=EditSetup(templates=FIXED_TEMPLATES), checkpoint_dir=ckpt)


def test_state_save_load_continue_equals_uninterrupted_alphaedit(cov, tmp_path: Path) -> None:
    reqs = requests()
    ed = AlphaEditEditor(cov, LAYERS, tau=1e-3, tau_mode="relative")
    straight = facts_model()
    state = ed.new_state()
    ed.apply(straight, reqs[:3], state, FIXED_TEMPLATES)
    ed.apply(straight, reqs[3:6], state, FIXED_TEMPLATES)

    first = facts_model()
    s1 = ed.new_state()
    ed.apply(first, reqs[:3], s1, FIXED_TEMPLATES)
    s1.save(tmp_path / "state.safetensors")
    weights = edit_weights(first)
    second = facts_model()
    snap = WeightSnapshot(second, LAYERS)
    snap.load(weights)
    s2 = EditState.load(tmp_path / "state.safetensors")
    assert s2.n_edits == 3 and s2.projector_info[0]["tau_mode"] == "relative"
    ed.apply(second, reqs[3:6], s2, FIXED_TEMPLATES)
    for layer in LAYERS:
        assert torch.equal(second.adapter.weight_of(layer), straight.adapter.weight_of(layer))
        assert torch.equal(s2.kkt_past[layer], state.kkt_past[layer])
        assert torch.equal(s2.projectors[layer], state.projectors[layer])
    assert s2.n_edits == state.n_edits == 6 and s2.n_batches == 2
    # K_past matters: continuing from a reset state gives other weights
    third = facts_model()
    WeightSnapshot(third, LAYERS).load(weights)
    s3 = EditState.load(tmp_path / "state.safetensors")
    s3.reset()
    ed.apply(third, reqs[3:6], s3, FIXED_TEMPLATES)
    assert not torch.equal(third.adapter.weight_of(1), straight.adapter.weight_of(1))


def test_reset_restores_the_original_weights_bit_exactly(cov) -> None:
    loaded = facts_model()
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    ed = AlphaEditEditor(cov, LAYERS, tau=1e-3, tau_mode="relative")
    result = sequential(loaded, ed, requests(),
                        schedule=SequentialSchedule(batch_size=3, milestones=[2, 5], n_edits=7),
                        setup=EditSetup(templates=FIXED_TEMPLATES), evaluate=evaluate)
    assert [b["size"] for b in result.batches] == [2, 3, 2]  # batches cut at the milestones
    assert [m["n_edits"] for m in result.milestones] == [2, 5, 7]
    assert not result.snapshot.is_original()
    assert result.summary()["weight_change"][1] > 0
    result.snapshot.restore()
    result.state.reset()
    assert result.snapshot.is_original() and result.state.n_edits == 0 and not result.state.kkt_past
    assert all(torch.equal(v, before[k]) for k, v in loaded.model.state_dict().items())


def test_bad_sequential_arguments(cov) -> None:
    ed = MemitEditor(cov, LAYERS)
    loaded = facts_model()
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        sequential(loaded, ed, requests(), schedule=SequentialSchedule(batch_size=0))
    with pytest.raises(ValueError, match="strictly increasing"):
        sequential(loaded, ed, requests(), schedule=SequentialSchedule(milestones=[5, 2]))
    with pytest.raises(ValueError, match="n_edits = 99 but only 24"):
        sequential(loaded, ed, requests(), schedule=SequentialSchedule(n_edits=99))
    assert WeightSnapshot(loaded, LAYERS).is_original()


KILL_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from tiny import FIXED_TEMPLATES, LAYERS, evaluate, facts_covariance, facts_model, requests
    from moir_lib.editing import EditSetup, MemitEditor, SequentialSchedule, sequential

    def killing(model, tok, records):
        if len(records) == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)
        return evaluate(model, tok, records)

    loaded = facts_model()
    cov = facts_covariance(loaded, LAYERS)
    sequential(loaded, MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative"), requests(),
               schedule=SequentialSchedule(batch_size=2, milestones=[2, 4, 6], n_edits=8),
               setup=EditSetup(templates=FIXED_TEMPLATES), evaluate=killing, checkpoint_dir={ckpt!r})
""")


@pytest.mark.slow
def test_resume_after_sigkill_in_a_subprocess(cov, tmp_path: Path) -> None:
    facts_model_dir()  # trained before the child starts
    ckpt = tmp_path / "k"
    script = KILL_SCRIPT.format(tests=str(Path(__file__).parent), kill_at=6, ckpt=str(ckpt))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    progress = json.loads((ckpt / "ckpt-0000004" / "progress.json").read_text())
    assert progress["position"] == 4
    kwargs = {"schedule": SequentialSchedule(batch_size=2, milestones=[2, 4, 6], n_edits=8),
              "setup": EditSetup(templates=FIXED_TEMPLATES)}
    resumed_model = facts_model()
    resumed = sequential(resumed_model, MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative"),
                         requests(),
                         evaluate=evaluate, checkpoint_dir=ckpt, **kwargs)
    whole = facts_model()
    ref = sequential(whole, MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative"), requests(),
                     evaluate=evaluate, **kwargs)
    assert resumed.resumed_from == 4 and resumed.metrics() == ref.metrics()
    for layer in LAYERS:
        assert torch.equal(resumed_model.adapter.weight_of(layer), whole.adapter.weight_of(layer))
