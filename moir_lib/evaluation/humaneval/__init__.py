"""HumanEval pass@1 (appendix C.3, table "metric_desc") and the sandbox that runs model-written code.

The paper scores HumanEval with one sample per problem at ``temperature=0.2, top_p=0.95``
(``n_samples=1``) by executing ``prompt + completion + test + check(entry_point)`` "in a
custom sandbox". :func:`run_humaneval` generates the completions from an in-memory model
(stopping at the Codex stop sequences :data:`STOP_SEQUENCES`), runs each program with
:func:`execute`, and reports pass@1 (the unbiased pass@k estimator of Chen et al. 2021 with
k = 1, i.e. the share of passing samples, averaged over problems) with per-problem records.

Running generated code is dangerous: nothing runs without an explicit opt-in (``MOIR_ALLOW_CODE_EVAL=1``
or ``allow_code_eval=True``, :mod:`.opt_in`), and every program runs in the layered sandbox of
:mod:`.sandbox`, whose docstring says what each layer contains and what it does not.

One module per concept:

- :mod:`.opt_in`: the opt-in (:class:`CodeExecutionNotAllowed`);
- :mod:`.limits`: :class:`SandboxConfig`, the child's environment and resource limits;
- :mod:`.isolation`: network/PID namespaces and the read-only file system, probed once;
- :mod:`.guard`: the bootstrap the child runs: limits, Python guard, the pass token;
- :mod:`.sandbox`: :func:`execute` and :func:`execute_many` (:class:`ExecutionResult`);
- :mod:`.problems`: :func:`load_problems`, :func:`build_program`, the stop sequences;
- :mod:`.sampling_settings`: :class:`HumanEvalSettings`, how completions are sampled and executed (the
  paper's: :data:`PAPER_HUMANEVAL`);
- :mod:`.completions`: :func:`generate_completions` from an in-memory model;
- :mod:`.scoring`: :func:`pass_at_k`, :func:`evaluate_completions`, :func:`run_humaneval`.
"""

from moir_lib.evaluation.humaneval.completions import generate_completions
from moir_lib.evaluation.humaneval.isolation import isolation_mode
from moir_lib.evaluation.humaneval.limits import SandboxConfig
from moir_lib.evaluation.humaneval.opt_in import (
    ALLOW_ENV,
    CodeExecutionNotAllowed,
    check_code_eval_allowed,
    code_eval_allowed,
)
from moir_lib.evaluation.humaneval.problems import (
    REQUIRED_FIELDS,
    STOP_SEQUENCES,
    build_program,
    load_problems,
    truncate_at_stop,
)
from moir_lib.evaluation.humaneval.sampling_settings import PAPER_HUMANEVAL, HumanEvalSettings
from moir_lib.evaluation.humaneval.sandbox import ExecutionResult, execute, execute_many
from moir_lib.evaluation.humaneval.scoring import (
    HumanEvalResult,
    evaluate_completions,
    pass_at_k,
    run_humaneval,
)

__all__ = [
    "ALLOW_ENV",
    "STOP_SEQUENCES",
    "REQUIRED_FIELDS",
    "CodeExecutionNotAllowed",
    "SandboxConfig",
    "HumanEvalSettings",
    "PAPER_HUMANEVAL",
    "ExecutionResult",
    "HumanEvalResult",
    "code_eval_allowed",
    "check_code_eval_allowed",
    "isolation_mode",
    "execute",
    "execute_many",
    "load_problems",
    "build_program",
    "truncate_at_stop",
    "generate_completions",
    "pass_at_k",
    "evaluate_completions",
    "run_humaneval",
]
