"""vltool.deform on a dataset on disk: the rows it drops and the columns it makes are not copied into memory."""

from __future__ import annotations

import pyarrow as pa

from tests.fixtures.training import make_pairs


def test_deform_drops_rows_without_copying_the_images(tmp_path):
    """deform writes the kept rows through an indices mapping over the input's memory-mapped table: the
    image column of its output is the input's (the same buffers, no copy), and what is written is exactly
    the selected rows that keep a text, with their own images."""
    import datasets

    from vltool.deform import DeformConfig, deform, deform_dataset
    from vltool.io import load_dataset

    caps = ["A man riding a red bike.", "The the the.", "Two cats play with a ball.", "The the the.", "A dog on a red couch."] * 4
    data = make_pairs(tmp_path / "d", n=20)
    ds = datasets.load_from_disk(data).remove_columns(["caption"]).add_column("caption", caps)
    ds.add_column("split", ["train", "test"] * 10).save_to_disk(str(tmp_path / "src"))
    src = load_dataset(str(tmp_path / "src"), where=["split=train"])
    out, stats = deform_dataset(src.dataset, DeformConfig(ops="rmstop", base_frac=0))

    def buffers(d):
        return [b.address for c in d.data.table.column("image").chunks for b in c.buffers() if b is not None]

    assert buffers(out) == buffers(src.dataset)
    deform(str(tmp_path / "src"), tmp_path / "out", DeformConfig(ops="rmstop", base_frac=0), where=["split=train"])
    written = datasets.load_from_disk(str(tmp_path / "out")).cast_column("image", datasets.Image(decode=False))
    source = {r["id"]: r for r in datasets.load_from_disk(str(tmp_path / "src")).cast_column("image", datasets.Image(decode=False))}
    expected = [i for k, i in enumerate(f"p{j}" for j in range(20)) if k % 2 == 0 and caps[k] != "The the the."]
    assert written["id"] == expected and stats["rows_out"] == len(expected) == 6
    for r in written:
        assert r["image"]["bytes"] == source[r["id"]]["image"]["bytes"] and r["caption_original"] == source[r["id"]]["caption"]
        assert r["split"] == "train" and r["caption"] and not r["is_base"]


def test_deform_spills_its_new_columns_to_a_memory_mapped_file(tmp_path, monkeypatch):
    """With a spill directory, deform's new columns (the deformed text, is_base) and the kept rows' indices
    are written TEXT_CHUNK rows at a time to Arrow files and memory-mapped back: the output is the same as
    with everything in memory, and Arrow's memory pool holds none of the new columns afterwards (in
    memory, it holds the whole deformed column). `deform` removes its spill directory when it is done."""
    import random

    import datasets

    import vltool.deform as D
    from vltool.deform import DeformConfig, deform, deform_dataset

    rng = random.Random(0)
    words = "a the red dog cat runs on of big small park street blue house".split()
    caps = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 40))) for _ in range(3000)] + ["the of a"] * 50
    src = datasets.Dataset.from_dict({"id": [f"r{i}" for i in range(len(caps))], "caption": caps})
    src.save_to_disk(str(tmp_path / "src"))
    ds = datasets.load_from_disk(str(tmp_path / "src"))
    cfg = DeformConfig(ops="shuffle,rmstop,basevocab,rmtopfreq3,keep8", seed=1)
    monkeypatch.setattr(D, "TEXT_CHUNK", 500)

    in_memory, stats = deform_dataset(ds, cfg)
    (tmp_path / "spill").mkdir()
    before = pa.total_allocated_bytes()
    spilled, spilled_stats = deform_dataset(ds, cfg, spill=tmp_path / "spill")
    held = pa.total_allocated_bytes() - before
    assert spilled.to_list() == in_memory.to_list() and spilled_stats == stats
    assert stats["rows_dropped_empty"] >= 50 and spilled._indices is not None
    deformed_bytes = in_memory.data.table.column("caption").nbytes
    assert deformed_bytes > 50_000 and held < deformed_bytes / 10, (held, deformed_bytes)
    assert sorted(p.name for p in (tmp_path / "spill").iterdir()) == ["columns.arrow", "indices.arrow"]

    deform(str(tmp_path / "src"), tmp_path / "out", cfg)
    assert datasets.load_from_disk(str(tmp_path / "out")).to_list() == in_memory.flatten_indices().to_list()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "spill", "src"]  # no spill left beside out


def test_deform_output_pickles_as_files_not_data(tmp_path):
    """save_to_disk with --num-proc pickles the dataset to its worker processes: deform's output must pickle
    as the input's files, the spill file and the operations on them, not as their data (wrapped in an
    in-memory table, 1M rows with images pickled 3.3 GB per worker and peaked at 8.7 GB). Here a 2 MB
    column of the input pickles in a few kB, with rows dropped and with a selection (--where) alike."""
    import pickle

    import datasets

    from vltool.deform import DeformConfig, deform_dataset
    from vltool.io import load_dataset

    n = 200
    caps = ["the the" if i % 7 == 0 else f"a red dog number {i} runs in the park" for i in range(n)]
    datasets.Dataset.from_dict({
        "id": [f"r{i}" for i in range(n)], "caption": caps, "blob": [bytes([i % 251]) * 10_000 for i in range(n)],
        "split": ["train", "test"] * (n // 2),
    }).save_to_disk(str(tmp_path / "src"))
    for where in ([], ["split=train"]):
        spill = tmp_path / f"spill{len(where)}"
        spill.mkdir()
        src = load_dataset(str(tmp_path / "src"), where=where)
        out, stats = deform_dataset(src.dataset, DeformConfig(ops="rmstop", base_frac=0), spill=spill)
        assert stats["rows_dropped_empty"] > 0 and out.data.nbytes > 2_000_000 // (1 + len(where))
        assert len(pickle.dumps(out.data)) < 50_000 and len(pickle.dumps(out._indices)) < 50_000
        assert pickle.loads(pickle.dumps(out.data)).to_pydict() == out.data.to_pydict()
