"""Evaluation of any causal LM, edited or not (appendix C.3); this package never imports ``editing``.

* :mod:`.counterfact`: the CounterFact edit metrics in both conventions: ROME/MEMIT ES, PS,
  NS and EasyEdit/KnowEdit Efficacy, Generalization, Specificity, with Fluency* and
  Portability (:func:`evaluate_counterfact`).
* :mod:`.scores`: the harmonic-mean composites ``S_e`` (eq. (se)) and ``S_p`` (eq. (sp)).
* ``preservation`` (lm-eval suites) and ``humaneval`` (execution sandbox) are imported from
  their modules directly; they pull in heavier dependencies.

Importing this package is cheap: torch, transformers and pandas load on first use.
"""

from moir_lib.evaluation.counterfact import (
    CONVENTIONS,
    CounterFactResult,
    EncodedTarget,
    PortabilityProbe,
    TargetScore,
    encode_prompt_target,
    evaluate_counterfact,
    load_portability,
    portability_probes,
    standalone_target_ids,
    teacher_forced_scores,
    tokenizer_adds_bos,
)
from moir_lib.evaluation.scores import (
    EDIT_METRICS,
    PAPER_PRESERVATION_TASKS,
    Score,
    edit_score,
    harmonic_mean,
    preservation_score,
)

__all__ = [
    "CONVENTIONS",
    "EDIT_METRICS",
    "PAPER_PRESERVATION_TASKS",
    "CounterFactResult",
    "EncodedTarget",
    "PortabilityProbe",
    "Score",
    "TargetScore",
    "edit_score",
    "encode_prompt_target",
    "evaluate_counterfact",
    "harmonic_mean",
    "load_portability",
    "portability_probes",
    "preservation_score",
    "standalone_target_ids",
    "teacher_forced_scores",
    "tokenizer_adds_bos",
]
