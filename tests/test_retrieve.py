"""`vltool retrieve`: the record, several captions per image, chance levels, bad rows, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fixtures.eval_data import make_colors, make_model
from vltool.errors import UsageError
from vltool.retrieve import RetrieveConfig, parse_recall_k, retrieval_chance_levels, retrieve


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_model(tmp_path_factory.mktemp("model") / "run"))


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return make_colors(tmp_path_factory.mktemp("data") / "colors")


def cfg(model_dir, **kw):
    return RetrieveConfig(model=model_dir, progress=False, **{"bootstrap": 50, **kw})


def test_record_and_reference(model_dir, colors, tmp_path):
    """The metrics equal a plain full-matrix computation on the cached embeddings."""
    from vltool.cache import EmbeddingCache
    from vltool.encode import encode_images, encode_texts
    from vltool.io import load_dataset
    from vltool.model import load_model

    r = retrieve(colors, cfg(model_dir, text_column="captions", cache_dir=str(tmp_path)), where=["split=test"], out=tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["metrics"] == r["metrics"]
    assert r["data"]["images"] == 12 and r["data"]["texts"] == 24 and r["command"] == "retrieve"
    m = load_model(model_dir)
    data = load_dataset(colors, where=["split=test"])
    img = encode_images(m, data, cache=EmbeddingCache(tmp_path), progress=False)
    txt = encode_texts(m, data, column="captions", cache=EmbeddingCache(tmp_path), progress=False)
    assert img.hit and txt.hit
    s = img.embeddings.astype(np.float64) @ txt.embeddings.astype(np.float64).T  # (12, 24)
    correct = txt.owner[None, :] == np.arange(12)[:, None]
    i_rank = np.array([1 + (s[i, ~correct[i]] > s[i, correct[i]].max()).sum() for i in range(12)])
    t_rank = np.array([1 + (s[np.arange(12) != txt.owner[t], t] > s[txt.owner[t], t]).sum() for t in range(24)])
    for k in (1, 5, 10):
        assert r["metrics"][f"image_to_text_R@{k}"]["value"] == pytest.approx(np.mean(i_rank <= k))
        assert r["metrics"][f"text_to_image_R@{k}"]["value"] == pytest.approx(np.mean(t_rank <= k))
    assert r["metrics"]["image_to_text_mean_rank"]["value"] == pytest.approx(i_rank.mean())
    assert r["metrics"]["text_to_image_median_rank"]["value"] == pytest.approx(np.median(t_rank))
    for e in r["metrics"].values():
        assert e["ci_low"] <= e["value"] + 1e-12 and e["value"] <= e["ci_high"] + 1e-12


def test_chance_levels():
    c = retrieval_chance_levels([1, 5], n_images=10, n_texts=20, per_image=np.full(10, 2))
    assert c["text_to_image_R@1"] == pytest.approx(0.1) and c["text_to_image_R@5"] == pytest.approx(0.5)
    assert c["image_to_text_R@1"] == pytest.approx(2 / 20)
    assert c["image_to_text_R@5"] == pytest.approx(1 - (18 * 17 * 16 * 15 * 14) / (20 * 19 * 18 * 17 * 16))
    assert c["text_to_image_mean_rank"] == pytest.approx(5.5) and c["image_to_text_mean_rank"] == pytest.approx(21 / 3)


def test_every_registered_metric_is_in_the_results_with_its_chance(model_dir, colors, tmp_path):
    from vltool.metrics import RETRIEVAL_METRICS

    r = retrieve(colors, cfg(model_dir, recall_k="1,3", cache_dir=str(tmp_path)), where=["split=test"])
    names = [name for m in RETRIEVAL_METRICS for name, _ in m.at([1, 3])]
    assert list(r["metrics"]) == names == list(r["chance"])
    assert all(r["metrics"][n]["chance"] == r["chance"][n] is not None for n in names)


def test_a_metric_declared_once_reaches_the_results(model_dir, colors, tmp_path, monkeypatch):
    """The issue's contributor change: one declaration in vltool.metrics.RETRIEVAL_METRICS (a mean reciprocal
    rank), and retrieve reports it with its interval and chance level; no second list of names to edit."""
    from vltool import metrics

    mrr = metrics.Metric("image_to_text_mrr", True, lambda it, qw, k: float(qw.image @ (1 / it.i2t_rank) / qw.image_sum),
                         lambda c, k: float(np.mean(1 / ((c.n_texts + 1) / (c.per_image + 1.0)))), "1/rank at random", "mean of 1/rank")
    monkeypatch.setattr(metrics, "RETRIEVAL_METRICS", (*metrics.RETRIEVAL_METRICS, mrr))
    r = retrieve(colors, cfg(model_dir, cache_dir=str(tmp_path)), where=["split=test"])
    e = r["metrics"]["image_to_text_mrr"]
    assert 0 < e["value"] <= 1 and e["ci_low"] <= e["value"] + 1e-12 <= e["ci_high"] + 2e-12
    assert e["chance"] == r["chance"]["image_to_text_mrr"] == pytest.approx(2 / 13)  # 12 images, a caption each: 1 / ((12 + 1) / 2)
    assert list(r["metrics"])[-1] == "image_to_text_mrr"


def test_bad_images_and_empty_caption_lists_are_left_out(model_dir, tmp_path):
    import datasets

    path = make_colors(tmp_path / "bad", per_class=2, bad_rows=(0,))
    ds = datasets.load_from_disk(path)
    caps = list(ds["captions"])
    caps[3] = []
    ds = ds.remove_columns("captions").add_column("captions", caps, feature=datasets.List(datasets.Value("string")))
    ds.save_to_disk(str(tmp_path / "bad2"))
    r = retrieve(str(tmp_path / "bad2"), cfg(model_dir, text_column="captions", cache_dir=str(tmp_path / "c")))
    assert r["stats"]["bad_images"] == 1 and r["stats"]["rows_without_text"] == 1
    assert r["data"]["images"] == 10 and r["data"]["texts"] == 20


def test_options_are_checked(model_dir, colors):
    assert parse_recall_k("10,1,5,5") == [1, 5, 10]
    with pytest.raises(UsageError) as e:
        retrieve(colors, RetrieveConfig(model=model_dir, recall_k="1,x", block_mb=0))
    assert "--recall-k" in str(e.value) and "--block-mb" in str(e.value)
    with pytest.raises(UsageError, match="no text column 'nope'|no column 'nope'"):
        retrieve(colors, cfg(model_dir, text_column="nope"))


def test_cli(cli, model_dir, colors, tmp_path):
    r = cli("retrieve", colors, "--model", model_dir, "--where", "split=test", "--recall-k", "1,2", "--bootstrap", "10",
            "--json", "--no-progress", "--cache-dir", tmp_path)
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert set(rec["metrics"]) == {
        "image_to_text_R@1", "image_to_text_R@2", "image_to_text_mean_rank", "image_to_text_median_rank",
        "text_to_image_R@1", "text_to_image_R@2", "text_to_image_mean_rank", "text_to_image_median_rank",
    }
    assert rec["options"]["cache_dir"] == str(tmp_path) and rec["stats"]["cache"]["images"]["hit"] is False
    t = cli("retrieve", colors, "--model", model_dir, "--where", "split=test", "--bootstrap", "10", "--no-progress", "--cache-dir", tmp_path)
    assert t.exit_code == 0 and "text_to_image_R@10" in t.stdout and "chance" in t.stdout


def test_seconds_to_first_batch_is_recorded_when_something_is_encoded(model_dir, colors, tmp_path):
    """The start-up before any encoding (docs/conventions.md, "Provenance"): recorded when the command encoded
    a batch, inside its wall time; absent when every embedding came from the cache."""
    first = retrieve(colors, cfg(model_dir, cache_dir=str(tmp_path / "c")), where=["split=test"], out=tmp_path / "a.json")
    assert 0 < first["seconds_to_first_batch"] <= first["wall_time_s"]
    again = retrieve(colors, cfg(model_dir, cache_dir=str(tmp_path / "c")), where=["split=test"], out=tmp_path / "b.json")
    assert "seconds_to_first_batch" not in again and json.loads((tmp_path / "b.json").read_text())["metrics"] == first["metrics"]


def test_ranks_on_the_gpu_the_model_encodes_on(model_dir, colors, tmp_path, monkeypatch):
    """retrieve hands retrieval_ranks the process's device (the CPU, or its GPU); the torch blocks give
    the plain numpy pass's metrics (here the 'GPU' is the CPU, through torch)."""

    import vltool.encode as enc
    import vltool.metrics as metrics

    seen = []
    real = metrics.retrieval_ranks

    def spy(*a, device="cpu", **k):
        seen.append(device)
        return real(*a, device="cpu" if isinstance(device, FakeGpu) else device, **k)

    class FakeGpu:
        type = "cuda"

    monkeypatch.setattr(metrics, "retrieval_ranks", spy)
    on_cpu = retrieve(colors, cfg(model_dir, cache_dir=str(tmp_path)), where=["split=test"])
    monkeypatch.setattr(enc, "encode_device", lambda: FakeGpu())
    on_gpu = retrieve(colors, cfg(model_dir, cache_dir=str(tmp_path)), where=["split=test"])
    monkeypatch.setattr(enc, "encode_device", lambda: None)  # None: the plain numpy pass
    plain = retrieve(colors, cfg(model_dir, cache_dir=str(tmp_path)), where=["split=test"])
    assert str(seen[0]) == "cpu" and isinstance(seen[1], FakeGpu) and seen[2] is None
    assert on_gpu["metrics"] == plain["metrics"] == on_cpu["metrics"]
