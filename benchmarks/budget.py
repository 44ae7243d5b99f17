"""The sample budget of C on a real checkpoint, through the folder path: is the pocket curve an artifact?

Prints measured numbers (never pass/fail). For a profile's model (default ``stories260k``: the golden
case's llama2.c checkpoint in ``data/reference/model``, d = 172, loaded as any local folder), ``--draws``
independent C_Wiki's and C_Moir's, each with its prefixes ``--fractions`` taken in the pass that builds
it (:mod:`moir_lib.covariance.prefixes`):

* C_Wiki: the profile's ``wiki_corpus`` (stories260k: the WikiText-2 test slice of ``data/slices``),
  sampled once with seed 0 and cut into ``--draws`` disjoint shards, one C per shard (draws of a small
  corpus that share no document);
* C_Moir: ``--samples`` self-generated sequences per draw (the profile's seed strategy and length, keys
  collected while generating), generation seed ``1000 · k`` for draw ``k``.

Each prefix is compared with its whole C (:func:`moir_lib.covariance.budget.compare`): the relative change
of MEMIT's and AlphaEdit's update for the same requests (``--requests``; default the golden case's ten)
and the same z (fitted once), the principal angles of the subspace AlphaEdit protects at the profile's τ,
the null-space dimension; each point with the interval over the draws
(:func:`moir_lib.experiments.budget_curve.intervals`), the size each editor needs
(:func:`moir_lib.chapters.diagnosis.budget_needs`), and every whole C's split-half agreement
(:mod:`moir_lib.covariance.convergence`). ``--out`` writes it all as JSON.

    python benchmarks/budget.py                                    # stories260K on the CPU, a few minutes
    python benchmarks/budget.py --profile llama3.1-8b-instruct --device cuda --requests cf.json \
        --samples 20000                                            # a GPU node
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference"
FRACTIONS = ["1/64", "1/32", "1/16", "1/8", "1/4", "1/2"]


def _covs(loaded, profile, args, work: Path):
    """``{("wiki" | "moir", draw): (whole C, documents)}``, every C with its prefixes."""
    from moir_lib.covariance import EstimationSettings, estimate
    from moir_lib.covariance.prefixes import prefix_counts
    from moir_lib.documents import load_corpus
    from moir_lib.generation import GenerationSettings, load_key_stats, self_generate

    layers, gen = list(profile.edit_layers), profile.generation
    out = {}
    for k in range(args.draws):
        corpus = load_corpus(profile.covariance.wiki_corpus, n=args.wiki_docs, seed=0, shard=(k, args.draws))
        n = corpus.count()
        t0 = time.perf_counter()
        settings = EstimationSettings(tokens_per_batch=profile.covariance.tokens_per_batch, count_bos=False)
        stats = estimate(loaded, corpus, layers, settings, progress=False,
                         prefixes=list(prefix_counts(n, args.fractions).values()))
        print(f"C_Wiki draw {k}: {n} documents, {stats.n_tokens:,} keys ({stats.n_tokens / stats.dim:,.0f} "
              f"per dimension) in {time.perf_counter() - t0:.1f} s")
        out["wiki", k] = (stats, n)
        gen_dir = work / f"moir-{k}"
        t0 = time.perf_counter()
        settings = GenerationSettings(gen.seed_strategy, args.samples,
                                      args.max_new_tokens or gen.max_new_tokens, gen.batch_size,
                                      seed=1000 * k, collect_layers=layers,
                                      prefixes=list(prefix_counts(args.samples, args.fractions).values()))
        self_generate(loaded.model, loaded.tokenizer, settings, gen_dir, progress=False)
        stats = load_key_stats(gen_dir)
        print(f"C_Moir draw {k}: {args.samples} samples, {stats.n_tokens:,} keys "
              f"({stats.n_tokens / stats.dim:,.0f} per dimension) in {time.perf_counter() - t0:.1f} s")
        out["moir", k] = (stats, args.samples)
    return out


def _editing(loaded, profile, args):
    """``deltas(editor, C) -> {layer: ΔW}`` for the requests, every C sharing one fit of z."""
    from moir_lib.editing.editors import make_editor
    from moir_lib.editing.regimes import EditSetup, batch
    from moir_lib.editing.target_store import TargetStore
    from moir_lib.editing.templates import as_template_groups, sample_templates
    from moir_lib.models import model_fingerprint

    requests = json.loads(Path(args.requests).read_text())
    reference = Path(args.requests).resolve() == (REFERENCE / "inputs" / "requests.json").resolve()
    templates = (as_template_groups(json.loads((REFERENCE / "inputs" / "templates.json").read_text()))
                 if reference else sample_templates(loaded.adapter, profile.memit.context_templates, 0))
    store = TargetStore(model_fingerprint(loaded.model), disk=False)

    def deltas(editor: str, C) -> dict:
        ed = make_editor(editor, profile, C, **({"allow_empty": True} if editor == "alphaedit" else {}))
        result = batch(loaded, ed, requests, EditSetup(templates=templates, targets=store), keep_deltas=True)
        result.snapshot.restore()
        return dict(result.outcome.deltas)

    return deltas, len(requests)


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    from moir_lib import models
    from moir_lib.chapters.diagnosis import budget_needs, budget_table
    from moir_lib.covariance.budget import compare
    from moir_lib.covariance.convergence import split_half
    from moir_lib.covariance.prefixes import format_fraction, prefix_counts
    from moir_lib.experiments.budget_curve import intervals
    from moir_lib.profiles import load_profile

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="stories260k")
    p.add_argument("--device", default=None)
    p.add_argument("--draws", type=int, default=4, help="independent C's of each kind (default 4)")
    p.add_argument("--samples", type=int, default=4096, help="self-generated sequences per C_Moir draw")
    p.add_argument("--max-new-tokens", type=int, help="default: the profile's")
    p.add_argument("--wiki-docs", type=int,
                   help="documents of the wiki corpus, all draws together (default all)")
    p.add_argument("--fractions", nargs="+", default=FRACTIONS)
    p.add_argument("--requests", default=str(REFERENCE / "inputs" / "requests.json"),
                   help="ROME-style requests (default: the golden case's ten)")
    p.add_argument("--tolerance", type=float, default=0.1)
    p.add_argument("--work", help="where the generation directories go (default a temporary folder)")
    p.add_argument("--out", help="write the curve and the needs as JSON here")
    args = p.parse_args(argv)
    logging.getLogger("moir_lib.editing").setLevel(logging.ERROR)  # an empty null space is in the table
    args.fractions = [format_fraction(f) for f in args.fractions]
    if "1/2" not in args.fractions:
        p.error("--fractions must include 1/2 (the split halves read it)")

    profile = load_profile(args.profile)
    loaded = models.load(profile, device=args.device)
    a = profile.alphaedit
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        covs = _covs(loaded, profile, args, work)
        deltas, n_requests = _editing(loaded, profile, args)
        parts, halves = [], {}
        t0 = time.perf_counter()
        for (cov, k), (whole, n) in covs.items():
            ref = {e: deltas(e, whole) for e in ("memit", "alphaedit")}
            for fraction, m in prefix_counts(n, args.fractions).items():
                pre = whole.prefixes[m]
                updates = {e: (deltas(e, pre), ref[e]) for e in ref}
                rows = compare(pre, whole, documents=m, tau=a.tau, tau_mode=a.tau_mode, updates=updates)
                parts.append(rows.assign(organism=0, cov=cov, draw=k, fraction=fraction))
            half = prefix_counts(n, ["1/2"])["1/2"]
            halves[cov, k] = split_half(whole, whole.prefixes[half], (half, n), tau=a.tau,
                                        tau_mode=a.tau_mode)
        print(f"updates and angles: {time.perf_counter() - t0:.1f} s ({n_requests} requests)")
    rows = pd.concat(parts, ignore_index=True)
    curve = intervals(rows)
    d = loaded.adapter.key_dim
    print(f"\n{profile.name} (d = {d}), τ = {a.tau:g} ({a.tau_mode}), {args.draws} draws per C; each prefix "
          f"against its whole C (value [95 % interval over the draws]):\n")
    print(budget_table(curve).to_markdown(index=False, floatfmt=".1f"))
    needs = budget_needs(curve, args.tolerance)
    print(f"\nkey vectors per key dimension from which the ΔW change's upper bound stays within "
          f"{args.tolerance:g}: " + json.dumps(needs))
    for (cov, k), h in halves.items():
        print(f"split halves of the whole {cov} draw {k}: gap {h.gap:.4f}, largest angle "
              f"{h.worst.max_angle_deg:.1f}° at layer {h.worst.layer} ({h.worst.keys_per_dim:,.0f} keys per "
              f"dimension)")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "profile": profile.name, "d": d, "tau": a.tau, "draws": args.draws, "samples": args.samples,
            "fractions": args.fractions, "tolerance": args.tolerance, "needs": needs,
            "curve": json.loads(curve.to_json(orient="records")),
            "split_halves": [{"cov": c, "draw": k, **h.to_dict()} for (c, k), h in halves.items()]},
            indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
