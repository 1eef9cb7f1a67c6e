"""vltool pick-caption: exact picks on a hand-made dataset."""

import datasets
import pytest
from typer.testing import CliRunner

from vltool.cli import app
from vltool.io import load_dataset
from vltool.pick_caption import PickConfig, pick_caption, row_rng


@pytest.fixture()
def multi(tmp_path):
    ds = datasets.Dataset.from_dict({
        "id": ["a", "b", "c"],
        "caption": ["red square", "blue", "green"],
        "captions": [["red square", "red", "a big red square"], ["blue"], ["green", "lime tone"]],
    })
    ds.save_to_disk(str(tmp_path / "multi"))
    return str(tmp_path / "multi")


@pytest.mark.parametrize("strategy,expected", [
    ("first", ["red square", "blue", "green"]),
    ("last", ["a big red square", "blue", "lime tone"]),
    ("longest", ["a big red square", "blue", "lime tone"]),
    ("shortest", ["red", "blue", "green"]),
])
def test_strategies(tmp_path, multi, strategy, expected):
    pick_caption(multi, tmp_path / "out", PickConfig(strategy=strategy))
    ds = load_dataset(str(tmp_path / "out")).dataset
    assert ds["caption"] == expected
    assert ds["caption_original"] == ["red square", "blue", "green"]


def test_exclude_caption_drops_rows_without_another_caption(tmp_path, multi):
    prov = pick_caption(multi, tmp_path / "out", PickConfig(strategy="first", exclude_caption=True))
    ds = load_dataset(str(tmp_path / "out")).dataset
    assert ds["id"] == ["a", "c"] and ds["caption"] == ["red", "lime tone"]
    assert prov["stats"]["dropped_no_candidate"] == 1 and prov["stats"]["dropped_ids"] == ["b"]


def test_random_pick_depends_on_seed_and_id_only(tmp_path, multi):
    pick_caption(multi, tmp_path / "all", PickConfig(seed=3))
    pick_caption(multi, tmp_path / "some", PickConfig(seed=3), where=["id=a"])
    a_all = load_dataset(str(tmp_path / "all")).dataset["caption"][0]
    assert load_dataset(str(tmp_path / "some")).dataset["caption"] == [a_all]
    assert a_all == row_rng(3, "a").choice(["red square", "red", "a big red square"])


def test_cli_errors_on_a_string_column(tmp_path, multi):
    r = CliRunner().invoke(app, ["pick-caption", multi, "--from", "caption", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "holds one string per row, not lists of strings" in r.output
    r = CliRunner().invoke(app, ["pick-caption", multi, "--strategy", "best", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--strategy" in r.output
