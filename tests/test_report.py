"""vltool report: exact summaries of hand-made result files."""

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from vltool.cli import app
from vltool.errors import VltoolError
from vltool.report import Metric, ReportConfig, build_report, parse_metric, parse_styles, render_markdown, write_report


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
    # no per-example outcomes (hand-made JSONs, a plain number): the difference without a paired interval
    assert "| BoW | +2.3 [-]<br>sd 2.1 | +0 [-]<br>sd 0 |" in md
    assert s["paired"] is None and "no per-example outcomes" in s["paired_note"]
    assert "[-]: no paired interval. ZS: no paired interval, some runs have no per-example outcomes" in md
    assert "len: a plain number, not an outcome per test example." in md
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


# ----------------------------------------------------------------------------------------------------
# the paired bootstrap interval against the baseline (docs/evaluation.md, "Comparing variants")
# ----------------------------------------------------------------------------------------------------


def write_run(d, hits, *, ids=("a1", "a2", "b1", "b2"), groups=("A", "A", "B", "B"), group_column="base_id", classes=None,
              name="zeroshot"):
    """A zeroshot results JSON and its per-example outcomes: example i a hit (true class ranked first) or not."""
    import numpy as np

    from vltool.outcomes import Outcomes, base_arrays, write_examples

    d.mkdir(parents=True, exist_ok=True)
    hits = np.asarray(hits)
    arrays = base_arrays("zeroshot", "classification", np.asarray(ids), np.asarray(groups) if group_column else None, group_column)
    arrays.update({"class": np.asarray(classes if classes is not None else [0] * len(hits)), "greater": (1 - hits)[None].astype(np.int32),
                   "tied": np.zeros((1, len(hits)), np.int32), "num_classes": np.asarray(2)})
    write_examples(d / f"{name}.examples.npz", arrays)
    values = Outcomes(arrays).statistic()(None)
    d.joinpath(f"{name}.json").write_text(json.dumps({
        "metrics": {k: entry(v, None, None, 0.5) for k, v in values.items()},
        "examples": {"file": f"{name}.examples.npz", "format": "vltool-examples/1"}}))
    return values


def test_paired_interval_by_hand(tmp_path):
    """Two base_id groups A, B of two test images each, one seed. Top-1 hits per image:

        baseline  A: 1 0   B: 0 0        variant "up"    A: 1 1   B: 1 1   (differences A: 0 1, B: 1 1)
                                         variant "same"  A: 0 1   B: 1 0   (differences A: -1 1, B: 1 0)

    Δ(up) = 1 - 1/4 = 0.75. A resample draws 2 groups with replacement: AA, AB, BA, BB, each with
    probability 1/4; the difference of a resample is the mean of the drawn groups' mean differences
    (dA = 0.5, dB = 1): AA 0.5, AB and BA 0.75, BB 1. The 2.5th percentile is 0.5 (a quarter of the mass),
    the 97.5th 1: the interval [0.5, 1] excludes 0: "differs". For "same", dA = 0, dB = 0.5: [0, 0.5],
    which does not exclude 0: "within noise".

    Resampling images instead (the group column ignored), "up"'s differences 0, 1, 1, 1 give a resample
    mean of 0 with probability 1/256, at most 0.25 with 13/256 > 2.5%: the interval is [0.25, 1]."""
    runs = tmp_path / "runs"
    write_run(runs / "base" / "seed0", [1, 0, 0, 0])
    write_run(runs / "up" / "seed0", [1, 1, 1, 1])
    write_run(runs / "same" / "seed0", [0, 1, 1, 0])
    cfg = ReportConfig(metrics=[parse_metric("ZS top-1=zeroshot:top1")], baseline="base", bootstrap=2000, seed=0)
    r = build_report(runs, cfg)
    by = {v["name"]: v["summary"]["zeroshot:top1"] for v in r["variants"]}
    up, same = by["up"]["paired"], by["same"]["paired"]
    assert up["delta"] == pytest.approx(0.75) and (up["ci_low"], up["ci_high"]) == pytest.approx((0.5, 1.0)) and up["differs"]
    assert same["delta"] == pytest.approx(0.25) and (same["ci_low"], same["ci_high"]) == pytest.approx((0.0, 0.5)) and not same["differs"]
    assert up["unit"] == "base_id group (2 groups of 4 images), not stratified: 1 class holds fewer than 5 groups" and up["seeds"] == [0]
    assert by["base"].get("paired") is None
    md = render_markdown(r)
    # beside each interval its Monte Carlo error: the bounds sit on plateaus (MC ±0), p = P(AA) = 1/4 read from 2,000 resamples
    assert "| same | +25.0 [+0.0, +50.0] *within noise*<br>MC ±0.00, p 0.234 ± 0.009 |" in md
    assert "| up | +75.0 [+50.0, +100.0] **differs**<br>MC ±0.00, p 0.000 ± 0.000 |" in md
    assert same["resamples"] == 2000 and same["verdict"] == "within noise" and up["verdict"] == "differs"
    assert "Each interval is read from 2,000 resamples (a verdict near the edge draws more, up to 80,000)" in md
    assert "each resample draws whole base_id groups of test images, not stratified by class" in md

    # the same runs evaluated without --group-column: images are the unit, and the interval is [0.25, 1]
    for name, hits in (("base", [1, 0, 0, 0]), ("up", [1, 1, 1, 1]), ("same", [0, 1, 1, 0])):
        write_run(runs / name / "seed0", hits, group_column=None)
    up = next(v for v in build_report(runs, cfg)["variants"] if v["name"] == "up")["summary"]["zeroshot:top1"]["paired"]
    assert (up["ci_low"], up["ci_high"]) == pytest.approx((0.25, 1.0)) and up["unit"] == "image, not stratified: 1 class holds fewer than 5 images"


