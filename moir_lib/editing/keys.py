"""k*: the key ``k = φ_ℓ(x)`` at the last subject token, averaged over context templates.

MEMIT and AlphaEdit write a fact into ``W_out^ℓ`` (``down_proj``) through the key its
input takes at the *last token of the subject* (ROME's ``subject_last`` strategy), located by
:func:`moir_lib.editing.requests.locate_subject` under every context template
(:mod:`moir_lib.editing.templates`). This module reads activations at those sites
(:func:`capture_at`) and computes ``K`` for an edit layer (:func:`compute_keys`): hidden
activations in the model's dtype, read out as float32, averaged within each template group and
then over the groups in float64, as the reference's ``compute_ks`` does
(``k = ½·k("{}") + ½·mean(prefixed)`` for MEMIT's two groups; a flat mean over all templates
is a different key). One column per :class:`~moir_lib.editing.requests.RequestGroup`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from moir_lib.timings import timed

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Float32, Float64, Int

    from moir_lib.editing.requests import RequestGroup
    from moir_lib.models import ModelAdapter

__all__ = ["capture_at", "compute_keys", "compute_keys_at", "pad_batch", "template_mean"]


def _device_of(model: Any) -> torch.device:
    return next(model.parameters()).device


class _Stop(Exception):
    """Raised by the last hook needed, to skip the rest of the forward pass."""


def _layer_output(output: Any) -> Float[torch.Tensor, "batch seq d_out"]:
    return output[0] if isinstance(output, tuple) else output


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int | None, device: Any
              ) -> tuple[Int[torch.Tensor, "batch seq"], Int[torch.Tensor, "batch seq"]]:
    """Right-padded ``input_ids`` and ``attention_mask`` (positions stay 0..n-1 per row)."""
    import torch

    width = max(len(r) for r in rows)
    pad = 0 if pad_id is None else pad_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


def capture_at(adapter: ModelAdapter, rows: Sequence[Sequence[int]], positions: Sequence[int], *,
               key_layers: Iterable[int] = (), out_layers: Iterable[int] = (), batch_size: int = 32
               ) -> dict[tuple[str, int],
                         Float32[torch.Tensor, "rows d_in"] | Float32[torch.Tensor, "rows d_out"]]:
    """Activations at one position per row (one row per row of ``rows``), as float32 tensors on the CPU.

    ``("key", ℓ)``: the input of layer ℓ's key module (``down_proj``), i.e. ``k``;
    ``("out", ℓ)``: the output of decoder layer ℓ (the residual stream after it). The forward
    pass stops after the deepest site needed.
    """
    import torch

    key_layers, out_layers = sorted(set(key_layers)), sorted(set(out_layers))
    adapter.check_layers(sorted({*key_layers, *out_layers}) or [0])
    events = [(layer, 0, "key") for layer in key_layers] + [(layer, 1, "out") for layer in out_layers]
    if not events:
        return {}
    last = max(events)
    device = _device_of(adapter.model)
    found: dict[tuple[str, int], list[torch.Tensor]] = {(kind, layer): [] for layer, _, kind in events}
    current: dict[str, torch.Tensor] = {}

    def grab(kind: str, layer: int, hidden: torch.Tensor) -> None:
        rows_idx = torch.arange(hidden.shape[0], device=hidden.device)
        found[(kind, layer)].append(hidden[rows_idx, current["pos"]].detach().float().cpu())
        if (layer, 0 if kind == "key" else 1, kind) == last:
            raise _Stop

    handles = []
    try:
        for layer in key_layers:
            handles.append(adapter.key_module(layer).register_forward_pre_hook(
                lambda mod, args, layer=layer: grab("key", layer, args[0])))
        for layer in out_layers:
            handles.append(adapter.layers[layer].register_forward_hook(
                lambda mod, args, out, layer=layer: grab("out", layer, _layer_output(out))))
        with torch.no_grad():
            for b in range(0, len(rows), batch_size):
                chunk = rows[b: b + batch_size]
                ids, mask = pad_batch(chunk, adapter.pad_token_id, device)
                current["pos"] = torch.tensor(list(positions[b: b + batch_size]), device=device)
                try:
                    adapter.model(input_ids=ids, attention_mask=mask)
                except _Stop:
                    pass
    finally:
        for h in handles:
            h.remove()
    return {k: torch.cat(v) if v else torch.empty(0) for k, v in found.items()}


def template_mean(values: Float[torch.Tensor, "n templates d_in"], group_sizes: Sequence[int]
                  ) -> Float[torch.Tensor, "n d_in"]:
    """Average over templates as the reference's ``compute_ks`` does: within each template group, then
    over the groups."""
    import torch

    if sum(group_sizes) != values.shape[1]:
        raise ValueError(f"template groups of sizes {list(group_sizes)} do not cover "
                         f"{values.shape[1]} templates")
    parts = torch.split(values, list(group_sizes), dim=1)
    return torch.stack([p.mean(dim=1) for p in parts]).mean(dim=0)


@timed("keys")
def compute_keys(adapter: ModelAdapter, groups: Sequence[RequestGroup], layer: int, *,
                 out_layer: int | None = None, batch_size: int = 32
                 ) -> tuple[Float64[torch.Tensor, "d_in n"], Float64[torch.Tensor, "d_out n"] | None]:
    """``K`` of ``layer``: one column per group, the key at the last subject token averaged over the
    context templates by :func:`template_mean` (per group, then over groups: the reference's convention).

    With ``out_layer``, also the output of that decoder layer at the last subject token of the
    *plain* prompt (template 0), from the same forward pass (MEMIT's ``cur_zs``).
    """
    got = _capture_groups(adapter, groups, [layer], [] if out_layer is None else [out_layer], batch_size)
    keys = _template_keys(got, groups, layer)
    cur = None
    if out_layer is not None:
        cur = got[("out", out_layer)].double().reshape(len(groups), len(groups[0].key_sites), -1)[:, 0]
        cur = cur.T.contiguous()
    return keys, cur


@timed("keys")
def compute_keys_at(adapter: ModelAdapter, groups: Sequence[RequestGroup], layers: Sequence[int], *,
                    batch_size: int = 32) -> dict[int, Float64[torch.Tensor, "d_in n"]]:
    """:func:`compute_keys` at several layers from one forward pass: ``{layer: K}``."""
    got = _capture_groups(adapter, groups, layers, [], batch_size)
    return {layer: _template_keys(got, groups, layer) for layer in layers}


def _capture_groups(adapter: ModelAdapter, groups: Sequence[RequestGroup], key_layers: Sequence[int],
                    out_layers: Sequence[int], batch_size: int
                    ) -> dict[tuple[str, int],
                              Float32[torch.Tensor, "rows d_in"] | Float32[torch.Tensor, "rows d_out"]]:
    if not groups:
        raise ValueError("no requests to compute keys for")
    rows = [s.ids for g in groups for s in g.key_sites]
    pos = [s.index for g in groups for s in g.key_sites]
    return capture_at(adapter, rows, pos, key_layers=key_layers, out_layers=out_layers, batch_size=batch_size)


def _template_keys(got: dict[tuple[str, int],
                             Float32[torch.Tensor, "rows d_in"] | Float32[torch.Tensor, "rows d_out"]],
                   groups: Sequence[RequestGroup], layer: int) -> Float64[torch.Tensor, "d_in n"]:
    per_template = got[("key", layer)].double().reshape(len(groups), len(groups[0].key_sites), -1)
    return template_mean(per_template, groups[0].group_sizes).T.contiguous()
