"""`vltool export`: WebDataset shards and open_clip's CSV layout, read back sample by sample; a
smoke test trains open_clip one step on the shards where its training extras are installed."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import datasets
import pytest
from PIL import Image
from typer.testing import CliRunner

from vltool.cli import app
from vltool.export import ExportConfig, encode_image, export
from vltool.importer import ImportConfig, import_data

runner = CliRunner()


def _bytes(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def make_dataset(path: Path, ids=("a1", "b2", "c3", "d4", "e5")) -> datasets.Dataset:
    """Five rows: JPEG, transparent PNG, opaque PNG images; several captions; a ClassLabel; a passthrough column."""
    rgba = Image.new("RGBA", (12, 10), (255, 0, 0, 255))
    rgba.paste((0, 0, 0, 0), (0, 0, 6, 10))  # the left half transparent: composited on white
    images = [
        _bytes(Image.new("RGB", (16, 8), (10, 200, 30)), "JPEG"),
        _bytes(rgba, "PNG"),
        _bytes(Image.new("RGB", (9, 9), (0, 0, 250)), "PNG"),
        _bytes(Image.new("L", (7, 5), 128), "JPEG"),
        _bytes(Image.new("RGB", (16, 8), (1, 2, 3)), "JPEG"),
    ]
    feats = datasets.Features({
        "id": datasets.Value("string"),
        "image": datasets.Image(),
        "caption": datasets.Value("string"),
        "captions": datasets.List(datasets.Value("string")),
        "label": datasets.ClassLabel(names=["cat", "dog"]),
        "split": datasets.Value("string"),
    })
    ds = datasets.Dataset.from_dict({
        "id": list(ids),
        "image": [{"bytes": b, "path": None} for b in images],
        "caption": ["a green box", "a red tile", "a blue square", "grey", "ünïcödé caption"],
        "captions": [["a green box", "green"], ["a red tile"], ["a blue square", "blue", "square"], ["grey"], ["ünïcödé caption"]],
        "label": [0, 1, 1, 0, 1],
        "split": ["train", "train", "test", "train", "test"],
    }, features=feats)
    ds.save_to_disk(str(path))
    return ds


def read_shards(out: Path) -> list[dict]:
    """Every sample of OUT/*.tar, with the webdataset package when installed, else tarfile."""
    urls = sorted(str(p) for p in out.glob("*.tar"))
    if importlib.util.find_spec("webdataset") is not None:
        import webdataset as wds

        return [dict(s) for s in wds.WebDataset(urls, shardshuffle=False)]
    samples: list[dict] = []
    for url in urls:
        with tarfile.open(url) as tar:
            for m in tar.getmembers():
                key, _, ext = m.name.partition(".")
                if not samples or samples[-1]["__key__"] != key:
                    samples.append({"__key__": key})
                samples[-1][ext] = tar.extractfile(m).read()
    return samples


def test_webdataset_round_trip(tmp_path):
    src = make_dataset(tmp_path / "data")
    out = tmp_path / "wds"
    r = runner.invoke(app, ["export", str(tmp_path / "data"), "--to", "webdataset", "--out", str(out), "--shard-size", "2", "--json"])
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["rows_out"], s["shards"], s["keys_from"], s["images_reencoded"]) == (5, 3, "id", 2)
    assert s["train_data"] == f"{out.resolve()}/{{00000..00002}}.tar"
    assert sorted(p.name for p in out.iterdir()) == ["00000.tar", "00001.tar", "00002.tar", "sizes.json", "vltool.json"]
    assert json.loads((out / "sizes.json").read_text()) == {"00000.tar": 2, "00001.tar": 2, "00002.tar": 1}

    samples = read_shards(out)
    assert [x["__key__"] for x in samples] == src["id"]
    raw = src.cast_column("image", datasets.Image(decode=False))
    for i, x in enumerate(samples):
        assert set(k for k in x if not k.startswith("__")) == {"jpg", "txt", "json"}
        assert x["txt"].decode() == src[i]["caption"]
        meta = json.loads(x["json"])
        assert meta["id"] == src[i]["id"] and meta["captions"] == src[i]["captions"] and meta["split"] == src[i]["split"]
        assert meta["label"] == src[i]["label"] and meta["label_name"] == ["cat", "dog"][src[i]["label"]]
        img = Image.open(io.BytesIO(x["jpg"]))
        assert img.format == "JPEG" and img.size == src[i]["image"].size
        if Image.open(io.BytesIO(raw[i]["image"]["bytes"])).format == "JPEG":
            assert x["jpg"] == raw[i]["image"]["bytes"]  # JPEG sources copied byte for byte
    red = Image.open(io.BytesIO(samples[1]["jpg"])).convert("RGB")
    assert min(red.getpixel((1, 5))) > 235  # transparent pixels are white, not black
    r_, g_, b_ = red.getpixel((10, 5))
    assert r_ > 200 and g_ < 60 and b_ < 60

    # ... and `vltool import` reads the shards back into the same rows
    back = import_data(str(out / "{00000..00002}.tar"), tmp_path / "back", ImportConfig())
    assert back["stats"]["rows_out"] == 5 and back["stats"]["skipped"] == {}
    ds = datasets.load_from_disk(str(tmp_path / "back"))
    assert ds["id"] == src["id"] and ds["caption"] == src["caption"] and ds["captions"] == src["captions"]
    assert [im.size for im in ds["image"]] == [im.size for im in src["image"]]


def test_export_num_proc_and_determinism(tmp_path):
    make_dataset(tmp_path / "data")
    a = export(str(tmp_path / "data"), tmp_path / "a", ExportConfig(shard_size=2))
    b = export(str(tmp_path / "data"), tmp_path / "b", ExportConfig(shard_size=2, num_proc=2))
    assert a["stats"]["rows_out"] == b["stats"]["rows_out"] == 5
    for name in ("00000.tar", "00001.tar", "00002.tar", "sizes.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_unsafe_ids_use_row_numbers_and_png(tmp_path):
    make_dataset(tmp_path / "data", ids=("x.1", "x/2", "x 3", "x4", "x5"))
    s = export(str(tmp_path / "data"), tmp_path / "wds", ExportConfig(image_format="png"), where=["split=train"])["stats"]
    assert (s["rows_in"], s["rows_out"], s["keys_from"]) == (3, 3, "row number")
    samples = read_shards(tmp_path / "wds")
    assert [x["__key__"] for x in samples] == ["000000000", "000000001", "000000002"]
    assert [json.loads(x["json"])["id"] for x in samples] == ["x.1", "x/2", "x4"]
    assert all(Image.open(io.BytesIO(x["png"])).format == "PNG" for x in samples)
    assert Image.open(io.BytesIO(samples[1]["png"])).mode == "RGBA"  # png keeps the alpha channel
    import_data(str(tmp_path / "wds"), tmp_path / "back", ImportConfig())
    assert datasets.load_from_disk(str(tmp_path / "back"))["id"] == ["x.1", "x/2", "x4"]  # ids from the .json


def test_csv_layout_round_trip(tmp_path):
    src = make_dataset(tmp_path / "data")
    out = tmp_path / "csv"
    r = runner.invoke(app, ["export", str(tmp_path / "data"), "--to", "csv", "--out", str(out), "--shard-size", "3"])
    assert r.exit_code == 0, r.stderr
    assert "--dataset-type csv" in r.stdout
    lines = (out / "data.csv").read_text().splitlines()
    assert lines[0] == "filepath\ttitle\tid\tlabel"
    rows = [line.split("\t") for line in lines[1:]]
    assert [row[2] for row in rows] == src["id"] and [row[1] for row in rows] == src["caption"]
    assert [row[3] for row in rows] == ["cat", "dog", "dog", "cat", "dog"]
    assert rows[0][0] == str(out.resolve() / "images" / "00000" / "a1.jpg")
    assert rows[4][0] == str(out.resolve() / "images" / "00001" / "e5.jpg")
    assert all(Path(row[0]).is_file() for row in rows)
    import_data(str(out / "data.csv"), tmp_path / "back", ImportConfig())
    ds = datasets.load_from_disk(str(tmp_path / "back"))
    assert ds["id"] == src["id"] and ds["caption"] == src["caption"]


def test_csv_captions_with_line_breaks_read_back_whole(tmp_path):
    """`export --to csv` of a caption holding a line break: `vltool import` read 59 of 60 rows back, and
    open_clip's reader (pandas.read_csv with sep) split a lone carriage return into a row (issue 44)."""
    import pandas as pd

    src = make_dataset(tmp_path / "data")
    captions = ["two\nlines", "dos\r\nlines", "a lone\rreturn", 'a "quote"\tand a tab', "plain"]
    src.remove_columns("caption").add_column("caption", captions).save_to_disk(str(tmp_path / "data2"))
    out = tmp_path / "csv"
    r = runner.invoke(app, ["export", str(tmp_path / "data2"), "--to", "csv", "--out", str(out)])
    assert r.exit_code == 0, r.stderr
    back = pd.read_csv(out / "data.csv", sep="\t")  # open_clip_train.data.CsvDataset
    assert list(back["title"]) == captions and list(back["id"]) == src["id"]
    r = runner.invoke(app, ["import", str(out / "data.csv"), "--out", str(tmp_path / "back")])
    assert r.exit_code == 0, r.stderr
    ds = datasets.load_from_disk(str(tmp_path / "back"))
    assert ds["id"] == src["id"] and ds["caption"] == captions


def test_export_emoji_subset_and_errors(tmp_path):
    from vltool.io import load_dataset

    n = load_dataset("emoji", where=["label=face smiling"]).rows
    out = tmp_path / "e"
    r = runner.invoke(app, ["export", "emoji", "--out", str(out), "--where", "label=face smiling", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["rows_out"] == n == sum(json.loads((out / "sizes.json").read_text()).values())
    r = runner.invoke(app, ["export", "emoji", "--out", str(out), "--where", "label=face smiling"])
    assert r.exit_code == 2 and "--overwrite" in r.stderr
    r = runner.invoke(app, ["export", "emoji", "--out", str(tmp_path / "x"), "--to", "zip"])
    assert r.exit_code == 2 and "webdataset or csv" in r.stderr
    assert not (tmp_path / "x").exists()


def test_encode_image_reencodes_only_when_needed():
    jpg = _bytes(Image.new("RGB", (4, 4)), "JPEG")
    assert encode_image(jpg, "jpg") == (jpg, False)
    data, changed = encode_image(jpg, "png")
    assert changed and Image.open(io.BytesIO(data)).format == "PNG"


# open_clip_train needs its training extras (webdataset<=0.2.86, braceexpand, pandas); skip without them.
def _open_clip_train_missing() -> str | None:
    for mod in ("open_clip_train", "webdataset", "braceexpand", "pandas"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    from importlib.metadata import version

    major_minor = tuple(int(x) for x in version("webdataset").split(".")[:2])
    if major_minor >= (1, 0):
        return f"open_clip_train needs webdataset<=0.2.86 (installed: {version('webdataset')})"
    return None


TINY_OPEN_CLIP = {
    "model_cfg": {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    },
    "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]},
}


@pytest.mark.skipif(_open_clip_train_missing() is not None, reason=str(_open_clip_train_missing()))
def test_open_clip_trains_one_step_on_exported_shards(tmp_path):
    make_dataset(tmp_path / "data")
    s = export(str(tmp_path / "data"), tmp_path / "wds", ExportConfig(), where=["split!=test"])["stats"]
    assert s["rows_out"] == 3
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "open_clip_config.json").write_text(json.dumps(TINY_OPEN_CLIP))
    cmd = [
        sys.executable, "-m", "open_clip_train.main",
        "--dataset-type", "webdataset", "--train-data", s["train_data"],  # no --train-num-samples: sizes.json
        "--model", f"local-dir:{model}", "--batch-size", "3", "--epochs", "1", "--workers", "0",
        "--device", "cpu", "--precision", "fp32", "--lr", "1e-4", "--warmup", "0",
        "--logs", str(tmp_path / "logs"), "--name", "smoke", "--report-to", "", "--save-frequency", "0", "--seed", "0",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    log = (tmp_path / "logs" / "smoke" / "out.log")
    text = log.read_text() if log.is_file() else ""
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Train Epoch: 0 [3/3 (100%)]" in text, text[-3000:]
    assert "Loss:" in text
