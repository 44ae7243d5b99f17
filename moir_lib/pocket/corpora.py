"""Pocket domain corpora: deterministic document streams about (and beside) the world.

The pocket stand-ins for the paper's corpora (appendix A.2): ``wiki`` (encyclopedic
sentences about the world's facts, and with ``WorldSpec.roster_share`` directory pages that put
each person's values right after the name; Wikipedia), ``web`` (everyday prose; DCLM),
``code`` (functions read at run time from the local Python standard library plus
generated ones; StarCoder), ``math`` (word problems with step-by-step answers
ending in ``#### N``; Proof-Pile / GSM8K) and ``chat`` (``<|user|>``/``<|assistant|>``
transcripts about facts and arithmetic; the SFT data). The ``validation`` split of
``chat`` is the held-out post-training reference set (Tulu SFT/DPO, appendix D.3).

Every stream is a pure function of ``(domain, split, seed, world)``.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import operator
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from moir_lib.pocket.world import World

__all__ = [
    "DOMAINS",
    "SPLITS",
    "MIXTURE",
    "REFERENCE_SPLIT",
    "USER",
    "ASSISTANT",
    "iter_documents",
    "math_problem",
    "prose_item",
    "code_task",
    "chat_text",
    "MathProblem",
    "CodeTask",
    "ProseItem",
]

DOMAINS: tuple[str, ...] = ("wiki", "web", "code", "math", "chat")
SPLITS: tuple[str, ...] = ("train", "validation")
#: Pretraining mixture: share of *tokens* per domain (chat is post-training only).
MIXTURE: dict[str, float] = {"wiki": 0.45, "web": 0.10, "code": 0.15, "math": 0.30}
#: The split of ``chat`` that serves as the held-out post-training reference set.
REFERENCE_SPLIT = "validation"
USER, ASSISTANT = "<|user|>", "<|assistant|>"

_NAMES = (
    ("Anna", "she"),
    ("Tom", "he"),
    ("Lena", "she"),
    ("Omar", "he"),
    ("Mia", "she"),
    ("Jack", "he"),
    ("Sara", "she"),
    ("Ben", "he"),
    ("Nora", "she"),
    ("Leo", "he"),
    ("Ivy", "she"),
    ("Max", "he"),
    ("Ella", "she"),
    ("Sam", "he"),
    ("Ruth", "she"),
    ("Paul", "he"),
)
_ITEMS = (
    "apples",
    "pencils",
    "stickers",
    "marbles",
    "cookies",
    "books",
    "stamps",
    "shells",
    "coins",
    "cards",
)
_CAUSES = (
    ("was thirsty", "drank a glass of water"),
    ("was tired", "went to bed early"),
    ("was hungry", "cooked a big dinner"),
    ("was cold", "put on a warm coat"),
    ("felt sick", "went to see the doctor"),
    ("was bored", "read a long book"),
    ("missed the bus", "walked to school"),
    ("lost the keys", "called a locksmith"),
    ("had a birthday", "baked a chocolate cake"),
    ("saw the rain", "took an umbrella"),
    ("wanted to learn", "signed up for a class"),
    ("broke a cup", "swept up the pieces"),
    ("heard a noise", "looked out of the window"),
    ("had a headache", "took a short nap"),
    ("found a puppy", "brought it some food"),
    ("got a letter", "wrote a reply"),
    ("won the race", "celebrated with friends"),
    ("forgot lunch", "bought a sandwich"),
    ("needed money", "took a part-time job"),
    ("liked the song", "sang it all day"),
)
_FILLERS = (
    "It was a quiet morning in the small town.",
    "The weather was sunny and warm.",
    "Everyone at home was still asleep.",
    "The streets were busy with people.",
    "It had been a long week.",
    "The shop on the corner was already open.",
    "A light wind blew through the trees.",
    "Nobody expected what happened next.",
    "The day went by slowly.",
    "The kitchen smelled of fresh bread.",
)
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_VERBS = ("compute", "get", "make", "find", "calc", "build", "apply", "take")
_NOUNS = ("value", "total", "result", "score", "amount", "count", "level", "size", "price", "offset")
_STDLIB_SKIP = {
    "test",
    "tests",
    "idlelib",
    "tkinter",
    "turtledemo",
    "lib2to3",
    "site-packages",
    "ensurepip",
    "pydoc_data",
    "encodings",
    "__pycache__",
    "dist-packages",
    "config-3",
}


def _rng(*parts: object) -> random.Random:
    return random.Random("/".join(map(str, parts)))


# -- wiki ---------------------------------------------------------------------------------------
def _roster(world: World, rng: random.Random) -> str:
    """A directory page: each line a person's name, then their attribute values in a random order."""
    lines = []
    for person in rng.sample(world.people, rng.randint(3, 6)):
        values = [f.object for f in world.facts_of(person)]
        rng.shuffle(values)
        lines.append(f"{person} {', '.join(values)}")
    return "Directory of people\n" + "\n".join(lines)


