""":func:`evaluate_counterfact`: check the inputs, tokenise every (prompt, target) pair once, score
them under teacher forcing, generate and score the fluency continuations, aggregate.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from moir_lib.data import CounterFactRecord
from moir_lib.evaluation.counterfact.fluency import _continuations, _fluency_rows, _generation_plan
from moir_lib.evaluation.counterfact.portability import (
    PortabilityArg,
    PortabilityProbe,
    _portability_map,
    portability_probes,
)
from moir_lib.evaluation.counterfact.scoring_settings import CounterFactSettings
from moir_lib.evaluation.counterfact.tables import CONVENTIONS, CounterFactResult, _metrics, _record_row
from moir_lib.evaluation.counterfact.targets import (
    EncodedTarget,
    _bos_token_id,
    encode_prompt_target,
    special_ids,
    tokenizer_adds_bos,
)
from moir_lib.evaluation.counterfact.teacher_forcing import teacher_forced_scores
from moir_lib.timings import timed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

#: The scoring of a plain :func:`evaluate_counterfact` call.
DEFAULT_SETTINGS = CounterFactSettings()


def _unedited_value(baseline: float | CounterFactResult | None, settings: dict[str, Any],
                    case_ids: list[int]) -> float | None:
    if baseline is None:
        return None
    if isinstance(baseline, CounterFactResult):
        for key in ("decoding", "max_gen_tokens", "seed", "add_bos", "max_fluency_prompts"):
            if baseline.settings.get(key) != settings.get(key):
                raise ValueError(f"unedited_fluency was measured with {key}={baseline.settings.get(key)!r}, "
                                 f"this evaluation uses {settings.get(key)!r}: evaluate both with the same "
                                 f"settings")
        if list(baseline.per_record["case_id"]) != case_ids:
            raise ValueError("unedited_fluency comes from an evaluation of other records: evaluate the "
                             "unedited model on the same records")
        value = baseline.metrics.get("fluency")
        if value is None:
            raise ValueError("the baseline evaluation has no fluency (compute_fluency=False?)")
    else:
        value = baseline
    value = float(value)
    if not math.isfinite(value) or value >= 0:
        raise ValueError(f"unedited_fluency must be the unedited model's mean token log-probability "
                         f"(a negative number), got {value}")
    return value


@timed("CounterFact scoring")
def evaluate_counterfact(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                         records: Sequence[CounterFactRecord],
                         settings: CounterFactSettings = DEFAULT_SETTINGS, *,
                         unedited_fluency: float | CounterFactResult | None = None,
                         portability: PortabilityArg = None, edited_subjects: Collection[str] = (),
                         progress: bool = True) -> CounterFactResult:
    """ES/PS/NS (ROME/MEMIT), Efficacy/Generalization/Specificity (EasyEdit), Fluency*, Portability and S_e.

    ``model``: any transformers causal LM (edited or not), evaluated as it is (eval mode for
    the duration; restored after). ``records``: :class:`~moir_lib.data.CounterFactRecord` s
    from :func:`~moir_lib.data.load_counterfact` (ROME or EasyEdit format, or pocket).
    ``settings``: batching, the fluency continuations and BOS (:class:`CounterFactSettings`).

    ``unedited_fluency``: the unedited model's ``fluency`` (a float, or its whole
    :class:`CounterFactResult`, whose settings and records are then checked against these);
    without it Fluency* is ``None`` and the raw ``fluency`` is marked unnormalised.
    ``portability``: the pocket world's two-hop probes (path of ``portability.json``, its list,
    or ``{case_id: probes}``); records' own EasyEdit ``portability`` fields are used where no
    probe is given. ``edited_subjects``: the subjects edited in the run, whose neighbourhood
    prompts NS leaves out where the records name their neighbours (``NS_all`` keeps them). See
    :mod:`moir_lib.evaluation.counterfact` for every definition.
    """
    import pandas as pd

    records = list(records)
    settings = _checked(records, tokenizer, settings)
    ids = special_ids(tokenizer)
    edited = frozenset(edited_subjects)
    recorded = _recorded(settings, len(edited))
    case_ids = [rec.case_id for rec in records]
    base_f = _unedited_value(unedited_fluency, recorded, case_ids) if settings.compute_fluency else None
    probes_by_case = _portability_map(portability)
    with _eval_mode(model):
        # 1. every teacher-forced (prompt, target) pair, tokenised once
        pairs, plan, n_fallbacks = _encode_pairs(tokenizer, records, probes_by_case, settings.add_bos, edited)
        scores = teacher_forced_scores(model, [(p.prefix, p.target) for p in pairs],
                                       batch_size=settings.batch_size, pad_token_id=ids.pad,
                                       progress=progress, desc="CounterFact scoring")

        # 2. fluency: continuations of the generation prompts, scored by the model itself
        gen_rows: list[dict[str, Any]] = []
        if settings.compute_fluency:
            gen_plan = _generation_plan(tokenizer, records, settings.max_fluency_prompts, settings.add_bos,
                                        ids.bos)
            continuations = _continuations(model, [p for *_, p in gen_plan], settings, ids, progress=progress)
            gen_rows = _fluency_rows(model, tokenizer, records, gen_plan, continuations,
                                     batch_size=settings.batch_size, pad_id=ids.pad, progress=progress)

    # 3. per-record rows
    rows = [_record_row(rec, item, scores, [g["mean_logprob"] for g in gen_rows if g["_r"] == r])
            for r, (rec, item) in enumerate(zip(records, plan, strict=True))]
    table = pd.DataFrame(rows)
    generations = pd.DataFrame(gen_rows, columns=["case_id", "prompt", "prompt_source", "continuation",
                                                  "n_tokens", "mean_logprob", "_r"]).drop(columns="_r")

    # 4. aggregates (means over the records where a metric is defined)
    metrics, score = _metrics(table, len(records), plan, base_f)
    recorded["n_tokenisation_fallbacks"] = n_fallbacks
    if n_fallbacks:
        log.warning("%d (prompt, target) pairs merged across the boundary; their targets were tokenised "
                    "alone", n_fallbacks)
    log.info("CounterFact on %d records: %s", len(records),
             ", ".join(f"{k}={metrics[k]:.3f}" for k in CONVENTIONS if isinstance(metrics.get(k), float)))
    return CounterFactResult(metrics, table, generations, recorded, score)


def _checked(records: list[CounterFactRecord], tokenizer: PreTrainedTokenizerBase,
             settings: CounterFactSettings) -> CounterFactSettings:
    """``settings`` with ``add_bos`` resolved (``None``: the tokenizer's default), once the records and
    settings are checked."""
    if not records:
        raise ValueError("no CounterFact records to evaluate")
    for i, rec in enumerate(records):
        if not isinstance(rec, CounterFactRecord):
            raise TypeError(f"records[{i}] is a {type(rec).__name__}, not a CounterFactRecord: read files "
                            f"with moir_lib.data.load_counterfact")
    if settings.decoding not in ("greedy", "sample"):
        raise ValueError(f"decoding must be 'greedy' or 'sample', got {settings.decoding!r}")
    if settings.max_gen_tokens < 1:
        raise ValueError(f"max_gen_tokens must be ≥ 1, got {settings.max_gen_tokens}")
    add_bos = tokenizer_adds_bos(tokenizer) if settings.add_bos is None else settings.add_bos
    if add_bos and _bos_token_id(tokenizer) is None:
        raise ValueError("add_bos=True but the tokenizer has no BOS token")
    return replace(settings, add_bos=add_bos)


def _recorded(settings: CounterFactSettings, n_edited: int) -> dict[str, Any]:
    """The result's ``settings``: how it was scored (a baseline's are checked against them)."""
    return {
        "decoding": settings.decoding, "max_gen_tokens": settings.max_gen_tokens,
        "seed": settings.seed if settings.decoding == "sample" else None,
        "max_fluency_prompts": settings.max_fluency_prompts, "compute_fluency": settings.compute_fluency,
        "add_bos": settings.add_bos, "batch_size": settings.batch_size, "n_edited_subjects": n_edited,
        "fluency_scored_by": "the evaluated model (teacher forcing)",
        "fluency_orientation": "Fluency* = f_baseline / f_edited (higher is better; paper's literal ratio is "
                               "its reciprocal)",
    }


@contextlib.contextmanager
def _eval_mode(model: PreTrainedModel) -> Iterator[None]:
    """Dropout off while the block runs (the metrics must be deterministic); training mode restored after."""
    was_training = bool(getattr(model, "training", False))
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def _encode_pairs(tokenizer: PreTrainedTokenizerBase, records: list[CounterFactRecord],
                  probes_by_case: dict[int, list[PortabilityProbe]],
                  add_bos: bool, edited: frozenset[str]
                  ) -> tuple[list[EncodedTarget], list[dict[str, Any]], int]:
    """Every teacher-forced (prompt, target) pair in order, each distinct pair tokenised once.

    Returns the pairs, per record the indices of its pairs (rewrite, paraphrases, neighbours with
    whether their subject is in ``edited``, portability) and the number of distinct pairs whose
    target was tokenised alone (fallbacks).
    """
    cache: dict[tuple[str, str], EncodedTarget] = {}
    pairs: list[EncodedTarget] = []

    def add(prompt: str, target: str) -> int:
        key = (prompt, target)
        if key not in cache:
            cache[key] = encode_prompt_target(tokenizer, prompt, target, add_bos=add_bos)
        pairs.append(cache[key])
        return len(pairs) - 1

    plan: list[dict[str, Any]] = []
    for rec in records:
        rewrite = rec.filled_prompt
        item: dict[str, Any] = {
            "rewrite_new": add(rewrite, rec.target_new),
            "rewrite_true": add(rewrite, rec.target_true) if rec.target_true else None,
            "para": [(add(p, rec.target_new), add(p, rec.target_true) if rec.target_true else None)
                     for p in rec.paraphrase_prompts],
            "neigh": [add(p, t) for p, t in
                      zip(rec.neighborhood_prompts, rec.neighborhood_targets, strict=True)],
            "neigh_edited": [s in edited for s in rec.neighborhood_subjects] or
                            [False] * len(rec.neighborhood_prompts),
        }
        if rec.case_id in probes_by_case:
            probes, source = probes_by_case[rec.case_id], "given probes"
        else:
            probes, source = portability_probes(rec), "record portability field"
        item["port"] = [[add(p.prompt, t) for t in p.targets] for p in probes]
        item["port_source"] = source if probes else None
        plan.append(item)
    return pairs, plan, sum(e.fallback for e in cache.values())
