"""Outputs and checkpoints under faults: a failed write never leaves a partial file or replaces a
good one, and a damaged sequential-edit checkpoint is named and refused, never resumed from."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from tiny import FIXED_TEMPLATES, LAYERS, facts_covariance, facts_model, requests

from moir_lib import files, results
from moir_lib.editing import EditSetup, MemitEditor, SequentialSchedule, sequential

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "OMP_NUM_THREADS": "1"}


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "table.parquet"
    good = pd.DataFrame({"x": [1, 2, 3]})
    files.atomic_write(path, lambda p: good.to_parquet(p, index=False))

    def half_then_fail(p: Path) -> None:
        p.write_bytes(b"PAR1 truncat")
        raise OSError(27, "File too large")

    with pytest.raises(OSError, match="File too large"):
        files.atomic_write(path, half_then_fail)
    assert pd.read_parquet(path).equals(good)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.parquet"]  # no temporary left


def test_file_size_limit_leaves_the_earlier_results_whole(tmp_path):
    """A real RLIMIT_FSIZE in a child: writing a larger table over a good one fails with EFBIG."""
    out = tmp_path / "out"
    small = pd.DataFrame({"x": range(5)})
    results.write_results(out, "ch", {"n": 5}, {}, tables={"rows": small}, table_format="parquet")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import resource, signal
        import numpy as np, pandas as pd
        from moir_lib import results
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
        big = pd.DataFrame({{"x": np.random.default_rng(0).random(200_000)}})
        results.write_results({str(out)!r}, "ch", {{"n": 1}}, {{}}, tables={{"rows": big}},
                              table_format="parquet")
    """)], env=ENV, capture_output=True, text=True, timeout=120)
    assert child.returncode != 0 and "File too large" in child.stderr, child.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert pd.read_parquet(out / "rows.parquet").equals(small)


# --------------------------------------------------------------------------- sequential checkpoints


@pytest.fixture(scope="module")
def cov():
    return facts_covariance(facts_model(), LAYERS)


def _checkpointed(cov, ckpt: Path) -> Path:
    editor = MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative")
    sequential(facts_model(), editor, requests(),
               schedule=SequentialSchedule(batch_size=2, milestones=[2], n_edits=2),
               setup=EditSetup(templates=FIXED_TEMPLATES), checkpoint_dir=ckpt)
    return ckpt / (ckpt / "LATEST").read_text().strip()


def _resume(cov, ckpt: Path):
    editor = MemitEditor(cov, LAYERS, lambda_=1.0, lambda_mode="relative")
    return sequential(facts_model(), editor, requests(),
                      schedule=SequentialSchedule(batch_size=2, milestones=[2], n_edits=2),
                      setup=EditSetup(templates=FIXED_TEMPLATES), checkpoint_dir=ckpt)


def test_checkpoint_with_a_flipped_bit_is_refused(cov, tmp_path):
    folder = _checkpointed(cov, tmp_path / "c")
    assert _resume(cov, tmp_path / "c").resumed_from == 2  # an intact one resumes
    weights = folder / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x40  # an exponent bit of the last float
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"checkpoint {folder} is damaged \(weights.safetensors: SHA-256"):
        _resume(cov, tmp_path / "c")


def test_truncated_checkpoint_is_refused(cov, tmp_path):
    folder = _checkpointed(cov, tmp_path / "c")
    state = folder / "state.safetensors"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"checkpoint {folder} is damaged .*start over"):
        _resume(cov, tmp_path / "c")
    (folder / "state.safetensors").unlink()
    with pytest.raises(ValueError, match=r"incomplete \(no state.safetensors\)"):
        _resume(cov, tmp_path / "c")


def test_state_loads_aligned(cov, tmp_path):
    folder = _checkpointed(cov, tmp_path / "c")
    from moir_lib.editing import EditState

    state = EditState.load(folder / "state.safetensors")
    assert state.kkt_past and all(t.data_ptr() % 64 == 0 for t in state.kkt_past.values())


# --------------------------------------------------------------------------- shared caches