def _wiki(world: World, rng: random.Random) -> Iterator[str]:
    while True:
        if world.spec.roster_share and rng.random() < world.spec.roster_share:
            yield _roster(world, rng)
            continue
        articles = []
        for _ in range(2 if rng.random() < 0.3 else 1):
            subject = rng.choice(world.facts).subject
            facts = world.facts_of(subject)
            rng.shuffle(facts)
            articles.append(
                " ".join(f.rel.sentence(rng.choice(f.rel.templates), subject, f.object) for f in facts)
            )
        yield " ".join(articles)


# -- web ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProseItem:
    """A cloze item: ``context`` is completed by ``choices[label]``."""

    context: str
    choices: tuple[str, ...]
    label: int


def prose_item(rng: random.Random, n_choices: int = 4) -> ProseItem:
    name, pron = rng.choice(_NAMES)
    picks = rng.sample(_CAUSES, n_choices)
    label = rng.randrange(n_choices)
    return ProseItem(f"{name} {picks[label][0]}, so {pron}", tuple(f" {e}." for _, e in picks), label)


def _faq(world: World, rng: random.Random) -> str:
    """A web FAQ page: questions about the world answered in plain text (no chat tags), so that a
    question read outside a chat has a continuation other than the assistant tag."""
    lines = []
    for fact in rng.sample(world.facts, rng.randint(2, 4)):
        rel = fact.rel
        question = rng.choice(rel.questions).format(fact.subject)
        lines.append(
            f"Q: {question}\nA: {rel.sentence(rng.choice(rel.templates), fact.subject, fact.object)}"
        )
    return "Frequently asked questions\n" + "\n".join(lines)


def _web(world: World, rng: random.Random) -> Iterator[str]:
    while True:
        if rng.random() < 0.25:
            yield _faq(world, rng)
            continue
        sentences = []
        for _ in range(rng.randint(3, 6)):
            if rng.random() < 0.35:
                sentences.append(rng.choice(_FILLERS))
            else:
                item = prose_item(rng)
                sentences.append(item.context + item.choices[item.label])
        yield " ".join(sentences)


# -- math ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MathProblem:
    question: str
    solution: str  # step-by-step, ends with "#### N"
    answer: int


def math_problem(rng: random.Random) -> MathProblem:
    name, pron = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    kind = rng.choice(("add", "sub", "mul", "two"))
    a, b = rng.randint(2, 20), rng.randint(1, 10)
    if kind == "add":
        q = f"{name} has {a} {item}. {pron.capitalize()} gets {b} more. How many {item} does {name} have now?"
        steps, n = f"{name} has {a} + {b} = {a + b} {item}.", a + b
    elif kind == "sub":
        a, b = max(a, b) + 1, min(a, b)
        q = f"{name} has {a} {item}. {pron.capitalize()} gives away {b}. How many {item} are left?"
        steps, n = f"{name} has {a} - {b} = {a - b} {item} left.", a - b
    elif kind == "mul":
        a, b = rng.randint(2, 6), rng.randint(2, 6)
        q = f"{name} buys {a} boxes with {b} {item} in each box. How many {item} does {name} buy?"
        steps, n = f"{name} buys {a} * {b} = {a * b} {item}.", a * b
    else:
        c = rng.randint(1, a + b - 1)
        q = (
            f"{name} has {a} {item}. {pron.capitalize()} gets {b} more and then gives away {c}. "
            f"How many {item} does {name} have now?"
        )
        steps, n = f"First {a} + {b} = {a + b}. Then {a + b} - {c} = {a + b - c}.", a + b - c
    return MathProblem(q, f"{steps}\n#### {n}", n)


def _math(rng: random.Random) -> Iterator[str]:
    while True:
        p = math_problem(rng)
        yield f"Question: {p.question}\nAnswer: {p.solution}"


# -- code ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeTask:
    """A HumanEval-like task: ``prompt`` (signature + docstring, no final newline) + ``solution``.

    The prompt stops before the newline so that the newline and the indentation stay one BPE pre-token,
    as in training text.
    """

    prompt: str
    solution: str
    test: str
    entry_point: str


