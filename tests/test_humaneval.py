"""The HumanEval sandbox and pass@1: opt-in, limits, hostile completions, canonical solutions, generation.

Every hostile program is written so that it would *pass* (exit 0) if its attack worked; the
tests check that each is recorded as a failure, that its effect did not happen, that no
process it started survives, and that the evaluation goes on. Each test runs under a
SIGALRM deadline, so a sandbox that hangs fails the test instead of the suite.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from moir_lib.evaluation import humaneval as H

DEADLINE_S = 60
TOY = {
    "task_id": "toy/0",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "entry_point": "add",
    "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
}
FAST = H.SandboxConfig(timeout_s=3.0)


@pytest.fixture(autouse=True)
def _deadline():
    def expired(signum, frame):
        raise TimeoutError(f"test exceeded its {DEADLINE_S} s deadline: the sandbox hung")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(DEADLINE_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def allowed(monkeypatch):
    monkeypatch.setenv(H.ALLOW_ENV, "1")


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _assert_no_stragglers(result: H.ExecutionResult) -> None:
    deadline = time.monotonic() + 3
    while (left := _processes_mentioning(result.workdir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of the sandboxed program survived: {left}"


def _program(body: str) -> str:
    return H.build_program(TOY, body)


# --------------------------------------------------------------------------- opt-in and config


def test_refuses_without_opt_in(monkeypatch):
    monkeypatch.delenv(H.ALLOW_ENV, raising=False)
    with pytest.raises(H.CodeExecutionNotAllowed, match="MOIR_ALLOW_CODE_EVAL=1"):
        H.execute("print('hi')")
    for value in ("0", "true", "yes", ""):
        monkeypatch.setenv(H.ALLOW_ENV, value)
        assert not H.code_eval_allowed()
        with pytest.raises(H.CodeExecutionNotAllowed):
            H.execute_many(["print('hi')"])
    # refused before the model is touched (None would crash any generation)
    with pytest.raises(H.CodeExecutionNotAllowed):
        H.run_humaneval(None, None, [TOY])
    assert H.execute("x = 1", FAST, allow_code_eval=True).passed


def test_config_is_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        H.SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        H.SandboxConfig(memory_mb=0)
    with pytest.raises(ValueError, match="isolation"):
        H.SandboxConfig(isolation="chroot")


def test_pass_fail_and_the_environment(allowed, monkeypatch):
    monkeypatch.setenv("MOIR_TEST_SECRET_TOKEN", "hunter2")
    assert H.execute(_program(TOY["canonical_solution"]), FAST).status == "passed"
    assert H.execute(_program("    return a - b\n"), FAST).status == "failed"
    assert H.execute("def broken(:\n", FAST).status == "failed"
    probe = (
        "import os, sys, tempfile\n"
        "assert 'MOIR_TEST_SECRET_TOKEN' not in os.environ, 'secret leaked'\n"
        "assert set(os.environ) <= {'PATH', 'LANG', 'HOME', 'TMPDIR', 'LC_CTYPE'}, sorted(os.environ)\n"
        "assert os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR']\n"
        "assert 'moir-sandbox-' in os.getcwd()\n"
        "assert sys.flags.isolated and sys.flags.dont_write_bytecode\n"
        "open('scratch.txt', 'w').write('ok')  # the working directory is writable\n"
        "tempfile.NamedTemporaryFile(dir=os.getcwd()).close()\n"
    )
    result = H.execute(probe, FAST)
    assert result.passed, result.stderr
    assert not Path(result.workdir).exists(), "the temporary working directory must be removed"
    assert result.limits["as_bytes"] == FAST.memory_mb * 2**20 and result.limits["cpu_s"] == 4


def test_isolation_probe_reports_what_it_found():
    mode = H.isolation_mode()
    assert mode in ("pid+net", "net", "none")
    with pytest.raises(ValueError):
        H.SandboxConfig(isolation="bogus")
    if mode != "pid+net":
        with pytest.raises(ValueError, match="not available"):
            H.isolation_mode(H.SandboxConfig(isolation="pid+net"))


# --------------------------------------------------------------------------- hostile completions


@pytest.fixture
def listener():
    """A TCP server on the host's loopback: a sandboxed program must not reach it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture
