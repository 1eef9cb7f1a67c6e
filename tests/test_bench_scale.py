"""bench/bench_scale.py: its results file keeps the latest measurement of each command and size."""

from __future__ import annotations

from pathlib import Path


def test_bench_scale_merge_keeps_the_latest_measurement_of_each_command_and_size():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_scale", Path(__file__).resolve().parents[1] / "bench" / "bench_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    old = [{"command": "mine-positives", "rows": 10_000, "seconds": 1.0}, {"command": "retrieve", "rows": 10_000, "seconds": 2.0},
           {"command": "pretrain", "rows": 1_000_000, "seconds": 3.0}]
    new = [{"command": "mine-positives", "rows": 10_000, "seconds": 9.0}, {"command": "mine-positives", "rows": 1_000_000, "seconds": 8.0}]
    got = [(r["command"], r["rows"], r["seconds"]) for r in bench.merged([old, new])]
    assert got == [("retrieve", 10_000, 2.0), ("mine-positives", 10_000, 9.0), ("pretrain", 1_000_000, 3.0), ("mine-positives", 1_000_000, 8.0)]
