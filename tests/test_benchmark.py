"""`vltool benchmark` over fixture datasets: a CLIP_benchmark classification layout read directly, an imported
CLIP_benchmark retrieval layout, and a dataset with a `split` column; every number equals the one the
single command prints."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.clip_benchmark import make_cb_classification, make_cb_retrieval
from tests.fixtures.eval_data import make_colors, make_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from typer.testing import CliRunner

    from vltool.cli import app

    root = tmp_path_factory.mktemp("bench")
    cb = make_cb_classification(root / "wds_colors")
    caps_wds = make_cb_retrieval(root / "wds_caps")
    r = CliRunner().invoke(app, ["import", str(caps_wds), "--out", str(root / "caps"), "--no-progress"])
    assert r.exit_code == 0, r.stderr
    colors = make_colors(root / "colors", per_class=3)
    model = make_model(root / "run")
    return root, cb, root / "caps", colors, model


def test_benchmark_equals_the_single_commands(setup, cli, tmp_path):
    root, cb, caps, colors, model = setup
    listing = tmp_path / "list.txt"
    listing.write_text(f"# the fixtures\n{cb}\n{caps}\n\n{colors}\n")
    r = cli("benchmark", "--model", model, "--datasets", listing, "--bootstrap", "20", "--out", tmp_path / "b.json", "--cache-dir", tmp_path / "c")
    assert r.exit_code == 0, r.stderr
    rec = json.loads((tmp_path / "b.json").read_text())
    assert rec["command"] == "benchmark" and rec["stats"]["datasets"] == 3
    assert {d["spec"]: d["tasks"] for d in rec["datasets"]} == {
        str(cb): ["zeroshot", "probe"], str(caps): ["retrieve"], colors: ["zeroshot", "retrieve", "probe"]}
    assert rec["stats"]["tasks_skipped"][str(caps)] == {"zeroshot": "no label or labels column", "probe": "no single-label ClassLabel column"}
    imported = next(d["path"] for d in rec["datasets"] if d["spec"] == str(cb))
    assert imported.startswith(str(tmp_path / "c" / "clip_benchmark"))

    def single(*args):
        r = cli(*args, "--model", model, "--bootstrap", "20", "--json", "--cache-dir", tmp_path / "c")
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)

    expected = {
        (str(cb), "zeroshot"): single("zeroshot", imported, "--split", "test"),
        (str(cb), "probe"): single("probe", imported, "--split", "train", "--eval-data", imported, "--eval-split", "test"),
        (str(caps), "retrieve"): single("retrieve", caps, "--split", "test", "--text-column", "captions"),
        (colors, "zeroshot"): single("zeroshot", colors, "--where", "split=test"),
        (colors, "retrieve"): single("retrieve", colors, "--where", "split=test", "--text-column", "captions"),
        (colors, "probe"): single("probe", colors, "--where", "split=train", "--eval-data", colors, "--eval-where", "split=test"),
    }
    for (spec, task), want in expected.items():
        assert rec["results"][spec][task]["metrics"] == want["metrics"], (spec, task)
    # the CLIP_benchmark dataset's own templates were used
    assert rec["results"][str(cb)]["zeroshot"]["protocol"]["template_list"] == ["a photo of a {}.", "a {} square."]
    rows = {(r["dataset"], r["task"], r["metric"]): r for r in rec["table"]}
    assert rows[(colors, "probe", "top1")]["value"] == expected[(colors, "probe")]["metrics"]["top1"]["value"]
    assert rows[(str(caps), "retrieve", "image_to_text_R@5")]["chance"] == expected[(str(caps), "retrieve")]["metrics"]["image_to_text_R@5"]["chance"]


def test_tasks_option_and_errors(setup, cli, tmp_path):
    root, cb, caps, colors, model = setup
    r = cli("benchmark", "--model", model, "--datasets", f"{colors},{caps}", "--tasks", "zeroshot", "--bootstrap", "0", "--json")
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    assert list(rec["results"]) == [colors] and list(rec["results"][colors]) == ["zeroshot"]
    r = cli("benchmark", "--model", model, "--datasets", str(caps), "--tasks", "probe")
    assert r.exit_code == 2 and "no task applies to any dataset" in r.stderr
    r = cli("benchmark", "--model", model, "--datasets", colors, "--tasks", "zeroshot,linear")
    assert r.exit_code == 2 and "--tasks 'zeroshot,linear'" in r.stderr
    r = cli("benchmark", "--model", model, "--datasets", colors, "--out", f"{colors}/b.json")
    assert r.exit_code == 2 and "inputs are never modified" in r.stderr
    r = cli("benchmark", "--model", model)
    assert r.exit_code == 2 and "--datasets is required" in r.stderr


def test_a_dataset_named_twice_or_an_unknown_eval_split_is_refused(setup, cli, tmp_path):
    """Issue 44: a dataset named twice (in a file, or spelled two ways) ran twice without a word; an
    --eval-split that is not a value of the `split` column (a typo) evaluated every row, exit 0."""
    root, cb, caps, colors, model = setup
    listing = tmp_path / "list.txt"
    listing.write_text(f"{colors}\n{caps}\n{colors}\n")
    for datasets_, said in ((listing, f"{colors!r} is listed twice"), (f"{colors},{caps},{colors}", f"{colors!r} is listed twice"),
                            (f"{colors},{colors}/", f"{colors!r} and {colors + '/'!r} are the same dataset")):
        r = cli("benchmark", "--model", model, "--datasets", datasets_, "--bootstrap", "0", "--out", tmp_path / "b.json",
                "--cache-dir", tmp_path / "c", "--no-progress")
        assert r.exit_code == 2 and said in r.stderr and "list each dataset once" in r.stderr, r.stderr
        assert not (tmp_path / "b.json").exists()
    r = cli("benchmark", "--model", model, "--datasets", colors, "--eval-split", "tset", "--bootstrap", "0", "--out", tmp_path / "b.json",
            "--cache-dir", tmp_path / "c", "--no-progress")
    assert r.exit_code == 2 and not (tmp_path / "b.json").exists(), r.stderr
    assert "no split 'tset' to evaluate on" in r.stderr and "['test', 'train']" in r.stderr and "--eval-split" in r.stderr, r.stderr


def test_a_class_label_split_column_selects_its_rows(tmp_path):
    """A `split` column stored as a ClassLabel (as `datasets` often makes it) selects the test rows to
    evaluate and the train rows to probe, like a string column; before, the whole dataset was evaluated
    (training rows included) and the probe skipped."""
    import datasets

    from vltool.benchmark import BenchmarkConfig, plan_dataset

    feats = datasets.Features({"split": datasets.ClassLabel(names=["train", "test"]),
                               "label": datasets.ClassLabel(names=["a", "b"]), "caption": datasets.Value("string")})
    datasets.Dataset.from_dict({"split": [0, 1, 0, 1], "label": [0, 1, 1, 0], "caption": list("wxyz")},
                               features=feats).save_to_disk(str(tmp_path / "d"))
    plan = plan_dataset(str(tmp_path / "d"), BenchmarkConfig(model="unused"))
    assert plan.eval_where == ["split=test"] and plan.train_where == ["split=train"]


def test_the_table_keeps_metric_names_whole_at_80_columns(setup, cli, tmp_path, monkeypatch):
    """In an 80-column terminal the dataset paths fold, and image_to_text_R@1 / R@5 stay whole (they were cut
    to `image_to_tex...`)."""
    import io

    from rich.console import Console

    from vltool import console

    root, cb, caps, colors, model = setup
    buf = io.StringIO()
    monkeypatch.setattr(console, "out", Console(file=buf, width=80, soft_wrap=True))
    r = cli("benchmark", "--model", model, "--datasets", f"{caps},{colors}", "--tasks", "retrieve", "--bootstrap", "20",
            "--cache-dir", tmp_path / "c")
    assert r.exit_code == 0, r.stderr
    text = buf.getvalue()
    for name in ("image_to_text_R@1", "image_to_text_R@5", "text_to_image_R@1", "text_to_image_R@5"):
        assert name in text, text
    assert "…" not in text and "..." not in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_table_fits_80_columns_with_dataset_names_whole(monkeypatch):
    """issue 40: at COLUMNS=80 the table was 82 columns wide and "emoji-openmoji" was broken across two lines."""
    import io

    from rich.console import Console

    from vltool import console
    from vltool.commands.benchmark import print_table

    rows = [{"dataset": "emoji-openmoji", "task": "zeroshot", "metric": m, "value": 1.0, "ci_low": 0.9999, "ci_high": 1.0,
             "chance": 0.0123} for m in ("top1", "mean_per_class_recall")]
    rows += [{"dataset": "emoji-openmoji", "task": "retrieve", "metric": "image_to_text_R@5", "value": 0.5, "ci_low": None,
              "ci_high": None, "chance": None}]
    record = {"model": {"spec": "open_clip:ViT-B-32/laion2b_s34b_b79k"}, "table": rows, "datasets": []}
    buf = io.StringIO()
    monkeypatch.setattr(console, "out", Console(file=buf, width=80, soft_wrap=True))
    print_table(record)
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80, buf.getvalue()
    assert sum("emoji-openmoji" in line for line in lines) == 3, buf.getvalue()
    assert any("mean_per_class_recall" in line and "100.00%" in line and "99.99-100.00" in line for line in lines)


def test_report_pairs_two_models_benchmark_runs(setup, cli, tmp_path):
    """`vltool benchmark --out X.json` writes each task's per-example outcomes beside X (X.<i>-<task>.examples.npz,
    named in results[dataset][task]["examples"]), so `report` pairs two models' benchmark runs on the same test
    examples as it pairs their zeroshot/retrieve/probe runs; before, it printed "[-]" (issue 39)."""
    root, cb, caps, colors, _ = setup
    runs = tmp_path / "runs"
    for variant, seed in (("a", 0), ("b", 1)):
        model = make_model(tmp_path / f"model-{variant}", seed=seed)
        out = runs / variant / "seed0" / "bench.json"
        r = cli("benchmark", "--model", model, "--datasets", f"{cb},{colors}", "--bootstrap", "20", "--out", out,
                "--cache-dir", tmp_path / "c")
        assert r.exit_code == 0, r.stderr
        rec = json.loads(out.read_text())
        assert rec["results"][colors]["retrieve"]["examples"]["file"] == "bench.1-retrieve.examples.npz"
        assert (out.parent / "bench.1-retrieve.examples.npz").exists() and (out.parent / "bench.0-zeroshot.examples.npz").exists()
        r = cli("benchmark", "--model", model, "--datasets", f"{cb},{colors}", "--bootstrap", "20", "--out", out)
        assert r.exit_code == 2 and "exists" in r.stderr
    r = cli("report", runs, "--out", tmp_path / "rep", "--baseline", "a",
            "--metric", f"CB ZS=bench:results.{cb}.zeroshot.metrics.top1",
            "--metric", f"Colors I→T=bench:results.{colors}.retrieve.metrics.image_to_text_R@1",
            "--metric", f"Colors probe=bench:results.{colors}.probe.metrics.top1")
    assert r.exit_code == 0, r.stderr
    rep = json.loads((tmp_path / "rep.json").read_text())
    b = next(v for v in rep["variants"] if v["name"] == "b")
    for m in rep["metrics"]:
        assert b["summary"][m["name"]]["paired"] is not None, (m["name"], b["summary"][m["name"]].get("paired_note"))
