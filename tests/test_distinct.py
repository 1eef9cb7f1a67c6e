"""vltool.distinct: whether a column's values are all distinct, by sorted 64-bit hashes with an exact recheck,
against Arrow's hash table of every value (`duplicate_reference`), on hand-made and random columns."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from vltool import distinct
from vltool.distinct import duplicate, duplicate_reference, string_hashes
from vltool.io import duplicate_rows

CASES = [
    (["a", "b", "c"], (False, None)),
    (["a", "b", "a"], (True, "a")),
    (["", None], (False, None)),  # a null is not the empty string
    ([None, "x", None], (True, None)),
    (["", ""], (True, "")),
    (["abcdefgh", "abcdefgh"], (True, "abcdefgh")),  # exactly one word
    (["abcdefghijk", "abcdefghijl"], (False, None)),  # differ in the second word
    (["x" * 16, "x" * 17, "x" * 15], (False, None)),  # same bytes, lengths across a word boundary
    (["a\0", "a"], (False, None)),  # a trailing zero byte is a byte, not padding
    (["é", "e"], (False, None)),
    ([], (False, None)),
    (["solo"], (False, None)),
]


@pytest.mark.parametrize("values,expected", CASES)
def test_hand_made_columns(values, expected):
    for t in (pa.string(), pa.large_string()):
        col = pa.array(values, t)
        assert duplicate(col) == duplicate_reference(col) == expected


def test_binary_and_non_string_columns():
    assert duplicate(pa.array([b"\x00\x01", b"\x00\x02", b"\x00\x01"], pa.binary())) == (True, b"\x00\x01")
    assert duplicate(pa.array([3, 1, 2], pa.int64())) == (False, None)
    assert duplicate(pa.array([3, 1, 3], pa.int64())) == (True, 3)


def random_ids(rng: random.Random, n: int, repeats: int) -> list:
    alphabet = "ab\u00e9Z09/_-."
    ids = {"".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 3, 7, 8, 9, 15, 16, 17, 40])))
           for _ in range(n)}
    ids = sorted(ids)
    rng.shuffle(ids)
    for _ in range(repeats):
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(ids))
    return ids


@pytest.mark.parametrize("seed", range(6))
def test_random_columns_in_many_chunks_and_slices_equal_the_reference(monkeypatch, seed):
    """Chunked as a saved dataset is (a record batch per few rows), hashed a few rows per step, sliced at an
    offset: the same verdict and the same hashes as one array."""
    monkeypatch.setattr(distinct, "SLICE_ROWS", 37)
    rng = random.Random(seed)
    ids = random_ids(rng, 400, repeats=seed % 2)
    cuts = sorted(rng.sample(range(1, len(ids)), 20))
    col = pa.chunked_array([pa.array(ids[a:b]) for a, b in zip([0, *cuts], [*cuts, len(ids)])])
    got, ref = duplicate(col), duplicate_reference(col)
    assert got[0] == ref[0] == bool(seed % 2)
    if got[0]:
        assert ids.count(got[1]) > 1
    whole = string_hashes(pa.array(ids))
    assert np.array_equal(string_hashes(col), whole)
    assert np.array_equal(string_hashes(pa.array(["pad", *ids]).slice(1)), whole)  # an array with an offset
    equal = [ids.index(v) for v in ids]  # equal values hash equal
    assert np.array_equal(whole, whole[equal])


def test_a_hash_collision_is_decided_by_the_values(monkeypatch):
    """Every value hashing the same (as if all collided): the exact recheck still says distinct or names the
    repeated value."""
    monkeypatch.setattr(distinct, "_hash_strings", lambda arr: np.zeros(len(arr), np.uint64))
    assert duplicate(pa.array(["a", "b", "c"])) == (False, None)
    assert duplicate(pa.array(["a", "b", "c", "b"])) == (True, "b")


def test_different_values_hash_differently():
    """No collision among 200,000 distinct short ids (a weak mix of the words would collide here)."""
    ids = [f"r{i:09d}" for i in range(100_000)] + [f"{i:x}" for i in range(100_000, 200_000)]
    h = string_hashes(pa.array(ids))
    assert len(np.unique(h)) == len(ids)


def test_duplicate_rows_of_the_shard_index():
    """The shard index drops the rows whose id repeats an earlier row's (hashes from vltool.distinct)."""
    ids = pa.chunked_array([pa.array(["a", "b"]), pa.array(["a", "c", "b", "a"])])
    assert duplicate_rows(ids) == [2, 4, 5]
    assert duplicate_rows(pa.array(["x", "y"])) == []