def cleanup():
    """Paths a failing test's attack may have written; removed even when the test fails."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


def _hostile(name: str, tmp_path: Path, port: int) -> tuple[str, list[Path]]:
    """(completion body, files that must not exist afterwards) for attack ``name``."""
    outside = tmp_path / "escaped.txt"
    tmp_marker = Path("/tmp") / f"moir-escape-{os.getpid()}-{name}"
    bodies = {
        "infinite_loop": "    while True:\n        pass\n",
        # bounded on purpose: at most 20 children, each sleeping, then the parent spins
        "fork_bomb": ("    import os, time\n    for _ in range(20):\n        if os.fork() == 0:\n"
                      "            time.sleep(60)\n            os._exit(0)\n    while True:\n        pass\n"),
        "posix_fork": ("    import posix, time\n    for _ in range(20):\n        if posix.fork() == 0:\n"
                       "            time.sleep(60)\n            posix._exit(0)\n"
                       "    while True:\n        pass\n"),
        "huge_allocation": "    blob = bytearray(16 * 2**30)\n    return a + b\n",
        "write_outside": (f"    open({str(outside)!r}, 'w').write('x')\n"
                          f"    open({str(tmp_marker)!r}, 'w').write('x')\n    return a + b\n"),
        "socket": ("    import socket\n"
                   f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
                   "    return a + b\n"),
        "os_system": f"    import os\n    assert os.system('touch {tmp_marker}') == 0\n    return a + b\n",
        "subprocess": ("    import subprocess\n"
                       f"    subprocess.run(['touch', {str(tmp_marker)!r}], check=True)\n    return a + b\n"),
        "kill_parent": "    import os\n    os.kill(os.getppid(), 9)\n    return a + b\n",
    }
    return bodies[name], [outside, tmp_marker]


HOSTILE = ["infinite_loop", "fork_bomb", "posix_fork", "huge_allocation", "write_outside", "socket",
           "os_system", "subprocess", "kill_parent"]


@pytest.mark.parametrize("attack", HOSTILE)
def test_hostile_completion_is_a_contained_failure(attack, allowed, tmp_path, listener, cleanup):
    body, forbidden = _hostile(attack, tmp_path, listener.getsockname()[1])
    cleanup += forbidden
    start = time.monotonic()
    result = H.execute(_program(body), FAST)
    assert not result.passed, f"{attack} passed: {result.stderr}"
    assert result.status in ("failed", "timeout")
    assert time.monotonic() - start < FAST.timeout_s + 5
    for path in forbidden:
        assert not path.exists(), f"{attack} wrote {path}"
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    _assert_no_stragglers(result)
    if attack in ("fork_bomb", "posix_fork", "os_system", "subprocess", "kill_parent", "write_outside"):
        assert result.status == "failed" and "PermissionError" in result.stderr  # refused by the guard
    if attack == "infinite_loop":
        assert result.status == "timeout" and result.returncode == -signal.SIGKILL
    # the evaluation goes on: the next program runs normally
    assert H.execute(_program(TOY["canonical_solution"]), FAST).passed


@pytest.mark.parametrize("attack", ["infinite_loop", "fork_bomb", "huge_allocation", "socket", "kill_parent"])
def test_os_layers_contain_attacks_without_the_python_guard(attack, allowed, tmp_path, listener, cleanup):
    """With the Python guard off, the process/rlimit/namespace layers alone must hold."""
    mode = H.isolation_mode()
    if attack == "socket" and mode == "none":
        pytest.skip("no network namespace here: sockets are blocked only by the Python guard "
                    "(the documented fallback)")
    if attack == "kill_parent" and mode != "pid+net":
        pytest.skip("without a PID namespace only the Python guard stops os.kill(os.getppid(), 9)")
    body, forbidden = _hostile(attack, tmp_path, listener.getsockname()[1])
    cleanup += forbidden
    config = H.SandboxConfig(timeout_s=3.0, python_guard=False)
    result = H.execute(_program(body), config)
    assert not result.passed, f"{attack} passed without the guard: {result.stderr}"
    assert not result.python_guard and result.isolation == mode
    with pytest.raises(BlockingIOError):
        listener.accept()
    _assert_no_stragglers(result)


@pytest.mark.parametrize("guard", [True, False])
def test_socket_fallback_without_namespaces(guard, allowed, tmp_path, listener):
    """isolation='none' is the documented fallback: sockets are refused inside Python, guard or not."""
    body, _ = _hostile("socket", tmp_path, listener.getsockname()[1])
    result = H.execute(_program(body), H.SandboxConfig(timeout_s=3.0, isolation="none", python_guard=guard))
    assert result.status == "failed" and result.isolation == "none"
    assert "PermissionError" in result.stderr
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_evaluation_continues_through_hostile_completions(allowed, tmp_path, listener, cleanup):
    attacks = ["kill_parent", "fork_bomb", "infinite_loop", "os_system", "socket", "huge_allocation"]
    cleanup += [p for a in attacks for p in _hostile(a, tmp_path, 0)[1]]
    completions = [[_hostile(a, tmp_path, listener.getsockname()[1])[0]] for a in attacks]
    completions.insert(3, [TOY["canonical_solution"]])
    problems = [dict(TOY, task_id=f"toy/{i}") for i in range(len(completions))]
    result = H.evaluate_completions(problems, completions, FAST, workers=2)
    passed = {r["task_id"]: r["passed"] for r in result.per_sample}
    assert passed == {f"toy/{i}": i == 3 for i in range(len(completions))}
    assert result.pass_at_1 == pytest.approx(1 / len(completions))
    assert result.n_problems == len(completions) == result.n_samples
    assert {r["status"] for r in result.per_sample} <= {"passed", "failed", "timeout"}
    assert result.settings["sandbox"]["isolation_used"] == H.isolation_mode()
    for a in attacks:
        for path in _hostile(a, tmp_path, 0)[1]:
            assert not path.exists()


# --------------------------------------------------------------------------- real problems


def test_canonical_solutions_of_the_shared_file_pass(slices, allowed):
    problems = H.load_problems(slices / "benchmarks" / "humaneval" / "HumanEval.jsonl.gz")
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"
    picked = problems[::27]  # 7 problems spread over the file
    right = [[p["canonical_solution"]] for p in picked]
    result = H.evaluate_completions(picked, right, H.SandboxConfig(timeout_s=10), workers=2)
    assert result.pass_at_1 == 1.0, [r for r in result.per_sample if not r["passed"]]
    wrong = H.evaluate_completions(picked, [["    return None\n"]] * len(picked), FAST, workers=2)
    assert wrong.pass_at_1 == 0.0


def test_load_problems_checks_the_schema(tmp_path):
    bad = tmp_path / "HumanEval.jsonl"
    bad.write_text('{"task_id": "x", "prompt": "def f():\\n"}\n')
    with pytest.raises(ValueError, match="lacks entry_point, test"):
        H.load_problems(bad)
    with pytest.raises(FileNotFoundError):
        H.load_problems(tmp_path / "nowhere.jsonl")
    good = tmp_path / "dir"
    good.mkdir()
    (good / "HumanEval.jsonl").write_text(__import__("json").dumps(TOY) + "\n")
    assert H.load_problems(good)[0]["entry_point"] == "add"


# --------------------------------------------------------------------------- scoring and generation


def test_pass_at_k_and_truncation():
    assert H.pass_at_k(1, 1, 1) == 1.0 and H.pass_at_k(1, 0, 1) == 0.0
    assert H.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert H.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    with pytest.raises(ValueError):
        H.pass_at_k(3, 4, 1)
    text = "    return a + b\n\ndef helper():\n    pass\nif True:\n"
    assert H.truncate_at_stop(text) == "    return a + b\n"
    assert H.truncate_at_stop("    x = 1\n    # inner comment\n    return x\n#top") == \
        "    x = 1\n    # inner comment\n    return x"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE (exact round trip of code), BOS-prefixing, trained in milliseconds."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [TOY["prompt"] + TOY["canonical_solution"], "def helper():\n    pass\n"] * 20
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


class ScriptedLM(torch.nn.Module):
    """Writes a fixed continuation token by token, honouring the stopping criteria like ``generate``."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, continuation: str) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
        self.steps: list[int] = []
        self.kwargs: list[dict] = []

    def generate(self, input_ids, attention_mask, max_new_tokens, num_return_sequences, pad_token_id,
                 stopping_criteria, **kwargs):
        self.kwargs.append(kwargs)
        rows = input_ids.repeat_interleave(num_return_sequences, 0)
        new = torch.tensor([self.ids[:max_new_tokens]] * rows.shape[0], dtype=rows.dtype)
        for step in range(1, new.shape[1] + 1):
            out = torch.cat([rows, new[:, :step]], 1)
            if bool(stopping_criteria(out, None).all()):
                break
        self.steps.append(step)
        return out


