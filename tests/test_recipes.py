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
    "unicl": {"unicl": ["unicl-text", "clip", "unicl-label", "unicl-both"], "unicl-labels": ["unicl-label", "unicl-both"]},
    "clip-lite": {"clip-lite": ["clip-25pct", "jsd-25pct", "clip-100pct", "jsd-100pct"], "clip-lite-batch": ["jsd-batch4", "jsd-100pct"],
                  "clip-lite-negatives": ["jsd-all-100pct", "jsd-100pct", "clip-100pct"]},
    "fff": {"fff": ["clip", "sigmoid", "sigmoid-mined", "sigmoid-k", "sigmoid-1ofk", "sigmoid-mined-k", "sigmoid-mined-1ofk"],
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
        # recipes/common.sh pins one torch thread per command, and the report's machine block is the runs' (issue 42)
        assert report["machine"]["torch_threads"] == 1 and report["machine"]["source"].startswith("the runs' records")
        assert (out / "results" / f"{name}.md").read_text().startswith("# ")
        # every evaluation is also scored in the second art style (emoji-openmoji), its twin beside it
        evals = [m for m in report["metrics"] if m["file"].split("/")[-1].startswith(("zeroshot", "retrieve", "probe"))]
        if evals:
            assert [s["name"] for s in report["styles"]] == ["Noto", "OpenMoji"]
            twins = [m for m in evals if m.get("twin_of")]
            assert twins and {m["twin_of"] for m in twins} == {m["name"] for m in evals if not m.get("twin_of")}
            runs = [by_name[v]["runs"]["0"] for v in variants]
            assert all(m["name"] in r for m in twins for r in runs if m["twin_of"] in r)
    CHECKS.get(recipe, lambda out: None)(out)


def _commands(out: Path, name: str) -> list[str]:
    return [c["command_line"] for c in json.loads((out / "results" / f"{name}.json").read_text())["commands"]]


def _run_stats(run: Path) -> dict:
    return json.loads((run / "vltool.json").read_text())["stats"]


def _check_fistful(out: Path) -> None:
    # the memory bank's EMA momentum comes from each run's length (docs/objectives.md), logged in metrics.jsonl
    for run in (out / "intact/seed0/run", out / "aligned-only-2x/seed0/run"):
        (ema,) = [m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "ema"]
        steps = _run_stats(run)["steps"]
        assert ema["given"] is False and ema["ema_momentum"] == min(0.999, 0.5 ** (1 / (0.1 * steps)))
    # the pseudo-words are retrieved from the intact aligned half (all its rows), not the deformed one
    pl = [c for c in _commands(out, "fistful-of-words-semi-aligned") if c.startswith("vltool pseudolabel")]
    assert len(pl) == 4 and all("/shared/seed0/halves/aligned " in c for c in pl)
    halves = json.loads((out / "shared/seed0/halves/aligned/vltool.json").read_text())
    stats = json.loads((out / "pl-maxcount/seed0/data/vltool.json").read_text())["stats"]
    assert stats["aligned_rows"] == halves["rows_out"]


def _check_unicl(out: Path) -> None:
    # UniCL on the image-text rows alone is the baseline, and every variant trains as many steps as CLIP
    report = json.loads((out / "results" / "unicl.json").read_text())
    assert report["baseline"] == "unicl-text"
    steps = {v: _run_stats(out / v / "seed0" / "run")["steps"] for v in ("clip", "unicl-text", "unicl-label", "unicl-both")}
    assert len(set(steps.values())) == 1, steps


def _check_caption_worth(out: Path) -> None:
    # the Santurkar probe's metric is class-balanced accuracy (appendix A.3)
    report = json.loads((out / "results" / "caption-worth.json").read_text())
    assert any("probe:mean_per_class_recall" in json.dumps(m) for m in report["metrics"])


def _check_fff(out: Path) -> None:
    # "both" mines over every caption of a row; its control trains on the same positives, one caption per step
    mined = json.loads((out / "sigmoid-mined-k/seed0/data/vltool.json").read_text())
    assert mined["stats"]["text_column"] == "captions" and mined["stats"]["several_captions"] is True
    cmds = [c for c in _commands(out, "fff") if c.startswith("vltool pretrain")]
    (control,) = [c for c in cmds if "/sigmoid-mined-1ofk/" in c]
    assert "sigmoid-mined-k/seed0/data" in control and "--caption-sampling random" in control and "--captions-per-image" not in control


CHECKS = {"fistful-of-words": _check_fistful, "unicl": _check_unicl, "caption-worth": _check_caption_worth, "fff": _check_fff}
