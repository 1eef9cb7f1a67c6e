"""vltool.io.locks: one writer per output, and only a dead writer's temporaries removed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.locks import LOCK_HOLDER
from tests.fixtures.messages import one_error

REPO = Path(__file__).resolve().parents[1]


def test_a_second_writer_gets_one_line_and_stale_temporaries_go(world, cli, tmp_path):
    """Two writers of one output: the second gets a one-line error. A killed writer's `.OUT.tmp-*` /
    `.OUT.work-*` stay while it lives and go at the next write once it is dead."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for name in (".out.tmp-0123abcd", ".out.work-0123abcd"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "big").write_bytes(b"x" * 1000)
        line = one_error(cli("deform", world["data"], "--out", out, "--no-progress"), 1)
        assert "is being written by another vltool process" in line and f"pid {holder.pid}" in line
        assert (tmp_path / ".out.tmp-0123abcd").is_dir() and (tmp_path / ".out.work-0123abcd").is_dir()  # a live writer's
    finally:
        holder.kill()
        holder.wait()
    r = cli("deform", world["data"], "--out", out, "--no-progress")
    assert r.exit_code == 0, r.stderr
    assert "warning: removed what 2 killed or stopped write(s)" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_writing_beside_an_output_removes_only_its_own_stale_temporaries(world, cli, tmp_path):
    for name in (".out.tmp-00000001", ".other.tmp-00000002", ".out.work-00000003"):
        (tmp_path / name).mkdir()
    r = cli("deform", world["data"], "--out", tmp_path / "out", "--no-progress")
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-00000002", "out"]
