"""``moir edit``: one editing experiment of the chapters' Lab (MEMIT or AlphaEdit, batch or sequential),
scored on CounterFact.

``moir edit --profile P --editor memit|alphaedit --cov wiki|moir|moir-bos|oracle|PATH
--regime batch|sequential --n-edits N [--tau T|auto] [--lambda L|auto] [--records PATH] [--set KEY=VALUE]...
--out DIR``

``--tau auto`` / ``--lambda auto`` first select the value on the profile's validation split
(:func:`moir_lib.experiments.selection.select`: the grid ``alphaedit.tau_grid`` / ``memit.lambda_grid``,
``--select-edits`` records edited in one batch, the largest S_e + S_p among the values whose ES clears the
edit gate), then run with it; the selection is in ``summary.json``'s parameters and ``<out>/selection``.

The experiment is :meth:`moir_lib.experiments.lab.Lab.edit`, the function chapters 01 and 05 score their
points with: the same edited records (pocket profiles: the pocket CounterFact after the facts its
preservation suite asks; ``--records``: that file from its first record; both without the profile's
validation split at the end, :mod:`moir_lib.experiments.records`; ``--seed`` ≠ 0: a seeded
permutation), the same named C's (:mod:`moir_lib.covariance.recipes`), editors, context templates
(the editor's ``context_templates`` in the profile) and CounterFact scores
(:class:`~moir_lib.experiments.specs.EvalSettings`: the chapters' defaults unless a flag changes
them). Its outputs are written by :meth:`moir_lib.experiments.experiment.ExperimentResult.save`:
``summary.json`` (headline: the CounterFact metrics after editing and before, per-milestone metrics
for the sequential regime, the z-optimisation statistics, timings; parameters: profile, editor
configuration with λ_eff / null-space dimensions, the covariance used, the context templates),
``requests.csv`` (per-request final z loss), ``milestones.csv`` (sequential) and the evaluation
tables (``counterfact_*``).

``--set KEY=VALUE`` changes a profile setting by its dotted key, as the chapters' ``overrides`` do
(``organism=3``: organism 3 of the pocket recipe; ``alphaedit.tau_grid=[0.5,0.2]``: the grid of ``--tau
auto``).

This module parses the flags and checks every argument before the model is loaded: the profile
(with its overrides), λ > 0 and τ ∈ (0, ∞), the records file (and that it holds N records to
edit), a covariance file (readable, covering the edit layers, of the model's key width where that
can be read from the config, symmetric PSD, and for AlphaEdit a τ that leaves a non-empty null
space), the output directory.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from moir_lib.cli.args import add_model_arguments, positive_int
from moir_lib.data import check_distinct_facts
from moir_lib.experiments.gates import ES_GATE
from moir_lib.files import write_json
from moir_lib.locks import writable_dir, writable_file

if TYPE_CHECKING:
    from moir_lib.experiments.lab import Lab
    from moir_lib.experiments.selection import Selection
    from moir_lib.experiments.specs import EvalSettings, ExperimentSpec
    from moir_lib.profiles import Profile

__all__ = ["COV_NAMES", "add_parser"]

log = logging.getLogger(__name__)

COV_NAMES = ("wiki", "moir", "moir-bos", "oracle")
_EDITORS = ("memit", "alphaedit")
_REGIMES = ("batch", "sequential")
_MODES = ("absolute", "relative")
_ALL = "all"
_AUTO = "auto"


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _count_or_all(text: str) -> int | str:
    return _ALL if text == _ALL else positive_int(text)


def _number_or_auto(text: str) -> float | str:
    return _AUTO if text == _AUTO else _number(text)


def _setting(text: str) -> tuple[str, object]:
    """``--set KEY=VALUE``: a dotted profile key and its value read as YAML."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE such as organism=3, got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise argparse.ArgumentTypeError(f"--set {key}: the value is not YAML ({exc})") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "edit", help="MEMIT / AlphaEdit batch or sequential editing with a chosen C, scored on CounterFact",
        description="Edit a profile's model with MEMIT or AlphaEdit using a named or saved covariance C, "
                    "in the batch or the sequential regime, as the chapters' Lab does, and write "
                    "summary.json with ES/PS/NS, the EasyEdit metrics and S_e. Arguments are checked "
                    "before the model loads.")
    add_model_arguments(p)
    p.add_argument("--editor", required=True, choices=_EDITORS)
    p.add_argument("--cov", required=True, metavar="wiki|moir|moir-bos|oracle|PATH",
                   help="named covariance (estimated on the model, cached) or a saved CovarianceStats file")
    p.add_argument("--regime", required=True, choices=_REGIMES)
    p.add_argument("--n-edits", required=True, type=positive_int, help="number of records to edit")
    p.add_argument("--lambda", dest="lambda_", type=_number_or_auto, metavar="L|auto",
                   help="MEMIT λ (default: the profile's; auto: selected on the validation split)")
    p.add_argument("--lambda-mode", choices=_MODES, help="MEMIT λ convention (default: the profile's)")
    p.add_argument("--tau", type=_number_or_auto, metavar="T|auto",
                   help="AlphaEdit null-space threshold τ (default: the profile's; auto: selected on the "
                        "validation split)")
    p.add_argument("--select-edits", type=positive_int, metavar="N",
                   help="with --tau/--lambda auto: validation records edited per grid value (default: "
                        "--n-edits, at most the profile's editing.validation_records)")
    p.add_argument("--tau-mode", choices=_MODES, help="τ convention (default: the profile's)")
    p.add_argument("--records", dest="records_path", metavar="PATH",
                   help="CounterFact file (ROME or EasyEdit format); pocket profiles default to the pocket "
                        "CounterFact")
    p.add_argument("--portability", help="two-hop probes (pocket portability.json format); default: the "
                                         "pocket CounterFact's")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="sequential regime: edits per batch (default 1, as the paper)")
    p.add_argument("--milestones", help="sequential regime: comma-separated cumulative edit counts "
                                        "(default: the profile's editing.sequential_milestones)")
    p.add_argument("--checkpoint-dir", help="sequential regime: checkpoints, resumed from when present "
                                            "(default <out>/checkpoints)")
    p.add_argument("--v-steps", type=positive_int, help="z optimisation steps (default: the profile's)")
    p.add_argument("--v-lr", type=_number, help="z optimisation learning rate (default: the profile's)")
    p.add_argument("--set", dest="settings", action="append", type=_setting, default=[], metavar="KEY=VALUE",
                   help="a profile setting by dotted key, the value read as YAML, e.g. --set organism=3 or "
                        "--set alphaedit.tau_grid=[0.5,0.2] (repeatable; the chapters' `overrides`); applied "
                        "before the flags above it names")
    p.add_argument("--context-templates", type=int, default=None, metavar="K",
                   help="prefixes sampled from the model to average keys and targets over, besides the "
                        "plain prompt (MEMIT/AlphaEdit code: 5; 0 = the plain prompt only; default: the "
                        "profile's memit.context_templates or alphaedit.context_templates)")
    p.add_argument("--seed", type=int, default=0,
                   help="the one seed of the run's random draws: its edit sample (0: the records in "
                        "file order), context templates, corpus sampling, generation")
    p.add_argument("--n-eval", type=_count_or_all, metavar="N|all",
                   help="edited records scored per point, evenly spaced (default: the chapters' and the "
                        "editability gate's, experiments.N_EVAL; the paper: all)")
    p.add_argument("--pres-limit", type=_count_or_all, metavar="N|all",
                   help="items per preservation task (default: the chapters', experiments.PRES_LIMIT); in "
                        "the pocket suite the first N CounterFact records are the facts task, not edited")
    p.add_argument("--no-fluency", action="store_true", help="skip Fluency* (no generation; S_e incomplete)")
    p.add_argument("--fluency-prompts", type=_count_or_all, metavar="K|all",
                   help="generation prompts per record for Fluency*")
    p.add_argument("--max-gen-tokens", type=positive_int, help="Fluency* continuation length")
    p.add_argument("--eval-batch-size", type=positive_int, help="sequences per evaluation batch")
    p.add_argument("--ns-neighbours", choices=("unedited", "all"),
                   help="NS over the neighbours not edited in the experiment (default; where the records "
                        "name them, as pocket CounterFact does) or over all of them, as MEMIT's evaluation "
                        "code")
    p.add_argument("--out", required=True, help="run directory")
    p.set_defaults(func=_cmd_edit)
    p.epilog = "The evaluation flags default to the chapters' settings (moir_lib.experiments.EvalSettings)."


