"""A self-generation directory: its manifest, the shard files, crash-safe appends, reading back.

**Sharding.** ``shard=(i, n)`` generates the indices ``i, i+n, i+2n, …`` (strided, so every shard
gets a share of every part of the index range) into ``shard-0000i-of-0000n.jsonl``. Shards may run
as separate processes over the same ``out_dir``; ``shard=None`` is ``(0, 1)``. The shard count is part
of the generation's configuration.

**Generation directory.** ``manifest.json`` (configuration; resuming with a different one is refused,
naming the differing fields) and one ``shard-XXXXX-of-YYYYY.jsonl`` per shard, one JSON record per
line: ``{"index", "seed_strategy", "seed_ids", "token_ids", "text"}``. ``seed_ids`` include BOS;
``token_ids`` are the sampled tokens, including a final EOS when one was sampled; ``text`` decodes the
seed (without BOS) followed by the continuation (without the final EOS), keeping chat tags and any
other special token the model produced. Text does not always re-tokenize to the same ids: consumers
that need the exact sequence should use the ids.

**Crash safety.** A batch's records are appended with one ``write`` and ``fsync``-ed. On resume, a
torn last line (the process died mid-write) is truncated, every complete record is kept, its index
is skipped (no duplicates), and batches are re-formed exactly as in an uninterrupted generation.

**Checked on reading.** Line ``k`` of a shard holds the shard's ``k``-th index (``i + (k-1)·n``): a
repeated, missing, foreign or unparsable line is refused (:class:`DamagedShard`) naming the file, the
line and the repair, on resume and by :func:`verify_generation`. A shard is sealed when complete: its
SHA-256 goes into ``shard-XXXXX-of-YYYYY.jsonl.sha256`` (``sha256sum`` format), which
:func:`verify_generation` checks; a complete shard without one (an older generation) is checked by count and
indices only, with a warning.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import json
import logging
import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import moir_lib
from moir_lib.cache import sha256_file
from moir_lib.files import writing

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


FORMAT_VERSION = 1


MANIFEST = "manifest.json"


#: manifest fields that do not have to match on resume (``stopped``: the outcome of a stop rule)
_INFORMATIONAL = ("created", "moir_lib", "tokenizer", "stopped")


class DamagedShard(ValueError):
    """A generation directory or shard file that is not what the generation's manifest says (the message
    names the file, the line and what to do)."""


def shard_indices(n_samples: int, shard: tuple[int, int]) -> range:
    """Global sample indices of ``shard=(i, n)``: ``i, i+n, i+2n, … < n_samples``."""
    i, n = shard
    return range(i, n_samples, n)


def validate_shard(shard: tuple[int, int] | None) -> tuple[int, int]:
    """``(i, n)`` with ``0 <= i < n`` (``None``: the whole generation, ``(0, 1)``); ``ValueError``
    otherwise."""
    if shard is None:
        return (0, 1)
    try:
        i, n = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}")
    return (i, n)


def _shard_name(shard: tuple[int, int]) -> str:
    return f"shard-{shard[0]:05d}-of-{shard[1]:05d}"


def vocabulary_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """16 hex of SHA-256 over the vocabulary, the added tokens and the special-token map: what the ids of
    a generated sample mean (not how text is split into them; that is
    :func:`moir_lib.covariance.estimation.tokenizer_fingerprint`)."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items()), separators=(",", ":")).encode())
    added = {int(i): str(t) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    h.update(json.dumps(sorted(added.items())).encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def read_manifest(gen_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The generation's ``manifest.json``."""
    path = Path(gen_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{gen_dir} is not a self-generation (no {MANIFEST})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedShard(f"{path} is not valid JSON ({exc}): the generation's manifest is damaged; "
                           f"generate it again into a new directory") from None
    if not isinstance(manifest, dict):
        raise DamagedShard(f"{path} holds a {type(manifest).__name__}, not a generation manifest (an object)")
    return manifest


def generation_samples(manifest: dict[str, Any]) -> int:
    """The samples a generation holds: those at which its stop rule stopped it (the manifest's ``stopped``,
    :mod:`moir_lib.generation.stopping`), else its ``n_samples``."""
    stopped = manifest.get("stopped")
    return int(stopped["n_samples"]) if stopped else int(manifest["n_samples"])


def generation_fingerprint(manifest: dict[str, Any]) -> str:
    """16 hex identifying a generation's configuration (what every shard must agree on; not its outcome)."""
    from moir_lib.cache import fingerprint

    return fingerprint({k: v for k, v in manifest.items() if k not in _INFORMATIONAL})


def record_stop(out_dir: Path, stopped: dict[str, Any]) -> dict[str, Any]:
    """Write the stop rule's outcome into the generation's manifest (atomic replace); returns the manifest."""
    path = out_dir / MANIFEST
    manifest = {**read_manifest(out_dir), "stopped": stopped}
    tmp = path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(out_dir)
    return manifest


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _ensure_manifest(out_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Create the manifest (first process wins) or check that ``config`` matches the existing one."""
    path = out_dir / MANIFEST
    if not path.exists():
        manifest = {**config, "created": datetime.now(UTC).isoformat(timespec="seconds"),
                    "moir_lib": moir_lib.__version__}
        tmp = path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        try:
            os.link(tmp, path)  # atomic create-if-absent, even with concurrent shard processes
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(out_dir)
    existing = read_manifest(out_dir)
    keys = (set(existing) | set(config)) - set(_INFORMATIONAL)
    differing = sorted(k for k in keys if existing.get(k) != config.get(k))
    if differing:
        details = "; ".join(f"{k}: generation has {existing.get(k)!r}, requested {config.get(k)!r}"
                            for k in differing)
        raise ValueError(f"{out_dir} holds a generation with a different configuration ({details}); resume "
                         f"it with the same settings or choose a new out_dir")
    return existing


def checksum_path(shard_path: Path) -> Path:
    """``shard-XXXXX-of-YYYYY.jsonl.sha256``: the SHA-256 of a complete shard (``sha256sum`` format)."""
    return shard_path.with_name(shard_path.name + ".sha256")


def _sealed_digest(shard_path: Path) -> str | None:
    """The SHA-256 recorded when the shard was completed, or ``None`` when it carries none."""
    side = checksum_path(shard_path)
    try:
        fields = side.read_text(encoding="ascii").split()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedShard(f"{side} cannot be read ({exc}): delete it and rerun `moir generate` on the "
                           f"run to write it again") from None
    if len(fields) != 2 or len(fields[0]) != 64 or fields[1] != shard_path.name:
        raise DamagedShard(f"{side} is not a SHA-256 line for {shard_path.name}: delete it and rerun "
                           f"`moir generate` on the generation to write it again")
    return fields[0]


def _seal(shard_path: Path) -> None:
    """Record the SHA-256 of a complete shard (atomic replace: readers see no half-written checksum)."""
    side = checksum_path(shard_path)
    tmp = side.with_name(f".{side.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(f"{sha256_file(shard_path)}  {shard_path.name}\n", encoding="ascii")
        os.replace(tmp, side)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(shard_path.parent)


def _seal_complete(shard_path: Path, n_done: int, owned: range) -> None:
    """Seal the shard when it holds all its ``owned`` samples and carries no checksum yet (a shard that
    cannot be sealed, e.g. in a read-only directory, stays readable: by count and indices, with a warning)."""
    if n_done == len(owned) and not checksum_path(shard_path).exists():
        try:
            _seal(shard_path)
        except OSError as exc:
            log.warning("%s is complete but its checksum could not be written (%s): it will be checked by "
                        "count and indices only", shard_path, exc)


def _repair(path: Path, line: int) -> str:
    """What to do about a shard whose records go wrong from ``line`` on."""
    keys = path.with_name(path.name.replace("shard-", "keys-", 1).replace(".jsonl", ".safetensors"))
    whole = f"delete {path.name}{f' and {keys.name}' if keys.exists() else ''} to regenerate the shard"
    if line <= 1 or keys.exists():
        return f"{whole}, then rerun `moir generate` with the generation's settings"
    return (f"cut the file before line {line} (`head -n {line - 1} {path} > {path}.tmp && mv {path}.tmp "
            f"{path}`) or {whole}, then rerun `moir generate` with the generation's settings to resume")


def _problem(index: int, n: int, owned: range, seen: dict[int, int]) -> str:
    """Why ``index`` on line ``n`` is not the shard's ``n``-th index."""
    if index in seen:
        return f"repeats sample index {index} of line {seen[index]}"
    if n > len(owned):
        return (f"holds index {index} after the {len(owned)} samples the manifest gives this shard "
                f"(indices {owned.start}, {owned.start + owned.step}, ... < {owned.stop})")
    expected = owned[n - 1]
    if index in owned and index > expected:
        return f"holds index {index} where index {expected} belongs: sample {expected} is missing"
    if index in owned:
        return f"holds index {index} out of order (index {expected} belongs here)"
    return (f"holds index {index}, which is not one of this shard's indices ({owned.start}, "
            f"{owned.start + owned.step}, ... < {owned.stop})")


def _check_lines(path: Path, lines: Iterable[bytes], owned: range) -> int:
    """The number of ``lines`` (the complete lines of ``path``): line ``k`` must hold the ``k``-th index of
    ``owned``; :class:`DamagedShard` naming the first line that does not."""
    seen: dict[int, int] = {}
    n = 0
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            index = record["index"]
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"index {index!r} is not an integer")
        except (ValueError, KeyError, TypeError) as exc:
            reason = "no 'index' field" if isinstance(exc, KeyError) else str(exc)
            raise DamagedShard(f"{path}: line {n} is not a sample record ({reason}); {_repair(path, n)}") \
                from None
        if n > len(owned) or index != owned[n - 1]:
            raise DamagedShard(f"{path}: line {n} {_problem(index, n, owned, seen)}; {_repair(path, n)}")
        seen[index] = n
    return n


def _complete_lines(path: Path, digest: Any) -> Iterator[bytes]:
    """The complete lines of ``path`` (not a torn tail), every byte read fed to ``digest``."""
    with open(path, "rb") as f:
        for line in f:
            digest.update(line)
            if line.endswith(b"\n"):
                yield line


def _scan_shard(path: Path, owned: range, keep_bytes: int | None = None) -> tuple[list[int], int]:
    """Indices of the complete records of a shard file, truncating a torn tail (or past ``keep_bytes``).

    Every kept line must hold the shard's next index (:class:`DamagedShard` otherwise); a complete shard
    must match its checksum. A shard cut back loses its checksum (it is written again on completion).
    """
    if not path.exists():
        if keep_bytes:
            raise DamagedShard(f"{path} is missing but the key statistics cover {keep_bytes} bytes of it: "
                               f"{_repair(path, 1)}")
        checksum_path(path).unlink(missing_ok=True)
        return [], 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if keep_bytes is not None:
        if keep_bytes > end:
            raise DamagedShard(f"{path} has {end} complete bytes but its key statistics cover {keep_bytes}: "
                               f"the shard file was damaged; {_repair(path, 1)}")
        end = keep_bytes
    n_done = _check_lines(path, io.BytesIO(data[:end]), owned)
    if end != len(data):
        log.warning("%s: truncating %d bytes after the last committed record", path.name, len(data) - end)
        checksum_path(path).unlink(missing_ok=True)
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    elif n_done < len(owned):
        checksum_path(path).unlink(missing_ok=True)  # a shard cut back by hand: sealed again when complete
    else:
        _check_seal(path, hashlib.sha256(data).hexdigest())
    return list(owned[:n_done]), end


def _check_seal(path: Path, digest: str) -> bool:
    """Whether ``path`` (a complete shard of SHA-256 ``digest``) carries a checksum; :class:`DamagedShard`
    when it does not match."""
    sealed = _sealed_digest(path)
    if sealed is not None and sealed != digest:
        raise DamagedShard(f"{path} differs from the checksum written when it was completed "
                           f"({checksum_path(path).name}): it was changed since; {_repair(path, 1)}")
    return sealed is not None


def _manifest_counts(gen_dir: Path, manifest: dict[str, Any]) -> tuple[int, int]:
    """``(samples the generation holds, n_shards)`` of a manifest (:func:`generation_samples`);
    :class:`DamagedShard` when they are not positive integers."""
    counts = []
    stopped = manifest.get("stopped")
    for name in ("n_samples", "n_shards"):
        value = manifest.get(name)
        if name == "n_samples" and isinstance(stopped, dict) and "n_samples" in stopped:
            value = stopped["n_samples"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DamagedShard(f"{gen_dir / MANIFEST}: field {name!r} must be a positive integer, got "
                               f"{value!r}; the manifest is damaged: generate it again into a new "
                               f"directory")
        counts.append(value)
    return counts[0], counts[1]


def verify_generation(gen_dir: str | os.PathLike[str]) -> None:
    """Check that ``gen_dir`` holds exactly the samples its manifest names, before anything reads them.

    Each shard ``i`` of the manifest's ``n_shards`` must exist, hold its indices ``i, i+n, …`` below
    ``n_samples`` in that order, each once, on complete lines, and match the checksum written when it was
    completed; a shard without a checksum (an older generation) is checked by count and indices, with a
    warning. Raises :class:`DamagedShard` (a ``ValueError``) naming the file, the line and what to do.
    """
    gen_dir = Path(gen_dir)
    n_samples, n_shards = _manifest_counts(gen_dir, read_manifest(gen_dir))
    names = {f"{_shard_name((i, n_shards))}.jsonl" for i in range(n_shards)}
    stray = sorted(p.name for p in gen_dir.glob("shard-*-of-*.jsonl") if p.name not in names)
    if stray:
        raise DamagedShard(f"{gen_dir / stray[0]} is not a shard of this generation (its manifest names "
                           f"{n_shards} shard(s)): move it out of {gen_dir}")
    unsealed = []
    for i in range(n_shards):
        path = gen_dir / f"{_shard_name((i, n_shards))}.jsonl"
        owned = shard_indices(n_samples, (i, n_shards))
        if not path.is_file():
            if owned:
                raise DamagedShard(f"{path} is missing: the manifest names {n_samples} samples in {n_shards} "
                                   f"shard(s); generate it with `moir generate --shard {i}/{n_shards} --out "
                                   f"{gen_dir}` (the generation's settings)")
            continue
        digest = hashlib.sha256()
        n_done = _check_lines(path, _complete_lines(path, digest), owned)
        cut = path.stat().st_size > 0 and not _ends_a_line(path)
        if cut or n_done < len(owned):
            torn = f", and line {n_done + 1} is cut off" if cut else ""
            raise DamagedShard(f"{path} holds {n_done} of the {len(owned)} samples the manifest gives it "
                               f"(n_samples {n_samples}, {n_shards} shard(s)){torn}: the shard is "
                               f"incomplete; resume it with `moir generate --shard {i}/{n_shards} --out "
                               f"{gen_dir}` (the generation's settings)")
        if not _check_seal(path, digest.hexdigest()):
            unsealed.append(path.name)
    if unsealed:
        log.warning("%s: no checksum for %s (written before complete shards were sealed): checked by count "
                    "and indices only", gen_dir, ", ".join(unsealed))


def check_shard(out_dir: str | os.PathLike[str], shard: tuple[int, int], n_samples: int) -> None:
    """Check, read-only and before any model work, that the records already in shard ``shard`` of a generation
    are its indices in order (what a resume continues from); :class:`DamagedShard` naming the line
    otherwise. Nothing to check when the generation does not exist yet or has another configuration (the
    manifest check names the difference)."""
    out_dir = Path(out_dir)
    path = out_dir / f"{_shard_name(shard)}.jsonl"
    if not path.is_file() or not (out_dir / MANIFEST).is_file():
        return
    manifest = read_manifest(out_dir)
    if (manifest.get("n_samples"), manifest.get("n_shards")) != (n_samples, shard[1]):
        return
    with open(path, "rb") as f:
        _check_lines(path, (line for line in f if line.endswith(b"\n")), shard_indices(n_samples, shard))


def _ends_a_line(path: Path) -> bool:
    """Whether the last byte of ``path`` (not empty) is a newline."""
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _append(fd: int, data: bytes, path: Path) -> None:
    """Append ``data`` to the shard ``path`` open at ``fd`` and flush it to disk (a full disk or a file-size
    limit names the shard; the torn tail it may leave is cut when the generation resumes)."""
    view = memoryview(data)
    with writing(path):
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)


def _iter_shard(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):  # a torn tail of a killed (or running) writer
                break
            yield json.loads(line)


def read_samples(gen_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the records of every shard of ``gen_dir`` in index order (complete records only).

    A generation still in progress or interrupted yields what has been written so far; a reader that needs the
    generation exactly as its manifest names it calls :func:`verify_generation` first (as a corpus does).
    """
    gen_dir = Path(gen_dir)
    read_manifest(gen_dir)
    shards = sorted(gen_dir.glob("shard-*-of-*.jsonl"))
    yield from heapq.merge(*(_iter_shard(p) for p in shards), key=lambda r: r["index"])
