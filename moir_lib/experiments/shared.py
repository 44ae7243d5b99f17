"""The editing settings chapters 01 and 05 share: one declaration both score their points with.

Their parameters cells carry these values as literal defaults (papermill needs one, and a reader sees
it); ``moir docs`` writes them there from :data:`SHARED_EDITING` and ``moir docs --check`` (and
``tests/test_docs.py``) fails when a cell differs. A chapter run may still override any of them (``-p
seq_batch_size 1``): it then computes its own points instead of sharing the other chapter's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moir_lib.experiments.specs import N_EVAL, PRES_LIMIT

__all__ = ["SHARED_EDITING", "SharedEditing"]


@dataclass(frozen=True)
class SharedEditing:
    """Settings several chapters run with, so that each reads back the points the other computed."""

    chapters: tuple[str, ...]  # the notebooks sharing it (their ``_toc.yml`` entries), the longest grid first
    milestones: tuple[int, ...]  # sequential edit counts scored
    seq_batch_size: int  # edits per sequential step
    n_eval: int  # edited records scored for the edit metrics (:data:`~moir_lib.experiments.specs.N_EVAL`)
    pres_limit: int  # items per preservation task (:data:`~moir_lib.experiments.specs.PRES_LIMIT`)

    def parameters(self) -> dict[str, Any]:
        """The chapters' parameters these settings are, as their parameters cells write them."""
        return {"milestones": list(self.milestones), "seq_batch_size": self.seq_batch_size,
                "n_eval": self.n_eval, "pres_limit": self.pres_limit}


#: the editing settings of chapters 05 and 01 (the pocket report's editability gate edits as they do)
SHARED_EDITING = SharedEditing(chapters=("notebooks/05_editing", "notebooks/01_diagnosis"),
                               milestones=(10, 30, 60), seq_batch_size=10, n_eval=N_EVAL,
                               pres_limit=PRES_LIMIT)
