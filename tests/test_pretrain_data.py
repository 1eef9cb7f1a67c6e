"""The trainer's batches (vltool.pretrain.data; docs/pretrain.md, "The data path"): with streamed shards each
data-loader worker builds whole micro-batches in turn, collated where they are read, and each crosses as one
image tensor and one token tensor (never a tensor per sample); the trainer neither collates nor copies; the
open files of the trainer do not grow with the batch (batch 1,024 trains under a 256-file limit)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest
import torch

from tests.fixtures.wds import make_shards

PP = {"size": 16, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "interpolation": "bicubic", "resize_mode": "shortest"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    return make_shards(tmp_path_factory.mktemp("wds") / "shards", shards=4, per_shard=12)


@pytest.fixture(scope="module")
def tokenizer():
    from vltool.model.create import ModelSpec, create_model

    return create_model(ModelSpec(arch="vltool-micro"))[1]


class MainProcessCollate:
    """A Collate that fails when called in the process that made it (the trainer's)."""

    def __init__(self, inner):
        self.inner, self.pid = inner, os.getpid()

    def __call__(self, items):
        assert os.getpid() != self.pid, "a batch was collated in the training process"
        return self.inner(items)


def _stream(shards, tokenizer, collate, workers, sizes):
    from vltool.pretrain.data import PairDataset, ShardStream
    from vltool.shards import expand_shards
    from vltool.transforms import train_pixels

    pairs = PairDataset(None, "caption", None, train_pixels(PP, "clip"), 0)
    return ShardStream(expand_shards(shards), pairs.item, "caption", 1, 0, sizes, 0, 5, collate=collate)


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def test_shard_batches_are_collated_in_the_workers(shards, tokenizer):
    """2 workers: every micro-batch is collated in its worker (the trainer's Collate would fail), and what
    crosses per micro-batch holds 3 tensors (rows, images, tokens) whatever the batch size."""
    from vltool.pretrain.data import Collate, stream_micro_batches

    for batch in (4, 8):
        stream = _stream(shards, tokenizer, MainProcessCollate(Collate(tokenizer)), 2, (batch, batch))
        loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
        it = iter(loader)
        for _ in range(4):
            sub = next(it)
            assert "items" not in sub and sub["batch"]["images"].dtype == torch.uint8
            assert len(_tensors(sub)) == 3
        got = next(stream_micro_batches(stream, 2))
        assert got["images"].shape == (batch, 3, 16, 16) and got["tokens"].shape[0] == batch


def test_micro_batches_are_whole_batches_of_each_worker_in_turn(shards, tokenizer):
    """The trainer's micro-batch j (stream_micro_batches, 2 workers) is worker j mod 2's next 4 samples,
    collated as Collate collates them in one call, tensor for tensor; with `rotate` 1 (a resume whose next
    turn is worker 1's) the first one is worker 1's."""
    from vltool.pretrain.data import Collate, stream_micro_batches

    collate = Collate(tokenizer)
    for rotate in (0, 1):
        made = _stream(shards, tokenizer, collate, 2, (4, 4))
        made.rotate = rotate
        positions = {}
        got_all = stream_micro_batches(made, 2, positions=positions)
        plain = _stream(shards, tokenizer, None, 2, (4, 4))  # items, collated here
        subs = [iter(plain.samples(plain.stream_of(w), 0)) for w in (0, 1)]
        for j in range(5):
            got = next(got_all)
            w = (rotate + j) % 2
            items = [plain.item(e, raw) for e, _, raw in (next(subs[w]) for _ in range(4))]
            want = collate(items)
            assert got.keys() == want.keys()
            for k in want:
                assert torch.equal(got[k], want[k]) if isinstance(want[k], torch.Tensor) else got[k] == want[k], (rotate, j, k)
            assert positions[w] == (0, 4 * (j // 2 + (1 if w == rotate or j % 2 else 0)))


def test_a_large_batch_trains_under_a_low_open_file_limit(tmp_path):
    """Batch 1,024 with 2 workers under `ulimit -n 256`: a tensor per sample crossing from the workers would
    need over 512 descriptors per micro-batch (the workers then fail with "Too many open files")."""
    pattern = make_shards(tmp_path / "shards", shards=2, per_shard=520, stats=False)

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    cmd = [sys.executable, "-m", "vltool", "pretrain", pattern, "--out", str(tmp_path / "run"), "--arch", "vltool-micro",
           "--steps", "1", "--batch-size", "1024", "--workers", "2", "--no-progress", "--device", "cpu"]
    r = subprocess.run(cmd, preexec_fn=limit, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "run" / "model").is_dir()


def test_decode_on_the_device_makes_the_workers_crops(tmp_path, tokenizer):
    """--decode gpu's path, run here with the CPU as the device: JPEGs cross as their bytes and crop boxes
    (one buffer a batch), a PNG is decoded in its worker (one line says so), and Pixels.device_images gives
    exactly the crops of --decode cpu, in the batch's order."""
    import io as _io

    import numpy as np
    from PIL import Image

    from vltool.pretrain.data import Collate, PairDataset
    from vltool.transforms import train_pixels

    rng = np.random.default_rng(0)

    def encoded(fmt, h, w):
        buf = _io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, fmt)
        return {"bytes": buf.getvalue(), "path": None}

    images = [encoded("JPEG", 40, 52), encoded("PNG", 30, 30), encoded("JPEG", 64, 48), {"bytes": b"junk", "path": None}]
    cpu = PairDataset(None, "caption", None, train_pixels(PP, "clip"), 3)
    gpu = PairDataset(None, "caption", None, train_pixels(PP, "clip", "gpu"), 3)
    items = [(cpu.item(0, r, f"id{r}", "a text", im), gpu.item(0, r, f"id{r}", "a text", im)) for r, im in enumerate(images)]
    assert ["jpeg" in g for _, g in items] == [True, False, True, False] and items[3][1]["bad"]
    collate = Collate(tokenizer)
    want, got = collate([c for c, _ in items]), collate([g for _, g in items])
    assert got["jpeg"].dtype == torch.uint8 and got["jpeg"].ndim == 1 and got["jpeg_at"].tolist() == [0, 2]
    assert got["images_at"].tolist() == [1] and got["n"] == want["n"] == 3
    crops = gpu.transform.device_images(got, torch.device("cpu"))
    assert crops.shape == want["images"].shape and torch.equal(crops, want["images"])
    with pytest.raises(Exception, match="--decode gpu"):
        from vltool.pretrain import PretrainConfig

        PretrainConfig(arch="vltool-micro", augment="none", decode="gpu").validate()


def test_decode_gpu_without_a_gpu_is_refused_before_anything_is_written(tmp_path):
    r = subprocess.run([sys.executable, "-m", "vltool", "pretrain", "emoji", "--where", "split=train", "--out", str(tmp_path / "run"),
                        "--arch", "vltool-micro", "--steps", "1", "--decode", "gpu", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--decode gpu decodes JPEGs with nvjpeg on a CUDA device" in r.stderr.strip().splitlines()[-1], r.stderr[-800:]
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


def test_every_logged_step_records_its_wait_for_data_and_auto_precision_is_float32_here(tmp_path, monkeypatch):
    """metrics.jsonl's data_wait_s / data_wait_share on every logged step; --precision auto resolves to no
    (float32) on a CPU without native bf16 and is recorded so, and to bf16 where the CPU computes it."""
    import json

    import torch

    from vltool.pretrain import PretrainConfig, pretrain
    from vltool.pretrain.runtime import native_precision

    pattern = make_shards(tmp_path / "s", shards=2, per_shard=8)
    pretrain([pattern], tmp_path / "run", PretrainConfig(arch="vltool-micro", batch_size=4, steps=3, log_every=1), progress=False)
    train = [m for m in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "train"]
    assert len(train) == 3 and all(m["data_wait_s"] >= 0 and 0 <= m["data_wait_share"] <= 1 for m in train)
    assert any(m["data_wait_s"] > 0 for m in train)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    native = native_precision("cpu")
    assert run["config"]["precision"] == native and run["runtime"]["precision_chosen"].startswith(f"auto: {native}")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert native_precision("cpu") == "bf16"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert native_precision("cpu") == "no"


# A dead or failing data-loader worker (issue 5): `vltool pretrain` stops with one line naming the cause, exit 1,
# never a hang and never a traceback. The trainer runs in a subprocess (python -c WORKER_FAULT) whose data code is
# changed first; its workers are forked from it, so they run the change too.
WORKER_FAULT = """
import errno, os, resource, signal, sys
import vltool.pretrain.data as data, vltool.pretrain.loop as loop
fault = sys.argv.pop(1)
if fault == "kill":  # every item read in a worker kills that worker
    def killed(self, key):
        os.kill(os.getpid(), signal.SIGKILL)
    data.PairDataset.__getitem__ = killed
elif fault == "emfile":  # the worker's shard reading runs out of descriptors
    def no_descriptors(self, epoch, raw):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), self.shards[raw[0]])
    data.ShardStream.item = no_descriptors
elif fault == "limit":  # the real limit: ten descriptors more than the trainer holds when it starts its loader
    inner = loop.stream_micro_batches
    def limited(*args, **kwargs):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 10, hard))
        return inner(*args, **kwargs)
    loop.stream_micro_batches = limited
from vltool.cli import main
sys.argv[0] = "vltool"
main()
"""


def _failing_pretrain(fault: str, data_args: list, tmp_path) -> tuple[str, float]:
    """Run pretrain with one worker under `fault`; returns its one line of stderr and the seconds it took, after
    asserting exit 1 and no traceback (a hang fails at the timeout)."""
    cmd = [sys.executable, "-c", WORKER_FAULT, fault, "pretrain", *data_args, "--out", str(tmp_path / "run"), "--arch", "vltool-micro",
           "--steps", "2", "--batch-size", "4", "--workers", "1", "--precision", "no", "--device", "cpu", "--no-progress"]
    t = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"pretrain hung after its worker failed ({fault}): {(e.stderr or b'')[-1500:]!r}")
    lines = [line for line in r.stderr.splitlines() if line.strip() and "WebDataset shards, indexed into" not in line]  # (the first run's index)
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
    return lines[0], time.monotonic() - t


def test_a_worker_killed_by_a_signal_stops_the_run_in_one_line(tmp_path):
    """A worker killed (SIGKILL, as the out-of-memory killer kills) while the trainer reads a dataset on disk:
    one line naming the signal, exit 1, within seconds (it was 'internal error ... this is a bug')."""
    line, took = _failing_pretrain("kill", ["emoji", "--where", "split=train"], tmp_path)
    assert "data-loader worker" in line and "killed by SIGKILL" in line and "out-of-memory" in line, line
    assert "internal error" not in line and took < 120


def test_too_many_open_files_in_a_worker_names_the_limit(tmp_path):
    """OSError EMFILE raised in a worker's shard reading: one line with the limit (`ulimit -n`) and how to raise it."""
    import resource

    pattern = make_shards(tmp_path / "s", shards=2, per_shard=8)
    line, _ = _failing_pretrain("emfile", [pattern], tmp_path)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert line.startswith("error: too many open files") and f"the limit is {soft} (`ulimit -n`)" in line and "--workers" in line, line


def test_a_worker_out_of_open_files_while_sending_a_batch_does_not_hang(tmp_path):
    """The hang: under a low open-file limit a worker could not pass its batch's shared memory to the trainer
    (its queue's feeder thread printed a traceback and dropped the batch, or its resource-sharer thread could not
    accept the trainer's connection) and the trainer waited for ever. Now the worker ends and the run stops with
    one line naming the limit."""
    pattern = make_shards(tmp_path / "s", shards=2, per_shard=8)
    line, took = _failing_pretrain("limit", [pattern], tmp_path)
    assert line.startswith("error: too many open files") and "(`ulimit -n`)" in line and "ulimit -n " in line, line
    assert took < 120