def test_paired_interval_pools_the_seeds_with_one_draw(tmp_path):
    """Δ is the mean over seeds of the per-seed differences; one resample of groups serves every seed. Seed 0
    as above (group differences 0.5, 1), seed 1 with group differences 0.5, 0: pooled per group 0.5, 0.5,
    so every resample gives 0.5 and the interval is [0.5, 0.5], whereas either seed alone varies."""
    runs = tmp_path / "runs"
    write_run(runs / "base" / "seed0", [1, 0, 0, 0])
    write_run(runs / "up" / "seed0", [1, 1, 1, 1])
    write_run(runs / "base" / "seed1", [0, 0, 1, 1])
    write_run(runs / "up" / "seed1", [1, 0, 1, 1])
    r = build_report(runs, ReportConfig(metrics=[parse_metric("zeroshot:top1"), parse_metric("zeroshot:mean_per_class_recall")],
                                        baseline="base", bootstrap=500))
    s = r["variants"][1]["summary"]
    for name in ("zeroshot:top1", "zeroshot:mean_per_class_recall"):
        p = s[name]["paired"]
        assert p["delta"] == pytest.approx(s[name]["delta_vs_baseline"]["mean"]) == pytest.approx(0.5)
        assert (p["ci_low"], p["ci_high"]) == pytest.approx((0.5, 0.5)) and p["differs"] and p["seeds"] == [0, 1]


def test_paired_interval_when_each_seed_tests_its_own_examples(tmp_path):
    """Seeds that hold out their own classes test different examples: seed 0 images a1, a2, b; seed 1 b, c1,
    c2 (each image its own base_id group). Top-1 hits, baseline none, variant: seed 0 a1 only, seed 1 c1, c2.
    Per seed, Δ0(w) = w_a1 / (w_a1 + w_a2 + w_b) and Δ1(w) = (w_c1 + w_c2) / (w_b + w_c1 + w_c2).

    One resample draws the union's groups within the set of seeds that test them: {a1, a2} (seed 0 only)
    twice, {b} (both) once, {c1, c2} (seed 1 only) twice. So each seed always has 3 images, Δ1 = 2/3
    always, and w_a1 is 0, 1 or 2 with probability 1/4, 1/2, 1/4: Δ = (w_a1/3 + 2/3) / 2 is 1/3, 1/2 or
    2/3. Point Δ = 1/2, interval [1/3, 2/3]: differs."""
    runs = tmp_path / "runs"
    s0 = {"ids": ("a1", "a2", "b"), "groups": ("a1", "a2", "b")}
    s1 = {"ids": ("b", "c1", "c2"), "groups": ("b", "c1", "c2")}
    write_run(runs / "base" / "seed0", [0, 0, 0], **s0)
    write_run(runs / "up" / "seed0", [1, 0, 0], **s0)
    write_run(runs / "base" / "seed1", [0, 0, 0], **s1)
    write_run(runs / "up" / "seed1", [0, 1, 1], **s1)
    cfg = ReportConfig(metrics=[parse_metric("zeroshot:top1")], baseline="base", bootstrap=2000)
    up = build_report(runs, cfg)["variants"][1]["summary"]["zeroshot:top1"]["paired"]
    assert (up["delta"], up["ci_low"], up["ci_high"]) == pytest.approx((0.5, 1 / 3, 2 / 3)) and up["differs"]
    assert up["unit"] == ("base_id group (5 groups of 5 images, the union of the seeds' test sets), "
                          "within the set of seeds that test it")  # (a class of 1-2 groups is no stratum)
    # the seeds give b different classes (each seed its own class list): classes are not strata, the same draw here
    write_run(runs / "base" / "seed1", [0, 0, 0], classes=[1, 0, 0], **s1)
    write_run(runs / "up" / "seed1", [0, 1, 1], classes=[1, 0, 0], **s1)
    up = build_report(runs, cfg)["variants"][1]["summary"]["zeroshot:top1"]["paired"]
    assert (up["ci_low"], up["ci_high"]) == pytest.approx((1 / 3, 2 / 3)) and up["unit"].endswith("within the set of seeds that test it")
    # within one seed the two models must still test the same examples
    write_run(runs / "up" / "seed1", [0, 1, 1], ids=("a1", "c1", "c2"), groups=("a1", "c1", "c2"))
    with pytest.raises(VltoolError, match="the test examples differ"):
        build_report(runs, cfg)
    # and an example keeps its group across seeds
    write_run(runs / "up" / "seed1", [0, 1, 1], classes=[1, 0, 0], **s1)
    write_run(runs / "base" / "seed1", [0, 0, 0], classes=[1, 0, 0], ids=s1["ids"], groups=("a1", "c1", "c2"))
    write_run(runs / "up" / "seed1", [0, 1, 1], classes=[1, 0, 0], ids=s1["ids"], groups=("a1", "c1", "c2"))
    with pytest.raises(VltoolError, match="in group"):
        build_report(runs, cfg)


