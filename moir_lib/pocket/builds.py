"""Several pocket builds: side by side on this machine's cores, or one as a task of a cluster's job array.

A build trains on its recipe's fixed thread count (:attr:`~moir_lib.pocket.variants.TrainSpec.threads`), so
its weights are those of a lone build on this machine whatever runs beside it; only its speed depends on
the load (two builds on two cores run about three times slower in all than one after the other,
``benchmarks/README.md``). :func:`builds_at_once` is how many fit: one per ``threads`` cores this process
may use, at most ``jobs`` processes and the builds to do; with two cores and two threads, one.
:func:`build_side_by_side` builds the organisms not cached, that many at a time, each in a process of its
own; :func:`build_record` builds (or finds) one organism and says what it is, as a grid's build task
(:mod:`moir_lib.grid`) records it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from moir_lib.pocket.build import build, provenance

__all__ = ["available_cores", "build_record", "build_side_by_side", "builds_at_once"]

log = logging.getLogger(__name__)


def available_cores() -> int:
    """The cores this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


def builds_at_once(todo: int, jobs: int, threads: int, cores: int) -> int:
    """Builds of ``threads`` threads each run side by side: ``cores // threads`` (at least one), at most
    ``jobs`` processes and the ``todo`` builds."""
    return max(1, min(todo, jobs, cores // threads))


def build_side_by_side(variant: str, organisms: Sequence[int], jobs: int, cores: int | None = None
                       ) -> list[int]:
    """Build every organism of ``variant`` in ``organisms`` not yet cached, :func:`builds_at_once` of them at
    a time (``cores``: default :func:`available_cores`): one after another in this process, or each in a
    spawned process of its own. Returns the organisms built."""
    import concurrent.futures as cf
    import multiprocessing

    from moir_lib.pocket.variants import get_variant

    todo = [k for k in organisms if provenance(variant, k) is None]
    width = builds_at_once(len(todo), jobs, get_variant(variant).train.threads, cores or available_cores())
    if width <= 1:
        for k in todo:
            build(variant, organism=k)
        return todo
    log.info("building organisms %s of %s, %d side by side", todo, variant, width)
    with cf.ProcessPoolExecutor(width, mp_context=multiprocessing.get_context("spawn")) as pool:
        for future in [pool.submit(build, variant, False, k) for k in todo]:
            future.result()
    return todo


def build_record(variant: str, organism: int) -> dict[str, Any]:
    """Build organism ``organism`` of ``variant`` unless cached; what it is: its cache entry, the SHA-256 of
    its weights, its training precision, the wall seconds of its build (``build_s``, from its manifest) and
    of this call (``wall_s``), and the host."""
    t0 = time.perf_counter()
    entry = build(variant, organism=organism)
    built = provenance(variant, organism)
    if built is None:  # its entry changed since build() verified it
        raise RuntimeError(f"pocket {variant} organism {organism}: {entry} is not a verified build")
    return {"variant": variant, "organism": organism, "entry": str(built.entry),
            "weights_sha256": built.weights_sha256, "precision": built.precision, "build_s": built.build_s,
            "wall_s": round(time.perf_counter() - t0, 2), "host": os.uname().nodename}
