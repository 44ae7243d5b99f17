"""The measured figures of ``benchmarks/README.md`` (the project's log of measurements) as data.

The log is the one place a measured figure lives; what computes with one reads it from there, never types
it again. :func:`rows` reads every row of the log's tables (command, machine, date, what was measured),
:func:`latest` the most recent row whose command holds a phrase on a machine, and :func:`pipeline` the
figures of the paper's per-model pipeline on a GPU: self-generation and C-estimation throughput, and the
key width, sample length and sample count they were measured and projected at (the H100 rows of
``benchmarks/gpu.py``). :meth:`Pipeline.at` is that pipeline's time at a sample budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOG", "Pipeline", "Row", "latest", "numbers", "pipeline", "rows"]

#: The log.
LOG = Path(__file__).resolve().parents[1] / "benchmarks" / "README.md"
_NUMBER = re.compile(r"\d{1,3}(?: \d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Row:
    """One measurement of the log."""

    command: str
    machine: str
    date: str
    measured: str

    def cite(self) -> str:
        """``"<command>" (<machine>, <date>): <measured>``, for a text that uses the figure."""
        return f"“{self.command}” ({self.machine}, {self.date}): {self.measured}"


def rows(path: str | Path = LOG) -> list[Row]:
    """Every row of the log's ``command | machine | date | measured`` tables, in file order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"the benchmark log {path} is missing: it is the repository's "
                                f"benchmarks/README.md")
    out, in_log = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if cells[:4] == ["command", "machine", "date", "measured"]:
            in_log = True
        elif len(cells) == 4 and in_log and not set(cells[0]) <= {"-"}:
            out.append(Row(*(c.replace("\\|", "|") for c in cells)))
        elif not line.strip().startswith("|"):
            in_log = False
    return out


def latest(log: list[Row], phrase: str, machine: str) -> Row:
    """The most recent row (by date, then position) on ``machine`` whose command holds ``phrase``."""
    found = [(r.date, i, r) for i, r in enumerate(log) if phrase in r.command and r.machine == machine]
    if not found:
        raise ValueError(f"the benchmark log has no row on {machine} whose command holds {phrase!r}")
    return max(found)[2]


def numbers(text: str) -> list[float]:
    """The numbers of ``text`` as the log writes them (``18 300``, ``22 000-29 500``, ``0.6``)."""
    return [float(m.replace(" ", "")) for m in _NUMBER.findall(text)]


@dataclass(frozen=True)
class Pipeline:
    """The per-model pipeline on one GPU as the log measured it: ``generation_tps`` (self-generation,
    tokens/s), ``c_tps`` (one C pass over them, the fastest precision), at key width ``d``, samples of
    ``tokens_per_sample`` tokens (a random model never samples EOS: the worst case), and the paper's
    ``paper_samples``; ``sources``: the rows read."""

    machine: str
    d: int
    tokens_per_sample: int
    paper_samples: int
    generation_tps: float
    c_tps: float
    sources: tuple[Row, ...]

    def at(self, keys_per_dim: float, *, generate: bool = True) -> dict[str, float]:
        """Tokens, samples and minutes (generation, C, total) at ``keys_per_dim`` key vectors per key
        dimension; ``generate``: C_Moir's pipeline (generation, then C), else C alone over a corpus."""
        tokens = keys_per_dim * self.d
        gen = tokens / self.generation_tps / 60 if generate else 0.0
        c = tokens / self.c_tps / 60
        return {"keys_per_dim": keys_per_dim, "tokens": tokens, "samples": tokens / self.tokens_per_sample,
                "generation_min": gen, "c_min": c, "total_min": gen + c}

    def paper(self) -> dict[str, float]:
        """:meth:`at` the paper's budget: ``paper_samples`` samples of ``tokens_per_sample`` tokens."""
        return self.at(self.paper_samples * self.tokens_per_sample / self.d)


def pipeline(path: str | Path = LOG, machine: str = "H100") -> Pipeline:
    """The :class:`Pipeline` of the log's rows on ``machine`` (``benchmarks/gpu.py``: self-generation,
    C estimation, the closed form's key width, the projected pipeline's sample count and length)."""
    log = rows(path)
    gen = latest(log, "self-generation, Llama-3.1-8B shapes", machine)
    c = latest(log, "C estimation, layers", machine)
    width = latest(log, "MEMIT closed form", machine)
    projected = latest(log, "projected per-model pipeline", machine)
    d = re.search(r"d = (\d{1,3}(?: \d{3})*)", width.command)
    sizes = re.search(r"\((\d{1,3}(?: \d{3})*) samples × (\d+) tokens", projected.command)
    if d is None or sizes is None:
        raise ValueError(f"the benchmark log's rows no longer name the key width or the samples: "
                         f"{width.cite()}; {projected.cite()}")
    return Pipeline(machine, int(numbers(d.group(1))[0]), int(sizes.group(2)),
                    int(numbers(sizes.group(1))[0]), numbers(gen.measured)[0],
                    max(numbers(c.measured.split("tokens/s")[0])), (gen, c, width, projected))