def test_paired_examples_are_matched_by_id_and_must_be_the_same(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "base" / "seed0", [1, 0, 0, 0])
    # the variant's file lists the same examples in another order: paired by id, the same result
    write_run(runs / "up" / "seed0", [1, 1, 1, 1][::-1], ids=("b2", "b1", "a2", "a1"), groups=("B", "B", "A", "A"))
    cfg = ReportConfig(metrics=[parse_metric("zeroshot:top1")], baseline="base", bootstrap=2000)
    up = build_report(runs, cfg)["variants"][1]["summary"]["zeroshot:top1"]["paired"]
    assert (up["delta"], up["ci_low"], up["ci_high"]) == pytest.approx((0.75, 0.5, 1.0))
    write_run(runs / "up" / "seed0", [1, 1, 1, 1], ids=("a1", "a2", "b1", "c9"))
    with pytest.raises(VltoolError, match="the test examples differ"):
        build_report(runs, cfg)
    write_run(runs / "up" / "seed0", [1, 1, 1, 1], groups=("A", "B", "B", "B"))
    with pytest.raises(VltoolError, match="group the examples differently"):
        build_report(runs, cfg)
    # an outcomes file that does not give its JSON's numbers (from another run) is refused
    write_run(runs / "up" / "seed0", [1, 1, 1, 1])
    rec = json.loads((runs / "up" / "seed0" / "zeroshot.json").read_text())
    rec["metrics"]["top1"]["value"] = 0.5
    (runs / "up" / "seed0" / "zeroshot.json").write_text(json.dumps(rec))
    with pytest.raises(VltoolError, match="come from different runs"):
        build_report(runs, cfg)


# ----------------------------------------------------------------------------------------------------
# --style: the same test examples in a second art style, and where each difference holds
# ----------------------------------------------------------------------------------------------------


def test_styles_side_by_side_and_where_each_difference_holds(tmp_path):
    # base hits one example of each group in both styles; each variant's difference is the same in every group
    # and seed, so its paired interval is a point: +0.5 (all hits), -0.5 (no hit) or 0 (the base's hits)
    up, same, down = [1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]
    styles = {"base": (same, same), "both": (up, up), "noto-only": (up, same), "opposite": (up, down), "none": (same, same)}
    for variant, (noto, openmoji) in styles.items():
        for seed in range(3):
            d = tmp_path / "runs" / variant / f"seed{seed}"
            write_run(d, noto)
            write_run(d, openmoji, name="zeroshot-style2")
            (d / "data").mkdir()
            (d / "data" / "vltool.json").write_text(json.dumps({"stats": {"rows": 10}}))
    cfg = ReportConfig(metrics=[parse_metric("ZS=zeroshot:top1"), parse_metric("rows=data/vltool.json:stats.rows")],
                       variants=[(v, v) for v in styles], baseline="base", styles=parse_styles(["Noto=", "OpenMoji=-style2"]),
                       bootstrap=200)
    r = build_report(tmp_path / "runs", cfg)
    # the twin follows its metric; the plain number has no file in the second style, so no twin
    assert [(m["label"], m["file"], m.get("style"), m.get("twin_of")) for m in r["metrics"]] == [
        ("ZS", "zeroshot", "Noto", None), ("ZS, OpenMoji", "zeroshot-style2", "OpenMoji", "zeroshot:top1"),
        ("rows", "data/vltool.json", "Noto", None)]
    by = {v["name"]: v["summary"] for v in r["variants"]}
    assert by["noto-only"]["zeroshot-style2:top1"]["mean"] == pytest.approx(0.5)
    assert by["noto-only"]["zeroshot:top1"]["paired"]["delta"] == pytest.approx(0.5)
    assert by["opposite"]["zeroshot-style2:top1"]["paired"]["delta"] == pytest.approx(-0.5)
    verdicts = {n: s["zeroshot:top1"]["styles"] for n, s in by.items() if n != "base"}
    assert verdicts == {
        "both": {"verdict": "both styles", "by_style": {"Noto": "up", "OpenMoji": "up"}},
        "noto-only": {"verdict": "Noto only", "by_style": {"Noto": "up", "OpenMoji": "within noise"}},
        "opposite": {"verdict": "opposite signs", "by_style": {"Noto": "up", "OpenMoji": "down"}},
        "none": {"verdict": "neither style", "by_style": {"Noto": "within noise", "OpenMoji": "within noise"}}}
    assert "styles" not in by["both"]["data/vltool.json:stats.rows"]
    md = render_markdown(r)
    assert "| noto-only | Noto only (Noto ↑ OpenMoji –) |" in md
    assert "| opposite | opposite signs (Noto ↑ OpenMoji ↓) |" in md
    assert "Holds in one style only: noto-only, ZS (Noto only)." in md
    assert "| Variant | ZS | ZS, OpenMoji | rows |" in md
    # --pair: a contrast the baseline table does not hold, paired and judged across styles the same way
    r2 = build_report(tmp_path / "runs", replace(cfg, pairs=[("noto-only", "both"), ("both", "base")]))
    c1, c2 = r2["contrasts"]
    assert (c1["name"], c1["reference"]) == ("noto-only", "both")
    assert c1["summary"]["zeroshot:top1"]["paired"]["delta"] == pytest.approx(0.0)
    assert c1["summary"]["zeroshot-style2:top1"]["paired"]["delta"] == pytest.approx(-0.5)
    assert c1["summary"]["zeroshot:top1"]["styles"] == {"verdict": "OpenMoji only", "by_style": {"Noto": "within noise", "OpenMoji": "down"}}
    both = by["both"]["zeroshot-style2:top1"]["paired"]
    assert {k: c2["summary"]["zeroshot-style2:top1"]["paired"][k] for k in ("delta", "ci_low", "ci_high")} == {
        k: both[k] for k in ("delta", "ci_low", "ci_high")}
    md2 = render_markdown(r2)
    assert ("| noto-only − both | +0.0 [+0.0, +0.0] *within noise*<br>sd 0.0<br>MC ±0.00, p 1.000 ± 0.000 | "
            "−50.0 [−50.0, −50.0] **differs**<br>sd 0.0<br>MC ±0.00, p 0.000 ± 0.000 |") in md2
    assert "noto-only − both, ZS (OpenMoji only)" in md2
    with pytest.raises(Exception, match="--pair"):
        build_report(tmp_path / "runs", replace(cfg, pairs=[("nope", "base")]))
    # without --style: no twins, no verdicts
    plain = build_report(tmp_path / "runs", ReportConfig(metrics=cfg.metrics, variants=cfg.variants, baseline="base", bootstrap=200))
    assert len(plain["metrics"]) == 2 and "Across styles" not in render_markdown(plain)


