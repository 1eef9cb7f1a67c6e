"""Checks on the built-in ``emoji`` dataset (built by scripts/build_emoji.py)."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest

EMOJI_DIR = Path(__file__).resolve().parent.parent / "vltool" / "assets" / "emoji"
COLUMNS = {
    "id", "image", "caption", "captions", "label",
    "subgroup", "group", "gender", "base_id", "split",
}


@pytest.fixture(scope="module")
def ds():
    assert EMOJI_DIR.is_dir(), f"missing {EMOJI_DIR}; run scripts/build_emoji.py"
    return datasets.load_from_disk(str(EMOJI_DIR))


@pytest.fixture(scope="module")
def table(ds):
    """All non-image columns as Python lists (fast: no image decoding)."""
    return ds.remove_columns(["image"]).to_dict()


def test_rows_and_columns(ds):
    assert ds.num_rows == 3655
    assert set(ds.column_names) == COLUMNS


def test_features(ds):
    f = ds.features
    assert isinstance(f["image"], datasets.Image)
    for name in ("id", "caption", "subgroup", "group", "gender", "base_id", "split"):
        assert f[name] == datasets.Value("string"), name
    # datasets >= 4 spells Sequence(Value) as List(Value).
    assert f["captions"] == datasets.Sequence(datasets.Value("string"))
    label = f["label"]
    assert isinstance(label, datasets.ClassLabel)
    assert "face smiling" in label.names
    assert "sky and weather" in label.names
    assert label.names[0] == "face smiling"
    assert len(set(label.names)) == label.num_classes


def test_ids_unique(table):
    assert len(set(table["id"])) == len(table["id"])


def test_splits_by_base_id(table):
    splits_of: dict[str, set] = {}
    for base, split in zip(table["base_id"], table["split"]):
        splits_of.setdefault(base, set()).add(split)
    assert set(table["split"]) == {"train", "test"}
    assert all(len(s) == 1 for s in splits_of.values()), "base_id in both splits"
    n_test = sum(1 for s in splits_of.values() if s == {"test"})
    assert 0.15 <= n_test / len(splits_of) <= 0.25


def test_gender_values(table):
    assert set(table["gender"]) == {"", "man", "woman"}


def _row(table, **where):
    (key, value), = where.items()
    idx = table[key].index(value)
    return {k: v[idx] for k, v in table.items()}


def test_exact_rows(ds, table):
    names = ds.features["label"].names

    grin = _row(table, id="1f600")
    assert grin["caption"] == "grinning face"
    assert names[grin["label"]] == "face smiling"
    assert grin["subgroup"] == "face-smiling"
    assert grin["group"] == "Smileys & Emotion"
    assert grin["captions"][0] == "grinning face"
    assert "face" in grin["captions"][1:]
    assert grin["gender"] == ""

    tech = _row(table, id="1f468-200d-1f4bb")
    assert tech["caption"] == "man technologist"
    assert tech["gender"] == "man"
    neutral = _row(table, caption="technologist")
    assert neutral["gender"] == ""
    assert tech["base_id"] == neutral["base_id"]
    dark = _row(table, caption="woman technologist: dark skin tone")
    assert dark["gender"] == "woman"
    assert dark["base_id"] == neutral["base_id"]

    assert _row(table, caption="woman: blond hair")["gender"] == "woman"
    assert _row(table, caption="men holding hands")["gender"] == ""
    assert (
        _row(table, caption="men holding hands")["base_id"]
        == _row(table, caption="people holding hands")["base_id"]
    )
    assert (
        _row(table, caption="man gesturing NO")["base_id"]
        == _row(table, caption="person gesturing NO")["base_id"]
    )

    japan = _row(table, caption="flag: Japan")
    assert table["base_id"].count(japan["base_id"]) == 1


def test_images(ds):
    rng = np.random.default_rng(0)
    idxs = sorted({0, ds.num_rows - 1, *rng.choice(ds.num_rows, 40, replace=False).tolist()})
    for row in ds.select(idxs):
        img = row["image"]
        assert img.size == (64, 64)
        assert img.mode == "RGB"
        arr = np.asarray(img)
        assert (arr < 250).any(), f"{row['id']} is blank"
