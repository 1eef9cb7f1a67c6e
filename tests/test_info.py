"""`vltool info`: dataset statistics, model directories, and the provenance chain back to the import."""

from __future__ import annotations

import io
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from vltool.cli import app
from vltool.deform import DeformConfig, deform
from vltool.importer import ImportConfig, import_data
from vltool.info import InfoConfig, chain_lines, dataset_summary, info, safetensors_header
from vltool.io import BUILTIN_DATASETS

runner = CliRunner()


def info_json(*args: str) -> dict:
    r = runner.invoke(app, ["info", *args, "--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_summary_exact_numbers():
    ds = datasets.Dataset.from_dict(
        {
            "id": ["a", "b", "c", "d"],
            "caption": ["one", "two words", "", "a b c d"],
            "captions": [["one"], ["two words", "2"], [], ["x", "y", "z"]],
            "label": [0, 2, 2, 2],
            "positives": [[], ["a"], ["a", "b"], ["c"]],
        },
        features=datasets.Features({
            "id": datasets.Value("string"),
            "caption": datasets.Value("string"),
            "captions": datasets.List(datasets.Value("string")),
            "label": datasets.ClassLabel(names=["x", "y", "z"]),
            "positives": datasets.List(datasets.Value("string")),
        }),
    )
    s = dataset_summary(ds)
    assert s["rows"] == 4
    assert s["columns"] == {"id": "string", "caption": "string", "captions": "list<string>", "label": "class_label[3]", "positives": "list<string>"}
    assert s["caption_words"] == {"min": 0, "p5": 0.15, "median": 1.5, "mean": 1.75, "p95": 3.7, "max": 4}
    assert s["empty_captions"] == 1
    assert s["rows_with_several_captions"] == 2 and s["captions_total"] == 6
    assert s["rows_with_positives"] == 3 and s["rows_with_several_positives"] == 1
    assert s["labels"]["label"] == {"classes": 3, "classes_present": 2, "counts": [["z", 3], ["x", 1]]}
    sel = dataset_summary(ds.select([1, 3]))  # an indices mapping is honoured
    assert sel["rows"] == 2 and sel["labels"]["label"]["counts"] == [["z", 2]]


def test_info_emoji_and_deformed_copy(tmp_path):
    n = len(datasets.load_from_disk(str(BUILTIN_DATASETS["emoji"])))
    r = info_json("emoji")
    assert r["kind"] == "dataset" and r["rows"] == n
    assert r["columns"]["image"] == "image" and r["columns"]["label"].startswith("class_label[")
    assert sum(c for _, c in r["labels"]["label"]["counts"]) == n
    assert r["rows_with_several_captions"] > 0
    assert set(r["split_counts"]) == {"train", "test"}
    assert r["provenance"]["builtin"] == "emoji" and r["provenance"]["made_by"] is None

    deform("emoji", tmp_path / "bow", DeformConfig(ops="shuffle,keep4", base_frac=0.0), where=["split=test"])
    r = info_json(str(tmp_path / "bow"))
    chain = r["provenance"]
    assert chain["made_by"] == "deform" and chain["rows_out"] == r["rows"]
    (parent,) = chain["inputs"]
    assert parent["builtin"] == "emoji" and parent["where"] == ["split=test"] and parent["spec"] == "emoji"
    assert r["is_base_counts"] == {"False": r["rows"]}
    assert r["caption_words"]["max"] <= 4 and "caption_original_words" in r
    table = runner.invoke(app, ["info", str(tmp_path / "bow")])
    assert table.exit_code == 0
    assert "provenance" in table.stdout and "made by `deform`" in table.stdout and "the built-in 'emoji' dataset" in table.stdout


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (90, 10, 10)).save(buf, format="JPEG")
    return buf.getvalue()


def test_chain_back_to_the_import(tmp_path):
    (tmp_path / "a.jpg").write_bytes(_jpeg())
    (tmp_path / "t.csv").write_text("filepath,title\na.jpg,a red dog runs fast\na.jpg,the red dog sleeps\n")
    import_data(str(tmp_path / "t.csv"), tmp_path / "imported", ImportConfig())
    deform(str(tmp_path / "imported"), tmp_path / "d1", DeformConfig(ops="shuffle", base_frac=0.0))
    deform(str(tmp_path / "d1"), tmp_path / "d2", DeformConfig(ops="keep2", base_frac=0.0))
    r = info(str(tmp_path / "d2"))
    lines = chain_lines(r["provenance"])
    assert len(lines) == 4
    assert "made by `deform`" in lines[0] and lines[0].startswith(str(tmp_path / "d2"))
    assert lines[1].startswith("  ") and "made by `deform`" in lines[1]
    assert "made by `import`" in lines[2] and "rows 2 -> 2" in lines[2]
    assert lines[3].strip() == f"source {tmp_path / 't.csv'} (csv, 1 files)"
    # a moved input is reported, not followed
    import shutil

    shutil.move(str(tmp_path / "imported"), str(tmp_path / "moved"))
    r = info(str(tmp_path / "d2"))
    assert "missing" in chain_lines(r["provenance"])[2]


def _write_model(d: Path, data: Path | None = None) -> int:
    """A model directory as vltool's pretrain may write it: config.json, model.safetensors, vltool.json."""
    from safetensors.numpy import save_file

    tensors = {
        "visual.conv1.weight": np.zeros((8, 3, 4, 4), np.float32),
        "visual.proj": np.zeros((8, 16), np.float32),
        "transformer.resblocks.0.attn.in_proj_weight": np.zeros((24, 8), np.float32),
        "token_embedding.weight": np.zeros((100, 8), np.float32),
        "text_projection": np.zeros((8, 16), np.float32),
        "logit_scale": np.zeros((), np.float32),
    }
    d.mkdir(parents=True)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps({
        "embed_dim": 16,
        "vision_cfg": {"image_size": 16, "layers": 1, "width": 8, "patch_size": 4},
        "text_cfg": {"context_length": 12, "vocab_size": 100, "width": 8, "layers": 1},
    }))
    prov = {
        "command": "pretrain", "command_line": "vltool pretrain data --out run", "created": "2026-01-01T00:00:00+00:00",
        "options": {"epochs": 2, "lr": 0.001, "loss": "clip"},
        "inputs": [{"spec": str(data), "path": str(data), "rows": 2}] if data else [],
        "stats": {"final_loss": 1.25, "steps": 10}, "wall_time_s": 3.5,
    }
    (d.parent / "vltool.json").write_text(json.dumps(prov))
    return sum(int(np.prod(t.shape)) for t in tensors.values())


