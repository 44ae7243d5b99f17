"""The z loops of ``compute_targets`` and the on-disk target store, on the micro pocket model.

The ``upper`` loop (layers below the z layer run once, LM head only where the loss reads, converged
groups leave the batch) must give the targets of the ``full`` loop (MEMIT's ``compute_z``: the
whole model at every step): the same steps per group, z within 1e-6, the same losses.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moir_lib.data import load_counterfact
from moir_lib.editing import group_requests
from moir_lib.editing.target_store import TargetStore
from moir_lib.editing.values import ValueConfig, compute_targets
from moir_lib.models import load
from moir_lib.pocket import build


@pytest.fixture(scope="module")
def micro():
    loaded = load("pocket-micro")
    records = load_counterfact(build("micro") / "counterfact.json")[:24]
    templates = [["{}"], ["The city . {}", "A b c . {}"]]
    return loaded, group_requests(loaded.adapter, records, templates)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("layer", [0, 1])
def test_upper_loop_gives_the_full_loops_targets(micro, layer: int) -> None:
    loaded, groups = micro
    # early stopping at a loss the micro model's groups reach at different steps, so the upper loop
    # shrinks its batch several times; chunks of 7 leave a ragged last chunk. (At a learning rate
    # where Adam never settles, both loops amplify float rounding alike and no tolerance is fair.)
    cfg = ValueConfig(num_steps=25, chunk_size=7, lr=0.5, early_stop_loss=3.0)
    full = compute_targets(loaded.adapter, groups, layer, cfg, loop="full")
    upper = compute_targets(loaded.adapter, groups, layer, cfg, loop="upper")
    assert upper.steps == full.steps
    if layer == 0:  # there the groups leave at several different steps (at layer 1 at 0 or the end)
        assert len(set(full.steps)) > 2
    assert _relative(upper.z, full.z) <= 1e-6
    torch.testing.assert_close(upper.h, full.h, rtol=0, atol=0)
    for name in ("loss", "nll", "kl", "delta_ratio"):
        torch.testing.assert_close(torch.tensor(getattr(upper, name)), torch.tensor(getattr(full, name)),
                                   rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor([x for r in upper.request_nll for x in r]),
                               torch.tensor([x for r in full.request_nll for x in r]), rtol=1e-5, atol=1e-6)


def test_auto_loop_and_a_bad_loop_name(micro) -> None:
    loaded, groups = micro
    assert loaded.adapter.can_run_from(1) and not loaded.adapter.can_run_from(0)
    with pytest.raises(ValueError, match="unknown z loop 'fast'"):
        compute_targets(loaded.adapter, groups[:2], 1, ValueConfig(num_steps=2), loop="fast")


def test_target_store_fits_once_then_serves_from_disk(micro, tmp_path, monkeypatch) -> None:
    loaded, groups = micro
    monkeypatch.setenv("MOIR_CACHE", str(tmp_path))
    cfg = ValueConfig(num_steps=4)
    first = TargetStore("model-a")(loaded.adapter, groups[:5], 1, cfg)
    entries = list((tmp_path / "targets").glob("*.pt"))
    assert len(entries) == 1
    fresh = TargetStore("model-a")  # a new process: nothing in memory
    calls = []
    monkeypatch.setattr("moir_lib.editing.target_store.compute_targets",
                        lambda *a, **k: calls.append(a) or compute_targets(*a, **k))
    again = fresh(loaded.adapter, groups[:5], 1, cfg)
    assert not calls
    assert torch.equal(again.z, first.z) and again.steps == first.steps and again.loss == first.loss
    # anything the targets depend on is a miss: the model, the settings, the layer, the requests
    for store, grp, layer, c in ((TargetStore("model-b"), groups[:5], 1, cfg),
                                 (fresh, groups[:5], 1, dataclasses.replace(cfg, lr=0.4)),
                                 (fresh, groups[:5], 0, cfg), (fresh, groups[1:6], 1, cfg)):
        store(loaded.adapter, grp, layer, c)
    assert len(calls) == 4 and len(list((tmp_path / "targets").glob("*.pt"))) == 5
    # a damaged entry is not served: it is fitted again
    victim = entries[0]
    victim.write_bytes(victim.read_bytes()[:-10])
    TargetStore("model-a")(loaded.adapter, groups[:5], 1, cfg)
    assert len(calls) == 5
