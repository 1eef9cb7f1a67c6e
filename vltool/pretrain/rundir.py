"""The run directory's lifecycle: which run (`resolve_run`: a new one, or the saved options of the one
resumed), starting it (`_start_run_dir`: RUN_DIR with run.json), its checkpoints (`_save`), and finishing it
(`finish`: the final evaluation, the model and its open_clip export, loss.png and vltool.json; a run built
beside the RUN_DIR it replaces is swapped in last). A run that fails before its first checkpoint leaves
nothing (`_drop_if_nothing_to_resume`). Refusing an output in use or unfinished is the data's set-up
(setup._load_data), before anything is written."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from vltool import columns as C
from vltool import provenance
from vltool.checks import read_json
from vltool.errors import UsageError, VltoolError
from vltool.io.atomic import final_of_work_dir, replace_path, work_dir, write_json_atomic
from vltool.io.outputs import not_writable
from vltool.model.export import export_open_clip
from vltool.model.format import MODEL_DIR, OPEN_CLIP_DIR
from vltool.model.model_dir import save_model
from vltool.model.pinning import fingerprint
from vltool.objective_specs import gives_data
from vltool.pretrain import checkpoint as ckpt
from vltool.pretrain.config import PLOT_FILE, RUN_FILE, PretrainConfig, RunSpec, recorded
from vltool.pretrain.evaluate import evaluate
from vltool.pretrain.logs import plot_curves
from vltool.pretrain.runtime import run_dtype
from vltool.topology import is_main, launch_token, warn
from vltool.transforms import eval_transform

if TYPE_CHECKING:
    from vltool.pretrain.state import RunState


# ---- which run


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
        if not data and not (config and gives_data(config)):  # (--label-data, --text-data)
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
        spec = RunSpec(list(data), list(where), split, list(eval_data), list(eval_where), recorded(config), 0, eval_split=eval_split)
    config.validate()
    return spec, run_dir, config


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


# ---- starting it, its checkpoints


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


def _save(run: RunState) -> Path:
    return ckpt.save_checkpoint(run.run_dir, run.step, run.model, run.objective.loss, run.optimizer, run.accelerator,
                                run.samples_seen, run.bad_ids, run.first_loss, run.config.keep_checkpoints,
                                data_positions=run.data_positions if run.streaming else None)


# ---- finishing it


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


def _evaluate(run: RunState) -> dict:
    return evaluate(run.model, run.tokenizer, run.evald, eval_transform(run.model.config["preprocess"]), run.objective.loss,
                    run.config.batch_size * run.accelerator.num_processes, run.accelerator, run.config.seed)


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
    options = {**recorded(run.config), "data": spec.data, "where": spec.where, "split": spec.split,
               "eval_data": spec.eval_data, "eval_where": spec.eval_where, **({"eval_split": spec.eval_split} if spec.eval_split else {}),
               "init_revision": spec.init_revision or None}
    inputs = run.train.inputs + (run.evald.inputs if run.evald else [])
    prov = provenance.make("pretrain", options, inputs, rows_in=run.train.rows_in, rows_out=None, stats=stats, timer=timer,
                           device=run.accelerator.device, dtype=run_dtype(run.config))
    write_json_atomic(run.run_dir / C.PROVENANCE_FILE, prov)
    if final is not None:  # complete: now it replaces the old RUN_DIR (which stayed whole until here)
        replace_path(run.run_dir, final, overwrite=True)
    return prov


def _final_stats(run: RunState, plain, final_eval, bad_all: set, exported: bool, plotted: str) -> dict:
    c, trained = run.config, run.step - run.start_step
    new_samples = run.samples_seen - run.samples_at_start  # this invocation's
    return {
        "steps": run.step,
        "epochs": run.epochs(),
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
        **run.objective.stats(),  # the objectives' entries (--memory-bank: ema_momentum, given or from the run's length)
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