def add_check_reference_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-reference",
        help="compare our MEMIT/AlphaEdit with a golden case computed by the authors' code",
        description="Read a reference folder (model/, inputs/, expected/<name>.npz; see "
                    "data/reference/SOURCES.md), run the closed forms on its K, resid, C and P and our "
                    "keys -> z -> per-layer updates from its prompts, and print the relative Frobenius error "
                    "of every method x stage x layer against its tolerance. Exit 1 on any failure.")
    p.add_argument("folder", nargs="?", default=None,
                   help="reference folder (default: the repository's case, data/reference)")
    p.add_argument("--json", dest="json_out", metavar="OUT",
                   help="also write the table as a JSON list of rows")
    p.add_argument("--device", default=None, help="e.g. cpu, cuda (default: cpu)")
    p.add_argument("--z-loop", choices=("auto", "upper", "full"), default="auto",
                   help="the loop that fits MEMIT's targets z: auto (the suite's: the layers above the z "
                        "layer only, where the model allows), upper, or full (the whole model every step, "
                        "as the reference's compute_z)")
    p.set_defaults(func=_cmd_check_reference)


def _cmd_check_reference(args: argparse.Namespace) -> int:

    from moir_lib.editing.reference import REFERENCE_DIR, check_reference, format_table

    if args.json_out is not None:
        writable_file(args.json_out, "--json")
    rows = check_reference(args.folder or REFERENCE_DIR, device=args.device, z_loop=args.z_loop)
    print(format_table(rows))
    if args.json_out is not None:
        write_json(args.json_out, rows, indent=1)
    return 0 if all(r["passed"] for r in rows) else 1


