"""The trainer: `pretrain()` = `setup()` -> `train()` (one `step()` per optimizer step) -> `finish()`.

It runs unchanged in one process or under `accelerate launch`. What it guarantees (docs/pretrain.md):
- N processes with --batch-size B and --accum-steps A train as one process with batch A*N*B: the loss
  sees the global batch (vltool.losses; A micro-batches by gradient caching, vltool.pretrain.objectives),
  tower gradients are summed over processes during the backward pass (optim.GradientSync), the data
  order depends only on the seed.
- The data a step sees depends only on (seed, epoch, position) (vltool.pretrain.data), so `--resume`
  continues exactly, whatever the number of data-loader workers.
- Checkpoints (vltool.pretrain.checkpoint) are complete or absent. The final model is RUN_DIR/model
  (vltool.model's format) and, when expressible, RUN_DIR/open_clip (open_clip's local-dir layout).
What an objective needs (a logit bias, a critic, EMA towers, two views, a positive mask) is declared by the
objective (vltool.pretrain.objectives), not decided here.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import transformers
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch.nn.attention import SDPBackend, sdpa_kernel

from vltool import columns as C
from vltool import provenance
from vltool.checks import read_json
from vltool.errors import UsageError, VltoolError
from vltool.io.atomic import final_of_work_dir, replace_path, work_dir, write_json_atomic
from vltool.io.digests import shared_ids
from vltool.io.heldout import test_only_inputs
from vltool.io.images import require_a_decodable_image
from vltool.io.index import is_shard_input
from vltool.io.locks import hold_output_lock, refuse_if_busy
from vltool.io.outputs import check_output, not_writable
from vltool.io.outputs import model_inputs as model_reads  # (what --init reads; features.model_inputs is a batch's model inputs)
from vltool.model.create import create_model
from vltool.model.export import export_open_clip
from vltool.model.format import MODEL_DIR, OPEN_CLIP_DIR
from vltool.model.load import build_from_spec, check_init
from vltool.model.model_dir import save_model
from vltool.model.pinning import fingerprint, pinned_spec
from vltool.pretrain import checkpoint as ckpt
from vltool.pretrain.config import METRICS_FILE, PLOT_FILE, RUN_FILE, PretrainConfig, RunSpec
from vltool.pretrain.data import (Collate, PairDataset, ShardData, ShardStream, TrainData, load_shard_data, load_train_data,
                                  load_unicl_data, loader_options, make_sampler, shard_samples_index, stream_micro_batches)
from vltool.pretrain.evaluate import evaluate
from vltool.pretrain.features import FrozenFeatures, frozen_features, model_inputs
from vltool.pretrain.logs import MetricsLog, plot_curves
from vltool.pretrain.objectives import Objective, build_objective, cached_backward
from vltool.pretrain.optim import GradientSync, apply_freezing, build_optimizer, local_parameters, lr_at, set_train_mode
from vltool.pretrain.workers import guarded, one_line_failures
from vltool.topology import is_main, launch_token, shutdown_at_exit, warn
from vltool.transforms import Pixels, eval_transform, train_pixels


@dataclass
class RunState:
    """Everything a run holds between steps."""

    config: PretrainConfig
    spec: RunSpec
    run_dir: Path
    accelerator: Any
    resumed: bool
    train: TrainData | ShardData
    evald: TrainData | None
    total_steps: int
    per_epoch_micro: int | None  # micro-batches in an epoch (None: shards of unknown size)
    model: Any = None
    tokenizer: Any = None
    objective: Objective | None = None
    optimizer: Any = None
    trainable: list = field(default_factory=list)
    local_params: list = field(default_factory=list)  # gradients summed over processes
    sync: Any = None  # GradientSync of local_params
    math_attention: bool = False  # bf16 on CPU with short sequences: the math attention kernel (_autocast)
    pending: list = field(default_factory=list)  # (step, metrics as tensors) not read back yet
    frozen: dict = field(default_factory=dict)  # side -> wholly frozen
    features: FrozenFeatures = field(default_factory=FrozenFeatures)
    dataset: PairDataset | None = None
    collate: Collate | None = None
    pixels: Pixels | None = None  # the training transform: uint8 crops in the workers, normalised on the device
    log: MetricsLog | None = None
    step: int = 0
    start_step: int = 0
    samples_seen: int = 0
    samples_at_start: int = 0
    bad_ids: set = field(default_factory=set)
    first_loss: float | None = None
    last_loss: float | None = None
    searched_bias: float | None = None
    had_checkpoint: bool = False
    window: list = field(default_factory=lambda: [time.perf_counter(), 0, 0.0, 0])  # the log window: start, samples, seconds waiting for data, steps
    precision_note: str | None = None  # --precision auto: what it chose, and why
    data_bound_warned: bool = False
    train_seconds: float = 0.0
    data_positions: dict = field(default_factory=dict)  # shards: this process's stream -> (epoch, samples consumed)

    @property
    def streaming(self) -> bool:
        return isinstance(self.train, ShardData)

    @property
    def device(self):
        return self.accelerator.device

    def inputs(self, batch: dict) -> dict:
        return model_inputs(batch, self.features, self.tokenizer, int(self.model.config["preprocess"]["size"]), self.device)


def pretrain(
    data: Sequence[str] = (),
    out: str | Path | None = None,
    config: PretrainConfig | None = None,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    eval_data: Sequence[str] = (),
    eval_where: Sequence[str] = (),
    eval_split: str | None = None,
    overwrite: bool = False,
    resume: str | Path | None = None,
    stop_after_steps: int | None = None,
    progress: bool = True,
) -> dict:
    """Train a two-tower model on `data` into the run directory `out` (or continue the run `resume`).

    Returns the provenance record (also written to RUN_DIR/vltool.json) when training finished, or
    {"status": "stopped", ...} when `stop_after_steps` stopped it early (resume with `resume=RUN_DIR`).
    """
    timer = provenance.Timer()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if stop_after_steps is not None and stop_after_steps < 1:
        raise UsageError(f"--stop-after-steps must be >= 1, got {stop_after_steps}")
    spec, run_dir, config = resolve_run(data, out, config, where, split, eval_data, eval_where, resume, eval_split)
    made: list[Path] = []  # the run directory, once this invocation has made it (holding its lock)
    threads_before = torch.get_num_threads()
    if config.threads is not None:  # (restored afterwards: the count is the process's, not only this run's)
        torch.set_num_threads(config.threads)
    try:
        try:
            run = setup(spec, run_dir, config, overwrite=overwrite, resumed=resume is not None, progress=progress, made=made)
            stopped = train(run, stop_after_steps)
        except BaseException:
            if made:  # never a directory another invocation made (it may be training in it)
                _drop_if_nothing_to_resume(run_dir)
            raise
        bad_all = ckpt.gather_set(run.bad_ids, run.accelerator)
        if stopped:
            return {"status": "stopped", "step": run.step, "total_steps": run.total_steps, "run_dir": str(run_dir)}
        return finish(run, bad_all, timer)
    finally:
        torch.set_num_threads(threads_before)


def run_dtype(config: PretrainConfig) -> str:
    """The run's numeric precision, for its records: float32 weights, with --precision's autocast."""
    return "float32" if config.precision == "no" else f"float32 weights, {config.precision} autocast"


def _check_resumed_threads(spec: RunSpec, run_dir: Path) -> None:
    """A resumed run on another thread count than it started with may not give the bits of an uninterrupted one."""
    was = (spec.runtime or {}).get("torch_threads")
    now = torch.get_num_threads()
    if was is not None and was != now:
        warn(f"--resume {run_dir}: the run started with {was} torch thread(s), this process has {now}; the weights may differ "
             "in the last bits from an uninterrupted run (pass --threads at the start to pin it)")


def _drop_if_nothing_to_resume(run_dir: Path) -> None:
    """A run this invocation started that failed before its first checkpoint leaves nothing behind (there
    is nothing to resume); one with a checkpoint stays, for --resume."""
    if is_main() and (run_dir / RUN_FILE).is_file() and not (run_dir / C.PROVENANCE_FILE).exists() \
            and not ckpt.list_checkpoints(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


def resolve_run(data, out, config, where, split, eval_data, eval_where, resume, eval_split=None) -> tuple[RunSpec, Path, PretrainConfig]:
    """What to run: a new run, or the saved options of the run being resumed."""
    if resume is not None:
        run_dir = Path(resume).expanduser()
        if not (run_dir / RUN_FILE).is_file():
            raise UsageError(f"--resume {run_dir}: not a vltool pretrain run directory (no {RUN_FILE})")
        if (run_dir / C.PROVENANCE_FILE).is_file():
            raise UsageError(f"--resume {run_dir}: this run has finished (its model is {run_dir / 'model'})")
        for d in (run_dir, run_dir.absolute().parent):  # its checkpoints and model go in it, its lock beside it
            why = not_writable(d)
            if why:
                raise UsageError(f"--resume {run_dir}: cannot write in {d} ({why}); a resumed run writes its checkpoints "
                                 "and model there: make it writable, or copy the run somewhere writable and resume the copy")
        saved = read_json(run_dir / RUN_FILE, f"--resume {run_dir}:")
        try:
            spec = RunSpec(**saved)
        except TypeError as e:
            raise VltoolError(f"--resume {run_dir}: {RUN_FILE} is not a run description this vltool reads ({e})") from None
        if "cpu" in spec.config:  # a run started before --cpu became --device
            spec.config["device"] = "cpu" if spec.config.pop("cpu") else "auto"
        if data and list(data) != spec.data:
            raise UsageError(f"--resume {run_dir}: the run trains on {spec.data}, not {list(data)}; give no DATA with --resume")
        if out is not None and Path(out).expanduser().resolve() != run_dir.resolve():
            raise UsageError("--resume continues RUN_DIR in place; do not pass a different --out")
        config = PretrainConfig(**spec.config)
    else:
        if not data and not (config and (config.label_data or config.text_data)):
            raise UsageError("give at least one training dataset (or 'emoji')")
        if out is None:
            raise UsageError("--out RUN_DIR is required")
        run_dir = Path(out).expanduser()
        if run_dir.exists() or run_dir.is_symlink():
            # An existing output (with --overwrite; _load_data refuses it otherwise) is replaced only once the new
            # run is complete: the run is built in a hidden sibling that finish() swaps in. Every process of a
            # launch names the sibling alike.
            run_dir = work_dir(run_dir, launch_token())
        config = config or PretrainConfig()
        if eval_split is not None and not eval_data:
            raise UsageError(f"--eval-split {eval_split}: it selects a split of --eval-data; give --eval-data")
        spec = RunSpec(list(data), list(where), split, list(eval_data), list(eval_where), asdict(config), 0, eval_split=eval_split)
    config.validate()
    return spec, run_dir, config


def setup(spec: RunSpec, run_dir: Path, config: PretrainConfig, *, overwrite: bool, resumed: bool, progress: bool,
          made: list[Path] | None = None) -> RunState:
    """Processes, data (checked before anything is written), the run directory, the model and objective,
    frozen features, the resume state and the data loader. A new run directory is appended to `made`."""
    asked = config.precision
    accelerator = _accelerator(config)  # (resolves --precision auto)
    spec.config["precision"] = config.precision
    if config.decode == "gpu" and accelerator.device.type != "cuda":  # (before anything is read or written)
        raise UsageError(f"--decode gpu decodes JPEGs with nvjpeg on a CUDA device; this run trains on {accelerator.device.type} "
                         "(use --decode cpu)")
    _tune_device(accelerator)  # before the run's record, which says what the run does (TF32 included)
    world = accelerator.num_processes
    if config.processes is not None and world != config.processes:
        raise UsageError(
            f"--processes {config.processes}: the launch started {world} process{'es' if world != 1 else ''}, not {config.processes} "
            "(accelerate launch on a machine without GPUs starts one unless given --multi_gpu; check --num_processes)")
    if config.workers is None:  # chosen once, from this machine, and recorded in run.json (resume uses it)
        config.workers = default_workers(accelerator.device.type, world)
        spec.config["workers"] = config.workers
    if resumed:
        _check_resumed_threads(spec, run_dir)
    if resumed and spec.num_processes != world:
        raise UsageError(
            f"--resume {run_dir}: the run was started with {spec.num_processes} process(es), now {world}; "
            "resume with the same number so the data order and batches stay the same"
        )
    if config.sync_bn and world > 1 and accelerator.device.type == "cpu":
        raise UsageError("--sync-bn needs GPUs: torch's SyncBatchNorm does not run on CPU (freeze BatchNorm with --lock-image instead)")
    train, evald = _load_data(spec, config, run_dir, overwrite, resumed)
    if config.init and not resumed:  # resolved (fetched where it names a Hub id) and checked before RUN_DIR is made, and
        spec.init_revision = check_init(config.init)  # before the data's size is judged: a bad --init is named as such
    if isinstance(train, ShardData):
        streams = world * max(1, config.workers)
        if len(train.shards) < streams:
            raise UsageError(
                f"{len(train.shards)} shard(s) for {world} process(es) x {max(1, config.workers)} data stream(s) each: every "
                "stream reads whole shards, so give at least as many shards as processes x max(1, --workers)")
        epoch_rows = train.rows  # counted by the shards' index
    else:
        epoch_rows = make_sampler(train, config, 1, 0, 0, 0).n  # rows an epoch draws (fewer with --balanced)
    per_epoch_micro = None
    if epoch_rows is not None:
        per_epoch_micro = epoch_rows // (config.batch_size * world * config.accum_steps) * config.accum_steps  # whole steps
        if per_epoch_micro < config.accum_steps:
            raise UsageError(
                f"the training data has {epoch_rows} rows per epoch, fewer than one step needs "
                f"({config.batch_size} per process x {world} process(es) x {config.accum_steps} accumulation steps)"
            )
    total = config.steps if config.steps is not None else max(1, int(round((config.epochs or 1) * (per_epoch_micro // config.accum_steps))))
    run = RunState(config, spec, run_dir, accelerator, resumed, train, evald, total, per_epoch_micro)
    run.precision_note = f"auto: {config.precision} ({_native_reason(accelerator.device)})" if asked == "auto" else None
    if not resumed:
        _start_run_dir(run)
        if made is not None:
            made.append(run_dir)
    _build_model(run)
    _resume_state(run)
    _init_bias(run)
    _log_ema(run)
    run.log = MetricsLog(run_dir / METRICS_FILE, accelerator.is_main_process, total, run.start_step, progress)
    return run


def train(run: RunState, stop_after_steps: int | None = None) -> bool:
    """Optimizer steps until the end (or `stop_after_steps` of this invocation); True when stopped early."""
    workers = run.config.workers  # a dataset's rows do not depend on it (rows are seeded by (seed, epoch, row))
    pin = run.device.type == "cuda"
    if run.streaming:  # whole micro-batches built in the workers, in turn
        micro_batches = stream_micro_batches(run.dataset, workers, pin, run.data_positions)
    else:
        sampler = make_sampler(run.train, run.config, run.accelerator.num_processes, run.accelerator.process_index,
                               run.step * run.config.accum_steps, run.total_steps * run.config.accum_steps)
        loader = torch.utils.data.DataLoader(run.dataset, batch_sampler=sampler, collate_fn=run.collate,
                                             generator=torch.Generator().manual_seed(run.config.seed),
                                             **loader_options(workers, pin))
        micro_batches = guarded(loader)  # a failed worker: one line, not a hang (vltool.pretrain.workers)
    stopped = False
    # Adam's second moments of rarely-used rows (token embeddings) decay into denormal floats, which
    # are ~10x slower on CPU; flushing them to zero changes nothing measurable in training.
    flush = torch.set_flush_denormal(True) if run.device.type == "cpu" else None
    malloc = _keep_freed_memory(True) if run.device.type == "cpu" else False
    t0 = time.perf_counter()
    try:
        batches = micro_batches
        set_train_mode(run.model)
        with one_line_failures():  # a worker's death noticed during a step (torch's SIGCHLD handler): one line too
            while run.step < run.total_steps:
                if stop_after_steps is not None and run.step - run.start_step >= stop_after_steps:
                    stopped = True
                    break
                stats, lr = step(run, batches)
                _after_step(run, stats, lr)
        if run.pending:
            _read_metrics(run)
        run.train_seconds = time.perf_counter() - t0
        if run.step > run.start_step or not run.had_checkpoint or stopped:
            _save(run)
    finally:
        if flush is not None:
            torch.set_flush_denormal(False)
        if malloc:
            _keep_freed_memory(False)
        run.log.close()
    return stopped


def default_workers(device_type: str, world: int) -> int:
    """--workers when not given: 0 when training on CPU (the model's threads use the cores; decoding in
    the main process costs little next to a CPU step); on GPUs the CPU cores each process of this machine
    may use, less one for the process itself (a GPU at 40% MFU on ViT-B-32 wants ~7,000 images a second:
    every core it can have)."""
    if device_type == "cpu":
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # (set by accelerate launch and torchrun)
    return max(0, cores // max(local, 1) - 1)


def _keep_freed_memory(keep: bool) -> bool:
    """CPU training (Linux, glibc): keep freed memory in the process while training. glibc's malloc hands
    large blocks back to the system when they are freed, and the next step faults them in again, zeroed
    by the kernel (about 7% of a vltool-small step on 2 cores); torch's CPU tuning guide's advice is the
    same (jemalloc/tcmalloc). `keep=False` sets glibc's default values again (128 KiB); the mmap threshold
    then stays fixed at that value, where glibc's own would have adapted (any mallopt of it turns the
    adaptation off for the process). True when it applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    trim, top_pad, mmap = -1, -2, -3  # M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD
    values = {mmap: 32 << 20, trim: 1 << 30, top_pad: 256 << 20} if keep else {mmap: 128 << 10, trim: 128 << 10, top_pad: 128 << 10}
    return all(mallopt(k, v) == 1 for k, v in values.items())


