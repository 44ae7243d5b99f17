"""C in the statistics caches of the MEMIT / AlphaEdit repositories and of EasyEdit, both ways.

Those codebases read ``C`` through ROME's ``layer_stats`` cache: one ``.npz`` per layer at

    <stats_dir>/<model dir>/<dataset>_stats/<key module>_<precision>_mom2_<n_samples>.npz

holding ``mom2.mom2`` (the **sum** ``S = Σ k kᵀ`` over tokens, stored in ``precision``),
``mom2.count`` (the token count ``N``), ``mom2.constructor`` and ``sample_size`` (``n_samples``,
which must equal the editor's ``mom2_n_samples`` or the cache is ignored and recomputed). Their
``get_cov`` returns ``(mom2.mom2 / mom2.count)`` in the file's dtype, cast to float32
(:func:`loader_moment`): the per-token mean ``Ĉ = S / N`` of eq. (memoir_estimator), the ``C``
that ``λ = mom2_update_weight`` multiplies and AlphaEdit's ``nullspace_threshold`` thresholds.

The layouts differ only in where the cache is rooted and in the ``<model dir>``, which they
derive from the model's ``config._name_or_path``: the MEMIT repository replaces every ``/`` by
``_``, the AlphaEdit repository and EasyEdit keep the text after the last ``/``; both
repositories root the cache at ``STATS_DIR`` (their ``globals.yml``), EasyEdit at the
hyper-parameter ``stats_dir``. AlphaEdit's null-space
projectors travel as one float32 tensor ``(layers, d, d)`` (``null_space_project.pt``, in the
order of the ``layers`` hyper-parameter), which EasyEdit loads from ``P_loc``
(:func:`save_projectors`; the projectors themselves come from
:func:`moir_lib.editing.alphaedit.null_space_projector`).

:func:`export_stats` writes a :class:`CovarianceStats` in one of these layouts and returns the
hyper-parameter lines that point the editor at it; :func:`import_stats` reads such a directory
back into a :class:`CovarianceStats` (sums and counts exactly as stored).
"""

from __future__ import annotations

import logging
import os
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moir_lib.covariance.stats import CovarianceStats
from moir_lib.files import atomic_write, writing

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float32

__all__ = ["FORMATS", "PROJECTOR_FILE", "Export", "Mom2Hparams", "StatsFile", "export_stats",
           "find_stats_files", "import_stats", "loader_moment", "model_dir", "read_stats_file",
           "save_projectors", "stats_path"]

log = logging.getLogger(__name__)

#: the layouts :func:`export_stats` writes and :func:`import_stats` reads
FORMATS = ("memit", "alphaedit", "easyedit")
#: file precisions ``layer_stats`` accepts (its ``mom2_dtype``)
FILE_PRECISIONS = ("float64", "float32")
#: the file name AlphaEdit saves its projectors under (EasyEdit's default ``P_loc``)
PROJECTOR_FILE = "null_space_project.pt"
#: the module their ``SecondMoment`` statistic lives in, recorded in ``mom2.constructor``
_CONSTRUCTOR = {"memit": "util.runningstats.SecondMoment()", "alphaedit": "util.runningstats.SecondMoment()",
                "easyedit": "easyeditor.util.runningstats.SecondMoment()"}
_NAME = re.compile(r"^(?P<module>.+)_(?P<precision>float64|float32|float16)_(?P<stats>[a-z0-9_-]+?)"
                   r"(?:_t\{?\w*\}?)?_(?P<n>\d+)\.npz$")


def _check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown statistics format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return fmt


def model_dir(model_name: str, fmt: str) -> str:
    """The folder the editor looks in for ``model_name`` (its ``config._name_or_path``)."""
    _check_format(fmt)
    name = model_name.replace("/", "_") if fmt == "memit" else model_name.rsplit("/")[-1]
    if not name or name in (".", ".."):
        raise ValueError(f"model name {model_name!r} gives no usable folder name in the {fmt} layout: pass "
                         f"the name the editor loads the model by (config._name_or_path), e.g. "
                         f"'meta-llama/Llama-3.1-8B-Instruct', without a trailing '/'")
    return name


def stats_path(root: str | os.PathLike[str], model_name: str, dataset: str, module: str, precision: str,
               n_samples: int, fmt: str) -> Path:
    """Where the editor's ``layer_stats`` looks for the second moment of ``module``."""
    return (Path(root) / model_dir(model_name, fmt) / f"{dataset}_stats"
            / f"{module}_{precision}_mom2_{int(n_samples)}.npz")