# ----------------------------------------------------------------------------- checks


def _check_flags(args: argparse.Namespace) -> None:
    """The flags that need nothing else."""
    lam, tau = (None if v == _AUTO else v for v in (args.lambda_, args.tau))
    if lam is not None and not lam > 0:
        raise ValueError(f"--lambda must be > 0, got {lam}")
    if lam is not None and not math.isfinite(lam):
        raise ValueError(f"--lambda must be finite, got {lam}")
    if tau is not None and not (0 < tau < math.inf):
        raise ValueError(f"--tau must lie in (0, ∞), got {tau}")
    for flag, value, editor in (("--tau", args.tau, "alphaedit"), ("--lambda", args.lambda_, "memit")):
        if value == _AUTO and args.editor != editor:
            raise ValueError(f"{flag} auto selects {editor}'s value: use it with --editor {editor}")
    if args.select_edits is not None and _AUTO not in (args.tau, args.lambda_):
        raise ValueError("--select-edits belongs to --tau auto / --lambda auto")
    if args.context_templates is not None and args.context_templates < 0:
        raise ValueError(f"--context-templates must be >= 0, got {args.context_templates}")
    if args.v_lr is not None and not args.v_lr > 0:
        raise ValueError(f"--v-lr must be > 0, got {args.v_lr}")
    if args.regime == "batch" and (args.milestones or args.batch_size != 1 or args.checkpoint_dir):
        raise ValueError("--milestones, --batch-size and --checkpoint-dir belong to --regime sequential")
    if args.portability and not Path(args.portability).is_file():
        raise FileNotFoundError(f"--portability {args.portability} not found")