def test_run_humaneval_scores_scripted_completions(allowed):
    tok = byte_tokenizer()
    good = ScriptedLM(tok, "    return a + b\ndef helper():\n    return 0\n")
    long = H.HumanEvalSettings(max_new_tokens=64)
    result = H.run_humaneval(good, tok, [TOY, dict(TOY, task_id="toy/1")], long)
    assert result.pass_at_1 == 1.0 and result.n_problems == 2
    assert [r["completion"] for r in result.per_sample] == ["    return a + b", "    return a + b"]
    assert good.steps[0] < len(good.ids), "generation must stop once a stop sequence appears"
    assert good.kwargs[0] == {"do_sample": True, "temperature": 0.2, "top_p": 0.95}
    assert result.settings["temperature"] == 0.2 and result.settings["n"] == 1
    bad = ScriptedLM(tok, "    return a - b\n")
    assert H.run_humaneval(bad, tok, [TOY], long).pass_at_1 == 0.0
    greedy = ScriptedLM(tok, "    return a + b\n")
    H.run_humaneval(greedy, tok, [TOY], H.HumanEvalSettings(temperature=0.0, max_new_tokens=8))
    assert greedy.kwargs[0] == {"do_sample": False}


def test_generation_with_a_tiny_llama_is_seeded(allowed):
    torch.set_num_threads(1)
    tok = byte_tokenizer()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompts = [TOY["prompt"], "def helper():\n"]
    state = torch.random.get_rng_state()
    sampled = H.HumanEvalSettings(n=2, max_new_tokens=12, seed=3)
    first = H.generate_completions(model, tok, prompts, sampled, progress=False)
    again = H.generate_completions(model, tok, prompts, sampled, progress=False)
    assert torch.equal(state, torch.random.get_rng_state()), "the global RNG must be left alone"
    assert first == again and [len(s) for s in first] == [2, 2]
    assert all(not any(stop in c for stop in H.STOP_SEQUENCES) for s in first for c in s)
    short = H.HumanEvalSettings(max_new_tokens=8, batch_size=2)
    result = H.run_humaneval(model, tok, [TOY] * 3, short, limit=2)
    assert result.n_problems == 2 and len(result.per_sample) == 2 and result.settings["limit"] == 2
    assert 0.0 <= result.pass_at_1 <= 1.0


