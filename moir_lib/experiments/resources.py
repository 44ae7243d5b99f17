"""What the labs on one model share: the model, its C's, editors, context templates and z targets.

Everything here is computed on the *unedited* model and reused by every point of every lab that holds
the same :class:`ModelResources` (a chapter's lab and its selection's validation lab,
:func:`moir_lib.experiments.selection.validation_lab`). :meth:`ModelResources.edited` is where a point's
edit happens: it hands out the unedited model and restores the edit layers on the way out, checked
bit-exactly.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from moir_lib.covariance.recipes import CovSettings

if TYPE_CHECKING:
    from moir_lib.covariance import CovarianceStats
    from moir_lib.editing.alphaedit import AlphaEditEditor
    from moir_lib.editing.memit import MemitEditor
    from moir_lib.editing.snapshot import WeightSnapshot
    from moir_lib.editing.target_store import TargetStore
    from moir_lib.experiments.specs import ExperimentSpec
    from moir_lib.models import LoadedModel
    from moir_lib.profiles import Profile

    AnyEditor = MemitEditor | AlphaEditEditor

__all__ = ["ModelResources"]

log = logging.getLogger(__name__)


@dataclass
class ModelResources:
    """The model of ``profile`` (loaded on first use, with a snapshot of its original edit layers) and what
    is built once on it: each C named under ``cov_settings`` with its provenance, the pocket domains' ``C_d``
    (``variant``: the pocket variant, None for a real model),
    one editor per editor × C × λ/τ, the context templates per count and sample, the z-target store."""

    profile: Profile
    cov_settings: CovSettings
    variant: str | None = None
    device: str | None = None
    progress: bool = False
    loaded: LoadedModel | None = field(default=None, init=False)
    snapshot: WeightSnapshot | None = field(default=None, init=False)
    cov_stats: dict[str, tuple[CovarianceStats, dict[str, Any]]] = field(default_factory=dict, init=False)
    domains: dict[str, CovarianceStats] | None = field(default=None, init=False)
    editors: dict[tuple[str, str, float | None, float | None], AnyEditor] = field(default_factory=dict,
                                                                                    init=False)
    template_sets: dict[tuple[int, int], list[list[str]]] = field(default_factory=dict, init=False)
    targets: TargetStore | None = field(default=None, init=False)

    def model(self) -> LoadedModel:
        """The model as it is now (loaded on first use, with a snapshot of its original edit layers)."""
        if self.loaded is None:
            from moir_lib.editing.snapshot import WeightSnapshot
            from moir_lib.models import load

            t0 = time.perf_counter()
            self.loaded = load(self.profile, device=self.device)
            self.snapshot = WeightSnapshot(self.loaded.adapter, self.profile.edit_layers)
            log.info("loaded %s in %.1f s", self.profile.model, time.perf_counter() - t0)
        return self.loaded

    def unedited(self) -> LoadedModel:
        """:meth:`model`, checked to hold its original edit-layer weights (what C's, context templates and z
        targets are computed on, and where every run starts)."""
        loaded = self.model()
        if not self.snapshot.is_original():
            raise RuntimeError("the model's edit layers differ from the original weights: a run did not "
                               "restore them")
        return loaded

    @contextlib.contextmanager
    def edited(self) -> Iterator[LoadedModel]:
        """The unedited model, to edit inside the ``with`` block; its edit layers are restored on the way
        out (also on an error) and checked to be the original weights bit for bit."""
        loaded = self.unedited()
        try:
            yield loaded
        finally:
            self.snapshot.restore()
        if not self.snapshot.is_original():
            raise RuntimeError("restoring the original weights failed")

    def covariance(self, name: str) -> CovarianceStats:
        """The C named ``name`` at the edit layers (:func:`moir_lib.covariance.recipes.build`, cached; a
        pocket variant's ``wiki-subset`` and ``oracle`` mix the domains' ``C_d``)."""
        if name not in self.cov_stats:
            from moir_lib.covariance import recipes
            from moir_lib.documents import pocket_corpus

            t0 = time.perf_counter()
            pocket_component = self.variant is not None and recipes.parse_name(name) in (("wiki-subset", 0),
                                                                                     ("oracle", 0))
            components = ({pocket_corpus(d, self.variant): c for d, c in self.domain_covariances().items()}
                          if pocket_component else None)
            loaded = None if name in self.cov_settings.files else self.unedited()  # a file needs no model
            stats, info = recipes.build(name, loaded, self.profile, self.cov_settings, components=components,
                                        progress=self.progress)
            self.cov_stats[name] = stats, {**info, "seconds": round(time.perf_counter() - t0, 2)}
            log.info("C %s: %s", name, self.cov_stats[name][1])
        return self.cov_stats[name][0]

    def cov_info(self, name: str) -> dict[str, Any]:
        """The provenance of the C named ``name`` (built by :meth:`covariance`)."""
        return self.cov_stats[name][1]

    def domain_covariances(self) -> dict[str, CovarianceStats]:
        """Pocket only: ``C_d`` of every domain's training split (the oracle's components and the distortion
        probes, :func:`moir_lib.covariance.recipes.domain_covariances`)."""
        if self.domains is None:
            from moir_lib.covariance.recipes import domain_covariances

            self.domains = domain_covariances(self.unedited(), self.profile, self.cov_settings, self.progress)
        return self.domains

    def editor(self, spec: ExperimentSpec, allow_empty: bool = False) -> AnyEditor:
        """The editor of ``spec`` (one per editor × C × λ/τ, its projectors computed once). A τ that
        leaves ``C`` no null space is refused, unless ``allow_empty`` (the points of a grid, where a τ
        selected on one C may leave another none): that AlphaEdit point edits nothing (``P = 0``, as
        its authors' code does) and its efficacy says so."""
        from moir_lib.editing.editors import make_editor

        ck = (spec.editor, spec.cov, spec.lambda_, spec.tau)
        if ck not in self.editors:
            extra = {"allow_empty": True} if spec.editor == "alphaedit" else {}
            self.editors[ck] = make_editor(spec.editor, self.profile, self.covariance(spec.cov),
                                           lambda_=spec.lambda_, tau=spec.tau, **extra)
        if spec.editor == "alphaedit" and not allow_empty:
            self.editors[ck].require_null_space()
        return self.editors[ck]

    def templates(self, n_templates: int, seed: int) -> list[list[str]]:
        """The plain prompt and ``n_templates`` prefixes sampled from the unedited model with ``seed``."""
        ck = (n_templates, seed)
        if ck not in self.template_sets:
            from moir_lib.editing.templates import sample_templates

            self.template_sets[ck] = sample_templates(self.unedited().adapter, n_templates, seed)
        return self.template_sets[ck]

    def target_store(self) -> TargetStore:
        """The z targets on the unedited model, fitted once per request set and settings and kept in
        ``$MOIR_CACHE/targets`` (:mod:`moir_lib.editing.target_store`)."""
        if self.targets is None:
            from moir_lib.editing.target_store import TargetStore
            from moir_lib.models import model_fingerprint

            self.targets = TargetStore(model_fingerprint(self.unedited().model, self.profile.revision))
        return self.targets