def step(run: RunState, batches) -> tuple[dict, float]:
    """One optimizer step over the global batch (`accum_steps` micro-batches per process, by gradient
    caching when more than one); the tower gradients are summed over processes during the last backward
    pass. Returns the step's metrics as tensors (read back on logging steps only: a step does not wait for
    the device) and its lr."""
    config, model, objective = run.config, run.model, run.objective
    lr = lr_at(run.step, run.total_steps, config)
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    micro = []
    for _ in range(config.accum_steps):
        t = time.perf_counter()
        batch = next(batches)
        run.window[2] += time.perf_counter() - t  # the time this step waited for its batches (the data loader)
        micro.append(to_device(run, batch))
    for batch in micro:
        run.bad_ids.update(batch["bad_ids"])
    if run.accelerator.num_processes == 1 and sum(b["n"] for b in micro) == 0:  # nothing to compute a loss on
        raise VltoolError(_nothing_to_train_on(run, micro))
    with _attention_kernel(run):  # also over backward: --grad-checkpointing recomputes with the same kernel
        if len(micro) == 1:
            with _autocast(run):
                out, n = objective(model, micro[0], run.inputs(micro[0]))
            run.sync.arm()
            run.accelerator.backward(out["loss"])
        else:
            out, n = cached_backward(objective, model, micro, run.inputs, lambda: _autocast(run), run.accelerator.backward, run.sync.arm)
    objective.after_backward()
    run.sync.finish()
    run.samples_seen += n
    run.window[1] += n
    run.window[3] += 1
    if config.grad_clip_norm is not None:
        run.accelerator.clip_grad_norm_(run.trainable, config.grad_clip_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    model.clamp_logit_scale()
    objective.after_step(model)
    run.step += 1
    return {k: v.detach() for k, v in out.items()}, lr


def to_device(run: RunState, batch: dict) -> dict:
    """A batch's images on the training device as the model takes them: uint8 crops copied (non-blocking from
    pinned memory) and normalised there (vltool.transforms.Pixels.normalise); everything else as it came."""
    if "jpeg" in batch:  # --decode gpu: decoded and cropped on the device
        batch["images"] = run.pixels.device_images(batch, run.device)
    for key in ("images", "images2"):
        if key in batch and run.pixels is not None:
            batch[key] = run.pixels.normalise(batch[key].to(run.device, non_blocking=True))
    return batch


def _nothing_to_train_on(run: RunState, micro: list[dict]) -> str:
    """Why a step's batch holds no sample: its texts are missing (streamed samples without text), its images
    do not decode, or both, with the counts and an example id."""
    no_text = sum(b.get("no_text", 0) for b in micro)
    undecodable = sum(len(b["bad_ids"]) for b in micro) - no_text
    example = sorted(run.bad_ids)[0] if run.bad_ids else None
    e_g = f", e.g. id {example!r}" if example is not None else ""
    if undecodable == 0:
        return (f"step {run.step + 1}: not one sample of the batch has a text in {run.train.text_column!r} ({no_text} without "
                f"one{e_g}); the training data's texts are missing")
    if no_text == 0:
        return (f"step {run.step + 1}: not one image of the batch could be decoded ({len(run.bad_ids)} undecodable images "
                f"so far{e_g}); the training data's images are corrupt or missing")
    return (f"step {run.step + 1}: not one sample of the batch has both a text and a decodable image ({no_text} without a "
            f"text, {undecodable} undecodable images{e_g})")


def _autocast(run: RunState):
    """The forward passes' precision context: Accelerate's autocast; with bf16 on CPU and sequences of at
    most 160 tokens also torch's math attention kernel, which is 2-3x faster there than its CPU flash
    attention (about 15% of a vltool-small step; longer sequences keep flash attention)."""
    ctx = run.accelerator.autocast()
    if not run.math_attention:
        return ctx
    stack = contextlib.ExitStack()
    stack.enter_context(ctx)
    stack.enter_context(_attention_kernel(run))
    return stack


def _attention_kernel(run: RunState):
    """torch's math attention kernel where _autocast chooses it, else nothing. The training step holds it
    over the backward pass too: checkpointed blocks are recomputed there, and torch restores autocast for
    them but not the kernel choice (a block recomputed with another kernel fails its checkpoint check)."""
    if not run.math_attention:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


def _read_metrics(run: RunState) -> dict:
    """The metrics of the steps since the last read as floats (one wait for the device); the last step's
    are returned. Stops training if a loss was not finite (before any checkpoint of its weights)."""
    keys = list(run.pending[-1][1])
    values = torch.stack([torch.stack([m[k].float() for k in keys]) for _, m in run.pending]).tolist()
    steps = [s for s, _ in run.pending]
    run.pending = []
    li = keys.index("loss")
    for s, v in zip(steps, values):
        if not math.isfinite(v[li]):
            good = ckpt.list_checkpoints(run.run_dir)
            where_ = f"the last good checkpoint is {good[-1]}" if good else "no checkpoint was written yet"
            raise VltoolError(f"the loss became {v[li]} at step {s}; training stopped ({where_}). "
                              "Try a lower --lr, --grad-clip-norm, or --precision no")
    if run.first_loss is None:
        run.first_loss = values[0][li]
    run.last_loss = values[-1][li]
    return dict(zip(keys, values[-1]))


def _after_step(run: RunState, stats: dict, lr: float) -> None:
    """Log, evaluate and checkpoint on their schedules (the metrics are read back only then)."""
    config, step_ = run.config, run.step
    run.pending.append((step_, stats))
    log = step_ % config.log_every == 0 or step_ == run.total_steps or step_ == 1
    evaluate_ = run.evald is not None and config.eval_every and step_ % config.eval_every == 0 and step_ < run.total_steps
    save = step_ % config.checkpoint_every == 0 and step_ < run.total_steps
    if log or evaluate_ or save:
        stats = _read_metrics(run)
    if log:
        now = time.perf_counter()
        wall = max(now - run.window[0], 1e-9)
        sps, wait, steps = run.window[1] / wall, run.window[2], max(run.window[3], 1)
        run.window = [now, 0, 0.0, 0]
        scale = round(float(run.model.logit_scale.detach().exp()), 4)
        run.log.write({"kind": "train", "step": step_, "epoch": _epochs(run),
                       "samples": run.samples_seen, **{k: round(v, 6) for k, v in stats.items()}, "lr": lr,
                       "logit_scale": scale, "samples_per_s": round(sps, 2), "bad_images": len(run.bad_ids),
                       "data_wait_s": round(wait / steps, 6), "data_wait_share": round(min(wait / wall, 1.0), 4)})
        _warn_if_data_bound(run, step_, wait / wall, steps)
        run.log.progress(step_, f"loss {run.last_loss:.4f}  lr {lr:.2e}  scale {scale:.1f}  {sps:.0f} samples/s")
    run.log.progress(step_)
    if evaluate_:
        run.log.write({"kind": "eval", "step": step_, **_evaluate(run)})
        set_train_mode(run.model)
    if save:
        _save(run)


DATA_BOUND_SHARE = 0.2  # a log window that waited this share of its wall time for batches was held back by the loader


def _warn_if_data_bound(run: RunState, step_: int, share: float, steps: int) -> None:
    """One line, once a run, when the data loader held an accelerator back: over DATA_BOUND_SHARE of a log
    window's time spent waiting for batches (data_wait_share in metrics.jsonl; open_clip logs it as
    "Data (t)"). Not on CPU, where decoding and the step share the same cores, and not in the first window,
    which holds the workers' start."""
    if run.data_bound_warned or run.device.type == "cpu" or step_ <= 1 or share <= DATA_BOUND_SHARE:
        return
    run.data_bound_warned = True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    warn(f"the data loader held the {run.device.type} back: {share:.0%} of the last {steps} step(s)' time was spent waiting "
         f"for batches (data_wait_share in {METRICS_FILE}); raise --workers (now {run.config.workers}; this process may use "
         f"{cores} cores), or store the images smaller (JPEGs near the model's input size decode fastest)")


def finish(run: RunState, bad_all: set, timer) -> dict:
    """Final evaluation; the model (and its open_clip export), loss.png and vltool.json, by the main process."""
    final_eval = None
    if run.evald is not None:
        final_eval = _evaluate(run)
        run.log.write({"kind": "eval", "step": run.step, **final_eval})
    run.model.eval()
    prov = None
    if run.accelerator.is_main_process:
        with ckpt.final_save_kept(run.run_dir, run.step):
            prov = _write_final(run, final_eval, bad_all, timer)
    run.accelerator.wait_for_everyone()
    prov = prov if prov is not None else {"stats": {}}
    prov["status"] = "finished"
    return prov


def _write_final(run: RunState, final_eval, bad_all: set, timer) -> dict:
    """The main process's part of finish(): the model, its open_clip export, loss.png and vltool.json; a run
    built beside the RUN_DIR it replaces is swapped in last."""
    plain = run.model.module if hasattr(run.model, "module") else run.model
    plain = run.objective.export(plain, run.config)  # --export-ema: the EMA towers are the model
    tmp = run.run_dir / f".{MODEL_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(plain, run.tokenizer, tmp)
    replace_path(tmp, run.run_dir / MODEL_DIR, overwrite=True)
    tmp = run.run_dir / f".{OPEN_CLIP_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    exported = export_open_clip(plain, tmp)
    if exported is not None:
        replace_path(tmp, run.run_dir / OPEN_CLIP_DIR, overwrite=True)
    plotted = plot_curves(run.log.read(), run.run_dir / PLOT_FILE)
    stats = _final_stats(run, plain, final_eval, bad_all, exported is not None, plotted)
    final = final_of_work_dir(run.run_dir)  # a run replacing an existing RUN_DIR, built beside it
    if final is not None:
        for key in ("model", "open_clip_export"):
            if stats.get(key):
                stats[key] = str(final / Path(stats[key]).relative_to(run.run_dir))
    spec = run.spec
    options = {**asdict(run.config), "data": spec.data, "where": spec.where, "split": spec.split,
               "eval_data": spec.eval_data, "eval_where": spec.eval_where, **({"eval_split": spec.eval_split} if spec.eval_split else {}),
               "init_revision": spec.init_revision or None}
    inputs = run.train.inputs + (run.evald.inputs if run.evald else [])
    prov = provenance.make("pretrain", options, inputs, rows_in=run.train.rows_in, rows_out=None, stats=stats, timer=timer,
                           device=run.accelerator.device, dtype=run_dtype(run.config))
    write_json_atomic(run.run_dir / C.PROVENANCE_FILE, prov)
    if final is not None:  # complete: now it replaces the old RUN_DIR (which stayed whole until here)
        replace_path(run.run_dir, final, overwrite=True)
    return prov


# ---- set-up pieces


def native_precision(device_type: str) -> str:
    """--precision auto: bf16 where the device computes it natively (a CUDA GPU that supports bf16; a CPU with
    AVX-512 BF16 or AMX), else no (float32). On a CPU without them bf16 is emulated, about 50x slower."""
    if device_type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    if device_type == "cpu":
        native = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)() or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        return "bf16" if native else "no"
    return "no"


