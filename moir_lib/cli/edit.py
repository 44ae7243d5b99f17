"""``moir edit``: MEMIT or AlphaEdit on a profile's model, batch or sequential, scored on CounterFact.

``moir edit --profile P --editor memit|alphaedit --cov wiki|moir|moir-bos|oracle|PATH
--regime batch|sequential --n-edits N [--tau T] [--lambda L] [--records PATH] --out DIR``

Every argument is checked before the model is loaded: the profile, λ > 0 and τ ∈ (0, ∞), the
records file (and that it holds N records), a covariance file (readable, covering the edit
layers, of the model's key width where that can be read from the config, symmetric PSD, and
for AlphaEdit a τ that leaves a non-empty null space), the output directory.

**Covariances.** ``PATH``: a saved :class:`moir_lib.covariance.CovarianceStats`. The names are
estimated on the loaded model with the profile's settings (and cached by
:func:`moir_lib.covariance.estimate` / :func:`moir_lib.generation.self_generate`):

* ``wiki`` — ``profile.covariance.wiki_corpus`` (``wiki_samples`` documents): C_Wiki;
* ``moir`` — self-generation with ``profile.generation.seed_strategy`` (the paper: rand×1),
  keys collected during generation: C_Moir;
* ``moir-bos`` — the same seeded with BOS only;
* ``oracle`` — the pocket pretraining mixture ``Σ_d w_d C_d`` over the pocket domains
  (pocket profiles only; for a real model pass the mixture as a file).

**Records.** ``--records`` (ROME or EasyEdit CounterFact JSON/JSONL); pocket profiles default
to the pocket world's CounterFact (and its two-hop portability probes). The first N records
are edited.

**Context templates.** Keys are averaged over ROME's two template groups, the plain prompt and
K prefixes sampled from the model (``½·k(plain) + ½·mean(prefixed)``), and z's loss over all of
them (ROME/MEMIT: K = 5; the profile's ``editing.context_templates``). The
pocket profiles use K = 0: in a 6-layer model the sampled prefixes move the subject's key so far
that the averaged key misses the plain prompt's (post-edit gap to z ≈ 0.6 instead of ≈ 0.1,
ES ≈ 0.5 instead of ≈ 0.8 in the first measurement).

**Output.** ``summary.json`` (headline: the CounterFact metrics after editing and before,
per-milestone metrics for the sequential regime, the z-optimisation statistics, timings;
parameters: profile, editor configuration with λ_eff / null-space dimensions, the covariance
used, the context templates), ``requests.csv`` (per-request final z loss),
``milestones.csv`` (sequential), and the evaluation tables (``counterfact_*``).
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from moir_lib.cli.args import add_model_arguments, positive_int
from moir_lib.locks import writable_dir

__all__ = ["COV_NAMES", "add_parser", "resolve_covariance"]

log = logging.getLogger(__name__)

COV_NAMES = ("wiki", "moir", "moir-bos", "oracle")
_EDITORS = ("memit", "alphaedit")
_REGIMES = ("batch", "sequential")
_MODES = ("absolute", "relative")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "edit", help="MEMIT / AlphaEdit batch or sequential editing with a chosen C, scored on CounterFact",
        description="Edit a profile's model with MEMIT or AlphaEdit using a named or saved covariance C, "
                    "in the batch or the sequential regime, and write summary.json with ES/PS/NS, the "
                    "EasyEdit metrics and S_e. Arguments are checked before the model loads.")
    add_model_arguments(p)
    p.add_argument("--editor", required=True, choices=_EDITORS)
    p.add_argument("--cov", required=True, metavar="wiki|moir|moir-bos|oracle|PATH",
                   help="named covariance (estimated on the model, cached) or a saved CovarianceStats file")
    p.add_argument("--regime", required=True, choices=_REGIMES)
    p.add_argument("--n-edits", required=True, type=positive_int, help="number of records to edit")
    p.add_argument("--lambda", dest="lambda_", type=_number, help="MEMIT λ (default: the profile's)")
    p.add_argument("--lambda-mode", choices=_MODES, help="MEMIT λ convention (default: the profile's)")
    p.add_argument("--tau", type=_number, help="AlphaEdit null-space threshold τ (default: the profile's)")
    p.add_argument("--tau-mode", choices=_MODES, help="τ convention (default: the profile's)")
    p.add_argument("--records", help="CounterFact file (ROME or EasyEdit format); pocket profiles default to "
                                     "the pocket CounterFact")
    p.add_argument("--portability", help="two-hop probes (pocket portability.json format); pocket default")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="sequential regime: edits per batch (default 1, as the paper)")
    p.add_argument("--milestones", help="sequential regime: comma-separated cumulative edit counts "
                                        "(default: the profile's editing.sequential_milestones)")
    p.add_argument("--checkpoint-dir", help="sequential regime: checkpoints, resumed from when present "
                                            "(default <out>/checkpoints)")
    p.add_argument("--v-steps", type=positive_int, help="z optimisation steps (default: the profile's)")
    p.add_argument("--v-lr", type=_number, help="z optimisation learning rate (default: the profile's)")
    p.add_argument("--context-templates", type=int, default=None, metavar="K",
                   help="prefixes sampled from the model to average keys and targets over, besides the "
                        "plain prompt (ROME/MEMIT: 5; 0 = the plain prompt only; default: the profile's "
                        "editing.context_templates)")
    p.add_argument("--seed", type=int, default=0, help="context templates, corpus sampling, generation")
    p.add_argument("--no-fluency", action="store_true", help="skip Fluency* (no generation; S_e incomplete)")
    p.add_argument("--eval-batch-size", type=positive_int, default=16)
    p.add_argument("--max-gen-tokens", type=positive_int, default=32, help="Fluency* continuation length")
    p.add_argument("--out", required=True, help="run directory")
    p.set_defaults(func=_cmd_edit)


def add_check_reference_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-reference",
        help="compare our MEMIT/AlphaEdit with a golden case computed by the authors' code",
        description="Read a reference folder (model/, inputs/, expected/<name>.npz; see "
                    "../shared/reference/README.md), run the closed forms on its K, resid, C and P and our "
                    "keys -> z -> per-layer updates from its prompts, and print the relative Frobenius error "
                    "of every method x stage x layer against the README's tolerance. Exit 1 on any failure.")
    p.add_argument("folder", help="reference folder")
    p.add_argument("--json", dest="json_out", metavar="OUT",
                   help="also write the table as a JSON list of rows")
    p.add_argument("--device", default=None, help="e.g. cpu, cuda (default: cpu)")
    p.set_defaults(func=_cmd_check_reference)


def _cmd_check_reference(args: argparse.Namespace) -> int:
    import json

    from moir_lib.editing.reference import check_reference, format_table

    if args.json_out is not None:
        writable_dir(Path(args.json_out).expanduser().parent, "--json")
    rows = check_reference(args.folder, device=args.device)
    print(format_table(rows))
    if args.json_out is not None:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["passed"] for r in rows) else 1


# ----------------------------------------------------------------------------- checks


def _pocket_variant(profile: Any) -> str | None:
    from moir_lib.models import POCKET_SPECS

    return POCKET_SPECS.get(profile.model)


def _expected_key_dim(profile: Any) -> int | None:
    """The key width from the config alone (no weights), or None when it cannot be read cheaply."""
    variant = _pocket_variant(profile)
    try:
        if variant is not None:
            from moir_lib.pocket import get_variant

            return int(get_variant(variant).model.intermediate_size)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(profile.model, revision=profile.revision)
        for name in ("intermediate_size", "n_inner", "ffn_dim"):
            value = getattr(config, name, None)
            if isinstance(value, int):
                return value
    except Exception as exc:  # noqa: BLE001 - only a pre-check; the editor checks again on the model
        log.debug("key width not available before loading: %s", exc)
    return None


def _pocket_file(variant: str, name: str) -> Path:
    """A file of the pocket build (``counterfact.json``, ``portability.json``); builds on first use."""
    from moir_lib.pocket import build

    return build(variant) / name


def _load_records(args: argparse.Namespace, profile: Any) -> tuple[list[Any], str, Any]:
    from moir_lib.data import load_counterfact

    variant = _pocket_variant(profile)
    if args.records:
        source = args.records
    elif variant is not None:
        source = str(_pocket_file(variant, "counterfact.json"))
    else:
        raise ValueError(f"--records is required for profile {profile.name!r} (model {profile.model}): "
                         f"pass a CounterFact file (ROME counterfact.json or EasyEdit counterfact-*.json)")
    records = load_counterfact(source)
    if args.n_edits > len(records):
        raise ValueError(f"--n-edits {args.n_edits} but {source} holds {len(records)} records")
    portability: Any = None
    if args.portability:
        if not Path(args.portability).is_file():
            raise FileNotFoundError(f"--portability {args.portability} not found")
        portability = args.portability
    elif variant is not None and not args.records:
        path = _pocket_file(variant, "portability.json")
        portability = str(path) if path.is_file() else None
    return records[: args.n_edits], source, portability


def _check_cov_file(path: Path, profile: Any) -> Any:
    from moir_lib.covariance import CovarianceStats

    if not path.is_file():
        raise FileNotFoundError(f"--cov {path}: no such file, and not one of {', '.join(COV_NAMES)}")
    try:
        stats = CovarianceStats.load(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a user error here
        raise ValueError(f"--cov {path}: not a saved CovarianceStats ({exc})") from exc
    missing = [layer for layer in profile.edit_layers if layer not in stats.layers]
    if missing:
        raise ValueError(f"--cov {path} has layers {list(stats.layers)}, but profile {profile.name!r} edits "
                         f"{list(profile.edit_layers)} (missing {missing})")
    return stats


def _milestones(args: argparse.Namespace, profile: Any) -> list[int]:
    if not args.milestones:
        return list(profile.editing.sequential_milestones)
    try:
        values = [int(x) for x in args.milestones.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--milestones: expected comma-separated integers, got {args.milestones!r}"
                         ) from None
    increasing = all(b > a for a, b in zip(values, values[1:], strict=False))
    if not values or any(v < 1 for v in values) or not increasing:
        raise ValueError(f"--milestones must be strictly increasing positive integers, got {values}")
    return values


# ----------------------------------------------------------------------------- covariances


def resolve_covariance(spec: str, profile: Any, loaded: Any, *, seed: int = 0, progress: bool = True
                       ) -> tuple[Any, dict[str, Any]]:
    """``(CovarianceStats, provenance)`` for ``--cov``: a path or one of :data:`COV_NAMES`, built by
    :func:`moir_lib.covariance.recipes.build` (the recipe the Lab and chapter 03 use)."""
    from moir_lib.covariance import recipes

    if spec not in COV_NAMES:
        stats = _check_cov_file(Path(spec), profile)
        return stats, recipes.file_provenance(spec, stats)
    return recipes.build(spec, loaded, recipes.Settings.from_profile(profile, seed=seed, progress=progress))


# ----------------------------------------------------------------------------- the command


def _evaluator(args: argparse.Namespace, portability: Any):
    """``evaluate(model, tokenizer, records, baseline=None) -> CounterFactResult`` (imported lazily)."""
    from moir_lib.evaluation.counterfact import evaluate_counterfact

    def run(model: Any, tokenizer: Any, records: list[Any], baseline: Any = None) -> Any:
        return evaluate_counterfact(model, tokenizer, records, baseline_fluency=baseline,
                                    portability=portability, batch_size=args.eval_batch_size,
                                    max_gen_tokens=args.max_gen_tokens,
                                    seed=args.seed, compute_fluency=not args.no_fluency, progress=False)

    return run


def _baseline_fluency(pre: Any, records: list[Any]) -> float | None:
    """The unedited model's fluency over ``records`` (a prefix of the evaluated ones)."""
    if pre is None or "fluency" not in pre.records:
        return None
    ids = {r.case_id for r in records}
    values = [v for c, v in zip(pre.records["case_id"], pre.records["fluency"], strict=True)
              if c in ids and v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else None


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for row in rows for k in row if not isinstance(row[k], (dict, list))))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _check_arguments(args: argparse.Namespace, profile: Any) -> tuple[list[int], Path]:
    """``(milestones, out)`` once the flags are checked against each other and the profile.

    Fills ``args.context_templates`` from the profile when unset. Needs no model and no pocket build.
    """
    if args.lambda_ is not None and not args.lambda_ > 0:
        raise ValueError(f"--lambda must be > 0, got {args.lambda_}")
    if args.tau is not None and not (0 < args.tau < math.inf):
        raise ValueError(f"--tau must lie in (0, ∞), got {args.tau}")
    if args.context_templates is None:
        args.context_templates = profile.editing.context_templates
    if args.context_templates < 0:
        raise ValueError(f"--context-templates must be >= 0, got {args.context_templates}")
    if args.v_lr is not None and not args.v_lr > 0:
        raise ValueError(f"--v-lr must be > 0, got {args.v_lr}")
    if args.regime == "batch" and (args.milestones or args.batch_size != 1 or args.checkpoint_dir):
        raise ValueError("--milestones, --batch-size and --checkpoint-dir belong to --regime sequential")
    milestones = _milestones(args, profile) if args.regime == "sequential" else []
    if args.records is None and _pocket_variant(profile) is None:
        raise ValueError(f"--records is required for profile {profile.name!r} (model {profile.model}): pass "
                         f"a CounterFact file (ROME counterfact.json or EasyEdit counterfact-*.json)")
    return milestones, writable_dir(args.out, "--out")


