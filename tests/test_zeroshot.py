"""`vltool zeroshot`: class embeddings, templates, the results record, multi-label, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fixtures.eval_data import COLORS, make_colors, make_model
from tests.fixtures.launch import launch
from vltool.errors import UsageError
from vltool.zeroshot import ZeroshotConfig, class_embeddings, zeroshot

PROVENANCE_FIELDS = ("vltool_version", "command", "command_line", "options", "inputs", "rows_in", "rows_out", "created", "wall_time_s", "stats")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_model(tmp_path_factory.mktemp("model") / "run"))


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return make_colors(tmp_path_factory.mktemp("data") / "colors")


def cfg(model_dir, **kw):
    return ZeroshotConfig(model=model_dir, progress=False, **{"bootstrap": 50, **kw})


def test_class_embedding_is_the_renormalised_mean_of_normalised_prompts():
    rng = np.random.default_rng(0)
    e = rng.normal(size=(5, 4)).astype(np.float32)
    got = class_embeddings(e, [2, 3])
    n = e / np.linalg.norm(e, axis=1, keepdims=True)
    for c, rows in enumerate((slice(0, 2), slice(2, 5))):
        m = n[rows].mean(0)
        np.testing.assert_allclose(got[c], m / np.linalg.norm(m), atol=1e-6)


def test_record_metrics_chance_and_provenance(model_dir, colors, tmp_path):
    out = tmp_path / "zs.json"
    r = zeroshot(colors, cfg(model_dir), where=["split=test"], out=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(r, default=str))
    for f in PROVENANCE_FIELDS:
        assert f in r
    assert r["command"] == "zeroshot" and r["inputs"][0]["where"] == ["split=test"]
    assert r["classnames"] == list(COLORS)
    assert r["protocol"]["template_list"] == ["a photo of a {}."]
    assert set(r["metrics"]) == {"top1", "top5", "mean_per_class_recall"}
    n_cls = len(COLORS)
    for name, e in r["metrics"].items():
        assert e["ci_low"] <= e["value"] <= e["ci_high"] or np.isclose(e["ci_low"], e["value"]) or np.isclose(e["ci_high"], e["value"])
    assert r["metrics"]["top1"]["chance"] == pytest.approx(1 / n_cls)
    assert r["metrics"]["top5"]["chance"] == pytest.approx(5 / n_cls)
    assert r["chance"]["majority_class"] == pytest.approx(2 / 12)
    assert r["model"]["fingerprint"] and r["data"]["rows_evaluated"] == 12
    assert sum(p["support"] for p in r["per_class"]) == 12
    with pytest.raises(UsageError, match="exists"):
        zeroshot(colors, cfg(model_dir), where=["split=test"], out=out)
    again = zeroshot(colors, cfg(model_dir), where=["split=test"], out=out, overwrite=True)
    assert again["stats"]["cache"]["images"]["hit"] and again["metrics"] == r["metrics"]


def test_fewer_than_five_classes_have_no_top5(model_dir, colors):
    r = zeroshot(colors, cfg(model_dir), where=["label=red", "label=green", "label=blue"])
    assert r["metrics"]["top5"]["value"] is not None  # the label column still has 6 classes
    names = ["red", "green", "blue", "yellow"]
    import datasets

    ds = datasets.load_from_disk(colors).filter(lambda r: r["label"] < 4)
    ds = ds.cast_column("label", datasets.ClassLabel(names=names))
    path = colors + "_four"
    ds.save_to_disk(path)
    r4 = zeroshot(path, cfg(model_dir))
    assert "top5" not in r4["metrics"] and r4["chance"]["top5"] is None


def test_template_sets_files_and_class_prompts(model_dir, colors, tmp_path):
    from vltool.templates import load_templates, template_names

    assert {"photo", "openai-imagenet", "fff-cifar", "fff-food101", "fff-caltech101", "fff-cars", "fff-dtd", "fff-sun397", "fff-imagenet"} <= set(template_names())
    assert len(load_templates("openai-imagenet")[1]) == 80 and load_templates("fff-imagenet")[1] == load_templates("openai-imagenet")[1]
    f = tmp_path / "t.txt"
    f.write_text("a {c} thing\n\n# a comment\nthe {label}.\n")
    r = zeroshot(colors, cfg(model_dir, templates=str(f)), where=["split=test"])
    assert r["protocol"]["template_list"] == ["a {} thing", "the {}."] and r["stats"]["prompts"] == 12
    bad = tmp_path / "bad.txt"
    bad.write_text("no placeholder\n")
    with pytest.raises(UsageError, match="exactly one"):
        zeroshot(colors, cfg(model_dir, templates=str(bad)))
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps({"red": ["a red square", "crimson"], "blue": ["a blue square"]}))
    r = zeroshot(colors, cfg(model_dir, class_prompts=str(prompts)), where=["split=test"])
    assert r["stats"]["prompts"] == 3 + 4 and r["protocol"]["class_prompts"]["red"] == ["a red square", "crimson"]
    prompts.write_text(json.dumps({"crimson": ["a red square"]}))
    with pytest.raises(UsageError, match="not classes"):
        zeroshot(colors, cfg(model_dir, class_prompts=str(prompts)))


@pytest.mark.skipif(not __import__("importlib").util.find_spec("clip_benchmark"), reason="clip-benchmark not installed")
def test_template_sets_equal_clip_benchmark():
    import importlib.resources

    from vltool.templates import load_templates

    ref = json.loads((importlib.resources.files("clip_benchmark") / "datasets" / "en_zeroshot_classification_templates.json").read_text())
    pairs = {"fff-cifar": "cifar10", "fff-food101": "food101", "fff-caltech101": "caltech101", "fff-cars": "cars",
             "fff-dtd": "dtd", "fff-sun397": "sun397", "openai-imagenet": "imagenet1k"}
    for ours, theirs in pairs.items():
        assert load_templates(ours)[1] == [t.replace("{c}", "{}") for t in ref[theirs]], ours
    assert ref["cifar100"] == ref["cifar10"]


def test_classnames_file(model_dir, colors, tmp_path):
    f = tmp_path / "names.txt"
    f.write_text("\n".join(f"{c} colour" for c in COLORS) + "\n")
    r = zeroshot(colors, cfg(model_dir, classnames=str(f)), where=["split=test"])
    assert r["classnames"][0] == "red colour"
    f.write_text("red\ngreen\n")
    with pytest.raises(UsageError, match="6 classes"):
        zeroshot(colors, cfg(model_dir, classnames=str(f)))


def test_multilabel_gives_map(model_dir, tmp_path):
    import datasets
    path = make_colors(tmp_path / "ml", per_class=3, multilabel=True)
    r = zeroshot(path, cfg(model_dir, label_column="labels"))
    assert set(r["metrics"]) == {"mAP"} and r["task"] == "zeroshot-multilabel"
    e = r["metrics"]["mAP"]
    assert 0 <= e["value"] <= 1 and e["ci_low"] <= e["ci_high"]
    y = np.zeros((18, 6), bool)
    for i, labs in enumerate(datasets.load_from_disk(path)["labels"]):
        y[i, labs] = True
    assert e["chance"] == pytest.approx(y.mean(axis=0).mean())  # mean prevalence (every class has positives)
    aps = [p["ap"] for p in r["per_class"]]
    assert e["value"] == pytest.approx(np.mean(aps))
    assert all(0 <= a <= 1 for a in aps)


def test_validation_reports_every_problem(model_dir):
    with pytest.raises(UsageError) as e:
        zeroshot("emoji", ZeroshotConfig(model="", templates="nope", bootstrap=-1, classnames="/no/such"))
    msg = str(e.value)
    for part in ("--model is required", "--templates 'nope'", "--bootstrap", "--classnames /no/such"):
        assert part in msg


def test_cli_json_and_table(cli, model_dir, colors):
    r = cli("zeroshot", colors, "--model", model_dir, "--where", "split=test", "--bootstrap", "20", "--json", "--no-progress")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert rec["command"] == "zeroshot" and "top1" in rec["metrics"]
    t = cli("zeroshot", colors, "--model", model_dir, "--where", "split=test", "--bootstrap", "20", "--per-class", "--no-progress")
    assert t.exit_code == 0 and "top1" in t.stdout and "95% CI" in t.stdout and "per class" in t.stdout
    bad = cli("zeroshot", colors, "--model", model_dir + "_missing")
    assert bad.exit_code == 2 and "error:" in bad.stderr


@pytest.mark.slow
def test_two_processes_under_accelerate_give_the_same_results(model_dir, colors, tmp_path):
    """`accelerate launch -m vltool zeroshot` with 2 CPU processes: one table, the same numbers as 1 process."""
    import os
    import subprocess
    import sys

    args = ["zeroshot", colors, "--model", model_dir, "--bootstrap", "20", "--json", "--no-progress", "--batch-size", "4"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    one = subprocess.run([sys.executable, "-m", "vltool", *args, "--cache-dir", str(tmp_path / "c1")], capture_output=True, text=True, env=env, check=True)
    two = launch(["-m", "vltool", *args, "--cache-dir", tmp_path / "c2"], 2)
    a, b = json.loads(one.stdout), json.loads(two.stdout)  # only the main process prints
    assert a["stats"]["processes"] == 1 and b["stats"]["processes"] == 2
    assert a["metrics"] == b["metrics"] and a["stats"]["cache"]["images"]["key"] == b["stats"]["cache"]["images"]["key"]


def test_present_classes_only_equals_a_dataset_of_those_classes(model_dir, colors, tmp_path):
    """Zero-shot on held-out classes (UniCL Table 6): the absent classes are not candidates."""
    import datasets

    where = ["label=0", "label=2"]
    got = zeroshot(colors, cfg(model_dir, present_classes_only=True), where=where)
    ds = datasets.load_from_disk(colors).filter(lambda r: r["label"] in (0, 2))
    ds = ds.cast_column("label", datasets.Value("int64")).map(lambda r: {"label": {0: 0, 2: 1}[r["label"]]})
    ds = ds.cast_column("label", datasets.ClassLabel(names=["red", "blue"]))
    ds.save_to_disk(str(tmp_path / "two"))
    ref = zeroshot(str(tmp_path / "two"), cfg(model_dir))
    assert got["classnames"] == ["red", "blue"] and got["stats"]["classes_in_label_column"] == len(COLORS)
    assert got["chance"]["top1"] == 0.5
    for k in ("top1", "mean_per_class_recall"):
        assert got["metrics"][k]["value"] == pytest.approx(ref["metrics"][k]["value"])
    full = zeroshot(colors, cfg(model_dir), where=where)
    assert full["chance"]["top1"] == pytest.approx(1 / len(COLORS))


def test_ranks_in_blocks_equal_the_whole_score_matrix(monkeypatch, model_dir, colors, tmp_path):
    """zeroshot never holds the (N, C) score matrix of single-label data: its blocks of rows give the same
    per-image ranks as the whole matrix (ties included), and the same results."""
    import vltool.zeroshot as zs
    from vltool.metrics import class_ranks

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 8)).astype(np.float32)
    cls = rng.standard_normal((7, 8))
    cls[3] = cls[1]  # two classes tied everywhere
    target = rng.integers(0, 7, 50)
    want = class_ranks(x.astype(np.float64) @ cls.T, target)
    monkeypatch.setattr(zs, "ROW_BLOCK", 16)
    got = zs.ranks_in_blocks(x, cls, target)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and (want[1] > 0).any()
    small = zeroshot(colors, ZeroshotConfig(model=model_dir, progress=False, bootstrap=50), out=tmp_path / "a.json")
    monkeypatch.setattr(zs, "ROW_BLOCK", 16_384)
    whole = zeroshot(colors, ZeroshotConfig(model=model_dir, progress=False, bootstrap=50), out=tmp_path / "b.json")
    assert small["metrics"] == whole["metrics"] and small["rows_out"] > 16


def test_encoding_defaults_and_precision(model_dir, colors, tmp_path, monkeypatch):
    """Evaluation on a GPU (issue 51): --batch-size and --workers default from the device (64 and 1 on CPU,
    the exact path; 256 and the cores less one, at most 8, on a GPU); --precision bf16 encodes under autocast,
    cached apart from float32 (whose cache key is what it was), with nearly the same embeddings."""
    import os

    import torch

    from vltool.encode import image_preprocessing, with_precision
    from vltool.evaluation import encode_defaults

    assert encode_defaults() == (64, 1) and (cfg(model_dir).batch_size, cfg(model_dir).decode_threads) == (64, 1)
    assert cfg(model_dir, batch_size=8, decode_threads=3).batch_size == 8
    with monkeypatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
        mp.setenv("LOCAL_WORLD_SIZE", "1")
        assert encode_defaults() == (256, 8)
        mp.setenv("LOCAL_WORLD_SIZE", "8")
        mp.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
        assert encode_defaults() == (256, 7)
    prep = {"kind": "image", "transform": {"size": 32}, "features": "post"}
    assert with_precision(prep, "no") is prep and with_precision(prep, "bf16") == {**prep, "precision": "bf16"}
    assert image_preprocessing  # (the key's other half, unchanged)
    cache = tmp_path / "cache"
    fp32 = zeroshot(colors, cfg(model_dir, cache_dir=str(cache)), where=["split=test"])
    bf16 = zeroshot(colors, cfg(model_dir, cache_dir=str(cache), precision="bf16"), where=["split=test"])
    assert not bf16["stats"]["cache"]["images"]["hit"]  # not served float32's embeddings
    assert bf16["options"]["precision"] == "bf16" and fp32["options"]["precision"] == "no"
    again = zeroshot(colors, cfg(model_dir, cache_dir=str(cache)), where=["split=test"])
    assert again["stats"]["cache"]["images"]["hit"] and again["metrics"] == fp32["metrics"]
    assert abs(bf16["metrics"]["top1"]["value"] - fp32["metrics"]["top1"]["value"]) <= 0.25
    with pytest.raises(UsageError, match="--precision 'fp8'"):
        zeroshot(colors, cfg(model_dir, precision="fp8"), where=["split=test"])
