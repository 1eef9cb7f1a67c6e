"""What `zeroshot`, `retrieve` and `probe` share: their common options, the results record, the table, the
`--debias` edit (Edit). The model is loaded with vltool.encode.load_eval_model (and recorded with
vltool.encode.model_record), as every command that encodes does; is_main is vltool.topology's.

A results record (written by `--out`, printed by `--json`) holds the provenance fields at top level
(vltool.provenance.make) and:
    "task", "model" {spec, pretrained, fingerprint, source}, "data" {...}, "protocol" {...},
    "metrics" {name: {"value", "ci_low", "ci_high", "chance"}}, "chance" {...}, and task-specific parts.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from rich.table import Table

from vltool import console, provenance
from vltool.cache import EmbeddingCache
from vltool.encode import ENCODE_PRECISIONS, encode_device, encode_images, load_eval_model, model_record
from vltool.errors import UsageError
from vltool.importer import clip_benchmark_input
from vltool.io.atomic import write_json_atomic
from vltool.io.loading import load_dataset, LoadedDataset
from vltool.io.outputs import OUTPUT_MARKS, check_output, model_inputs, require_output_name
from vltool.metrics import Interval, classification_chance_levels, majority_rate
from vltool.outcomes import FORMAT, examples_path, write_examples
from vltool.subspace import load_subspace, project_out
from vltool.topology import is_main, on_cuda  # (the commands import is_main from here too)

LEVEL = 0.95


@dataclass
class EvalCommon:
    """Options every evaluation command has, one field per option of the same name (`--no-progress` for
    `progress`; help: `vltool zeroshot --help`)."""

    model: str = ""
    pretrained: str | None = None
    bootstrap: int = 1000
    seed: int = 0  # the bootstrap's (and any sampling's)
    batch_size: int | None = None  # None: encode_defaults() when the config is made (64 on CPU, 256 on a GPU)
    decode_threads: int | None = None  # None: encode_defaults() (1 on CPU; on a GPU the cores this process may use - 1, at most 8)
    device: str = "auto"  # auto | cpu | cuda (vltool.topology.compute_scope)
    threads: int | None = None  # torch's intra-op threads (None: torch's own)
    precision: str = "no"  # float32, the exact path the library oracles check; bf16/fp16: autocast
    cache_dir: str | None = None
    progress: bool = True
    debias: str | None = None
    debias_text: bool = False
    group_column: str | None = None  # the bootstrap resamples whole groups of rows sharing its value

    def __post_init__(self):
        batch, decode_threads = encode_defaults(self.device)
        self.batch_size = batch if self.batch_size is None else self.batch_size
        self.decode_threads = decode_threads if self.decode_threads is None else self.decode_threads

    def common_problems(self) -> list[str]:
        problems = []
        if self.precision not in ENCODE_PRECISIONS:
            problems.append(f"--precision {self.precision!r}: use {', '.join(ENCODE_PRECISIONS)}")
        if not str(self.model or "").strip():
            problems.append("--model is required (a vltool RUN_DIR, hf:ORG/NAME or hf:DIR, open_clip:ARCH/TAG, open_clip:hf-hub:ORG/NAME, or local-dir:PATH)")
        if self.bootstrap < 0:
            problems.append(f"--bootstrap must be >= 0, got {self.bootstrap}")
        if self.batch_size < 1:
            problems.append(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.decode_threads < 1:
            problems.append(f"--decode-threads must be >= 1, got {self.decode_threads}")
        if self.threads is not None and self.threads < 1:
            problems.append(f"--threads must be >= 1, got {self.threads}")
        if self.debias_text and not self.debias:
            problems.append("--debias-text needs --debias SUBSPACE_DIR")
        if self.debias and not Path(self.debias).expanduser().is_dir():
            problems.append(f"--debias {self.debias}: no such subspace directory (make one with `vltool debias --out`)")
        if self.pretrained is not None and not str(self.model).startswith("open_clip:"):
            problems.append("--pretrained applies to --model open_clip:ARCH only")
        return problems


def encode_defaults(device: str = "auto") -> tuple[int, int]:
    """(--batch-size, --decode-threads) of the evaluation commands when not given, on --device `device`: 64
    images and 1 decoding thread on CPU (the model's threads use the cores); on a GPU 256 images and a
    decoding thread per core this process may use less one, at most 8, so that the GPU does not wait for
    the decoding."""
    if not on_cuda(device):
        return 64, 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return 256, max(1, min(8, cores // max(local, 1) - 1))


def entry(value: float, interval: Interval | None, chance: float | None) -> dict:
    def clean(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)

    out = {
        "value": clean(value),
        "ci_low": clean(interval.low) if interval else None,
        "ci_high": clean(interval.high) if interval else None,
        "chance": clean(chance),
    }
    if interval is not None and interval.replicates:  # the Monte Carlo error of the bounds (protocol.bootstrap.resamples drawn)
        out.update(ci_replicates=int(interval.replicates), ci_low_mc_se=clean(interval.low_mc_se), ci_high_mc_se=clean(interval.high_mc_se))
    return out


def bootstrap_record(n_boot: int, seed: int, unit: str, resampling=None, group_column: str | None = None) -> dict:
    """protocol.bootstrap; with `resampling` (a vltool.metrics.Resampling) also its group column, units, strata."""
    return {
        "resamples": n_boot,
        "seed": seed,
        "level": LEVEL,
        "method": "percentile",
        "unit": unit,
        **(resampling.record(group_column) if resampling is not None else {}),
    }


def check_out(out: str | Path | None, overwrite: bool, inputs: Sequence[Path], config: EvalCommon | None = None) -> Path | None:
    """Refuse a bad --out before any work (exists without --overwrite, a directory; equal to, inside or
    containing an input: the data, and with `config` the model and the --debias subspace)."""
    if out is None:
        return None
    if config is not None:
        inputs = [*inputs, *model_inputs(config.model, config.pretrained), *([Path(config.debias)] if config.debias else [])]
    p = check_output(out, overwrite, inputs, related=[examples_path(require_output_name(out)).name], kind="file")
    if p.is_dir():
        raise UsageError(f"--out {p} is a directory; give a file name such as results.json")
    ex = examples_path(p)
    if ex.exists() and not overwrite:
        raise UsageError(f"{ex} (the per-example outcomes written beside --out) exists; pass --overwrite to replace it")
    for path, why in ((p, not_a_result(p)), (ex, not_outcomes(ex))):
        if why:
            raise UsageError(f"--out {p}: {path} {why}; vltool replaces only what it wrote (even with --overwrite): choose another --out")
    return p


# The commands whose --out is a results JSON (with X.examples.npz beside it): one may replace another's.
RESULT_COMMANDS = ("zeroshot", "retrieve", "probe", "benchmark", "debias")


def not_a_result(p: Path) -> str | None:
    """Why an existing file at a results --out is not one vltool may replace, or None (absent, or a results
    JSON of RESULT_COMMANDS: its provenance names vltool and the command). A model's config.json, a
    dataset's state.json, an output directory's provenance or a user's notes.json is never replaced."""
    if not os.path.lexists(p):
        return None
    if p.name in OUTPUT_MARKS:
        return f"is the record of an output directory ({p.name})"
    try:
        record = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "is not a results JSON vltool wrote"
    if not (isinstance(record, dict) and "vltool_version" in record and record.get("command") in RESULT_COMMANDS):
        return "is not a results JSON vltool wrote (its provenance names no vltool evaluation)"
    return None


def not_outcomes(ex: Path) -> str | None:
    """Why an existing file at the outcomes path X.examples.npz is not vltool's per-example outcomes, or None."""
    if not os.path.lexists(ex):
        return None
    import numpy as np

    try:
        with np.load(ex, allow_pickle=False) as z:
            fmt = str(z["format"]) if "format" in z.files else ""
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
        fmt = ""  # (a damaged outcomes file of ours reads as damaged, and stays: the user decides)
    return None if fmt == FORMAT else f"is not a per-example outcomes file vltool wrote (format {FORMAT})"


def finish(record: dict, out: Path | None, overwrite: bool, examples: dict | None = None, examples_out: Path | None = None) -> dict:
    """Write the record to --out (main process only, atomically); with `examples` (the arrays of
    vltool.outcomes) first the per-example outcomes beside it, X.examples.npz, which the record names.
    `examples_out`: the outcomes to that file instead, also without --out (`vltool benchmark`'s tasks, whose
    records go into its own JSON beside that file)."""
    ex = examples_out if examples_out is not None else examples_path(out) if out is not None else None
    if ex is not None and examples is not None:
        record["examples"] = {"file": ex.name, "format": FORMAT, "rows": int(len(examples["id"]))}
        if is_main():
            write_examples(ex, examples)
    if out is not None and is_main():
        write_json_atomic(out, record, overwrite=overwrite)
    return record


def fmt_value(x: float | None, kind: str) -> str:
    if x is None:
        return "-"
    if kind == "pct":
        return f"{100 * x:.2f}%"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def print_table(record: dict, title: str) -> None:
    """The metrics with their intervals and chance level, as a rich table on stdout."""
    stdout = console.out

    t = Table(title=title, show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column(f"{int(LEVEL * 100)}% CI", justify="right")
    t.add_column("chance", justify="right")
    for name, e in record["metrics"].items():
        kind = "num" if "rank" in name else "pct"
        ci = "-" if e["ci_low"] is None else f"{fmt_value(e['ci_low'], kind)} - {fmt_value(e['ci_high'], kind)}"
        t.add_row(name, fmt_value(e["value"], kind), ci, fmt_value(e["chance"], kind))
    stdout.print(t)
    extra = record.get("chance", {}).get("majority_class")
    if extra is not None:
        stdout.print(f"majority-class rate: {100 * extra:.2f}%", highlight=False)


@dataclass(frozen=True)
class Edit:
    """The concept edit of `--debias`: functions on (N, D) embedding arrays, and what the record says of it."""

    images: Callable  # (N, D) image embeddings -> edited (N, D)
    texts: Callable  # (N, D) text embeddings -> edited (N, D); the identity without --debias-text
    record: dict  # {"subspace", "components", "text"}: the results record's protocol.debias


def debias_edit(m, config: EvalCommon) -> Edit | None:
    """The concept edit of `--debias` (vltool.subspace.project_out with the saved subspace), or None."""
    if not config.debias:
        return None
    v = load_subspace(config.debias, m.fingerprint)  # refuses another model's subspace

    def edit(x):
        return project_out(x, v)

    def keep(x):
        return x

    record = {"subspace": str(config.debias), "components": int(v.shape[0]), "text": bool(config.debias_text)}
    return Edit(images=edit, texts=edit if config.debias_text else keep, record=record)


# ----------------------------------------------------------------------------------------------------
# Stages zeroshot and retrieve share (probe's are the same stages): load_eval_input -> require_selected ->
# open_model -> encode_eval_images -> ... -> write_results.
# ----------------------------------------------------------------------------------------------------


def load_eval_input(data: str, config: EvalCommon, where: Sequence[str], split: str | None, **columns) -> LoadedDataset:
    """The evaluation data, its rows selected: a dataset, shards, or a CLIP_benchmark folder (read through
    vltool.importer.clip_benchmark_input); `columns` are load_dataset's checks (images=, texts=, required=).
    Its spec is what the user typed."""
    loaded = load_dataset(clip_benchmark_input(data, config.cache_dir), split=split, where=where, cache_dir=config.cache_dir, **columns)
    loaded.spec = data
    return loaded


def require_selected(loaded: LoadedDataset, data: str, where: Sequence[str]) -> None:
    """No result on nothing: the selection holds at least one row."""
    if loaded.rows == 0:
        raise UsageError(f"no rows of {data!r} are selected (--where {list(where)})")


def open_model(config: EvalCommon) -> tuple:
    """The model to evaluate (vltool.encode.load_eval_model) and the embedding cache it encodes through."""
    return load_eval_model(config.model, config.pretrained, config.cache_dir), EmbeddingCache(config.cache_dir)


def encode_eval_images(m, loaded: LoadedDataset, cache: EmbeddingCache, config: EvalCommon, **kw):
    """The images of `loaded` encoded with the command's batch size, workers and progress (vltool.encode.encode_images)."""
    return encode_images(m, loaded, cache=cache, batch_size=config.batch_size, workers=config.decode_threads, progress=config.progress,
                         precision=config.precision, **kw)


def classification_chance(target, n_cls: int) -> dict:
    """The chance levels of single-label classification: each metric's (vltool.metrics.CLASSIFICATION_METRICS),
    and the majority class's rate."""
    return {**classification_chance_levels(target, n_cls), "majority_class": majority_rate(target, n_cls)}


def data_record(spec: str, loaded: LoadedDataset, **extra) -> dict:
    """The record's "data": what was read and which rows (`extra`: the command's counts and columns)."""
    return {"spec": spec, "fingerprint": loaded.fingerprint, "split": loaded.split, "where": loaded.where, "rows": loaded.rows, **extra}


def _model_dtype(m) -> str | None:
    """The dtype of the model's weights (None for a model without torch parameters)."""
    try:
        return str(next(m.parameters()).dtype).removeprefix("torch.")
    except (AttributeError, StopIteration, TypeError):
        return None


def write_results(
    command: str, config: EvalCommon, inputs: Sequence[LoadedDataset], m, *, task: str, data: dict, protocol: dict, results: dict,
    rows_out: int, stats: dict, timer: provenance.Timer, argv: Sequence[str] | None, out: Path | None, overwrite: bool, examples: dict | None,
    examples_out: Path | None = None,
) -> dict:
    """The results record, written to --out with the per-example outcomes beside it (finish): the provenance
    fields, then "task", "model", "data", "protocol" and `results` ("metrics", "chance", ...), in that order."""
    record = provenance.make(command, config, list(inputs), rows_in=sum(i.rows for i in inputs), rows_out=rows_out, stats=stats, timer=timer,
                             argv=argv, device=encode_device(), dtype=_model_dtype(m))
    record.update({"task": task, "model": model_record(m, config.model, config.pretrained), "data": data, "protocol": protocol, **results})
    record["wall_time_s"] = round(timer.seconds, 3)
    return finish(record, out, overwrite, examples, examples_out)