def _native_reason(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} {'computes' if torch.cuda.is_bf16_supported() else 'does not compute'} bf16 natively"
    return f"CPU capability {torch.backends.cpu.get_cpu_capability()}: bf16 {'native' if native_precision('cpu') == 'bf16' else 'emulated'}"


def _tune_device(acc) -> None:
    """The GPU path: TF32 for float32 matmuls and convolutions (set before the run's record is written)."""
    if acc.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def _accelerator(config: PretrainConfig):
    if AcceleratorState._shared_state:  # an earlier run in this process (notebook, tests): new precision allowed
        AcceleratorState._reset_state()
    try:
        if config.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: no GPU is visible to torch")
        if config.precision == "auto":
            config.precision = native_precision("cpu" if config.device == "cpu" or not torch.cuda.is_available() else "cuda")
        acc = Accelerator(cpu=config.device == "cpu" or not torch.cuda.is_available(), mixed_precision=config.precision)
    except (ValueError, RuntimeError) as e:
        raise UsageError(f"--precision {config.precision}: {e}") from None
    if acc.num_processes > 1:
        shutdown_at_exit()  # the process group destroyed before interpreter teardown (a gloo group left to it can abort)
    return acc


def _load_data(spec: RunSpec, config: PretrainConfig, run_dir: Path, overwrite: bool, resumed: bool):
    if _is_shards(spec.data, config):
        train = load_shard_data(spec.data, config, spec.where, spec.split)
    elif config.loss == "unicl":
        if spec.data:
            config.text_data = list(config.text_data) + [d for d in spec.data if d not in config.text_data]
        train = load_unicl_data(config, spec.where, spec.split)
    else:
        train = load_train_data(spec.data, config, spec.where, spec.split)
    test_only_inputs(train.inputs, "training input", config.allow_test_data)
    evald = load_train_data(spec.eval_data, config, spec.eval_where, spec.eval_split, what="--eval-data") if spec.eval_data else None
    if evald is not None:
        require_a_decodable_image(evald.dataset, C.IMAGE, "--eval-data " + ", ".join(s.spec for s in evald.inputs))
    if evald is not None:
        _refuse_training_rows_in_eval(train, evald)
    final = final_of_work_dir(run_dir) or run_dir  # the output a run built beside it replaces when it finishes
    if resumed:
        if is_main():  # only the main process of a launch locks RUN_DIR (for the command's lifetime, in the CLI)
            hold_output_lock(final, keep=[run_dir])
        return train, evald
    if is_main():  # a run another launch is starting or training is "in use", not "unfinished" (this launch's main locks it)
        refuse_if_busy(final)
    if not overwrite and (final / RUN_FILE).is_file() and not (final / C.PROVENANCE_FILE).is_file():
        found = ckpt.list_checkpoints(final)
        at = f"its last checkpoint is {found[-1].name}" if found else "it has no checkpoint yet"
        raise UsageError(
            f"{final} is an unfinished run ({at}); continue it with `vltool pretrain --resume {final}` "
            "(--overwrite starts again from scratch; the unfinished run is replaced only when the new one finishes)"
        )
    # every path read: datasets (with the shards their images live in) or the shards streamed
    sources = list(train.inputs) + (list(evald.inputs) if evald else [])
    inputs = [p for s in sources for p in s.reads] + model_reads(config.init)
    check_output(final, overwrite, inputs=inputs, lock=is_main())
    return train, evald