@pytest.mark.parametrize("specs", [["Noto=-a", "OpenMoji=-b"], ["Noto="], ["Noto=", "Noto=-b"], ["Noto", "OpenMoji=-b"]])
def test_style_options_are_checked(specs, tmp_path):
    with pytest.raises(Exception, match="--style"):
        parse_styles(specs)
    args = ["report", str(tmp_path), "--out", str(tmp_path / "o"), "--metric", "zeroshot:top1"]
    r = CliRunner().invoke(app, args + [a for s in specs for a in ("--style", s)])
    assert r.exit_code == 2 and "--style" in r.output


@pytest.mark.parametrize("theirs", ["notes.md", "notes.png", "notes.json"])
def test_out_never_replaces_files_the_report_did_not_write(runs, tmp_path, theirs):
    """`report RUNS --out DIR/notes` wrote DIR/notes.md over the user's notes, exit 0, no --overwrite asked
    (issue 44). Now only a report's own files are replaced, and the refusal says so with or without --overwrite
    (it advised --overwrite, then refused it: issue 53)."""
    out = tmp_path / "dir"
    out.mkdir()
    (out / theirs).write_text("my own notes\n")
    args = ["report", str(runs), "--out", str(out / "notes"), "--metric", "zeroshot:top1", "--no-chart"]
    for extra in ([], ["--overwrite"]):
        r = CliRunner().invoke(app, [*args, *extra])
        assert r.exit_code == 2, r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert f"{out / theirs} was not written by vltool report" in line and "choose another --out" in line, line
        assert "pass --overwrite" not in r.stderr
    assert [p.name for p in out.iterdir()] == [theirs] and (out / theirs).read_text() == "my own notes\n"


def test_overwrite_replaces_an_earlier_report(runs, tmp_path):
    args = ["report", str(runs), "--out", str(tmp_path / "res" / "x"), "--metric", "zeroshot:top1"]
    assert CliRunner().invoke(app, args).exit_code == 0
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "pass --overwrite" in r.stderr
    r = CliRunner().invoke(app, [*args, "--overwrite", "--title", "again"])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "res" / "x.md").read_text().startswith("# again")
    assert sorted(p.name for p in (tmp_path / "res").iterdir()) == ["x.json", "x.md", "x.png"]


