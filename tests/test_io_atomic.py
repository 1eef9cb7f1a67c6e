"""vltool.io.atomic: `--overwrite` on a full disk keeps the earlier output whole, for every command that writes one (issue 44).

Each case writes its output once onto a small tmpfs, fills the disk but for a page for the lock and half of
what the output holds, and writes it again with `--overwrite`: the new write runs out of space part way.
The command fails with one line saying the disk is full, exit 1, and the disk holds exactly what it held
before (the earlier output hashed file by file, nothing beside it: no temporary, work folder or lock).
Output files (a results JSON) and folders (a dataset, a run, a subspace) alike; a command with `--out`
that has no case fails `test_every_command_with_out_and_overwrite_has_a_case`.
docs/conventions.md, "Writes".
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.fixtures.command_inputs import COMMON, command_line, tree_hash
from tests.fixtures.disk import FULL

PAGE = 4096
RESULT_FILES = {"zeroshot", "retrieve", "probe", "benchmark", "debias-report"}
CASES = ["deform", "recaption", "filter", "mine-positives", "pretrain", "pseudolabel", "zeroshot", "retrieve", "probe",
         "debias", "debias-report", "export", "split", "pick-caption", "import", "benchmark", "report"]


def argv_for(case: str, w: dict, out: Path) -> list:
    cache = ["--cache-dir", str(w["root"] / "cache")]
    if case == "debias":  # a subspace folder
        return ["debias", "--model", w["model"], "--out", out, *cache]
    if case == "debias-report":  # a report JSON
        return command_line("debias", w, w["data"], out)
    if case == "import":
        return ["import", w["csv"], "--out", out]
    if case == "benchmark":
        return ["benchmark", "--model", w["model"], "--datasets", w["data"], "--bootstrap", "0", "--out", out, *cache]
    if case == "report":  # STEM.json, STEM.md, STEM.png
        return ["report", w["runs"], "--out", out, "--metric", "zeroshot:top1"]
    return command_line(case, w, w["data"], out)


def free_space(disk: Path, room: int) -> None:
    """Fill `disk` (a file `fill`) and give `room` bytes back."""
    with open(disk / "fill", "wb", buffering=0) as f:  # (unbuffered: closing it writes nothing more)
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    size = (disk / "fill").stat().st_size
    os.truncate(disk / "fill", max(0, size - room))


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def test_every_command_with_out_and_overwrite_has_a_case():
    import typer

    from vltool.cli import app

    group = typer.main.get_command(app)
    writers = {name for name, c in group.commands.items() if {"--out", "--overwrite"} <= {o for p in c.params for o in getattr(p, "opts", [])}}
    assert writers, "no command found"
    assert writers <= {c.split("-report")[0] for c in CASES}, sorted(writers - set(CASES))


@pytest.mark.parametrize("case", CASES)
def test_overwrite_on_a_full_disk_keeps_the_earlier_output(world, cli, request, small_disk, case):  # noqa: F811 (fixtures)
    import typer

    from vltool.cli import app

    command = case.split("-report")[0]
    opts = {o for p in typer.main.get_command(app).commands[command].params for o in getattr(p, "opts", [])}
    if "--overwrite" not in opts:
        pytest.skip(f"{command} has no --overwrite")
    w = world
    if case == "recaption":
        w = {**world, "gpt2": request.getfixturevalue("captioners")["gpt2"]}
    disk = small_disk("64m")
    out = disk / ("out.json" if case in RESULT_FILES else "out")
    argv = argv_for(case, w, out)
    r = cli(*argv, *COMMON)
    assert r.exit_code == 0, (argv, r.stdout[-800:], r.stderr[-1500:])
    # the lock's page and half the output, never all of it: an output just over a page (its size depends on the
    # paths it records) found room for all of itself in half its two pages plus the page
    used = disk_bytes(disk)
    free_space(disk, min(PAGE + used // 2 // PAGE * PAGE, (used - 1) // PAGE * PAGE))
    before = tree_hash(disk)
    before.pop("fill")
    r = cli(*argv, "--overwrite", *COMMON)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.exit_code == 1, (argv, r.exit_code, r.stdout[-800:], r.stderr[-1500:])
    assert len(lines) == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert FULL in lines[0], lines[0]
    after = tree_hash(disk)
    after.pop("fill")
    if case == "recaption":  # its finished shards, kept for a rerun (docs/recaption-filter.md, "Resumable work")
        assert "finished shard(s) are kept in" in lines[0] and "rerun the same command" in lines[0], lines[0]
        after = {k: v for k, v in after.items() if not k.startswith("out.partial")}
    assert after == before, "the earlier output changed, or something was left beside it"