def _value_config(args: argparse.Namespace, profile: Any) -> Any:
    """The profile's z-optimisation settings (a ``ValueConfig``) with ``--v-steps`` / ``--v-lr`` applied."""
    from moir_lib.editing.values import ValueConfig

    values = ValueConfig.from_memit(profile.memit)
    if args.v_steps is not None or args.v_lr is not None:
        import dataclasses

        changes = {"num_steps": args.v_steps, "lr": args.v_lr}
        values = dataclasses.replace(values, **{k: v for k, v in changes.items() if v is not None})
    return values


def _run_regime(args: argparse.Namespace, loaded: Any, editor: Any, records: list[Any], *, templates: Any,
                evaluate: Any, pre: Any, milestones: list[int], out: Path, headline: dict[str, Any],
                timings: dict[str, float]) -> tuple[list[dict[str, Any]], Any]:
    """Edit ``records`` in ``args.regime`` and score them: ``(per-request rows, weight snapshot)``.

    Adds the metrics to ``headline`` and the timings to ``timings``; writes the evaluation tables (and,
    sequentially, ``milestones.csv``) into ``out``.
    """
    from moir_lib.editing.regimes import batch, sequential

    if args.regime == "batch":
        result = batch(loaded, editor, records, templates=templates)
        timings.update({f"edit_{k}": v for k, v in result.outcome.timings.items()})
        t0 = time.perf_counter()
        post = evaluate(loaded.model, loaded.tokenizer, records, baseline=_baseline_fluency(pre, records))
        timings["evaluate_post_s"] = time.perf_counter() - t0
        post.save(out, prefix="counterfact")
        headline.update(post.metrics)
        headline["edit"] = result.outcome.summary()
        return result.outcome.per_request(), result.snapshot

    def at_milestone(model: Any, tokenizer: Any, done: list[Any]) -> dict[str, Any]:
        res = evaluate(model, tokenizer, done, baseline=_baseline_fluency(pre, done))
        res.save(out, prefix=f"counterfact_{len(done):06d}")
        return {k: v for k, v in res.metrics.items() if isinstance(v, (int, float, str, type(None)))}

    ckpt = Path(args.checkpoint_dir) if args.checkpoint_dir else out / "checkpoints"
    result = sequential(loaded, editor, records, batch_size=args.batch_size, milestones=milestones,
                        evaluate=at_milestone, checkpoint_dir=ckpt, templates=templates, seed=args.seed)
    final = result.milestones[-1]
    headline.update({k: v for k, v in final.items() if k not in ("timings", "n_edits")})
    headline["milestones"] = result.metrics()
    headline["resumed_from"] = result.resumed_from
    timings.update({f"sequential_{k}": v for k, v in result.timings.items()})
    _write_csv(out / "milestones.csv", result.metrics())
    return result.per_request, result.snapshot


