"""Quality gates of the built pocket model (``moir pocket report``).

Measures what makes the pocket model a fair stand-in for the paper's instruction-tuned
models: it knows its facts (first-token recall on held-out paraphrase prompts), it does
chat arithmetic (strict ``#### N`` match) and code, BOS-seeded sampling collapses onto
one first token (the chat template, like OLMo-2-Instruct), while rand×1-seeded sampling
(BOS + one uniformly random token; temperature 1, no top-k/top-p) stays diverse and free
of the chat template. Build time and size come from the cache manifest. Each organism of the recipe
(:mod:`.organisms`) is measured on its own; :func:`organisms_table` shows several side by side.
"""

from __future__ import annotations

import json
import logging
import operator
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.files import write_text
from moir_lib.pocket.build import build, verify
from moir_lib.pocket.corpora import ASSISTANT, USER
from moir_lib.pocket.variants import get_variant

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Int
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = [
    "BUDGETS",
    "GATES",
    "LABELS",
    "measure",
    "markdown_table",
    "organisms_table",
    "reports_markdown",
    "fact_recall",
    "seeded_samples",
    "copies_operands",
    "question_copying",
]

log = logging.getLogger(__name__)

#: metric -> (comparison, threshold); the issue's quality gates.
GATES: dict[str, tuple[str, float]] = {
    "fact_recall": (">=", 0.90),
    "arith_strict_match": (">=", 0.40),
    "bos_top1_share": (">=", 0.90),
    "rand1_top1_share": ("<=", 0.10),
    "rand1_chat_leakage": ("<=", 0.05),
}
#: metric -> (comparison, bound): budgets of the machine that built the model, shown beside the
#: gates but not a gate: the build's wall time depends on the CPU (bf16 autocast where it has AMX or
#: AVX512-BF16, float32 elsewhere, see ``moir pocket build --precision``), not on the model
BUDGETS: dict[str, tuple[str, float]] = {"build_s": ("<=", 600.0)}
_OPS = {">=": operator.ge, "<=": operator.le}
#: metric -> its label in the report's table
LABELS = {
    "fact_recall": "fact recall (first token, held-out paraphrases)",
    "facts_mc_acc": "facts multiple choice (lm-eval acc)",
    "arith_strict_match": "arithmetic, chat format (strict #### N)",
    "arith_raw_strict_match": "arithmetic, raw format (strict #### N)",
    "code_pass@1": "code pass@1",
    "prose_acc": "prose cloze accuracy",
    "arith_copies_operands": "arithmetic, raw format: first answer line holds every number of the question",
    "bos_top1_share": "BOS-seeded: top-1 first-token share",
    "bos_top1_token": "BOS-seeded: top-1 first token",
    "rand1_top1_share": "rand×1-seeded: top-1 first-token share",
    "rand1_chat_leakage": "rand×1-seeded: share containing the chat template",
    "pretrain_s": "pretraining wall time (s)",
    "sft_s": "chat SFT wall time (s)",
    "build_s": "whole build wall time (s)",
    "organism": "organism of the recipe",
    "weights_sha256": "weights (SHA-256 of model.safetensors)",
    "precision": "training precision",
    "cpu_capability": "CPU of the build (torch's capability)",
    "n_parameters": "parameters",
}


def _last_token_logits(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, prompts: list[str], batch_size: int
) -> Float[torch.Tensor, "rows vocab"]:
    """Next-token logits after each prompt (BOS-prefixed), one row per prompt."""
    import torch

    out = []
    for start in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True)
        with torch.no_grad():
            logits = model(**enc).logits  # [batch, seq, vocab], right-padded
        last = enc["attention_mask"].sum(1) - 1  # [batch]
        out.append(logits[torch.arange(len(last)), last])
    return torch.cat(out)


