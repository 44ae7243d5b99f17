"""``moir components``: the variance components of a book's claims, written to the repository's file."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser"]


def _components(args: argparse.Namespace) -> int:
    from moir_lib.chapters.methods import measured_components
    from moir_lib.evaluation import components

    out = Path(args.out) if args.out else components.COMPONENTS_FILE
    if args.provisional:
        from moir_lib.evaluation.calibration import provisional_components

        c = provisional_components(args.null_sd, args.organism_mean_sd)
        command = (f"moir components --provisional --null-sd {args.null_sd:g} "
                   f"--organism-mean-sd {args.organism_mean_sd:g}")
        how = {"provisional": True, "produced_by": command,
               "derivation": (f"from two figures of a book whose items were not kept: the null control's "
                              f"organism means spread by {args.null_sd:g} (two sets of 2 C draws, paired), "
                              f"the claims' organism means by {args.organism_mean_sd:g} (their root mean "
                              "square); "
                              "the items' parts from the simulated item model at the book's sizes "
                              "(moir_lib.evaluation.calibration.provisional_components); the edit samples' "
                              "part not told apart (one edit sample per organism). Replace it with a book's "
                              "own: moir components RUN_DIR")}
        path = components.write({"S_p": c}, how, out)
    else:
        pooled, how = measured_components(args.run_dir)
        path = components.write(pooled, how, out)
    types, _ = components.load(path)
    for kind, c in types.items():
        sd = {k: "—" if v is None else f"{v:.3f}" for k, v in c.sd().items()}
        print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in sd.items()) + f" ({c.claims} claims)")
    print(f"written to {path}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("components", help="measure a book's variance components (between organisms, C draws, "
                                          "edit samples, items) into data/calibration/components.json")
    p.add_argument("run_dir", nargs="?", type=Path,
                   help="a book's run directory (its chapters' summary.json)")
    p.add_argument("--out", type=Path, default=None, help="where to write (default: the repository's file)")
    p.add_argument("--provisional", action="store_true",
                   help="derive S_p's components from two figures instead of a run directory")
    p.add_argument("--null-sd", type=float, default=0.095, help="the null control's organism-mean spread")
    p.add_argument("--organism-mean-sd", type=float, default=0.10, help="the claims' organism-mean spread")

    def run(args: argparse.Namespace) -> int:
        if args.provisional == (args.run_dir is not None):
            p.error("give a run directory, or --provisional (not both)")
        return _components(args)

    p.set_defaults(func=run)
