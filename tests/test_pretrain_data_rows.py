"""vltool.pretrain.data's rows, without per-row Python work (issue 22): the training rows of a dataset on disk are checked,
filtered and keyed by whole-column Arrow work, never by formatting rows one by one in Python.

bench/bench_scale.py measures the time and memory this saves; these tests check the behaviour on tiny data
(no timings): what is computed is what the row-by-row code computed, and no row is formatted.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.fixtures.training import make_pairs
from vltool.errors import UsageError


def test_blank_text_test_equals_texts_of():
    from vltool.checks import has_text as _has_text
    from vltool.pretrain.data import texts_of

    strings = pa.chunked_array([["a", "", "  ", None, " b\t"], ["\u3000", "x", "\n"]])
    lists = pa.chunked_array([[["", "a"], [], None, ["  ", None]], [["z"], [" "]]])
    assert _has_text(strings, False).tolist() == [bool(texts_of(v, None)) for v in strings.to_pylist()]
    assert _has_text(lists, True).tolist() == [bool(texts_of(v, "first")) for v in lists.to_pylist()]


def test_blank_text_test_over_slices_of_many_chunks(monkeypatch):
    """has_text works TEXT_SLICE_ROWS rows at a time, across record batches: any slice size gives the
    row-by-row answer, for strings and lists, with slices that cut through batches."""
    import random

    import vltool.checks as checks
    from vltool.checks import has_text as _has_text
    from vltool.pretrain.data import texts_of

    rng = random.Random(0)
    pool = ["a", "", "  ", None, " b\t", "\u3000", "x y", "\n"]
    strings = pa.chunked_array([[rng.choice(pool) for _ in range(rng.randint(0, 7))] for _ in range(40)], type=pa.string())
    lists = pa.chunked_array([[rng.choice([None, [], [rng.choice(pool) for _ in range(rng.randint(0, 3))]])
                               for _ in range(rng.randint(0, 7))] for _ in range(40)], type=pa.list_(pa.string()))
    want_s = [bool(texts_of(v, None)) for v in strings.to_pylist()]
    want_l = [bool(texts_of(v, "first")) for v in lists.to_pylist()]
    for rows in (1, 5, 13, 1 << 20):
        monkeypatch.setattr(checks, "TEXT_SLICE_ROWS", rows)
        assert _has_text(strings, False).tolist() == want_s and _has_text(lists, True).tolist() == want_l


def test_load_train_data_formats_no_row(tmp_path, rows_formatted):
    """Checking ids, dropping rows without text and keying the rows read whole columns: no row is formatted
    (the row-by-row code formatted each row 3 times: ids twice and texts once)."""
    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_train_data

    data = make_pairs(tmp_path / "d", n=40, empty=(3, 17))
    other = make_pairs(tmp_path / "o", n=8, ids=[f"q{i}" for i in range(8)])
    rows_formatted.clear()  # (saving the fixtures formats batches)
    td = load_train_data([data], PretrainConfig())
    assert rows_formatted == []
    assert len(td.dataset) == 38 and td.rows_in == 40 and td.empty_text_ids == ["p3", "p17"]
    td = load_train_data([data, other], PretrainConfig(caption_sampling="random"))
    assert rows_formatted == [] and len(td.dataset) == 48  # the lists of captions are not empty in any row
    td = load_train_data([data, data], PretrainConfig(prefix_ids=True))
    assert rows_formatted == []  # the prefixed ids are an Arrow column beside the input's table
    assert td.ids[:2] == ["0:p0", "0:p1"] and td.ids[-1] == "1:p39" and len(td.ids) == 76


@pytest.fixture
def no_copied_rows(monkeypatch):
    """Fails a test that copies a selection's rows (datasets' flatten_indices, which add_column on a
    selection calls: it writes every selected row anew, images included)."""
    import datasets

    def refuse(self, *a, **k):
        raise AssertionError("flatten_indices copied the selected rows")

    monkeypatch.setattr(datasets.Dataset, "flatten_indices", refuse)


def test_prefixed_ids_and_positives_under_where_copy_no_row(tmp_path, no_copied_rows):
    """--prefix-ids on two inputs under --where: the ids and each row's mined positives are prefixed by whole-
    column Arrow work and the images stay the inputs' own (no selected row is copied); a missing list of
    positives is an empty one. Reference: the plain per-row prefixing."""
    import datasets

    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_train_data
    from vltool.pretrain.data.positives import _positive_rows, _positive_rows_reference

    paths = []
    for k, n in enumerate((12, 9)):
        ds = datasets.load_from_disk(make_pairs(tmp_path / f"raw{k}", n=n, empty=(3,)))
        pos = [None if i == 5 else [f"p{j}" for j in range(n) if j != i and j % 3 == i % 3] for i in range(n)]
        ds = ds.add_column("positives", pos).add_column("split", ["train" if i % 4 else "test" for i in range(n)])
        ds.save_to_disk(str(tmp_path / f"in{k}"))
        paths.append(str(tmp_path / f"in{k}"))
    cfg = PretrainConfig(loss="sigmoid", mined_positives=True, prefix_ids=True)
    td = load_train_data(paths, cfg, where=["split=train"])
    want_ids, want_pos, want_img = [], [], []
    for k, path in enumerate(paths):
        ds = datasets.load_from_disk(path).cast_column("image", datasets.Image(decode=False))
        for row in ds:
            if row["split"] == "train" and row["caption"]:
                want_ids.append(f"{k}:{row['id']}")
                want_pos.append([f"{k}:{p}" for p in (row["positives"] or [])])
                want_img.append(row["image"]["bytes"])
    got = td.dataset.cast_column("image", datasets.Image(decode=False))
    assert td.ids == want_ids and got["positives"] == want_pos and [i["bytes"] for i in got["image"]] == want_img
    assert td.empty_text_ids == ["0:p3", "1:p3"]  # the train rows without a caption, named with their prefix
    assert td.positives == _positive_rows_reference(td.dataset) == _positive_rows(td.dataset) and td.positives


def test_the_checked_rows_are_kept_under_the_inputs_fingerprints(tmp_path, monkeypatch):
    """load_train_data keeps its verdict (the rows without text of inputs whose ids passed) in the cache:
    the same inputs and filters again check nothing (the id count and the text test are not called) and
    give the same rows; another filter, another text column or another input is checked anew; duplicate
    ids are refused every time (no verdict is kept for them); an unreadable verdict is checked anew."""
    import datasets

    import vltool.pretrain.data.checks as data_mod
    from vltool.io import default_cache_dir
    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_train_data

    made = datasets.load_from_disk(make_pairs(tmp_path / "made", n=40, empty=(3, 17)))
    data = str(tmp_path / "d")
    made.add_column("split", ["train", "test"] * 20).save_to_disk(data)
    first = load_train_data([data], PretrainConfig())
    calls = []
    real_duplicate, real_has_text = data_mod.duplicate, data_mod.has_text
    monkeypatch.setattr(data_mod, "duplicate", lambda *a, **k: calls.append("ids") or real_duplicate(*a, **k))
    monkeypatch.setattr(data_mod, "has_text", lambda *a, **k: calls.append("texts") or real_has_text(*a, **k))

    again = load_train_data([data], PretrainConfig())
    assert calls == [] and again.ids == first.ids and again.empty_text_ids == first.empty_text_ids == ["p3", "p17"]
    assert again.rows_key == first.rows_key and again.rows_in == first.rows_in == 40
    tested = load_train_data([data], PretrainConfig(), where=["split=test"])
    assert calls == ["ids", "texts"] and tested.empty_text_ids == ["p3", "p17"] and len(tested.ids) == 18
    calls.clear()
    assert load_train_data([data], PretrainConfig(), where=["split=test"]).ids == tested.ids and calls == []
    load_train_data([data], PretrainConfig(caption_sampling="random"))
    assert calls == ["ids", "texts"]

    assert len(list((default_cache_dir() / data_mod.VERDICT_DIR).glob("*.npy"))) == 3
    for f in (default_cache_dir() / data_mod.VERDICT_DIR).glob("*.npy"):
        f.write_bytes(b"not a verdict")
    calls.clear()
    assert load_train_data([data], PretrainConfig()).ids == first.ids and calls == ["ids", "texts"]

    dup = make_pairs(tmp_path / "dup", n=8, ids=["a", "b", "c", "b", "e", "f", "g", "h"])
    for _ in range(2):
        with pytest.raises(UsageError, match="duplicate ids"):
            load_train_data([dup], PretrainConfig())


def test_positive_rows_equal_the_row_by_row_reference(monkeypatch, rows_formatted):
    """The mined positives' rows by Arrow's lookup equal the plain loop over rows (order kept, repeats kept,
    unknown ids and a row's own id ignored, rows without positives absent), for any slice size across
    record batches, and no row is formatted."""
    import random

    import datasets

    import vltool.pretrain.data.positives as data_mod

    rng = random.Random(0)
    n = 500
    ids = [f"r{i}" for i in rng.sample(range(2000), n)]
    listed = [None if rng.random() < 0.2 else [rng.choice(ids + ["zz", "yy"]) for _ in range(rng.randint(0, 5))] for _ in range(n)]
    for i in range(0, n, 50):
        listed[i] = [ids[i], ids[i]]  # only itself: no positive
    feats = datasets.Features({"id": datasets.Value("string"), "positives": datasets.List(datasets.Value("string"))})
    ds = datasets.concatenate_datasets(
        [datasets.Dataset.from_dict({"id": ids[a : a + 37], "positives": listed[a : a + 37]}, features=feats) for a in range(0, n, 37)])
    want = data_mod._positive_rows_reference(ds)
    assert 200 < len(want) < n and any(len(set(v)) < len(v) for v in want.values())
    rows_formatted.clear()
    for rows in (1, 7, 1 << 20):
        monkeypatch.setattr(data_mod, "SLICE_ROWS", rows)
        assert data_mod._positive_rows(ds) == want
    sub = ds.select(sorted(rng.sample(range(n), 300)))  # a selection (rows without text dropped): an indices mapping
    assert data_mod._positive_rows(sub) == data_mod._positive_rows_reference(sub) != {}
    assert rows_formatted == []


def test_duplicate_and_clashing_ids_are_named(tmp_path):
    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_train_data

    dup = make_pairs(tmp_path / "dup", n=8, ids=["a", "b", "c", "b", "e", "f", "g", "h"])
    with pytest.raises(UsageError, match="duplicate ids \\(e.g. 'b'\\)"):
        load_train_data([dup], PretrainConfig())
    one = make_pairs(tmp_path / "one", n=8, ids=[f"x{i}" for i in range(8)])
    two = make_pairs(tmp_path / "two", n=8, ids=[f"y{i}" for i in range(7)] + ["x5"])
    with pytest.raises(UsageError, match=f"id 'x5' is in both '{one}' and '{two}'"):
        load_train_data([one, two], PretrainConfig())


def _unicl_reference(config, where=()):
    """load_unicl_data row by row in Python, as it was before (the reference): (ids, texts, labels,
    templated, empty ids, rows in, dropped rows)."""
    import datasets

    from vltool.io import load_dataset

    specs = [(s, "label") for s in config.label_data] + [(s, "text") for s in config.text_data]
    classes, ids_out, texts_out, role_out, empty, dropped, rows_in = {}, [], [], [], [], [], 0
    for k, (spec_, role) in enumerate(specs):
        col = config.label_column if role == "label" else config.text_column
        ds = load_dataset(spec_, where=where, required=["id", "image", col]).dataset
        feat = ds.features[col]
        if role == "label" and isinstance(feat, datasets.ClassLabel):
            values = [None if v is None or v < 0 else feat.names[v] for v in ds[col]]
        else:
            values = ds[col]
        texts = [t if isinstance(t, str) and t.strip() else None for t in values]
        if role == "label":
            for t in texts:
                if t is not None and t not in classes:
                    classes[t] = len(classes)
        ids = [f"{k}:{i}" for i in ds["id"]] if config.prefix_ids and len(specs) > 1 else ds["id"]
        for j, (i, t) in enumerate(zip(ids, texts)):
            if t is None:
                empty.append(i)
                dropped.append(rows_in + j)
            else:
                ids_out.append(i), texts_out.append(t), role_out.append(role == "label")
        rows_in += len(ds)
    labels = [classes.get(t, -1) if lab else len(classes) + r for r, (t, lab) in enumerate(zip(texts_out, role_out))]
    return ids_out, texts_out, labels, role_out, empty, rows_in, dropped


@pytest.mark.parametrize("prefix", [False, True])
def test_unicl_data_equal_the_row_by_row_reference(tmp_path, rows_formatted, prefix, no_copied_rows):
    """UniCL's rows by whole-column work equal the row-by-row loader's: ids (prefixed or not), texts, labels
    (classes numbered in order of first appearance over two label inputs, a ClassLabel one with a missing
    label and a string one with a blank name, a name shared by both), which rows are templated, the rows
    without text dropped and named; under --where too, copying no selected row; and no row is formatted."""
    import datasets

    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_unicl_data

    base = datasets.load_from_disk(make_pairs(tmp_path / "base", n=30, empty=(4, 21)))
    names = ["red", "blue", "green", "cyan"]
    lab1 = base.select(range(10)).remove_columns(["caption", "captions"])
    lab1 = lab1.add_column("label", [2, 0, -1, 2, 3, 0, 1, 1, 3, 2]).cast_column("label", datasets.ClassLabel(names=names))
    lab2 = base.select(range(10, 20)).remove_columns(["caption", "captions"])
    lab2 = lab2.add_column("label", ["pink", "blue", "  ", "pink", None, "red", "gray", "blue", "pink", "teal"])
    txt = base.select(range(20, 30))
    paths = []
    for name, d in (("lab1", lab1), ("lab2", lab2), ("txt", txt)):
        d.add_column("split", ["train", "test"] * 5).save_to_disk(str(tmp_path / name))
        paths.append(str(tmp_path / name))
    cfg = PretrainConfig(arch="vltool-micro", loss="unicl", label_data=paths[:2], text_data=paths[2:], prefix_ids=prefix)
    for where in ((), ("split=train",)):
        got = load_unicl_data(cfg, where=where)
        ids, texts, labels, templated, empty, rows_in, dropped = _unicl_reference(cfg, where)
        assert got.ids == ids and got.dataset["_unicl_text"] == texts
        assert got.labels.tolist() == labels and got.templated.tolist() == templated
        assert got.empty_text_ids == empty and got.rows_in == rows_in
        assert got.rows_key == load_unicl_data(cfg, where=where).rows_key
    assert len(set(labels)) < len(labels) and -1 not in labels and sum(templated) == 7  # (under split=train)
    rows_formatted.clear()
    load_unicl_data(cfg)
    assert rows_formatted == []
    p0, p1 = ("0:", "1:") if prefix else ("", "")
    assert empty == [f"{p0}p2", f"{p1}p12", f"{p1}p14"]  # (train rows) lab1's missing label, lab2's blank and missing names


def test_unicl_duplicate_and_clashing_ids_are_named(tmp_path):
    import datasets

    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_unicl_data

    base = datasets.load_from_disk(make_pairs(tmp_path / "base", n=8, ids=["a", "b", "c", "b", "e", "f", "g", "h"]))
    base.select([0, 1, 2, 3]).save_to_disk(str(tmp_path / "dup"))
    base.select([4, 5, 6, 7]).save_to_disk(str(tmp_path / "ok"))
    base.select([0, 4]).save_to_disk(str(tmp_path / "clash"))
    cfg = dict(arch="vltool-micro", loss="unicl", label_column="caption")
    with pytest.raises(UsageError, match="duplicate ids .*'b'"):
        load_unicl_data(PretrainConfig(**cfg, text_data=[str(tmp_path / "dup")]))
    with pytest.raises(UsageError, match="id 'e' is in both"):
        load_unicl_data(PretrainConfig(**cfg, label_data=[str(tmp_path / "ok")], text_data=[str(tmp_path / "clash")]))
    ok = load_unicl_data(PretrainConfig(**cfg, label_data=[str(tmp_path / "ok")], text_data=[str(tmp_path / "clash")], prefix_ids=True))
    assert ok.ids == ["0:e", "0:f", "0:g", "0:h", "1:a", "1:e"]


def test_mined_positives_naming_no_row_are_refused(tmp_path):
    """Issue 44: `positives` listing ids that are no row's id (mined on other data, or keyed by the ids
    before --prefix-ids) were accepted and silently ignored. Ids of rows --where leaves out are still ignored
    (research hygiene); an id of no row at all is refused, naming one."""
    import datasets

    from vltool.errors import UsageError
    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_train_data

    paths = []
    for k, n in enumerate((12, 9)):
        ds = datasets.load_from_disk(make_pairs(tmp_path / f"raw{k}", n=n))
        pos = [[f"p{(i + 1) % n}"] for i in range(n)]
        ds = ds.add_column("positives", pos).add_column("split", ["train" if i % 4 else "test" for i in range(n)])
        ds.save_to_disk(str(tmp_path / f"in{k}"))
        paths.append(str(tmp_path / f"in{k}"))
    cfg = PretrainConfig(loss="sigmoid", mined_positives=True)
    assert load_train_data(paths[:1], cfg, where=["split=train"]).positives  # (test rows named: ignored, not refused)
    assert load_train_data(paths, PretrainConfig(loss="sigmoid", mined_positives=True, prefix_ids=True)).positives
    # mined on other data: an id of no row
    ds = datasets.load_from_disk(paths[0])
    ds.remove_columns(["positives"]).add_column("positives", [["p1"], ["zz9"]] + [[]] * 10).save_to_disk(str(tmp_path / "other"))
    with pytest.raises(UsageError, match=r"--mined-positives: 1 ids listed in 'positives' are not the id of any row of .* \(e.g. 'zz9'\)"):
        load_train_data([str(tmp_path / "other")], cfg)
    # keyed by the ids before --prefix-ids ('0:p1' is the row; 'p1' names nothing once the ids are prefixed)
    ds.remove_columns(["positives"]).add_column("positives", [["0:p1"]] + [[]] * 11).save_to_disk(str(tmp_path / "keyed"))
    with pytest.raises(UsageError, match=r"1 ids listed .* \(e.g. '0:0:p1'\) \(with --prefix-ids the ids are '<input index>:<id>'"):
        load_train_data([str(tmp_path / "keyed"), paths[1]], PretrainConfig(loss="sigmoid", mined_positives=True, prefix_ids=True))
