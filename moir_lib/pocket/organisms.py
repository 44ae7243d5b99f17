"""Pocket organisms: several models of one pocket recipe.

Organism ``K`` of a variant is trained on exactly what organism 0 is trained on (the same world,
tokenizer, corpora, pretraining windows and SFT rows; the same CounterFact records, portability
probes and benchmark data), from its own weight initialisation and in its own row order: a claim
that holds across organisms is about the training procedure, not about one draw of it. Organism 0
is the recipe itself (no reseeding, no reordering), so its build and cache entry are the ones the
recipe always had. Two organisms with the same weights are one model: wherever organisms are pooled,
:func:`same_weights` refuses them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from jaxtyping import Int

__all__ = ["check", "check_list", "init_seed", "reorder", "same_weights"]


def check(organism: object) -> int:
    """``organism`` as an ``int`` ≥ 0, else a ``ValueError`` that says what is accepted."""
    if isinstance(organism, bool) or not isinstance(organism, int) or organism < 0:
        raise ValueError(f"pocket organism {organism!r}: give an integer >= 0 (0 is the recipe's own model; "
                         f"K >= 1 retrains it with another initialisation and data order)")
    return organism


def check_list(value: Any, what: str = "organisms") -> tuple[int, ...]:
    """``value`` as organisms of one run (a non-empty list of distinct integers >= 0; ``True`` is no
    organism), else a ``ValueError`` naming ``what`` and the value."""
    ok = (isinstance(value, list | tuple) and bool(value)
          and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in value)
          and len(set(value)) == len(value))
    if not ok:
        raise ValueError(f"{what} {value!r}: give a list of distinct integers >= 0, e.g. [0] or [0, 1, 2] "
                         f"(0 is the recipe's own model)")
    return tuple(value)


def _seed(seed: int, organism: int, purpose: str) -> int:
    """A 63-bit seed of organism ``organism`` for ``purpose``, independent of the recipe's own seeds."""
    digest = hashlib.sha256(f"pocket-organism/{seed}/{organism}/{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def init_seed(seed: int, organism: int) -> int:
    """The weight-initialisation seed of ``organism`` in a recipe seeded ``seed`` (organism 0: ``seed``)."""
    return seed if check(organism) == 0 else _seed(seed, organism, "init")


def reorder(
    rows: Int[torch.Tensor, "rows seq"], labels: Int[torch.Tensor, "rows seq"], seed: int, organism: int,
    stage: str,
) -> tuple[Int[torch.Tensor, "rows seq"], Int[torch.Tensor, "rows seq"]]:
    """``rows`` and their ``labels`` in organism ``organism``'s order for training ``stage`` (one permutation
    of whole rows, the same for both; organism 0: unchanged)."""
    if check(organism) == 0:
        return rows, labels
    import torch

    generator = torch.Generator().manual_seed(_seed(seed, organism, stage))
    order = torch.randperm(rows.shape[0], generator=generator)
    return rows[order], labels[order]


def same_weights(weights: Mapping[int, Iterable[str]], where: str, variant: str) -> None:
    """Refuse (``ValueError`` naming ``where``, both organisms and the weights) two organisms of ``variant``
    in ``weights`` (organism -> the SHA-256s of the weights it is known by) that share weights: pooled, one
    model would count twice, and its claims would read as holding across organisms."""
    owner: dict[str, int] = {}
    for organism, shas in sorted(weights.items()):
        for sha in sorted(set(shas)):
            other = owner.setdefault(sha, organism)
            if other != organism:
                raise ValueError(
                    f"{where}: organisms {other} and {organism} of {variant} have the same weights "
                    f"(model.safetensors SHA-256 {sha[:16]}...): they are one model, not two organisms of "
                    f"the recipe; rebuild organism {organism} (moir pocket build --variant {variant} "
                    f"--organism {organism} --force) and rerun what pooled them")
