"""bench/gpu_check.py, the prepared GPU check (issue 51), in its dry mode: every stage on tiny inputs with the
GPU side on the CPU, so the script a GPU session runs at once cannot rot between the sessions lent one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_every_stage_in_its_dry_mode(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path / "gc")],
                       capture_output=True, text=True, timeout=1200)
    record = json.loads((tmp_path / "gc" / "gpu-check.json").read_text())
    failed = {s["stage"]: s.get("error") or s.get("stderr") for s in record["stages"] if not s["ok"]}
    assert r.returncode == 0 and not failed, (failed, r.stdout[-2000:], r.stderr[-2000:])
    stages = {s["stage"]: s for s in record["stages"]}
    assert record["dry_run"] is True and len(stages) == 13
    assert stages["pinned, non-blocking shard batches"]["normalised_equal_cpu"] is True
    assert stages["pretrain --decode gpu against --decode cpu"]["refused_on_cpu"]
    assert set(stages["pretrain: every objective, GPU against CPU"]["objectives"]) == {"clip", "sigmoid", "jsd", "simclr", "memory-bank"}
    assert all(stages[k]["compared"] > 0 for k in ("zeroshot", "retrieve", "probe", "debias"))
    assert "ratio vltool / open_clip" in stages["bench_pretrain ViT-B-32 from JPEG shards against open_clip_train"]["printed"]
