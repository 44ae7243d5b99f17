"""The CounterFact records a lab edits, in the order each edit-sample seed edits them.

Pocket profiles edit the pocket CounterFact (and score its two-hop portability probes). Its
``pocket_facts`` benchmark asks the first records' facts, so the edited records are taken *after* the
``pres_limit`` facts that preservation scores, and preservation measures untouched facts; without a
limit the two overlap (a warning says so). Another records file is edited from its first record. Seed 0
edits the pool in file order, other seeds a seeded permutation of it (:meth:`EditRecords.pool`): the
edit sample is a random draw, and two C's compared on the same seed edit the same records.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from pathlib import Path
from typing import Any

from moir_lib.cache import fingerprint

__all__ = ["EditRecords"]

log = logging.getLogger(__name__)


class EditRecords:
    """The records (``records``: a CounterFact file; ``None``: the pocket CounterFact of ``variant``) and
    ``portability`` probes (a ``portability.json``; default: the pocket CounterFact's) of a lab whose
    preservation suite is ``suite`` and scores the first ``pres_limit`` items of each task."""

    def __init__(self, variant: str | None, suite: str, pres_limit: int | None, *,
                 records: str | os.PathLike[str] | None = None,
                 portability: str | os.PathLike[str] | None = None, organism: int = 0) -> None:
        if records is None and variant is None:
            raise ValueError("a non-pocket profile needs records=<CounterFact file>")
        self.variant = variant
        self.suite = suite
        self.pres_limit = pres_limit
        self.path = Path(records) if records is not None else None
        self.given_portability = str(portability) if portability is not None else None
        self.organism = organism  # every organism's build holds the same records: read the one loaded
        self._all: list[Any] | None = None

    @classmethod
    def of(cls, profile: Any, evaluation: Any, records: str | os.PathLike[str] | None = None,
           portability: str | os.PathLike[str] | None = None) -> EditRecords:
        """The records of a lab of ``profile`` scored with ``evaluation`` (its suite: ``evaluation.suite``,
        else the pocket suite for pocket profiles and the paper's otherwise)."""
        from moir_lib.models import POCKET_SPECS

        variant = POCKET_SPECS.get(profile.model)
        suite = evaluation.suite or ("pocket" if variant else "paper")
        if suite == "pocket" and variant is None:
            raise ValueError(f"the pocket suite needs a pocket profile; {profile.name!r} loads "
                             f"{profile.model}")
        if records is None and variant is None:
            raise ValueError(f"profile {profile.name!r} ({profile.model}) needs records=<CounterFact file>")
        return cls(variant, suite, evaluation.pres_limit, records=records, portability=portability,
                   organism=getattr(profile, "organism", 0))

    def all(self) -> list[Any]:
        """Every record of the file (pocket: the pocket CounterFact)."""
        if self._all is None:
            from moir_lib.data import load_counterfact

            self._all = load_counterfact(str(self.path or self._pocket_file("counterfact.json")))
        return self._all

    def pool(self, seed: int = 0) -> list[Any]:
        """The records edited under edit-sample ``seed``, in edit order (module doc)."""
        recs = list(self.all())
        skip = 0
        if self.suite == "pocket" and self.path is None:
            if self.pres_limit is None:
                log.warning("pres_limit=None: pocket_facts scores every fact, including the edited ones")
            else:
                skip = min(self.pres_limit, len(recs))
        pool = recs[skip:]
        if seed:
            random.Random(f"moir-edit-pool/{seed}").shuffle(pool)
        return pool

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
        """What determines the records (part of every result key): the file's content, or the pocket build."""
        if self.path is not None:
            return file_identity(self.path)
        from moir_lib.pocket.build import cache_key
        from moir_lib.pocket.variants import get_variant

        return {"pocket": fingerprint(cache_key(get_variant(self.variant)))}

    def describe(self) -> str:
        return str(self.path or f"pocket:{self.variant}")

    def _pocket_file(self, name: str) -> Path:
        from moir_lib.pocket import build

        return build(self.variant, organism=self.organism) / name


def file_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A file's path and the start of its SHA-256."""
    p = Path(path)
    return {"file": str(p), "sha": hashlib.sha256(p.read_bytes()).hexdigest()[:16]}
