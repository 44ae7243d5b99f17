"""Faults an adversarial user meets: concurrent writers, damaged caches, overlapping
merges, kill -9 and resume, unwritable destinations, impossible inputs, programs that exit early.

Every concurrent or killed writer is a real second process; models are tests/tiny.py's micro
models, so the whole file runs in well under a minute beside a training job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from tiny import random_documents, tiny_loaded

from moir_lib import cli, locks, theory
from moir_lib import covariance as C
from moir_lib import generation as G
from moir_lib.cache import DamagedFile, read_checked, write_checked

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llama():
    return tiny_loaded("llama", n_layers=4, seed=0)


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model fails the test: every check here must come before it."""
    import moir_lib.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(moir_lib.models, "load", refuse)


def spawn(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the child did not get there in time")
        time.sleep(0.02)


@contextlib.contextmanager
def holder_process(lock_path: Path):
    """A second process holding ``lock_path`` until the block ends (then killed)."""
    child = spawn(f"""
        import time
        from moir_lib.locks import exclusive
        with exclusive({str(lock_path)!r}, "test"):
            print("locked", flush=True)
            time.sleep(120)
    """)
    assert child.stdout.readline().strip() == b"locked"
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err


# --------------------------------------------------------------------------- 1. one writer at a time


@pytest.mark.parametrize("command", [
    ["edit", "--profile", "pocket", "--editor", "memit", "--cov", "wiki", "--regime", "batch",
     "--n-edits", "1"],
    ["trace", "--profile", "pocket"],
    ["eval", "--profile", "pocket", "--suite", "pocket"],
    ["run", "notebooks/04_g_cancellation.ipynb"],
])
def test_second_writer_to_a_directory_is_refused_with_the_holders_pid(command, tmp_path, capsys,
                                                                      no_model_load):
    out = tmp_path / "out"
    with holder_process(locks.dir_lock_path(out)) as child:
        code, err = run_cli([*command, "--out", str(out)], capsys)
    assert code == 2
    assert f"PID {child.pid}" in err and "in use by" in err and "moir_lib.locks" in err  # its command


def test_second_cov_writer_to_a_file_is_refused(tmp_path, capsys, no_model_load):
    out = tmp_path / "c.safetensors"
    with holder_process(locks.file_lock_path(out)) as child:
        code, err = run_cli(["cov", "estimate", "--profile", "pocket", "--corpus", "pocket:wiki", "--out",
                             str(out)], capsys)
    assert code == 2 and f"PID {child.pid}" in err


def test_stale_lock_of_a_killed_process_is_taken_over(tmp_path, caplog):
    lock = locks.dir_lock_path(tmp_path)
    with holder_process(lock) as child:
        pass  # killed (SIGKILL) on leaving the block, the lock file keeps its record
    assert locks.holder(lock)["pid"] == child.pid
    with caplog.at_level(logging.WARNING, logger="moir_lib.locks"), locks.exclusive(lock, "the directory"):
        assert locks.holder(lock)["pid"] == os.getpid()
    assert f"PID {child.pid}" in caplog.text and "no longer running" in caplog.text
    assert locks.holder(lock) == {}  # a clean release leaves no record


def test_two_generators_on_one_shard(tmp_path, llama):
    out = tmp_path / "run"
    shard = out / "shard-00000-of-00001.jsonl"
    with holder_process(locks.file_lock_path(shard)) as child:
        with pytest.raises(locks.Busy, match=f"PID {child.pid}"):
            G.self_generate(llama.model, llama.tokenizer, G.GenerationSettings("rand1", 4, 4, 2), out,
                            progress=False)
    assert not shard.exists()
    # another shard of the same run is not blocked
    G.self_generate(llama.model, llama.tokenizer, G.GenerationSettings("rand1", 4, 4, 2), out, shard=(1, 2),
                    progress=False)


BUILD_C = """
import sys, time
from tiny import random_documents, tiny_loaded
from moir_lib import covariance as C
lm = tiny_loaded("llama", n_layers=4, seed=0)
lm.adapter.layers[0].register_forward_pre_hook(lambda *a: time.sleep(0.05))
print("start", flush=True)
C.estimate(lm, random_documents(40, seed=2), [1], C.EstimationSettings(tokens_per_batch=48),
           corpus_spec="shared", cache={cache!r}, progress=False)
"""


def test_two_processes_building_one_c_build_it_once(tmp_path, llama):
    cache = tmp_path / "cache"
    child = spawn(BUILD_C.format(cache=str(cache)))
    assert child.stdout.readline().strip() == b"start"
    wait_for(lambda: any(p.read_text() for p in cache.glob("covariance/*/.moir.lock")))
    calls = []
    handle = llama.model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        stats = C.estimate(llama, random_documents(40, seed=2), [1],
                           C.EstimationSettings(tokens_per_batch=48), corpus_spec="shared", cache=cache,
                           progress=False)
    finally:
        handle.remove()
    assert child.wait(60) == 0
    assert stats.from_cache and not calls  # it waited for the other builder, then reused its C


# --------------------------------------------------------------------------- 2. damaged cache entries


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def small_stats(llama, docs=None, **kw) -> C.CovarianceStats:
    return C.estimate(llama, docs or random_documents(12, seed=5), [1, 3],
                      C.EstimationSettings(tokens_per_batch=64), cache=False, progress=False, **kw)


@pytest.mark.parametrize("where", ["data", "header", "truncated"])
def test_damaged_statistics_file_is_named(where, tmp_path, llama):
    path = small_stats(llama).save(tmp_path / "c.safetensors")
    size = path.stat().st_size
    if where == "data":
        flip_bit(path, size - 100)
    elif where == "header":
        text = path.read_bytes()
        start = text.index(b"counts")
        digit = next(i for i in range(start, len(text)) if text[i:i + 1].isdigit())
        flip_bit(path, digit)  # a digit of a count becomes another digit: still valid JSON
    else:
        path.write_bytes(path.read_bytes()[: size // 2])
    with pytest.raises(DamagedFile, match=str(path)):
        C.CovarianceStats.load(path)


def test_damaged_cache_entry_is_rebuilt_never_served(tmp_path, llama, caplog):
    docs = random_documents(12, seed=5)
    kw = {"settings": C.EstimationSettings(tokens_per_batch=64), "corpus_spec": "flip", "cache": tmp_path,
          "progress": False}
    first = C.estimate(llama, docs, [1, 3], **kw)
    for damage in ("flip", "truncate"):
        if damage == "flip":
            flip_bit(first.path, first.path.stat().st_size - 8)
        else:
            first.path.write_bytes(first.path.read_bytes()[:-64])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            again = C.estimate(llama, docs, [1, 3], **kw)
        assert not again.from_cache and str(first.path) in caplog.text and "rebuilt" in caplog.text
        for layer in (1, 3):
            assert torch.equal(again.sum(layer), first.sum(layer))
        assert C.estimate(llama, docs, [1, 3], **kw).from_cache  # the rebuilt entry verifies


def test_checked_cache_files(tmp_path, caplog):
    path = write_checked(tmp_path / "rows.json", lambda p: p.write_text('{"value": 358}'), key={"n": 1})
    assert read_checked(path, key={"n": 1}) == path
    path.write_text('{"value": 958}')
    with caplog.at_level(logging.WARNING):
        assert read_checked(path, key={"n": 1}) is None
    assert str(path) in caplog.text and not path.exists()


def test_a_cache_entry_copied_into_another_keys_place_is_rebuilt_never_served(tmp_path, llama, caplog,
                                                                              monkeypatch):
    """An entry replaced by another key's (its checksums intact) is another computation: a covariance
    estimate of another corpus, the context templates of another seed. Each is rebuilt, with the path
    named, and the rebuilt entry is the one of its own key."""
    import shutil

    from moir_lib.editing import templates

    kw = {"settings": C.EstimationSettings(tokens_per_batch=64), "cache": tmp_path, "progress": False}
    mine = C.estimate(llama, random_documents(12, seed=5), [1, 3], corpus_spec="mine", **kw)
    other = C.estimate(llama, random_documents(12, seed=6), [1, 3], corpus_spec="other", **kw)
    shutil.copy2(other.path, mine.path)
    with caplog.at_level(logging.WARNING):
        again = C.estimate(llama, random_documents(12, seed=5), [1, 3], corpus_spec="mine", **kw)
    assert not again.from_cache and str(mine.path) in caplog.text and "rebuilt" in caplog.text
    assert all(torch.equal(again.sum(layer), mine.sum(layer)) for layer in (1, 3))

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "moir"))
    monkeypatch.setattr(templates, "_TEMPLATE_MEMORY", {})
    first, second = (templates.context_templates(llama.adapter, seed=s, n_per_word=2) for s in (3, 4))
    assert first != second
    entries = sorted((tmp_path / "moir" / "context_templates").iterdir())
    seeds = {json.loads((e / "templates.json").read_text())["settings"]["seed"]: e for e in entries}
    moved, source = seeds[4], seeds[3]
    for name in ("templates.json", "templates.json.sha256"):
        shutil.copy2(source / name, moved / name)
    templates._TEMPLATE_MEMORY.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert templates.context_templates(llama.adapter, seed=4, n_per_word=2) == second
    assert f"{moved / 'templates.json'} is not this key's entry" in caplog.text


# --------------------------------------------------------------------------- 3. merges cannot double-count


def test_merges_refuse_overlapping_parts(tmp_path, llama, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    lines = (json.dumps({"text": d}) + "\n" for d in random_documents(12, seed=8))
    (folder / "a.jsonl").write_text("".join(lines))
    from moir_lib.documents import load_corpus

    paths = []
    for i in range(2):
        stats = C.estimate(llama, load_corpus(folder, shard=(i, 2)), [1],
                           C.EstimationSettings(tokens_per_batch=64), cache=False, progress=False)
        paths.append(str(stats.save(tmp_path / f"s{i}.safetensors")))
    merged = str(tmp_path / "merged.safetensors")
    assert cli.main(["cov", "merge", *paths, "--out", merged]) == 0
    capsys.readouterr()
    for parts in ([paths[0], paths[0]], [merged, paths[1]]):
        code, err = run_cli(["cov", "merge", *parts, "--out", str(tmp_path / "bad.safetensors")], capsys)
        assert code == 2 and "count documents twice" in err and parts[0] in err and parts[1] in err
    whole = C.estimate(llama, load_corpus(folder), [1], C.EstimationSettings(tokens_per_batch=64),
                       cache=False, progress=False)
    with pytest.raises(ValueError, match="shard 0/1 .* overlaps shard 0/2"):
        C.CovarianceStats.load(paths[0]).merge(whole)


def test_strided_shards_overlap_exactly_when_congruent():
    def part(i, n):
        s = C.CovarianceStats([0], 2, {"corpus": [{"name": "c", "n": 100, "shard": [i, n]}]})
        return s

    C.check_disjoint([part(0, 2), part(1, 4), part(3, 4)])  # evens, 1 mod 4, 3 mod 4: disjoint
    with pytest.raises(ValueError, match="shard 2/4 .* overlaps shard 0/2"):
        C.check_disjoint([part(0, 2), part(2, 4)])
    other = C.CovarianceStats([0], 2, {"corpus": [{"name": "c", "n": 50, "shard": [0, 2]}]})
    C.check_disjoint([part(0, 2), other])  # another source (n differs)


# --------------------------------------------------------------------------- 4. kill -9, then resume


GENERATE = """
import time
from tiny import tiny_loaded
from moir_lib import generation as G
lm = tiny_loaded("llama", n_layers=4, seed=0)
lm.adapter.layers[0].register_forward_pre_hook(lambda *a: time.sleep(0.01))
settings = G.GenerationSettings("rand1", 48, 12, 4, collect_layers=[1, 2])
G.self_generate(lm.model, lm.tokenizer, settings, {out!r}, progress=False)
print("finished")
"""


def test_generation_killed_then_resumed_is_byte_identical(tmp_path, llama):
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    child = spawn(GENERATE.format(out=str(killed)))
    keys = killed / "keys-00000-of-00001.safetensors"
    def samples_done() -> int:
        try:
            return C.read_metadata(keys)["generation"]["n_records"]
        except (OSError, ValueError):  # not there yet, or mid-replace
            return 0

    try:
        wait_for(lambda: samples_done() >= 8)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    n_done = C.read_metadata(keys)["generation"]["n_records"]
    assert n_done < 48, "the child finished before it was killed"
    res = G.self_generate(llama.model, llama.tokenizer,
                          G.GenerationSettings("rand1", 48, 12, 4, collect_layers=[1, 2]), killed,
                          progress=False)
    assert res.n_skipped >= n_done and res.complete
    G.self_generate(llama.model, llama.tokenizer,
                    G.GenerationSettings("rand1", 48, 12, 4, collect_layers=[1, 2]), straight, progress=False)
    name = "shard-00000-of-00001.jsonl"
    assert (killed / name).read_bytes() == (straight / name).read_bytes()
    a, b = G.load_key_stats(killed), G.load_key_stats(straight)
    for layer in (1, 2):
        assert a.count(layer) == b.count(layer) and torch.equal(a.sum(layer), b.sum(layer))


def test_merged_shards_stay_within_the_documented_bound(llama):
    """Sharded C equals unsharded C to |ΔS_jk| <= 2 γ_N sqrt(S_jj S_kk) when the keys are the same
    (one document per batch, so each key is computed identically in both runs; README)."""
    docs = random_documents(30, seed=9, min_words=20, max_words=38)
    kw = {"settings": C.EstimationSettings(tokens_per_batch=40), "cache": False, "progress": False}
    whole = C.estimate(llama, docs, [1], corpus_spec="bound", **kw)
    shards = [C.estimate(llama, docs[i::3], [1], corpus_spec={"name": "bound", "shard": [i, 3]}, **kw)
              for i in range(3)]
    merged = C.CovarianceStats.merge_all(shards)
    n = whole.count(1)
    assert merged.count(1) == n
    u = 2.0**-53
    gamma = n * u / (1 - n * u)
    s = whole.sum(1)
    diag = s.diagonal().clamp(min=0)
    bound = 2 * gamma * torch.sqrt(diag[:, None] * diag[None, :])
    assert bool(((merged.sum(1) - s).abs() <= bound).all())


# --------------------------------------------------------------------------- 5. destinations and inputs


def test_unwritable_destinations_fail_before_any_model(tmp_path, capsys, no_model_load):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cases = [
        ["cov", "estimate", "--profile", "pocket", "--corpus", "pocket:wiki", "--out",
         str(blocker / "c.safetensors")],
        ["generate", "--profile", "pocket", "--out", str(blocker / "run")],
        ["run", "notebooks/04_g_cancellation.ipynb", "--out", str(blocker / "run")],
        ["eval", "--profile", "pocket", "--suite", "pocket", "--out", str(blocker)],
    ]
    for argv in cases:
        code, err = run_cli(argv, capsys)
        assert code == 2 and str(blocker) in err, (argv, err)


def test_unwritable_cache_runs_uncached_with_a_warning(tmp_path, llama, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING):
        stats = C.estimate(llama, random_documents(6, seed=1), [1], C.EstimationSettings(tokens_per_batch=64),
                           corpus_spec="ro", cache=blocker / "cache", progress=False)
    assert stats.count(1) > 0 and "not writable" in caplog.text


def test_bad_inputs_get_clear_messages(tmp_path, capsys, llama, no_model_load):
    code, err = run_cli(["cov", "estimate", "--profile", "pocket", "--corpus", "pocket:wiki",
                         "--tokens-per-batch", "0", "--out", str(tmp_path / "c.safetensors")], capsys)
    assert code == 2 and "--tokens-per-batch must be a positive integer, got 0" in err
    grid = tmp_path / "g.yaml"
    grid.write_text("name: x\nruns:\n  - notebook: [a\n")
    code, err = run_cli(["grid", str(grid)], capsys)
    assert code == 2 and f"{grid}:4:1" in err and "not valid YAML" in err
    with pytest.raises(ValueError, match=r"n_instances must be an integer >= 1, got -5"):
        theory.run_all(n_instances=-5)
    with pytest.raises(ValueError, match="shorter seed") as err:
        G.self_generate(llama.model, llama.tokenizer, G.GenerationSettings("rand100000", 2, 4, 2),
                        tmp_path / "g", progress=False)
    assert "-99" not in str(err.value)
    empty = C.CovarianceStats([1], 4, {}).save(tmp_path / "empty.safetensors")
    with pytest.raises(ValueError, match=f"no keys in {empty}"):
        C.CovarianceStats.load(empty).mean(1)


def test_alphaedit_relative_tau_does_not_suggest_relative():
    from moir_lib.editing.alphaedit import null_space_projector

    c = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    with pytest.raises(ValueError) as err:
        null_space_projector(c, 10.0, tau_mode="relative")
    assert "P = I" in str(err.value) and "try tau_mode 'relative'" not in str(err.value)


def test_make_lab_allows_root():
    make = (TESTS.parent / "Makefile").read_text()
    assert "--allow-root" in make and "id -u" in make


# --------------------------------------------------------------------------- 6. the HumanEval sandbox


@pytest.fixture
def allowed(monkeypatch):
    monkeypatch.setenv("MOIR_ALLOW_CODE_EVAL", "1")


PROBLEM = "def f(x):\n    return x + 1\n"
TESTS_OF_F = "assert f(1) == 2\nassert f(2) == 4  # fails\n"


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)",
                                       "raise SystemExit", "raise SystemExit(0)"])
