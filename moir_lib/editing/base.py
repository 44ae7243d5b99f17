"""What MEMIT and AlphaEdit share: the covariance they read, the layer loop, the editor driver.

Both editors write one batch of requests into the edit layers ``ℓ_1 < … < ℓ_L`` the same way
(MEMIT's ``apply_memit_to_model``, kept by AlphaEdit): group the requests
(:func:`moir_lib.editing.requests.group_requests`), fit the targets ``Z`` at the output of the
last edit layer ``L`` (:mod:`moir_lib.editing.values`), then, layer by layer on the partly
edited model (:func:`spread_edit`), recompute the keys ``K_ℓ`` ``(d_in, n)``
(:func:`moir_lib.editing.keys.compute_keys`) and the current output ``H_L`` of the last edit
layer, spread the residual ``R_ℓ = (Z − H_L) / (#layers left)`` ``(d_out, n)`` evenly over the
layers still to be edited, solve for ``ΔW_ℓ`` with the editor's closed form (eq. (memit-update) in
:mod:`moir_lib.editing.memit`, eq. (alphaedit-update) in :mod:`moir_lib.editing.alphaedit`) and
apply it. Afterwards the batch's keys, read on the model *after* all its layers were edited (as
AlphaEdit's code updates its ``cache_c``), are added to the sequential state's
``K_past K_pastᵀ`` (:class:`moir_lib.editing.state.EditState`).

``C`` is read per edit layer as float64 (:func:`covariance_matrix`) and refused unless it is
``(d_in, d_in)``, symmetric and positive semi-definite (:func:`check_covariance`, the smallest
eigenvalue is reported when it is not).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from moir_lib.editing.keys import capture_at, compute_keys, compute_keys_at
from moir_lib.editing.requests import RequestGroup, group_requests, normalise_requests
from moir_lib.editing.state import EditState
from moir_lib.editing.values import TargetResult, TargetSource, ValueConfig, compute_targets
from moir_lib.timings import phase

if TYPE_CHECKING:
    import numpy as np
    import torch
    from jaxtyping import Float, Float64

    from moir_lib.covariance.stats import CovarianceStats
    from moir_lib.models import ModelAdapter

    #: where an editor reads ``C`` of each edit layer (:func:`covariance_matrix`)
    CovarianceSource = (CovarianceStats | Mapping[int, Float[torch.Tensor | np.ndarray, "d_in d_in"]]
                        | Callable[[int], Float[torch.Tensor | np.ndarray, "d_in d_in"]])

__all__ = [
    "EditOutcome",
    "Editor",
    "Solver",
    "as_adapter",
    "check_covariance",
    "check_width",
    "covariance_matrix",
    "spread_edit",
]

log = logging.getLogger(__name__)


def as_adapter(model_or_adapter: Any) -> ModelAdapter:
    """A :class:`ModelAdapter` from an adapter or a :class:`~moir_lib.models.LoadedModel`."""
    from moir_lib.models import LoadedModel, ModelAdapter

    if isinstance(model_or_adapter, ModelAdapter):
        return model_or_adapter
    if isinstance(model_or_adapter, LoadedModel):
        return model_or_adapter.adapter
    raise ValueError(f"expected a ModelAdapter or a LoadedModel (models.load(...)), "
                     f"got {type(model_or_adapter).__name__}")


# ----------------------------------------------------------------------------- covariance


def covariance_matrix(cov: CovarianceSource, layer: int) -> Float64[torch.Tensor, "d_in d_in"]:
    """``C`` of ``layer`` as float64 from a ``CovarianceStats`` (``.mean(layer)``), a mapping
    ``{layer: matrix}`` or a callable ``layer -> matrix``."""
    import torch

    if hasattr(cov, "mean") and callable(cov.mean) and not isinstance(cov, torch.Tensor):
        C = cov.mean(layer)
    elif isinstance(cov, Mapping):
        if layer not in cov:
            raise ValueError(f"no covariance for layer {layer}; it has layers {sorted(cov)}")
        C = cov[layer]
    elif callable(cov):
        C = cov(layer)
    else:
        raise ValueError(f"cannot read a covariance for layer {layer} from {type(cov).__name__}: pass a "
                         f"CovarianceStats, a mapping layer -> (d, d) matrix, or a callable")
    return torch.as_tensor(C).to(torch.float64)


def check_width(C: Float[torch.Tensor, "d_in d_in"], d: int, *, layer: int | None = None) -> None:
    """``ValueError`` unless ``C`` is ``(d, d)`` with ``d`` the model's key width."""
    where = f"C of layer {layer}" if layer is not None else "C"
    if tuple(C.shape) != (d, d):
        raise ValueError(f"{where} has shape {tuple(C.shape)} but the model's key width (the input of "
                         f"down_proj, i.e. the intermediate size) is {d}: was it estimated on another model?")