@pytest.mark.parametrize("damage", ["truncated", "garbled", "empty"])
def test_a_damaged_outcomes_file_names_the_file_and_the_run(tmp_path, damage):
    """`report` over a run whose X.examples.npz was truncated: "internal error (BadZipFile)" (issue 44)."""
    runs = tmp_path / "runs"
    write_run(runs / "base" / "seed0", [1, 0, 0, 0])
    write_run(runs / "up" / "seed0", [1, 1, 1, 1])
    npz = runs / "up" / "seed0" / "zeroshot.examples.npz"
    data = npz.read_bytes()
    npz.write_bytes({"truncated": data[: len(data) // 2], "garbled": data[:40] + bytes(len(data) - 80) + data[-40:],
                     "empty": b""}[damage])
    r = CliRunner().invoke(app, ["report", str(runs), "--out", str(tmp_path / "o"), "--metric", "zeroshot:top1",
                                 "--baseline", "base", "--no-chart"])
    assert r.exit_code == 1 and "internal error" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: run up/seed0: ") and str(npz) in line and "re-run" in line, line
    assert not list(tmp_path.glob("o.*"))


def _two_style_runs(root, *, skip=None):
    for variant in ("base", "up"):
        for seed in range(2):
            d = root / variant / f"seed{seed}"
            write_run(d, [1, 1, 1, 1] if variant == "up" else [1, 0, 1, 0])
            if (variant, seed) != skip:
                write_run(d, [1, 0, 1, 0], name="zeroshot-style2")
    return root


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "0.5"])
def test_a_non_finite_number_in_a_results_file_is_refused(runs, tmp_path, bad):
    """A NaN or inf in a results file was averaged into the table, exit 0 (issue 44)."""
    p = runs / "bow" / "seed1" / "zeroshot.json"
    record = json.loads(p.read_text())
    record["metrics"]["top1"]["value"] = bad
    p.write_text(json.dumps(record))  # (json writes NaN and Infinity, and reads them back)
    r = CliRunner().invoke(app, ["report", str(runs), "--out", str(tmp_path / "o"), "--metric", "zeroshot:top1", "--no-chart"])
    assert r.exit_code == 1, r.stdout
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {p}: top1 has value ") and "not a finite number (run bow/seed1)" in line, line
    assert not list(tmp_path.glob("o.*"))


def test_a_style_whose_files_are_missing_is_refused(tmp_path):
    """`--style OpenMoji=-stlye2` (a typo, or runs evaluated in one style only) printed the first style's table
    as if the second had been asked for nothing (issue 44)."""
    runs = _two_style_runs(tmp_path / "runs")
    args = ["report", str(runs), "--out", str(tmp_path / "o"), "--metric", "zeroshot:top1", "--baseline", "base", "--no-chart",
            "--style", "Noto=", "--style", "OpenMoji=-stlye2"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --style OpenMoji=-stlye2: no run has a file named with '-stlye2'") and "zeroshot-stlye2.json" in line, line
    assert CliRunner().invoke(app, [*args[:-1], "OpenMoji=-style2"]).exit_code == 0


def test_a_twin_missing_in_one_run_is_refused(tmp_path):
    """One run without its second-style file: its variant's twin was averaged over the other seeds (or shown
    as "-") without a word (issue 44)."""
    runs = _two_style_runs(tmp_path / "runs", skip=("up", 1))
    r = CliRunner().invoke(app, ["report", str(runs), "--out", str(tmp_path / "o"), "--metric", "zeroshot:top1", "--baseline", "base",
                                 "--no-chart", "--style", "Noto=", "--style", "OpenMoji=-style2"])
    assert r.exit_code == 1
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: run up/seed1 has zeroshot:top1 but not its OpenMoji twin ") and "zeroshot-style2" in line, line
    assert not list(tmp_path.glob("o.*"))


def test_a_borderline_style_is_named_in_where_a_difference_holds():
    """issue 42: a style whose verdict is borderline is neither "differs" nor "within noise" there."""
    from vltool.report import style_verdict

    up = {"ci_low": 0.1, "delta": 0.2, "differs": True, "verdict": "differs"}
    edge = {"ci_low": -0.001, "delta": 0.2, "differs": False, "verdict": "borderline"}
    flat = {"ci_low": -0.1, "delta": 0.0, "differs": False, "verdict": "within noise"}
    assert style_verdict({"Noto": up, "OpenMoji": edge}) == "Noto only; OpenMoji borderline"
    assert style_verdict({"Noto": flat, "OpenMoji": edge}) == "Noto within noise; OpenMoji borderline"
    assert style_verdict({"Noto": edge, "OpenMoji": edge}) == "Noto, OpenMoji borderline"


def _pretrain_record(d, threads):
    """A run's pretrain vltool.json with the runtime it recorded."""
    d.joinpath("vltool.json").write_text(json.dumps({
        "command": "pretrain", "command_line": "vltool pretrain emoji", "created": "2026-11-27T00:00:00", "wall_time_s": 60.0,
        "runtime": {"cpu_count": 2, "processor": "x86_64", "torch_threads": threads, "torch_interop_threads": 2, "device": "cpu",
                    "dtype": "float32", "deterministic_algorithms": False, "libraries": {"torch": "2.9.0", "numpy": "2.3.0"}}}))


def test_runs_on_different_thread_counts_are_not_paired_unless_allowed_and_the_machine_is_the_runs(tmp_path):
    """issue 42: the report pairs runs only when their records name the same torch thread count (a JSD run's
    bits depend on it), unless --allow-mixed-threads; the machine block is what the runs recorded, not the
    report process's."""
    runs = tmp_path / "runs"
    write_run(runs / "base" / "seed0", [1, 0, 0, 0])
    write_run(runs / "up" / "seed0", [1, 1, 1, 1])
    _pretrain_record(runs / "base" / "seed0", 1)
    _pretrain_record(runs / "up" / "seed0", 1)
    cfg = ReportConfig(metrics=[parse_metric("ZS top-1=zeroshot:top1")], baseline="base", bootstrap=200)
    r = build_report(runs, cfg)
    m = r["machine"]
    assert m["torch_threads"] == 1 and m["device"] == "cpu" and m["torch"] == "2.9.0" and m["source"].startswith("the runs' records (2 of 2")
    assert ("Machine, from the runs' records: 2 CPU cores (x86_64), torch 2.9.0, 1 torch thread(s) (2 inter-op), device cpu, "
            "float32, deterministic algorithms off.") in render_markdown(r)

    _pretrain_record(runs / "up" / "seed0", 2)
    with pytest.raises(VltoolError, match=r"up/seed0 ran with 2 torch thread\(s\), .*base/seed0 with 1: .*--allow-mixed-threads"):
        build_report(runs, cfg)
    r = build_report(runs, replace(cfg, allow_mixed_threads=True))
    assert r["paired"]["mixed_threads_allowed"] and r["variants"][1]["summary"]["zeroshot:top1"]["paired"]["differs"]
    assert r["machine"]["torch_threads"] == {"differs": [{"value": 1, "commands": 1, "e.g.": "base/seed0/vltool.json"},
                                                         {"value": 2, "commands": 1, "e.g.": "up/seed0/vltool.json"}]}
    result = CliRunner().invoke(app, ["report", str(runs), "--out", str(tmp_path / "rep"), "--metric", "zeroshot:top1",
                                      "--baseline", "base", "--bootstrap", "50", "--no-chart"])
    assert result.exit_code == 1 and "--allow-mixed-threads" in result.output
    result = CliRunner().invoke(app, ["report", str(runs), "--out", str(tmp_path / "rep"), "--metric", "zeroshot:top1",
                                      "--baseline", "base", "--bootstrap", "50", "--no-chart", "--allow-mixed-threads"])
    assert result.exit_code == 0, result.output

    for d in ("base", "up"):  # runs made before vltool recorded its runtime: said so, not the report's own machine
        (runs / d / "seed0" / "vltool.json").unlink()
    m = build_report(runs, cfg)["machine"]
    assert m["source"].startswith("not recorded by the runs") and "torch_threads" not in m


def _committed_reports():
    """(path, report) of each committed recipe report: results/*.json with variants."""
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "results").glob("*.json")):
        report = json.loads(path.read_text())
        if "variants" in report:
            yield path, report