def _refuse_training_rows_in_eval(train, evald) -> None:
    """Evaluation rows never reach training: an id of --eval-data among the training rows' ids (streamed
    shards: their index's) is refused."""
    tables = [shard_samples_index(s) for s in train.inputs] if isinstance(train, ShardData) else [train.dataset]
    overlap = sorted({i for table in tables for i in shared_ids(table, evald.dataset)})
    if overlap:
        raise UsageError(
            f"{len(overlap)} rows of --eval-data are also training rows (e.g. id {overlap[0]!r}); "
            "evaluation rows must not reach training (e.g. --where split=train --eval-where split=test)"
        )


def _is_shards(data: Sequence[str], config: PretrainConfig) -> bool:
    """--data-format wds, or auto and DATA naming tar shards (a pattern, or a folder of .tar files). With
    --data-format hf, shards are read through their index (vltool.io.shard_index) like a dataset on disk."""
    if config.data_format != "auto":
        return config.data_format == "wds"
    flags = [is_shard_input(d) for d in data]
    if any(flags) and not all(flags):
        raise UsageError("DATA mixes tar shards and datasets: train on one kind (import the shards with `vltool import`)")
    return bool(flags) and all(flags)


def _start_run_dir(run: RunState) -> None:
    """A new run: RUN_DIR made anew with run.json (what --resume reads)."""
    acc = run.accelerator
    acc.wait_for_everyone()
    if acc.is_main_process:
        # Never a removal of an existing output here: RUN_DIR is new, or the hidden sibling a run that replaces
        # RUN_DIR is built in (resolve_run; finish() swaps it in). A sibling left by a killed launch of the same
        # name is stale.
        if final_of_work_dir(run.run_dir) is not None and run.run_dir.is_dir():
            shutil.rmtree(run.run_dir)
        run.run_dir.mkdir(parents=True)
        run.spec.num_processes = acc.num_processes
        run.spec.command_line = provenance.command_line()
        run.spec.runtime = provenance.runtime(acc.device, run_dtype(run.config))
        if run.precision_note:
            run.spec.runtime["precision_chosen"] = run.precision_note
        write_json_atomic(run.run_dir / RUN_FILE, asdict(run.spec))
    acc.wait_for_everyone()


