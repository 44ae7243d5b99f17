"""CounterFact edit metrics of appendix C.3, in both conventions, side by side.

:func:`evaluate_counterfact` judges *any* causal LM (edited or not; this module never imports
:mod:`moir_lib.editing`) on :class:`~moir_lib.data.CounterFactRecord` s and returns a
:class:`CounterFactResult`: one row per record and the aggregates under the paper's names.

**ROME/MEMIT convention** (sequence-level likelihood comparisons, Meng et al. 2022/2023)

* ``ES``: ``1[NLL(o* | x) < NLL(o | x)]`` on the rewrite prompt ``x``, where
  ``NLL(o | x) = -(1/T) Σ_t log P(o_t | x, o_<t)`` is length-normalised.
* ``PS``: the same on the paraphrase prompts ``x'`` (per record: the fraction of its
  paraphrases, as ROME averages them; then the mean over records).
* ``NS``: on the neighbourhood prompts, ``Π_s 1[argmax P(· | x_n, o_<s) = o_s]`` with ``o``
  the *true* target (``target_true`` in the ROME format, ``locality_ground_truth`` in the
  EasyEdit one): every token right under teacher forcing. This is the paper's definition;
  ROME's original NS compared likelihoods instead. Per record: the fraction of its prompts.
  *Edited neighbours.* Where the records name their neighbours' subjects (pocket CounterFact's
  ``neighborhood_subjects``), the prompts about a subject in ``edited_subjects`` (the run's own
  edits) are left out of NS: their answer was rewritten or their subject's key moved on purpose,
  so they measure the edit, not its spread. In the 200-person pocket world 100 edits touch 44 %
  of the people, and 43 % of the neighbourhood prompts; in CounterFact's 21 919 records such
  overlaps are rare and the files name no neighbour, so nothing is left out. ``NS_all`` keeps
  the fraction over every neighbourhood prompt.

**EasyEdit/KnowEdit convention** (token-level argmax accuracy under teacher forcing)

* ``Efficacy``: ``(1/T) Σ_t 1[argmax P(· | x, o*_<t) = o*_t]`` on the rewrite prompt
  (partial credit per token), mean over records.
* ``Generalization``: the same on the paraphrase prompts (mean over a record's paraphrases).
* ``Specificity``: identical to ``NS`` (the paper: "the two conventions agree"); computed
  once and reported under both names.
* ``Fluency*``: ``f`` is the mean token log-probability of generated continuations, scored by
  the evaluated model itself under teacher forcing. Continuations are generated from the
  record's ``generation_prompts`` (ROME format), or from the filled rewrite prompt when it
  has none (the EasyEdit convention, which generates from the edit prompt), without chat
  template, for ``max_gen_tokens`` tokens or up to EOS (EOS included). Decoding is greedy by
  default (deterministic, batch-independent; repeated prompts are generated once) or
  ancestral sampling at temperature 1 with a fixed seed (``decoding="sample"``). Per
  continuation the mean over its tokens, per record the mean over its prompts, ``f`` the mean
  over records.

  *Direction.* The paper writes ``f̃ = f_edited / f_baseline`` with ``f`` a mean
  log-probability, i.e. a ratio of two negative numbers, which would *grow* when the edited
  model becomes less fluent. Its tables report values just below 1 for edited models and feed
  Fluency* into a harmonic mean where higher is better, so we report the orientation in which
  higher is better: ``Fluency* = f_baseline / f_edited = NLL_baseline / NLL_edited``: 1 means
  unchanged, below 1 less fluent than the unedited model. ``fluency_ratio_literal`` holds
  the paper's literal ratio (its reciprocal). Without ``baseline_fluency``, ``Fluency*`` is
  ``None`` and only the raw ``fluency`` (``f``) is reported, with ``fluency_normalised=False``.
  Caveat: self-scored continuations reward confident degeneration (a repeating model has a
  high ``f``, so Fluency* can exceed 1); the ``generations`` table lets one look.
* ``Portability``: the fraction of portability probes answered correctly, where "correct"
  means greedy decoding from the probe prompt produces the answer, i.e. every answer token is
  the argmax under teacher forcing (``portability_token_acc`` keeps EasyEdit's per-token
  partial credit). Probes come from the pocket world's two-hop probes (pass its
  ``portability.json`` as ``portability=``; the answer is the *new* two-hop object) or from
  EasyEdit/KnowEdit ``portability`` fields of the records. When neither exists Portability
  is ``None`` (not available) — never invented — and ``S_e`` is flagged incomplete.
* ``S_e`` = HM(Efficacy, Generalization, Specificity, Fluency*, Portability) (eq. (se),
  :func:`moir_lib.evaluation.scores.edit_score`) over the available constituents; the
  unavailable ones are listed in ``S_e_missing``.

**Tokenisation.** A target is scored as the tokens it has *after its prompt*: the prompt and
``prompt + " " + target`` are tokenised without special tokens and the target's ids are the
suffix (:func:`encode_prompt_target`); only if the tokenizer merges across the boundary does it
fall back to tokenising the target alone (:func:`standalone_target_ids`: ``" " + target`` for
byte-level BPEs such as GPT-2's and Llama-3's, ``target`` for SentencePiece tokenizers, which
add the word-start marker themselves; counted in ``settings["n_tokenisation_fallbacks"]``).
Leading/trailing spaces of targets and trailing spaces of prompts are normalised to exactly
one separating space, so ``"Paris"`` and ``" Paris"`` score identically (the AlphaEdit code
strips BOS and spaces by hand for Llama). BOS is prepended exactly once when the tokenizer
adds one by default (Llama, OLMo-2, pocket) and never otherwise (GPT-2, Qwen3), overridable
with ``add_bos``; targets never contain it.

**Batching.** Teacher-forced scoring: one forward pass per batch of ``prefix + target``
sequences, right-padded (causal attention and position ids of real tokens are unaffected) and
sorted by length; identical sequences are scored once. Generation: left-padded batches through
``model.generate`` with an explicit generation config (``use_model_defaults=False``: a model's
own sampling defaults, e.g. Qwen3's, never leak into greedy decoding).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from moir_lib.data import CounterFactRecord
from moir_lib.evaluation.scores import EDIT_METRICS, Score, edit_score
from moir_lib.files import atomic_write, write_json
from moir_lib.timings import timed

if TYPE_CHECKING:  # heavy imports stay lazy
    import pandas as pd
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "CONVENTIONS",
    "CounterFactResult",
    "EncodedTarget",
    "PortabilityProbe",
    "TargetScore",
    "encode_prompt_target",
    "evaluate_counterfact",
    "load_portability",
    "portability_probes",
    "standalone_target_ids",
    "teacher_forced_scores",
    "tokenizer_adds_bos",
]

log = logging.getLogger(__name__)

Decoding = Literal["greedy", "sample"]

#: aggregate metric -> the convention of appendix C.3 it belongs to (for tidy tables).
CONVENTIONS: dict[str, str] = {
    "ES": "ROME/MEMIT", "PS": "ROME/MEMIT", "NS": "ROME/MEMIT",
    **dict.fromkeys(("Efficacy", "Generalization", "Specificity", "Fluency*", "Portability"),
                    "EasyEdit/KnowEdit"),
    "S_e": "composite (eq. (se))",
}
_RECORD_METRICS = ("ES", "PS", "NS", "NS_all", "Efficacy", "Generalization", "Specificity", "fluency",
                   "Portability", "portability_token_acc")


# ----------------------------------------------------------------------------- tokenisation


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _bos_token_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    bos = getattr(tokenizer, "bos_token_id", None)
    return int(bos) if bos is not None else None


def tokenizer_adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``tokenizer(text)`` starts with BOS by default (Llama/OLMo-2/pocket yes, GPT-2/Qwen3 no).

    The same test as :attr:`moir_lib.models.ModelAdapter.tokenizer_adds_bos`, on the tokenizer alone.
    """
    bos = _bos_token_id(tokenizer)
    if bos is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and int(ids[0]) == bos