def test_committed_reports_render_as_committed():
    """Each committed report's JSON renders to its own committed Markdown; so does a report made before issue 42
    added Monte Carlo errors, verdicts and the runs' runtime (tests/golden/report-before-issue-42.*:
    results/fistful-of-words.{json,md} as committed at de76e4c), so a user's older reports stay readable."""
    import gzip
    from pathlib import Path

    for path, report in _committed_reports():
        assert render_markdown(report) == path.with_suffix(".md").read_text(), path.name
    golden = Path(__file__).resolve().parent / "golden" / "report-before-issue-42"
    old = json.loads(gzip.decompress(golden.with_suffix(".json.gz").read_bytes()))
    assert "p_value" not in json.dumps(old) and "source" not in old["machine"]  # it is a pre-issue-42 report
    assert render_markdown(old) == golden.with_suffix(".md").read_text()


def test_every_committed_report_is_current():
    """Every committed recipe report was made under issue 42's rules: its machine block is the runs' own record
    (one torch thread a command), and every paired difference carries its verdict, its bootstrap p-value and
    the Monte Carlo error of the p-value and of both bounds, with the resamples it was read from; a settled
    verdict agrees with its interval."""
    seen = 0
    for path, report in _committed_reports():
        machine = report["machine"]
        assert machine["source"].startswith("the runs' records") and machine["torch_threads"] == 1, path.name
        for group in ("variants", "contrasts"):
            for row in report.get(group) or []:
                for metric, s in row["summary"].items():
                    p = s.get("paired")
                    if not p or p.get("ci_low") is None:
                        continue
                    seen += 1
                    where = (path.name, row["name"], metric)
                    for key in ("p_value", "p_value_mc_se", "ci_low_mc_se", "ci_high_mc_se"):
                        assert p[key] is not None and p[key] >= 0, where
                    assert 1000 <= p["resamples"] <= report["paired"]["max_resamples"], where
                    excludes = p["ci_low"] > 0 or p["ci_high"] < 0
                    assert p["verdict"] == "borderline" or p["verdict"] == ("differs" if excludes else "within noise"), where
    assert seen >= 354  # the seven recipes' paired cells, fistful-of-words' included


