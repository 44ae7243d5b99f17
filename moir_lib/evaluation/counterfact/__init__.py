"""CounterFact edit metrics of appendix C.3, in both conventions, side by side.

:func:`evaluate_counterfact` judges *any* causal LM (edited or not; this package never imports
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
  so they measure the edit, not its spread. In the 200-person pocket world 100 edits touch half
  of the people, and about half of the neighbourhood prompts; in CounterFact's 21 919 records such
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
  the paper's literal ratio (its reciprocal). Without ``unedited_fluency``, ``Fluency*`` is
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

One module per concept:

- :mod:`.scoring_settings`: :class:`CounterFactSettings`, how the records are scored;
- :mod:`.targets`: how a target is tokenised after its prompt (:func:`encode_prompt_target`);
- :mod:`.teacher_forcing`: per-token log-probabilities and argmax hits (:func:`teacher_forced_scores`);
- :mod:`.fluency`: the fluency continuations and their self-scored log-probabilities;
- :mod:`.portability`: the portability probes (:func:`load_portability`, :func:`portability_probes`);
- :mod:`.tables`: per-record rows, the aggregates and ``S_e`` (:class:`CounterFactResult`);
- :mod:`.pipeline`: :func:`evaluate_counterfact`.
"""

from moir_lib.evaluation.counterfact.pipeline import evaluate_counterfact
from moir_lib.evaluation.counterfact.portability import PortabilityProbe, load_portability, portability_probes
from moir_lib.evaluation.counterfact.scoring_settings import CounterFactSettings
from moir_lib.evaluation.counterfact.tables import CONVENTIONS, CounterFactResult
from moir_lib.evaluation.counterfact.targets import (
    EncodedTarget,
    encode_prompt_target,
    standalone_target_ids,
    tokenizer_adds_bos,
)
from moir_lib.evaluation.counterfact.teacher_forcing import TargetScore, teacher_forced_scores

__all__ = [
    "CONVENTIONS",
    "CounterFactResult",
    "CounterFactSettings",
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