@dataclass
class Export:
    """What :func:`export_stats` wrote, and the hyper-parameters that make the editor read it."""

    fmt: str
    root: Path
    files: dict[int, Path]
    hparams: dict[str, Any]
    #: where the cache root is set: ``globals.yml`` (MEMIT/AlphaEdit) or the hyper-parameters (EasyEdit)
    stats_dir_line: str
    projectors: Path | None = None

    def lines(self) -> list[str]:
        """The lines to paste: JSON fields (MEMIT/AlphaEdit ``hparams/*.json``) or YAML (EasyEdit)."""
        import json

        if self.fmt == "easyedit":
            body = [f"{k}: {json.dumps(v)}" for k, v in self.hparams.items()]
        else:
            body = [f"{json.dumps(k)}: {json.dumps(v)}," for k, v in self.hparams.items()]
        if self.projectors is not None:
            value = json.dumps(str(self.projectors.resolve()))
            body.append(f"P_loc: {value}" if self.fmt == "easyedit" else
                        f"# projectors: {value} (the AlphaEdit repository recomputes P from C; EasyEdit "
                        f"reads P_loc)")
        return [self.stats_dir_line, *body]


@dataclass(frozen=True)
class Mom2Hparams:
    """The editor's ``mom2_*`` hyper-parameters an export is filed under: ``dataset`` its ``mom2_dataset``;
    ``n_samples`` its ``mom2_n_samples`` (default: the documents the corpus records of the statistics
    count); ``precision`` its ``mom2_dtype`` (``float64`` keeps ``S`` as estimated; ``float32`` rounds it,
    as their own estimates are stored)."""

    dataset: str = "moir"
    n_samples: int | None = None
    precision: str = "float64"


def export_stats(stats: CovarianceStats, out: str | os.PathLike[str], *, model_name: str, fmt: str = "memit",
                 mom2: Mom2Hparams = Mom2Hparams(), module_template: str | None = None,
                 layers: Sequence[int] | None = None) -> Export:
    """Write ``stats`` (sums ``S_ℓ``, counts ``N_ℓ``) as the editor's ``layer_stats`` cache under ``out``.

    ``model_name``: the model's ``config._name_or_path`` in the editor's run; ``mom2``: its
    :class:`Mom2Hparams`; ``module_template``: the key module with ``{}`` for the layer (default: the
    statistics' ``key_site``). Every argument is checked before anything is written.
    """
    dataset, n_samples, precision = mom2.dataset, mom2.n_samples, mom2.precision
    _check_format(fmt)
    if precision not in FILE_PRECISIONS:
        raise ValueError(f"precision {precision!r}: the editors read float64 or float32 statistics "
                         f"({', '.join(FILE_PRECISIONS)})")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", dataset):
        raise ValueError(f"dataset name {dataset!r} must be one path component of letters, digits, '.', "
                         f"'_' or '-' (it becomes the folder '<dataset>_stats')")
    template = module_template or stats.metadata.get("key_site")
    if not template or template.count("{}") != 1:
        raise ValueError(f"key module template {template!r} must contain '{{}}' once, for the layer: pass "
                         f"module_template, e.g. 'model.layers.{{}}.mlp.down_proj' (Llama, Qwen, OLMo) or "
                         f"'transformer.h.{{}}.mlp.c_proj' (GPT-2)")
    layers = list(stats.layers) if layers is None else [int(x) for x in layers]
    missing = [x for x in layers if x not in stats.layers]
    if missing:
        raise ValueError(f"layers {missing} are not in these statistics (layers {list(stats.layers)})")
    empty = [x for x in layers if stats.count(x) == 0]
    if empty:
        raise ValueError(f"layers {empty} have no keys: there is no second moment to export")
    n = _n_samples(stats) if n_samples is None else int(n_samples)
    if n < 1:
        raise ValueError(f"n_samples must be a positive integer (the editor's mom2_n_samples), got {n}")
    root = Path(out)
    files = {layer: stats_path(root, model_name, dataset, template.format(layer), precision, n, fmt)
             for layer in layers}
    dtype = np.float64 if precision == "float64" else np.float32
    for layer, path in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {"mom2.constructor": np.array(_CONSTRUCTOR[fmt]), "mom2.count": np.array(stats.count(layer)),
                  "mom2.mom2": stats.sum(layer).cpu().numpy().astype(dtype), "sample_size": np.array(n)}
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
        try:
            with writing(path, tmp):
                np.savez(tmp, **arrays)
                os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
    hparams = {"layers": layers, "rewrite_module_tmp": template, "mom2_dataset": dataset,
               "mom2_n_samples": n, "mom2_dtype": precision}
    absolute = str(root.resolve())
    folder = f"{model_dir(model_name, fmt)!r} for a model loaded as {model_name!r}"
    if fmt == "easyedit":
        hparams = {"stats_dir": absolute, **hparams}
        where = f"# EasyEdit hparams YAML (statistics folder {folder})"
    else:
        where = f'# globals.yml: STATS_DIR: "{absolute}"  (statistics folder {folder})'
    return Export(fmt, root, files, hparams, where)