def _clean_target(target: str) -> str:
    text = target.strip()
    if not text:
        raise ValueError(f"target {target!r} is empty: it tokenises to zero tokens")
    return text


_ANCHOR = "a"  # a neutral one-word prompt (the same anchor as moir_lib.editing's target ids)


def standalone_target_ids(tokenizer: PreTrainedTokenizerBase, target: str) -> list[int]:
    """Ids of ``target`` as it reads after a prompt, tokenised without one (no BOS).

    The suffix of ``ids("a " + target)`` after ``ids("a")``: right for byte-level BPEs
    (GPT-2, Llama-3, pocket), which mark the word-initial space inside the token
    (``"ĠParis"``), and for SentencePiece tokenizers (Llama-2 style), which add the
    word-start marker ``"▁"`` themselves, where the naive ``ids(" " + target)`` would give a
    stray ``"▁"`` token. If even the anchor merges with the target: ``ids(target)`` when that
    starts with ``"▁"`` (SentencePiece), else ``ids(" " + target)``. Leading spaces of
    ``target`` are normalised first, so ``"Paris"`` and ``" Paris"`` give the same ids.
    """
    text = _clean_target(target)
    head, full = _ids(tokenizer, _ANCHOR), _ids(tokenizer, f"{_ANCHOR} {text}")
    if head and len(full) > len(head) and full[:len(head)] == head:
        return full[len(head):]
    plain = _ids(tokenizer, text)
    pieces = tokenizer.convert_ids_to_tokens(plain[:1]) if plain else []
    if pieces and isinstance(pieces[0], str) and pieces[0].startswith("▁"):
        return plain
    ids = _ids(tokenizer, " " + text)
    if not ids:
        raise ValueError(f"target {target!r} tokenises to zero tokens")
    return ids


@dataclass(frozen=True)
class EncodedTarget:
    """``prefix`` (BOS at most once, then the prompt) and ``target`` ids; ``fallback``: the
    suffix method failed (boundary merge) and :func:`standalone_target_ids` was used."""

    prefix: tuple[int, ...]
    target: tuple[int, ...]
    fallback: bool = False


