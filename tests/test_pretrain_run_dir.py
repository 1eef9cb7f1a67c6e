"""The run directory of `vltool pretrain`: an --out in use, a finished run replaced only once the new one finishes,
an unfinished one resumed, a refused one left as it was."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.command_inputs import tree_hash
from tests.fixtures.locks import LOCK_HOLDER
from tests.fixtures.messages import error_line, one_error
from tests.fixtures.training import PRETRAIN, finished_micro_run, make_pairs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished micro run."""
    return finished_micro_run(tmp_path_factory.mktemp("messages_run"))


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


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    from tests.fixtures.training import make_pairs

    return make_pairs(tmp_path_factory.mktemp("pairs") / "pairs", n=16)


def _micro(**kw):
    from vltool.pretrain import PretrainConfig

    base = dict(arch="vltool-micro", batch_size=8, steps=2, lr=1e-3, log_every=1, checkpoint_every=100, augment="none")
    return PretrainConfig(**{**base, **kw})


def test_pretrain_overwrite_keeps_the_finished_run_until_the_new_one_finishes(tmp_path, pairs, cli):
    """An interrupted `pretrain --overwrite` leaves the finished run as it was; the unfinished run says how
    to continue it; a finished replacement swaps in whole."""
    from vltool.pretrain import pretrain

    run = tmp_path / "run"
    pretrain([pairs], run, _micro(), progress=False)
    before = tree_hash(run)
    r = pretrain([pairs], run, _micro(steps=4), overwrite=True, stop_after_steps=2, progress=False)
    assert r["status"] == "stopped"
    assert tree_hash(run) == before  # the finished run is untouched while the new one is built beside it
    sibling = [p for p in tmp_path.iterdir() if p.name.startswith(".run.work-")]
    assert len(sibling) == 1 and (sibling[0] / "checkpoints").is_dir()
    pretrain(resume=sibling[0], progress=False)
    assert not sibling[0].exists() and tree_hash(run) != before
    assert json.loads((run / "vltool.json").read_text())["stats"]["resumed_from_step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no lock, no work directory left


def test_rerunning_an_unfinished_run_says_resume_not_overwrite(tmp_path, pairs, cli):
    from vltool.pretrain import pretrain

    run = tmp_path / "run"
    pretrain([pairs], run, _micro(steps=4), stop_after_steps=2, progress=False)
    line = one_error(cli("pretrain", pairs, "--out", run, "--arch", "vltool-micro", "--steps", "4", "--no-progress"), 2)
    assert "is an unfinished run" in line and f"--resume {run}" in line and "pass --overwrite" not in line


def test_a_refused_pretrain_leaves_a_run_another_invocation_started(tmp_path, pairs, monkeypatch):
    """Two `pretrain --out R` started together: the one refused (R became another run's while it loaded
    its data) must not delete R. Before: it had seen no R at its start, so it removed R on the way out."""
    from vltool.errors import UsageError
    from vltool.pretrain import pretrain, setup as loop

    run = tmp_path / "run"
    load = loop._load_data

    def the_other_starts_first(*args, **kw):  # the other invocation makes R and starts training in it
        run.mkdir()
        (run / loop.RUN_FILE).write_text("{}")
        (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
        return load(*args, **kw)

    monkeypatch.setattr(loop, "_load_data", the_other_starts_first)
    with pytest.raises(UsageError, match="is an unfinished run"):
        pretrain([pairs], run, _micro(), progress=False)
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", loop.RUN_FILE]


def test_a_run_that_fails_before_its_first_checkpoint_leaves_nothing(tmp_path, pairs, monkeypatch):
    """The other side of the test above: a run this invocation made that fails before anything can be
    resumed is removed."""
    from vltool.pretrain import pretrain, setup as loop

    def no_model(run):
        raise RuntimeError("the model could not be built")

    monkeypatch.setattr(loop, "_build_model", no_model)
    with pytest.raises(RuntimeError):
        pretrain([pairs], tmp_path / "run", _micro(), progress=False)
    assert not (tmp_path / "run").exists()


def test_a_second_pretrain_into_a_run_being_written_is_refused(tmp_path, pairs, cli):
    """Two `pretrain --overwrite` into one RUN used to both run and log every step twice; `--resume` of a
    run another process is writing is refused alike."""
    from vltool.pretrain import pretrain

    run = tmp_path / "run"
    pretrain([pairs], run, _micro(steps=4), stop_after_steps=2, progress=False)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(run)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree_hash(tmp_path)
        for argv in (["pretrain", pairs, "--out", run, "--overwrite", "--arch", "vltool-micro", "--steps", "4"],
                     ["pretrain", "--resume", run]):
            assert "is being written by another vltool process" in one_error(cli(*argv, "--no-progress"), 1)
        assert tree_hash(tmp_path) == before
    finally:
        holder.kill()
        holder.wait()
    r = cli("pretrain", "--resume", run, "--no-progress")
    assert r.exit_code == 0, r.stderr
    assert [m["step"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "train"] == [1, 2, 3, 4]
