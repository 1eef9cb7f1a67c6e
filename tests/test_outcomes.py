"""--group-column on zeroshot, retrieve and probe (the bootstrap resamples whole groups), the per-example
outcomes written beside the results JSON (X.examples.npz), and `vltool report`'s paired interval from them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.fixtures.eval_data import make_colors, make_model
from vltool.metrics import bootstrap
from vltool.outcomes import FORMAT, Outcomes, examples_path, resampling_of


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return [str(make_model(d / f"m{s}", seed=s)) for s in (0, 1)]


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """The colour squares with a base_id: each class's test rows are one group of two (near-duplicates)."""
    import datasets

    d = tmp_path_factory.mktemp("grouped")
    ds = datasets.load_from_disk(make_colors(d / "plain", per_class=6))
    ds = ds.add_column("base_id", [f"g{i // 2}" for i in range(len(ds))])
    ds.save_to_disk(str(d / "data"))
    return str(d / "data")


def _check_outcomes(record, out):
    ex = examples_path(out)
    assert record["examples"]["file"] == ex.name and record["examples"]["format"] == FORMAT
    o = Outcomes.read(ex)
    got = o.statistic()(None)
    assert set(got) == set(record["metrics"])
    for k, v in got.items():
        assert v == pytest.approx(record["metrics"][k]["value"], abs=1e-12), k
    raw = np.load(ex, allow_pickle=False)  # numpy alone reads it
    assert raw["id"].dtype.kind == "U" and len(raw["id"]) == len(raw["group"])
    # the run's intervals are those of its resampling plan (groups, strata) on these outcomes: the groups were used
    b = record["protocol"]["bootstrap"]
    iv = bootstrap(len(o), o.statistic(), b["resamples"], b["seed"], resampling=resampling_of(o))
    for k, e in record["metrics"].items():
        assert (iv[k].low, iv[k].high) == pytest.approx((e["ci_low"], e["ci_high"]), abs=1e-12), k
    return o


def test_group_column_on_every_evaluation(models, grouped, tmp_path):
    from vltool.probe import ProbeConfig, probe
    from vltool.retrieve import RetrieveConfig, retrieve
    from vltool.zeroshot import ZeroshotConfig, zeroshot

    common = dict(model=models[0], group_column="base_id", bootstrap=50, progress=False)
    zs = zeroshot(grouped, ZeroshotConfig(**common), where=["split=test"], out=tmp_path / "zs.json")
    b = zs["protocol"]["bootstrap"]
    # 6 classes of one test group each: too few groups in a class to stratify (metrics.MIN_UNITS_PER_STRATUM)
    assert b["unit"] == "base_id group (6 groups of 12 images), not stratified: 6 classes hold fewer than 5 groups"
    assert (b["group_column"], b["units"], b["stratified"], b["strata_below_min"]) == ("base_id", 6, False, 6)
    o = _check_outcomes(zs, tmp_path / "zs.json")
    assert o.group_column == "base_id" and o.groups.tolist() == [f"g{3 * c + 2}" for c in range(6) for _ in range(2)]
    assert o.arrays["greater"].shape == (1, 12)

    rt = retrieve(grouped, RetrieveConfig(**common, text_column="captions"), where=["split=test"], out=tmp_path / "rt.json")
    assert rt["protocol"]["bootstrap"]["unit"] == "base_id group (6 groups of 12 images), each image with all its texts"
    o = _check_outcomes(rt, tmp_path / "rt.json")
    assert len(o.arrays["text_owner"]) == 24 and len(o.arrays["t2i_greater"]) == 24

    for protocol in ("fff", "voc07-svm"):
        pr = probe(grouped, grouped, ProbeConfig(**common, protocol=protocol, epochs=2), where=["split=train"], eval_where=["split=test"],
                   out=tmp_path / f"{protocol}.json")
        assert pr["protocol"]["bootstrap"]["unit"].startswith("base_id group (6 groups of 12 eval images)")
        _check_outcomes(pr, tmp_path / f"{protocol}.json")


def test_without_group_column_the_bootstrap_is_unchanged_and_each_example_is_its_own_group(models, grouped, tmp_path):
    from vltool.zeroshot import ZeroshotConfig, zeroshot

    zs = zeroshot(grouped, ZeroshotConfig(model=models[0], bootstrap=50, progress=False), where=["split=test"], out=tmp_path / "zs.json")
    assert zs["protocol"]["bootstrap"]["unit"] == "image, not stratified: 6 classes hold fewer than 5 images"
    assert zs["protocol"]["bootstrap"]["group_column"] is None
    o = _check_outcomes(zs, tmp_path / "zs.json")
    assert o.group_column == "" and np.array_equal(o.groups, o.ids)