def _cmd_edit(args: argparse.Namespace) -> int:
    from moir_lib.profiles import load_profile

    t_start = time.perf_counter()
    # ---- everything is checked before the model is loaded
    profile = load_profile(args.profile)
    milestones, out = _check_arguments(args, profile)
    if args.records is not None:  # a user file is read now; the pocket's after the C checks (it may build)
        records, records_source, portability = _load_records(args, profile)
    from moir_lib.editing.regimes import make_editor

    values = _value_config(args, profile)
    overrides = {"lambda_": args.lambda_, "lambda_mode": args.lambda_mode, "tau": args.tau,
                 "tau_mode": args.tau_mode}
    cov_description: dict[str, Any]
    editor = None
    if args.cov not in COV_NAMES:  # a file: C is checked (and the projector built) before loading
        stats = _check_cov_file(Path(args.cov), profile)
        key_dim = _expected_key_dim(profile)
        if key_dim is not None and stats.dim != key_dim:
            raise ValueError(f"--cov {args.cov} has width {stats.dim} but {profile.model}'s key width "
                             f"(intermediate size) is {key_dim}: was it estimated on another model?")
        editor = make_editor(args.editor, profile, stats, values=values, **overrides)
        cov_description = {"cov": "file", "path": args.cov, "n_tokens": stats.n_tokens}
    if args.records is None:
        records, records_source, portability = _load_records(args, profile)
    _evaluator(args, portability)  # the evaluation module must be importable before we start

    # ---- the model
    from moir_lib.editing.templates import sample_templates
    from moir_lib.models import load

    t0 = time.perf_counter()
    loaded = load(profile, device=args.device)
    timings: dict[str, float] = {"load_s": time.perf_counter() - t0}
    if editor is None:
        t0 = time.perf_counter()
        stats, cov_description = resolve_covariance(args.cov, profile, loaded, seed=args.seed)
        timings["covariance_s"] = time.perf_counter() - t0
        editor = make_editor(args.editor, profile, stats, values=values, **overrides)
    editor.check_model(loaded.adapter)
    evaluate = _evaluator(args, portability)
    t0 = time.perf_counter()
    templates = sample_templates(loaded.adapter, args.context_templates, args.seed)
    timings["templates_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pre = evaluate(loaded.model, loaded.tokenizer, records)
    timings["evaluate_pre_s"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    pre.save(out, prefix="counterfact_pre")

    headline: dict[str, Any] = {"editor": args.editor, "cov": args.cov, "regime": args.regime,
                                "n_edits": len(records)}
    per_request, snapshot = _run_regime(args, loaded, editor, records, templates=templates, evaluate=evaluate,
                                        pre=pre, milestones=milestones, out=out, headline=headline,
                                        timings=timings)
    headline["pre_edit"] = {k: v for k, v in pre.metrics.items()
                            if isinstance(v, (int, float, str, type(None)))}
    headline["weight_change"] = {str(k): v for k, v in snapshot.change_norms().items()}
    timings["total_s"] = time.perf_counter() - t_start
    headline["timings"] = timings
    _write_csv(out / "requests.csv", per_request)

    from moir_lib.results import undefined_as_none, write_summary

    parameters = {"profile": profile.to_dict(), "editor": editor.config(), "cov": cov_description,
                  "records": records_source, "portability": portability, "n_edits": len(records),
                  "regime": args.regime, "batch_size": args.batch_size, "milestones": milestones,
                  "seed": args.seed, "device": args.device, "context_templates": args.context_templates,
                  "templates": templates,
                  "spectrum": {str(k): v for k, v in editor.spectrum.items()},
                  "projector": {str(k): v for k, v in getattr(editor, "projector_info", {}).items()},
                  "fluency": not args.no_fluency, "max_gen_tokens": args.max_gen_tokens}
    path = write_summary(out, "edit", undefined_as_none(headline), undefined_as_none(parameters))
    shown = ("ES", "PS", "NS", "Efficacy", "Generalization", "Specificity", "Fluency*", "Portability", "S_e")
    line = "  ".join(f"{k}={headline[k]:.3f}" for k in shown if isinstance(headline.get(k), (int, float)))
    print(f"{args.editor} / C={args.cov} / {args.regime} / N={len(records)}: {line}")
    print(f"wrote {path}", file=sys.stderr)
    return 0