def _profile(args: argparse.Namespace) -> Profile:
    """The profile with ``--set``, then ``--lambda-mode``, ``--tau-mode``, ``--v-steps`` and ``--v-lr``
    applied."""
    from moir_lib.profiles import load_profile

    changes = {"memit.lambda_mode": args.lambda_mode, "alphaedit.tau_mode": args.tau_mode,
               "memit.v_num_grad_steps": args.v_steps, "memit.v_lr": args.v_lr}
    overrides = {**dict(args.settings), **{k: v for k, v in changes.items() if v is not None}}
    profile = load_profile(args.profile)
    return profile.with_overrides(overrides) if overrides else profile


def _milestones(args: argparse.Namespace, profile: Profile) -> tuple[int, ...]:
    if args.regime == "batch":
        return ()
    if not args.milestones:
        return tuple(profile.editing.sequential_milestones)
    try:
        values = [int(x) for x in args.milestones.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--milestones: expected comma-separated integers, got {args.milestones!r}"
                         ) from None
    increasing = all(b > a for a, b in zip(values, values[1:], strict=False))
    if not values or any(v < 1 for v in values) or not increasing:
        raise ValueError(f"--milestones must be strictly increasing positive integers, got {values}")
    return tuple(values)


def _evaluation(args: argparse.Namespace) -> EvalSettings:
    """The chapters' :class:`EvalSettings` with the evaluation flags applied."""
    from moir_lib.experiments.specs import EvalSettings

    given = {"n_eval": args.n_eval, "fluency_prompts": args.fluency_prompts,
             "max_gen_tokens": args.max_gen_tokens, "batch_size": args.eval_batch_size,
             "pres_limit": args.pres_limit}
    chosen = {k: None if v == _ALL else v for k, v in given.items() if v is not None}
    if args.ns_neighbours is not None:
        chosen["neighbours"] = args.ns_neighbours
    return EvalSettings(fluency=not args.no_fluency, **chosen)


def _expected_key_dim(lab: Lab) -> int | None:
    """The key width from the config alone (no weights), or None when it cannot be read cheaply."""
    try:
        if lab.variant is not None:
            from moir_lib.pocket import get_variant

            return int(get_variant(lab.variant).model.intermediate_size)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(lab.profile.model, revision=lab.profile.revision)
        for name in ("intermediate_size", "n_inner", "ffn_dim"):
            value = getattr(config, name, None)
            if isinstance(value, int):
                return value
    except Exception as exc:  # noqa: BLE001 - only a pre-check; the editor checks again on the model
        log.debug("key width not available before loading: %s", exc)
    return None


def _check_records(lab: Lab, args: argparse.Namespace) -> None:
    pool = lab.edit_records.pool(args.seed)
    if args.n_edits > len(pool):
        source = args.records_path or "the pocket CounterFact"
        kept = (f" (its first {lab.evaluation.pres_limit} are the facts task's items: a smaller --pres-limit "
                f"frees more)" if args.records_path is None and lab.evaluation.pres_limit else "")
        if lab.edit_records.validation_count:
            kept += (f"; its last {lab.edit_records.validation_count} are the validation split "
                     f"(editing.validation_records)")
        raise ValueError(f"--n-edits {args.n_edits} but {source} holds {len(pool)} records to edit{kept}")
    check_distinct_facts(pool[: args.n_edits], args.records_path or "the pocket CounterFact")


def _check_cov_file(lab: Lab, spec: ExperimentSpec) -> None:
    """Read ``--cov PATH`` (the edit layers checked), its width, and build the editor (C symmetric PSD;
    AlphaEdit's projector): all before the model loads, kept by the Lab for the experiment."""
    path = Path(spec.cov)
    if not path.is_file():
        raise FileNotFoundError(f"--cov {path}: no such file, and not one of {', '.join(COV_NAMES)}")
    stats = lab.covariance(spec.cov)
    key_dim = _expected_key_dim(lab)
    if key_dim is not None and stats.dim != key_dim:
        raise ValueError(f"--cov {path} has width {stats.dim} but {lab.profile.model}'s key width "
                         f"(intermediate size) is {key_dim}: was it estimated on another model?")
    lab.editor(spec)


