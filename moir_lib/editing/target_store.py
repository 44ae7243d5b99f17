"""Batch targets z, computed once per model, request set and settings, and kept on disk.

In the batch regime the targets z of :func:`moir_lib.editing.values.compute_targets` depend only on
the *unedited* model, the request groups (their token ids under every context template), the z
layer and the :class:`~moir_lib.editing.values.ValueConfig`: every C, both editors, every chapter
and the pocket report's editability gate need the same ones. A :class:`TargetStore` serves them
from memory, then from ``$MOIR_CACHE/targets/<key>.pt`` (checksummed, see :mod:`moir_lib.cache`;
two processes asking for one entry take turns through :mod:`moir_lib.locks`), and computes them only
when neither holds them. The key covers the model's weights (``model_id``, e.g.
:func:`moir_lib.models.model_fingerprint` of the unedited model), the groups, the layer, the settings
and the source of the z loop, so a change of any of them is a miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.cache import cache_dir, fingerprint, read_checked, write_checked
from moir_lib.editing import values
from moir_lib.editing.values import TargetResult, ValueConfig, compute_targets
from moir_lib.locks import exclusive, file_lock_path

if TYPE_CHECKING:
    from moir_lib.editing.requests import RequestGroup
    from moir_lib.models import ModelAdapter

__all__ = ["TargetStore"]

log = logging.getLogger(__name__)

#: the z loop's source: targets computed by other code are not served
_CODE = hashlib.sha256(Path(values.__file__).read_bytes()).hexdigest()[:16]


class TargetStore:
    """z targets on one unedited model (``model_id`` names its weights): memory, then disk, then
    :func:`~moir_lib.editing.values.compute_targets`. Call it as ``compute_targets``.

    ``disk``: also read and write ``$MOIR_CACHE/targets`` (a read-only cache serves hits and keeps
    new targets in memory only). ``threads``: torch CPU threads while fitting (the result does not
    depend on them: :func:`~moir_lib.editing.values.compute_targets`).
    """

    def __init__(self, model_id: str, *, disk: bool = True, threads: int | None = None) -> None:
        self.model_id = str(model_id)
        self.disk = bool(disk)
        self.threads = threads
        self._memo: dict[str, TargetResult] = {}

    def __len__(self) -> int:
        """Targets held in memory."""
        return len(self._memo)

    def key(self, adapter: ModelAdapter, groups: Sequence[RequestGroup], layer: int, cfg: ValueConfig) -> str:
        """Fingerprint of everything the targets of ``groups`` depend on: the model, the token ids, lookup
        positions and targets of every row the loss reads, the layer, the settings and the code."""
        rewrite, kl = values.loss_rows(adapter, groups, cfg)
        rows = [[r.ids, r.lookup, r.group, r.request, r.targets, r.first] for r in rewrite + kl]
        cases = [[r.case_id for r in g.requests] for g in groups]
        return fingerprint({"model": self.model_id, "rows": rows, "cases": cases, "layer": int(layer),
                            "cfg": cfg.to_dict(), "code": _CODE}, 32)

    def path(self, key: str) -> Path:
        return cache_dir() / "targets" / f"{key}.pt"

    def __call__(self, adapter: ModelAdapter, groups: Sequence[RequestGroup], layer: int,
                 cfg: ValueConfig | None = None) -> TargetResult:
        cfg = cfg or ValueConfig()
        key = self.key(adapter, groups, layer, cfg)
        if key in self._memo:
            log.info("z targets of %d groups reused (same model, requests and settings)", len(groups))
            return self._memo[key]
        if not self.disk:
            self._memo[key] = compute_targets(adapter, groups, layer, cfg, threads=self.threads)
            return self._memo[key]
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with exclusive(file_lock_path(path), f"z targets {path.name}", wait=True):
                result = self._read(path, key) or self._compute(adapter, groups, layer, cfg, path, key)
        except PermissionError as exc:  # a read-only cache: serve a hit, else compute in memory
            log.warning("z target cache %s not writable (%s): targets are kept in memory only", path, exc)
            result = (self._read(path, key)
                      or compute_targets(adapter, groups, layer, cfg, threads=self.threads))
        self._memo[key] = result
        return result

    def _compute(self, adapter: ModelAdapter, groups: Sequence[RequestGroup], layer: int, cfg: ValueConfig,
                 path: Path, key: str) -> TargetResult:
        import torch

        result = compute_targets(adapter, groups, layer, cfg, threads=self.threads)
        record = dataclasses.asdict(result)
        write_checked(path, lambda p: torch.save(record, p), key=key)
        return result

    @staticmethod
    def _read(path: Path, key: str) -> TargetResult | None:
        import torch

        if read_checked(path, key=key) is None:
            return None
        t0 = time.perf_counter()
        try:
            record: dict[str, Any] = torch.load(path, weights_only=True)
            result = TargetResult(**record)
        except Exception as exc:  # noqa: BLE001 - an unreadable entry is recomputed
            log.warning("ignoring unreadable z targets %s: %s", path, exc)
            return None
        log.info("z targets of %d groups read from %s in %.2f s (fitted in %.1f s)", result.z.shape[1], path,
                 time.perf_counter() - t0, result.seconds)
        return result
