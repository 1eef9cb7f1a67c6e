"""vltool.errors' DiskFull: a full disk is one line naming what was being written, exit 1, and nothing partial left (issue 35).

Each test writes onto a small tmpfs (mounted here: root only; skipped where mounting is not permitted), or,
for what a tmpfs cannot reach in time (pretrain's second checkpoint), through a writer that fails as a full
disk does. docs/conventions.md, "Writes": an OSError while writing (disk full) is one line, exit 1.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.fixtures.disk import FULL
from tests.fixtures.training import make_pairs, micro
from vltool.errors import DiskFull, disk_full_cause


def fill(disk: Path) -> None:
    """Leave no free byte on `disk`."""
    with open(disk / "fill", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC


def leftovers(disk: Path) -> list[str]:
    return sorted(p.name for p in disk.iterdir() if p.name != "fill")


def one_error_line(r) -> str:
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from vltool.pretrain import pretrain

    root = tmp_path_factory.mktemp("disk_full_model")
    pretrain([make_pairs(root / "pairs", n=16)], root / "run", micro(steps=1), progress=False)
    return root / "run"


def pretrain_on_a_filling_disk(tmp_path, monkeypatch, owner, name: str, failing, checkpoint_every: int) -> tuple[DiskFull, Path, list[str]]:
    """A 3-step run with `owner.name` replaced by `failing(original, *args, **kwargs)` (a writer that fails as a full
    disk does): the DiskFull it raises and the run folder. The writer is then restored and the run resumed to the
    end (asserted). Returns the error, the run, and what the failed run left: its checkpoints (and "model" if written)."""
    from vltool.pretrain import pretrain

    data = make_pairs(tmp_path / "pairs", n=16)
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *args, **kwargs: failing(original, *args, **kwargs))
    run = tmp_path / "run"
    with pytest.raises(DiskFull) as e:
        pretrain([data], run, micro(steps=3, checkpoint_every=checkpoint_every), progress=False)
    kept = sorted(p.name for p in (run / "checkpoints").iterdir()) + (["model"] if (run / "model").exists() else [])
    monkeypatch.setattr(owner, name, original)
    assert pretrain(resume=run, progress=False)["stats"]["steps"] == 3
    return e.value, run, kept


def test_the_cause_is_found_through_wrapping_errors():
    """datasets wraps the OSError (DatasetGenerationError from it); safetensors says it in its text only."""
    from safetensors import SafetensorError

    wrapped = RuntimeError("An error occurred while generating the dataset")
    wrapped.__cause__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert disk_full_cause(wrapped) is wrapped.__cause__
    assert disk_full_cause(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert disk_full_cause(OSError(errno.EACCES, "Permission denied")) is None


def test_pretrain_on_a_full_disk_is_one_line_and_leaves_nothing(cli, small_disk):
    """The first checkpoint's model.safetensors does not fit: safetensors' SafetensorError was an internal
    error; now one line naming RUN_DIR, and no run directory (it had no checkpoint) nor lock left."""
    disk = small_disk("200k")
    r = cli("pretrain", "emoji", "--where", "split=train", "--arch", "vltool-micro", "--steps", "2", "--batch-size", "8",
            "--out", disk / "run", "--no-progress")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert FULL in line and f"writing {disk / 'run'}" in line and "nothing is kept" in line, line
    assert leftovers(disk) == []


def test_pretrain_keeps_the_last_complete_checkpoint_when_the_disk_fills(tmp_path, monkeypatch):
    """The disk fills while step 2's checkpoint is written: that checkpoint is removed whole, step 1's stays,
    the error names it and --resume, and the run resumes from it once there is space."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full_at_step_2(save_file, tensors, filename, metadata=None):
        if "step_00000002" in str(filename):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return save_file(tensors, filename, metadata=metadata)

    error, run, kept = pretrain_on_a_filling_disk(tmp_path, monkeypatch, safetensors.torch, "save_file", full_at_step_2, 1)
    assert "step_00000001, is kept: free some space and continue with `vltool pretrain --resume" in str(error)
    assert kept == ["step_00000001"]


