"""The CounterFact records a lab edits, in the order each edit sample edits them, and the validation
split that selects the editors' τ and λ.

A records file is cut into disjoint parts (:meth:`EditRecords.parts`):

* **preservation facts** (pocket CounterFact only): its ``pocket_facts`` benchmark asks the first records'
  facts, so the first ``pres_limit`` records (the chapters' preservation items) and the next
  ``validation_items`` (the selection's, :mod:`moir_lib.experiments.selection`) are never edited, and
  preservation measures untouched facts; without a limit the facts and the edits overlap (a warning says
  so). Another records file has none: its preservation suite asks other benchmarks.
* **the edit pool** (:meth:`EditRecords.pool`, :meth:`EditRecords.all`): what the chapters edit and score.
  Edit sample 0 edits it in file order, the others a seeded permutation of it: the edit sample is a random
  draw, and two C's compared on the same edit sample edit the same records.
* **subjects apart** (``editing.subjects_apart``, the pocket profiles): each subject's k-th record of that
  order comes after every subject's (k−1)-th, so the first edits of a batch are about distinct subjects,
  as in CounterFact, whose records almost never share one; the pocket CounterFact asks several facts of
  each person, and MEMIT and AlphaEdit map one subject's key to one value (the MEMIT-Merge study of
  same-subject batches). Off (the file's order) for a real records file.
* **the validation split** (:meth:`EditRecords.validation`): the last ``validation`` records of the file,
  edited and scored only to select τ and λ. :meth:`EditRecords.validation_split` is the same records
  seen by a lab that edits the validation split instead of the pool.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moir_lib.cache import fingerprint

__all__ = ["EditRecords", "RecordPlan", "apart_by_subject"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordPlan:
    """How a records file is cut and ordered: ``validation`` records held out at its end (the validation
    split), ``validation_items`` preservation items per task the selection scores after ``pres_limit``
    (pocket CounterFact: those facts are not edited either), ``subjects_apart``: edit orders with each
    subject's records apart (module doc)."""

    validation: int = 0
    validation_items: int = 0
    subjects_apart: bool = False


