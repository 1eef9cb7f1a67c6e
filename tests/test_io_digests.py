"""vltool.io.digests: whole-column digests and the ids two inputs share, equal to their row-by-row forms."""

from __future__ import annotations


def test_column_digest_equals_ids_digest():
    """Encoding keys its cache entries' ids by an Arrow digest of the id column: the same digest as hashing
    each id in Python (so existing cache entries stay valid), for selections and non-string ids too."""
    import datasets

    from vltool.cache import ids_digest
    from vltool.io import column_digest, column_values

    ds = datasets.Dataset.from_dict({"id": ["a", "bé", "", "x" * 5], "n": [1, 2, 3, 4]})
    for d in (ds, ds.select([3, 0, 2]), ds.select([])):
        for col in ("id", "n"):
            assert column_digest(d, col) == ids_digest(column_values(d, col))
    assert ids_digest(["a", "b"]) == "8fb20ef63ced4145fc2e983ffe597d1dcff39154c3bf21f0fa9dde6a0c50fdc9"  # sha256(b"a\0b\0"): the digest's definition, unchanged


def test_shared_ids_of_train_and_eval_equal_the_set_intersection(rows_formatted):
    """pretrain's check that --eval-data rows are not training rows (and pseudolabel's, that no image is
    both aligned and unaligned): Arrow's set lookup gives the Python set intersection, either way round, and
    formats no row."""
    import random

    import datasets

    from vltool.io import shared_ids

    rng = random.Random(1)
    train_ids = [f"r{i}" for i in rng.sample(range(10_000), 3000)]
    eval_ids = [f"r{i}" for i in rng.sample(range(10_000), 300)]
    train = datasets.concatenate_datasets([datasets.Dataset.from_dict({"id": train_ids[a : a + 700]}) for a in range(0, 3000, 700)])
    evald = datasets.Dataset.from_dict({"id": eval_ids})
    assert shared_ids(train, evald) == shared_ids(evald, train) == sorted(set(train_ids) & set(eval_ids)) != []
    assert shared_ids(train, datasets.Dataset.from_dict({"id": ["x", "y"]})) == []
    assert rows_formatted == []
