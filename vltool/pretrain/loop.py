"""The trainer: `pretrain()` = `resolve_run()` -> `setup()` -> `train()` (one `step()` per optimizer step) -> `finish()`.

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

Here: `pretrain()`, which wires the stages, the loop (`train()`), the step and its logging. The set-up
(processes, data, run directory, model and objective, resume state) is vltool.pretrain.setup; the run
directory (resolve, start, checkpoints, finish) is vltool.pretrain.rundir; the accelerator, the device's tuning
and autocast vltool.pretrain.runtime; what a run holds (`RunState`) vltool.pretrain.state.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Sequence

import torch

from vltool import provenance
from vltool.errors import UsageError, VltoolError
from vltool.pretrain import checkpoint as ckpt
from vltool.pretrain.config import METRICS_FILE, PretrainConfig
from vltool.pretrain.data.samplers import make_sampler
from vltool.pretrain.data.streams import loader_options, stream_micro_batches
from vltool.pretrain.objectives import cached_backward
from vltool.pretrain.optim import lr_at, set_train_mode
from vltool.pretrain.rundir import _drop_if_nothing_to_resume, _evaluate, _save, finish, resolve_run
from vltool.pretrain.runtime import _attention_kernel, _autocast, _keep_freed_memory, to_device
from vltool.pretrain.setup import setup
from vltool.pretrain.state import LogWindow, RunState
from vltool.pretrain.workers import guarded, one_line_failures
from vltool.topology import warn


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
        run.window.waited += time.perf_counter() - t  # the time this step waited for its batches (the data loader)
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
    run.window.samples += n
    run.window.steps += 1
    if config.grad_clip_norm is not None:
        run.accelerator.clip_grad_norm_(run.trainable, config.grad_clip_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    model.clamp_logit_scale()
    objective.after_step(model)
    run.step += 1
    return {k: v.detach() for k, v in out.items()}, lr


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
        wall = max(now - run.window.start, 1e-9)
        sps, wait, steps = run.window.samples / wall, run.window.waited, max(run.window.steps, 1)
        run.window = LogWindow(now)
        scale = round(float(run.model.logit_scale.detach().exp()), 4)
        run.log.write({"kind": "train", "step": step_, "epoch": run.epochs(),
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
