"""Our editors against a golden case computed by the MEMIT/AlphaEdit authors' code.

A *reference folder* (:data:`REFERENCE_DIR`, the repository's case; its ``SOURCES.md`` lists the
conventions) holds
``model/`` (a ``save_pretrained`` Llama), ``inputs/requests.json`` (ROME requests with the
reference's target ids), ``inputs/templates.json`` (grouped context templates),
``inputs/C.npz`` (``C<layer>``: the per-token mean ``E[k kᵀ]``), and, per case ``<name>``,
``inputs/<name>.json`` (hyper-parameters in the reference's field names) with
``expected/<name>.npz`` (``z``, ``K<l>``, ``cur_zs<l>``, ``dW<l>``, ``resid<l>`` when stored;
AlphaEdit also ``P<l>``, ``rank_svd`` (the null-space dimension per layer), ``cache_c<l>``).
The method is the case name before its first ``_``.

:func:`check_reference` runs, per case, the closed forms alone on the expected ``K``, ``resid``,
``C`` and ``P`` (eqs. memit-update and alphaedit-update), then our whole pipeline from the
prompts (keys → z → per-layer updates), and returns one row per method × stage × layer with
the relative Frobenius error and its tolerance (:data:`TOLERANCES`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from moir_lib.models import ModelAdapter

__all__ = ["REFERENCE_DIR", "TOLERANCES", "ReferenceCase", "check_reference", "editor_settings",
           "load_reference"]

log = logging.getLogger(__name__)

#: The golden case kept in the repository (``data/reference``: stories260K, ten requests, three cases).
REFERENCE_DIR = Path(__file__).resolve().parents[2] / "data" / "reference"

#: The reference case's tolerances (relative Frobenius), per method and stage. Stages the
#: case does not list take the end-to-end bound of their method; ``rank`` and ``target_ids``
#: must match exactly.
TOLERANCES: dict[str, dict[str, float]] = {
    "memit": {"closed_form_dW": 1e-10, "target_ids": 0.0, "z": 1e-4, "K": 1e-5, "cur_zs": 1e-4,
              "resid": 1e-4, "dW": 1e-4},
    "alphaedit": {"closed_form_dW": 1e-5, "projector": 5e-4, "rank": 0.0, "target_ids": 0.0, "z": 1e-4,
                  "K": 1e-5, "cur_zs": 1e-4, "resid": 5e-4, "dW": 5e-4, "cache_c": 5e-4},
}

_FIELDS_REQUIRED = ("layers", "v_num_grad_steps", "v_lr", "v_loss_layer", "v_weight_decay",
                    "clamp_norm_factor", "kl_factor", "mom2_update_weight")


@dataclass
class ReferenceCase:
    """One ``inputs/<name>.json`` with its ``expected/<name>.npz`` (float64 arrays)."""

    name: str
    method: str
    hparams: dict[str, Any]
    expected: dict[str, np.ndarray]


@dataclass
class ReferenceFolder:
    """Everything a reference folder holds, read and checked (not the model's weights)."""

    root: Path
    requests: list[dict[str, Any]]
    templates: list[list[str]]
    C: dict[int, np.ndarray]
    cases: list[ReferenceCase]

    @property
    def model_dir(self) -> Path:
        return self.root / "model"


def _need(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"reference folder {path.parents[1] if path.parent.name else path.parent}: "
                                f"missing {path}")
    return path


def load_reference(root: str | Path) -> ReferenceFolder:
    """Read and check a reference folder; ``FileNotFoundError``/``ValueError`` name what is wrong."""
    from moir_lib.editing.templates import as_template_groups

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no reference folder at {root}")
    _need(root / "model" / "config.json")
    requests = json.loads(_need(root / "inputs" / "requests.json").read_text())
    templates = as_template_groups(json.loads(_need(root / "inputs" / "templates.json").read_text()))
    with np.load(_need(root / "inputs" / "C.npz")) as f:
        C = {int(k[1:]): np.asarray(f[k], dtype=np.float64)
             for k in f.files if k[:1] == "C" and k[1:].isdigit()}
    expected_dir = root / "expected"
    names = sorted(p.stem for p in expected_dir.glob("*.npz")) if expected_dir.is_dir() else []
    if not names:
        raise FileNotFoundError(f"reference folder {root}: no expected/<name>.npz files")
    cases = []
    for name in names:
        method = name.split("_", 1)[0]
        if method not in TOLERANCES:
            raise ValueError(f"{expected_dir / (name + '.npz')}: unknown method {method!r} (the name before "
                             f"the first '_' must be one of {sorted(TOLERANCES)})")
        hparams = json.loads(_need(root / "inputs" / f"{name}.json").read_text())
        needed = _FIELDS_REQUIRED + (("nullspace_threshold", "L2") if method == "alphaedit" else ())
        missing = [k for k in needed if k not in hparams]
        if missing:
            raise ValueError(f"{root / 'inputs' / (name + '.json')}: missing hyper-parameters {missing}")
        with np.load(expected_dir / f"{name}.npz") as f:
            expected = {k: np.asarray(f[k], dtype=np.float64) for k in f.files}
        for layer in hparams["layers"]:
            if int(layer) not in C:
                raise ValueError(f"{root / 'inputs' / 'C.npz'} has no C{layer} "
                                 f"(case {name} edits layer {layer})")
        cases.append(ReferenceCase(name, method, hparams, expected))
    return ReferenceFolder(root, requests, templates, C, cases)


def editor_settings(hparams: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
    """The one place that maps the reference's field names onto our configuration.

    Returns ``{"layers", "values": ValueConfig, "lambda_", "tau", "l2"}``. Settings we do not
    implement (another fact token, a loss read below the last layer, no ``mom2`` adjustment)
    are refused with the field's name.
    """
    from moir_lib.editing.values import ValueConfig

    checks = {"fact_token": "subject_last", "mom2_adjustment": True, "layer_selection": "all"}
    for key, want in checks.items():
        if key in hparams and hparams[key] != want:
            raise ValueError(f"reference field {key}={hparams[key]!r} is not supported (only {want!r})")
    if int(hparams["v_loss_layer"]) != n_layers - 1:
        raise ValueError(f"reference field v_loss_layer={hparams['v_loss_layer']}: our z loss is read at the "
                         f"model's output, i.e. after the last layer ({n_layers - 1})")
    values = ValueConfig(num_steps=int(hparams["v_num_grad_steps"]), lr=float(hparams["v_lr"]),
                         weight_decay=float(hparams["v_weight_decay"]),
                         clamp_norm_factor=float(hparams["clamp_norm_factor"]),
                         kl_factor=float(hparams["kl_factor"]))
    return {"layers": [int(x) for x in hparams["layers"]], "values": values,
            "lambda_": float(hparams["mom2_update_weight"]),  # absolute, on the per-token mean C
            "tau": float(hparams.get("nullspace_threshold", 0.0)),  # absolute, on C's singular values
            "l2": float(hparams.get("L2", 0.0))}


def _rel(ours: Any, ref: np.ndarray) -> float:
    a = ours.detach().cpu().double().numpy() if hasattr(ours, "detach") else np.asarray(ours, np.float64)
    if a.shape != ref.shape:
        raise ValueError(f"shape {a.shape} against the reference's {ref.shape}")
    den = float(np.linalg.norm(ref))
    return float(np.linalg.norm(a - ref)) / (den if den > 0 else 1.0)


class _Rows:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, case: ReferenceCase, stage: str, layer: int | None, rel_err: float) -> None:
        tol = TOLERANCES[case.method][stage]
        self.rows.append({"method": case.method, "case": case.name, "stage": stage, "layer": layer,
                          "rel_err": float(rel_err), "tolerance": tol, "passed": bool(rel_err <= tol)})


def _check_shapes(folder: ReferenceFolder, adapter: ModelAdapter) -> None:
    d_in, d_out, n = adapter.key_dim, adapter.hidden_size, len(folder.requests)
    for layer, C in folder.C.items():
        if C.shape != (d_in, d_in):
            raise ValueError(f"{folder.root / 'inputs' / 'C.npz'}: C{layer} is {C.shape} but the model's key "
                             f"width is {d_in}")
    want = {"z": (d_out, n), "K": (d_in, n), "cur_zs": (d_out, n), "resid": (d_out, n), "dW": (d_out, d_in),
            "P": (d_in, d_in), "cache_c": (d_in, d_in)}
    for case in folder.cases:
        for key, arr in case.expected.items():
            stem = key.rstrip("0123456789")
            if stem in want and arr.shape != want[stem]:
                raise ValueError(f"{folder.root / 'expected' / (case.name + '.npz')}: {key} is {arr.shape}, "
                                 f"expected {want[stem]} for this model and {n} requests")


def check_reference(root: str | Path, *, device: Any = None, z_loop: str = "auto") -> list[dict[str, Any]]:
    """Rows ``{"method", "case", "stage", "layer", "rel_err", "tolerance", "passed"}`` for every
    case of the reference folder ``root`` (see the module docstring). ``z_loop`` picks the loop
    that fits the targets (:func:`moir_lib.editing.values.compute_targets`; ``"full"`` is the
    reference's own, ``"auto"`` the one every edit of this suite uses)."""
    from moir_lib.editing.values import LOOPS

    if z_loop not in LOOPS:
        raise ValueError(f"unknown z loop {z_loop!r}: choose {', '.join(LOOPS)}")
    from moir_lib import models

    folder = load_reference(root)
    loaded = models.load(folder.model_dir, device=device)
    _check_shapes(folder, loaded.adapter)
    rows = _Rows()
    for case in folder.cases:
        settings = editor_settings(case.hparams, loaded.adapter.n_layers)
        loaded.adapter.check_layers(settings["layers"])
        _closed_forms(folder, case, settings, rows)
        _end_to_end(folder, case, settings, loaded.adapter, rows, z_loop)
    return rows.rows


def _closed_forms(folder: ReferenceFolder, case: ReferenceCase, settings: dict[str, Any], rows: _Rows
                  ) -> None:
    import torch

    from moir_lib.editing.alphaedit import alphaedit_delta, null_space_projector
    from moir_lib.editing.memit import memit_delta

    exp = case.expected
    for i, layer in enumerate(settings["layers"]):
        K, R = torch.from_numpy(exp[f"K{layer}"]), torch.from_numpy(_resid(case, settings["layers"], i))
        C = torch.from_numpy(folder.C[layer])
        if case.method == "memit":
            dW = memit_delta(R, K, C, settings["lambda_"])
        else:
            dW = alphaedit_delta(R, K, torch.from_numpy(exp[f"P{layer}"]), settings["l2"])
            P, info = null_space_projector(C, settings["tau"], "absolute")
            rows.add(case, "projector", layer, _rel(P, exp[f"P{layer}"]))
            rows.add(case, "rank", layer, abs(info["null_dim"] - float(np.ravel(exp["rank_svd"])[i])))
        rows.add(case, "closed_form_dW", layer, _rel(dW, exp[f"dW{layer}"]))


def _resid(case: ReferenceCase, layers: list[int], i: int) -> np.ndarray:
    """``resid<l>`` as stored, or ``(z − cur_zs<l>) / (layers left)`` (the reference's definition)."""
    exp, layer = case.expected, layers[i]
    if f"resid{layer}" in exp:
        return exp[f"resid{layer}"]
    return (exp["z"] - exp[f"cur_zs{layer}"]) / (len(layers) - i)


def _end_to_end(folder: ReferenceFolder, case: ReferenceCase, settings: dict[str, Any], adapter: ModelAdapter,
                rows: _Rows, z_loop: str) -> None:
    import functools

    import torch

    from moir_lib.editing.alphaedit import AlphaEditEditor
    from moir_lib.editing.memit import MemitEditor
    from moir_lib.editing.requests import group_requests
    from moir_lib.editing.snapshot import WeightSnapshot
    from moir_lib.editing.values import compute_targets

    cov = {layer: torch.from_numpy(folder.C[layer]) for layer in settings["layers"]}
    if case.method == "memit":
        editor = MemitEditor(cov, settings["layers"], lambda_=settings["lambda_"], values=settings["values"])
    else:
        editor = AlphaEditEditor(cov, settings["layers"], tau=settings["tau"], l2=settings["l2"],
                                 values=settings["values"])
    groups = group_requests(adapter, folder.requests, folder.templates)
    if len(groups) != len(folder.requests):
        raise ValueError(f"{folder.root}: requests share subject keys; the reference edits each separately")
    ours = [t for g in groups for t in g.targets]
    theirs = [list(r["target_new"]["ids"]) for r in folder.requests]
    rows.add(case, "target_ids", None, sum(a != b for a, b in zip(ours, theirs, strict=True)) / len(theirs))
    snapshot = WeightSnapshot(adapter, settings["layers"])
    try:
        state = editor.new_state()
        outcome = editor.apply(adapter, folder.requests, state, folder.templates, keep_deltas=True,
                               targets=functools.partial(compute_targets, loop=z_loop))
    finally:
        snapshot.restore()
    exp = case.expected
    rows.add(case, "z", settings["layers"][-1], _rel(outcome.targets.z, exp["z"]))
    for i, layer in enumerate(settings["layers"]):
        kept = outcome.internals[layer]
        for stage in ("K", "cur_zs", "dW"):
            rows.add(case, stage, layer, _rel(kept[stage], exp[f"{stage}{layer}"]))
        rows.add(case, "resid", layer, _rel(kept["resid"], _resid(case, settings["layers"], i)))
        if case.method == "alphaedit":
            rows.add(case, "cache_c", layer, _rel(state.kkt_past[layer], exp[f"cache_c{layer}"]))


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width text table (what ``moir check-reference`` prints)."""
    head = f"{'case':<22} {'stage':<15} {'layer':>5} {'rel_err':>10} {'tolerance':>10}  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        layer = "" if r["layer"] is None else str(r["layer"])
        lines.append(f"{r['case']:<22} {r['stage']:<15} {layer:>5} {r['rel_err']:>10.2e} "
                     f"{r['tolerance']:>10.0e}  {'pass' if r['passed'] else 'FAIL'}")
    failed = sum(not r["passed"] for r in rows)
    verdict = f"; {failed} FAILED" if failed else ""
    lines.append(f"{len(rows) - failed} of {len(rows)} rows within tolerance{verdict}")
    return "\n".join(lines)


def agreement_table(root: str | Path | None = None) -> Any:
    """The book's view of :func:`check_reference` on ``root`` (default :data:`REFERENCE_DIR`): one row
    per case × stage (worst layer)."""
    import pandas as pd

    rows = pd.DataFrame(check_reference(REFERENCE_DIR if root is None else root))
    table = rows.groupby(["case", "stage"], sort=False).agg(
        layers=("layer", lambda s: ", ".join(str(int(x)) for x in s.dropna())),
        max_rel_err=("rel_err", "max"), tolerance=("tolerance", "first"), passed=("passed", "all"))
    return table.reset_index()