def encode_prompt_target(tokenizer: PreTrainedTokenizerBase, prompt: str, target: str, *,
                         add_bos: bool | None = None) -> EncodedTarget:
    """Ids of ``prompt`` then ``target``, the target's ids being exactly those it has after the prompt.

    The prompt (trailing spaces removed) and ``prompt + " " + target`` are tokenised without
    special tokens; the target's ids are the suffix of the second after the first. If the
    prompt's ids are not a prefix (the tokenizer merged across the boundary), the target is
    tokenised alone (:func:`standalone_target_ids`). ``add_bos``: prepend BOS (once: not if
    the prompt already starts with it); ``None`` = what the tokenizer does by default.
    """
    if add_bos is None:
        add_bos = tokenizer_adds_bos(tokenizer)
    text = _clean_target(target)
    prompt_text = prompt.rstrip(" ")
    if not prompt_text:
        raise ValueError(f"empty prompt for target {target!r}")
    prompt_ids = _ids(tokenizer, prompt_text)
    full = _ids(tokenizer, f"{prompt_text} {text}")
    fallback = not (len(full) > len(prompt_ids) and full[:len(prompt_ids)] == prompt_ids)
    if fallback:
        log.debug("tokenizer merges %r with %r across the boundary: target tokenised alone", prompt, target)
        target_ids = standalone_target_ids(tokenizer, text)
    else:
        target_ids = full[len(prompt_ids):]
    bos = _bos_token_id(tokenizer)
    if add_bos:
        if bos is None:
            raise ValueError("add_bos=True but the tokenizer has no BOS token")
        if not prompt_ids or prompt_ids[0] != bos:
            prompt_ids = [bos, *prompt_ids]
    if not prompt_ids:
        raise ValueError(f"prompt {prompt!r} tokenises to zero tokens and there is no BOS to condition on")
    return EncodedTarget(tuple(prompt_ids), tuple(target_ids), fallback)


# ----------------------------------------------------------------------------- teacher forcing


@dataclass(frozen=True)
class TargetScore:
    """Per-token log-probabilities and argmax hits of one target under teacher forcing."""

    logprobs: tuple[float, ...]
    correct: tuple[bool, ...]

    @property
    def mean_logprob(self) -> float:
        return math.fsum(self.logprobs) / len(self.logprobs)

    @property
    def nll(self) -> float:
        """Length-normalised negative log-likelihood ``-(1/T) Σ_t log P(o_t | x, o_<t)``."""
        return -self.mean_logprob

    @property
    def token_accuracy(self) -> float:
        """EasyEdit's ``(1/T) Σ_t 1[argmax = o_t]``."""
        return sum(self.correct) / len(self.correct)

    @property
    def all_correct(self) -> bool:
        """Every token the argmax (greedy decoding would produce the target)."""
        return all(self.correct)


def _model_device(model: Any) -> torch.device:
    import torch

    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _logits_of(output: Any) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output[0]


def _tqdm(iterable: Iterable[Any], *, progress: bool, desc: str, total: int | None = None) -> Iterable[Any]:
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, disable=not progress, leave=False)


def teacher_forced_scores(model: PreTrainedModel, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                          batch_size: int = 16, pad_token_id: int = 0, progress: bool = False,
                          desc: str = "teacher forcing") -> list[TargetScore]:
    """Score each ``(prefix, target)`` id pair: ``log P(target_t | prefix, target_<t)`` and argmax hits.

    One forward pass per batch of ``prefix + target`` sequences, right-padded (with an
    attention mask) and sorted by length; identical pairs are scored once. Logits are read
    in float32 at the positions that predict the target tokens.
    """
    import torch

    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    keys: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for i, (prefix, target) in enumerate(sequences):
        prefix_t, target_t = tuple(int(t) for t in prefix), tuple(int(t) for t in target)
        if not prefix_t or not target_t:
            raise ValueError(f"sequence {i}: prefix and target need ≥ 1 token each "
                             f"(got {len(prefix_t)} and {len(target_t)})")
        keys.append((prefix_t, target_t))
    unique = sorted(set(keys), key=lambda k: (-(len(k[0]) + len(k[1])), k))
    device = _model_device(model)
    scores: dict[tuple[tuple[int, ...], tuple[int, ...]], TargetScore] = {}
    batches = [unique[i:i + batch_size] for i in range(0, len(unique), batch_size)]
    with torch.inference_mode():
        for batch in _tqdm(batches, progress=progress, desc=desc):
            width = max(len(p) + len(t) for p, t in batch)
            input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            rows, cols, gold = [], [], []
            for b, (prefix, target) in enumerate(batch):
                seq = prefix + target
                input_ids[b, :len(seq)] = torch.tensor(seq)
                mask[b, :len(seq)] = 1
                n = len(prefix)
                rows += [b] * len(target)
                cols += range(n - 1, n - 1 + len(target))  # logits at position p predict token p + 1
                gold += target
            logits = _logits_of(model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                      use_cache=False))
            where = logits.device
            picked = logits[torch.tensor(rows, device=where), torch.tensor(cols, device=where)].float()
            gold_t = torch.tensor(gold, device=picked.device)
            logprobs = torch.log_softmax(picked, dim=-1).gather(1, gold_t[:, None])[:, 0].cpu().tolist()
            hits = (picked.argmax(dim=-1) == gold_t).cpu().tolist()
            start = 0
            for prefix, target in batch:
                stop = start + len(target)
                scores[(prefix, target)] = TargetScore(tuple(logprobs[start:stop]), tuple(bool(h) for h in
                                                                                          hits[start:stop]))
                start = stop
    return [scores[k] for k in keys]


