"""CLIP_benchmark's WebDataset layout through `vltool import`, and zero-shot / retrieval on it with the
dataset's own class names and templates (fixture shards written in tests/fixtures/clip_benchmark.py)."""

from __future__ import annotations

import io
import json
import tarfile

import datasets

from tests.fixtures.clip_benchmark import TEMPLATES, _tar, make_cb_classification, make_cb_retrieval
from tests.fixtures.eval_data import COLORS, make_model


def _written(root, split):
    """{key: (image bytes, class index)} of a split's shards, read back with tarfile."""
    out = {}
    for shard in sorted((root / split).glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return {k: (v["png"], int(v["cls"])) for k, v in out.items()}


def test_import_classification(tmp_path, cli):
    root = make_cb_classification(tmp_path / "wds_colors")
    r = cli("mine-positives", root, "--model", "m", "--out", tmp_path / "o")  # the layout where a command needs a dataset
    assert r.exit_code == 2 and f"vltool import {root} --out DATA" in r.stderr
    r = cli("import", root, "--out", tmp_path / "colors", "--json", "--no-progress")
    assert r.exit_code == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["format"] == "clip_benchmark" and stats["splits"] == {"test": 12, "train": 24} and stats["files"] == 4
    dd = datasets.load_from_disk(str(tmp_path / "colors"))
    for split in ("train", "test"):
        ds = dd[split].cast_column("image", datasets.Image(decode=False))
        assert ds.features["label"].names == list(COLORS)
        got = {i: (im["bytes"], lab) for i, im, lab in zip(ds["id"], ds["image"], ds["label"])}
        assert got == _written(root, split)
    assert (tmp_path / "colors" / "zeroshot_classification_templates.txt").read_text().splitlines() == TEMPLATES
    assert (tmp_path / "colors" / "classnames.txt").read_text().split() == list(COLORS)


def test_zeroshot_uses_the_datasets_own_templates(tmp_path, cli):
    root = make_cb_classification(tmp_path / "wds_colors")
    assert cli("import", root, "--out", tmp_path / "colors", "--no-progress").exit_code == 0
    model = make_model(tmp_path / "run")
    r = cli("zeroshot", tmp_path / "colors", "--split", "test", "--model", model, "--json", "--bootstrap", "0")
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["protocol"]["template_list"] == ["a photo of a {}.", "a {} square."]
    assert rec["protocol"]["templates"].endswith("zeroshot_classification_templates.txt")
    assert rec["classnames"] == list(COLORS) and rec["stats"]["rows_evaluated"] == 12
    # an explicit --templates wins; a dataset without the file gets `photo`
    r = cli("zeroshot", tmp_path / "colors", "--split", "test", "--model", model, "--json", "--bootstrap", "0", "--templates", "photo")
    assert json.loads(r.stdout)["protocol"]["template_list"] == ["a photo of a {}."]
    # the layout given directly: imported once into the cache, the same numbers, the spec as given
    cache = tmp_path / "cache"
    direct = [cli("zeroshot", root, "--split", "test", "--model", model, "--json", "--bootstrap", "0", "--cache-dir", cache) for _ in range(2)]
    assert all(d.exit_code == 0 for d in direct), direct[0].stderr
    assert "imported into" in direct[0].stderr and "imported into" not in direct[1].stderr
    got = json.loads(direct[1].stdout)
    assert got["metrics"] == rec["metrics"] and got["protocol"]["template_list"] == rec["protocol"]["template_list"]
    assert got["data"]["spec"] == str(root) and len(list((cache / "clip_benchmark").iterdir())) == 1


def test_import_retrieval_and_retrieve(tmp_path, cli):
    root = make_cb_retrieval(tmp_path / "wds_caps")
    assert cli("import", root, "--out", tmp_path / "caps", "--no-progress").exit_code == 0
    ds = datasets.load_from_disk(str(tmp_path / "caps"))["test"]
    assert ds["captions"][3] == ["a green square", "green thing 3"] and ds["caption"][3] == "a green square"
    model = make_model(tmp_path / "run")
    r = cli("retrieve", tmp_path / "caps", "--split", "test", "--text-column", "captions", "--model", model, "--json", "--bootstrap", "0")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["texts"] == 24


def test_retrieve_scores_a_clip_benchmark_set_on_every_caption_by_default(tmp_path, cli):
    """`vltool retrieve` on a CLIP_benchmark retrieval set without --text-column scored one caption per image
    (669 texts where CLIP_benchmark uses 2,675; issue 52). By default it uses every caption, given the layout
    directly or vltool's import of it, as CLIP_benchmark and `vltool benchmark` do; other data keeps caption."""
    root = make_cb_retrieval(tmp_path / "wds_caps")
    assert cli("import", root, "--out", tmp_path / "caps", "--no-progress").exit_code == 0
    model = make_model(tmp_path / "run")
    ev = ["--model", model, "--json", "--bootstrap", "0", "--cache-dir", tmp_path / "cache", "--no-progress"]
    explicit = json.loads(cli("retrieve", tmp_path / "caps", "--split", "test", "--text-column", "captions", *ev).stdout)
    for data in (tmp_path / "caps", root):
        r = cli("retrieve", data, "--split", "test", *ev)
        assert r.exit_code == 0, r.stderr
        rec = json.loads(r.stdout)
        assert rec["data"]["text_column"] == "captions" and rec["stats"]["texts"] == 24 and rec["options"]["text_column"] == "captions"
        assert rec["stats"]["texts_per_image"]["mean"] == 2.0 and rec["metrics"] == explicit["metrics"]
    datasets.load_from_disk(str(tmp_path / "caps"))["test"].save_to_disk(str(tmp_path / "plain"))  # (no import record: a user's data)
    rec = json.loads(cli("retrieve", tmp_path / "plain", *ev).stdout)
    assert rec["data"]["text_column"] == "caption" and rec["stats"]["texts"] == 12


def test_bad_samples_counted_and_bad_layouts_refused(tmp_path, cli):
    root = make_cb_classification(tmp_path / "wds", shards=1)
    _tar(root / "test" / "0.tar", [("a.png", b"x"), ("b.png", b"y"), ("b.cls", b"9")])  # a: no label; b: class 9 of 6
    (root / "test" / "nshards.txt").write_text("1")
    r = cli("import", root, "--out", tmp_path / "o", "--json", "--no-progress")
    assert r.exit_code == 2 and "names 6 classes, but 1 sample(s) of split 'test' have a class index beyond them" in r.stderr
    _tar(root / "test" / "0.tar", [("a.png", b"x"), ("b.png", b"y")])  # a, b: no label
    r = cli("import", root, "--out", tmp_path / "o", "--json", "--no-progress")
    assert r.exit_code == 1 and "split 'test'" in r.stderr and "no sample could be read" in r.stderr
    _tar(root / "test" / "0.tar", [("a.png", b"x"), ("c.png", b"z"), ("c.cls", b"1")])
    r = cli("import", root, "--out", tmp_path / "o", "--json", "--no-progress")
    assert r.exit_code == 0 and json.loads(r.stdout)["skipped"] == {"test: missing label": 1}
    (root / "test" / "nshards.txt").write_text("3")
    r = cli("import", root, "--out", tmp_path / "o2", "--no-progress")
    assert r.exit_code == 2 and "nshards.txt says 3 shards; missing 1.tar" in r.stderr
    (root / "test" / "nshards.txt").write_text("1")
    (root / "dataset_type.txt").write_text("segmentation")
    r = cli("import", root, "--out", tmp_path / "o2", "--no-progress")
    assert r.exit_code == 2 and "not one of classification, multilabel, retrieval" in r.stderr


def test_a_short_classnames_file_is_refused_not_evaluated_on_the_rest(tmp_path, cli):
    """classnames.txt naming 2 of the 6 classes: benchmark dropped the 8 samples of the other 4 as "missing
    label" (shown only in the cached copy's provenance) and printed zero-shot on the 4 left, against 2 class
    names, as the dataset's result. Refused, naming the file."""
    root = make_cb_classification(tmp_path / "wds_colors", per_class=(2, 2), shards=1)
    (root / "classnames.txt").write_text("red\ngreen\n")
    model = make_model(tmp_path / "run")
    r = cli("benchmark", "--model", model, "--datasets", root, "--tasks", "zeroshot", "--bootstrap", "0", "--no-progress")
    assert r.exit_code == 2, r.stdout
    assert f"{root / 'classnames.txt'} names 2 classes, but 8 sample(s) of split" in r.stderr and "have a class index beyond them" in r.stderr
    assert "Traceback" not in r.stderr and "top1" not in r.stdout


def test_multilabel(tmp_path, cli):
    import numpy as np

    root = tmp_path / "ml"
    (root / "test").mkdir(parents=True)
    (root / "dataset_type.txt").write_text("multilabel\n")
    (root / "classnames.txt").write_text("cat\ndog\nbird\n")
    buf = io.BytesIO()
    np.save(buf, np.array([1, 0, 1], dtype=np.int64))
    from tests.fixtures.eval_data import _png

    _tar(root / "test" / "0.tar", [("k.png", _png((1, 2, 3), np.random.default_rng(0))), ("k.npy", buf.getvalue())])
    (root / "test" / "nshards.txt").write_text("1\n")
    assert cli("import", root, "--out", tmp_path / "o", "--no-progress").exit_code == 0
    ds = datasets.load_from_disk(str(tmp_path / "o"))["test"]
    assert ds["labels"] == [[0, 2]] and ds.features["labels"].feature.names == ["cat", "dog", "bird"]


def test_a_second_command_waits_for_the_first_ones_import(tmp_path):
    """Two commands given the same CLIP_benchmark folder at once: the second waits while the first (another
    process) holds the cache copy's lock (it failed with "being written by another vltool process"), then
    reads the copy, or makes it when the first ended without one."""
    import os
    import subprocess
    import sys
    import threading
    import time

    from vltool.cache import EmbeddingCache
    from vltool.importer import CB_CACHE, _layout_digest, clip_benchmark_input

    root = make_cb_classification(tmp_path / "cb")
    cache = tmp_path / "cache"
    clip_benchmark_input(str(make_cb_classification(tmp_path / "warm", seed=1)), cache)  # imports done, so the wait below is the lock's
    dest = EmbeddingCache(cache).root / CB_CACHE / f"cb-{_layout_digest(root)}"
    holder = subprocess.Popen(  # the first command: holds the copy's lock, then dies without a copy
        [sys.executable, "-c", "import sys, time\nfrom vltool.io import check_output, output_scope\n"
         "with output_scope():\n    check_output(sys.argv[1], True)\n    print('locked', flush=True)\n    time.sleep(60)\n",
         str(dest)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert holder.stdout.readline().strip() == "locked"
    got: dict = {}

    def second():
        try:
            got["path"] = clip_benchmark_input(str(root), cache)
        except Exception as e:  # noqa: BLE001 (reported below)
            got["error"] = e

    t = threading.Thread(target=second)
    t.start()
    time.sleep(1.5)
    alive = t.is_alive()
    holder.kill()
    holder.wait()
    t.join(60)
    assert alive and "error" not in got, got  # it waited, and did not fail
    assert got["path"] == str(dest) and (dest / "dataset_dict.json").is_file()
