"""vltool pick-caption: exact picks on a hand-made dataset."""

import datasets
import pytest
from typer.testing import CliRunner

from vltool.cli import app
from vltool.io import load_dataset
from vltool.pick_caption import PickConfig, pick, pick_caption, row_rng


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


def pick_reference(ds, config: PickConfig) -> tuple[list, list, dict]:
    """pick-caption row by row over Python lists (the code before it worked in chunks): the output's rows
    as dicts without the new columns' order, and the stats."""
    rows = ds.to_list()
    out, dropped = [], []
    for r in rows:
        cands = [t for t in (r["captions"] or []) if isinstance(t, str) and t.strip()]
        cap = r.get("caption")
        if config.exclude_caption and cap is not None:
            cands = [t for t in cands if t != cap]
        if not cands:
            dropped.append(r["id"])
            continue
        new = dict(r)
        if "caption" in r and "caption_original" not in r:
            new["caption_original"] = cap
        new["caption"] = pick(cands, config.strategy, row_rng(config.seed, r["id"]))
        out.append(new)
    return out, dropped, {"changed": sum(o["caption"] != r.get("caption") for o, r in zip(out, [r for r in rows if r["id"] not in dropped]))}


@pytest.mark.parametrize("exclude", [False, True])
def test_chunks_equal_the_row_by_row_reference(tmp_path, monkeypatch, exclude):
    """Any chunk size gives the row-by-row output: the picks, the dropped rows (no candidate: None, [],
    blanks only, or only the current caption with --exclude-caption), `caption_original` kept (and kept
    from the first pass on a second), under --where too; the stats count the same."""
    import random

    import vltool.pick_caption as P

    rng = random.Random(1)
    words = ["red", "blue", "a dog", "  ", "", "the big green tree", "sky"]
    n = 120
    lists = [None if i % 11 == 0 else [rng.choice(words) for _ in range(rng.randint(0, 4))] for i in range(n)]
    caps = [None if i % 13 == 0 else (lists[i][0] if lists[i] and i % 2 else "sky") for i in range(n)]
    datasets.Dataset.from_dict({"id": [f"r{i}" for i in range(n)], "caption": caps, "captions": lists,
                                "split": ["train", "test", "train"] * (n // 3)}).save_to_disk(str(tmp_path / "d"))
    config = PickConfig(strategy="random", exclude_caption=exclude, seed=4)
    for where in ([], ["split=train"]):
        want, dropped, counts = pick_reference(load_dataset(str(tmp_path / "d"), where=where).dataset, config)
        for chunk in (7, 50_000):
            monkeypatch.setattr(P, "CHUNK", chunk)
            out = tmp_path / f"o{len(where)}-{chunk}"
            prov = pick_caption(str(tmp_path / "d"), out, config, where=where)
            got = load_dataset(str(out)).dataset
            assert got.column_names == ["id", "caption", "captions", "split", "caption_original"]
            assert got.to_list() == [{c: w[c] for c in got.column_names} for w in want]
            s = prov["stats"]
            assert s["dropped_ids"] == dropped and s["dropped_no_candidate"] == len(dropped) and s["rows_out"] == len(want)
            assert s["caption_changed"] == counts["changed"]
    assert 0 < len(dropped) < len(want)
    again = pick_caption(str(tmp_path / "o0-7"), tmp_path / "again", PickConfig(strategy="first"))  # a second pass
    got = load_dataset(str(tmp_path / "again")).dataset
    first = load_dataset(str(tmp_path / "o0-7")).dataset
    assert got["caption_original"] == first["caption_original"] and again["rows_out"] <= len(first)


def test_output_pickles_as_files_not_data(tmp_path):
    """The output is built on the input's table (vltool.derived): a 2 MB column pickles in a few kB, with
    rows dropped and under --where, so save_to_disk's workers never receive the data."""
    import pickle

    from vltool.pick_caption import pick_dataset

    n = 200
    datasets.Dataset.from_dict({
        "id": [f"r{i}" for i in range(n)], "captions": [[] if i % 5 == 0 else ["a", f"b {i}"] for i in range(n)],
        "blob": [bytes([i % 251]) * 10_000 for i in range(n)], "split": ["train", "test"] * (n // 2),
    }).save_to_disk(str(tmp_path / "src"))
    for where in ([], ["split=train"]):
        spill = tmp_path / f"spill{len(where)}"
        spill.mkdir()
        out, stats = pick_dataset(load_dataset(str(tmp_path / "src"), where=where).dataset, PickConfig(strategy="last"), spill)
        assert stats["dropped_no_candidate"] > 0 and out.data.nbytes > 2_000_000 // (1 + len(where))
        assert len(pickle.dumps(out.data)) < 50_000 and len(pickle.dumps(out._indices)) < 50_000
        assert out["caption"][:2] == ["b 1", "b 2"] if not where else out["caption"][:2] == ["b 2", "b 4"]


def test_no_row_with_a_candidate_is_an_error(tmp_path, multi):
    r = CliRunner().invoke(app, ["pick-caption", multi, "--where", "id=b", "--exclude-caption", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no row of" in r.output and "--exclude-caption" in r.output
    assert not (tmp_path / "o").exists()
