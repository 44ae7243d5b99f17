"""External and self-generated corpora as deterministic document streams (the ``p`` of eq. (kfac)).

The covariance ``C = E_{x~D}[k kᵀ]`` is only as good as the documents it is estimated on: the
paper's baseline uses Wikipedia (C_Wiki), its oracle the pretraining mixture (appendix A.2),
Moir the model's own samples (appendix A.1). This module turns a *spec string* into a
:class:`Corpus` — a re-iterable, deterministic stream of documents that carries a
:class:`CorpusSpec`, the record that goes into covariance cache fingerprints.

Spec kinds (``parse_spec``)::

    wikimedia/wikipedia:20231101.en            Hugging Face dataset ``path[:config][@revision]``
    Salesforce/wikitext:wikitext-103-raw-v1    (streamed with ``datasets.load_dataset``)
    hf:text?data_files=/data/wiki.test.raw     ``hf:`` forces the HF kind (packaged builders:
                                               text, json, parquet, csv) — same code path
    ./corpus/  data.jsonl  file:notes.txt      local text / jsonl / json / parquet files or folders
    pocket:wiki   pocket:chat?split=validation the pocket domain corpora (moir_lib.pocket), written by
    pocket:wiki:micro                          the world of the book's ``pocket`` variant, or of the
                                               variant named after the domain (its models' own world)
    selfgen:runs/gen-rand1   runs/gen-rand1    a self-generation directory (manifest.json)

Options go after ``?`` (``&``-separated): ``split``, ``field`` (the text column), ``unit``
(``line`` | ``paragraph`` | ``file`` for plain-text files), ``data_files`` (comma-separated),
``buffer`` (HF shuffle buffer), ``ids`` (``1``: self-generated documents as token ids, the default,
``0``: as text); keyword arguments of :func:`load_corpus` override them.

Sampling (``seed``): ``None`` keeps the source order. An integer draws a seeded sample:
local files and generation directories are sampled exactly (uniformly without replacement, in a
seeded random order; two passes, ``n`` documents held in memory); a streamed HF dataset is
shuffled with ``IterableDataset.shuffle(seed, buffer_size)`` (the standard approximate
shuffle: exact for datasets smaller than the buffer); pocket domains pass the seed to their
generator. Self-generated samples are already i.i.d. draws, so their default order is the
sample index order (``seed=None``). ``n`` is the number of *non-empty* documents (documents
that are empty or whitespace-only are skipped everywhere: they carry no tokens of text).
``shard=(i, k)`` keeps documents ``i, i+k, …`` of that sequence, for covariance shards that
:meth:`moir_lib.covariance.CovarianceStats.merge` combines exactly.

Documents are ``str``, except generation directories, which yield the exact token ids the model
produced (``seed_ids + token_ids``: text does not always re-tokenize to the same ids);
:func:`moir_lib.covariance.estimate` accepts both. A generation directory is read only when it holds
exactly the samples its manifest names (:meth:`Corpus.check`): a duplicated, missing or changed
record is refused naming the shard file and line.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import itertools
import json
import logging
import os
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["KINDS", "Corpus", "CorpusSpec", "Document", "iter_documents", "load_corpus", "parse_spec",
           "pocket_corpus", "pocket_world"]

log = logging.getLogger(__name__)

#: A document: text, or token ids (generation directories).
Document = str | list[int]

#: kind -> example specs (used in error messages).
KINDS: dict[str, str] = {
    "hf": "Hugging Face dataset 'org/name[:config][@revision]' or 'hf:<builder>?data_files=...', "
          "e.g. wikimedia/wikipedia:20231101.en, Salesforce/wikitext:wikitext-103-raw-v1",
    "files": "local text/jsonl/json/parquet file or folder, e.g. ./corpus/ or file:notes.txt",
    "pocket": "pocket domain 'pocket:<domain>[:<variant>][?split=validation]', e.g. pocket:wiki",
    "selfgen": "self-generation directory 'selfgen:<dir>' (or a folder with manifest.json)",
}

TEXT_SUFFIXES = (".txt", ".raw", ".md", ".text")
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
_ALL_SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
_UNITS = ("line", "paragraph", "file")
_TEXT_FIELDS = ("text", "content", "code", "document")
_OPTIONS = {"split": "split", "field": "text_field", "unit": "text_unit", "data_files": "data_files",
            "buffer": "shuffle_buffer", "ids": "as_ids", "max_chars": "max_chars"}
_HASH_FULL_MAX = 1 << 30  # files above 1 GiB are fingerprinted by size, mtime and head/tail hashes


# ----------------------------------------------------------------------------- the spec record


@dataclass(frozen=True)
class CorpusSpec:
    """Everything that determines a corpus's documents; :meth:`key` goes into cache fingerprints.

    ``kind``: ``hf`` | ``files`` | ``pocket`` | ``selfgen``. ``name``: the dataset path, the file
    or folder, the pocket domain or the generation directory. ``config``: the HF config, or the
    pocket variant whose world writes a pocket domain (``None``: the book's ``pocket``,
    :func:`pocket_world`). ``revision``/``data_files``: HF only. ``split``: HF and pocket. ``n``:
    number of documents (``None``: all; pocket domains are infinite and need one). ``seed``: see the
    module doc. ``text_field``: column holding the text (``None``: the first of
    text/content/code/document present). ``text_unit``: how plain-text files split into documents.
    ``max_chars``: truncate each document to this many characters. ``shard``: ``(i, k)``.
    ``as_ids``: self-generated documents as token ids (else text).
    """

    kind: str
    name: str
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    data_files: tuple[str, ...] | None = None
    n: int | None = None
    seed: int | None = 0
    text_field: str | None = None
    text_unit: str = "line"
    shuffle_buffer: int = 10_000
    max_chars: int | None = None
    shard: tuple[int, int] | None = None
    as_ids: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown corpus kind {self.kind!r}: {_kinds_help()}")
        if self.n is not None and (isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 0):
            raise ValueError(f"n must be a non-negative integer or None, got {self.n!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.text_unit not in _UNITS:
            raise ValueError(f"unknown text unit {self.text_unit!r}: choose one of {', '.join(_UNITS)}")
        if self.max_chars is not None and self.max_chars <= 0:
            raise ValueError(f"max_chars must be positive, got {self.max_chars}")
        if self.shuffle_buffer <= 0:
            raise ValueError(f"shuffle buffer must be positive, got {self.shuffle_buffer}")
        if self.shard is not None:
            i, k = self.shard
            if not (isinstance(i, int) and isinstance(k, int) and k >= 1 and 0 <= i < k):
                raise ValueError(f"shard must be (i, k) with 0 <= i < k, got {self.shard!r}")
        if self.kind == "pocket" and self.n is None:
            raise ValueError(f"pocket:{self.name} is an endless stream: give n (the number of documents)")
        if self.kind == "pocket" and self.seed is None:  # pocket streams are always seeded
            object.__setattr__(self, "seed", 0)

    def replace(self, **changes: Any) -> CorpusSpec:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """Short human label, e.g. ``pocket:wiki (n=1000, seed=0)``."""
        head = {"hf": "", "files": "", "pocket": "pocket:", "selfgen": "selfgen:"}[self.kind] + self.name
        if self.config:
            head += f":{self.config}"
        if self.revision:
            head += f"@{self.revision}"
        bits = [f"n={self.n}" if self.n is not None else "all", f"seed={self.seed}"]
        if self.split:
            bits.append(f"split={self.split}")
        if self.shard:
            bits.append(f"shard={self.shard[0]}/{self.shard[1]}")
        return f"{head} ({', '.join(bits)})"

    def key(self) -> dict[str, Any]:
        """The fingerprint record: every field, plus content hashes of local files.

        Local files (and local ``data_files`` of an HF builder, and self-generated shards) are
        identified by their content as well as their path: editing a file is a cache miss (so is
        moving it, since the path is part of the record).
        """
        record = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        record["data_files"] = list(self.data_files) if self.data_files else None
        record["shard"] = list(self.shard) if self.shard else None
        if self.kind == "files":
            record["content"] = _content_hashes(_list_files(Path(self.name)), Path(self.name))
        elif self.kind == "selfgen":
            gen_dir = Path(self.name)
            files = sorted(gen_dir.glob("shard-*.jsonl")) + [gen_dir / "manifest.json"]
            record["content"] = _content_hashes(files, gen_dir)
        elif self.kind == "hf" and self.data_files:
            local = [Path(p) for p in self.data_files if Path(p).exists()]
            if local:
                record["content"] = _content_hashes(local, None)
        elif self.kind == "pocket":
            record["content"] = _pocket_identity(self.config)
        if self.kind == "hf" and not self.data_files and self.revision is None:
            log.info("%s has no pinned revision: cached statistics are keyed on its name only", self.name)
        return record


def _kinds_help() -> str:
    return "; ".join(f"{k}: {v}" for k, v in KINDS.items())


def pocket_world(variant: str | None = None) -> Any:
    """The :class:`~moir_lib.pocket.world.WorldSpec` that writes ``pocket:<domain>[:<variant>]``: that of the
    pocket ``variant`` (``None``: the book's ``pocket``), the world its models were trained on, so that a C
    of the pocket wiki sees the people the model knows."""
    from moir_lib.pocket.variants import get_variant

    return get_variant(variant or "pocket").world


def pocket_corpus(domain: str, variant: str | None = None) -> str:
    """The spec of pocket ``domain`` as the models of ``variant`` (``None``: ``pocket``) saw it."""
    return f"pocket:{domain}" + (f":{variant}" if variant and variant != "pocket" else "")


def _pocket_identity(variant: str | None) -> dict[str, Any]:
    import moir_lib

    try:
        world = dataclasses.asdict(pocket_world(variant))
    except ImportError:  # pragma: no cover - pocket not available
        world = None
    return {"moir_lib": moir_lib.__version__, "world": world}


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= _HASH_FULL_MAX:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:  # huge files: size, mtime and 16 MiB from each end
            h.update(f"{size}:{path.stat().st_mtime_ns}".encode())
            h.update(f.read(16 << 20))
            f.seek(size - (16 << 20))
            h.update(f.read())
    return h.hexdigest()[:16]


def _content_hashes(paths: Iterable[Path], root: Path | None) -> list[list[Any]]:
    out = []
    for p in paths:
        if not p.is_file():
            continue
        rel = str(p.relative_to(root)) if root is not None and root.is_dir() else p.name
        out.append([rel, p.stat().st_size, _file_hash(p)])
    return out


# ----------------------------------------------------------------------------- parsing


def parse_spec(spec: str | os.PathLike[str] | CorpusSpec, **overrides: Any) -> CorpusSpec:
    """A :class:`CorpusSpec` from a spec string (see the module doc); keyword arguments override.

    Raises ``ValueError`` listing the kinds for a spec that matches none, and
    ``FileNotFoundError`` for a path-like spec that does not exist.
    """
    if isinstance(spec, CorpusSpec):
        return spec.replace(**overrides) if overrides else spec
    text = os.fspath(spec).strip()
    if not text:
        raise ValueError(f"empty corpus spec: {_kinds_help()}")
    options: dict[str, Any] = {}
    if "?" in text and not Path(text).exists():
        text, query = text.split("?", 1)
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key not in _OPTIONS:
                raise ValueError(f"unknown corpus option {key!r} in {spec!r}: use {', '.join(_OPTIONS)}")
            options[_OPTIONS[key]] = _option_value(_OPTIONS[key], value)
    options.update(overrides)

    if text.startswith("pocket:"):
        domain, _, variant = text.removeprefix("pocket:").partition(":")
        from moir_lib.pocket.corpora import DOMAINS
        from moir_lib.pocket.variants import get_variant

        if domain not in DOMAINS:
            raise ValueError(f"unknown pocket domain {domain!r}: choose one of {', '.join(DOMAINS)}")
        if variant:
            get_variant(variant)  # an unknown variant is refused here, naming the known ones
        options.setdefault("split", "train")
        return CorpusSpec("pocket", domain, config=variant if variant and variant != "pocket" else None,
                          **options)
    if text.startswith(("selfgen:", "generated:")):
        gen_dir = Path(text.split(":", 1)[1]).expanduser()
        if not (gen_dir / "manifest.json").is_file():
            raise FileNotFoundError(f"{gen_dir} is not a self-generation directory (no manifest.json)")
        options.setdefault("seed", None)
        return CorpusSpec("selfgen", str(gen_dir), **options)
    if text.startswith("hf:"):
        return _hf_spec(text.removeprefix("hf:"), options)
    if text.startswith("file:"):
        return _local_spec(Path(text.removeprefix("file:")).expanduser(), options, must_exist=True)
    path = Path(text).expanduser()
    if path.exists() or text.startswith((".", "/", "~")) or path.suffix.lower() in _ALL_SUFFIXES + (".gz",):
        return _local_spec(path, options, must_exist=True)
    head = text.split("@", 1)[0].split(":", 1)[0]
    if head.count("/") == 1 or (":" in text and head and "/" not in head):
        return _hf_spec(text, options)
    raise ValueError(f"cannot tell which kind of corpus {spec!r} is: {_kinds_help()}")


def _option_value(name: str, value: str) -> Any:
    if name == "data_files":
        return tuple(v for v in value.split(",") if v)
    if name in ("shuffle_buffer", "max_chars"):
        return int(value)
    if name == "as_ids":
        return value.lower() in ("1", "true", "yes", "ids")
    return value


def _hf_spec(text: str, options: dict[str, Any]) -> CorpusSpec:
    revision = None
    if "@" in text:
        text, revision = text.rsplit("@", 1)
    path, _, config = text.partition(":")
    if not path:
        raise ValueError(f"empty dataset path in HF spec {text!r}: {KINDS['hf']}")
    options.setdefault("split", "train")
    options.setdefault("revision", revision)
    if options.get("data_files"):
        options["data_files"] = tuple(str(Path(p).expanduser()) if Path(p).expanduser().exists() else p
                                      for p in options["data_files"])
    return CorpusSpec("hf", path, config=config or None, **options)


def _local_spec(path: Path, options: dict[str, Any], must_exist: bool) -> CorpusSpec:
    if not path.exists():
        raise FileNotFoundError(f"corpus path {path} does not exist ({KINDS['files']})")
    if path.is_dir() and (path / "manifest.json").is_file() and any(path.glob("shard-*.jsonl")):
        options.setdefault("seed", None)
        return CorpusSpec("selfgen", str(path), **options)
    if path.is_dir() and not _list_files(path):
        raise ValueError(f"folder {path} holds no {'/'.join(_ALL_SUFFIXES)} files (optionally .gz)")
    if path.is_file() and not _supported(path):
        raise ValueError(f"unsupported corpus file {path.name}: use one of {', '.join(_ALL_SUFFIXES)} "
                         f"(optionally .gz)")
    return CorpusSpec("files", str(path), **options)


# ----------------------------------------------------------------------------- the corpus


@dataclass
class Corpus:
    """A deterministic, re-iterable stream of documents with its :class:`CorpusSpec`.

    ``iter(corpus)`` starts from the beginning every time and yields the same documents in
    the same order (that is what lets an interrupted covariance estimate resume).
    """

    spec: CorpusSpec
    _key: dict[str, Any] | None = field(default=None, repr=False)
    _checked: bool = field(default=False, repr=False, compare=False)

    def __iter__(self) -> Iterator[Document]:
        self.check()
        docs = _sampled(self.spec)
        if self.spec.shard is not None:
            i, k = self.spec.shard
            docs = itertools.islice(docs, i, None, k)
        return docs

    def check(self) -> None:
        """Refuse a source that is not what it claims, before any model work: a generation directory must
        hold exactly the samples its manifest names (:func:`moir_lib.generation.verify_generation`: count,
        indices in order, checksums). Checked once per :class:`Corpus`; iterating checks first."""
        if self.spec.kind == "selfgen" and not self._checked:
            from moir_lib.generation import verify_generation

            verify_generation(self.spec.name)
        self._checked = True

    def count(self) -> int:
        """The documents the corpus yields: counted (a pass over the text, no model), except for a streamed
        Hugging Face dataset with ``n``, which is not read twice: ``n`` (its shard's part of it), the
        most it yields."""
        if self.spec.kind == "hf" and self.spec.n is not None:
            i, k = self.spec.shard or (0, 1)
            return len(range(i, self.spec.n, k))
        return sum(1 for _ in self)

    def key(self) -> dict[str, Any]:
        """:meth:`CorpusSpec.key`, computed once (it hashes local files)."""
        if self._key is None:
            self._key = self.spec.key()
        return self._key

    def __str__(self) -> str:
        return self.spec.describe()


def load_corpus(spec: str | os.PathLike[str] | CorpusSpec, n: int | None = None,
                seed: int | None | str = "default", **options: Any) -> Corpus:
    """A :class:`Corpus` for ``spec``: ``n`` documents (``None``: all), sampled with ``seed``.

    ``seed="default"`` means 0, except for generation directories (sample order, ``None``).
    ``options``: any :class:`CorpusSpec` field (``split``, ``revision``, ``text_field``,
    ``text_unit``, ``data_files``, ``shuffle_buffer``, ``max_chars``, ``shard``, ``as_ids``).
    """
    unknown = set(options) - {f.name for f in dataclasses.fields(CorpusSpec)}
    if unknown:
        raise TypeError(f"unknown corpus option(s) {sorted(unknown)}")
    overrides = {k: v for k, v in options.items() if v is not None}
    if n is not None:
        overrides["n"] = n
    if seed != "default":
        overrides["seed"] = seed
    return Corpus(parse_spec(spec, **overrides))


def iter_documents(spec: str | os.PathLike[str] | CorpusSpec, n: int | None = None,
                   seed: int | None | str = "default", **options: Any) -> Iterator[Document]:
    """Iterate the documents of ``spec`` (see :func:`load_corpus`; this is ``iter(load_corpus(...))``)."""
    return iter(load_corpus(spec, n=n, seed=seed, **options))


# ----------------------------------------------------------------------------- sampling


def _raw(spec: CorpusSpec) -> Iterator[Document]:
    """All non-empty documents of the source, in source order (pocket/HF: already seeded)."""
    if spec.kind == "files":
        it: Iterator[Document] = _iter_files(spec)
    elif spec.kind == "hf":
        it = _iter_hf(spec)
    elif spec.kind == "pocket":
        it = _iter_pocket(spec)
    else:
        it = _iter_selfgen(spec)
    for doc in it:
        if isinstance(doc, str):
            if not doc.strip():
                continue
            if spec.max_chars is not None:
                doc = doc[: spec.max_chars]
        elif not doc:
            continue
        yield doc


def _sampled(spec: CorpusSpec) -> Iterator[Document]:
    if spec.kind in ("hf", "pocket") or spec.seed is None:  # seeded at the source, or source order
        return itertools.islice(_raw(spec), spec.n)
    return _exact_sample(spec)


def _exact_sample(spec: CorpusSpec) -> Iterator[Document]:
    """Uniform sample without replacement, in seeded random order (two passes over the source)."""
    total = sum(1 for _ in _raw(spec))
    rng = random.Random(f"moir-corpus/{spec.seed}")
    k = total if spec.n is None else min(spec.n, total)
    if spec.n is not None and spec.n > total:
        log.warning("%s: asked for %d documents, the source has %d", spec.describe(), spec.n, total)
    order = rng.sample(range(total), k)
    wanted = set(order)
    picked: dict[int, Document] = {}
    for i, doc in enumerate(_raw(spec)):
        if i in wanted:
            picked[i] = doc
    for i in order:
        yield picked.pop(i)


# ----------------------------------------------------------------------------- sources


def _supported(path: Path) -> bool:
    name = path.name.lower().removesuffix(".gz")
    return name.endswith(_ALL_SUFFIXES)


def _list_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = (p for p in path.rglob("*") if p.is_file() and _supported(p) and not p.name.startswith("."))
    return sorted(found, key=lambda p: str(p.relative_to(path)))


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline=None)
    return open(path, encoding="utf-8", newline=None)


def _pick_field(record: Mapping[str, Any], wanted: str | None, where: str) -> str:
    if wanted is not None:
        if wanted not in record:
            raise ValueError(f"{where}: no field {wanted!r}; fields are {sorted(record)}")
        return wanted
    for name in _TEXT_FIELDS:
        if name in record:
            return name
    raise ValueError(f"{where}: none of the text fields {_TEXT_FIELDS} found in {sorted(record)}; "
                     f"name one with ?field=<column> (or text_field=...)")


def _iter_files(spec: CorpusSpec) -> Iterator[str]:
    root = Path(spec.name)
    files = _list_files(root)
    if not files:
        raise ValueError(f"{root} holds no {'/'.join(_ALL_SUFFIXES)} files")
    for path in files:
        name = path.name.lower().removesuffix(".gz")
        if name.endswith(TEXT_SUFFIXES):
            yield from _iter_text_file(path, spec.text_unit)
        elif name.endswith(JSON_SUFFIXES):
            yield from _iter_json_file(path, spec.text_field)
        else:
            yield from _iter_parquet_file(path, spec.text_field)


def _iter_text_file(path: Path, unit: str) -> Iterator[str]:
    with _open_text(path) as f:
        if unit == "file":
            yield f.read()
        elif unit == "line":
            for line in f:
                yield line.rstrip("\n")
        else:
            para: list[str] = []
            for line in f:
                if line.strip():
                    para.append(line.rstrip("\n"))
                elif para:
                    yield "\n".join(para)
                    para = []
            if para:
                yield "\n".join(para)


def _iter_json_file(path: Path, text_field: str | None) -> Iterator[str]:
    with _open_text(path) as f:
        first = f.read(1)
        while first and first.isspace():
            first = f.read(1)
        f.seek(0)
        if first == "[":  # a JSON array of records
            rows: Iterable[Any] = json.load(f)
        else:
            rows = (json.loads(line) for line in f if line.strip())
        chosen = None
        for i, rec in enumerate(rows):
            if isinstance(rec, str):
                yield rec
                continue
            if chosen is None:
                chosen = _pick_field(rec, text_field, f"{path.name} record {i}")
            value = rec.get(chosen)
            if value is not None:
                yield str(value)


def _iter_parquet_file(path: Path, text_field: str | None) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    column = _pick_field({name: None for name in pf.schema_arrow.names}, text_field, path.name)
    for batch in pf.iter_batches(columns=[column], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield str(value)


def _iter_hf(spec: CorpusSpec) -> Iterator[str]:
    import datasets

    kwargs: dict[str, Any] = {"path": spec.name, "split": spec.split or "train", "streaming": True}
    if spec.config:
        kwargs["name"] = spec.config
    if spec.revision:
        kwargs["revision"] = spec.revision
    if spec.data_files:
        kwargs["data_files"] = list(spec.data_files)
    log.info("streaming HF dataset %s", kwargs)
    try:
        ds = datasets.load_dataset(**kwargs)
    except (FileNotFoundError, ConnectionError) as exc:
        offline = os.environ.get("HF_DATASETS_OFFLINE", "") in ("1", "true", "on", "yes") or \
            os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "on", "yes")
        hint = (" (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set: run once with hub access, or point at local "
                "files with hf:<builder>?data_files=... or a local path)") if offline else ""
        raise FileNotFoundError(f"could not open HF dataset {spec.describe()}: {exc}{hint}") from exc
    if spec.seed is not None:
        ds = ds.shuffle(seed=spec.seed, buffer_size=spec.shuffle_buffer)
    chosen = spec.text_field
    for i, rec in enumerate(ds):
        if chosen is None:
            chosen = _pick_field(rec, None, f"{spec.name} record {i}")
        elif i == 0:
            _pick_field(rec, chosen, f"{spec.name} record 0")
        value = rec.get(chosen)
        if value is not None:
            yield str(value)


def _iter_pocket(spec: CorpusSpec) -> Iterator[str]:
    from moir_lib.pocket.corpora import iter_documents as pocket_documents
    from moir_lib.pocket.world import World

    # pocket streams are infinite: ask for what we keep (n non-empty docs; pocket docs are never empty)
    return pocket_documents(spec.name, split=spec.split or "train", n=None,
                            seed=spec.seed if spec.seed is not None else 0,
                            world=World(pocket_world(spec.config)))


def _iter_selfgen(spec: CorpusSpec) -> Iterator[Document]:
    from moir_lib.generation import read_samples

    for rec in read_samples(spec.name):
        get = rec.get if isinstance(rec, Mapping) else (lambda k, r=rec: getattr(r, k, None))
        if spec.as_ids:
            ids = list(get("seed_ids") or []) + list(get("token_ids") or [])
            yield [int(t) for t in ids]
        else:
            yield str(get("text") or "")
