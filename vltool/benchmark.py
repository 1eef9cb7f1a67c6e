"""`vltool benchmark`: one model over many datasets, zero-shot classification, retrieval and a linear probe
of each, in one table (and JSON) with 95% intervals and chance: CLIP_benchmark's multi-dataset runs.

Each dataset of `--datasets` (a comma-separated list, or a file with one per line, as CLIP_benchmark's
`--dataset FILE`) is a vltool dataset directory (`save_to_disk`, `emoji`) or a CLIP_benchmark dataset in its
WebDataset layout, imported once into `<cache-dir>/clip_benchmark/` (keyed by its files' names, sizes and
times). Its rows are evaluated on `--eval-split` and the probe trained on `--train-split`: splits of a
DatasetDict, or values of a `split` column (`--where split=test`); a dataset with neither is evaluated whole,
without a probe. `--tasks auto` runs what the columns allow: zeroshot with a `label` / `labels` column,
retrieve with `captions` / `caption`, probe with a `label` and training rows.

Each task is the command of the same name, called as a function (`vltool.zeroshot.zeroshot`, ...), so a
number here is the number that command prints, with the same protocol, cache and provenance; the results
JSON holds every task's full record under `results[dataset][task]`.

Why a command and not a recipe: recipes (recipes/*.sh) train and compare variants over seeds with `vltool
report`; this is one evaluation of one model, whose output is one record (one provenance, one --out), the
way `vltool zeroshot` is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import datasets

from vltool import columns as C
from vltool import provenance
from vltool.errors import UsageError, check
from vltool.evaluation import EvalCommon, check_out, is_main
from vltool.importer import clip_benchmark_input
from vltool.io.atomic import write_json_atomic
from vltool.io.builtin import BUILTIN_DATASETS
from vltool.io.index import shard_index
from vltool.io.loading import read_from_disk, resolve_dataset_path
from vltool.probe import PRESETS, ProbeConfig, probe
from vltool.retrieve import RetrieveConfig, retrieve
from vltool.zeroshot import ZeroshotConfig, zeroshot
from vltool.topology import computes

TASKS = ("zeroshot", "retrieve", "probe")
AUTO = "auto"

# The metrics of the summary table (every metric is in the JSON): CLIP_benchmark's headline numbers.
HEADLINE = {
    "zeroshot": ("top1", "top5", "mean_per_class_recall", "mAP"),
    "retrieve": ("image_to_text_R@1", "image_to_text_R@5", "text_to_image_R@1", "text_to_image_R@5"),
    "probe": ("top1", "mean_per_class_recall"),
}


@dataclass
class BenchmarkConfig(EvalCommon):
    """Options of `vltool benchmark`, one field per option of the same name (help: `vltool benchmark --help`)."""

    datasets: str = ""  # comma-separated, or a file with one dataset per line
    tasks: str = AUTO  # auto, or a comma-separated subset of TASKS
    templates: str = "auto"  # zeroshot's --templates
    eval_split: str | None = "test"
    train_split: str | None = "train"
    protocol: str = "clip-benchmark"  # probe's --protocol

    def task_list(self) -> list[str] | None:
        """None for auto."""
        if self.tasks == AUTO:
            return None
        return [t.strip() for t in self.tasks.split(",") if t.strip()]

    def validate(self) -> None:
        problems = self.common_problems()
        if not self.datasets.strip():
            problems.append("--datasets is required: a comma-separated list of datasets, or a file with one per line")
        if self.tasks != AUTO:
            bad = [t for t in self.task_list() or [] if t not in TASKS]
            if bad or not self.task_list():
                problems.append(f"--tasks {self.tasks!r}: auto, or a comma-separated subset of {', '.join(TASKS)}")

        if self.protocol not in PRESETS:
            problems.append(f"--protocol {self.protocol!r}: choose one of {', '.join(PRESETS)}")
        check(problems)


def read_dataset_list(spec: str) -> list[str]:
    """A file with one dataset per line (blank lines and # comments skipped), else a comma-separated list."""
    p = Path(spec).expanduser()
    if p.is_file():
        items = [line.split("#", 1)[0].strip() for line in p.read_text().splitlines()]
        items = [i for i in items if i]
        if not items:
            raise UsageError(f"--datasets {spec}: the file lists no dataset")
    else:
        items = [s.strip() for s in spec.split(",") if s.strip()]
    twice = next((i for n, i in enumerate(items) if i in items[:n]), None)
    if twice is not None:
        raise UsageError(f"--datasets {spec}: {twice!r} is listed twice; list each dataset once")
    return items


def refuse_same_dataset_twice(plans: list) -> None:
    """Two spellings of one dataset (`data`, `./data/`, a link to it) would run it twice, as two rows."""
    seen: dict = {}
    for p in plans:
        where = resolve_dataset_path(p.path).resolve() if p.path in BUILTIN_DATASETS else Path(p.path).expanduser().resolve()
        if where in seen:
            raise UsageError(f"--datasets: {seen[where]!r} and {p.spec!r} are the same dataset ({where}); list each dataset once")
        seen[where] = p.spec


@dataclass
class DatasetPlan:
    """What to run on one dataset, and on which rows."""

    spec: str  # as listed
    path: str  # what load_dataset reads (an imported CLIP_benchmark layout: its copy in the cache)
    eval_split: str | None = None
    eval_where: list[str] = field(default_factory=list)
    train_split: str | None = None
    train_where: list[str] | None = None  # None: no training rows
    tasks: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # task -> why it does not apply
    text_column: str | None = None

    def record(self) -> dict:
        return {"spec": self.spec, "path": self.path, "eval": {"split": self.eval_split, "where": self.eval_where},
                "train": None if self.train_where is None else {"split": self.train_split, "where": self.train_where},
                "tasks": self.tasks, "skipped": self.skipped}


def plan_dataset(spec: str, config: BenchmarkConfig) -> DatasetPlan:
    path = clip_benchmark_input(spec, config.cache_dir)
    index = shard_index(path, config.cache_dir)  # WebDataset shards: their index (the tasks then read it too)
    obj = read_from_disk(index.path if index is not None else resolve_dataset_path(path), spec)
    plan = DatasetPlan(spec=spec, path=path)
    if isinstance(obj, datasets.DatasetDict):
        names = list(obj)
        if config.eval_split in obj:
            plan.eval_split = config.eval_split
        elif len(names) == 1:
            plan.eval_split = names[0]
        else:
            raise UsageError(f"{spec}: no split {config.eval_split!r} to evaluate on (its splits: {names}); choose one with --eval-split")
        if config.train_split in obj and config.train_split != plan.eval_split:
            plan.train_split, plan.train_where = config.train_split, []
        ds = obj[plan.eval_split]
    else:
        ds = obj
        values = set(ds.unique(C.SPLIT)) if C.SPLIT in ds.column_names else set()
        if isinstance(ds.features.get(C.SPLIT), datasets.ClassLabel):  # unique() gives the class numbers
            values = {ds.features[C.SPLIT].int2str(int(v)) for v in values}
        if values and config.eval_split is not None and config.eval_split not in values:  # (was: every row evaluated)
            raise UsageError(f"{spec}: no split {config.eval_split!r} to evaluate on (the values of its {C.SPLIT!r} column: "
                             f"{sorted(map(str, values))}); choose one with --eval-split")
        if config.eval_split in values:
            plan.eval_where = [f"{C.SPLIT}={config.eval_split}"]
            if config.train_split in values and config.train_split != config.eval_split:
                plan.train_where = [f"{C.SPLIT}={config.train_split}"]
    feats = ds.features
    label = isinstance(feats.get(C.LABEL), datasets.ClassLabel)
    multilabel = C.LABELS in feats
    plan.text_column = C.CAPTIONS if C.CAPTIONS in feats else C.CAPTION if C.CAPTION in feats else None
    why = {
        "zeroshot": None if (label or multilabel) else "no label or labels column",
        "retrieve": None if plan.text_column else "no captions or caption column",
        "probe": None if label and plan.train_where is not None else (
            "no single-label ClassLabel column" if not label else f"no training rows (no {config.train_split!r} split)"),
    }
    asked = config.task_list()
    for t in TASKS:
        if asked is not None and t not in asked:
            continue
        if why[t] is None:
            plan.tasks.append(t)
        else:
            plan.skipped[t] = why[t]
    return plan


def task_examples_path(out: Path, position: int, task: str) -> Path:
    """Where a task's per-example outcomes go beside --out X.json: X.<position of the dataset>-<task>.examples.npz
    (its record in results[dataset][task] names the file, as zeroshot's JSON names X.examples.npz)."""
    stem = out.name[: -len(".json")] if out.name.endswith(".json") else out.name
    return out.with_name(f"{stem}.{position}-{task}.examples.npz")


def _run_task(task: str, plan: DatasetPlan, config: BenchmarkConfig, examples_out: Path | None = None) -> dict:
    common = {k: getattr(config, k) for k in EvalCommon.__dataclass_fields__}
    if task == "zeroshot":
        return zeroshot(plan.path, ZeroshotConfig(**common, templates=config.templates), where=plan.eval_where, split=plan.eval_split,
                        examples_out=examples_out)
    if task == "retrieve":
        return retrieve(plan.path, RetrieveConfig(**common, text_column=plan.text_column), where=plan.eval_where, split=plan.eval_split,
                        examples_out=examples_out)

    return probe(plan.path, plan.path, ProbeConfig(**common, protocol=config.protocol), where=plan.train_where,
                 split=plan.train_split, eval_where=plan.eval_where, eval_split=plan.eval_split, examples_out=examples_out)


def summary_rows(results: dict) -> list[dict]:
    """One row per dataset, task and headline metric: value, interval, chance."""
    rows = []
    for spec, tasks in results.items():
        for task, rec in tasks.items():
            for m in HEADLINE[task]:
                e = rec["metrics"].get(m)
                if e is not None:
                    rows.append({"dataset": spec, "task": task, "metric": m, **e})
    return rows


@computes
def benchmark(config: BenchmarkConfig, *, out: str | Path | None = None, overwrite: bool = False,
              argv: Sequence[str] | None = None) -> dict:
    """Run every applicable task on every dataset of `config.datasets`; return the record (written to `out`)."""
    timer = provenance.Timer()
    config.validate()
    specs = read_dataset_list(config.datasets)
    listed = [Path(config.datasets).expanduser()] if Path(config.datasets).expanduser().is_file() else []
    out_path = check_out(out, overwrite, [Path(s).expanduser() for s in specs] + listed, config)
    plans = [plan_dataset(s, config) for s in specs]
    refuse_same_dataset_twice(plans)
    if not any(p.tasks for p in plans):
        raise UsageError("no task applies to any dataset: " + "; ".join(f"{p.spec}: {', '.join(f'{t} ({w})' for t, w in p.skipped.items())}" for p in plans))
    def examples_out(i: int, task: str) -> Path | None:
        return task_examples_path(out_path, i, task) if out_path is not None else None

    taken = [examples_out(i, t) for i, p in enumerate(plans) for t in p.tasks if out_path is not None]
    if not overwrite and any(e.exists() for e in taken):
        raise UsageError(f"{next(e for e in taken if e.exists())} (per-example outcomes written beside --out) exists; "
                         "pass --overwrite to replace it")
    results: dict[str, dict] = {}
    for i, p in enumerate(plans):
        if p.tasks:  # a dataset no task applies to is in record["datasets"] with its reasons
            results[p.spec] = {t: _run_task(t, p, config, examples_out(i, t)) for t in p.tasks}
    first = next(r for tasks in results.values() for r in tasks.values())
    inputs = [{"spec": p.spec, "path": p.path} for p in plans]
    stats = {"datasets": len(plans), "tasks_run": sum(len(p.tasks) for p in plans),
             "tasks_skipped": {p.spec: p.skipped for p in plans if p.skipped}}
    record = provenance.make("benchmark", config, inputs, stats=stats, timer=timer, argv=argv)
    record.update({
        "model": first["model"],
        "datasets": [p.record() for p in plans],
        "table": summary_rows(results),
        "results": results,
    })
    record["wall_time_s"] = round(timer.seconds, 3)
    if out_path is not None and is_main():
        write_json_atomic(out_path, record)
    return record
