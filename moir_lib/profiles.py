"""Typed model profiles: which model, which layers, which editor hyper-parameters.

A profile is one flat YAML file in ``data/profiles/<name>.yaml`` (or any path) read into
frozen dataclasses and validated on load, so a typo fails with the list of valid keys
instead of silently falling back to a default. Every key is required except ``revision`` and
``organism``;
the three paper profiles carry the values of appendix C (edit layers from causal tracing,
C.1/C.4; MEMIT/AlphaEdit hyper-parameters and the self-generation budget, C.2)::

    name: olmo2-7b-instruct
    model: allenai/OLMo-2-1124-7B-Instruct   # hub id | local folder | "pocket" | "pocket-micro"
    revision: null                            # hub revision (part of cache fingerprints)
    organism: 0                               # pocket models: which organism of the recipe (default 0)
    dtype: float16                            # model load dtype; edits are always float64
    edit_layers: [9, 10, 11, 12, 13, 14]
    generation: {n_samples, max_new_tokens, seed_strategy, temperature, top_p, batch_size}
    covariance: {tokens_per_batch, wiki_corpus, wiki_samples}
    memit: {lambda, lambda_mode, lambda_grid, v_num_grad_steps, v_lr, v_weight_decay, kl_factor,
            clamp_norm_factor, context_templates}
    alphaedit: {tau, tau_mode, tau_grid, l2, context_templates}
    editing: {batch_sizes_memit, batch_sizes_alphaedit, sequential_milestones, validation_records,
              validation_items, subjects_apart}

A ``model`` (or ``covariance.wiki_corpus``) that starts with ``./`` or ``../`` is a local path
relative to the profile file's folder, so a profile names a local checkpoint the same way
whatever the working directory. Each section's keys are documented on its dataclass below.
Use :func:`load_profile` and :func:`list_profiles`; :meth:`Profile.with_overrides` returns a
re-validated copy (for notebook parameters and experiment grids).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = [
    "AlphaEditConfig",
    "CovarianceConfig",
    "EditingConfig",
    "GenerationConfig",
    "MemitConfig",
    "Profile",
    "RETIRED_PROFILES",
    "ProfileError",
    "list_profiles",
    "load_profile",
    "profiles_dir",
]

Dtype = Literal["float16", "bfloat16", "float32", "float64"]
ThresholdMode = Literal["absolute", "relative"]

#: profiles merged into another -> the profile that replaces them
RETIRED_PROFILES = {"pocket-editable": "pocket"}

_STRATEGY_RE = re.compile(r"^(bos|rand[1-9][0-9]*|prompt:.+)$", re.DOTALL)


class ProfileError(ValueError):
    """A profile file that cannot be read or does not match the schema."""


def _f(check: str | None = None, key: str | None = None, doc: str = "") -> Any:
    """A required dataclass field; ``check`` in {"positive", "nonneg", "prob", "increasing",
    "strategy"}; ``key`` is the YAML name when it differs from the attribute (``lambda``)."""
    return field(metadata={"check": check, "key": key, "doc": doc})


_TEMPLATES_DOC = ("prefixes sampled from the model to average k* and z over, besides the plain prompt "
                  "(ROME/MEMIT/AlphaEdit code: 5)")


@dataclass(frozen=True)
class GenerationConfig:
    """Self-generation (appendix A.1, algorithm 1; C.2 "Moir generation")."""

    n_samples: int = _f("positive", doc="number of generated sequences (paper: 100 000)")
    max_new_tokens: int = _f("positive", doc="new tokens per sequence (paper: 256)")
    seed_strategy: str = _f("strategy", doc='"bos" | "rand1".."randK" | "prompt:<text>" (paper: rand1)')
    temperature: float = _f("positive", doc="sampling temperature (paper: 1.0, untruncated)")
    top_p: float = _f("prob", doc="nucleus mass (paper: 1.0)")
    batch_size: int = _f("positive", doc="sequences generated per forward batch")


@dataclass(frozen=True)
class CovarianceConfig:
    """Estimation of C = E[k kᵀ] at the ``down_proj`` input (eq. (kfac)'s ``A_ℓ`` / appendix A.1, C.2)."""

    tokens_per_batch: int = _f("positive", doc="tokens per forward batch collecting keys (paper: 12 288)")
    wiki_corpus: str = _f(doc='external baseline corpus, "hf_dataset:config" (C_Wiki)')
    wiki_samples: int = _f("positive", doc="articles sampled for C_Wiki (paper: 100 000)")


@dataclass(frozen=True)
class MemitConfig:
    """MEMIT hyper-parameters (appendix C.2; EasyEdit's names in brackets)."""

    lambda_: float = _f("positive", key="lambda", doc="preservation weight λ on C [mom2_update_weight]")
    lambda_mode: ThresholdMode = _f(
        doc='"absolute": λ as given; "relative": λ · mean diag(K Kᵀ) / mean diag(C)'
    )
    lambda_grid: tuple[float, ...] = _f("positive", doc="λ values searched on the validation split (in "
                                                        "lambda_mode's units; paper: 0.5K-30K); one pins λ")
    v_num_grad_steps: int = _f("positive", doc="gradient steps of the target-value (z) optimisation")
    v_lr: float = _f("positive", doc="learning rate of the z optimisation")
    v_weight_decay: float = _f("nonneg", doc="weight decay of the z optimisation")
    kl_factor: float = _f("nonneg", doc="weight of the essence-drift KL term")
    clamp_norm_factor: float = _f("positive", doc="max ‖δ‖ as a multiple of ‖h‖ (EasyEdit default 4)")
    context_templates: int = _f("nonneg", doc=_TEMPLATES_DOC)


@dataclass(frozen=True)
class AlphaEditConfig:
    """AlphaEdit null-space projection (appendix C.2)."""

    tau: float = _f("positive", doc="eigenvalue threshold τ of the null-space projector P")
    tau_mode: ThresholdMode = _f(doc='"absolute": eigenvalues < τ; "relative": < τ · largest eigenvalue')
    tau_grid: tuple[float, ...] = _f("positive", doc="τ values searched on the validation split (paper's "
                                                     "grid); one value pins τ")
    l2: float = _f("nonneg", doc="ridge term on the update (AlphaEdit's L2)")
    context_templates: int = _f("nonneg", doc=_TEMPLATES_DOC)


@dataclass(frozen=True)
class EditingConfig:
    """Edit counts of the batch and sequential regimes (appendix C.1) and the validation split that selects
    the editors' τ and λ (C.2: "selected ... on a held-out validation split")."""

    batch_sizes_memit: tuple[int, ...] = _f("positive", doc="N for MEMIT batch editing (paper: 1K-5K)")
    batch_sizes_alphaedit: tuple[int, ...] = _f("positive", doc="N for AlphaEdit batch editing (5K-20K)")
    sequential_milestones: tuple[int, ...] = _f("increasing", doc="cumulative edit counts evaluated (10-5K)")
    validation_records: int = _f("nonneg", doc="CounterFact records held out at the end of the records file, "
                                               "never edited by a chapter: the split that selects τ and λ")
    validation_items: int = _f("nonneg", doc="preservation items per task the selection scores, after the "
                                             "chapters' pres_limit (pocket: those facts are not edited)")
    subjects_apart: bool = _f(doc="edit each subject's k-th record after every subject's (k-1)-th, so a "
                                  "batch's first edits are about distinct subjects (pocket: its people "
                                  "have 2-3 records each); false: the records file's order")


#: keys of earlier schemas -> where they live now (named in the error)
_MOVED = {"context_templates": "context_templates is set per editor now: memit.context_templates and "
                               "alphaedit.context_templates"}

_SECTIONS: dict[str, type] = {
    "generation": GenerationConfig,
    "covariance": CovarianceConfig,
    "memit": MemitConfig,
    "alphaedit": AlphaEditConfig,
    "editing": EditingConfig,
}


@dataclass(frozen=True)
class Profile:
    """One model's complete configuration; see the module docstring for the YAML schema."""

    name: str = _f(doc="profile name (the file's stem)")
    model: str = _f(doc='hub id | local folder | "pocket" | "pocket-micro"')
    dtype: Dtype = _f(doc="model load dtype (edits are always computed in float64)")
    edit_layers: tuple[int, ...] = _f("increasing", doc="MLP layers edited (appendix C.1, causal tracing)")
    generation: GenerationConfig = _f()
    covariance: CovarianceConfig = _f()
    memit: MemitConfig = _f()
    alphaedit: AlphaEditConfig = _f()
    editing: EditingConfig = _f()
    revision: str | None = field(default=None, metadata={"check": None, "key": None, "doc": "hub revision"})
    #: left out of :meth:`to_dict` at 0, so the result keys of organism 0 are those of a profile without it
    organism: int = field(default=0, metadata={
        "check": "nonneg", "key": None, "omit_default": True,
        "doc": "pocket models: the organism of the recipe (0: its own model; K >= 1: the same data and "
               "world with another weight initialisation and data order; moir_lib.pocket.organisms)"})
    path: Path | None = field(default=None, compare=False, metadata={"internal": True})

    @property
    def torch_dtype(self) -> Any:
        """``dtype`` as a ``torch.dtype``."""
        import torch

        return getattr(torch, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        """The profile as YAML-keyed plain data (for fingerprints and ``summary.json``)."""
        return _to_dict(self)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Profile:
        """A re-validated copy with dotted keys replaced, e.g. ``{"memit.lambda": 5000}``."""
        data = self.to_dict()
        for dotted, value in overrides.items():
            parts = dotted.split(".")
            target = data
            for part in parts[:-1]:
                if not isinstance(target.get(part), dict):
                    raise ProfileError(f"override {dotted!r}: {part!r} is not a section; "
                                       f"sections: {', '.join(_SECTIONS)}")
                target = target[part]
            target[parts[-1]] = value
        return _build_profile(data, where=f"profile {self.name!r} with overrides", path=self.path)


def profiles_dir() -> Path:
    """``$MOIR_PROFILES`` or the repository's ``data/profiles`` folder."""
    env = os.environ.get("MOIR_PROFILES")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[1] / "data" / "profiles"


def list_profiles() -> list[str]:
    """Names of the profiles in :func:`profiles_dir`, sorted."""
    root = profiles_dir()
    if not root.is_dir():
        return []
    return sorted(p.stem for p in root.glob("*.yaml"))


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile by name (``data/profiles/<name>.yaml``) or by file path.

    Raises ``FileNotFoundError`` listing the available profiles when there is no such
    profile, and :class:`ProfileError` (a ``ValueError``) naming the file and key when the
    content does not match the schema.
    """
    text = str(name_or_path)
    candidate = Path(text).expanduser()
    looks_like_path = text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text
    if looks_like_path:
        path = candidate
    else:
        path = profiles_dir() / f"{text}.yaml"
    if not path.is_file() and not looks_like_path and text in RETIRED_PROFILES:
        raise FileNotFoundError(f"the profile {text!r} is now {RETIRED_PROFILES[text]!r} (one pocket model "
                                f"serves every chapter): use --profile {RETIRED_PROFILES[text]}")
    if path.is_dir():
        raise ProfileError(f"profile {path} is a directory: give a profile file (.yaml) or a profile name")
    if not path.is_file():
        available = ", ".join(list_profiles()) or "(none)"
        raise FileNotFoundError(
            f"no profile {text!r} (looked for {path}); available profiles in {profiles_dir()}: {available}"
        )
    where = f"profile {path.name} ({path})"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(f"{where}: not valid YAML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}): save it as "
                           f"UTF-8") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: expected a mapping at the top level, got {type(raw).__name__}")
    raw.setdefault("name", path.stem)
    _resolve_relative_paths(raw, path.parent)
    if not looks_like_path and raw["name"] != path.stem:
        raise ProfileError(f"{where}: name {raw['name']!r} differs from the file name {path.stem!r}")
    return _build_profile(raw, where=where, path=path)


def _resolve_relative_paths(raw: dict[str, Any], folder: Path) -> None:
    """``./x`` and ``../x`` in ``model`` and ``covariance.wiki_corpus``: relative to ``folder``."""
    def resolved(value: Any) -> Any:
        if isinstance(value, str) and value.startswith(("./", "../")):
            return str((folder / value).resolve())
        return value

    if "model" in raw:
        raw["model"] = resolved(raw["model"])
    if isinstance(raw.get("covariance"), dict) and "wiki_corpus" in raw["covariance"]:
        raw["covariance"] = {**raw["covariance"], "wiki_corpus": resolved(raw["covariance"]["wiki_corpus"])}


# ----------------------------------------------------------------------------- validation


def _yaml_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


def _schema_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def _build(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: expected a mapping, got {type(raw).__name__} ({raw!r})")
    fields = _schema_fields(cls)
    by_key = {_yaml_key(f): f for f in fields}
    unknown = [k for k in raw if k not in by_key]
    if unknown:
        moved = "".join(f"; {_MOVED[k]}" for k in unknown if k in _MOVED and cls is EditingConfig)
        raise ProfileError(
            f"{where}: unknown key {', '.join(map(repr, unknown))}; valid keys: {', '.join(by_key)}{moved}"
        )
    missing = [
        k for k, f in by_key.items()
        if k not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ProfileError(
            f"{where}: missing key {', '.join(map(repr, missing))}; valid keys: {', '.join(by_key)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, f in by_key.items():
        if key not in raw:
            continue
        sub = f"{where}: {key}"
        value = _coerce(raw[key], hints[f.name], sub)
        _check(value, f.metadata.get("check"), sub)
        kwargs[f.name] = value
    return cls(**kwargs)


def _build_profile(raw: Mapping[str, Any], where: str, path: Path | None) -> Profile:
    profile = _build(Profile, raw, where)
    return dataclasses.replace(profile, path=path)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin is Literal:
        if value not in args:
            raise ProfileError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ProfileError(f"{where}: expected a list, got {type(value).__name__} ({value!r})")
        if not value:
            raise ProfileError(f"{where}: the list is empty")
        return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ProfileError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(f"{where}: expected an integer, got {type(value).__name__} ({value!r})")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(f"{where}: expected a number, got {type(value).__name__} ({value!r})")
        if not math.isfinite(value):
            raise ProfileError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str) or not value:
            raise ProfileError(f"{where}: expected a non-empty string, got {value!r}")
        return value
    raise TypeError(f"{where}: unsupported schema type {tp!r}")  # a bug in this module


def _check(value: Any, check: str | None, where: str) -> None:
    values = value if isinstance(value, tuple) else (value,)
    if check == "positive" and any(v <= 0 for v in values):
        raise ProfileError(f"{where}: must be > 0, got {value!r}")
    if check == "nonneg" and any(v < 0 for v in values):
        raise ProfileError(f"{where}: must be >= 0, got {value!r}")
    if check == "prob" and not all(0 < v <= 1 for v in values):
        raise ProfileError(f"{where}: must be in (0, 1], got {value!r}")
    if check == "increasing":
        if any(v < 0 for v in values):
            raise ProfileError(f"{where}: must be >= 0, got {value!r}")
        if any(b <= a for a, b in itertools.pairwise(values)):
            raise ProfileError(f"{where}: must be strictly increasing without repeats, got {list(values)}")
    if check == "strategy" and not _STRATEGY_RE.match(value):
        raise ProfileError(f'{where}: {value!r} is not "bos", "rand<k>" (k >= 1) or "prompt:<text>"')


def _to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {
            _yaml_key(f): _to_dict(getattr(obj, f.name))
            for f in _schema_fields(type(obj))
            if not (f.metadata.get("omit_default") and getattr(obj, f.name) == f.default)
        }
    if isinstance(obj, tuple):
        return [_to_dict(v) for v in obj]
    return obj