# ----------------------------------------------------------------------------- generation


def _generate(model: PreTrainedModel, prefixes: Sequence[Sequence[int]], *, max_new_tokens: int,
              decoding: Decoding, seed: int, pad_token_id: int, eos_token_id: int | None, batch_size: int,
              progress: bool) -> list[tuple[int, ...]]:
    """Continuations of each prefix (left-padded batches), cut after the first stop token (kept).

    Stop tokens: ``eos_token_id`` (the tokenizer's) and the model's own EOS ids (generation
    config, then config; Llama-3-Instruct lists several), so what ``generate`` stops on is
    exactly what is cut.
    """
    import torch
    from transformers import GenerationConfig

    if not hasattr(model, "generate"):
        raise TypeError(f"{type(model).__name__} has no generate(): Fluency* needs a transformers causal LM "
                        f"(or pass compute_fluency=False)")
    stops = _stop_ids(model, eos_token_id)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=decoding == "sample", num_beams=1,
                              pad_token_id=pad_token_id, eos_token_id=stops or None)
    if decoding == "sample":  # plain ancestral sampling: no top-k / top-p truncation
        config.top_k = 0
        config.top_p = 1.0
        config.temperature = 1.0
    device = _model_device(model)
    out: list[tuple[int, ...]] = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        torch.manual_seed(seed)
        batches = [prefixes[i:i + batch_size] for i in range(0, len(prefixes), batch_size)]
        for batch in _tqdm(batches, progress=progress, desc="fluency generation"):
            width = max(len(p) for p in batch)
            input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for b, prefix in enumerate(batch):
                input_ids[b, width - len(prefix):] = torch.tensor(list(prefix))
                mask[b, width - len(prefix):] = 1
            generated = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                       generation_config=config, use_model_defaults=False)
            for row in generated[:, width:].cpu().tolist():
                cut = next((i for i, t in enumerate(row) if t in stops), None)
                if cut is not None:
                    row = row[:cut + 1]
                out.append(tuple(int(t) for t in row))
    return out


def _stop_ids(model: Any, eos_token_id: int | None) -> list[int]:
    ids: list[int] = [] if eos_token_id is None else [int(eos_token_id)]
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(cfg, "eos_token_id", None)
        for e in eos if isinstance(eos, list | tuple) else [eos]:
            if isinstance(e, int) and e not in ids:
                ids.append(e)
    return ids


# ----------------------------------------------------------------------------- portability


@dataclass(frozen=True)
class PortabilityProbe:
    """A portability question: ``prompt`` answered by any of ``targets``; ``kind`` e.g. ``"two_hop"``."""

    prompt: str
    targets: tuple[str, ...]
    kind: str = "portability"


def _answers(value: Any, where: str) -> tuple[str, ...]:
    """A ground truth as a tuple of acceptable answers (a string, or nested lists of aliases)."""
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if isinstance(value, Sequence):
        return tuple(a for v in value for a in _answers(v, where))
    raise ValueError(f"{where}: a portability answer must be a string or a list of strings, got {value!r}")


def _probe(raw: Any, kind: str, where: str) -> PortabilityProbe:
    if isinstance(raw, PortabilityProbe):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: a portability probe must be an object, got {type(raw).__name__}")
    prompt = raw.get("prompt", raw.get("New Question"))
    if "target_new" in raw and "ground_truth" not in raw:  # pocket two-hop probe: the edited answer
        answers, kind = _answers(raw["target_new"], where), "two_hop"
    else:
        answers = _answers(raw.get("ground_truth", raw.get("New Answer")), where)
    if not isinstance(prompt, str) or not prompt.strip() or not answers:
        raise ValueError(f"{where}: a portability probe needs a prompt and a non-empty answer "
                         f"(keys 'prompt' + 'ground_truth' or 'target_new'), got keys {sorted(raw)}")
    return PortabilityProbe(prompt, answers, kind)