def test_model_directory(tmp_path):
    (tmp_path / "a.jpg").write_bytes(_jpeg())
    (tmp_path / "t.csv").write_text("filepath,title\na.jpg,one\n")
    import_data(str(tmp_path / "t.csv"), tmp_path / "data", ImportConfig())
    total = _write_model(tmp_path / "run" / "model", tmp_path / "data")
    assert safetensors_header(tmp_path / "run" / "model" / "model.safetensors")["__metadata__"] == {"format": "pt"}
    for path in (tmp_path / "run", tmp_path / "run" / "model"):  # RUN_DIR or RUN_DIR/model
        r = info_json(str(path))
        assert r["kind"] == "model" and r["parameters"] == total
        assert r["parameters_by_tower"] == {"image": 8 * 3 * 16 + 8 * 16, "other": 1, "text": 24 * 8 + 800 + 128}
        assert r["embedding_size"] == 16
        assert set(r["towers"]) == {"vision_cfg", "text_cfg"} and r["towers"]["vision_cfg"]["width"] == 8
        assert r["training"]["command"] == "pretrain" and r["training"]["stats"]["final_loss"] == 1.25
        assert r["training"]["data"][0]["path"] == str(tmp_path / "data")
        lines = chain_lines(r["provenance"])
        assert "made by `pretrain`" in lines[0] and "made by `import`" in lines[1]
    table = runner.invoke(app, ["info", str(tmp_path / "run")])
    assert table.exit_code == 0
    assert "embedding size" in table.stdout and "pretrain" in table.stdout and f"{total:,}" in table.stdout


