"""A run's set-up: `setup()` = processes and precision -> the data (checked before anything is written) -> the
run directory -> the model and its objective -> the resume state -> the objective's set-up hooks (its
logit bias, its start record). vltool.pretrain.loop calls it; nothing here trains."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Sequence

import torch
import transformers

from vltool import columns as C
from vltool.errors import UsageError
from vltool.io.atomic import final_of_work_dir
from vltool.io.digests import shared_ids
from vltool.io.heldout import test_only_inputs
from vltool.io.images import require_a_decodable_image
from vltool.io.index import is_shard_input
from vltool.io.locks import hold_output_lock, refuse_if_busy
from vltool.io.outputs import check_output
from vltool.io.outputs import model_inputs as model_reads  # (what --init reads; features.model_inputs is a batch's model inputs)
from vltool.model.create import create_model
from vltool.model.load import build_from_spec, check_init
from vltool.model.pinning import pinned_spec
from vltool.pretrain import checkpoint as ckpt
from vltool.pretrain.config import METRICS_FILE, RUN_FILE, PretrainConfig, RunSpec, resolve_global_batch
from vltool.pretrain.data.items import Collate, PairDataset
from vltool.pretrain.data.rows import load_train_data
from vltool.pretrain.data.samplers import make_sampler
from vltool.pretrain.data.streams import ShardData, ShardStream, load_shard_data, shard_samples_index
from vltool.pretrain.features import frozen_features
from vltool.pretrain.logs import MetricsLog
from vltool.pretrain.objectives import Objective, build_objective, objective_class
from vltool.pretrain.optim import GradientSync, apply_freezing, build_optimizer, local_parameters
from vltool.pretrain.rundir import _check_resumed_threads, _start_run_dir
from vltool.pretrain.runtime import _accelerator, _autocast, _native_reason, _tune_device, default_workers, to_device
from vltool.pretrain.state import RunState
from vltool.topology import is_main, warn
from vltool.transforms import eval_transform, train_pixels


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
    resolve_global_batch(config, world)  # --global-batch-size: the per-process batch of the processes started
    spec.config["batch_size"] = config.batch_size
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


def _load_data(spec: RunSpec, config: PretrainConfig, run_dir: Path, overwrite: bool, resumed: bool):
    if _is_shards(spec.data, config):
        train = load_shard_data(spec.data, config, spec.where, spec.split)
    else:  # the objective's rows (unicl: its label and text inputs)
        train = objective_class(config).load_train(spec.data, config, spec.where, spec.split)
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
    """The objective's logit bias search (sigmoid --bias-init search, FFF 4.4): on the first
    `objective.init_batches` global batches of a new run, read back on resume."""
    config, n = run.config, run.objective.init_batches
    if not n or run.model.logit_bias is None:
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
    inner.stop = min(n * a, sampler.per_epoch)
    micro = [to_device(run, run.collate([run.dataset[k] for k in keys])) for keys in sampler]
    batches = [micro[i : i + a] for i in range(0, len(micro), a)]
    found = run.objective.init_bias(run.model, batches, run.inputs, lambda: _autocast(run))
    run.searched_bias = found.bias
    if acc.is_main_process:
        with open(run.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps({"kind": "bias_search", "step": 0, "logit_bias": found.bias, "batches": n,
                                "bracket": [found.lo, found.hi], "evaluations": found.evaluations}) + "\n")
        print(f"logit bias search: {found.bias:g} (grid over [{found.lo:g}, {found.hi:g}], {found.evaluations} losses)",
              file=sys.stderr)


def _log_ema(run: RunState) -> None:
    """The objective's start: its warning (--memory-bank: an EMA left mostly at its initial weights), and
    its line of a new run's metrics.jsonl (--memory-bank: the EMA momentum used, given or from the run's
    length)."""
    if run.objective.warning:
        warn(run.objective.warning)
    record = run.objective.start_record()
    if record is not None and run.accelerator.is_main_process and not run.resumed:
        kind, fields = record
        with open(run.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps({"kind": kind, "step": 0, **fields}) + "\n")