def save_projectors(projectors: Mapping[int, Any], layers: Sequence[int], path: str | os.PathLike[str]
                    ) -> Path:
    """Save AlphaEdit's null-space projectors ``P_ℓ`` (eq. (alphaedit-update)) as one float32
    ``(len(layers), d, d)`` tensor in the order of ``layers`` (``torch.save``; EasyEdit's ``P_loc``)."""
    import torch

    missing = [x for x in layers if x not in projectors]
    if missing:
        raise ValueError(f"no projector for layers {missing}")
    stacked = torch.stack([torch.as_tensor(projectors[x]).detach().cpu().to(torch.float32) for x in layers])
    return atomic_write(path, lambda tmp: torch.save(stacked, tmp))


def _n_samples(stats: CovarianceStats) -> int:
    """Documents behind ``stats`` by its corpus records (the natural ``mom2_n_samples``)."""
    imported = stats.metadata.get("imported") or {}
    if imported.get("n_samples"):
        return int(imported["n_samples"])
    corpora = stats.metadata.get("corpus") or []
    docs = [r.get("documents") for r in corpora]
    if not corpora or any(not isinstance(d, int) for d in docs):
        raise ValueError("these statistics do not record how many documents they cover: pass n_samples "
                         "(the editor's mom2_n_samples; any positive integer works if it matches)")
    return int(sum(docs))


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class StatsFile:
    """One ``layer_stats`` file, read from its path: ``model`` is the ``<model dir>`` folder."""

    path: Path
    model: str
    dataset: str
    module: str
    layer: int
    precision: str
    n_samples: int


def _parse(path: Path) -> StatsFile | None:
    m = _NAME.match(path.name)
    if m is None or not path.parent.name.endswith("_stats") or "mom2" not in m["stats"].split("-"):
        return None
    numbers = [int(p) for p in m["module"].split(".") if p.isdigit()]
    if len(numbers) != 1:
        raise ValueError(f"{path}: cannot tell the layer from the module name {m['module']!r} (expected one "
                         f"numeric component, as in 'model.layers.12.mlp.down_proj')")
    dataset = path.parent.name[: -len("_stats")]
    return StatsFile(path, path.parent.parent.name, dataset, m["module"], numbers[0], m["precision"],
                     int(m["n"]))


def find_stats_files(root: str | os.PathLike[str], *, model: str | None = None, dataset: str | None = None,
                     precision: str | None = None, n_samples: int | None = None) -> list[StatsFile]:
    """The second-moment files under ``root`` (a stats root, a model folder, or a ``<dataset>_stats``
    folder), optionally only those of one ``model`` folder, ``dataset``, ``precision`` or ``n_samples``."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no statistics directory at {root}")
    found = [f for p in sorted(root.rglob("*.npz")) if (f := _parse(p)) is not None]
    if model is not None:
        found = [f for f in found if f.model in (model, model.replace("/", "_"), model.rsplit("/")[-1])]
    for attr, want in (("dataset", dataset), ("precision", precision), ("n_samples", n_samples)):
        if want is not None:
            found = [f for f in found if getattr(f, attr) == want]
    return found


def read_stats_file(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """``(mom2.mom2, mom2.count)`` of one ``layer_stats`` file as stored; ``ValueError`` if malformed."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in ("mom2.mom2", "mom2.count") if k in f.files}
            keys = sorted(f.files)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a readable .npz file ({type(exc).__name__}: {exc})") from None
    if len(arrays) != 2:
        raise ValueError(f"{path} holds {keys}, not a second moment (keys 'mom2.mom2' and 'mom2.count' of "
                         f"layer_stats(to_collect=['mom2']))")
    S, count = np.asarray(arrays["mom2.mom2"]), arrays["mom2.count"]
    if count.ndim != 0 or not np.issubdtype(count.dtype, np.integer) or int(count) < 1:
        raise ValueError(f"{path}: mom2.count must be a positive integer token count, got {count!r}")
    if S.ndim != 2 or S.shape[0] != S.shape[1] or not np.issubdtype(S.dtype, np.floating):
        raise ValueError(f"{path}: mom2.mom2 must be a square float matrix, got {S.dtype} {S.shape}")
    if not np.isfinite(S).all():
        raise ValueError(f"{path}: mom2.mom2 has NaN or infinite entries")
    return S, int(count)