def check_covariance(C: Float[torch.Tensor, "d_in d_in"], d: int | None = None, *, layer: int | None = None,
                     rtol: float = 1e-6, eigenvalues: Float[torch.Tensor, " d_in"] | None = None
                     ) -> dict[str, float]:
    """Refuse a ``C`` that is not ``(d, d)``, not symmetric, or not positive semi-definite.

    ``rtol`` is relative to ``max |C|`` (symmetry) and to the largest eigenvalue (PSD: the
    smallest eigenvalue must be ``≥ −rtol · λ_max``). Returns the spectrum bounds.
    """
    import torch

    where = f"C of layer {layer}" if layer is not None else "C"
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"{where} must be a square (d, d) matrix, got shape {tuple(C.shape)}")
    if d is not None:
        check_width(C, d, layer=layer)
    if not bool(torch.isfinite(C).all()):
        raise ValueError(f"{where} has non-finite entries")
    scale = float(C.abs().max()) or 1.0
    asym = float((C - C.T).abs().max())
    if asym > rtol * scale:
        raise ValueError(f"{where} is not symmetric: max |C - Cᵀ| = {asym:.3g} (max |C| = {scale:.3g})")
    evals = eigenvalues if eigenvalues is not None else torch.linalg.eigvalsh(0.5 * (C + C.T))
    lo, hi = float(evals.min()), float(evals.max())
    if lo < -rtol * max(abs(hi), 1e-300):
        raise ValueError(f"{where} is not positive semi-definite: smallest eigenvalue {lo:.6g} "
                         f"(largest {hi:.6g}); an uncentered second moment E[k kᵀ] cannot have one below 0")
    return {"eig_min": lo, "eig_max": hi, "trace": float(torch.trace(C)),
            "mean_diag": float(torch.diagonal(C).mean())}



# ----------------------------------------------------------------------------- the spread loop


@dataclass
class EditOutcome:
    """What one call of an editor did (one batch of requests)."""

    editor: str
    layers: list[int]
    n_requests: int
    groups: list[RequestGroup] = field(repr=False)
    targets: TargetResult = field(repr=False)
    layer_stats: list[dict[str, Any]]
    timings: dict[str, float]
    deltas: dict[int, Float64[torch.Tensor, "d_out d_in"]] = field(default_factory=dict, repr=False)
    z_gap: list[float] = field(default_factory=list)
    #: with ``keep_deltas``: per layer ``K``, ``cur_zs`` and ``resid`` as the solve saw them
    internals: dict[int, dict[str, Float64[torch.Tensor, " ..."]]] = field(default_factory=dict, repr=False)

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def per_request(self) -> list[dict[str, Any]]:
        """One row per request: the z optimisation's final loss and NLL, and the post-edit gap."""
        rows = self.targets.per_request(self.groups)
        by_group = [g for g, group in enumerate(self.groups) for _ in group.requests]
        for row, g in zip(rows, by_group, strict=True):
            row["z_gap"] = self.z_gap[g] if self.z_gap else None
        return rows

    def summary(self) -> dict[str, Any]:
        """Plain numbers for ``summary.json``."""
        n = max(len(self.targets.loss), 1)
        return {
            "editor": self.editor,
            "n_requests": self.n_requests,
            "n_groups": self.n_groups,
            "z_final_loss_mean": sum(self.targets.loss) / n,
            "z_final_loss_max": max(self.targets.loss, default=0.0),
            "z_steps_mean": sum(self.targets.steps) / n,
            "z_delta_ratio_mean": sum(self.targets.delta_ratio) / n,
            "z_gap_mean": sum(self.z_gap) / len(self.z_gap) if self.z_gap else None,
            "layers": self.layer_stats,
            "timings": self.timings,
        }


