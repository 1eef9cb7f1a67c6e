"""The dataset contract: loading, --where, --split, atomic outputs, provenance."""

import json

import datasets
import pytest

from vltool import provenance
from vltool.errors import UsageError, VltoolError
from vltool.io import atomic_output, check_output, load_dataset, save_dataset, write_json_atomic


@pytest.fixture
def labelled(tmp_path):
    ds = datasets.Dataset.from_dict(
        {"id": ["a", "b", "c", "d"], "caption": ["w", "x", "y", "z"], "label": [0, 1, 2, 1],
         "split": ["train", "train", "test", "val"], "n": [1, 2, 3, 4], "flag": [True, False, True, False]},
        features=datasets.Features({"id": datasets.Value("string"), "caption": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
                                    "split": datasets.Value("string"), "n": datasets.Value("int64"),
                                    "flag": datasets.Value("bool")}))
    ds.save_to_disk(str(tmp_path / "d"))
    return str(tmp_path / "d")


def ids(src):
    return src.dataset["id"]


def test_where_or_within_and_across_columns(labelled):
    assert ids(load_dataset(labelled, where=["split=train"])) == ["a", "b"]
    assert ids(load_dataset(labelled, where=["split=train", "split=test"])) == ["a", "b", "c"]
    assert ids(load_dataset(labelled, where=["split=train", "label=dog"])) == ["b"]
    assert ids(load_dataset(labelled, where=["split!=train"])) == ["c", "d"]
    assert ids(load_dataset(labelled, where=["label=2"])) == ["c"]
    assert ids(load_dataset(labelled, where=["n=4"])) == ["d"]
    assert ids(load_dataset(labelled, where=["flag=true"])) == ["a", "c"]
    src = load_dataset(labelled, where=["split=train"])
    assert src.rows_on_disk == 4 and src.rows == 2 and src.where == ["split=train"]


