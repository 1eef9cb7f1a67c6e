"""vltool report: exact summaries of hand-made result files."""

import json
import math

import pytest
from typer.testing import CliRunner

from vltool.cli import app
from vltool.report import Metric, ReportConfig, build_report, parse_metric, render_markdown, write_report


def entry(v, lo, hi, chance=0.01):
    return {"value": v, "ci_low": lo, "ci_high": hi, "chance": chance}


@pytest.fixture()
def runs(tmp_path):
    top1 = {"base": [0.10, 0.12, 0.14], "bow": [0.13, 0.12, 0.18]}
    for variant, vals in top1.items():
        for seed, v in enumerate(vals):
            d = tmp_path / "runs" / variant / f"seed{seed}"
            (d / "data").mkdir(parents=True)
            (d / "zeroshot.json").write_text(json.dumps({
                "command_line": f"vltool zeroshot x --seed {seed}", "created": f"2026-01-0{seed + 1}T00:00:00", "wall_time_s": 10.0,
                "metrics": {"top1": entry(v, v - 0.02, v + 0.02), "image_to_text_median_rank": entry(5.0 + seed, 4.0, 6.0, 335.0)}}))
            (d / "data" / "vltool.json").write_text(json.dumps({"command_line": "vltool deform x", "wall_time_s": 2.0,
                                                                "stats": {"avg_caption_len_after": 3.0 + seed}}))
    return tmp_path / "runs"


def test_means_sds_and_paired_differences(runs):
    cfg = ReportConfig(metrics=[parse_metric("ZS=zeroshot:top1"), parse_metric("len=data/vltool.json:stats.avg_caption_len_after")],
                       variants=[("base", "Base"), ("bow", "BoW")], baseline="base")
    r = build_report(runs, cfg)
    base, bow = r["variants"]
    s = bow["summary"]["zeroshot:top1"]
    assert s["mean"] == pytest.approx(0.43 / 3)
    assert s["sd"] == pytest.approx(math.sqrt(((0.13 - 0.43 / 3) ** 2 + (0.12 - 0.43 / 3) ** 2 + (0.18 - 0.43 / 3) ** 2) / 2))
    assert s["ci_halfwidth_mean"] == pytest.approx(0.02) and s["chance"] == pytest.approx(0.01)
    d = s["delta_vs_baseline"]
    assert d["per_seed"] == pytest.approx([0.03, 0.0, 0.04]) and d["positive_seeds"] == 2 and d["mean"] == pytest.approx(0.07 / 3)
    assert base["summary"]["data/vltool.json:stats.avg_caption_len_after"]["mean"] == pytest.approx(4.0)
    assert r["wall_time_s"] == {"seed0": 24.0, "seed1": 24.0, "seed2": 24.0, "total": 72.0}
    assert len(r["commands"]) == 12
    md = render_markdown(r)
    assert "| BoW | 14.3 ± 3.2<br>±2.0 | 4 ± 1 |" in md  # percent for evaluation entries, raw for plain values
    assert "| BoW | +2.3 ± 2.1 (2/3) | +0 ± 0 (0/3) |" in md
    assert "| *chance* | 1.00 |" in md


def test_ranks_are_not_scaled_and_files_are_written(runs, tmp_path):
    cfg = ReportConfig(metrics=[parse_metric("rank=zeroshot:image_to_text_median_rank")])
    r = build_report(runs, cfg)
    assert [v["name"] for v in r["variants"]] == ["base", "bow"]  # every variant found, sorted
    assert "| base | 6.0 ± 1.0<br>±1.0 |" in render_markdown(r)
    files = write_report(r, tmp_path / "res" / "x")
    assert set(files) == {"markdown", "chart", "json"}
    assert json.loads((tmp_path / "res" / "x.json").read_text())["variants"][0]["summary"]
    assert (tmp_path / "res" / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors(runs, tmp_path):
    with pytest.raises(Exception, match="no runs of variant"):
        build_report(runs, ReportConfig(metrics=[Metric("a", "zeroshot", "top1")], variants=[("nope", "nope")]))
    r = CliRunner().invoke(app, ["report", str(runs), "--out", str(tmp_path / "o"), "--metric", "top1"])
    assert r.exit_code == 2 and "RELPATH:KEY" in r.output
    r = CliRunner().invoke(app, ["report", str(runs), "--out", str(tmp_path / "o"), "--metric", "zeroshot:top1", "--baseline", "x"])
    assert r.exit_code == 2 and "--baseline" in r.output


def test_seeds_missing_a_variant_are_left_out(runs):
    (runs / "bow" / "seed3").mkdir()  # a seed stopped part-way: one variant only, no numbers
    d = runs / "base" / "seed3"
    d.mkdir()
    (d / "zeroshot.json").write_text(json.dumps({"metrics": {"top1": entry(0.5, 0.4, 0.6)}}))
    r = build_report(runs, ReportConfig(metrics=[parse_metric("zeroshot:top1")], baseline="base"))
    assert r["seeds"] == [0, 1, 2] and r["incomplete_seeds"] == [3]
    assert r["variants"][0]["summary"]["zeroshot:top1"]["mean"] == pytest.approx(0.12)
    assert "Seed 3 left out" in render_markdown(r)