def code_task(rng: random.Random) -> CodeTask:
    name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
    c = rng.randint(2, 9)
    kind = rng.choice(("plus", "minus", "times", "filter", "repeat", "count", "max", "clip"))
    if kind in ("plus", "minus", "times"):
        op, fn = {"plus": ("+", operator.add), "minus": ("-", operator.sub), "times": ("*", operator.mul)}[
            kind
        ]
        sig, doc, body = "x", f"Return x {kind} {c}.", f"return x {op} {c}"
        cases = [(f"{x}", fn(x, c)) for x in rng.sample(range(-5, 20), 3)]
    elif kind == "filter":
        sig, doc, body = (
            "xs",
            f"Return the items of xs greater than {c}.",
            f"return [x for x in xs if x > {c}]",
        )
        cases = [(repr(xs), [x for x in xs if x > c]) for xs in ([1, c, c + 1, 12], [c + 3, 0], [])]
    elif kind == "repeat":
        sig, doc, body = "s", f"Return s repeated {_NUMBER_WORDS[c]} times.", f"return s * {c}"
        cases = [(repr(s), s * c) for s in ("ab", "x", "")]
    elif kind == "count":
        sig, doc, body = "xs", f"Return how many items of xs equal {c}.", f"return xs.count({c})"
        cases = [(repr(xs), xs.count(c)) for xs in ([c, 1, c], [0], [c])]
    elif kind == "max":
        sig, doc, body = "a, b", "Return the larger of a and b.", "return a if a > b else b"
        cases = [(f"{a}, {b}", max(a, b)) for a, b in ((1, 2), (7, c), (-3, -4))]
    else:
        sig, doc, body = "x", f"Return x, but at most {c}.", f"return min(x, {c})"
        cases = [(f"{x}", min(x, c)) for x in (0, c + 4, c)]
    prompt = f'def {name}({sig}):\n    """{doc}"""'
    test = "".join(f"assert {name}({args}) == {want!r}\n" for args, want in cases)
    return CodeTask(prompt, f"\n    {body}\n", test, name)


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP and not d.startswith("config-"))
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    if not files:
        raise FileNotFoundError(
            f"no Python standard library sources under {root}: the code corpus needs them"
        )
    return files


@lru_cache(maxsize=512)
def _functions(path: Path) -> tuple[tuple[str, str], ...]:
    """(qualified name, source) of the short, ASCII, top-level functions of one stdlib file."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ()
    lines = source.splitlines(keepends=True)
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.decorator_list:
            text = "".join(lines[node.lineno - 1 : node.end_lineno]).rstrip() + "\n"
            if 80 <= len(text) <= 1000 and text.isascii() and "\t" not in text:
                out.append((f"{path.stem}.{node.name}", text))
    return tuple(out)


def _stdlib(split: str, rng: random.Random) -> Iterator[str]:
    files = _stdlib_files()
    while True:  # one pass per epoch, files in a seeded order
        for path in rng.sample(files, len(files)):
            for qualname, text in _functions(path):
                held_out = int(hashlib.sha256(qualname.encode()).hexdigest(), 16) % 10 == 0
                if held_out == (split == "validation"):
                    yield text


def _code(split: str, rng: random.Random) -> Iterator[str]:
    stdlib = _stdlib(split, rng)
    while True:
        if rng.random() < 0.5:
            yield next(stdlib)
        else:
            task = code_task(rng)
            yield task.prompt + task.solution


# -- chat ---------------------------------------------------------------------------------------
def chat_text(turns: list[tuple[str, str]]) -> str:
    """A transcript in the pocket chat format (the tokenizer's chat template, without BOS/EOS)."""
    return "".join(f"{USER}\n{q}\n{ASSISTANT}\n{a}\n" for q, a in turns)


def _chat(world: World, rng: random.Random) -> Iterator[str]:
    while True:
        turns = []
        for _ in range(rng.choice((1, 1, 2))):
            if rng.random() < 0.5:
                fact = rng.choice(world.facts)
                rel = fact.rel
                turns.append(
                    (
                        rng.choice(rel.questions).format(fact.subject),
                        rel.sentence(rel.templates[0], fact.subject, fact.object),
                    )
                )
            else:
                p = math_problem(rng)
                turns.append((p.question, p.solution))
        yield chat_text(turns)


# -- public -------------------------------------------------------------------------------------
def iter_documents(
    domain: str, split: str = "train", n: int | None = None, seed: int = 0, world: World | None = None
) -> Iterator[str]:
    """Yield ``n`` documents (forever if ``None``) of ``domain`` from ``split``; deterministic in all args.

    ``world`` defaults to the default pocket world (:class:`~moir_lib.pocket.world.WorldSpec`).
    """
    if domain not in DOMAINS:
        raise ValueError(f"unknown pocket domain {domain!r}: choose one of {', '.join(DOMAINS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    world = world or World()
    rng = _rng("pocket-corpus", domain, split, seed, world.spec.seed)
    stream = {
        "wiki": lambda: _wiki(world, rng),
        "web": lambda: _web(world, rng),
        "code": lambda: _code(split, rng),
        "math": lambda: _math(rng),
        "chat": lambda: _chat(world, rng),
    }[domain]()
    return itertools.islice(stream, n)