def _build_model(run: RunState) -> None:
    """Model and tokenizer, what the objective adds to them, freezing, the optimizer, frozen features and
    the dataset of the training rows."""
    config, acc = run.config, run.accelerator
    torch.manual_seed(config.seed)
    run.objective = build_objective(config, run.train, run.total_steps)
    run.model, run.tokenizer = _new_or_init_model(config, run.objective, run.spec.init_revision)
    run.objective.adapt(run.model, config, run.resumed)
    run.frozen = apply_freezing(run.model, config)
    if config.grad_checkpointing:
        run.model.set_grad_checkpointing(True)
    if config.sync_bn and acc.num_processes > 1:
        run.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(run.model)  # keeps BatchNorm's state dict keys
    run.model.to(acc.device)
    if acc.device.type == "cuda" and run.model.convolutional_image_tower():  # the GPU path: channels_last convolutions
        run.model.set_channels_last(True)
    run.math_attention = acc.device.type == "cpu" and config.precision == "bf16" and run.model.attention_length() <= 160
    run.objective.attach(run.model, acc.device)
    run.local_params = local_parameters(run.model)
    run.sync = GradientSync(run.local_params)
    optimizer, run.trainable = build_optimizer(run.model, run.objective.loss, config, acc.device)
    run.optimizer = acc.prepare_optimizer(optimizer)
    pp = run.model.config["preprocess"]
    if not run.streaming:  # (streamed samples are not known before training: a frozen tower runs every step)
        run.features = frozen_features(run.model, run.tokenizer, run.train, config, run.frozen, run.objective.uses_text,
                                       eval_transform(pp), acc)
    run.pixels = train_pixels(pp, config.augment, config.decode)  # uint8 crops in the workers, normalised on the device (to_device)
    pairs = PairDataset(getattr(run.train, "dataset", None), run.train.text_column, config.caption_sampling,
                        run.pixels, config.seed, load_images=run.features.image is None,
                        captions_per_image=config.captions_per_image, templated=run.train.templated,
                        templates=run.train.templates, two_views=run.objective.two_views)
    text = run.features.text
    run.collate = Collate(run.tokenizer, tokenize=text is None, text_index=text.index if text is not None else None,
                          bad_rows=run.features.bad_rows)
    run.dataset = pairs
    if run.streaming:  # each worker builds whole micro-batches in turn (stream_micro_batches)
        run.dataset = ShardStream(run.train.shards, pairs.item, run.train.text_column, acc.num_processes, acc.process_index,
                                  [config.batch_size] * max(1, config.workers), config.seed, config.shuffle_buffer,
                                  collate=run.collate)
    if config.compile:  # after the EMA copy and the frozen features: only the towers' training calls are compiled
        run.model.visual.compile()
        run.model.text.compile()


