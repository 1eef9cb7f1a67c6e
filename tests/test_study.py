"""vltool.study: a study's variables checked from their metadata (`vltool check-study`); the recipes' use of it
is tested in tests/test_recipe_inputs.py."""

from __future__ import annotations

import datasets
import pytest

from tests.fixtures.clip_benchmark import make_cb_classification, make_cb_retrieval
from vltool.errors import UsageError
from vltool.study import VARIABLES, check_study, describe_data, parse_assignments


def test_good_values_pass_and_each_kind_of_data_is_read_from_its_metadata(tmp_path):
    cls, ret = make_cb_classification(tmp_path / "cls"), make_cb_retrieval(tmp_path / "ret")
    d = describe_data(str(cls))
    assert (d.kind, d.class_names, d.retrieval) == ("clip_benchmark", True, False) and "test" in d.splits
    assert describe_data(str(ret)).retrieval
    e = describe_data("emoji")
    assert e.kind == "dataset" and e.splits == ["test", "train"] and e.class_names
    assert check_study({"ZEROSHOT_BENCH": f"{cls} emoji", "RETRIEVAL_BENCH": str(ret), "PROBE_BENCH": "emoji", "TRAIN_DATA": "emoji",
                        "TRAINABLE": "image-last-2", "THREADS": "1", "BATCH": "64", "LAUNCH": "python -m x", "EVAL_SPLIT": ""}) == \
        ["TRAIN_DATA", "ZEROSHOT_BENCH", "RETRIEVAL_BENCH", "PROBE_BENCH", "TRAINABLE", "THREADS", "BATCH", "LAUNCH"]


def test_the_wrong_kind_of_data_is_named(tmp_path):
    ret = make_cb_retrieval(tmp_path / "ret")
    unlabelled = tmp_path / "unlabelled"
    datasets.Dataset.from_dict({"image": [None], "caption": ["a cat"], "label": [3]}).save_to_disk(str(unlabelled))
    for values, says in [
        ({"PROBE_BENCH": str(ret)}, "is a retrieval set (captions, no labels): the linear probe needs labelled data"),
        ({"ZEROSHOT_BENCH": str(unlabelled)}, "labels name no classes"),
        ({"RETRIEVAL_BENCH": "emoji", "EVAL_SPLIT": "val"}, "has no 'val' split"),
        ({"PROBE_BENCH": str(unlabelled)}, "labels name no classes"),
        ({"TRAIN_DATA": str(ret)}, "is a benchmark"),
        ({"TRAIN_WHERE": "lang==en"}, "single '='"),
        ({"BOOTSTRAP": "2000000"}, "over the limit"),
        ({"BATCH_SIZES": "16 3x"}, "3x: each a global batch"),
    ]:
        with pytest.raises(UsageError) as e:
            check_study(values)
        assert says in str(e.value), (values, str(e.value))


def test_assignments_and_names():
    assert parse_assignments(["A=1", "B_2=x=y", "C="]) == {"A": "1", "B_2": "x=y", "C": ""}
    for bad in ("noequals", "lower=1", "=1"):
        with pytest.raises(UsageError, match="expected NAME=VALUE"):
            parse_assignments([bad])
    with pytest.raises(UsageError, match="not a study variable"):
        check_study({"TRAIN_DAT": "x"})
    assert all(v.help for v in VARIABLES.values())


def test_the_command_lists_every_variable_in_its_help(cli):
    r = cli("check-study", "--help")
    assert r.exit_code == 0 and all(name in " ".join(r.stdout.split()) for name in VARIABLES)
    r = cli("check-study", "THREADS=0")
    assert r.exit_code == 2 and "THREADS=0: the torch threads of every command, a positive whole number" in r.stderr
