"""Compare the paired verdicts of two reports of the same runs, e.g. drawn with two bootstrap seeds.

    REPORT_ONLY=1 REPORT_SEED=1 RESULTS=/tmp/seed1 bash recipes/unicl.sh     # the same runs, another draw
    python scripts/compare_verdicts.py results/unicl.json /tmp/seed1/unicl.json

Prints every cell (variant or contrast, metric) whose verdict differs between the two, then one summary line.
A *contradiction* is "differs" in one and "within noise" in the other: the conclusion depends on the draw.
A cell that is "borderline" in one and settled in the other is listed too (its bootstrap p-value lies at the
edge of the borderline band, docs/evaluation.md). Exit 1 when any verdict contradicts, else 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SETTLED = {"differs", "within noise"}


def verdict_cells(report: dict) -> dict[tuple[str, str], dict]:
    """{(row, metric): paired entry} of a `vltool report` JSON: each variant's paired difference from the
    baseline and each --pair contrast's."""
    cells = {}
    for group in ("variants", "contrasts"):
        for row in report.get(group) or []:
            for metric, s in (row.get("summary") or {}).items():
                p = (s or {}).get("paired")
                if p and p.get("verdict"):
                    cells[(f"{group[:-1]} {row.get('name')}", metric)] = p
    return cells


def show(p: dict) -> str:
    """One paired entry as "verdict [low, high], p P at B resamples" (points)."""
    lo, hi = p.get("ci_low"), p.get("ci_high")
    iv = f"[{100 * lo:+.1f}, {100 * hi:+.1f}]" if lo is not None and hi is not None else "[no interval]"
    return f"{p['verdict']} {iv}, p {p.get('p_value')} at {p.get('resamples')} resamples"


def compare(a: dict, b: dict) -> tuple[list[str], int, int]:
    """(lines naming each cell whose verdict differs, contradictions, cells compared)."""
    ca, cb = verdict_cells(a), verdict_cells(b)
    if not ca:
        raise ValueError("no paired verdicts to compare (a report without --baseline or --pair, or one made "
                         "before reports recorded verdicts)")
    if set(ca) != set(cb):
        raise ValueError(f"the two reports hold different cells: {sorted(set(ca) ^ set(cb))[:3]}")
    lines, contradictions = [], 0
    for key in ca:
        pa, pb = ca[key], cb[key]
        if pa["verdict"] == pb["verdict"]:
            continue
        contra = {pa["verdict"], pb["verdict"]} == SETTLED
        contradictions += contra
        lines.append(f"{'CONTRADICTS' if contra else 'edge'}: {key[0]}, {key[1]}: {show(pa)} | {show(pb)}")
    return lines, contradictions, len(ca)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python scripts/compare_verdicts.py A.json B.json", file=sys.stderr)
        return 2
    try:
        a, b = (json.loads(Path(p).read_text()) for p in argv)
        lines, contradictions, n = compare(a, b)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    print(f"{n} paired cells: {n - len(lines)} the same verdict, {contradictions} contradict, "
          f"{len(lines) - contradictions} borderline in one only")
    return 1 if contradictions else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