def _new_or_init_model(config: PretrainConfig, objective: Objective, init_revision: dict | None = None):
    if config.init:  # the exact weights the run started from (a Hub id pinned to the commit it resolved to)
        model, tokenizer, _, _ = build_from_spec(pinned_spec(config.init, init_revision))
        if config.logit_scale_init is not None:
            with torch.no_grad():
                model.logit_scale.fill_(math.log(config.logit_scale_init))
        if config.logit_scale_learnable is not None:
            model.logit_scale.requires_grad_(config.logit_scale_learnable)
            model.config["logit_scale"]["learnable"] = config.logit_scale_learnable
        return model, tokenizer
    try:
        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass
    learn = objective.logit_scale_learnable if config.logit_scale_learnable is None else config.logit_scale_learnable
    return create_model(config.model_spec(), logit_scale_init=config.logit_scale_init or objective.logit_scale_init,
                        logit_scale_learnable=learn)


def _resume_state(run: RunState) -> None:
    """A resumed run: the newest checkpoint's weights, optimizer, RNG states and counters."""
    if not run.resumed:
        return
    found = ckpt.list_checkpoints(run.run_dir)
    run.had_checkpoint = bool(found)
    if found:
        run.step, run.samples_seen, run.bad_ids, run.first_loss = ckpt.load_checkpoint(
            found[-1], run.model, run.objective.loss, run.optimizer, run.accelerator, run.accelerator.process_index)
        if run.streaming:  # each stream continues after the samples the checkpoint's steps consumed
            positions = ckpt.load_data_positions(found[-1], run.accelerator.process_index)
            run.dataset.starts = {int(k): tuple(v) for k, v in positions.items()}
            run.data_positions.update(run.dataset.starts)
            run.dataset.rotate = (run.step * run.config.accum_steps) % len(run.dataset.sizes)  # whose turn the next micro-batch is
    run.start_step, run.samples_at_start = run.step, run.samples_seen
    if run.accelerator.is_main_process:
        ckpt.truncate_metrics(run.run_dir / METRICS_FILE, run.step)