class Solver(Protocol):
    """An editor's closed form for one layer: ``solve(layer, R, K, K_past K_pastᵀ or None)`` returns
    ``ΔW`` and the numbers to report for that layer."""

    def __call__(self, layer: int, R: Float[torch.Tensor, "d_out n"], K: Float[torch.Tensor, "d_in n"],
                 kkt_past: Float[torch.Tensor, "d_in d_in"] | None, /
                 ) -> tuple[Float64[torch.Tensor, "d_out d_in"], dict[str, float]]: ...


def spread_edit(adapter: ModelAdapter, groups: Sequence[RequestGroup], layers: Sequence[int],
                z: Float[torch.Tensor, "d_out n"], solve: Solver, state: EditState, *, batch_size: int = 32,
                keep_deltas: bool = False
                ) -> tuple[list[dict[str, Any]], dict[int, dict[str, Float64[torch.Tensor, " ..."]]],
                           dict[str, float]]:
    """MEMIT's layer loop, shared by both editors: for each layer in order, recompute keys and
    the current output of the last layer, spread the residual ``(Z − H_L) / (layers left)``,
    ``ΔW = solve(layer, R, K, K_past K_pastᵀ)`` and apply it in place (rounded to the weights'
    dtype, as the reference does). Afterwards the batch's keys, read on the edited model at every
    layer, are added to ``state``'s ``K_past K_pastᵀ``. Returns per-layer stats, the per-layer
    tensors ``{"K", "cur_zs", "resid", "dW"}`` (float64 CPU, when ``keep_deltas``) and timings.
    """
    import torch

    stats, kept = [], {}
    t_keys = t_solve = 0.0
    last = layers[-1]
    for i, layer in enumerate(layers):
        t0 = time.perf_counter()
        K, cur = compute_keys(adapter, groups, layer, out_layer=last, batch_size=batch_size)
        t1 = time.perf_counter()
        R = (z - cur) / (len(layers) - i)  # (d_out, n)
        past = state.kkt_past.get(layer)
        with phase("solves"):
            delta, info = solve(layer, R, K, past)
        adapter.apply_delta(layer, delta)
        fit = float(torch.linalg.norm(delta @ K.to(delta.device) - R.to(delta.device)) /
                    max(float(torch.linalg.norm(R)), 1e-300))
        t2 = time.perf_counter()
        t_keys += t1 - t0
        t_solve += t2 - t1
        stats.append({"layer": layer, "residual_norm": float(torch.linalg.norm(R)),
                      "delta_norm": float(torch.linalg.norm(delta)),
                      "key_norm_mean": float(K.norm(dim=0).mean()), "fit_error": fit, **info})
        if keep_deltas:
            kept[layer] = {"K": K.cpu(), "cur_zs": cur.cpu(), "resid": R.cpu(), "dW": delta.detach().cpu()}
        log.debug("layer %d: |R| %.3g |ΔW| %.3g fit error %.3g", layer, stats[-1]["residual_norm"],
                  stats[-1]["delta_norm"], fit)
    t0 = time.perf_counter()
    for layer, K in compute_keys_at(adapter, groups, layers, batch_size=batch_size).items():
        state.add_keys(layer, K)
    t_keys += time.perf_counter() - t0
    return stats, kept, {"keys_s": t_keys, "solve_s": t_solve}


def _z_gap(adapter: ModelAdapter, groups: Sequence[RequestGroup], layer: int, targets: TargetResult,
           batch_size: int) -> list[float]:
    """Per group ‖z − h_after‖ / ‖z − h_before‖ at the last edit layer (0: reached the target)."""
    import torch

    rows = [g.key_sites[0].ids for g in groups]
    pos = [g.key_sites[0].index for g in groups]
    got = capture_at(adapter, rows, pos, out_layers=[layer], batch_size=batch_size)
    after = got[("out", layer)].double().T
    num = torch.linalg.norm(targets.z - after, dim=0)
    den = torch.linalg.norm(targets.z - targets.h, dim=0).clamp_min(1e-30)
    return [float(x) for x in num / den]