def test_the_command_line_default_of_bootstrap_max_is_the_library_s():
    """`vltool report --bootstrap-max` spells its default as a literal (the command module does not import the
    numerical code at start-up); it must stay vltool.outcomes.MAX_RESAMPLES."""
    import inspect

    from vltool.commands.report import report_command
    from vltool.outcomes import MAX_RESAMPLES
    from vltool.report import ReportConfig

    assert inspect.signature(report_command).parameters["bootstrap_max"].default == MAX_RESAMPLES == ReportConfig.bootstrap_max


KILL_AT = """
import os, signal, sys
import vltool.io.atomic as atomic
point, count = sys.argv[1], int(sys.argv[2])
real = {"replace": os.replace, "journal": atomic.write_json_atomic}
calls = []
def killing(name):
    def f(*a, **k):
        calls.append(name)
        if name == point and calls.count(name) > count:
            os.kill(os.getpid(), signal.SIGKILL)  # (as kill -9: no finally, no cleanup)
        return real[name](*a, **k)
    return f
os.replace = killing("replace")
atomic.write_json_atomic = killing("journal")
from vltool.cli import main
sys.argv = ["vltool", *sys.argv[3:]]
main()
"""


def _set(stem):
    """(the title the .md shows, the title the .json records); None where the file is absent."""
    md, js = stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".json")
    return (md.read_text().splitlines()[0] if md.exists() else None,
            "# " + json.loads(js.read_text())["title"] if js.exists() else None)


