"""Checkpoints: RUN_DIR/checkpoints/step_NNNNNNNN/, written to a temporary directory and renamed when
complete, so a killed run never leaves a partial one. Each holds the model, the objective's state (memory
bank: EMA towers and queue), the optimizer, the grad scaler, every process's RNG states, and the step,
samples seen and bad image ids; `--resume` continues from the newest exactly."""

from __future__ import annotations

import json
import os
import random
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import safetensors.torch  # (save_file / load_file through the module: tests replace them)
import torch
from accelerate.utils import gather_object

from vltool.errors import DiskFull, VltoolError, disk_full_cause, disk_full_message
from vltool.checks import read_json
from vltool.io.atomic import final_of_work_dir
from vltool.model.model_dir import state_dict_for_save
from vltool.pretrain.config import CHECKPOINTS, METRICS_FILE


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    d = Path(run_dir) / CHECKPOINTS
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.startswith("step_") and (p / "state.json").is_file())


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]), "python_pos": random.getstate()[2]}
    np_state = np.random.get_state()
    st["numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    st["numpy_pos"] = int(np_state[2])
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate((3, tuple(st["python"]), st["python_pos"]))
    np.random.set_state(("MT19937", st["numpy"].numpy().astype(np.uint32), st["numpy_pos"], 0, 0.0))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def searched_bias_of(run_dir: Path):
    path = Path(run_dir) / METRICS_FILE
    if path.is_file():
        for line in path.read_text().splitlines():
            m = json.loads(line)
            if m.get("kind") == "bias_search":
                return m["logit_bias"]
    return None


def gather_set(items: set, accelerator) -> set:
    if accelerator.num_processes == 1:
        return set(items)
    return set(gather_object(sorted(items)))


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after the checkpoint a run resumes from."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in keep))


def save_checkpoint(run_dir: Path, step: int, model, loss_fn, optimizer, accelerator, samples_seen, bad_ids, first_loss, keep: int,
                    data_positions: dict | None = None) -> Path:
    """RUN_DIR/checkpoints/step_NNNNNNNN/, written to a temporary directory and renamed when complete.
    `data_positions` (streamed shards): this process's stream -> (epoch, samples of it consumed), as
    data_<rank>.json."""
    rank = accelerator.process_index
    base = run_dir / CHECKPOINTS
    final = base / f"step_{step:08d}"
    tmp = base / f".step_{step:08d}.tmp"
    bad_all = gather_set(bad_ids, accelerator)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    with _partial_removed(tmp, run_dir, step):
        if accelerator.is_main_process:
            tmp.mkdir(parents=True)
        accelerator.wait_for_everyone()
        _write_checkpoint(tmp, rank, model, loss_fn, optimizer, accelerator, data_positions)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"step": step, "samples_seen": samples_seen, "bad_image_ids": sorted(bad_all), "first_loss": first_loss,
                 "num_processes": accelerator.num_processes}
        with _partial_removed(tmp, run_dir, step):
            (tmp / "state.json").write_text(json.dumps(state))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _write_checkpoint(tmp: Path, rank: int, model, loss_fn, optimizer, accelerator, data_positions: dict | None) -> None:
    """This process's files of a checkpoint into `tmp`: its RNG states (and stream positions), and on the main
    process the model, the objective's state, the optimizer and the grad scaler."""
    torch.save(_rng_state(), tmp / f"rng_{rank}.pt")
    if data_positions is not None:
        (tmp / f"data_{rank}.json").write_text(json.dumps({"streams": {str(k): list(v) for k, v in sorted(data_positions.items())}}))
    if accelerator.is_main_process:
        plain = model.module if hasattr(model, "module") else model
        safetensors.torch.save_file(state_dict_for_save(plain), str(tmp / "model.safetensors"))
        loss_state = {k: v.detach().cpu().contiguous() for k, v in loss_fn.state_dict().items()}
        if loss_state:
            safetensors.torch.save_file(loss_state, str(tmp / "loss.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if accelerator.scaler is not None:
            torch.save(accelerator.scaler.state_dict(), tmp / "scaler.pt")


@contextmanager
def _partial_removed(tmp: Path, run_dir: Path, step: int) -> Iterator[None]:
    """A checkpoint whose writing fails is removed (never half a checkpoint, nor the space it took); a full
    disk is one line naming the run and the checkpoint it keeps (DiskFull)."""
    try:
        yield
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, VltoolError) or disk_full_cause(e) is None:
            raise
        raise DiskFull(_disk_full_message(run_dir, f"the checkpoint of step {step}")) from e


@contextmanager
def final_save_kept(run_dir: Path, step: int) -> Iterator[None]:
    """Around the final model's writing: a full disk is one line saying what is kept (the last complete
    checkpoint, from which `--resume` finishes the run), not "choose another --out"."""
    try:
        yield
    except Exception as e:
        if isinstance(e, VltoolError) or disk_full_cause(e) is None:
            raise
        raise DiskFull(_disk_full_message(run_dir, f"the final model of step {step}")) from e


def _disk_full_message(run_dir: Path, what: str) -> str:
    """The run's --out (RUN_DIR, also for a run built beside the one it replaces), and what is kept."""
    kept = list_checkpoints(run_dir)
    out = final_of_work_dir(run_dir) or run_dir
    if not kept:
        return disk_full_message(out, f"{what} could not be written, and the run had no checkpoint yet, so "
                                 "nothing is kept: free some space there or choose another --out")
    return disk_full_message(out, f"{what} could not be written; the previous checkpoint, {kept[-1].name}, is kept: free "
                             f"some space and continue with `vltool pretrain --resume {run_dir}` (exactly from that checkpoint)")


def load_checkpoint(ckpt: Path, model, loss_fn, optimizer, accelerator, rank: int):
    plain = model.module if hasattr(model, "module") else model
    plain.load_state_dict(safetensors.torch.load_file(str(ckpt / "model.safetensors")), strict=True)
    if (ckpt / "loss.safetensors").is_file():
        loss_fn.load_state_dict(safetensors.torch.load_file(str(ckpt / "loss.safetensors")), strict=True)
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True))
    if accelerator.scaler is not None and (ckpt / "scaler.pt").is_file():
        accelerator.scaler.load_state_dict(torch.load(ckpt / "scaler.pt", weights_only=True))
    _set_rng_state(torch.load(ckpt / f"rng_{rank}.pt", weights_only=True))
    state = read_json(ckpt / "state.json", "the checkpoint state")
    return state["step"], state["samples_seen"], set(state["bad_image_ids"]), state.get("first_loss")


def load_data_positions(ckpt: Path, rank: int) -> dict:
    """Stream -> (epoch, samples consumed) of process `rank` at the checkpoint ({} before any step)."""
    path = Path(ckpt) / f"data_{rank}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the checkpoint has no data position of process {rank} (streamed shards)")
    return json.loads(path.read_text())["streams"]
