"""How CounterFact records are scored: :class:`CounterFactSettings`, what
:func:`~moir_lib.evaluation.counterfact.evaluate_counterfact` takes whole (and checks a baseline against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Decoding = Literal["greedy", "sample"]


@dataclass(frozen=True)
class CounterFactSettings:
    """The scoring of :func:`~moir_lib.evaluation.counterfact.evaluate_counterfact`.

    ``batch_size``: sequences per forward pass / generation batch. Fluency: ``max_gen_tokens`` per
    continuation, ``decoding`` ``"greedy"`` or ``"sample"`` (``seed``: sampling only),
    ``max_fluency_prompts`` (the first k generation prompts per record; ``None`` = all);
    ``compute_fluency=False`` skips generation (Fluency* ``None``). ``add_bos``: ``None`` = the
    tokenizer's default.
    """

    batch_size: int = 16
    max_gen_tokens: int = 32
    decoding: Decoding = "greedy"
    seed: int = 0
    max_fluency_prompts: int | None = None
    compute_fluency: bool = True
    add_bos: bool | None = None