@pytest.mark.parametrize("point,count,left", [
    ("journal", 0, "old"),   # killed before the journal (the commit point): the old set, stale temporaries
    ("replace", 2, "mixed"),  # killed between the renames (the first is the journal's): new .md beside the old .json
])
def test_a_killed_report_overwrite_leaves_one_set_and_the_next_run_finishes_it(runs, tmp_path, point, count, left):
    """kill -9 during `report --overwrite` left the new STEM.md beside the old STEM.json and .png (issue 53):
    each file was atomic, the set was not. Now the set is committed by a journal: a kill before it leaves the
    old set (and temporaries the next run removes); after it, the next run first finishes the swap, in one line."""
    import subprocess
    import sys

    stem = tmp_path / "res" / "x"
    args = ["report", str(runs), "--out", str(stem), "--metric", "zeroshot:top1", "--no-chart", "--no-progress"]
    assert CliRunner().invoke(app, [*args, "--title", "one"]).exit_code == 0
    r = subprocess.run([sys.executable, "-c", KILL_AT, point, str(count), *args, "--title", "two", "--overwrite"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    hidden = sorted(p.name for p in stem.parent.iterdir() if p.name.startswith("."))
    if left == "old":
        assert _set(stem) == ("# one", "# one") and not any(n.endswith(".swap") for n in hidden), hidden
    else:
        assert ".x.swap" in hidden and _set(stem) == ("# two", "# one")  # committed, cut between its renames
    r = CliRunner().invoke(app, [*args, "--title", "three", "--overwrite"])
    assert r.exit_code == 0, r.stderr
    if left == "mixed":
        assert "finished replacing" in r.stderr and "killed report" in r.stderr, r.stderr
    else:
        assert "removed what" in r.stderr, r.stderr
    assert _set(stem) == ("# three", "# three")
    assert sorted(p.name for p in stem.parent.iterdir()) == ["x.json", "x.md"]  # no journal, temporaries or lock left


def test_a_report_killed_in_its_first_write_does_not_block_the_next(runs, tmp_path):
    """kill -9 during a first report left STEM.md alone (and .STEM.lock); every later `report --overwrite`
    refused it as "not written by vltool report" (issue 53). Now nothing is in place before the commit, and
    after it the next run completes the set."""
    import subprocess
    import sys

    for point, count in (("journal", 0), ("replace", 2)):
        stem = tmp_path / point / "x"
        args = ["report", str(runs), "--out", str(stem), "--metric", "zeroshot:top1", "--no-chart", "--no-progress"]
        r = subprocess.run([sys.executable, "-c", KILL_AT, point, str(count), *args, "--title", "first"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == -9, r.stderr
        assert (stem.parent / ".x.lock").exists()  # (the lock file a kill leaves: not held, so it blocks nothing)
        r = CliRunner().invoke(app, [*args, "--title", "again", "--overwrite"])
        assert r.exit_code == 0, r.stderr
        assert _set(stem) == ("# again", "# again")
        assert sorted(p.name for p in stem.parent.iterdir()) == ["x.json", "x.md"]


def test_a_report_without_a_complete_seed_names_what_each_run_lacks(tmp_path):
    """Pairing two benchmark runs on different datasets said only "no seed has results for every variant
    (a, b)" (issue 53): the message names the file and the metric it lacks."""
    for variant, metrics in (("a", {"top1": entry(0.5, 0.4, 0.6)}), ("b", {"image_retrieval_recall@1": entry(0.2, 0.1, 0.3)})):
        d = tmp_path / "runs" / variant / "seed0"
        d.mkdir(parents=True)
        (d / "zeroshot.json").write_text(json.dumps({"metrics": metrics}))
    r = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--metric", "zeroshot:top1"])
    assert r.exit_code == 1, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "no seed has results for every variant (a, b)" in line and f"{tmp_path / 'runs' / 'b' / 'seed0' / 'zeroshot.json'} has no 'top1'" in line, line
    (tmp_path / "runs" / "b" / "seed0" / "zeroshot.json").unlink()
    line = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--metric", "zeroshot:top1"]).stderr
    assert "b/seed0/zeroshot(.json) is missing" in line, line


def test_the_machine_sentence_leaves_out_what_no_run_recorded():
    """A report over runs that recorded part of their runtime printed "device cpu, None" (and a benchmark
    pairing "device None, None"; issue 53): a fact no run recorded is left out."""
    from vltool.report_render import _machine_in_words

    full = {"source": "x", "cpu_count": 2, "processor": "x86_64", "torch": "2.14.1", "torch_threads": 1, "torch_interop_threads": 2,
            "device": "cpu", "dtype": "float32", "deterministic_algorithms": False}
    assert _machine_in_words(full) == ("Machine, from the runs' records: 2 CPU cores (x86_64), torch 2.14.1, 1 torch thread(s) "
                                       "(2 inter-op), device cpu, float32, deterministic algorithms off.")
    assert _machine_in_words({"source": "x", "device": "cpu", "dtype": None}) == "Machine, from the runs' records: device cpu."
    assert "None" not in _machine_in_words({"source": "x", "cpu_count": 2, "device": None, "dtype": None})


def test_a_seed_missing_one_evaluation_of_one_variant_is_left_out_and_named(runs):
    """With one seed's second evaluation missing, the report said "mean ± sd over 3 seeds" for cells that held
    2, and incomplete_seeds was [] (issue 52): a seed is kept only where every variant has every result it has
    at any seed; the one left out is named with what it lacks."""
    for variant in ("base", "bow"):
        for seed in range(3):
            if (variant, seed) != ("bow", 1):
                d = runs / variant / f"seed{seed}"
                (d / "retrieve.json").write_text(json.dumps({"metrics": {"image_to_text_R@1": entry(0.3 + seed / 100, 0.2, 0.4)}}))
    metrics = [parse_metric("zeroshot:top1"), parse_metric("retrieve:image_to_text_R@1")]
    r = build_report(runs, ReportConfig(metrics=metrics, baseline="base"))
    assert r["seeds"] == [0, 2] and r["incomplete_seeds"] == [1]
    assert r["incomplete_runs"] == ["bow/seed1: retrieve:image_to_text_R@1"]
    assert all(s["seeds"] == 2 for v in r["variants"] for s in v["summary"].values())
    md = render_markdown(r)
    assert "over 2 seeds" in md and "Seed 1 left out" in md and "bow/seed1: retrieve:image_to_text_R@1" in md


def test_a_metric_no_run_has_is_left_out_and_said(runs):
    """A study without a retrieval benchmark has no retrieve*.json: the report leaves the metric out and says so,
    rather than a column of "-" (issue 52: no task a study did not name)."""
    metrics = [parse_metric("zeroshot:top1"), parse_metric("R@1=retrieve:image_to_text_R@1")]
    r = build_report(runs, ReportConfig(metrics=metrics, baseline="base"))
    assert [m["name"] for m in r["metrics"]] == ["zeroshot:top1"] and r["metrics_without_results"] == ["R@1"]
    assert "No run has results for R@1: left out of the tables." in render_markdown(r)


def test_seeds_trained_differently_are_not_averaged(runs):
    """A rerun into a finished OUT with a new INIT, killed after its first seed, left seed0 trained from the new
    model and seed1 from the old; REPORT_ONLY=1 averaged them without a word (issue 52). The seeds' training
    records must agree on every option but the seed (paths compared without their seed<N>)."""
    def trained(seed, init):
        d = runs / "base" / f"seed{seed}" / "run"
        d.mkdir(parents=True, exist_ok=True)
        (d / "vltool.json").write_text(json.dumps({"command": "pretrain", "command_line": "vltool pretrain", "options": {
            "init": init, "seed": seed, "lr": 1e-3, "data": [f"runs/base/seed{seed}/data"], "threads": seed + 1}}))

    for seed in range(3):
        trained(seed, "hf:you/clip-a")
    r = build_report(runs, ReportConfig(metrics=[parse_metric("zeroshot:top1")], baseline="base"))
    assert r["seeds"] == [0, 1, 2]
    trained(0, "hf:you/clip-b")
    with pytest.raises(VltoolError, match=r"base: seed0 and seed1 were trained differently \(init: 'hf:you/clip-b' against 'hf:you/clip-a'\)"):
        build_report(runs, ReportConfig(metrics=[parse_metric("zeroshot:top1")], baseline="base"))


def test_report_has_overwrite(cli):
    """`report --overwrite` was "No such option"."""
    r = cli("report", "--help")
    assert r.exit_code == 0 and "--overwrite" in r.stdout