def test_exiting_before_the_tests_is_a_failure(exit_call, allowed):
    from moir_lib.evaluation import humaneval as H

    config = H.SandboxConfig(timeout_s=5.0)
    assert not H.execute(PROBLEM + TESTS_OF_F, config).passed
    result = H.execute(PROBLEM + exit_call + "\n" + TESTS_OF_F, config)
    assert result.returncode == 0 and result.status == "failed"
    assert H.execute(PROBLEM + "assert f(1) == 2\n", config).passed


@pytest.mark.parametrize("guard", [True, False])
def test_no_write_path_reaches_outside_the_sandbox(guard, allowed, tmp_path):
    from moir_lib.evaluation import humaneval as H

    targets = {name: tmp_path / name for name in ("fileio", "posix", "open")}
    body = textwrap.dedent(f"""
        import _io, posix
        for attempt in (lambda: _io.FileIO({str(targets['fileio'])!r}, "w").write(b"x"),
                        lambda: posix.write(posix.open({str(targets['posix'])!r}, 0o101, 0o644), b"x"),
                        lambda: open({str(targets['open'])!r}, "w").write("x")):
            try:
                attempt()
            except OSError:
                pass
        open("inside.txt", "w").write("ok")
    """)
    config = H.SandboxConfig(timeout_s=5.0, python_guard=guard)
    result = H.execute(body, config)
    if not guard and not result.readonly_fs:
        pytest.skip("no read-only mount namespace here: the Python guard is the only barrier")
    assert result.passed, result.stderr
    assert not any(p.exists() for p in targets.values())