def test_model_without_provenance_or_embed_key(tmp_path):
    from safetensors.numpy import save_file

    d = tmp_path / "m"
    d.mkdir()
    save_file({"model.visual.w": np.zeros((2, 3), np.float32), "model.text_projection": np.zeros((4, 5), np.float16)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text("{}")
    r = info(str(d))
    assert r["parameters"] == 26 and r["embedding_size"] == 5 and "training" not in r
    assert r["parameters_by_module"] == {"text_projection": 20, "visual": 6}  # the shared `model.` prefix dropped
    assert r["dtypes"] == {"F32": 6, "F16": 20}


def test_dataset_dict_split_and_errors(tmp_path):
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"id": ["a", "b"], "caption": ["x y", "z"]}),
        "test": datasets.Dataset.from_dict({"id": ["c"], "caption": ["w"]}),
    })
    dd.save_to_disk(str(tmp_path / "dd"))
    r = info_json(str(tmp_path / "dd"))
    assert {k: v["rows"] for k, v in r["splits"].items()} == {"train": 2, "test": 1}
    r = info_json(str(tmp_path / "dd"), "--split", "test")
    assert list(r["splits"]) == ["test"]
    res = runner.invoke(app, ["info", str(tmp_path / "dd"), "--split", "val"])
    assert res.exit_code == 2 and "train" in res.stderr
    res = runner.invoke(app, ["info", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "does not exist" in res.stderr
    (tmp_path / "plain").mkdir()
    res = runner.invoke(app, ["info", str(tmp_path / "plain")])
    assert res.exit_code == 2 and "neither a dataset" in res.stderr
    with pytest.raises(Exception, match="max-labels"):
        InfoConfig(max_labels=-1).validate()


def test_info_on_an_export(tmp_path):
    from vltool.export import ExportConfig, export

    export("emoji", tmp_path / "wds", ExportConfig(), where=["label=face smiling"])
    r = info_json(str(tmp_path / "wds"))
    assert r["kind"] == "output" and r["command"] == "export"
    assert r["provenance"]["inputs"][0]["builtin"] == "emoji"
    # shards imported back: the chain goes through the export to the built-in data
    import_data(str(tmp_path / "wds" / "*.tar"), tmp_path / "back", ImportConfig())
    lines = chain_lines(info(str(tmp_path / "back"))["provenance"])
    assert [line.strip().split(":")[0].split(" (")[0] for line in lines] == [
        str(tmp_path / "back"), f"source {tmp_path / 'wds' / '*.tar'}", str(tmp_path / "wds"), "emoji --where label=face smiling"]
    assert "made by `export`" in lines[2] and "the built-in 'emoji' dataset" in lines[3]


def test_info_names_the_damage_of_a_cache_entry(cli, tmp_path):
    """`vltool info` on an embedding-cache entry whose .npy was cut in half described it and said nothing of the
    damage (issue 53). It reads the array's header and size (no load) and says what is wrong."""
    import numpy as np

    from vltool.cache import CacheKey, EmbeddingCache

    cache = EmbeddingCache(tmp_path)
    k = CacheKey(model="m", dataset="d", rows={"split": None, "where": []}, column="image", preprocessing={})
    npy = cache.put(k, np.ones((64, 16), dtype=np.float32))
    meta = cache.paths(k)[1]
    r = cli("info", meta)
    assert r.exit_code == 0 and "damaged" not in r.stdout, r.stdout
    whole = npy.read_bytes()
    for damage, says in ((whole[: len(whole) // 2], "cut short"), (b"not numpy", "not a .npy file")):
        npy.write_bytes(damage)
        r = cli("info", meta)
        assert r.exit_code == 0 and "damaged: its array" in r.stdout and says in r.stdout, r.stdout
        assert cache.get(k) is None  # (and the cache agrees: a miss)
    np.save(npy, np.ones((64, 8), dtype=np.float32))
    assert "holds float32 [64, 8], its description says float32 [64, 16]" in cli("info", meta).stdout
    npy.unlink()
    assert "its array" in cli("info", meta).stdout and "is missing" in cli("info", meta).stdout


# ---- one answer each, for scripts (recipes/common.sh asks these instead of running Python of its own)


def test_select_prints_the_arguments_that_select_a_split(cli, tmp_path):
    from tests.fixtures.clip_benchmark import make_cb_classification

    dd = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"id": ["a"]}), "test": datasets.Dataset.from_dict({"id": ["b"]})}).save_to_disk(str(dd))
    datasets.Dataset.from_dict({"id": ["a"], "caption": ["x"]}).save_to_disk(str(tmp_path / "whole"))
    cb = make_cb_classification(tmp_path / "cb")
    for path, split, expect in (("emoji", "test", "--where\nsplit=test\n"), (str(dd), "test", "--split\ntest\n"),
                                (str(cb), "train", "--split\ntrain\n"), (str(tmp_path / "whole"), "test", "")):
        r = cli("info", path, "--select", split)
        assert r.exit_code == 0 and r.stdout == expect, (path, r.stdout, r.stderr)
    r = cli("info", str(cb), "--select", "val")
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {cb} has no 'val' split (its splits: test, train)"
    r = cli("info", str(tmp_path / "nothing"), "--select", "test")
    assert r.exit_code == 2 and "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_require_column_answers_by_the_exit_status(cli, tmp_path):
    from tests.fixtures.clip_benchmark import make_cb_classification, make_cb_retrieval

    cls, ret = make_cb_classification(tmp_path / "cls"), make_cb_retrieval(tmp_path / "ret")
    for path, column in (("emoji", "label"), ("emoji", "captions"), (str(cls), "label"), (str(ret), "captions"), (str(ret), "caption")):
        r = cli("info", path, "--require", f"column={column}")
        assert r.exit_code == 0 and r.stdout == "", (path, column, r.stderr)
    r = cli("info", str(ret), "--require", "column=label")
    assert r.exit_code == 1 and r.stderr.strip() == f"error: {ret} has no column 'label' (its columns: caption, captions, image)"
    r = cli("info", "emoji", "--require", "column=label", "--require", "column=nosuch")  # every one must hold
    assert r.exit_code == 1 and "no column 'nosuch'" in r.stderr
    r = cli("info", "emoji", "--require", "label")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --require label: expected column=NAME"


def test_get_prints_a_value_of_the_record(cli, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "vltool.json").write_text(json.dumps({"stats": {"steps": 7, "loss": 0.25, "name": "a b", "frozen": {"image": True}}}))
    for key, expect in (("stats.steps", "7\n"), ("stats.loss", "0.25\n"), ("stats.name", "a b\n"), ("stats.frozen", '{"image": true}\n')):
        r = cli("info", str(tmp_path / "run"), "--get", key)
        assert r.exit_code == 0 and r.stdout == expect, (key, r.stdout, r.stderr)
    r = cli("info", str(tmp_path / "run"), "--get", "stats.nosuch")
    assert r.exit_code == 1 and r.stderr.strip() == f"error: {tmp_path / 'run'}/vltool.json has no stats.nosuch"


def test_shipped_towers_and_the_auto_device_take_no_path(cli, monkeypatch):
    import importlib.util
    import os

    import torch

    from vltool.info import SHIPPED

    for name, (package, inner) in SHIPPED.items():
        r = cli("info", "--shipped", name)
        assert r.exit_code == 0, r.stderr
        assert r.stdout == os.path.join(os.path.dirname(importlib.util.find_spec(package).origin), *inner.split("/")) + "\n"
        assert Path(r.stdout.strip()).exists()
    r = cli("info", "--shipped", "resnet50")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --shipped resnet50: not a shipped tower (they are: mobilenet_v2, all-MiniLM-L6-v2)"
    assert cli("info", "--auto-device").stdout == ("cuda\n" if torch.cuda.is_available() else "cpu\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli("info", "--auto-device").stdout == "cuda\n"
    r = cli("info", "emoji", "--auto-device")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --auto-device takes no PATH (got emoji)"
    r = cli("info", "emoji", "--select", "test", "--get", "stats.steps")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --select and --get: give one question at a time"
    r = cli("info")
    assert r.exit_code == 2 and "give PATH" in r.stderr


def test_the_clip_benchmark_layout_is_recognised_in_one_place(tmp_path, monkeypatch):
    """describe_data (check-study, info --select), retrieve's default texts and the evaluations' import of a
    layout given directly all ask importer.clip_benchmark.clip_benchmark_layout."""
    from tests.fixtures.clip_benchmark import make_cb_retrieval
    from vltool.importer import clip_benchmark
    from vltool.retrieve import default_text_column
    from vltool.study import describe_data

    ret = make_cb_retrieval(tmp_path / "ret")
    assert describe_data(str(ret)).kind == "clip_benchmark" and default_text_column(str(ret)) == "captions"
    assert clip_benchmark.clip_benchmark_input(str(tmp_path / "nothing"), tmp_path / "cache") == str(tmp_path / "nothing")
    monkeypatch.setattr(clip_benchmark, "clip_benchmark_layout", lambda spec: None)  # the one test says no: all three agree
    assert default_text_column(str(ret)) == "caption"
    assert clip_benchmark.clip_benchmark_input(str(ret), tmp_path / "cache") == str(ret)
    from vltool.study import Refused

    with pytest.raises(Refused):
        describe_data(str(ret))