def _selection(lab: Lab, args: argparse.Namespace) -> Selection:
    """``--tau auto`` / ``--lambda auto``: the value selected on the profile's validation split."""
    from moir_lib.experiments.selection import select

    held = len(lab.edit_records.parts()["validation"])
    n = args.select_edits or min(args.n_edits, held) or args.n_edits
    selection = select(lab, args.editor, args.cov, n, edit_sample=args.seed)
    table = selection.table[["value", "ES", "S_e", "S_p", "Total", "chosen"]].to_string(index=False)
    print(f"{selection.param} selected on the validation split ({n} edits):\n{table}", file=sys.stderr)
    if not selection.gated:
        print(f"no {selection.param} of the grid reaches ES >= {ES_GATE}: the largest ES is used",
              file=sys.stderr)
    return selection


# ----------------------------------------------------------------------------- the command


def _cmd_edit(args: argparse.Namespace) -> int:
    from moir_lib.covariance.recipes import CovSettings
    from moir_lib.experiments import EditRecords, EditSettings, ExperimentSpec, Lab, PointStore
    from moir_lib.experiments.point import ScorePlan
    from moir_lib.models import POCKET_SPECS

    # ---- everything is checked before the model is loaded
    _check_flags(args)
    profile = _profile(args)
    milestones = _milestones(args, profile)
    if args.records_path is None and POCKET_SPECS.get(profile.model) is None:
        raise ValueError(f"--records is required for profile {profile.name!r} (model {profile.model}): pass "
                         f"a CounterFact file (ROME counterfact.json or EasyEdit counterfact-*.json)")
    out = writable_dir(args.out, "--out")
    spec = ExperimentSpec(args.editor, args.regime, args.cov, args.n_edits, milestones, edit_sample=args.seed,
                   lambda_=None if args.lambda_ == _AUTO else args.lambda_,
                   tau=None if args.tau == _AUTO else args.tau)
    cov_file = args.cov not in COV_NAMES
    cov_settings = CovSettings(seed=args.seed, files={args.cov: args.cov} if cov_file else {})
    evaluation = _evaluation(args)
    lab = Lab(profile, PointStore(out, shared=False), evaluation=evaluation, cov_settings=cov_settings,
              editing=EditSettings(args.context_templates, args.batch_size),
              edit_records=EditRecords.of(profile, evaluation, args.records_path, args.portability),
              device=args.device, progress=True)
    if args.records_path is not None:  # a user file is read now; the pocket's after the C checks
        _check_records(lab, args)
    if cov_file:
        _check_cov_file(lab, spec)
    if args.records_path is None:
        _check_records(lab, args)

    # ---- the experiment
    selection = _selection(lab, args) if _AUTO in (args.tau, args.lambda_) else None
    if selection is not None:
        spec = selection.spec(args.regime, args.n_edits, milestones=milestones, edit_sample=args.seed)
    checkpoints = (args.checkpoint_dir or out / "checkpoints") if args.regime == "sequential" else None
    # every point scored (CounterFact) and its tables written as it comes
    plan = ScorePlan(score_unedited=True, checkpoint_dir=Path(checkpoints) if checkpoints else None,
                     out_dir=Path(out))
    experiment = lab.edit(spec, plan)
    if selection is not None:
        experiment.parameters["selection"] = selection.describe()
    path = experiment.save()
    head = experiment.headline()
    shown = ("ES", "PS", "NS", "NS_all", "Efficacy", "Generalization", "Specificity", "Fluency*",
             "Portability", "S_e")
    line = "  ".join(f"{k}={head[k]:.3f}" for k in shown if isinstance(head.get(k), (int, float)))
    print(f"{args.editor} / C={args.cov} / {args.regime} / N={args.n_edits}: {line}")
    print(f"wrote {path}", file=sys.stderr)
    return 0
