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


# ---- issue 44, "Messages whose advice is wrong": each names the option, the value and what to do.


@pytest.mark.parametrize("spec,expect", [
    ("open_clip:", "'open_clip:' names no architecture; expected open_clip:ARCH/TAG"),
    ("open_clip:NoSuchArch/tag", "open_clip:NoSuchArch/tag: unknown architecture 'NoSuchArch'"),
])
def test_an_open_clip_spelling_without_a_known_architecture_does_not_blame_arch(cli, spec, expect):
    """`--model open_clip:` and `open_clip:NoSuchArch/tag` said "--arch '...': unknown architecture" (no --arch was given)."""
    r = cli("zeroshot", "emoji", "--model", spec, "--bootstrap", "0")
    assert r.exit_code == 2
    line = error_line(r)
    assert line.startswith(f"error: {expect}") and "--arch" not in line, line


def test_a_file_that_is_not_open_clip_weights_says_what_to_give(cli):
    """`open_clip:ViT-B-32/../../../../etc/passwd`: a raw "list index out of range"."""
    r = cli("zeroshot", "emoji", "--model", "open_clip:vltool-micro/../../../../etc/passwd", "--bootstrap", "0")
    assert r.exit_code == 2
    line = error_line(r)
    assert line.startswith("error: open_clip:vltool-micro/../../../../etc/passwd: cannot load open_clip weights ") and \
        "give a weights file open_clip saved for vltool-micro, or one of its pretrained tags" in line, line


def test_a_hub_id_with_a_space_after_hf_says_so(cli):
    """`hf: ORG/NAME` showed a valid id and called it "not a Hub id"."""
    r = cli("zeroshot", "emoji", "--model", "hf: openai/clip-vit-base-patch32", "--bootstrap", "0")
    assert r.exit_code == 2
    assert error_line(r) == "error: 'hf: openai/clip-vit-base-patch32': a space after 'hf:' (or at the end); write hf:openai/clip-vit-base-patch32"


def test_an_unknown_torchvision_tower_is_named_before_its_weights(cli, tmp_path):
    """`--image-tower torchvision:nosuchnet` asked for --image-weights (for a model that does not exist)."""
    r = cli("pretrain", "emoji", "--image-tower", "torchvision:nosuchnet", "--out", tmp_path / "run")
    assert r.exit_code == 2
    line = error_line(r)
    assert line == "error: --image-tower torchvision:nosuchnet: torchvision has no model 'nosuchnet' (e.g. mobilenet_v2, resnet50, efficientnet_b0)", line


def test_a_models_config_file_given_as_the_model_names_its_folder(cli, run_dir):
    """`--model RUN/model/config.json` said "not a vltool model (no config.json ...)"."""
    r = cli("zeroshot", "emoji", "--model", run_dir / "model" / "config.json", "--bootstrap", "0")
    assert r.exit_code == 2
    assert error_line(r) == f"error: model '{run_dir / 'model' / 'config.json'}' is a file, not a model folder; give its folder: {run_dir}"


def test_resume_of_a_read_only_run_does_not_say_choose_another_out(cli, tmp_path, run_dir):
    """`pretrain --resume RUN` on a read-only folder said "choose another --out" (resume has no --out)."""
    import subprocess

    disk = tmp_path / "ro"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(disk)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        run = disk / "run"
        shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("model", "open_clip", "vltool.json", "loss.png"))  # unfinished
        assert subprocess.run(["mount", "-o", "remount,ro", str(disk)]).returncode == 0
        r = cli("pretrain", "--resume", run, "--no-progress")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert r.exit_code == 2
    line = error_line(r)
    assert line.startswith(f"error: --resume {run}: cannot write in {run} (read-only file system); ") and \
        "make it writable, or copy the run somewhere writable and resume the copy" in line and "--out" not in line, line


def test_hub_cache_problems_are_named_not_called_missing(cli, tmp_path, monkeypatch):
    """HF_HOME being a file, and refs/main naming a snapshot that is gone, both said "not in the Hugging Face
    cache; download it", which downloading does not fix."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    home = tmp_path / "hf-home"
    home.write_text("not a folder")
    monkeypatch.setenv("HF_HOME", str(home))
    r = cli("zeroshot", "emoji", "--model", "hf:testorg/tiny-clip", "--bootstrap", "0")
    assert r.exit_code == 2
    line = error_line(r)
    assert f"the Hugging Face cache {home / 'hub'} (HF_HOME={home}) cannot be a folder: {home} is a file; point HF_HOME at a folder" in line, line
    home.unlink()
    folder = home / "hub" / "models--testorg--tiny-clip"
    (folder / "refs").mkdir(parents=True)
    (folder / "snapshots").mkdir()
    (folder / "refs" / "main").write_text("ab" * 20)
    r = cli("zeroshot", "emoji", "--model", "hf:testorg/tiny-clip", "--bootstrap", "0")
    assert r.exit_code == 2
    line = error_line(r)
    assert f"the cache {folder} is damaged: refs/main names commit {'ab' * 20}, whose snapshot folder is missing; remove {folder}" in line, line
    assert "not in the Hugging Face cache" not in line


def test_a_subspace_option_given_empty_is_named(cli, tmp_path, run_dir):
    """`debias --subspace ''` named --debias."""
    r = cli("debias", "--model", run_dir, "--subspace", "", "--eval-data", "emoji")
    assert r.exit_code == 2
    line = error_line(r)
    assert line.startswith("error: --subspace is empty") and "--debias" not in line, line


def test_report_has_overwrite(cli):
    """`report --overwrite` was "No such option"."""
    r = cli("report", "--help")
    assert r.exit_code == 0 and "--overwrite" in r.stdout