FORGERIES = {
    # the attack: walk the frames up to the harness, send anything token-like, exit 0
    "frame_walk": ("    import os, sys\n    f = sys._getframe()\n    while f is not None:\n"
                   "        for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
                   "            if isinstance(v, bytes) and len(v) == 32:\n"
                   "                for fd in range(3, 64):\n"
                   "                    try:\n                        os.write(fd, v)\n"
                   "                    except OSError:\n                        pass\n"
                   "        f = f.f_back\n    os._exit(0)\n"),
    # read the token from its pipe and write it to every descriptor
    "descriptors": ("    import os\n    token = b''\n    for fd in range(3, 64):\n        try:\n"
                    "            os.set_blocking(fd, False)\n            token += os.read(fd, 64)\n"
                    "        except (OSError, PermissionError):\n            pass\n"
                    "    for fd in range(3, 64):\n        try:\n            os.write(fd, token)\n"
                    "        except (OSError, PermissionError):\n            pass\n    os._exit(0)\n"),
    "open_descriptors": ("    import os\n    token = b''\n    for fd in range(3, 64):\n        try:\n"
                         "            token += open(fd, 'rb', closefd=False).read1(64)\n"
                         "        except (OSError, PermissionError, ValueError):\n            pass\n"
                         "    for fd in range(3, 64):\n        try:\n"
                         "            open(fd, 'wb', closefd=False).write(token)\n"
                         "        except (OSError, PermissionError, ValueError):\n            pass\n"
                         "    os._exit(0)\n"),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_wrong_code_cannot_forge_the_pass_signal(forgery, allowed):
    """A wrong ``add`` (a - b) that tries to send the pass token itself and exit 0 is a failure."""
    result = H.execute(_program(FORGERIES[forgery] + "    return a - b\n"), FAST)
    assert result.status == "failed", (result.stdout, result.stderr)