class EditRecords:
    """The records (``records_path``: a CounterFact file; ``None``: the pocket CounterFact of ``variant``) and
    ``portability`` probes (a ``portability.json``; default: the pocket CounterFact's) of a lab whose
    preservation suite is ``suite`` and scores the first ``pres_limit`` items of each task.

    ``plan``: how the file is cut and ordered (:class:`RecordPlan`). :meth:`pool` serves the edit pool
    (:meth:`validation_split`: the validation split)."""

    def __init__(self, variant: str | None, suite: str, pres_limit: int | None, *,
                 records_path: str | os.PathLike[str] | None = None,
                 portability: str | os.PathLike[str] | None = None, organism: int = 0,
                 plan: RecordPlan = RecordPlan()) -> None:
        if records_path is None and variant is None:
            raise ValueError("a non-pocket profile needs records_path=<CounterFact file>")
        if plan.validation < 0 or plan.validation_items < 0:
            raise ValueError(f"validation ({plan.validation}) and validation_items ({plan.validation_items}) "
                             f"must be >= 0")
        self.variant = variant
        self.suite = suite
        self.pres_limit = pres_limit
        self.path = Path(records_path) if records_path is not None else None
        self.given_portability = str(portability) if portability is not None else None
        self.organism = organism  # every organism's build holds the same records: read the one loaded
        self.validation_count, self.validation_items = plan.validation, plan.validation_items
        self.subjects_apart, self.split = bool(plan.subjects_apart), "edit"
        self._file: list[Any] | None = None

    @classmethod
    def of(cls, profile: Any, evaluation: Any, records_path: str | os.PathLike[str] | None = None,
           portability: str | os.PathLike[str] | None = None) -> EditRecords:
        """The records of a lab of ``profile`` scored with ``evaluation`` (its suite: ``evaluation.suite``,
        else the pocket suite for pocket profiles and the paper's otherwise), with the profile's validation
        split (``editing.validation_records``, ``editing.validation_items``)."""
        from moir_lib.models import POCKET_SPECS

        variant = POCKET_SPECS.get(profile.model)
        suite = evaluation.suite or ("pocket" if variant else "paper")
        if suite == "pocket" and variant is None:
            raise ValueError(f"the pocket suite needs a pocket profile; {profile.name!r} loads "
                             f"{profile.model}")
        if records_path is None and variant is None:
            raise ValueError(f"profile {profile.name!r} ({profile.model}) needs "
                             f"records_path=<CounterFact file>")
        return cls(variant, suite, evaluation.pres_limit, records_path=records_path, portability=portability,
                   organism=getattr(profile, "organism", 0),
                   plan=RecordPlan(profile.editing.validation_records, profile.editing.validation_items,
                                   profile.editing.subjects_apart))

    def validation_split(self) -> EditRecords:
        """These records, with :meth:`pool` serving the validation split (what the selection edits)."""
        other = copy.copy(self)
        other.split = "validation"
        return other

    # ------------------------------------------------------------------ the parts of the file

    def file(self) -> list[Any]:
        """Every record of the file, in file order (pocket: the pocket CounterFact)."""
        if self._file is None:
            from moir_lib.data import load_counterfact

            self._file = load_counterfact(str(self.path or self._pocket_file("counterfact.json")))
        return self._file

    def parts(self) -> dict[str, range]:
        """The positions in :meth:`file` of each part: ``preservation`` (the facts the pocket suite scores,
        the chapters' and the selection's), ``edit`` (the pool) and ``validation``; ``ValueError`` when the
        file is too small to hold them apart."""
        n = len(self.file())
        skip = 0
        if self.suite == "pocket" and self.path is None:
            if self.pres_limit is None:
                log.warning("pres_limit=None: pocket_facts scores every fact, including the edited ones")
            else:
                skip = self.pres_limit + self.validation_items
        held = self.validation_count
        if not held:
            skip = min(skip, n)
        elif skip + held >= n:
            raise ValueError(
                f"{self.describe()} holds {n} records: the first {skip} are preservation facts and the last "
                f"{held} the validation split (editing.validation_records), leaving none to edit; give a "
                f"larger records file, or lower validation_records / validation_items / pres_limit")
        return {"preservation": range(0, skip), "edit": range(skip, n - held),
                "validation": range(n - held, n)}

    def all(self) -> list[Any]:
        """The edit pool in file order: every record but the preservation facts and the validation split."""
        part = self.parts()["edit"]
        return self.file()[part.start:part.stop]

    def validation(self, edit_sample: int = 0) -> list[Any]:
        """The validation split (the file's last ``validation`` records): in file order for ``edit_sample``
        0, else a seeded permutation."""
        part = self.parts()["validation"]
        records = self.file()[part.start:part.stop]
        if edit_sample:
            random.Random(f"moir-validation/{edit_sample}").shuffle(records)
        return apart_by_subject(records) if self.subjects_apart else records

    def pool(self, edit_sample: int = 0) -> list[Any]:
        """The records edited under ``edit_sample``, in edit order (module doc); with
        :meth:`validation_split`, :meth:`validation`."""
        if self.split == "validation":
            return self.validation(edit_sample)
        pool = self.all()
        if edit_sample:
            random.Random(f"moir-edit-pool/{edit_sample}").shuffle(pool)
        return apart_by_subject(pool) if self.subjects_apart else pool

    # ------------------------------------------------------------------ provenance

    def portability(self) -> str | None:
        """The two-hop probes' file (the pocket CounterFact's when none was given and it has one)."""
        if self.given_portability is not None or self.variant is None or self.path is not None:
            return self.given_portability
        path = self._pocket_file("portability.json")
        return str(path) if path.is_file() else None

    def source(self) -> str:
        """Where the records come from (a path), for a run's parameters."""
        return str(self.path or self._pocket_file("counterfact.json"))

    def identity(self) -> dict[str, Any]:
        """What determines the records (part of every result key): the file's content, or the pocket build,
        and how it is cut (the validation split's size; the records of :meth:`validation_split`)."""
        if self.path is not None:
            out = file_identity(self.path)
        else:
            from moir_lib.pocket.build import cache_key
            from moir_lib.pocket.variants import get_variant

            out = {"pocket": fingerprint(cache_key(get_variant(self.variant)))}
        if self.validation_count or self.validation_items:
            out["held_out"] = [self.validation_count, self.validation_items]
        if self.split != "edit":
            out["split"] = self.split
        if self.subjects_apart:
            out["subjects_apart"] = True
        return out

    def describe(self) -> str:
        """Where the records come from: the records path, or ``pocket:<variant>`` (its own file)."""
        return str(self.path or f"pocket:{self.variant}")

    def _pocket_file(self, name: str) -> Path:
        from moir_lib.pocket import build

        return build(self.variant, organism=self.organism) / name


def apart_by_subject(records: Sequence[Any]) -> list[Any]:
    """``records`` reordered so that each subject's k-th record comes after every subject's (k−1)-th, the
    given order kept otherwise (a stable sort on how many records of the subject came before)."""
    seen: dict[str, int] = {}
    rank: list[int] = []
    for record in records:
        rank.append(seen.get(record.subject, 0))
        seen[record.subject] = rank[-1] + 1
    return [records[i] for i in sorted(range(len(records)), key=lambda i: (rank[i], i))]


def file_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A file's path and the start of its SHA-256."""
    p = Path(path)
    return {"file": str(p), "sha": hashlib.sha256(p.read_bytes()).hexdigest()[:16]}