class Editor:
    """Common driver: group the requests, fit targets, run the layer loop."""

    name = "editor"

    def __init__(self, cov: CovarianceSource, layers: Sequence[int], values: ValueConfig | None,
                 batch_size: int) -> None:
        if not layers:
            raise ValueError("no edit layers given")
        if list(layers) != sorted(set(layers)):
            raise ValueError(f"edit layers must be strictly increasing, got {list(layers)}")
        self.layers = [int(x) for x in layers]
        self.values = values or ValueConfig()
        self.batch_size = batch_size
        self.C: dict[int, Float64[torch.Tensor, "d_in d_in"]] = {}
        self.spectrum: dict[int, dict[str, float]] = {}
        self._device_C: dict[tuple[int, str], Float64[torch.Tensor, "d_in d_in"]] = {}
        for layer in self.layers:
            self.C[layer] = covariance_matrix(cov, layer)

    def check_model(self, adapter: ModelAdapter) -> None:
        """Layers in range and C as wide as the model's keys (before any GPU work)."""
        adapter.check_layers(self.layers)
        for layer, C in self.C.items():
            check_width(C, adapter.key_dim, layer=layer)

    def _C_on(self, layer: int, device: Any) -> Float64[torch.Tensor, "d_in d_in"]:
        key = (layer, str(device))
        if key not in self._device_C:
            self._device_C[key] = self.C[layer].to(device)
        return self._device_C[key]

    def config(self) -> dict[str, Any]:
        return {"editor": self.name, "layers": self.layers, "values": self.values.to_dict()}

    def new_state(self) -> EditState:
        return EditState(editor=self.name, layers=list(self.layers), config=self.config())

    def _solver(self, adapter: ModelAdapter, state: EditState | None = None) -> Solver:
        raise NotImplementedError

    def apply(self, model: Any, requests: Sequence[Any], state: EditState | None = None,
              templates: Sequence[Sequence[str]] = (("{}",),), *, keep_deltas: bool = False,
              targets: TargetSource = compute_targets) -> EditOutcome:
        """Edit ``model`` (a ``ModelAdapter`` or ``LoadedModel``) in place for ``requests``.

        ``state`` carries ``K_past K_pastᵀ`` (and AlphaEdit's projectors) between sequential
        batches; ``None`` is a fresh state (the batch regime). ``templates`` from
        :func:`moir_lib.editing.templates.context_templates`, grouped (sample them before the first edit).
        ``targets``: what fits z (:func:`~moir_lib.editing.values.compute_targets`, or a
        :class:`~moir_lib.editing.target_store.TargetStore` for batches on the unedited model).
        """
        adapter = as_adapter(model)
        reqs = normalise_requests(requests)
        if not reqs:
            raise ValueError("no requests to edit")
        self.check_model(adapter)
        state = state if state is not None else self.new_state()
        state.check_compatible(self)
        start = time.perf_counter()
        groups = group_requests(adapter, reqs, templates)
        targets = targets(adapter, groups, self.layers[-1], self.values)
        solver = self._solver(adapter, state)
        stats, kept, timings = spread_edit(adapter, groups, self.layers, targets.z, solver, state,
                                           batch_size=self.batch_size, keep_deltas=keep_deltas)
        deltas = {layer: t["dW"] for layer, t in kept.items()}
        gap = _z_gap(adapter, groups, self.layers[-1], targets, self.batch_size)
        state.n_edits += len(reqs)
        state.n_batches += 1
        timings = {"values_s": targets.seconds, **timings, "total_s": time.perf_counter() - start}
        log.info("%s: %d requests (%d groups) edited in %.1f s; mean z loss %.3f, mean z gap %.3f",
                 self.name, len(reqs), len(groups), timings["total_s"],
                 sum(targets.loss) / len(targets.loss), sum(gap) / len(gap))
        return EditOutcome(self.name, list(self.layers), len(reqs), groups, targets, stats, timings, deltas,
                           gap, kept)
