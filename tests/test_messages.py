"""Errors that name the real cause (issue 35, "Messages that mislead"): each case was a clean exit with
the wrong advice. The full-disk messages of mine-positives and debias are in tests/test_disk_full.py."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_pretrain import make_pairs, micro  # noqa: E402
from wds_fixtures import make_shards  # noqa: E402

from vltool.errors import UsageError  # noqa: E402

PRETRAIN = ("--arch", "vltool-micro", "--steps", "2", "--batch-size", "4", "--no-progress")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished micro run."""
    from vltool.pretrain import pretrain

    root = tmp_path_factory.mktemp("messages_run")
    pretrain([make_pairs(root / "pairs", n=16)], root / "run", micro(steps=1), progress=False)
    return root / "run"


def error_line(r) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    return [line for line in r.stderr.splitlines() if line.startswith("error:")][-1]


@pytest.mark.parametrize("state", ["run.json only", "a directory being filled"])
def test_a_second_pretrain_of_the_same_out_is_told_it_is_in_use(cli, tmp_path, state):
    """While one run holds --out's lock, its directory is half made: run.json only (was "an unfinished run ...
    --resume"), or files without a vltool mark yet (was "a directory vltool did not write")."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ("run.json" if state == "run.json only" else "metrics.jsonl")).write_text("{}")
    holder = os.open(tmp_path / ".run.lock", os.O_RDWR | os.O_CREAT)  # the first run's lock (another open: flock conflicts)
    os.write(holder, b"4242\n")
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        r = cli("pretrain", make_pairs(tmp_path / "pairs", n=8), "--out", out, *PRETRAIN)
        r_over = cli("pretrain", tmp_path / "pairs", "--out", out, "--overwrite", *PRETRAIN)
    finally:
        os.close(holder)
    for res in (r, r_over):
        assert res.exit_code == 1
        assert error_line(res) == (f"error: {out} is being written by another vltool process (pid 4242); wait for it to "
                                   "finish or choose another --out")
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl" if state != "run.json only" else "run.json"]


@pytest.mark.parametrize("model", ["local-dir:", "hf:"])
def test_a_model_prefix_without_a_path_does_not_blame_the_current_directory(cli, tmp_path, monkeypatch, model):
    """`--model local-dir:` read as the current directory, which `--out results.json` then "would overwrite"."""
    monkeypatch.chdir(tmp_path)
    r = cli("retrieve", "emoji", "--model", model, "--out", "results.json")
    assert r.exit_code == 2
    line = error_line(r)
    assert "would overwrite the input" not in line and "expected" in line and model in line, line
    assert not (tmp_path / "results.json").exists()


def test_streamed_shards_without_text_are_named_so(cli, tmp_path):
    """A batch of samples without text (the shards have 4 captions in 32 samples) was "not one image of the
    batch could be decoded ... images are corrupt or missing"."""
    pattern = make_shards(tmp_path / "few", shards=1, per_shard=32, empty=range(4, 32))
    r = cli("pretrain", pattern, "--out", tmp_path / "run", "--shuffle-buffer", "1", *PRETRAIN)
    assert r.exit_code == 1
    line = error_line(r)
    assert line.startswith("error: step 2: not one sample of the batch has a text in 'caption' (4 without one"), line
    assert "corrupt" not in line and not (tmp_path / "run").exists()
    nothing = make_shards(tmp_path / "none", shards=1, per_shard=8, empty=range(8), stats=False)
    r = cli("pretrain", nothing, "--out", tmp_path / "run", *PRETRAIN)
    assert r.exit_code == 1 and "no sample of the 1 shards has an image and a text" in error_line(r)


def test_a_model_with_its_config_deleted_is_incomplete_not_unfinished(cli, tmp_path, run_dir):
    """A finished run whose model/config.json was deleted was "an unfinished training run ... --resume"."""
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    (broken / "model" / "config.json").unlink()
    for model in (broken, broken / "model"):
        r = cli("retrieve", "emoji", "--model", model, "--out", tmp_path / "r.json")
        assert r.exit_code == 2
        line = error_line(r)
        assert line.startswith(f"error: {broken / 'model'} is an incomplete model (no config.json)") and "--resume" not in line, line
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copytree(run_dir / "checkpoints", unfinished / "checkpoints")
    shutil.copy(run_dir / "run.json", unfinished)
    r = cli("retrieve", "emoji", "--model", unfinished, "--out", tmp_path / "r.json")
    assert r.exit_code == 2 and "unfinished training run" in error_line(r) and "--resume" in error_line(r)


def test_streamed_shards_with_repeated_ids_are_refused_as_a_dataset_is(tmp_path):
    """One rule for ids, whatever the form of the training data: a dataset whose ids repeat is refused, and so
    are shards whose samples repeat a key (they trained silently), streamed or read through their index, and an
    id in two DATA arguments without --prefix-ids."""
    from vltool.pretrain import pretrain

    pattern = make_shards(tmp_path / "shards", shards=2, per_shard=8, stats=False)
    twice = tmp_path / "twice"
    twice.mkdir()
    shutil.copy(tmp_path / "shards" / "00000.tar", twice / "00000.tar")
    shutil.copy(tmp_path / "shards" / "00000.tar", twice / "00001.tar")
    for fmt in ("wds", "hf"):
        with pytest.raises(UsageError, match=r"'.*twice' has duplicate ids \(8 samples repeat .*\); ids must be unique"):
            pretrain([str(twice)], tmp_path / "run", micro(steps=1, batch_size=4, data_format=fmt), progress=False)
    with pytest.raises(UsageError, match="has duplicate ids"):
        pretrain([make_pairs(tmp_path / "pairs", n=8, ids=["same"] * 8)], tmp_path / "run", micro(steps=1, batch_size=4),
                 progress=False)
    with pytest.raises(UsageError, match="pass --prefix-ids"):
        pretrain([pattern, str(tmp_path / "shards" / "00001.tar")], tmp_path / "run", micro(steps=1, batch_size=4), progress=False)
    assert not (tmp_path / "run").exists()
    r = pretrain([pattern, str(tmp_path / "shards" / "00001.tar")], tmp_path / "run", micro(steps=1, batch_size=4, prefix_ids=True),
                 progress=False)
    assert r["stats"]["steps"] == 1
    assert json.loads((tmp_path / "run" / "vltool.json").read_text())["command"] == "pretrain"