def loader_moment(path: str | os.PathLike[str]) -> Float32[torch.Tensor, "d_in d_in"]:
    """The ``C`` the editors' ``get_cov`` returns for this file: ``mom2.mom2 / mom2.count`` computed
    by torch in the file's dtype, then cast to float32 (``SecondMoment.moment().float()``)."""
    import torch

    S, count = read_stats_file(path)
    return (torch.from_numpy(S) / count).float()


def import_stats(root: str | os.PathLike[str], *, model: str | None = None, dataset: str | None = None,
                 precision: str | None = None, n_samples: int | None = None,
                 layers: Iterable[int] | None = None) -> CovarianceStats:
    """A :class:`CovarianceStats` from a MEMIT / AlphaEdit / EasyEdit statistics directory.

    The sums are the files' ``mom2.mom2`` (float32 ones widened exactly to float64) and the counts
    their ``mom2.count``, so ``mean()`` is the files' per-token ``C``. The filters select one set
    of files when the directory holds several (models, datasets, precisions, sample counts); a
    directory that is still ambiguous, holds a layer twice or none at all is refused by name.
    """
    files = find_stats_files(root, model=model, dataset=dataset, precision=precision, n_samples=n_samples)
    if layers is not None:
        wanted = {int(x) for x in layers}
        absent = sorted(wanted - {f.layer for f in files})
        if absent:
            raise ValueError(f"no second-moment file for layers {absent} under {root}")
        files = [f for f in files if f.layer in wanted]
    if not files:
        raise FileNotFoundError(f"no layer_stats second-moment files (<module>_<precision>_mom2_<n>.npz in a "
                                f"'<dataset>_stats' folder) under {root} match the filters")
    sets = sorted({(f.model, f.dataset, f.precision, f.n_samples) for f in files})
    if len(sets) > 1:
        listing = "\n  ".join(f"model {m}, dataset {d}, {p}, n_samples {n}" for m, d, p, n in sets)
        raise ValueError(f"{root} holds several statistics:\n  {listing}\nchoose one with the model, "
                         f"dataset, precision or n_samples filters")
    by_layer: dict[int, StatsFile] = {}
    for f in files:
        if f.layer in by_layer:
            raise ValueError(f"layer {f.layer} appears twice: {by_layer[f.layer].path} and {f.path}")
        by_layer[f.layer] = f
    sums, counts = {}, {}
    for layer, f in sorted(by_layer.items()):
        sums[layer], counts[layer] = read_stats_file(f.path)
    dims = {S.shape[0] for S in sums.values()}
    if len(dims) > 1:
        raise ValueError(f"the files under {root} have different widths {sorted(dims)}: not one model's keys")
    first = next(iter(by_layer.values()))
    template = re.sub(rf"(?<=\.){first.layer}(?=\.|$)", "{}", first.module, count=1)
    model_name, ds, prec, n = sets[0]
    meta = {"model": None, "model_name": model_name, "key_site": template, "key_dim": dims.pop(),
            "dtype": None, "tokenization": None,
            "corpus": [{"name": ds, "kind": "layer_stats", "model": model_name, "n_samples": n}],
            "imported": {"root": str(Path(root).resolve()), "dataset": ds, "n_samples": n, "precision": prec,
                         "files": {str(k): str(f.path) for k, f in sorted(by_layer.items())}}}
    stats_precision = "float64" if prec == "float64" else "float32"
    return CovarianceStats.from_sums(sums, counts, meta, precision=stats_precision)
