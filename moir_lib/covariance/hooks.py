"""The key site's hooks: :class:`KeyCollector` reads ``k = φ_ℓ(x)`` of several layers in one forward pass.

The key of layer ``ℓ`` is the *input* of the second MLP projection ``W_out^ℓ`` (``mlp.down_proj``;
GPT-2's ``mlp.c_proj``), located by :class:`moir_lib.models.ModelAdapter`. :class:`KeyCollector`
hooks (forward *pre*-hooks) the key modules of all requested layers at once, for one forward pass
over a padded batch or for incremental decoding (inputs ``(b, 1, d)``; Algorithm 1 collects keys
during generation); :meth:`~KeyCollector.set_mask` says which positions count, and
:meth:`~KeyCollector.set_taps` adds the keys of chosen rows to further statistics in the same pass (the
prefixes of :mod:`moir_lib.covariance.prefixes`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from moir_lib.covariance.products import _torch
from moir_lib.covariance.stats import FORMAT, CovarianceStats
from moir_lib.models import model_fingerprint

if TYPE_CHECKING:
    import torch
    from jaxtyping import Bool, Float

    from moir_lib.models import ModelAdapter


class _StopForward(Exception):
    """Raised from the last needed layer's hook to end a forward pass early (caught by KeyCollector)."""


def model_dtype(model: Any) -> str:
    for p in model.parameters():
        return str(p.dtype).removeprefix("torch.")
    return "unknown"


def base_metadata(adapter: ModelAdapter, precision: str = "float64", revision: str | None = None,
                  model_fp: str | None = None) -> dict[str, Any]:
    """The identity metadata of statistics collected from ``adapter``'s model."""
    return {
        "format": FORMAT,
        "model": model_fp or model_fingerprint(adapter.model, revision),
        "model_name": adapter.name,
        "revision": revision,
        "key_site": adapter.key_module_template,
        "key_dim": adapter.key_dim,
        "dtype": model_dtype(adapter.model),
        "precision": precision,
        "tokenization": None,
        "corpus": [],
    }