def _init_bias(run: RunState) -> None:
    """--bias-init search (FFF 4.4): searched on the first batches of a new run, read back on resume."""
    config = run.config
    if config.bias_init != "search" or run.model.logit_bias is None:
        return
    if run.resumed:
        run.searched_bias = ckpt.searched_bias_of(run.run_dir)  # the weights come from the checkpoint
        if run.searched_bias is not None:
            run.model.config["logit_bias_init"] = run.searched_bias
        return
    acc = run.accelerator
    sampler = make_sampler(run.train, config, acc.num_processes, acc.process_index, 0, 0)
    inner = getattr(sampler, "inner", sampler)
    a = config.accum_steps  # a search batch is a global batch: accum_steps micro-batches of every process
    inner.stop = min(config.bias_search_batches * a, sampler.per_epoch)
    micro = [to_device(run, run.collate([run.dataset[k] for k in keys])) for keys in sampler]
    batches = [micro[i : i + a] for i in range(0, len(micro), a)]
    found = run.objective.init_bias(run.model, batches, run.inputs, lambda: _autocast(run))
    run.searched_bias = found.bias
    if acc.is_main_process:
        with open(run.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps({"kind": "bias_search", "step": 0, "logit_bias": found.bias, "batches": config.bias_search_batches,
                                "bracket": [found.lo, found.hi], "evaluations": found.evaluations}) + "\n")
        print(f"logit bias search: {found.bias:g} (grid over [{found.lo:g}, {found.hi:g}], {found.evaluations} losses)",
              file=sys.stderr)


