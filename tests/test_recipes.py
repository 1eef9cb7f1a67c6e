"""Every recipe runs end to end in smoke mode (SMOKE=1: 8% of the emoji data, a tiny model, a few steps),
so that none rots. The numbers are not checked here: they measure nothing at this size."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.recipes  # about 20 minutes on 2 cores: `python -m pytest -m recipes` (.ci/run runs it)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {
    # recipe: the results it writes, and variants each must contain
    "quickstart": {"quickstart": ["lit-bow"]},
    "fistful-of-words": {"fistful-of-words": ["intact", "only-bow", "mostly-bow", "mostly-bow-no-rmtopfreq"],
                         "fistful-of-words-semi-aligned": ["aligned-only", "aligned-only-2x", "pl-rmtop-rand", "pl-rmtop-maxcount",
                                                           "pl-maxcount", "pl-weighted-count"]},
    "caption-worth": {"caption-worth": ["simclr", "clip", "clips"],
                      "caption-worth-filter": ["clip-keywords-random", "clip-keywords-filtered"]},
    "unicl": {"unicl": ["clip", "unicl-label", "unicl-both"]},
    "clip-lite": {"clip-lite": ["clip-25pct", "jsd-25pct", "clip-100pct", "jsd-100pct"], "clip-lite-batch": ["jsd-batch4", "jsd-100pct"]},
    "fff": {"fff": ["clip", "sigmoid", "sigmoid-mined", "sigmoid-k", "sigmoid-mined-k"],
            "fff-terms": ["mined-it", "mined-ii", "mined-tt"]},
    "debias": {"debias": ["images", "images-and-queries"], "debias-alignment": ["images"]},
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_runs_in_smoke_mode(recipe, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "SMOKE": "1", "OUT": str(out), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(["bash", str(ROOT / "recipes" / f"{recipe}.sh")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "results").exists()  # smoke results stay under OUT
    for name, variants in RECIPES[recipe].items():
        report = json.loads((out / "results" / f"{name}.json").read_text())
        assert report["seeds"] == [0] and report["recipe"] == f"recipes/{recipe}.sh"
        by_name = {v["name"]: v for v in report["variants"]}
        for v in variants:
            assert by_name[v]["runs"]["0"], f"{name}: {v} has no numbers"
        assert report["commands"] and all(c["command_line"].startswith("vltool ") for c in report["commands"])
        assert (out / "results" / f"{name}.md").read_text().startswith("# ")