@pytest.mark.parametrize(
    "where, msg",
    [("split", "expected COLUMN=VALUE"), ("nope=1", "has no column 'nope' (it has: id, caption, label, split, n, flag)"),
     ("label=fish", "not a class of 'label'"), ("n=x", "holds integers"), ("flag=maybe", "is boolean")],
)
def test_where_errors(labelled, where, msg):
    with pytest.raises(UsageError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        load_dataset(labelled, where=[where])


def test_required_columns_named_with_found_ones(labelled):
    with pytest.raises(UsageError, match=r"has no column 'image' \(it has: id, caption"):
        load_dataset(labelled, required=["id", "image"])


def test_dataset_dict_needs_split(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"id": ["a"]}),
                               "test": datasets.Dataset.from_dict({"id": ["b"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(UsageError, match="choose one with --split"):
        load_dataset(str(tmp_path / "dd"))
    with pytest.raises(UsageError, match="no split 'val'"):
        load_dataset(str(tmp_path / "dd"), split="val")
    assert load_dataset(str(tmp_path / "dd"), split="test").dataset["id"] == ["b"]


def test_split_errors_name_the_option_that_gave_the_split(tmp_path, cli):
    """`pretrain --eval-split` (or filter --reference-split, probe --eval-split) on a single dataset said
    "--split does not apply" (issue 53): the messages name the option the user set, and its --where twin."""
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"id": ["a"]}), "test": datasets.Dataset.from_dict({"id": ["b"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    datasets.Dataset.from_dict({"id": ["a"], "caption": ["x"]}).save_to_disk(str(tmp_path / "single"))
    with pytest.raises(UsageError, match=r"so --eval-split does not apply; select rows with --eval-where \(e.g. --eval-where split=test\)"):
        load_dataset(str(tmp_path / "single"), split="test", split_option="--eval-split")
    with pytest.raises(UsageError, match="choose one with --reference-split"):
        load_dataset(str(tmp_path / "dd"), split_option="--reference-split")
    with pytest.raises(UsageError, match=r"^--aligned-split val: .* has no split 'val'"):
        load_dataset(str(tmp_path / "dd"), split="val", split_option="--aligned-split")
    r = cli("filter", "emoji", "--where", "split=train", "--reference", str(tmp_path / "single"), "--reference-split", "test",
            "--out", tmp_path / "f", "--no-progress")
    assert r.exit_code == 2 and "so --reference-split does not apply; select rows with --reference-where" in r.stderr, r.stderr


def test_not_a_dataset_directory(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(UsageError, match="not a dataset saved with datasets' save_to_disk"):
        load_dataset(str(tmp_path / "plain"))


def test_builtin_emoji_loads_with_filter():
    src = load_dataset("emoji", where=["split=test"])
    assert src.rows_on_disk == 3655 and 0 < src.rows < 3655
    assert set(src.dataset["split"]) == {"test"}


def test_atomic_output_commits_only_on_success(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(ValueError):
        with atomic_output(out) as tmp:
            (tmp / "f").write_text("half")
            raise ValueError("crash")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with atomic_output(out) as tmp:
        (tmp / "f").write_text("1")
    assert (out / "f").read_text() == "1"
    with pytest.raises(UsageError, match="exists; pass --overwrite"):
        with atomic_output(out) as tmp:
            pass
    with atomic_output(out, overwrite=True) as tmp:
        (tmp / "g").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["g"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_check_output_refuses_inputs_and_builtin_data(tmp_path, labelled):
    with pytest.raises(UsageError, match="inputs are never modified"):
        check_output(labelled, True, inputs=[labelled])
    with pytest.raises(UsageError, match="inputs are never modified"):
        check_output(f"{labelled}/sub", True, inputs=[labelled])
    from vltool.io import BUILTIN_DATASETS

    with pytest.raises(UsageError, match="built-in data"):
        check_output(BUILTIN_DATASETS["emoji"], True)


def test_save_dataset_writes_provenance(tmp_path, labelled):
    src = load_dataset(labelled, where=["split=train"])
    prov = provenance.make("test", {"x": 1}, [src], rows_in=2, rows_out=2, stats={"s": 1},
                           timer=provenance.Timer(), argv=["vltool", "test", "--x", "1"])
    save_dataset(src.dataset, tmp_path / "out", prov)
    saved = json.loads((tmp_path / "out" / "vltool.json").read_text())
    assert saved["command_line"] == "vltool test --x 1"
    assert saved["inputs"][0]["fingerprint"] == src.fingerprint
    assert {"vltool_version", "options", "rows_in", "rows_out", "wall_time_s", "stats", "created"} <= set(saved)
    assert datasets.load_from_disk(str(tmp_path / "out"))["id"] == ["a", "b"]


def test_write_json_atomic(tmp_path):
    p = write_json_atomic(tmp_path / "r.json", {"a": 1})
    assert json.loads(p.read_text()) == {"a": 1}
    with pytest.raises(UsageError):
        write_json_atomic(p, {"a": 2}, overwrite=False)
    assert json.loads(p.read_text()) == {"a": 1}
    assert [x.name for x in tmp_path.iterdir()] == ["r.json"]


def test_corrupt_dataset_is_runtime_error(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "state.json").write_text("{not json")
    with pytest.raises(VltoolError):
        load_dataset(str(d))


def test_transforms_write_nothing_into_the_input_directory(labelled):
    from pathlib import Path

    before = sorted(p.name for p in Path(labelled).iterdir())
    src = load_dataset(labelled, where=["split=train"])
    src.dataset.map(lambda r: {"caption": r["caption"] + "!"}).filter(lambda r: True)
    assert sorted(p.name for p in Path(labelled).iterdir()) == before


@pytest.mark.parametrize("text,parsed", [
    ("caption=!", ("caption", "!", False)), ("caption=!test", ("caption", "!test", False)),
    ("caption=a!=b", ("caption", "a!=b", False)), ("x=a=b", ("x", "a=b", False)), ("split!=train", ("split", "train", True)),
])
def test_where_values_may_hold_bang_and_equals(text, parsed):
    """The first '=' splits a clause; the value is verbatim (a value starting with '!' was refused with
    "use a single '='", and 'caption=a!=b' was read as the negated column 'caption=a')."""
    from vltool.io import Where

    w = Where.parse(text)
    assert (w.column, w.value, w.negate) == parsed and str(w) == text