def portability_probes(record: CounterFactRecord) -> list[PortabilityProbe]:
    """The EasyEdit/KnowEdit ``portability`` probes of a record (``[]`` when it has none).

    Accepted shapes: ``{"Subject_Aliasing": [{"prompt", "ground_truth"}], "reasoning": [...], ...}``
    (KnowEdit), a single ``{"prompt", "ground_truth"}`` or ``{"New Question", "New Answer"}``
    (EasyEdit ZsRE-style), or a list of such objects. Anything else raises ``ValueError``.
    """
    raw = record.portability
    where = f"case_id {record.case_id}: portability"
    if raw is None:
        return []
    if isinstance(raw, Mapping):
        if any(k in raw for k in ("prompt", "New Question")):
            return [_probe(raw, "portability", where)]
        probes = []
        for kind, items in raw.items():
            items = [items] if isinstance(items, Mapping) else items
            if not isinstance(items, Sequence) or isinstance(items, str):
                raise ValueError(f"{where}.{kind}: expected a list of probes, got {type(items).__name__}")
            probes += [_probe(item, str(kind), f"{where}.{kind}[{j}]") for j, item in enumerate(items)]
        return probes
    if isinstance(raw, Sequence) and not isinstance(raw, str):
        return [_probe(item, "portability", f"{where}[{j}]") for j, item in enumerate(raw)]
    raise ValueError(f"{where}: unrecognised portability field of type {type(raw).__name__}")


PortabilityArg = (str | os.PathLike[str] | Sequence[Mapping[str, Any]]
                  | Mapping[int, Sequence[PortabilityProbe | Mapping[str, Any]]] | None)