def test_cli_group_column_errors_and_the_examples_file_is_never_clobbered(cli, models, grouped, tmp_path):
    r = cli("zeroshot", grouped, "--where", "split=test", "--model", models[0], "--group-column", "nope", "--no-progress")
    assert r.exit_code == 2 and "--group-column 'nope'" in r.stderr
    out = tmp_path / "zs.json"
    examples_path(out).write_bytes(b"someone else's file")
    r = cli("zeroshot", grouped, "--where", "split=test", "--model", models[0], "--no-progress", "--out", out)
    assert r.exit_code == 2 and "zs.examples.npz" in r.stderr and "--overwrite" in r.stderr
    args = ["zeroshot", grouped, "--where", "split=test", "--model", models[0], "--group-column", "base_id", "--bootstrap", "20",
            "--no-progress", "--out", out, "--overwrite"]
    r = cli(*args)  # a file of someone else's at the outcomes path: not replaced, even with --overwrite (issue 53)
    assert r.exit_code == 2 and "is not a per-example outcomes file vltool wrote" in r.stderr, r.stderr
    assert examples_path(out).read_bytes() == b"someone else's file"
    examples_path(out).unlink()
    r = cli(*args)
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["protocol"]["bootstrap"]["group_column"] == "base_id"
    assert Outcomes.read(examples_path(out)).group_column == "base_id"


def test_report_pairs_real_runs(models, grouped, tmp_path):
    """Two models x two seeds of runs from the commands: the report's Δ is the mean of the per-seed differences,
    its interval brackets it and resamples base_id groups."""
    from vltool.report import ReportConfig, build_report, parse_metric, render_markdown
    from vltool.retrieve import RetrieveConfig, retrieve
    from vltool.zeroshot import ZeroshotConfig, zeroshot

    runs = tmp_path / "runs"
    for name, model in (("a", models[0]), ("b", models[1])):
        for seed in (0, 1):
            d = runs / name / f"seed{seed}"
            common = dict(model=model, group_column="base_id", bootstrap=20, seed=seed, progress=False)
            zeroshot(grouped, ZeroshotConfig(**common), where=["split=test"], out=d / "zeroshot.json")
            retrieve(grouped, RetrieveConfig(**common), where=["split=test"], out=d / "retrieve.json")
    metrics = [parse_metric(m) for m in ("zeroshot:top1", "zeroshot:mean_per_class_recall", "retrieve:image_to_text_R@1",
                                         "retrieve:text_to_image_mean_rank")]
    r = build_report(runs, ReportConfig(metrics=metrics, baseline="a", bootstrap=200))
    s = r["variants"][1]["summary"]
    for m in metrics:
        p = s[m.name]["paired"]
        assert p["delta"] == pytest.approx(s[m.name]["delta_vs_baseline"]["mean"], abs=1e-12)
        assert p["ci_low"] <= p["delta"] + 1e-12 and p["delta"] <= p["ci_high"] + 1e-12
        assert p["resampling"]["group_column"] == "base_id" and p["resampling"]["units"] == 6
    assert s["zeroshot:top1"]["paired"]["unit"].endswith("not stratified: 6 classes hold fewer than 5 groups")
    assert not s["zeroshot:top1"]["paired"]["seeds_resampled"]  # 2 seeds: the interval is the test set's only
    assert "each resample draws whole base_id groups of test images, not stratified by class" in render_markdown(r)


def test_example_ids_equal_each_rows_str():
    """example_ids converts the id column a slice at a time into one fixed-width array: the same values as
    str() of each row's id (None, non-ASCII, numbers, a selection, more rows than one slice), and "#<i>"
    without an id column."""
    import datasets

    from vltool.outcomes import example_ids

    n = (1 << 16) + 5  # two slices
    ids = [f"r{i}" for i in range(n)]
    ids[3], ids[70_000 % n], ids[-1] = None, "ñü-長い", "x" * 40
    ds = datasets.Dataset.from_dict({"id": ids})
    for d in (ds, ds.select(range(n - 1, -1, -3))):
        assert example_ids(d).tolist() == [str(v) for v in d["id"]]
    nums = datasets.Dataset.from_dict({"id": [7, 123456, -1]})
    assert example_ids(nums).tolist() == ["7", "123456", "-1"]
    assert example_ids(datasets.Dataset.from_dict({"v": list(range(12))})).tolist() == [f"#{i}" for i in range(12)]


def _hits_outcomes(hits, groups=("A", "A", "B", "B", "C", "C")):
    """Zero-shot outcomes of hand-made top-1 hits (1: the true class ranked first), one class of two."""
    from vltool.outcomes import base_arrays

    hits = np.asarray(hits)
    ids = np.asarray([f"x{i}" for i in range(len(hits))])
    arrays = base_arrays("zeroshot", "classification", ids, np.asarray(groups), "base_id")
    arrays.update({"class": np.zeros(len(hits), np.int64), "greater": (1 - hits)[None].astype(np.int32),
                   "tied": np.zeros((1, len(hits)), np.int32), "num_classes": np.asarray(2)})
    return Outcomes(arrays)