def fact_recall(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    records: list[dict[str, Any]],
    batch_size: int = 64,
) -> float:
    """Share of paraphrase prompts whose greedy next token is the first token of the true object."""
    prompts, targets = [], []
    for rec in records:
        first = tokenizer(" " + rec["requested_rewrite"]["target_true"]["str"], add_special_tokens=False)
        for prompt in rec["paraphrase_prompts"]:
            prompts.append(prompt)
            targets.append(first["input_ids"][0])
    predicted = _last_token_logits(model, tokenizer, prompts, batch_size).argmax(-1)
    return sum(int(p) == t for p, t in zip(predicted.tolist(), targets, strict=True)) / len(targets)


def seeded_samples(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    n: int,
    seed_tokens: int,
    max_new_tokens: int,
    seed: int = 0,
    batch_size: int = 128,
) -> Int[torch.Tensor, "rows new"]:
    """Ancestral samples (temperature 1, no top-k/top-p) after BOS + ``seed_tokens`` random ordinary tokens.

    Returns the new tokens only, ``n`` rows (PAD after an early EOS).
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    special = set(tokenizer.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    picks = ordinary[torch.randint(len(ordinary), (n, seed_tokens), generator=generator)]
    seeds = torch.cat([torch.full((n, 1), tokenizer.bos_token_id), picks], dim=1)  # [n, 1 + seed_tokens]
    torch.manual_seed(seed)
    out = []
    for start in range(0, n, batch_size):
        batch = seeds[start : start + batch_size]
        with torch.no_grad():
            gen = model.generate(
                batch,
                attention_mask=torch.ones_like(batch),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                min_new_tokens=1,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = gen[:, batch.shape[1] :]
        out.append(
            torch.nn.functional.pad(new, (0, max_new_tokens - new.shape[1]), value=tokenizer.pad_token_id)
        )
    return torch.cat(out)


def copies_operands(question: str, line: str) -> bool:
    """Whether ``line`` contains every number written in ``question`` (each as a whole number)."""
    return set(re.findall(r"\d+", question)) <= set(re.findall(r"\d+", line))


def question_copying(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    questions: list[str],
    max_new_tokens: int = 40,
) -> float:
    """Share of greedy raw-format answers (BOS ``Question: q\nAnswer:``) whose first line holds every
    number of the question: does the model read its question (the book's pocket page)?"""
    import torch

    hits = 0
    for question in questions:
        ids = tokenizer(
            f"Question: {question}\nAnswer:", return_tensors="pt", add_special_tokens=False
        ).input_ids
        ids = torch.cat([torch.tensor([[tokenizer.bos_token_id]]), ids], dim=1)  # [1, prompt]
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
        hits += copies_operands(question, answer.split("\n")[0])
    return hits / len(questions)


def _top1(samples: Int[torch.Tensor, "rows new"]) -> tuple[int, float]:
    token, count = Counter(samples[:, 0].tolist()).most_common(1)[0]
    return token, count / samples.shape[0]


def measure(variant: str = "pocket", limit: int | None = None, organism: int = 0) -> dict[str, Any]:
    """Build (or hit) organism ``organism`` of ``variant``, measure every metric and gate; returns the
    report dict."""
    import torch

    from moir_lib.pocket.benchmarks import evaluate
    from moir_lib.pocket.build import load

    spec = get_variant(variant)
    entry = build(variant, organism=organism)
    manifest = verify(entry)
    model, tokenizer = load(variant, organism)
    records = json.loads((entry / "counterfact.json").read_text())
    arith = [
        json.loads(line)["question"]
        for line in (entry / "benchmarks" / "arith.jsonl").read_text().splitlines()
    ]
    bench = evaluate(model, tokenizer, limit=limit, variant=variant)
    n, k = spec.bench.samples, spec.bench.sample_tokens
    bos = seeded_samples(model, tokenizer, n, 0, k, seed=1)
    rand1 = seeded_samples(model, tokenizer, n, 1, k, seed=2)
    chat_ids = torch.tensor(tokenizer.convert_tokens_to_ids([USER, ASSISTANT]))
    bos_token, bos_share = _top1(bos)
    metrics: dict[str, Any] = {
        "fact_recall": fact_recall(model, tokenizer, records[:limit] if limit else records),
        "facts_mc_acc": bench["pocket_facts"]["acc"],
        "arith_strict_match": bench["pocket_arith"]["exact_match"],
        "arith_raw_strict_match": bench["pocket_arith_raw"]["exact_match"],
        "code_pass@1": bench["pocket_code"]["pass@1"],
        "prose_acc": bench["pocket_prose"]["acc"],
        "arith_copies_operands": question_copying(model, tokenizer, arith[:limit] if limit else arith),
        "bos_top1_share": bos_share,
        "bos_top1_token": tokenizer.convert_ids_to_tokens(bos_token),
        "rand1_top1_share": _top1(rand1)[1],
        "rand1_chat_leakage": torch.isin(rand1, chat_ids).any(1).float().mean().item(),
        **manifest["timings"],
        "organism": organism,
        "weights_sha256": manifest["files"]["model.safetensors"],
        "precision": manifest.get("precision", "bf16"),  # builds before the choice existed used bf16
        "cpu_capability": manifest.get("cpu_capability", "unknown"),
        "n_parameters": manifest["n_parameters"],
    }
    gates = {
        name: {"value": metrics[name], "op": op, "threshold": bound, "passed": _OPS[op](metrics[name], bound)}
        for name, (op, bound) in GATES.items()
    }
    budgets = {
        name: {"value": metrics[name], "op": op, "threshold": bound, "within": _OPS[op](metrics[name], bound)}
        for name, (op, bound) in BUDGETS.items()
    }
    return {
        "variant": variant,
        "organism": organism,
        "entry": str(entry),
        "enforced": spec.enforce_gates,
        "passed": all(g["passed"] for g in gates.values()),
        "metrics": metrics,
        "gates": gates,
        "budgets": budgets,
        "architecture": {
            "layers": spec.model.num_layers,
            "hidden": spec.model.hidden_size,
            "intermediate": spec.model.intermediate_size,
            "heads": spec.model.num_heads,
            "vocab": spec.model.vocab_size,
        },
        "world": {"facts": manifest["n_facts"], "subjects": manifest["n_subjects"]},
        "pretrain_tokens": manifest["pretrain_tokens"],
        "samples": {"n": n, "new_tokens": k},
        "limit": limit,
    }


#: metric -> characters shown of its value in a table (a hash: its prefix; the report JSON keeps it whole)
_SHOWN_CHARS = {"weights_sha256": 16}


def _fmt(value: Any, name: str = "") -> str:
    if name in _SHOWN_CHARS and isinstance(value, str):
        value = value[: _SHOWN_CHARS[name]]
    if isinstance(value, float):
        return f"{value:.3f}" if value <= 1 else f"{value:.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "`" + str(value).replace("|", "\\|") + "`"  # a bare | would split the table cell


def _bars(report: dict[str, Any], name: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The gate and the budget of metric ``name`` in ``report`` (either or both ``None``)."""
    return report["gates"].get(name), report.get("budgets", {}).get(name)


def markdown_table(report: dict[str, Any]) -> str:
    """The report as a markdown table (quantity, value, gate or budget, verdict)."""
    lines = ["| quantity | value | gate | |", "|---|---|---|---|"]
    for name, value in report["metrics"].items():
        gate, budget = _bars(report, name)
        rule, verdict = "", ""
        if gate:
            rule = f"{gate['op']} {_fmt(gate['threshold'])}"
            verdict = "pass" if gate["passed"] else "**FAIL**"
        elif budget:
            rule = f"budget {budget['op']} {_fmt(budget['threshold'])}"
            verdict = "within budget" if budget["within"] else "over budget on this CPU"
        label = report.get("labels", {}).get(name) or LABELS.get(name, name)
        lines.append(f"| {label} | {_fmt(value, name)} | {rule} | {verdict} |")
    return "\n".join(lines) + "\n"


def _rule(report: dict[str, Any], name: str) -> str:
    """The bar of metric ``name`` (a gate's, or a budget's), else empty."""
    gate, budget = _bars(report, name)
    if gate:
        return f"{gate['op']} {_fmt(gate['threshold'])}"
    return f"budget {budget['op']} {_fmt(budget['threshold'])}" if budget else ""


def _cell(report: dict[str, Any], name: str) -> str:
    """Metric ``name`` of ``report`` with its verdict where it misses its gate or budget."""
    if name not in report["metrics"]:
        return "—"
    text = _fmt(report["metrics"][name], name)
    gate, budget = _bars(report, name)
    if gate and not gate["passed"]:
        return f"{text} **FAIL**"
    return f"{text} (over budget)" if budget and not budget["within"] else text


def _worst(reports: list[dict[str, Any]], name: str) -> str:
    """The worst value of metric ``name`` over ``reports`` with respect to its gate or budget, with its
    organism in brackets (the lowest for a ``>=`` bar, the highest for ``<=``); empty for a metric
    without a bar."""
    op = next((bar["op"] for r in reports for bar in _bars(r, name) if bar), None)
    scored = [(r["metrics"][name], r.get("organism", 0)) for r in reports
              if isinstance(r["metrics"].get(name), int | float)]
    if op is None or not scored:
        return ""
    value, organism = (min if op == ">=" else max)(scored, key=lambda pair: pair[0])
    return f"{_fmt(float(value), name)} ({organism})"


def organisms_table(reports: list[dict[str, Any]]) -> str:
    """Several organisms' reports (:func:`measure`, one per organism) as one markdown table: a row per
    quantity with its gate or budget, a column per organism, a missed gate marked in its cell, and a
    last column with the worst organism's value of every gated quantity; a last row says whether each
    organism passes every gate, and a sentence under the table names what missed."""
    names = list(dict.fromkeys(name for r in reports for name in r["metrics"] if name != "organism"))
    organisms = [r.get("organism", 0) for r in reports]
    columns = " | ".join(f"organism {k}" for k in organisms)
    lines = [f"| quantity | gate | {columns} | worst (organism) |",
             "|---|---|" + "---|" * (len(reports) + 1)]
    for name in names:
        label = next((r.get("labels", {})[name] for r in reports if name in r.get("labels", {})),
                     LABELS.get(name, name))
        rule = next((_rule(r, name) for r in reports if _rule(r, name)), "")
        lines.append(f"| {label} | {rule} | " + " | ".join(_cell(r, name) for r in reports)
                     + f" | {_worst(reports, name)} |")
    verdicts = ["pass" if r["passed"] else "**FAIL**" for r in reports]
    lines.append("| every gate | | " + " | ".join(verdicts) + " | |")
    missed = {k: [n for n, g in r["gates"].items() if not g["passed"]] for k, r in zip(organisms, reports,
                                                                                         strict=True)}
    if not any(missed.values()):
        verdict = f"Every organism ({', '.join(map(str, organisms))}) passes every gate."
    else:
        verdict = " ".join(f"Organism {k} misses {', '.join(f'`{n}`' for n in gates)}."
                           for k, gates in missed.items() if gates)
    return "\n".join(lines) + "\n\n" + verdict + "\n"


def reports_markdown(reports: list[dict[str, Any]]) -> str:
    """One organism's report as :func:`markdown_table`, several as :func:`organisms_table`."""
    if not reports:
        raise ValueError("no report to show: measure at least one organism")
    return markdown_table(reports[0]) if len(reports) == 1 else organisms_table(reports)


def write(report: dict[str, Any], json_path: Path | None, markdown_path: Path | None) -> None:
    """Write the report JSON and/or its markdown table (atomically, parents created)."""
    for path, text in ((json_path, json.dumps(report, indent=1)), (markdown_path, markdown_table(report))):
        if path is not None:
            write_text(path, text)
            log.info("wrote %s", path)