def load_portability(source: str | os.PathLike[str] | Sequence[Mapping[str, Any]]
                     ) -> dict[int, list[PortabilityProbe]]:
    """Portability probes by ``case_id`` from the pocket world's ``portability.json`` (or its list).

    Each pocket probe ``{"case_id", "prompt", "hops", "target_true", "target_new"}`` asks the
    two-hop question (person -> citizenship -> capital) of a rewrite; after the edit the
    correct answer is ``target_new`` (the new country's capital).
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no portability file at {path}")
        source = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(source, Sequence):
        raise ValueError(f"portability probes must be a list of objects, got {type(source).__name__}")
    by_case: dict[int, list[PortabilityProbe]] = {}
    for j, raw in enumerate(source):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("case_id"), int):
            raise ValueError(f"portability probe {j}: needs an integer 'case_id'")
        by_case.setdefault(raw["case_id"], []).append(_probe(raw, "two_hop", f"portability probe {j}"))
    return by_case


def _portability_map(portability: PortabilityArg) -> dict[int, list[PortabilityProbe]]:
    if portability is None:
        return {}
    if isinstance(portability, Mapping):
        return {int(case): [_probe(p, "portability", f"case_id {case}: portability probe {j}")
                            for j, p in enumerate(probes)] for case, probes in portability.items()}
    return load_portability(portability)


# ----------------------------------------------------------------------------- results


@dataclass(eq=False)
class CounterFactResult(Mapping[str, Any]):
    """What :func:`evaluate_counterfact` measured; as a mapping, its ``metrics``.

    ``metrics``: aggregates under the paper's names (``ES PS NS Efficacy Generalization
    Specificity Fluency* Portability S_e``; ``None`` = not available) plus counts and flags
    (``n_records``, ``n_<metric>``, ``fluency``, ``fluency_baseline``, ``fluency_normalised``,
    ``fluency_ratio_literal``, ``S_e_missing``, ``portability_source``). ``records``: one row per
    record (the same metric columns, NaN where not defined, plus NLLs and counts).
    ``generations``: one row per fluency continuation. ``settings``: how it was measured.
    ``edit_score``: the :class:`~moir_lib.evaluation.scores.Score` behind ``metrics["S_e"]``.
    """

    metrics: dict[str, Any]
    records: pd.DataFrame
    generations: pd.DataFrame
    settings: dict[str, Any]
    edit_score: Score | None = field(default=None, repr=False)

    def __getitem__(self, name: str) -> Any:
        return self.metrics[name]

    def __iter__(self) -> Any:
        return iter(self.metrics)

    def __len__(self) -> int:
        return len(self.metrics)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (metrics + settings) for ``summary.json``."""
        return {"metrics": dict(self.metrics), "settings": dict(self.settings)}

    def tidy(self) -> pd.DataFrame:
        """Long table: one row per aggregate metric with its convention and record count."""
        import pandas as pd

        counts = {"Fluency*": "n_fluency"}
        rows = [{"metric": name, "convention": conv, "value": self.metrics.get(name),
                 "n": self.metrics.get(counts.get(name, f"n_{name}"), self.metrics["n_records"])}
                for name, conv in CONVENTIONS.items()]
        return pd.DataFrame(rows)

    def save(self, out_dir: str | os.PathLike[str], prefix: str = "counterfact") -> Path:
        """Write ``<prefix>_metrics.json`` and the per-record and generation tables (parquet)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / f"{prefix}_records.parquet", lambda p: self.records.to_parquet(p, index=False))
        atomic_write(out / f"{prefix}_generations.parquet",
                     lambda p: self.generations.to_parquet(p, index=False))
        write_json(out / f"{prefix}_metrics.json", self.to_dict(), indent=1, default=str)
        return out


def _mean(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return math.fsum(vals) / len(vals) if vals else math.nan


def _aggregate(column: Any) -> tuple[float | None, int]:
    vals = [float(v) for v in column if v is not None and not math.isnan(float(v))]
    return (math.fsum(vals) / len(vals) if vals else None), len(vals)


# ----------------------------------------------------------------------------- the evaluation


def _baseline_value(baseline: float | CounterFactResult | None, settings: dict[str, Any],
                    case_ids: list[int]) -> float | None:
    if baseline is None:
        return None
    if isinstance(baseline, CounterFactResult):
        for key in ("decoding", "max_gen_tokens", "seed", "add_bos", "max_fluency_prompts"):
            if baseline.settings.get(key) != settings.get(key):
                raise ValueError(f"baseline_fluency was measured with {key}={baseline.settings.get(key)!r}, "
                                 f"this evaluation uses {settings.get(key)!r}: evaluate both with the same "
                                 f"settings")
        if list(baseline.records["case_id"]) != case_ids:
            raise ValueError("baseline_fluency comes from an evaluation of other records: evaluate the "
                             "unedited model on the same records")
        value = baseline.metrics.get("fluency")
        if value is None:
            raise ValueError("the baseline evaluation has no fluency (compute_fluency=False?)")
    else:
        value = baseline
    value = float(value)
    if not math.isfinite(value) or value >= 0:
        raise ValueError(f"baseline_fluency must be the unedited model's mean token log-probability "
                         f"(a negative number), got {value}")
    return value


@timed("CounterFact scoring")
def evaluate_counterfact(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                         records: Sequence[CounterFactRecord], *,
                         baseline_fluency: float | CounterFactResult | None = None,
                         portability: PortabilityArg = None,
                         batch_size: int = 16, max_gen_tokens: int = 32, decoding: Decoding = "greedy",
                         seed: int = 0, max_fluency_prompts: int | None = None, compute_fluency: bool = True,
                         add_bos: bool | None = None, edited_subjects: Collection[str] = (),
                         progress: bool = True) -> CounterFactResult:
    """ES/PS/NS (ROME/MEMIT), Efficacy/Generalization/Specificity (EasyEdit), Fluency*, Portability and S_e.

    ``model``: any transformers causal LM (edited or not), evaluated as it is (eval mode for
    the duration; restored after). ``records``: :class:`~moir_lib.data.CounterFactRecord` s
    from :func:`~moir_lib.data.load_counterfact` (ROME or EasyEdit format, or pocket).

    ``baseline_fluency``: the unedited model's ``fluency`` (a float, or its whole
    :class:`CounterFactResult`, whose settings and records are then checked against these);
    without it Fluency* is ``None`` and the raw ``fluency`` is marked unnormalised.
    ``portability``: the pocket world's two-hop probes (path of ``portability.json``, its list,
    or ``{case_id: probes}``); records' own EasyEdit ``portability`` fields are used where no
    probe is given. ``batch_size``: sequences per forward pass / generation batch.
    ``max_gen_tokens``, ``decoding`` (``"greedy"`` or ``"sample"``), ``seed`` (sampling only),
    ``max_fluency_prompts`` (first k generation prompts per record; ``None`` = all),
    ``compute_fluency=False`` skips generation (Fluency* ``None``). ``add_bos``: ``None`` = the
    tokenizer's default. ``edited_subjects``: the subjects edited in the run, whose neighbourhood
    prompts NS leaves out where the records name their neighbours (``NS_all`` keeps them). See
    the module docstring for every definition.
    """
    records = list(records)
    if not records:
        raise ValueError("no CounterFact records to evaluate")
    for i, rec in enumerate(records):
        if not isinstance(rec, CounterFactRecord):
            raise TypeError(f"records[{i}] is a {type(rec).__name__}, not a CounterFactRecord: read files "
                            f"with moir_lib.data.load_counterfact")
    if decoding not in ("greedy", "sample"):
        raise ValueError(f"decoding must be 'greedy' or 'sample', got {decoding!r}")
    edited = frozenset(edited_subjects)
    if max_gen_tokens < 1:
        raise ValueError(f"max_gen_tokens must be ≥ 1, got {max_gen_tokens}")
    if add_bos is None:
        add_bos = tokenizer_adds_bos(tokenizer)
    bos_id = _bos_token_id(tokenizer)
    if add_bos and bos_id is None:
        raise ValueError("add_bos=True but the tokenizer has no BOS token")
    eos_id = getattr(tokenizer, "eos_token_id", None)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = int(pad_id if pad_id is not None else eos_id if eos_id is not None else 0)
    settings: dict[str, Any] = {
        "decoding": decoding, "max_gen_tokens": max_gen_tokens,
        "seed": seed if decoding == "sample" else None,
        "max_fluency_prompts": max_fluency_prompts, "compute_fluency": compute_fluency, "add_bos": add_bos,
        "batch_size": batch_size, "n_edited_subjects": len(edited),
        "fluency_scored_by": "the evaluated model (teacher forcing)",
        "fluency_orientation": "Fluency* = f_baseline / f_edited (higher is better; paper's literal ratio is "
                               "its reciprocal)",
    }
    case_ids = [rec.case_id for rec in records]
    base_f = _baseline_value(baseline_fluency, settings, case_ids) if compute_fluency else None
    probes_by_case = _portability_map(portability)
    was_training = bool(getattr(model, "training", False))
    if was_training:
        model.eval()  # dropout off: the metrics must be deterministic
    try:
        return _evaluate(model, tokenizer, records, settings=settings, base_f=base_f,
                         edited=edited,
                         probes_by_case=probes_by_case, batch_size=batch_size, max_gen_tokens=max_gen_tokens,
                         decoding=decoding, seed=seed, max_fluency_prompts=max_fluency_prompts,
                         compute_fluency=compute_fluency, add_bos=add_bos, bos_id=bos_id, eos_id=eos_id,
                         pad_id=pad_id, progress=progress)
    finally:
        if was_training:
            model.train()


def _evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, records: list[CounterFactRecord], *,
              settings: dict[str, Any], base_f: float | None, edited: frozenset[str],
              probes_by_case: dict[int, list[PortabilityProbe]],
              batch_size: int, max_gen_tokens: int, decoding: Decoding, seed: int,
              max_fluency_prompts: int | None, compute_fluency: bool, add_bos: bool, bos_id: int | None,
              eos_id: int | None, pad_id: int, progress: bool) -> CounterFactResult:
    """The evaluation proper (inputs checked by :func:`evaluate_counterfact`): score, generate, aggregate."""
    import pandas as pd

    # 1. every teacher-forced (prompt, target) pair, tokenised once
    pairs, plan, n_fallbacks = _encode_pairs(tokenizer, records, probes_by_case, add_bos, edited)
    scores = teacher_forced_scores(model, [(p.prefix, p.target) for p in pairs], batch_size=batch_size,
                                   pad_token_id=pad_id, progress=progress, desc="CounterFact scoring")

    # 2. fluency: continuations of the generation prompts, scored by the model itself
    gen_rows: list[dict[str, Any]] = []
    if compute_fluency:
        gen_plan = _generation_plan(tokenizer, records, max_fluency_prompts, add_bos, bos_id)
        continuations = _continuations(model, [p for *_, p in gen_plan], max_gen_tokens=max_gen_tokens,
                                       decoding=decoding, seed=seed, pad_id=pad_id, eos_id=eos_id,
                                       batch_size=batch_size, progress=progress)
        gen_rows = _fluency_rows(model, tokenizer, records, gen_plan, continuations, batch_size=batch_size,
                                 pad_id=pad_id, progress=progress)

    # 3. per-record rows
    rows = [_record_row(rec, item, scores, [g["mean_logprob"] for g in gen_rows if g["_r"] == r])
            for r, (rec, item) in enumerate(zip(records, plan, strict=True))]
    table = pd.DataFrame(rows)
    generations = pd.DataFrame(gen_rows, columns=["case_id", "prompt", "prompt_source", "continuation",
                                                  "n_tokens", "mean_logprob", "_r"]).drop(columns="_r")

    # 4. aggregates (means over the records where a metric is defined)
    metrics, score = _metrics(table, len(records), plan, base_f)
    settings["n_tokenisation_fallbacks"] = n_fallbacks
    if n_fallbacks:
        log.warning("%d (prompt, target) pairs merged across the boundary; their targets were tokenised "
                    "alone", n_fallbacks)
    log.info("CounterFact on %d records: %s", len(records),
             ", ".join(f"{k}={metrics[k]:.3f}" for k in CONVENTIONS if isinstance(metrics.get(k), float)))
    return CounterFactResult(metrics, table, generations, settings, score)


#: A fluency generation: (record index, prompt, prompt source, token prefix).
_Generation = tuple[int, str, str, tuple[int, ...]]


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


def _generation_plan(tokenizer: PreTrainedTokenizerBase, records: list[CounterFactRecord],
                     max_fluency_prompts: int | None, add_bos: bool, bos_id: int | None) -> list[_Generation]:
    """The fluency prompts of every record (its generation prompts, else its rewrite prompt), tokenised."""
    gen_plan: list[_Generation] = []
    for r, rec in enumerate(records):
        prompts, source = (list(rec.generation_prompts), "generation_prompts") if rec.generation_prompts \
            else ([rec.filled_prompt], "rewrite prompt")
        if max_fluency_prompts is not None:
            prompts = prompts[:max_fluency_prompts]
        for prompt in prompts:
            prefix = _ids(tokenizer, prompt.rstrip(" "))
            if add_bos and (not prefix or prefix[0] != bos_id):
                prefix = [bos_id, *prefix]
            gen_plan.append((r, prompt, source, tuple(prefix)))
    return gen_plan


def _continuations(model: PreTrainedModel, prefixes: list[tuple[int, ...]], *, max_gen_tokens: int,
                   decoding: Decoding, seed: int, pad_id: int, eos_id: int | None, batch_size: int,
                   progress: bool) -> list[Any]:
    """One continuation per prefix; greedy decoding generates each distinct prefix once (deterministic)."""
    if decoding == "greedy":
        distinct = list(dict.fromkeys(prefixes))
        generated = _generate(model, distinct, max_new_tokens=max_gen_tokens, decoding=decoding,
                              seed=seed, pad_token_id=pad_id, eos_token_id=eos_id,
                              batch_size=batch_size, progress=progress)
        conts = dict(zip(distinct, generated, strict=True))
        return [conts[p] for p in prefixes]
    return _generate(model, prefixes, max_new_tokens=max_gen_tokens,
                     decoding=decoding, seed=seed, pad_token_id=pad_id, eos_token_id=eos_id,
                     batch_size=batch_size, progress=progress)


@timed("Fluency generation")
def _fluency_rows(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  records: list[CounterFactRecord], gen_plan: list[_Generation], continuations: list[Any],
                  *, batch_size: int, pad_id: int, progress: bool) -> list[dict[str, Any]]:
    """One row per generation: its continuation and mean token log-probability under the model itself."""
    scorable = [(p, c) for (*_, p), c in zip(gen_plan, continuations, strict=True) if c]
    cont_scores = iter(teacher_forced_scores(model, scorable, batch_size=batch_size, pad_token_id=pad_id,
                                             progress=progress, desc="fluency scoring"))
    gen_rows: list[dict[str, Any]] = []
    for (r, prompt, source, _), cont in zip(gen_plan, continuations, strict=True):
        lp = next(cont_scores).mean_logprob if cont else math.nan
        gen_rows.append({"case_id": records[r].case_id, "prompt": prompt, "prompt_source": source,
                         "continuation": tokenizer.decode(list(cont)), "n_tokens": len(cont),
                         "mean_logprob": lp, "_r": r})
    return gen_rows


def _record_row(rec: CounterFactRecord, item: dict[str, Any], scores: Sequence[TargetScore],
                flu: list[float]) -> dict[str, Any]:
    """A record's metrics from its pairs' scores and its fluency log-probabilities ``flu``."""
    new = scores[item["rewrite_new"]]
    true = scores[item["rewrite_true"]] if item["rewrite_true"] is not None else None
    para = [(scores[a], scores[b] if b is not None else None) for a, b in item["para"]]
    neigh = [scores[j] for j in item["neigh"]]
    port = [[scores[j] for j in alts] for alts in item["port"]]
    ns = _mean(float(s.all_correct) for s, e in zip(neigh, item["neigh_edited"], strict=True) if not e)
    return {
        "case_id": rec.case_id,
        "subject": rec.subject,
        "source_format": rec.source_format,
        "ES": float(new.nll < true.nll) if true is not None else math.nan,
        "PS": _mean(float(a.nll < b.nll) for a, b in para if b is not None),
        "NS": ns,
        "NS_all": _mean(float(s.all_correct) for s in neigh),
        "Efficacy": new.token_accuracy,
        "Generalization": _mean(a.token_accuracy for a, _ in para),
        "Specificity": ns,
        "fluency": _mean(flu) if flu else math.nan,
        "Portability": _mean(float(any(s.all_correct for s in alts)) for alts in port),
        "portability_token_acc": _mean(max(s.token_accuracy for s in alts) for alts in port),
        "nll_new": new.nll,
        "nll_true": true.nll if true is not None else math.nan,
        "rewrite_all_correct": float(new.all_correct),
        "n_target_new_tokens": len(new.logprobs),
        "n_paraphrases": len(para),
        "n_neighbours": len(neigh),
        "n_neighbours_edited": sum(item["neigh_edited"]),
        "n_fluency_prompts": len(flu),
        "n_portability": len(port),
        "portability_source": item["port_source"],
    }


def _metrics(table: pd.DataFrame, n_records: int, plan: list[dict[str, Any]],
             base_f: float | None) -> tuple[dict[str, Any], Score]:
    """Means over the records where each metric is defined, Fluency* against ``base_f``, and S_e."""
    metrics: dict[str, Any] = {"n_records": n_records}
    for name in _RECORD_METRICS:
        value, n = _aggregate(table[name])
        metrics[name] = value
        metrics[f"n_{name}"] = n
    f = metrics["fluency"]
    metrics["fluency_baseline"] = base_f
    metrics["fluency_normalised"] = base_f is not None and f is not None
    if metrics["fluency_normalised"] and f != 0.0:
        metrics["Fluency*"] = base_f / f
        metrics["fluency_ratio_literal"] = f / base_f
    else:
        if metrics["fluency_normalised"]:
            log.warning("edited fluency is exactly 0 (certain continuations): Fluency* is undefined")
        metrics["Fluency*"] = None
        metrics["fluency_ratio_literal"] = None
    sources = sorted({item["port_source"] for item in plan if item["port_source"]})
    metrics["portability_source"] = ", ".join(sources) if sources else None
    if metrics["Portability"] is None:
        log.info("Portability not available: no pocket two-hop probes given and no portability fields in the "
                 "records")
    score = edit_score(metrics, allow_missing=EDIT_METRICS)
    metrics["S_e"] = float(score)
    metrics["S_e_missing"] = list(score.missing)
    metrics["S_e_complete"] = score.complete
    return metrics, score