class KeyCollector:
    """Accumulate the keys of several layers from the forward passes run inside a ``with`` block.

    Registers a forward *pre*-hook on ``adapter.key_module(l)`` for every layer in ``layers``
    (the hook sees the key-module input ``(..., d)``: ``(b, t, d)`` for a padded batch,
    ``(b, 1, d)`` for a decoding step; GPT-2's ``Conv1D`` input has the same layout).
    :meth:`set_mask` selects the positions that count (``bool (b, t)``; ``None``: all). Each
    forward pass is one *batch* (numbered from 0, or as given to :meth:`forward`), used in
    error messages.

    ``stats``: an existing :class:`CovarianceStats` to add to (default: a new one with the
    model's metadata). ``stop_after_last``: end each forward pass once the last layer's keys
    are read (use :meth:`forward`, which swallows the stop; outputs are then ``None``).
    """

    def __init__(self, adapter: ModelAdapter, layers: Iterable[int], stats: CovarianceStats | None = None,
                 *, precision: str = "float64", stop_after_last: bool = False,
                 revision: str | None = None) -> None:
        self.adapter = adapter
        self.layers = sorted(adapter.check_layers(layers))
        if stats is None:
            stats = CovarianceStats(self.layers, adapter.key_dim, base_metadata(adapter, precision, revision),
                                    precision=precision)
        missing = sorted(set(self.layers) - set(stats.layers))
        if missing or stats.dim != adapter.key_dim:
            raise ValueError(f"stats hold layers {list(stats.layers)} of dimension {stats.dim}; the "
                             f"collector needs layers {self.layers} of dimension {adapter.key_dim}")
        self.stats = stats
        self.stop_after_last = stop_after_last
        self.batch_index = -1
        self._next_batch: int | None = None
        self._mask: Bool[torch.Tensor, "batch seq"] | Bool[torch.Tensor, " batch"] | None = None
        self._taps: list[tuple[CovarianceStats, Bool[torch.Tensor, " batch"]]] = []
        self._handles: list[Any] = []
        self._first, self._last = self.layers[0], self.layers[-1]

    def set_mask(self, mask: Bool[torch.Tensor, "batch seq"] | Bool[torch.Tensor, " batch"] | None) -> None:
        """Which positions of the next forward passes count (one per row for a decoding step),
        ``True`` = count; ``None`` = all positions."""
        torch = _torch()
        if mask is not None:
            mask = torch.as_tensor(mask)
            if mask.dtype != torch.bool:
                mask = mask.bool()
            if bool(mask.all()):  # one check here, not one per layer
                mask = None
        self._mask = mask

    def set_taps(self, taps: Sequence[tuple[CovarianceStats, Bool[torch.Tensor, " batch"]]] = ()) -> None:
        """Also add, in the next forward passes, the counted keys of the rows ``rows`` (``bool (b,)``, one
        per batch row) to each ``stats`` of ``taps`` (layers as this collector's); ``()``: none."""
        torch = _torch()
        taps = [(stats, torch.as_tensor(rows, dtype=torch.bool)) for stats, rows in taps]
        for stats, rows in taps:
            if rows.ndim != 1 or set(self.layers) - set(stats.layers) or stats.dim != self.adapter.key_dim:
                raise ValueError(f"a tap needs one bool per batch row and statistics of layers "
                                 f"{self.layers}, got rows of shape {tuple(rows.shape)} and layers "
                                 f"{list(stats.layers)}")
        self._taps = taps

    def __enter__(self) -> KeyCollector:
        if self._handles:
            raise RuntimeError("KeyCollector is already active")
        try:
            for layer in self.layers:
                module = self.adapter.key_module(layer)
                hook = self._make_hook(layer)
                self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> bool:
        self._remove()
        return False

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _make_hook(self, layer: int):
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            if layer == self._first:
                self.batch_index = self._next_batch if self._next_batch is not None else self.batch_index + 1
                self._next_batch = None
            self.stats.update(layer, self._select(x, layer), batch=self.batch_index)
            for stats, rows in self._taps:
                stats.update(layer, self._select(x, layer, rows), batch=self.batch_index)
            if self.stop_after_last and layer == self._last:
                raise _StopForward
        return hook

    def _select(self, x: Float[torch.Tensor, "batch seq d_in"], layer: int,
                rows: Bool[torch.Tensor, " batch"] | None = None) -> Float[torch.Tensor, "tokens d_in"]:
        """The counted keys of ``x`` (of the rows ``rows`` only, when given)."""
        d = x.shape[-1]
        mask = self._mask
        if mask is None and rows is None:
            return x.reshape(-1, d)
        lead = x.shape[:-1]
        if mask is not None:
            if mask.device != x.device:
                mask = self._mask = mask.to(x.device)
            if tuple(mask.shape) != tuple(lead):
                if mask.numel() != math.prod(lead):
                    raise ValueError(f"mask of shape {tuple(mask.shape)} does not match the key input "
                                     f"{tuple(lead)} at layer {layer}")
                mask = mask.reshape(lead)
        if rows is not None:
            if rows.shape[0] != lead[0]:
                raise ValueError(f"a tap names {rows.shape[0]} rows but the key input has {lead[0]} at layer "
                                 f"{layer}")
            chosen = rows.to(x.device).reshape(-1, *([1] * (len(lead) - 1))).expand(lead)
            mask = chosen if mask is None else mask & chosen
        return x[mask]

    def forward(self, model: Any, *args: Any, batch_index: int | None = None, **kwargs: Any) -> Any:
        """Run ``model(*args, **kwargs)`` as batch ``batch_index`` (``None`` when stopped early)."""
        self._next_batch = batch_index
        try:
            return model(*args, **kwargs)
        except _StopForward:
            return None
        finally:
            self._next_batch = None