def test_the_paired_interval_resamples_the_seeds_by_hand():
    """Three seeds whose variant beats the baseline on every test image (Δ = +1), twice, and loses on every
    one (Δ = -1), once. Resampling test groups leaves each seed's Δ unchanged, so a test-set-only interval is
    the point [1/3, 1/3] and would say "differs". Drawing the 3 seeds with replacement gives a mean of -1,
    -1/3, 1/3 or 1 with probabilities 1/27, 6/27, 12/27, 8/27: the 2.5th percentile is -1 (3.7% of the mass)
    and the 97.5th is 1, so the interval is [-1, 1] and the verdict *within noise*."""
    from vltool.outcomes import paired_difference

    up, down = _hits_outcomes([1] * 6), _hits_outcomes([0] * 6)
    pairs = [(up, down), (up, down), (down, up)]
    r = paired_difference(pairs, ["top1"], n_boot=4000, seed=0)
    m = r["metrics"]["top1"]
    assert m["delta"] == pytest.approx(1 / 3) and m["per_seed"] == [1.0, 1.0, -1.0]
    assert m["seed_sd"] == pytest.approx(np.std([1, 1, -1], ddof=1))
    assert (m["ci_low"], m["ci_high"]) == (-1.0, 1.0) and not m["differs"]
    assert r["seeds_resampled"] and r["interval"].startswith("test groups and seeds")
    # two of those seeds only: fewer than 3 are not resampled, and the record says the interval is the test set's
    two = paired_difference(pairs[1:], ["top1"], n_boot=500, seed=0)
    assert not two["seeds_resampled"] and two["interval"].startswith("test set only: 2 seeds")
    assert (two["metrics"]["top1"]["ci_low"], two["metrics"]["top1"]["ci_high"]) == (0.0, 0.0)


def test_with_identical_seeds_the_paired_interval_is_the_test_set_one():
    """Seeds that agree exactly: drawing them changes nothing, and the interval is today's (test groups only),
    bit for bit, from the same generator of group draws."""
    from vltool.outcomes import paired_difference

    variant, base = _hits_outcomes([1, 0, 1, 1, 0, 1]), _hits_outcomes([1, 0, 0, 0, 0, 1])
    one = paired_difference([(variant, base)], ["top1"], n_boot=1000, seed=3)
    three = paired_difference([(variant, base)] * 3, ["top1"], n_boot=1000, seed=3)
    assert not one["seeds_resampled"] and three["seeds_resampled"]
    a, b = one["metrics"]["top1"], three["metrics"]["top1"]
    assert (a["delta"], a["ci_low"], a["ci_high"], a["differs"]) == (b["delta"], b["ci_low"], b["ci_high"], b["differs"])
    assert a["ci_low"] < a["ci_high"]  # the test groups do vary
    assert b["seed_sd"] == 0.0


def _known_p_pair(n=200, up=19, down=8):
    """A variant right where the baseline is wrong on `up` of n test images and the reverse on `down` (each
    image its own group, one seed). A resample's difference is (A - B) / n with (A, B) multinomial(n; up/n,
    down/n): its share at or below 0, the bootstrap p-value, is exact (19 and 8 of 200: 0.01913)."""
    groups = [f"g{i}" for i in range(n)]
    variant = _hits_outcomes([1] * up + [0] * down + [0] * (n - up - down), groups)
    base = _hits_outcomes([0] * up + [1] * down + [0] * (n - up - down), groups)
    return variant, base


def _exact_p(n, a, b):
    from scipy.stats import binom

    k = np.arange(n + 1)
    return float((binom.pmf(k, n, (a + b) / n) * binom.cdf(np.floor(k / 2), k, a / (a + b))).sum())


def test_a_verdict_near_the_edge_is_settled_by_more_resamples_and_is_stable_across_seeds():
    """issue 42: p = 0.0191, within 2 Monte Carlo s.e. of 0.025 at 1,000 resamples (s.e. 0.0043), so 1,000
    resamples say "differs" or "within noise" by the draw; more resamples (up to 80,000) settle it: every
    bootstrap seed says "differs", and the p-value read agrees with the exact one within its MC error."""
    from vltool.outcomes import paired_difference

    variant, base = _known_p_pair()
    p_true = _exact_p(200, 19, 8)
    assert p_true == pytest.approx(0.01913, abs=1e-4)
    settled, fixed = [], []
    for seed in range(8):
        m = paired_difference([(variant, base)], ["top1"], n_boot=1000, seed=seed)["metrics"]["top1"]
        settled.append(m["verdict"])
        assert m["resamples"] > 1000 or abs(m["p_value"] - 0.025) > 2 * m["p_value_mc_se"]
        assert abs(m["p_value"] - p_true) <= 4 * math.sqrt(p_true * (1 - p_true) / m["resamples"])
        assert m["ci_low_mc_se"] >= 0 and m["ci_high_mc_se"] >= 0  # (0 on a plateau of this discrete metric)
        assert m["differs"] == (m["ci_low"] > 0)
    assert set(settled) == {"differs"}
    for seed in range(40):
        one = paired_difference([(variant, base)], ["top1"], n_boot=1000, seed=seed, max_boot=1000)["metrics"]["top1"]
        fixed.append("differs" if one["ci_low"] > 0 else "within noise")
        assert one["resamples"] == 1000
    assert len(set(fixed)) == 2  # 1,000 resamples alone flip with the seed