def _log_ema(run: RunState) -> None:
    """--memory-bank: the EMA momentum used (given, or from the run's length) in metrics.jsonl, and the
    warning when it leaves the EMA mostly at its initial weights."""
    momentum = getattr(run.objective, "momentum", None)
    if momentum is None:
        return
    if run.objective.warning:
        warn(run.objective.warning)
    if run.accelerator.is_main_process and not run.resumed:
        with open(run.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps({"kind": "ema", "step": 0, "ema_momentum": momentum, "given": run.config.ema_momentum is not None,
                                "initial_share_at_end": run.objective.initial_share}) + "\n")


def _save(run: RunState) -> Path:
    return ckpt.save_checkpoint(run.run_dir, run.step, run.model, run.objective.loss, run.optimizer, run.accelerator,
                                run.samples_seen, run.bad_ids, run.first_loss, run.config.keep_checkpoints,
                                data_positions=run.data_positions if run.streaming else None)


def _evaluate(run: RunState) -> dict:
    return evaluate(run.model, run.tokenizer, run.evald, eval_transform(run.model.config["preprocess"]), run.objective.loss,
                    run.config.batch_size * run.accelerator.num_processes, run.accelerator, run.config.seed)


def _epochs(run: RunState) -> float | None:
    """Passes over the data so far (shards: samples seen / the shards' samples; None when unknown)."""
    if run.per_epoch_micro is None:
        return None
    return round(run.step * run.config.accum_steps / run.per_epoch_micro, 4)


def _final_stats(run: RunState, plain, final_eval, bad_all: set, exported: bool, plotted: str) -> dict:
    c, trained = run.config, run.step - run.start_step
    new_samples = run.samples_seen - run.samples_at_start  # this invocation's
    return {
        "steps": run.step,
        "epochs": _epochs(run),
        "samples_seen": run.samples_seen,
        "global_batch": c.batch_size * run.accelerator.num_processes * c.accum_steps,  # the loss's batch
        "accum_steps": c.accum_steps,
        "num_processes": run.accelerator.num_processes,
        "per_process_batch": c.batch_size,  # --batch-size: rows per process per micro-batch
        "first_loss": run.first_loss,
        "final_loss": run.last_loss,
        "final_logit_scale": float(plain.logit_scale.detach().exp()),
        "final_logit_bias": float(plain.logit_bias.detach()) if plain.logit_bias is not None else None,
        "searched_logit_bias": run.searched_bias,
        "ema_momentum": getattr(run.objective, "momentum", None),  # --memory-bank: given or from the run's length
        "final_eval": final_eval,
        "bad_images": len(bad_all),
        "bad_image_ids": sorted(bad_all)[:100],
        "empty_texts": len(run.train.empty_text_ids),
        "empty_text_ids": run.train.empty_text_ids[:100],
        "rows_used": run.train.rows if run.streaming else len(run.train.dataset),
        "data_format": "wds" if run.streaming else "hf",
        "parameters": sum(p.numel() for p in plain.parameters()),
        "trainable_parameters": sum(p.numel() for p in run.trainable),
        "frozen": run.frozen,
        "cached_features": run.features.describe(),
        "train_seconds_this_invocation": round(run.train_seconds, 3),
        "samples_per_s_this_invocation": round(new_samples / run.train_seconds, 2) if run.train_seconds > 0 else None,
        "seconds_per_step_this_invocation": round(run.train_seconds / trained, 4) if trained > 0 else None,
        "resumed_from_step": run.start_step if run.resumed else None,
        "model": str(run.run_dir / MODEL_DIR),
        "model_fingerprint": fingerprint(plain, plain.config),
        "open_clip_export": str(run.run_dir / OPEN_CLIP_DIR) if exported else None,
        "hf_model": (plain.config.get("hf") or {}).get("model_type"),  # started from hf:DIR: export --to hf
        "plot": f"{PLOT_FILE} ({plotted})",
    }
