"""`vltool pretrain --global-batch-size G`: the global batch (batch-size x processes x accum-steps) divided among
the processes the launch started, instead of the recipes dividing --batch-size in bash (issue 55). The run is
the one `--batch-size G / (processes x accum-steps)` makes, and records that --batch-size."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.launch import ENV, launch, launch_command
from tests.fixtures.training import make_pairs, weights

TRAIN = ["--arch", "vltool-micro", "--steps", "2", "--lr", "1e-3", "--precision", "no", "--augment", "none", "--no-progress"]
# what differs between two runs of the same command (times, speeds) and the command line itself
VARIES = {"created", "wall_time_s", "command_line", "runtime"}
SPEEDS = {"train_seconds_this_invocation", "samples_per_s_this_invocation", "seconds_per_step_this_invocation"}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return make_pairs(tmp_path_factory.mktemp("pairs") / "pairs", n=32)


def _record(run: Path) -> dict:
    rec = json.loads((run / "vltool.json").read_text())
    rec["stats"] = {k: v for k, v in rec["stats"].items() if k not in SPEEDS}
    return {k: v for k, v in rec.items() if k not in VARIES}


def _run_json(run: Path) -> dict:
    return {k: v for k, v in json.loads((run / "run.json").read_text()).items() if k not in ("command_line", "runtime")}


def test_a_global_batch_on_one_process_is_the_batch_size_run(cli, pairs, tmp_path):
    run = tmp_path / "run"
    r = cli("pretrain", pairs, *TRAIN, "--batch-size", "8", "--out", run)
    assert r.exit_code == 0, r.stderr
    plain, plain_spec, plain_weights = _record(run), _run_json(run), weights(run)
    r = cli("pretrain", pairs, *TRAIN, "--global-batch-size", "8", "--out", run, "--overwrite")
    assert r.exit_code == 0, r.stderr
    rec = json.loads((run / "vltool.json").read_text())
    assert rec["options"]["batch_size"] == 8 and "global_batch_size" not in rec["options"]
    assert _record(run) == plain and _run_json(run) == plain_spec  # the same record, options included
    assert weights(run).keys() == plain_weights.keys() and all((weights(run)[k] == v).all() for k, v in plain_weights.items())
    # with accumulation the global batch is divided among the steps too (as --batch-size's help counts it)
    r = cli("pretrain", pairs, *TRAIN, "--global-batch-size", "8", "--accum-steps", "2", "--out", tmp_path / "accum")
    assert r.exit_code == 0, r.stderr
    stats = json.loads((tmp_path / "accum" / "vltool.json").read_text())["stats"]
    assert (stats["per_process_batch"], stats["accum_steps"], stats["global_batch"]) == (4, 2, 8)


def test_a_global_batch_with_a_batch_size_or_one_that_does_not_divide_is_refused(cli, pairs, tmp_path):
    r = cli("pretrain", pairs, *TRAIN, "--batch-size", "8", "--global-batch-size", "8", "--out", tmp_path / "a")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --batch-size and --global-batch-size: give one (the global batch is divided among the processes)"
    r = cli("pretrain", pairs, *TRAIN, "--global-batch-size", "9", "--accum-steps", "2", "--out", tmp_path / "b")
    assert r.exit_code == 2 and r.stderr.strip() == (
        "error: --global-batch-size 9: does not divide among the 1 process the launch started x 2 accumulation steps "
        "(e.g. --global-batch-size 10)")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_a_global_batch_is_divided_among_the_processes_launched(pairs, tmp_path):
    """2 CPU processes: --global-batch-size 8 trains and records exactly as --batch-size 4 does; 7 is refused in
    one line before anything is written."""
    run = tmp_path / "run"
    launch(["-m", "vltool", "pretrain", pairs, *TRAIN, "--batch-size", "4", "--processes", "2", "--out", run], 2)
    plain, plain_spec, plain_weights = _record(run), _run_json(run), weights(run)
    assert (plain["stats"]["num_processes"], plain["stats"]["per_process_batch"], plain["stats"]["global_batch"]) == (2, 4, 8)
    launch(["-m", "vltool", "pretrain", pairs, *TRAIN, "--global-batch-size", "8", "--processes", "2", "--out", run, "--overwrite"], 2)
    assert _record(run) == plain and _run_json(run) == plain_spec
    assert "--global-batch-size 8" in json.loads((run / "vltool.json").read_text())["command_line"]  # (what differs)
    assert all((weights(run)[k] == v).all() for k, v in plain_weights.items())
    r = subprocess.run(launch_command(["-m", "vltool", "pretrain", pairs, *TRAIN, "--global-batch-size", "7", "--out", tmp_path / "odd"], 2),
                       capture_output=True, text=True, env={**os.environ, **ENV}, timeout=300)
    # each process refuses in the same one line, exit 2 (the launcher then exits 1)
    errors = {line for line in r.stderr.splitlines() if line.startswith("error:")}
    assert r.returncode != 0 and errors == {"error: --global-batch-size 7: does not divide among the 2 processes the launch started "
                                            "(e.g. --global-batch-size 8)"}, r.stderr[-2000:]
    assert not (tmp_path / "odd").exists()
