"""`vltool split`: whole groups per part, exact fractions of groups, seeded."""

import datasets
import pytest

from vltool.errors import UsageError
from vltool.split import SplitConfig, assign_parts, split


def test_groups_never_straddle_parts_and_fractions_are_exact():
    groups = [g for g in "abcdefghij" for _ in range(3)]
    parts = assign_parts(groups, [("x", 0.5), ("y", 0.5)], seed=0)
    by_group = {}
    for g, p in zip(groups, parts):
        by_group.setdefault(g, set()).add(p)
    assert all(len(v) == 1 for v in by_group.values())
    assert sorted(p.pop() for p in by_group.values()).count("x") == 5
    assert assign_parts(groups, [("x", 0.5), ("y", 0.5)], seed=0) == parts
    assert assign_parts(groups, [("x", 0.5), ("y", 0.5)], seed=1) != parts


def test_emoji_halves(tmp_path, cli):
    r = cli("split", "emoji", "--where", "split=train", "--by", "base_id", "--parts", "aligned=0.5,unaligned=0.5",
            "--out", tmp_path / "h")
    assert r.exit_code == 0, r.stderr
    ds = datasets.load_from_disk(str(tmp_path / "h")).select_columns(["base_id", "part", "split"])
    assert set(ds["split"]) == {"train"} and set(ds["part"]) == {"aligned", "unaligned"}
    a = set(b for b, p in zip(ds["base_id"], ds["part"]) if p == "aligned")
    u = set(b for b, p in zip(ds["base_id"], ds["part"]) if p == "unaligned")
    assert not a & u and abs(len(a) - len(u)) <= 1


@pytest.mark.parametrize("parts", ["a=0.5", "a=0.7,b=0.7", "a=x,b=0.5", "a=0.5,a=0.5"])
def test_bad_parts(parts):
    with pytest.raises(UsageError):
        SplitConfig(parts=parts).parsed()


def test_separate_parts_are_datasets_of_their_own(tmp_path):
    from vltool.io import load_dataset

    split("emoji", tmp_path / "h", SplitConfig(parts="x=0.25,y=0.75", by="base_id", separate=True), where=["split=test"])
    x = load_dataset(str(tmp_path / "h" / "x")).dataset
    y = load_dataset(str(tmp_path / "h" / "y")).dataset
    assert len(x) + len(y) == 669 and set(x["part"]) == {"x"} and not set(x["base_id"]) & set(y["base_id"])
