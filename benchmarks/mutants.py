"""Mutants of the claims engine, and which tests catch them.

Each mutant is a deliberate defect of :mod:`moir_lib.evaluation.inference` that a sound test suite must
reject:

* ``narrow``: every interval half as wide (and its p-value to match: the standard errors halved);
* ``no-floor``: the t floor on the organism means removed (the studentized interval alone);
* ``normal``: a normal quantile in place of the Student t (intervals, p-values).

``python benchmarks/mutants.py [TESTS ...]`` runs the tests once per mutant, in a subprocess with the mutant
applied at start-up (``MOIR_MUTANT``, read by this file's pytest plugin), and prints which tests fail; the
suite must fail under every mutant and pass without one. ``--coverage`` measures instead the coverage of
each mutant's 95 % intervals at the book's noise (:func:`moir_lib.evaluation.calibration.world`) on the
slow tier's seeded datasets.
Default tests: the calibration and inference tests of the default tier.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ("narrow", "no-floor", "normal")
ENV = "MOIR_MUTANT"
DEFAULT_TESTS = ("tests/test_calibration.py", "tests/test_inference.py")


@contextlib.contextmanager
def mutant(name: str | None) -> Iterator[None]:
    """Apply the mutant ``name`` to :mod:`moir_lib.evaluation.inference` for the duration (None: none)."""
    from moir_lib.evaluation import inference

    saved = {k: getattr(inference, k) for k in ("t_quantile", "t_interval", "t_p_value", "floors")}
    try:
        if name == "narrow":
            q, iv, pv = saved["t_quantile"], saved["t_interval"], saved["t_p_value"]
            inference.t_quantile = lambda df, level=0.95: 0.5 * q(df, level)
            inference.t_interval = lambda m, se, df, level=0.95: iv(m, 0.5 * se, df, level)
            inference.t_p_value = lambda m, se, df, null=0.0: pv(m, 0.5 * se, df, null)
        elif name == "no-floor":
            floors = saved["floors"]
            inference.floors = lambda res: {} if res.n_organisms >= 2 else floors(res)
        elif name == "normal":
            def quantile(df: float, level: float = 0.95) -> float:
                return float(stats.norm.ppf((1 + level) / 2))

            def interval(m: float, se: float, df: float, level: float = 0.95) -> tuple[float, float]:
                if not (df >= 1 and math.isfinite(se) and math.isfinite(m)):
                    return math.nan, math.nan
                return m - quantile(df, level) * se, m + quantile(df, level) * se

            def p_value(m: float, se: float, df: float, null: float = 0.0) -> float:
                if not (df >= 1 and math.isfinite(se) and se > 0 and math.isfinite(m)):
                    return math.nan
                return float(2 * stats.norm.sf(abs(m - null) / se))

            inference.t_quantile, inference.t_interval, inference.t_p_value = quantile, interval, p_value
        elif name is not None:
            raise ValueError(f"unknown mutant {name!r}: choose one of {MUTANTS}")
        yield
    finally:
        for k, v in saved.items():
            setattr(inference, k, v)


def pytest_configure(config: object) -> None:
    """The plugin: apply ``$MOIR_MUTANT`` for the whole pytest session."""
    name = os.environ.get(ENV)
    if name:
        stack = contextlib.ExitStack()
        stack.enter_context(mutant(name))
        config.add_cleanup(stack.close)  # type: ignore[attr-defined]


def run_tests(tests: list[str], extra: list[str]) -> dict[str, list[str]]:
    """``mutant -> failed test ids`` (``""``: no mutant) of a pytest run of ``tests`` per mutant."""
    out = {}
    for name in ("", *MUTANTS):
        env = {**os.environ, ENV: name, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "mutants", "-m", "not slow", "--no-header",
               "-rf", *extra, *tests]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        failed = [line.split(" ", 1)[1].split(" - ")[0] for line in done.stdout.splitlines()
                  if line.startswith("FAILED ")]
        out[name] = failed
        print(f"{name or 'no mutant'}: {len(failed)} failed")
        for f in failed:
            print(f"    {f}")
        tail = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line]
        print(f"    ({tail[-1] if tail else done.stdout[-300:]})")
    return out


def coverage(reps: int, factors: tuple[float, ...], seed: int = 0, n_resamples: int = 500) -> None:
    """Print the coverage of the true ΔS_p by each mutant's interval at the book's noise × ``factors``."""
    import numpy as np

    from moir_lib.evaluation import calibration as cal
    from moir_lib.evaluation.bootstrap import Term, resample
    from moir_lib.evaluation.inference import assess

    c = cal.book_components()
    for f in factors:
        try:
            sc = cal.world(c, factor=f)
        except cal.BeyondReach as exc:
            print(f"book noise × {f:g}: not simulated ({exc})", flush=True)
            continue
        rng = np.random.default_rng(seed)
        hits: dict[str, int] = {name: 0 for name in ("none", *MUTANTS)}
        for r in range(reps):
            res = resample(Term(*cal.simulate(sc, rng), "S_p"), seed=seed + r, n_resamples=n_resamples)
            for name in hits:
                with mutant(None if name == "none" else name):
                    e = assess(res).estimate
                hits[name] += e.lo <= sc.effect <= e.hi
        se = math.sqrt(0.95 * 0.05 / reps)
        print(f"book noise × {f:g} ({reps} repetitions, Monte-Carlo SE at 0.95: {se:.3f}): "
              + ", ".join(f"{k} {v / reps:.3f}" for k, v in hits.items()), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tests", nargs="*", default=list(DEFAULT_TESTS))
    p.add_argument("--coverage", type=int, default=0, metavar="REPS",
                   help="measure each mutant's coverage over REPS repetitions instead of running tests")
    p.add_argument("--factors", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    p.add_argument("--seed", type=int, default=None,
                   help="the coverage's seed (default: 100 × the factor, as the slow tier's test)")
    p.add_argument("-k", default=None, help="pytest -k expression")
    args = p.parse_args()
    if args.coverage:
        for f in args.factors:
            coverage(args.coverage, (f,), int(100 * f) if args.seed is None else args.seed)
        return 0
    out = run_tests(args.tests, ["-k", args.k] if args.k else [])
    caught = all(out[m] for m in MUTANTS) and not out[""]
    print("every mutant fails a test, the engine none" if caught else "NOT every mutant is caught")
    return 0 if caught else 1


if __name__ == "__main__":
    sys.exit(main())
