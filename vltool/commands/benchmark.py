"""`vltool benchmark`: the Typer layer. The work is vltool.benchmark.benchmark."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich import box
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.topology import is_main
from vltool.commands import short_help
from vltool.commands.common import CacheDirOpt, DecodeThreadsOpt, DeviceOpt, ThreadsOpt, JsonOpt, OverwriteOpt, SeedOpt, handle_errors
from vltool.commands.evaluation import (
    BootstrapOpt, DebiasOpt, DebiasTextOpt, EncodeBatchOpt, EncodePrecisionOpt, EvalModelOpt, GroupColumnOpt, NoProgressOpt, PretrainedOpt, ResultsOutOpt,
)

HELP = """One model over many datasets: zero-shot classification, retrieval and a linear probe of each, in one
table with 95% intervals and chance (CLIP_benchmark's multi-dataset runs).

--datasets is a comma-separated list, or a file with one dataset per line. A dataset is a vltool dataset
(save_to_disk, or emoji) or a CLIP_benchmark dataset in its WebDataset layout (DIR/test/0.tar, ...,
classnames.txt, zeroshot_classification_templates.txt), imported once into the cache. Rows come from
--eval-split (the probe trains on --train-split): splits of a DatasetDict, or values of a `split` column.
--tasks auto runs what each dataset's columns allow: zeroshot (label / labels, with the dataset's own
templates when it carries them), retrieve (captions / caption), probe (label, and training rows). Each
number is what `vltool zeroshot` / `retrieve` / `probe` prints for it; --out holds every full record.

Examples:

  vltool benchmark --model hf:clip-vit-b32 --datasets wds_cifar10,wds_flickr8k --out bench.json

  vltool benchmark --model runs/tiny --datasets emoji --tasks zeroshot,probe

  vltool benchmark --model runs/tiny --datasets my_benchmarks.txt --bootstrap 200 --json
"""


def benchmark_command(
    model: EvalModelOpt,
    datasets: Annotated[str, typer.Option("--datasets", help="Datasets: comma-separated, or a file with one per line (vltool datasets or CLIP_benchmark layouts).", show_default=False)] = "",
    pretrained: PretrainedOpt = None,
    tasks: Annotated[str, typer.Option("--tasks", help="auto (what each dataset's columns allow), or a comma-separated subset of zeroshot, retrieve, probe.")] = "auto",
    templates: Annotated[str, typer.Option("--templates", help="zeroshot: template set name or file; auto: each dataset's own (zeroshot_classification_templates.txt in its directory), else photo.")] = "auto",
    eval_split: Annotated[Optional[str], typer.Option("--eval-split", help="The rows evaluated: this split of a DatasetDict, or these values of a `split` column (a dataset with one split is evaluated whole).")] = "test",
    train_split: Annotated[Optional[str], typer.Option("--train-split", help="probe: the rows the probe is fitted on (a split, or a `split` column value).")] = "train",
    protocol: Annotated[str, typer.Option("--protocol", help="probe: the protocol (see vltool probe --help).")] = "clip-benchmark",
    bootstrap: BootstrapOpt = 1000,
    seed: SeedOpt = 0,
    batch_size: EncodeBatchOpt = None,
    precision: EncodePrecisionOpt = "no",
    decode_threads: DecodeThreadsOpt = None,
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = None,
    cache_dir: CacheDirOpt = None,
    out: ResultsOutOpt = None,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    group_column: GroupColumnOpt = None,
    debias: DebiasOpt = None,
    debias_text: DebiasTextOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.benchmark (torch, datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.benchmark import BenchmarkConfig, benchmark

    config = BenchmarkConfig(
        model=model, pretrained=pretrained, datasets=datasets, tasks=tasks, templates=templates, eval_split=eval_split,
        train_split=train_split, protocol=protocol, bootstrap=bootstrap, seed=seed, batch_size=batch_size, precision=precision, decode_threads=decode_threads, device=device, threads=threads,
        cache_dir=str(cache_dir) if cache_dir else None, progress=not no_progress, debias=str(debias) if debias else None,
        debias_text=debias_text, group_column=group_column,
    )
    record = benchmark(config, out=out, overwrite=overwrite)
    if not is_main():
        return
    if as_json:
        print_json(record)
        return
    print_table(record)


def print_table(record: dict) -> None:
    stdout = console.out
    # 80 columns hold a row of the widest headline metric (mean_per_class_recall, image_to_text_R@1) with a
    # dataset name of 14 characters (emoji-openmoji) whole: no outer edge, one rule under the header, a single
    # space between columns, the interval's bounds without their % signs. Metric names and numbers are never
    # cut; a longer dataset path folds.
    t = Table(title=f"benchmark of {record['model']['spec']}", show_header=True, box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, collapse_padding=True, padding=(0, 1))
    metric_width = max([len("metric"), *(len(r["metric"]) for r in record["table"])])
    t.add_column("dataset", overflow="fold", min_width=len("dataset"))
    t.add_column("task", no_wrap=True)
    t.add_column("metric", no_wrap=True, min_width=metric_width)
    for c in ("value", "95% CI", "chance"):
        t.add_column(c, justify="right", no_wrap=True)

    def fmt(name, x, unit=True):
        return "-" if x is None else f"{x:.2f}" if "rank" in name else f"{100 * x:.2f}" + ("%" if unit else "")

    for r in record["table"]:
        ci = "-" if r["ci_low"] is None else f"{fmt(r['metric'], r['ci_low'], False)}-{fmt(r['metric'], r['ci_high'], False)}"
        t.add_row(r["dataset"], r["task"], r["metric"], fmt(r["metric"], r["value"]), ci, fmt(r["metric"], r["chance"]))
    stdout.print(t)
    for d in record["datasets"]:
        for task, why in d["skipped"].items():
            stdout.print(f"{d['spec']}: {task} not run ({why})", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("benchmark", help=HELP, short_help=short_help("benchmark"))(
        handle_errors(benchmark_command)
    )