def test_generator_on_a_shared_entry_waits_for_the_other(tmp_path):
    import time

    from tiny import tiny_loaded

    from moir_lib import generation as G
    from moir_lib import locks

    llama = tiny_loaded("llama", n_layers=2, seed=0)
    out = tmp_path / "run"
    shard = out / "shard-00000-of-00001.jsonl"
    lock = locks.file_lock_path(shard)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from moir_lib.locks import exclusive
        with exclusive({str(lock)!r}, "test"):
            print("locked", flush=True)
            time.sleep(1.5)
    """)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        start = time.monotonic()
        result = G.self_generate(llama.model, llama.tokenizer, G.GenerationSettings("rand1", 4, 4, 2), out,
                                 progress=False, wait=True)
        assert time.monotonic() - start > 0.5 and result.n_written == 4  # it waited, then generated
    finally:
        child.kill()
        child.wait()


def test_cache_key_holds_the_token_budget(tmp_path):
    from tiny import random_documents, tiny_loaded

    from moir_lib import covariance as C

    llama = tiny_loaded("llama", n_layers=2, seed=0)
    docs = random_documents(40, seed=2)
    kw = {"corpus_spec": "budget", "cache": tmp_path, "progress": False}
    first = C.estimate(llama, docs, [1], C.EstimationSettings(tokens_per_batch=128), **kw)
    other = C.estimate(llama, docs, [1], C.EstimationSettings(tokens_per_batch=512), **kw)
    assert not other.from_cache and other.path != first.path
    assert C.estimate(llama, docs, [1], C.EstimationSettings(tokens_per_batch=128), **kw).from_cache


# --------------------------------------------------------------------------- environment faults named


def test_a_write_that_fills_the_disk_names_the_file_and_what_to_do(tmp_path):
    """The OS error of a failed ``write`` names no file: the shared write helpers (atomic outputs, checked
    cache entries) raise it naming the file being written and what to do, and keep no temporary file."""
    import errno

    from moir_lib.cache import write_checked

    def fill(p: Path) -> None:
        p.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no filename

    def checked(path: Path, write) -> Path:
        return write_checked(path, write, key={"probe": 1})

    for helper, path in ((files.atomic_write, tmp_path / "out" / "results.parquet"),
                         (checked, tmp_path / "cache" / "items.parquet")):
        with pytest.raises(files.WriteError) as err:
            helper(path, fill)
        assert str(err.value) == (f"could not write {path}: No space left on device (the disk is full: free "
                                  f"space, then rerun; finished work is kept)")
        assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
        assert list(path.parent.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="elsewhere.txt"):  # a fault of another file names that one
        files.atomic_write(tmp_path / "x.json", lambda p: open(tmp_path / "elsewhere.txt").read())


def test_a_file_size_limit_names_the_file_in_every_large_writer(tmp_path):
    """A real RLIMIT_FSIZE in a child: a results table (parquet), a covariance (safetensors, whose error is
    its own type) and a self-generated shard (appended) each fail naming their file and `ulimit -f`."""
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, resource, signal
        from pathlib import Path
        import numpy as np, pandas as pd, torch
        from moir_lib import results
        from moir_lib.covariance.stats import CovarianceStats
        from moir_lib.generation.shards import _append
        out = Path({str(tmp_path)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        big = pd.DataFrame({{"x": np.random.default_rng(0).random(100_000)}})
        stats = CovarianceStats.from_sums({{1: torch.eye(200, dtype=torch.float64)}}, 1)
        fd = os.open(out / "shard.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for write in (lambda: results.write_results(out / "run", "ch", {{}}, {{}}, tables={{"rows": big}},
                                                    table_format="parquet"),
                      lambda: stats.save(out / "c.safetensors"),
                      lambda: _append(fd, b"x" * 200_000, out / "shard.jsonl")):
            try:
                write()
                print("no error")
            except OSError as err:
                print(err)
    """)], env=ENV, capture_output=True, text=True, timeout=120)
    lines = child.stdout.splitlines()
    assert child.returncode == 0 and len(lines) == 3, child.stdout + child.stderr[-2000:]
    for line, name in zip(lines, (tmp_path / "run" / "rows.parquet", tmp_path / "c.safetensors",
                                  tmp_path / "shard.jsonl"), strict=True):
        assert line == (f"could not write {name}: File too large (a file-size limit: raise `ulimit -f`, then "
                        f"rerun; finished work is kept)"), line
    assert not (tmp_path / "run" / "rows.parquet").exists() and not (tmp_path / "c.safetensors").exists()
