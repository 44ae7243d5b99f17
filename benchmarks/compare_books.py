"""Two books' claims side by side: do their intervals about the recipe overlap?

``python benchmarks/compare_books.py RUN_A RUN_B`` reads every chapter's ``summary.json`` claims under the
two run directories (two books whose organisms differ: other seeds, or another CPU), pairs them by
chapter and measured label, and prints one Markdown row per claim: each book's value, marginal 95 %
interval, verdict about the recipe and about its organisms, each organism's own value and λ / τ, and whether
the two intervals overlap. Claims about one model's samples (chapters 02 and 03) are compared too, marked
as such: their intervals need not cover another model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def claims(run_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """``(chapter, measured) -> record`` of every claim under ``run_dir`` (the first of a repeated one)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(run_dir.rglob("summary.json")):
        data = json.loads(path.read_text())
        for c in (data.get("headline") or {}).get("claims") or []:
            out.setdefault((str(c.get("chapter") or data.get("chapter")), str(c["measured"])), c)
    if not out:
        raise SystemExit(f"{run_dir} holds no judged claims (no summary.json with headline claims)")
    return out


def _cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return "—"
    if c.get("value") is None:
        return "not measured"
    lo, hi = c.get("lo"), c.get("hi")
    text = f"{c['value']:+.3f}" + ("" if lo is None or hi is None else f" [{lo:+.3f}, {hi:+.3f}]")
    text += f", {c['verdict']}"
    if c.get("organisms", 0) and c["organisms"] > 1:
        text += f"; organisms: {c.get('verdict_organisms', '?')} ({c.get('agreeing', 0)}/{c['organisms']})"
        values = [v for v in c.get("organism_values") or [] if v is not None]
        if values:
            text += " · " + ", ".join(f"{v:+.2f}" for v in values)
    return text


def overlap(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if not a or not b or None in (a.get("lo"), a.get("hi"), b.get("lo"), b.get("hi")):
        return "—"
    return "yes" if a["lo"] <= b["hi"] and b["lo"] <= a["hi"] else "**no**"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    args = p.parse_args()
    a, b = claims(args.run_a), claims(args.run_b)
    print(f"| chapter | claim | {args.run_a.name} | {args.run_b.name} | intervals overlap | about |")
    print("|---|---|---|---|---|---|")
    disjoint = 0
    for key in sorted(set(a) | set(b)):
        ca, cb = a.get(key), b.get(key)
        scope = (ca or cb).get("scope", "")
        ok = overlap(ca, cb)
        disjoint += ok == "**no**" and scope == "recipe"
        print(f"| {key[0]} | {key[1]} | {_cell(ca)} | {_cell(cb)} | {ok} | {scope} |")
    print(f"\n{disjoint} claim(s) about the recipe with disjoint intervals.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
