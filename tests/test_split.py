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


def test_separate_parts_are_datasets_of_their_own(tmp_path, monkeypatch):
    """... and the --where selection's rows are not written anew before that (flatten_indices refused)."""
    from vltool.io import load_dataset

    def refuse(self, *a, **k):
        raise AssertionError("flatten_indices copied the selected rows")

    monkeypatch.setattr(datasets.Dataset, "flatten_indices", refuse)

    split("emoji", tmp_path / "h", SplitConfig(parts="x=0.25,y=0.75", by="base_id", separate=True), where=["split=test"])
    x = load_dataset(str(tmp_path / "h" / "x")).dataset
    y = load_dataset(str(tmp_path / "h" / "y")).dataset
    assert len(x) + len(y) == 669 and set(x["part"]) == {"x"} and not set(x["base_id"]) & set(y["base_id"])


@pytest.mark.parametrize("kind", ["text", "int", "float", "bool"])
def test_assign_column_equals_assign_parts(kind):
    """The command assigns parts by whole-column Arrow work (assign_column); the plain per-row assign_parts is
    its reference: equal parts for text groups (with a missing value, a literal "None", non-ASCII text that
    sorts by code point) and for numbers and booleans, grouped by their text as assign_parts does."""
    import random

    import numpy as np
    import pyarrow as pa

    from vltool.split import assign_column

    rng = random.Random(kind)
    pools = {"text": ["b", "a", "None", None, "é", "z", "Z", "ab", "日本", "10", "9"], "int": [3, 10, 2, -1, 100, 7],
             "float": [1.0, 0.5, 2.25, 10.0], "bool": [True, False]}
    values = [rng.choice(pools[kind]) for _ in range(200)]
    parts = [("x", 0.3), ("y", 0.5), ("z", 0.2)]
    for seed in (0, 1, 2):
        got, n_groups = assign_column(pa.chunked_array([values[:50], values[50:]]), parts, seed)
        want = assign_parts(values, parts, seed)
        assert [parts[k][0] for k in got] == want and n_groups == len(set(map(str, values)))
        assert len(set(want)) == min(3, n_groups)
    assert isinstance(got, np.ndarray)
