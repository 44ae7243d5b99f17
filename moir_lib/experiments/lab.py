"""The lab: one model's editing experiments, computed only where the results table lacks them.

A :class:`Lab` owns one model (loaded lazily, only when something must be computed), the
candidate covariances ``C`` of that model, and a results table in its run directory. Asking it
for a run (:class:`RunSpec`) returns the run's tidy rows (:mod:`moir_lib.experiments.rows`),
computing only what the table does not already hold:

* **C variants** (:meth:`Lab.covariance`): ``wiki`` (the profile's ``covariance.wiki_corpus``,
  ``wiki_samples`` documents: C_Wiki), ``wiki-subset`` (an independent draw of the encyclopedic
  component of the pretraining mixture: the paper's "Dolma 1.7, Wiki subset only"), ``oracle``
  (``Σ_d w_d C_d``, per-domain covariances mixed at the pretraining proportions by
  :func:`moir_lib.covariance.mix`, appendix A.2), ``moir`` (self-generation with the profile's
  seed strategy, rand×1 in the paper, keys collected during generation: Algorithm 1) and
  ``moir-<strategy>`` (``moir-bos``, ``moir-rand2``, …: the seed ablation of Table 2), each built by
  its one recipe (:mod:`moir_lib.covariance.recipes`, shared with ``moir edit`` and chapter 03). Every
  ``C`` is cached on disk by :func:`moir_lib.covariance.estimate` /
  :func:`moir_lib.generation.self_generate` (the self-generation cache is the one ``moir edit
  --cov moir`` uses). External corpora are estimated with ``count_bos=False`` (the BOS key is one
  fixed vector per document, and Moir's keys exclude the seed as Algorithm 1 does), as in chapter 03.
* **Editing** (:meth:`Lab.edit`, the one editing run of the chapters and of ``moir edit``):
  MEMIT or AlphaEdit (:func:`moir_lib.editing.make_editor`, the profile's hyper-parameters, optional
  λ / τ per run) in the ``batch`` regime (N edits jointly) or the ``sequential`` regime (batches of
  ``seq_batch_size`` edits, scored at each milestone), run by
  :func:`moir_lib.experiments.editrun.run_edits`. In the batch regime the z targets depend only on
  the unedited model and the requests, so they are computed once per request set and shared by
  every C and both editors. After every run the edit layers are restored and checked bit-exactly
  against the original weights.
* **Evaluation** at each scored point: the CounterFact metrics of
  :class:`~moir_lib.experiments.editrun.Scorer` (ES/PS/NS, Efficacy, Generalization, Specificity,
  Fluency*, Portability, ``S_e``) on up to ``n_eval`` of the edited records, the preservation suite
  (:func:`moir_lib.evaluation.preservation.evaluate_preservation`: the pocket tasks on pocket
  profiles, the paper's on real ones; ``S_p``), the mean NLL of held-out documents of every
  pocket domain, and the *distortion* of each domain's ``down_proj`` output,
  ``tr(ΔW C_d ΔWᵀ) / tr(W C_d Wᵀ)`` (mean over edit layers): the fraction by which the edit moves
  what the layer writes on that domain's keys. It tracks which capability survives, because the
  edit's penalty weighs ``ΔW`` by ``C``: *a C protects the distribution it was sampled from*.
* **Items and uncertainty.** Each point keeps its per-item scores (:attr:`Lab.items`, ``items.parquet``
  beside ``results.parquet``; per edited record, per preservation item, per NLL document), and its rows
  carry ``n``, ``stderr`` and a 95 % interval (:func:`point_uncertainty`), so any two points that share
  records or items can be compared paired (:mod:`moir_lib.evaluation.uncertainty`, :meth:`Lab.items_of`).

**Records.** Pocket profiles edit the pocket CounterFact (and score its two-hop portability
probes). Its ``pocket_facts`` benchmark asks the first records' facts, so the edited records are
taken *after* the ``pres_limit`` facts that are scored, and facts preservation measures untouched
facts; without a limit the two overlap (a warning says so). Another records file is edited from its
first record. Seed 0 edits the pool in file order, other seeds a seeded permutation of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moir_lib.cache import fingerprint, read_checked, write_checked
from moir_lib.evaluation.uncertainty import ITEM_COLUMNS
from moir_lib.experiments.distortion import output_distortion
from moir_lib.experiments.editrun import EditRun, OnPoint, Point, Scorer, run_edits
from moir_lib.experiments.identity import ROW_VERSION, code_identity, shared_items_path, shared_path
from moir_lib.experiments.rows import (
    EDIT_METRICS,
    GROUPS,
    NONE,
    RESULTS_NAME,
    ROW_COLUMNS,
    empty_items,
    empty_rows,
    load_items,
    load_rows,
    read_items_file,
    read_rows_file,
    write_items,
    write_rows,
)
from moir_lib.experiments.specs import EDITORS, CovSettings, EvalSettings, RunSpec
from moir_lib.locks import Busy, exclusive, file_lock_path
from moir_lib.timings import timed

if TYPE_CHECKING:
    from moir_lib.covariance import CovarianceStats
    from moir_lib.editing.target_store import TargetStore
    from moir_lib.models import LoadedModel
    from moir_lib.profiles import Profile

log = logging.getLogger(__name__)


class Lab:
    """One model's editing experiments with their covariances and a cached results table.

    ``profile``: a profile name, path or :class:`~moir_lib.profiles.Profile`; ``overrides``:
    dotted profile overrides (e.g. ``{"memit.v_num_grad_steps": 10}``). ``out_dir``: the run
    directory holding ``results.parquet``. ``evaluation``: :class:`EvalSettings`.
    ``context_templates``: prefixes sampled from the model besides the plain prompt, for every editor
    (default: each editor's own, ``memit.context_templates`` / ``alphaedit.context_templates``; the
    authors' code: 5). ``seq_batch_size``: edits per batch in
    the sequential regime (the paper: 1). ``cov_settings``: :class:`CovSettings` (held resolved against
    the profile). ``records``: a CounterFact file (pocket profiles: the pocket CounterFact);
    ``portability``: two-hop probes (a pocket ``portability.json``; default: the pocket CounterFact's).
    ``reuse``: other run directories / results files whose rows count as cached. ``shared_cache``:
    also keep every scored point in ``$MOIR_CACHE/experiments`` and read it from there, so chapters and
    reruns share work (default on; ``MOIR_SHARED_RESULTS=0`` turns it off).
    """

    def __init__(self, profile: str | os.PathLike[str] | Profile, out_dir: str | os.PathLike[str], *,
                 overrides: Mapping[str, Any] | None = None, evaluation: EvalSettings | None = None,
                 cov_settings: CovSettings | None = None, context_templates: int | None = None,
                 seq_batch_size: int = 1, records: str | os.PathLike[str] | None = None,
                 portability: str | os.PathLike[str] | None = None,
                 reuse: Iterable[str | os.PathLike[str]] = (), shared_cache: bool | None = None,
                 device: str | None = None, progress: bool = False) -> None:
        from moir_lib.profiles import Profile, load_profile

        prof = profile if isinstance(profile, Profile) else load_profile(profile)
        if overrides:
            prof = prof.with_overrides(dict(overrides))
        self.profile = prof
        self.out_dir = Path(out_dir)
        self.evaluation = evaluation or EvalSettings()
        if context_templates is not None and context_templates < 0:
            raise ValueError(f"context_templates must be >= 0, got {context_templates}")
        if seq_batch_size < 1:
            raise ValueError(f"seq_batch_size must be >= 1, got {seq_batch_size}")
        self.context_templates = int(context_templates) if context_templates is not None else None
        self.seq_batch_size = int(seq_batch_size)
        self.device = device
        self.progress = progress
        from moir_lib.models import POCKET_SPECS

        self.variant = POCKET_SPECS.get(prof.model)
        self.suite = self.evaluation.suite or ("pocket" if self.variant else "paper")
        if self.suite == "pocket" and self.variant is None:
            raise ValueError(f"the pocket suite needs a pocket profile; {prof.name!r} loads {prof.model}")
        if records is None and self.variant is None:
            raise ValueError(f"profile {prof.name!r} ({prof.model}) needs records=<CounterFact file>")
        self._records_path = Path(records) if records is not None else None
        self.portability = str(portability) if portability is not None else None
        self.cov_settings = self._resolved(cov_settings or CovSettings())
        self._loaded: LoadedModel | None = None
        self._pristine: Any = None
        self._covs: dict[str, CovarianceStats] = {}
        self._cov_info: dict[str, dict[str, Any]] = {}
        self._domain_covs: dict[str, CovarianceStats] | None = None
        self._editors: dict[tuple, Any] = {}
        self._target_store: TargetStore | None = None
        self._scorer: Scorer | None = None
        self._nll_docs: dict[str, list[list[int]]] | None = None
        self._templates: dict[tuple[int, int], list[list[str]]] = {}
        self._records: list[Any] | None = None
        self.computed: list[dict[str, Any]] = []  # what this lab computed (not read from the cache)
        if shared_cache is None:  # MOIR_SHARED_RESULTS=0 turns the machine-wide copy off (tests do)
            flag = os.environ.get("MOIR_SHARED_RESULTS", "1").strip().lower()
            shared_cache = flag not in ("0", "false", "no")
        self.shared_cache = bool(shared_cache)
        self._shared_seen: set[tuple[str, int]] = set()
        own = self.out_dir / f"{RESULTS_NAME}.parquet"
        self.rows = load_rows([own]) if own.is_file() else empty_rows()
        self.items = load_items([own]) if own.is_file() else empty_items()
        #: rows and items of other runs (``reuse``): only those whose key and N a point asks for are copied
        sources = _reuse_sources(reuse) if reuse else []
        self._reused = load_rows(sources) if sources else empty_rows()
        self._reused_items = load_items(sources) if sources else empty_items()

    def _resolved(self, cov: CovSettings) -> CovSettings:
        """``cov`` with the profile's sample counts and, for pocket profiles, the pocket corpora filled in."""
        oracle = cov.oracle
        if oracle is None and self.variant is not None:
            from moir_lib.pocket import MIXTURE

            oracle = {f"pocket:{d}": w for d, w in MIXTURE.items()}
        n_samples = cov.n_samples or self.profile.generation.n_samples
        return dataclasses.replace(cov, n_samples=n_samples,
                                   strategy_samples=cov.strategy_samples or n_samples,
                                   oracle=dict(oracle) if oracle else None,
                                   wiki_subset=cov.wiki_subset or ("pocket:wiki" if self.variant else None),
                                   files={k: str(v) for k, v in cov.files.items()})

    # ------------------------------------------------------------------ identity

    def describe(self) -> dict[str, Any]:
        """The lab's settings (for ``summary.json``)."""
        return {"profile": self.profile.name, "model": self.profile.model, "suite": self.suite,
                "evaluation": dataclasses.asdict(self.evaluation),
                "context_templates": {e: self.n_templates(e) for e in EDITORS},
                "seq_batch_size": self.seq_batch_size, "cov_settings": dataclasses.asdict(self.cov_settings),
                "records": str(self._records_path or f"pocket:{self.variant}"),
                "portability": self.portability,
                "memit": dataclasses.asdict(self.profile.memit),
                "alphaedit": dataclasses.asdict(self.profile.alphaedit)}

    def _cov_recipe(self, name: str) -> dict[str, Any]:
        if name == NONE:
            return {}
        if name in self.cov_settings.files:
            return {"file": self.cov_settings.files[name]}
        cfg = self.profile.covariance
        cov = self.cov_settings
        base = {"count_bos": cov.count_bos, "seed": cov.seed, "layers": list(self.profile.edit_layers)}
        if name == "wiki":
            return {**base, "corpus": cfg.wiki_corpus, "n": cfg.wiki_samples}
        if name == "wiki-subset":
            return {**base, "corpus": self.cov_settings.wiki_subset, "n": cfg.wiki_samples, "draw": "domain"}
        if name == "oracle":
            return {**base, "mixture": self.cov_settings.oracle, "n": cfg.wiki_samples, "draw": "domain"}
        if name == "moir" or name.startswith("moir-"):
            gen = self.profile.generation
            return {"strategy": self._strategy(name), "n": self._samples(name),
                    "max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature,
                    "top_p": gen.top_p, "seed": cov.seed, "layers": list(self.profile.edit_layers)}
        raise ValueError(f"unknown C {name!r}: choose wiki, wiki-subset, oracle, moir, moir-<seed strategy> "
                         f"(e.g. moir-bos, moir-rand2) or a name given in cov_settings.files")

    def _samples(self, name: str) -> int:
        return self.cov_settings.n_samples if name == "moir" else self.cov_settings.strategy_samples

    def defined_covs(self, covs: Iterable[str]) -> list[str]:
        """The names in ``covs`` this lab can build (``oracle`` and ``wiki-subset`` need their corpora)."""
        out = []
        for c in covs:
            cov = self.cov_settings
            missing = (c == "oracle" and not cov.oracle) or (c == "wiki-subset" and not cov.wiki_subset)
            if c in self.cov_settings.files or not missing:
                out.append(c)
            else:
                log.info("C %s is not defined for profile %s: left out", c, self.profile.name)
        return out

    def _strategy(self, name: str) -> str:
        if name == "moir":
            return self.profile.generation.seed_strategy
        from moir_lib.generation import parse_seed_strategy

        strategy = name.removeprefix("moir-")
        parse_seed_strategy(strategy)  # ValueError for a bad one
        return strategy

    def _editor_settings(self, spec: RunSpec) -> dict[str, Any]:
        if spec.editor == "memit":
            m = self.profile.memit
            lam = spec.lambda_ if spec.lambda_ is not None else m.lambda_
            return {"lambda": lam, "lambda_mode": m.lambda_mode}
        if spec.editor == "alphaedit":
            a = self.profile.alphaedit
            return {"tau": spec.tau if spec.tau is not None else a.tau, "tau_mode": a.tau_mode, "l2": a.l2}
        return {}

    def key(self, spec: RunSpec) -> str:
        """Fingerprint of everything that determines the rows of ``spec`` at ``spec.n_edits``."""
        prof = self.profile.to_dict()
        prof.pop("name", None)
        for section in ("editing",):  # the grid's edit counts do not change one run's numbers
            prof.pop(section, None)
        if spec.cov in ("wiki", "wiki-subset", "oracle", NONE) or spec.cov in self.cov_settings.files:
            prof.pop("generation", None)
        if spec.editor == NONE:
            for section in ("memit", "alphaedit", "covariance", "generation"):
                prof.pop(section, None)
        record = {"v": ROW_VERSION, "code": code_identity(), "profile": prof, "editor": spec.editor,
                  "settings": self._editor_settings(spec), "regime": spec.regime, "cov": spec.cov,
                  "cov_recipe": self._cov_recipe(spec.cov),
                  "n_edits": spec.n_edits, "seed": spec.seed, "records": self._records_identity(),
                  "eval": self.evaluation.key(), "suite": self.suite}
        if spec.editor != NONE:
            record["templates"] = self.n_templates(spec.editor)
        if self.portability is not None:
            record["portability"] = _file_identity(Path(self.portability))
        if spec.regime == "sequential":
            record["seq_batch_size"] = self.seq_batch_size
            cuts = [m for m in spec.milestones if m <= spec.n_edits]
            if any(m % self.seq_batch_size for m in cuts):  # batches are cut at milestones: they shape it
                record["cuts"] = cuts
        return fingerprint(record)

    def _records_identity(self) -> dict[str, Any]:
        if self._records_path is not None:
            return _file_identity(self._records_path)
        from moir_lib.pocket.build import cache_key
        from moir_lib.pocket.variants import get_variant

        return {"pocket": fingerprint(cache_key(get_variant(self.variant)))}

    # ------------------------------------------------------------------ the cache

    def _cached(self, key: str, n: int) -> pd.DataFrame:
        hit = self.rows[(self.rows["key"] == key) & (self.rows["n_edits"] == n)]
        if not self._reused.empty:
            found = _complete(self._reused[(self._reused["key"] == key) & (self._reused["n_edits"] == n)])
            if not set(found["group"]) <= set(hit["group"]):
                it = self._reused_items
                items = it[(it["key"] == key) & (it["n_edits"] == n) & it["group"].isin(found["group"])]
                self._merge(found, write_shared=False, items=items)
                hit = self.rows[(self.rows["key"] == key) & (self.rows["n_edits"] == n)]
        if self.shared_cache and (key, n) not in self._shared_seen:
            self._shared_seen.add((key, n))
            path = shared_path(key, n)
            if read_checked(path) is not None:  # a damaged entry is removed and recomputed
                try:
                    shared = read_rows_file(path)
                except Exception as exc:  # noqa: BLE001 - a broken entry is recomputed
                    log.warning("ignoring unreadable shared result %s: %s", path, exc)
                else:
                    if not set(shared["group"]) <= set(hit["group"]):
                        items_path = shared_items_path(key, n)
                        items = read_items_file(items_path) if items_path.is_file() else None
                        self._merge(shared, write_shared=False, items=items)
                        hit = self.rows[(self.rows["key"] == key) & (self.rows["n_edits"] == n)]
        return hit

    def is_cached(self, spec: RunSpec, groups: Sequence[str] = ("edit", "preservation")) -> bool:
        """Whether every scored point of ``spec`` has rows of every group in ``groups``."""
        return all(self._have(spec.at(n), n, groups) for n in spec.points)

    def _have(self, point: RunSpec, n: int, groups: Sequence[str]) -> bool:
        have = set(self._cached(self.key(point), n)["group"])
        return set(self._needed_groups(groups, point)) <= have

    def _needed_groups(self, groups: Sequence[str], spec: RunSpec) -> list[str]:
        need = [g for g in groups if g in GROUPS]
        if spec.editor == NONE:
            need = [g for g in need if g != "distortion"]
        if self.evaluation.nll_docs == 0 or self.variant is None:
            need = [g for g in need if g not in ("nll",)]
        if self.variant is None:
            need = [g for g in need if g != "distortion"]
        return need

    def _store(self, new: pd.DataFrame, items: pd.DataFrame | None = None) -> None:
        self._merge(new, write_shared=self.shared_cache, items=items)

    def _merge(self, new: pd.DataFrame, write_shared: bool, items: pd.DataFrame | None = None) -> None:
        if new.empty:
            return
        # rows of equal key hold this lab's numbers, whichever profile (name) computed them
        new = new.assign(profile=self.profile.name, model=self.profile.model)
        rows = pd.concat([self.rows, new[list(ROW_COLUMNS)]], ignore_index=True)
        rows = rows.drop_duplicates(["key", "n_edits", "group", "metric"], keep="last")
        self.rows = rows.reset_index(drop=True)
        if items is not None and len(items):  # items first: a point's rows never outlive its items
            frames = [f for f in (self.items, items) if len(f)]
            merged = pd.concat(frames, ignore_index=True)
            self.items = merged.drop_duplicates(["key", "n_edits", "group", "unit", "item", "metric"],
                                                keep="last").reset_index(drop=True)
            write_items(self.items, self.out_dir)
        write_rows(self.rows, self.out_dir)
        if write_shared:
            for (key, n), _ in new.groupby(["key", "n_edits"]):
                point = self.rows[(self.rows["key"] == key) & (self.rows["n_edits"] == n)]
                point_items = self.items_at(key, int(n))
                path = shared_path(key, int(n))
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    if len(point_items):
                        write_checked(shared_items_path(key, int(n)),
                                      lambda p, frame=point_items: frame.to_parquet(p, index=False))
                    write_checked(path, lambda p, frame=point: frame.to_parquet(p, index=False))
                except OSError as exc:  # a read-only cache is not an error
                    log.warning("could not write the shared result %s: %s", path, exc)

    def items_at(self, key: str, n: int) -> pd.DataFrame:
        """The per-item scores of the point ``key`` at ``n`` edits (:data:`ITEM_COLUMNS` rows)."""
        return self.items[(self.items["key"] == key) & (self.items["n_edits"] == n)]

    def items_of(self, spec: RunSpec, n: int | None = None) -> pd.DataFrame:
        """The per-item scores of ``spec`` at ``n`` edits (default ``spec.n_edits``; the baseline: 0)."""
        n = (0 if spec.editor == NONE else spec.n_edits) if n is None else n
        return self.items_at(self.key(spec.at(n) if spec.editor != NONE else spec), n)

    # ------------------------------------------------------------------ the model

    @property
    def loaded(self) -> LoadedModel:
        """The model (loaded on first use) with a snapshot of its original edit-layer weights."""
        if self._loaded is None:
            from moir_lib.editing.regimes import WeightSnapshot
            from moir_lib.models import load

            t0 = time.perf_counter()
            self._loaded = load(self.profile, device=self.device)
            self._pristine = WeightSnapshot(self._loaded.adapter, self.profile.edit_layers)
            log.info("loaded %s in %.1f s", self.profile.model, time.perf_counter() - t0)
        return self._loaded

    @property
    def model_loaded(self) -> bool:
        return self._loaded is not None

    @property
    def target_store(self) -> TargetStore:
        """The batch regime's z targets on this lab's unedited model, fitted once per request set and
        settings and kept in ``$MOIR_CACHE/targets`` (:mod:`moir_lib.editing.target_store`)."""
        if self._target_store is None:
            from moir_lib.editing.target_store import TargetStore
            from moir_lib.models import model_fingerprint

            self._check_pristine()
            self._target_store = TargetStore(model_fingerprint(self.loaded.model, self.profile.revision))
        return self._target_store

    def _check_pristine(self) -> None:
        if self._pristine is not None and not self._pristine.is_original():
            raise RuntimeError("the model's edit layers differ from the original weights: a run did not "
                               "restore them")

    def records(self) -> list[Any]:
        """All CounterFact records of this lab (pocket: the pocket CounterFact)."""
        if self._records is None:
            from moir_lib.data import load_counterfact

            self._records = load_counterfact(str(self._records_path or self._pocket_file("counterfact.json")))
        return self._records

    def _pocket_file(self, name: str) -> Path:
        from moir_lib.pocket import build

        return build(self.variant) / name

    def edit_pool(self, seed: int = 0) -> list[Any]:
        """The records edited under ``seed`` (in edit order); see the module doc."""
        recs = list(self.records())
        skip = 0
        if self.suite == "pocket" and self._records_path is None:
            if self.evaluation.pres_limit is None:
                log.warning("pres_limit=None: pocket_facts scores every fact, including the edited ones")
            else:
                skip = min(self.evaluation.pres_limit, len(recs))
        pool = recs[skip:]
        if seed:
            random.Random(f"moir-edit-pool/{seed}").shuffle(pool)
        return pool

    def _portability(self) -> str | None:
        if self.portability is not None or self.variant is None or self._records_path is not None:
            return self.portability
        path = self._pocket_file("portability.json")
        return str(path) if path.is_file() else None

    def n_templates(self, editor: str) -> int:
        """Sampled prefixes ``editor`` averages over: the lab's ``context_templates``, else the profile's
        ``<editor>.context_templates``."""
        if self.context_templates is not None:
            return self.context_templates
        if editor not in EDITORS:
            raise ValueError(f"no context templates for editor {editor!r}: choose {', '.join(EDITORS)}")
        return getattr(self.profile, editor).context_templates  # the profile section named after it

    def templates(self, editor: str, seed: int) -> list[list[str]]:
        """The plain prompt and :meth:`n_templates` prefixes sampled from the unedited model."""
        k = self.n_templates(editor)
        if (k, seed) not in self._templates:
            from moir_lib.editing.templates import sample_templates

            if k:
                self._check_pristine()
            self._templates[k, seed] = sample_templates(self.loaded.adapter, k, seed)
        return self._templates[k, seed]

    # ------------------------------------------------------------------ covariances

    def covariance(self, name: str) -> CovarianceStats:
        """The C named ``name`` for the edit layers (estimated or read from the disk cache)."""
        if name not in self._covs:
            t0 = time.perf_counter()
            self._covs[name], info = self._build_cov(name)
            info["seconds"] = round(time.perf_counter() - t0, 2)
            self._cov_info[name] = info
            log.info("C %s: %s", name, info)
        return self._covs[name]

    def cov_info(self) -> pd.DataFrame:
        """One row per C built so far: recipe, token count, build time."""
        return pd.DataFrame([{"cov": k, **{kk: (json.dumps(vv) if isinstance(vv, (dict, list)) else vv)
                                           for kk, vv in v.items()}} for k, v in self._cov_info.items()])

    def _recipe_settings(self) -> Any:
        """The lab's :class:`moir_lib.covariance.recipes.Settings`: its :class:`CovSettings` applied."""
        from moir_lib.covariance import recipes

        cov = self.cov_settings
        return recipes.Settings.from_profile(self.profile, seed=cov.seed, count_bos=cov.count_bos,
                                             n_samples=cov.n_samples, strategy_samples=cov.strategy_samples,
                                             oracle=cov.oracle, wiki_subset=cov.wiki_subset,
                                             progress=self.progress)

    def domain_covariances(self) -> dict[str, CovarianceStats]:
        """Pocket only: ``C_d`` of every domain's training split (an independent draw from C_Wiki's),
        chat included (the post-training data). The oracle's components and the distortion probes
        (:func:`moir_lib.covariance.recipes.component`)."""
        if self.variant is None:
            raise ValueError("per-domain covariances are defined for the pocket world only")
        if self._domain_covs is None:
            from moir_lib.covariance import recipes
            from moir_lib.pocket import DOMAINS

            self._check_pristine()
            settings = self._recipe_settings()
            self._domain_covs = {d: recipes.component(f"pocket:{d}", self.loaded, settings) for d in DOMAINS}
        return self._domain_covs

    def _build_cov(self, name: str) -> tuple[CovarianceStats, dict[str, Any]]:
        """``(C, provenance)`` of :func:`moir_lib.covariance.recipes.build` (a ``cov_settings.files`` entry:
        that file; pocket components: this lab's domain C's)."""
        from moir_lib.covariance import recipes

        recipe = self._cov_recipe(name)
        settings = self._recipe_settings()
        if "file" in recipe:
            return recipes.from_file(recipe["file"], settings)
        self._check_pristine()
        components = None
        if self.variant is not None and name in ("wiki-subset", "oracle"):
            components = {f"pocket:{d}": c for d, c in self.domain_covariances().items()}
        return recipes.build(name, self.loaded, settings, components=components)

    def editor(self, spec: RunSpec) -> Any:
        """The editor of ``spec`` (cached per editor × C × λ/τ)."""
        from moir_lib.editing.regimes import make_editor

        ck = (spec.editor, spec.cov, spec.lambda_, spec.tau)
        if ck not in self._editors:
            self._editors[ck] = make_editor(spec.editor, self.profile, self.covariance(spec.cov),
                                            lambda_=spec.lambda_, tau=spec.tau)
        return self._editors[ck]

    # ------------------------------------------------------------------ evaluation

    @property
    def scorer(self) -> Scorer:
        """How edits are scored (:attr:`evaluation`, the portability probes), with the unedited model's
        fluency per record, kept across runs."""
        if self._scorer is None:
            self._scorer = Scorer(self.evaluation, self._portability())
        return self._scorer

    def _domain_docs(self) -> dict[str, list[list[int]]]:
        if self._nll_docs is None:
            from moir_lib.analysis.nll import tokenize_documents
            from moir_lib.corpora import load_corpus
            from moir_lib.pocket import DOMAINS

            tok = self.loaded.tokenizer
            n = self.evaluation.nll_docs
            seed = self.cov_settings.seed
            self._nll_docs = {d: tokenize_documents(tok, list(load_corpus(f"pocket:{d}", n=n, seed=seed,
                                                                          split="validation")))
                              for d in DOMAINS}
        return self._nll_docs

    def evaluate(self, edited: Sequence[Any], groups: Sequence[str], items: list[pd.DataFrame] | None = None
                 ) -> dict[tuple[str, str], float]:
        """Score the model as it is now: ``{(group, metric): value}`` for the requested groups; the
        per-item scores are appended to ``items`` (``group, unit, item, metric, value`` frames)."""
        items = [] if items is None else items
        out = {}
        if "edit" in groups and edited:
            result = self.scorer.score(self.loaded, edited)
            out = _edit_values(result)
            items.append(self._record_items(result))
        return {**out, **self._measure(edited, groups, items)}

    def _record_items(self, result: Any) -> pd.DataFrame:
        """Per edited record: the indicators, token accuracies, target probabilities and fluency (edited and
        unedited, the two sides of Fluency*)."""
        recs = result.records
        table = recs[[c for c in RECORD_ITEM_METRICS if c in recs.columns]].copy()
        table["fluency_base"] = [self.scorer.pre_fluency.get(int(c), math.nan) for c in recs["case_id"]]
        table["prob_new"] = np.exp(-recs["nll_new"].astype(float))
        table["prob_true"] = np.exp(-recs["nll_true"].astype(float))
        table["item"] = recs["case_id"].astype(str)
        long = table.melt(id_vars="item", var_name="metric", value_name="value")
        return long.assign(group="edit", unit="record")

    def _measure(self, edited: Sequence[Any], groups: Sequence[str], items: list[pd.DataFrame] | None = None
                 ) -> dict[tuple[str, str], float]:
        """The groups besides ``edit``: preservation, the pocket domains' NLL, the distortion."""
        items = [] if items is None else items
        out: dict[tuple[str, str], float] = {}
        model, tok = self.loaded.model, self.loaded.tokenizer
        if "preservation" in groups:
            from moir_lib.evaluation.preservation import evaluate_preservation

            ev = self.evaluation
            with _quiet(not self.progress):
                res = evaluate_preservation(model, tok, self.suite, limit=ev.pres_limit, data_dir=ev.data_dir,
                                            batch_size=max(ev.batch_size, 16),
                                            allow_code_eval=ev.allow_code_eval, pocket_variant=self.variant)
            for label, v in res.summary["scores"].items():
                out[("preservation", label)] = _num(v)
            table = res.table
            raw = table[(table["task"] == "pocket_arith_raw") & (table["metric"] == "exact_match")
                        & (table["filter"] == "strict-match")]
            if len(raw):
                out[("preservation", "arith_raw")] = _num(raw["value"].iloc[0])
            out[("preservation", "S_p")] = _num(res.summary["S_p"])
            if res.items is not None and len(res.items):
                pi = res.items
                items.append(pd.DataFrame({"group": "preservation",
                                           "unit": pi["label"].fillna(pi["task"].str.removeprefix("pocket_")),
                                           "item": pi["item"].astype(str),
                                           "metric": np.where(pi["label"].notna(), "correct", "reported"),
                                           "value": pi["value"].astype(float)}))
        if "nll" in groups and self.variant is not None and self.evaluation.nll_docs:
            from moir_lib.analysis.nll import document_nll

            for d, docs in self._domain_docs().items():
                frame = document_nll(model, tok, docs, corpus=d, batch_size=16, progress=False)
                out[("nll", d)] = float(np.nanmean(frame["nll"]))
                items.append(pd.DataFrame({"group": "nll", "unit": d, "metric": "nll",
                                           "item": [str(i) for i in range(len(frame))],
                                           "value": frame["nll"].astype(float).to_numpy()}))
        if "distortion" in groups and self.variant is not None and edited:
            for d, value in self.distortion().items():
                out[("distortion", d)] = value
        return out

    @timed("distortion")
    def distortion(self) -> dict[str, float]:
        """:func:`output_distortion` per pocket domain, averaged over the edit layers (current weights)."""
        import torch

        covs = self.domain_covariances()
        out = {}
        for d, C in covs.items():
            vals = [output_distortion(self._pristine.original[layer].detach().to("cpu", torch.float64),
                                      self._pristine.delta(layer).to("cpu"), C.mean(layer))
                    for layer in self.profile.edit_layers]
            out[d] = float(np.mean(vals))
        return out

    # ------------------------------------------------------------------ running

    def baseline(self, groups: Sequence[str] = ("edit", "preservation", "nll"), seed: int = 0,
                 n_records: int | None = None) -> pd.DataFrame:
        """Rows of the unedited model (``editor = regime = cov = "none"``, ``N = 0``); the edit
        metrics are those of the first ``n_records`` (default ``n_eval``) records of the pool."""
        spec = RunSpec.baseline()
        spec = dataclasses.replace(spec, seed=seed)
        return self._run(spec, groups, n_pre=n_records)

    def run(self, spec: RunSpec, groups: Sequence[str] = ("edit", "preservation", "nll", "distortion")
            ) -> pd.DataFrame:
        """The rows of ``spec`` (every scored point), computing only the missing ones."""
        if spec.editor == NONE:
            return self.baseline(groups, seed=spec.seed)
        return self._run(spec, groups)

    def run_all(self, specs: Iterable[RunSpec], groups: Sequence[str] = ("edit", "preservation", "nll",
                                                                          "distortion")) -> pd.DataFrame:
        """Rows of every run in ``specs`` (one table).

        With the machine-wide results cache, a run that another process is computing is put off rather
        than waited for: this one goes on with the next, and reads the runs it put off at the end
        (waiting for those still being computed). Processes given overlapping lists (two chapters, a
        chapter and its helper in :func:`moir_lib.runs.execute_book`) thus share the work, each run
        computed once, by one of them."""
        specs = list(specs)
        first = [self._run(s, groups, wait=False) if s.editor != NONE else None for s in specs]
        put_off = sum(f is None and s.editor != NONE for f, s in zip(first, specs, strict=True))
        if put_off:
            log.info("%d run(s) put off while another process computes them", put_off)
        frames = [f if f is not None else self.run(s, groups) for f, s in zip(first, specs, strict=True)]
        return pd.concat(frames, ignore_index=True) if frames else empty_rows()

    def _rows_for(self, spec: RunSpec, n: int) -> pd.DataFrame:
        return self._cached(self.key(spec.at(n)), n)

    def _collect(self, spec: RunSpec, groups: Sequence[str]) -> pd.DataFrame:
        frames = [self._rows_for(spec, n) for n in spec.points]
        rows = pd.concat(frames, ignore_index=True) if frames else empty_rows()
        keep = set(self._needed_groups(groups, spec)) | {"cost"}
        return rows[rows["group"].isin(keep)].reset_index(drop=True)

    def _make_rows(self, spec: RunSpec, n: int, values: Mapping[tuple[str, str], float],
                   items: Sequence[pd.DataFrame] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The point's rows (with their uncertainty) and its items, both keyed by the point."""
        settings = self._editor_settings(spec)
        key = self.key(spec.at(n))
        frames = [f for f in items if len(f)]
        point_items = (pd.concat(frames, ignore_index=True).assign(key=key, n_edits=int(n))
                       [list(ITEM_COLUMNS)] if frames else empty_items())
        base = {"profile": self.profile.name, "model": self.profile.model, "editor": spec.editor,
                "regime": spec.regime, "cov": spec.cov, "n_edits": int(n), "seed": int(spec.seed),
                "lambda": float(settings.get("lambda", math.nan)),
                "tau": float(settings.get("tau", math.nan)), "key": key}
        rows = pd.DataFrame([{**base, "group": g, "metric": m, "value": _num(v),
                              **point_uncertainty(point_items, g, m)}
                             for (g, m), v in values.items()], columns=list(ROW_COLUMNS))
        return rows, point_items

    def _run(self, spec: RunSpec, groups: Sequence[str], n_pre: int | None = None,
             wait: bool = True) -> pd.DataFrame | None:
        """The rows of ``spec``, computing its missing points; ``None`` (nothing done) when ``wait`` is
        false and another process holds the run."""
        need = self._needed_groups(groups, spec)
        if all(self._have(spec.at(n), n, need) for n in spec.points):
            return self._collect(spec, groups)
        try:
            with self._point_lock(spec, wait):  # another process computing the same run: wait, then read it
                missing = [n for n in spec.points if not self._have(spec.at(n), n, need)]
                if missing:
                    self._compute(spec, need, missing, n_pre)
        except Busy:
            return None
        return self._collect(spec, groups)

    @contextlib.contextmanager
    def _point_lock(self, spec: RunSpec, wait: bool = True) -> Iterator[None]:
        """With the machine-wide results cache: hold the lock of ``spec``'s last point, so that two
        processes (chapters run side by side, a chapter and the pocket report) compute a run once; the
        waiting one then reads the other's points from the cache (``wait`` false: :class:`Busy`)."""
        with contextlib.ExitStack() as stack:
            if self.shared_cache:
                n = max(spec.points)
                what = f"editing run {spec.editor} {spec.regime} C={spec.cov} N={n}"
                try:
                    stack.enter_context(exclusive(file_lock_path(shared_path(self.key(spec.at(n)), n)), what,
                                                  wait=wait))
                except ValueError as exc:  # an unwritable cache: compute without the lock
                    log.warning("%s", exc)
                self._shared_seen.clear()  # read again what another process stored while this one waited
            yield

    def _compute(self, spec: RunSpec, need: Sequence[str], missing: list[int], n_pre: int | None) -> None:
        """Compute the points ``missing`` of ``spec`` (groups ``need``) and store their rows."""
        t_start = time.perf_counter()
        if spec.editor == NONE:
            self.loaded  # noqa: B018 - load the model (and its pristine snapshot)
            self._check_pristine()
            pool = self.edit_pool(spec.seed)
            k = n_pre or self.evaluation.n_eval or len(pool)
            t0 = time.perf_counter()
            items: list[pd.DataFrame] = []
            values = self.evaluate(pool[:k], need, items)
            values[("cost", "eval_s")] = time.perf_counter() - t0
            self._store(*self._make_rows(spec, 0, values, items))
            self.computed.append({"spec": spec, "points": [0]})
            return
        if "distortion" in need and self.variant is not None:
            self.domain_covariances()  # estimated on the unedited model

        def on_point(point: Point, done: list[Any]) -> None:
            t0 = time.perf_counter()
            items: list[pd.DataFrame] = []
            values = {}
            if point.counterfact is not None:
                values = _edit_values(point.counterfact)
                items.append(self._record_items(point.counterfact))
            values.update(self._measure(done, need, items))
            values[("cost", "edit_s")] = point.edit_s
            values[("cost", "eval_s")] = point.eval_s + time.perf_counter() - t0
            # stored now: a crash later keeps this point
            self._store(*self._make_rows(spec, point.n_edits, values, items))

        self.edit(spec.at(max(missing)), score_edits="edit" in need, score_at=missing, on_point=on_point)
        self.computed.append({"spec": spec, "points": missing, "seconds": time.perf_counter() - t_start})
        log.info("%s %s C=%s N=%s seed %d: computed %s in %.1f s", spec.editor, spec.regime, spec.cov,
                 spec.n_edits, spec.seed, missing, time.perf_counter() - t_start)

    def edit(self, spec: RunSpec, *, score_edits: bool = True, score_unedited: bool = False,
             score_at: Collection[int] | None = None, on_point: OnPoint | None = None,
             checkpoint_dir: str | os.PathLike[str] | None = None,
             out_dir: str | os.PathLike[str] | None = None) -> EditRun:
        """The editing run ``spec`` on this lab's model: :func:`~moir_lib.experiments.editrun.run_edits`
        on the first ``spec.n_edits`` records of :meth:`edit_pool`, with :meth:`editor` (its C from
        :meth:`covariance`) and :meth:`templates`; the weights are restored and checked bit-exactly
        afterwards. :meth:`run` scores the chapters' points with it, ``moir edit`` calls it directly.

        ``score_edits``: CounterFact scores (:attr:`scorer`); the other arguments are
        :func:`~moir_lib.experiments.editrun.run_edits`'s. ``run.parameters`` describes the run.
        """
        t_start = time.perf_counter()
        timings = {}
        if not self.model_loaded:
            self.loaded  # noqa: B018 - load the model (and its pristine snapshot)
            timings["load_s"] = time.perf_counter() - t_start
        self._check_pristine()
        pool = self.edit_pool(spec.seed)
        if spec.n_edits > len(pool):
            raise ValueError(f"{spec}: {spec.n_edits} edits requested but only {len(pool)} records are "
                             f"available")
        t0 = time.perf_counter()
        self.covariance(spec.cov)
        timings["covariance_s"] = time.perf_counter() - t0
        editor = self.editor(spec)
        t0 = time.perf_counter()
        templates = self.templates(spec.editor, spec.seed)
        timings["templates_s"] = time.perf_counter() - t0
        try:
            run = run_edits(self.loaded, editor, pool[:spec.n_edits], spec, templates=templates,
                            batch_size=self.seq_batch_size, scorer=self.scorer if score_edits else None,
                            score_unedited=score_unedited, score_at=score_at, on_point=on_point,
                            checkpoint_dir=checkpoint_dir, out_dir=out_dir, targets=self.target_store)
        finally:
            self._pristine.restore()
        if not self._pristine.is_original():
            raise RuntimeError("restoring the original weights failed")
        run.timings = {**timings, **run.timings, "total_s": time.perf_counter() - t_start}
        run.parameters = self._run_parameters(spec, editor)
        return run

    def _run_parameters(self, spec: RunSpec, editor: Any) -> dict[str, Any]:
        """What an :class:`EditRun` of ``spec`` was (``summary.json``'s parameters)."""
        ev = self.evaluation
        return {"profile": self.profile.to_dict(), "editor": editor.config(), "cov": self._cov_info[spec.cov],
                "records": str(self._records_path or self._pocket_file("counterfact.json")),
                "portability": self._portability(), "n_edits": spec.n_edits, "regime": spec.regime,
                "batch_size": self.seq_batch_size, "milestones": list(spec.milestones), "seed": spec.seed,
                "cov_seed": self.cov_settings.seed, "device": self.device,
                "context_templates": self.n_templates(spec.editor),
                "templates": self.templates(spec.editor, spec.seed),
                "spectrum": {str(k): v for k, v in editor.spectrum.items()},
                "projector": {str(k): v for k, v in getattr(editor, "projector_info", {}).items()},
                "fluency": ev.fluency, "max_gen_tokens": ev.max_gen_tokens,
                "evaluation": dataclasses.asdict(ev)}

    # ------------------------------------------------------------------ tables

    def table(self, specs: Iterable[RunSpec] | None = None) -> pd.DataFrame:
        """All rows of this lab (or of ``specs``), tidy."""
        if specs is None:
            return self.rows.copy()
        keys = {self.key(s.at(n)) for s in specs for n in s.points}
        return self.rows[self.rows["key"].isin(keys)].reset_index(drop=True)


#: The per-record CounterFact columns kept as items (besides ``fluency_base``, ``prob_new``, ``prob_true``).
RECORD_ITEM_METRICS: tuple[str, ...] = ("ES", "PS", "NS", "NS_all", "Efficacy", "Generalization",
                                        "Specificity", "Portability", "fluency")
#: Rows whose interval is a bootstrap over items (the others: a rate's normal interval).
_COMPOSITES = {("edit", "S_e"), ("edit", "S_e_noport"), ("edit", "Fluency*"), ("preservation", "S_p")}


def point_uncertainty(items: pd.DataFrame, group: str, metric: str) -> dict[str, float]:
    """``n``, ``stderr``, ``lo``, ``hi`` of one row from its point's items: a rate's standard error and
    normal 95 % interval, a composite's (``S_e``, ``S_e_noport``, ``Fluency*``, ``S_p``) seeded bootstrap
    (:mod:`moir_lib.evaluation.uncertainty`); NaN where the row has no items (distortion, cost)."""
    from moir_lib.evaluation import uncertainty as unc

    nan = {"n": math.nan, "stderr": math.nan, "lo": math.nan, "hi": math.nan}
    if items.empty or group not in ("edit", "preservation", "nll"):
        return nan
    if (group, metric) in _COMPOSITES:
        est = unc.estimate(items, metric)
    elif group == "edit":
        sel = items[(items["group"] == "edit") & (items["metric"] == metric)]
        est = unc.rate(sel["value"].to_numpy()) if len(sel) else None
    else:
        sel = items[(items["group"] == group) & (items["unit"] == metric)]
        est = unc.rate(sel["value"].to_numpy()) if len(sel) else None
    if est is None or est.n == 0:
        return nan
    return {"n": float(est.n), "stderr": est.stderr, "lo": est.lo, "hi": est.hi}


def _edit_values(result: Any) -> dict[tuple[str, str], float]:
    """The ``edit`` rows of a CounterFact result: :data:`EDIT_METRICS`, ``S_e_noport`` being the harmonic
    mean (eq. (se)) without Portability."""
    from moir_lib.evaluation.scores import EDIT_SCORES, harmonic_mean

    m = result.metrics
    out = {("edit", name): _num(m.get(name)) for name in EDIT_METRICS[:-1]}
    four = {k: m.get(k) for k in EDIT_SCORES["S_e_noport"]}
    out[("edit", "S_e_noport")] = (harmonic_mean(four, skip_none=True)
                                  if any(v is not None for v in four.values()) else math.nan)
    return out


#: metrics a group's rows must all hold to be reused (a partial copy is recomputed, not half used)
_REQUIRED = {"edit": set(EDIT_METRICS), "preservation": {"S_p"}}


def _complete(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the groups of ``rows`` (one point) that hold every metric :data:`_REQUIRED` names."""
    ok = [g for g, part in rows.groupby("group") if _REQUIRED.get(g, set()) <= set(part["metric"])]
    return rows[rows["group"].isin(ok)]


def _reuse_sources(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The ``reuse`` paths, each an existing results file or a directory holding one (``ValueError``
    naming the first that is not)."""
    out = []
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(f"reuse path {p} does not exist: give a run directory or a "
                             f"{RESULTS_NAME}.parquet file")
        if p.is_dir() and not any(p.rglob(f"{RESULTS_NAME}.parquet")):
            raise ValueError(f"reuse path {p} holds no {RESULTS_NAME}.parquet: give a run directory of an "
                             f"earlier run")
        out.append(p)
    return out


def _file_identity(path: Path) -> dict[str, Any]:
    import hashlib

    return {"file": str(path), "sha": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}


def _num(v: Any) -> float:
    if v is None:
        return math.nan
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


@contextlib.contextmanager
def _quiet(enabled: bool = True) -> Iterator[None]:
    """lm-eval's per-task warnings and progress bars off (they would fill every notebook cell)."""
    if not enabled:
        yield
        return
    import io
    import logging as _logging

    loggers = [_logging.getLogger(n) for n in ("lm_eval", "lm-eval", "datasets", "evaluate")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(_logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
