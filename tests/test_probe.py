"""`vltool probe`: the four protocols, their searches, few-shot, hygiene, and a reference for the SVMs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.fixtures.eval_data import make_colors, make_model
from vltool.errors import UsageError, VltoolError
from vltool.probe import WD_COARSE, WD_GRID, ProbeConfig, cosine_lr, probe, train_linear

TRAIN, TEST = ["split=train"], ["split=test"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_model(tmp_path_factory.mktemp("model") / "run"))


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return make_colors(tmp_path_factory.mktemp("data") / "colors", per_class=9)


def run(model_dir, colors, **kw):
    config = ProbeConfig(model=model_dir, progress=False, **{"bootstrap": 50, **kw})
    return probe(colors, colors, config, where=TRAIN, eval_where=TEST)


def test_clip_benchmark_search_refit_and_record(model_dir, colors, tmp_path):
    r = run(model_dir, colors, epochs=2, cache_dir=str(tmp_path))
    p = r["protocol"]
    assert p["name"] == "clip-benchmark" and p["features"] == "post" and p["normalize"] is True
    tried = [s["weight_decay"] for s in p["search"]]
    assert tried[:7] == pytest.approx([float(WD_GRID[i]) for i in WD_COARSE])  # the 7 coarse points first
    assert p["chosen"]["weight_decay"] in tried
    assert p["chosen"]["train_rows"] == 36  # refit on train + val
    assert p["chosen"]["lr"] == 0.1 and p["chosen"]["batch_size"] == 64 and p["chosen"]["epochs"] == 2
    assert set(r["metrics"]) == {"top1", "top5", "mean_per_class_recall"}
    assert r["metrics"]["top1"]["chance"] == pytest.approx(1 / 6) and r["chance"]["majority_class"] == pytest.approx(1 / 6)
    assert r["data"]["train"]["rows"] == 36 and r["data"]["eval"]["rows"] == 18
    assert r["stats"]["cache"]["train"]["key"] != r["stats"]["cache"]["eval"]["key"]


def test_fff_learns_the_colours(model_dir, colors):
    r = run(model_dir, colors, protocol="fff")
    c = r["protocol"]["chosen"]
    assert (c["epochs"], c["weight_decay"], c["lr"], c["optimizer"], c["schedule"]) == (20, 0.0, 0.1, "adamw", "cosine")
    assert r["protocol"]["search"] == []
    assert r["metrics"]["top1"]["value"] > 0.6  # chance 1/6: solid colours are linearly separable


def test_santurkar_grid_seeds_and_pre_features(model_dir, colors):
    r = run(model_dir, colors, protocol="santurkar", epochs=3)
    p = r["protocol"]
    assert p["features"] == "pre" and p["normalize"] is False
    assert [s["lr"] for s in p["search"]] == [0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
    assert all("val_mean_per_class_recall" in s for s in p["search"])
    c = p["chosen"]
    assert c["seeds"] == [0, 1, 2] and c["weight_decay"] == 1e-6 and c["momentum"] == 0.9 and c["reweight"] and c["batch_size"] == 256
    assert r["stats"]["feature_dim"] == 32  # micro ViT width (the projection's input)
    assert "seed" in p["bootstrap"]["unit"]


def test_voc07_svm_equals_a_plain_scikit_learn_loop(model_dir, colors, tmp_path):
    from sklearn.metrics import average_precision_score
    from sklearn.model_selection import cross_val_score
    from sklearn.svm import LinearSVC

    from vltool.cache import EmbeddingCache
    from vltool.encode import encode_images
    from vltool.io import load_dataset
    from vltool.model import load_model

    r = run(model_dir, colors, protocol="voc07-svm", cache_dir=str(tmp_path))
    m = load_model(model_dir)
    tr, ev = load_dataset(colors, where=TRAIN), load_dataset(colors, where=TEST)
    x_tr = encode_images(m, tr, features="pre", cache=EmbeddingCache(tmp_path), progress=False).embeddings
    x_ev = encode_images(m, ev, features="pre", cache=EmbeddingCache(tmp_path), progress=False).embeddings
    x_tr /= np.linalg.norm(x_tr, axis=1, keepdims=True)
    x_ev /= np.linalg.norm(x_ev, axis=1, keepdims=True)
    y_tr, y_ev = np.array(tr.dataset["label"]), np.array(ev.dataset["label"])
    aps = []
    for c in range(6):
        def svm(cost):
            return LinearSVC(C=cost, class_weight={1: 2, 0: 1}, loss="squared_hinge", penalty="l2", dual=True, max_iter=2000, tol=1e-4)

        cv = [cross_val_score(svm(cost), x_tr, (y_tr == c).astype(int), cv=3, scoring="average_precision").mean() for cost in (0.01, 0.1, 1, 10)]
        best = (0.01, 0.1, 1, 10)[int(np.argmax(cv))]
        clf = svm(best).fit(x_tr, (y_tr == c).astype(int))
        aps.append(average_precision_score(y_ev == c, clf.decision_function(x_ev)))
    assert r["metrics"]["mAP"]["value"] == pytest.approx(np.mean(aps))
    assert r["metrics"]["mAP"]["chance"] == pytest.approx(1 / 6)


def test_voc07_svm_on_multilabel_and_softmax_refuses_it(model_dir, tmp_path):
    path = make_colors(tmp_path / "ml", per_class=6, multilabel=True)
    cfg = ProbeConfig(model=model_dir, progress=False, bootstrap=20, protocol="voc07-svm", label_column="labels")
    r = probe(path, path, cfg, where=TRAIN, eval_where=TEST)
    assert set(r["metrics"]) == {"mAP"} and r["protocol"]["bootstrap"]["unit"] == "eval image"
    with pytest.raises(UsageError, match="multi-label"):
        probe(path, path, ProbeConfig(model=model_dir, label_column="labels"), where=TRAIN, eval_where=TEST)


def test_fewshot(model_dir, colors):
    r = run(model_dir, colors, protocol="fff", fewshot_k=2, epochs=2)
    assert r["protocol"]["chosen"]["train_rows"] == 12
    r2 = run(model_dir, colors, fewshot_k=2, epochs=1)  # clip-benchmark: few-shot rows from the train part, no refit with val
    assert r2["protocol"]["chosen"]["train_rows"] == 12
    with pytest.raises(UsageError, match="fewer training rows"):
        run(model_dir, colors, protocol="fff", fewshot_k=7, epochs=1)


def test_train_and_eval_rows_must_be_disjoint(model_dir, colors):
    with pytest.raises(UsageError, match="both the training and the eval"):
        probe(colors, colors, ProbeConfig(model=model_dir), where=TRAIN, eval_where=[])


def test_one_class_in_the_training_rows_is_refused(model_dir, colors, tmp_path, cli):
    """Issue 44: one class in the training rows scored 100% beside a chance of 1/C; a probe needs 2 classes,
    in the rows selected and among the images that decode."""
    with pytest.raises(UsageError, match=r"hold 1 class \('red'\) of 'label'; a probe needs at least 2 classes"):
        probe(colors, colors, ProbeConfig(model=model_dir, epochs=1), where=[*TRAIN, "label=red"], eval_where=TEST)
    r = cli("probe", colors, "--where", "split=train", "--where", "label=red", "--eval-data", colors, "--eval-where", "split=test",
            "--model", model_dir, "--epochs", "1", "--out", tmp_path / "r.json", "--no-progress")
    assert r.exit_code == 2 and "a probe needs at least 2 classes" in r.stderr and not (tmp_path / "r.json").exists(), r.stderr
    # every image of the other classes undecodable: one class among the images that decode
    bad = make_colors(tmp_path / "bad", per_class=3, bad_rows=tuple(range(3, 18)))
    with pytest.raises(VltoolError, match=r"the training images .* that decode hold 1 class \('red'\)"):
        probe(bad, bad, ProbeConfig(model=model_dir, epochs=1, cache_dir=str(tmp_path / "c")), where=TRAIN, eval_where=TEST)


def test_validation_reports_every_problem(model_dir, colors):
    with pytest.raises(UsageError) as e:
        probe(colors, colors, ProbeConfig(model=model_dir, protocol="nope", features="mid", val_frac=1.5, fewshot_k=0))
    for part in ("--protocol 'nope'", "--features 'mid'", "--val-frac", "--fewshot-k"):
        assert part in str(e.value)
    with pytest.raises(UsageError, match="--val-frac must be > 0"):
        probe(colors, colors, ProbeConfig(model=model_dir, val_frac=0), where=TRAIN, eval_where=TEST)


def test_debias_options_a_probe_cannot_use_are_refused_before_any_work(model_dir, colors, tmp_path, monkeypatch):
    """--debias-text (a probe has no text) and --debias with pre-projection features are refused before any
    image is encoded (the second was refused after encoding; the first was accepted and did nothing)."""
    import vltool.encode

    subspace = tmp_path / "subspace"
    subspace.mkdir()
    monkeypatch.setattr(vltool.encode, "encode_images", lambda *a, **k: pytest.fail("encoded before refusing"))
    with pytest.raises(UsageError, match="a probe reads image features only"):
        probe(colors, colors, ProbeConfig(model=model_dir, debias=str(subspace), debias_text=True), where=TRAIN, eval_where=TEST)
    with pytest.raises(UsageError, match="use --features post with it"):
        probe(colors, colors, ProbeConfig(model=model_dir, debias=str(subspace), protocol="santurkar"), where=TRAIN, eval_where=TEST)


def test_linear_training_is_seeded_and_schedule_is_clip_benchmarks():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 4)).astype(np.float32), rng.integers(0, 3, 50)
    kw = dict(optimizer="adamw", lr=0.1, epochs=2, batch_size=8, weight_decay=0.0, schedule="cosine")
    a, b = train_linear(x, y, 3, seed=1, **kw), train_linear(x, y, 3, seed=1, **kw)
    assert all((p == q).all() for p, q in zip(a.parameters(), b.parameters()))
    assert cosine_lr(0.1, 0, 10) == 0.1 and cosine_lr(0.1, 5, 10) == pytest.approx(0.05)
    try:
        from clip_benchmark.metrics.linear_probe import cosine_lr as cb_cosine
    except ImportError:
        return

    class Opt:
        param_groups = [{"lr": 0}]

    opt = Opt()
    adjust = cb_cosine(opt, 0.1, 0.0, 40)
    for step in (0, 7, 39):
        adjust(step)
        assert opt.param_groups[0]["lr"] == pytest.approx(cosine_lr(0.1, step, 40))


def test_cli(cli, model_dir, colors):
    r = cli("probe", colors, "--where", "split=train", "--eval-data", colors, "--eval-where", "split=test", "--model", model_dir,
            "--protocol", "fff", "--epochs", "2", "--bootstrap", "10", "--json", "--no-progress")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["protocol"]["name"] == "fff"
    t = cli("probe", colors, "--where", "split=train", "--eval-data", colors, "--eval-where", "split=test", "--model", model_dir,
            "--protocol", "fff", "--epochs", "2", "--bootstrap", "10", "--no-progress")
    assert t.exit_code == 0 and "mean_per_class_recall" in t.stdout
    assert math.isfinite(json.loads(r.stdout)["metrics"]["top1"]["value"])


def test_clip_benchmark_splits_numbered_alike_are_not_one_set(tmp_path, cli):
    """CLIP_benchmark's converter numbers every split from s0000000: its train and test splits share every id
    and no image, so the probe trains on one and evaluates on the other; the same split twice is refused."""
    from tests.fixtures.clip_benchmark import make_cb_classification

    root = make_cb_classification(tmp_path / "cb")
    model = make_model(tmp_path / "run")
    common = ["--model", model, "--bootstrap", "0", "--cache-dir", tmp_path / "c", "--json"]
    r = cli("probe", root, "--split", "train", "--eval-data", root, "--eval-split", "test", *common)
    assert r.exit_code == 0, r.stderr
    r = cli("probe", root, "--split", "test", "--eval-data", root, "--eval-split", "test", *common)
    assert r.exit_code == 2 and "rows are in both the training and the eval data" in r.stderr


def test_rows_in_both_compares_images_across_splits_of_one_dataset(tmp_path):
    """Across two splits of one DatasetDict a shared id is one row only when the image bytes are the same;
    within one dataset (or across two datasets) the id alone decides."""
    import datasets

    from vltool.io import load_dataset, rows_in_both

    feats = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(), "label": datasets.Value("int64")})

    def split(images):
        return datasets.Dataset.from_dict({"id": ["x", "y"], "image": [{"bytes": b, "path": None} for b in images], "label": [0, 1]},
                                          features=feats)

    from tests.fixtures.eval_data import _png

    rng = np.random.default_rng(0)
    same, a, b = _png((1, 2, 3), rng), _png((200, 0, 0), rng), _png((0, 200, 0), rng)
    datasets.DatasetDict({"train": split([same, a]), "test": split([same, b])}).save_to_disk(str(tmp_path / "dd"))
    train = load_dataset(str(tmp_path / "dd"), split="train")
    test = load_dataset(str(tmp_path / "dd"), split="test")
    assert rows_in_both(train, test) == ["x"]  # y: the same id, another image
    assert rows_in_both(train, load_dataset(str(tmp_path / "dd"), split="train")) == ["x", "y"]