def test_at_the_edge_itself_the_verdict_is_borderline_and_a_settled_one_keeps_its_first_resamples():
    """40 and 24 of 200: the exact p-value is 0.02504, which no number of resamples can place on either side
    of 0.025: after 80,000 the verdict is "borderline" (neither differs nor within noise). A verdict far from
    the edge keeps the interval of its first 1,000 resamples, bit for bit."""
    from vltool.metrics import Replicates, percentile_interval
    from vltool.outcomes import paired_difference, resampling_of

    assert _exact_p(200, 40, 24) == pytest.approx(0.02504, abs=1e-5)
    edge = _known_p_pair(up=40, down=24)
    m = paired_difference([edge], ["top1"], n_boot=1000, seed=0)["metrics"]["top1"]
    assert m["verdict"] == "borderline" and not m["differs"] and m["resamples"] == 80_000
    assert abs(m["p_value"] - 0.025) <= 2 * m["p_value_mc_se"] and m["p_value_mc_se"] == pytest.approx(0.00055, abs=3e-5)
    far = _known_p_pair(up=40, down=2)
    f = paired_difference([far], ["top1"], n_boot=1000, seed=5)["metrics"]["top1"]
    assert f["verdict"] == "differs" and f["resamples"] == 1000 and f["p_value"] == 0.0
    stat = lambda w: {"top1": far[0].statistic()(w)["top1"] - far[1].statistic()(w)["top1"]}  # noqa: E731
    ref = percentile_interval(Replicates(200, stat, 5, resampling_of(far[1])).extend(1000).rows()[:, 0])
    assert (f["ci_low"], f["ci_high"]) == (ref.low, ref.high)


def test_the_monte_carlo_error_of_a_percentile_bound_matches_its_spread():
    """The order-statistic estimate of a 2.5th percentile's MC s.e. from one set of 1,000 normal replicates is
    near the sd of that percentile over 300 such sets (0.084 for a unit normal)."""
    from vltool.metrics import percentile_mc_se

    rng = np.random.default_rng(0)
    sets = rng.standard_normal((300, 1000))
    spread = np.std(np.percentile(sets, 2.5, axis=1))
    estimates = [percentile_mc_se(s, 2.5) for s in sets]
    assert spread == pytest.approx(0.084, rel=0.2)
    assert np.median(estimates) == pytest.approx(spread, rel=0.25)


def test_an_exact_tie_in_count_terms_is_zero_in_every_replicate(monkeypatch):
    """Ties at zero were decided in floating point (issue 52): the mean over seeds of +a and -a, a tie in count
    terms, landed at about ±1e-17 and counted as a difference, moving the p-value. Engineered: at seed 0 the
    variant wins example 0, at seed 1 it loses it, the baselines' other hits differ; every replicate's true
    difference is exactly 0, so the interval is [0, 0] and the p-value 1."""
    import vltool.outcomes as outcomes
    from vltool.outcomes import paired_difference

    groups = [f"g{i}" for i in range(7)]
    base0, var0 = _hits_outcomes([0, 1, 1, 0, 1, 0, 0], groups), _hits_outcomes([1, 1, 1, 0, 1, 0, 0], groups)
    base1, var1 = _hits_outcomes([1, 0, 1, 1, 0, 1, 1], groups), _hits_outcomes([0, 0, 1, 1, 0, 1, 1], groups)
    pairs = [(var0, base0), (var1, base1)]
    m = paired_difference(pairs, ["top1"], n_boot=2000, seed=0)["metrics"]["top1"]
    assert m["delta"] == 0.0 and (m["ci_low"], m["ci_high"]) == (0.0, 0.0) and m["p_value"] == 1.0, m
    assert m["verdict"] == "within noise"
    monkeypatch.setattr(outcomes, "TIE_RTOL", 0.0)  # floating point alone: the tie is not seen in some replicates
    m = paired_difference(pairs, ["top1"], n_boot=2000, seed=0)["metrics"]["top1"]
    assert m["p_value"] < 1.0 or (m["ci_low"], m["ci_high"]) != (0.0, 0.0), m
