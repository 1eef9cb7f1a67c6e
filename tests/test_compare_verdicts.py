"""scripts/compare_verdicts.py: which cells of two reports of the same runs have different verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_verdicts.py"


def report(verdicts: dict[str, str], contrast: str = "within noise") -> dict:
    def cell(v):
        return {"paired": {"verdict": v, "ci_low": -0.01, "ci_high": 0.02, "p_value": 0.2, "resamples": 1000}}
    return {"variants": [{"name": "base", "summary": {"zs:top1": {"mean": 0.5}}},
                         {"name": "v", "summary": {m: cell(v) for m, v in verdicts.items()}}],
            "contrasts": [{"name": "v-vs-w", "summary": {"zs:top1": cell(contrast)}}]}


def run(tmp_path, a: dict, b: dict) -> subprocess.CompletedProcess:
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                          capture_output=True, text=True)


def test_same_verdicts_pass(tmp_path):
    r = report({"zs:top1": "differs", "probe:top1": "within noise"})
    proc = run(tmp_path, r, r)
    assert proc.returncode == 0
    assert proc.stdout == "3 paired cells: 3 the same verdict, 0 contradict, 0 borderline in one only\n"


def test_a_contradiction_fails_and_a_borderline_edge_is_listed(tmp_path):
    a = report({"zs:top1": "differs", "probe:top1": "borderline"})
    b = report({"zs:top1": "within noise", "probe:top1": "within noise"})
    proc = run(tmp_path, a, b)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("CONTRADICTS: variant v, zs:top1: differs [-1.0, +2.0]")
    assert lines[1].startswith("edge: variant v, probe:top1: borderline")
    assert lines[-1] == "3 paired cells: 1 the same verdict, 1 contradict, 1 borderline in one only"
    proc = run(tmp_path, report({"zs:top1": "differs"}), report({"zs:top1": "differs"}, contrast="differs"))
    assert proc.returncode == 1 and proc.stdout.startswith("CONTRADICTS: contrast v-vs-w, zs:top1")


def test_reports_of_different_cells_are_refused_in_one_line(tmp_path):
    proc = run(tmp_path, report({"zs:top1": "differs"}), report({"probe:top1": "differs"}))
    assert proc.returncode == 2 and proc.stderr.startswith("error: the two reports hold different cells") and proc.stderr.count("\n") == 1


def test_reports_with_no_paired_verdict_are_refused_not_passed(tmp_path):
    """Nothing to compare is an error (exit 2), not "0 cells, 0 contradict" with exit 0."""
    empty = {"variants": [{"name": "base", "summary": {"zs:top1": {"mean": 0.5}}}], "contrasts": []}
    proc = run(tmp_path, empty, empty)
    assert proc.returncode == 2 and proc.stderr.startswith("error: no paired verdicts to compare") and not proc.stdout