def test_import_on_a_full_disk_is_one_line_and_leaves_nothing(cli, tmp_path, small_disk):
    """datasets' DatasetGenerationError (raised from the OSError) was an internal error."""
    rng = np.random.default_rng(0)
    (tmp_path / "imgs").mkdir()
    for i in range(40):  # ~12 KB of noise each: more than the disk holds
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "imgs" / f"{i}.png")
    (tmp_path / "data.csv").write_text("filepath\ttitle\n" + "".join(f"imgs/{i}.png\tnoise {i}\n" for i in range(40)))
    disk = small_disk("300k")
    r = cli("import", tmp_path / "data.csv", "--out", disk / "x", "--no-progress")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert FULL in line and f"writing {disk / 'x'}" in line, line
    assert leftovers(disk) == []


def test_mine_positives_on_a_full_disk_says_so(cli, tmp_path, small_disk, model):
    """The mined pairs spilled beside --out did not fit: numpy's "49152 requested and 40960 written"."""
    disk = small_disk("300k")
    r = cli("mine-positives", "emoji", "--model", model, "--out", disk / "mined", "--cache-dir", tmp_path / "cache",
            "--no-progress")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert FULL in line and f"writing {disk / 'mined'}" in line, line
    assert leftovers(disk) == []


def test_debias_on_a_full_disk_leaves_no_lock(cli, small_disk, model):
    """Not even the lock's pid fits: the lock file (.OUT.lock, left empty) is removed again."""
    disk = small_disk("100k")
    fill(disk)
    r = cli("debias", "--model", model, "--out", disk / "sub", "--no-progress")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert FULL in line and f"writing {disk / 'sub'}" in line, line
    assert leftovers(disk) == []  # (was: an empty .sub.lock)


def test_a_full_disk_while_torch_writes_optimizer_pt_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """The disk fills while torch.save writes step 2's optimizer.pt: torch's zip writer says only "[enforce fail
    at inline_container.cc:672] unexpected pos" (issue 44, was a raw RuntimeError). Now one line: step 1's
    checkpoint is kept, and `--resume` continues from it exactly. (The write is made to fail as torch's does
    on a full tmpfs: a few bytes written, then that RuntimeError.)"""
    import torch

    def full_at_step_2(save, obj, f, *args, **kwargs):
        if Path(str(f)).name == "optimizer.pt" and "step_00000002" in str(f):
            Path(f).write_bytes(b"PK\x03\x04" + b"\0" * 60)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1728 vs 1640")
        return save(obj, f, *args, **kwargs)

    error, run, kept = pretrain_on_a_filling_disk(tmp_path, monkeypatch, torch, "save", full_at_step_2, 1)
    assert str(error) == (f"{FULL} writing {run}; the checkpoint of step 2 could not be written; the previous checkpoint, "
                          f"step_00000001, is kept: free some space and continue with `vltool pretrain --resume {run}` "
                          "(exactly from that checkpoint)")
    assert kept == ["step_00000001"]  # no half checkpoint


def test_a_full_disk_at_the_final_save_names_the_checkpoint_to_resume_from(tmp_path, monkeypatch):
    """The final model does not fit: it said "choose another --out" though a complete checkpoint remained (the
    run's last, written before the model); --resume then only writes the model."""
    from safetensors import SafetensorError

    import vltool.pretrain.rundir as rundir

    def full(save_model, *args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    error, run, kept = pretrain_on_a_filling_disk(tmp_path, monkeypatch, rundir, "save_model", full, 2)
    assert str(error) == (f"{FULL} writing {run}; the final model of step 3 could not be written; the previous checkpoint, "
                          f"step_00000003, is kept: free some space and continue with `vltool pretrain --resume {run}` "
                          "(exactly from that checkpoint)")
    assert "choose another --out" not in str(error) and "step_00000003" in kept and "model" not in kept
    assert (run / "model").is_dir()  # written by the resume


def test_torch_saves_short_write_on_a_full_disk_is_recognised(small_disk):
    """What torch.save raises on a real full disk (its zip writer's "unexpected pos", without an errno) is a full disk."""
    import torch

    disk = small_disk("256k")
    with pytest.raises(Exception) as e:
        torch.save({"w": torch.zeros(1 << 17)}, disk / "optimizer.pt")  # 512 KB
    assert disk_full_cause(e.value) is not None, repr(e.value)
