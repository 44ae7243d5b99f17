"""``moir trace``: causal tracing of a profile's model, and optionally writing the window into it.

``moir trace --profile P [--n-prompts N] [--knowns PATH] [--write-profile] --out DIR`` runs
:func:`moir_lib.tracing.trace_profile` (appendix C.4) and writes what chapter 06 writes
(:func:`moir_lib.chapters.causal_tracing.write`): ``DIR/summary.json`` (the headline: the chosen
window, the peak, validity counts) and the tidy tables beside it. ``--write-profile`` then sets the
profile YAML's ``edit_layers`` to the traced window, keeping every other line, and says what changed.
Heavy imports stay inside the handler so ``moir --help`` answers instantly.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moir_lib.cli.args import add_model_arguments

__all__ = ["add_parser"]


def _cmd_trace(args: argparse.Namespace) -> int:
    from moir_lib import tracing
    from moir_lib.chapters import causal_tracing
    from moir_lib.profiles import load_profile

    if args.n_prompts < 1 or args.n_noise < 1:
        raise ValueError("--n-prompts and --n-noise must be >= 1")
    profile = load_profile(args.profile)
    if args.write_profile and profile.path is None:
        raise ValueError(f"profile {profile.name!r} has no file to write")
    settings = tracing.TraceSettings(n_noise=args.n_noise, noise_scale=args.noise_scale, seed=args.seed)
    result = tracing.trace_profile(profile, args.n_prompts, args.knowns, settings, device=args.device,
                                   progress=not args.quiet)
    headline = causal_tracing.headline(result, len(profile.edit_layers), profile.edit_layers)
    out = Path(args.out)
    params = {"profile": args.profile, "n_prompts": args.n_prompts, "knowns_path": args.knowns,
              "n_noise": args.n_noise, "noise_scale": args.noise_scale, "seed": args.seed,
              "command": "moir trace"}
    summary = causal_tracing.write(out, result, headline, params)
    peak = (f"peak IE {headline['peak_ie']:.3f} at layer {headline['peak_layer']}"
            if headline["peak_layer"] is not None else "no peak")
    print(f"moir trace: {headline['n_valid']}/{headline['n_prompts']} valid prompts, {peak}, window "
          f"{headline['window']} (profile: {headline['profile_layers']}); summary at {summary}")
    if args.write_profile and not headline["window"]:
        print(f"moir trace: no valid prompt, so no window; {profile.path} left unchanged", file=sys.stderr)
        return 1
    if args.write_profile:
        old, new = tracing.rewrite_edit_layers(profile.path, headline["window"])
        if old == new:
            print(f"moir trace: {profile.path}: edit_layers unchanged ({new})")
        else:
            print(f"moir trace: {profile.path}: edit_layers {old} -> {new}")
    elif not headline["agrees_with_profile"]:
        print("moir trace: the traced window differs from the profile's edit_layers; "
              "--write-profile would write it", file=sys.stderr)
    if args.json:
        print(json.dumps(headline, indent=2))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="causal tracing (appendix C.4): pick a profile's edit layers",
                       description="Causal tracing of a profile's model on the pocket world's facts "
                                   "(or ROME's knowns file): indirect effect per (layer, position), the "
                                   "contiguous window of len(edit_layers) layers with the largest summed IE "
                                   "at the last subject token, written to OUT/summary.json.")
    add_model_arguments(p)
    p.add_argument("--n-prompts", type=int, default=100, help="facts traced (default 100, as the paper)")
    p.add_argument("--knowns", default=None, metavar="PATH",
                   help="ROME's known_1000.json (real models); default: the pocket world's facts")
    p.add_argument("--n-noise", type=int, default=10, help="noise samples per prompt (default 10, as ROME)")
    p.add_argument("--noise-scale", type=float, default=3.0,
                   help="sigma as a multiple of the subject-embedding std (default 3, as the paper)")
    p.add_argument("--seed", type=int, default=0, help="seed of the noise and of the pocket fact sample")
    p.add_argument("--write-profile", action="store_true",
                   help="rewrite the profile's edit_layers with the traced window (other lines kept)")
    p.add_argument("--out", required=True, help="run directory for summary.json and the tables")
    p.add_argument("--json", action="store_true", help="also print the headline as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_trace)
