"""`vltool zeroshot`: the Typer layer. The work is vltool.zeroshot.zeroshot."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool import console
from vltool.topology import is_main
from vltool.commands import short_help
from vltool.commands.common import (
    CacheDirOpt, DataArg, JsonOpt, OldNumProcOpt, OldWorkersOpt, DecodeThreadsOpt, DeviceOpt, ThreadsOpt, decode_threads_option, OverwriteOpt, SeedOpt, SplitOpt, WhereOpt, handle_errors,
)
from vltool.commands.evaluation import (
    BootstrapOpt, EncodeBatchOpt, EncodePrecisionOpt, EvalModelOpt, DebiasOpt, DebiasTextOpt, GroupColumnOpt, NoProgressOpt, PretrainedOpt, ResultsOutOpt, emit,
)

HELP = """Zero-shot classification: each image goes to the class whose prompt embedding is closest.

A class embedding is the renormalised mean of the L2-normalised embeddings of its prompts: --templates
filled with the class name (the `label` ClassLabel names, or --classnames FILE), or its own prompts from
--class-prompts FILE (JSON: class name -> list of prompts). Template sets: auto (the default: the dataset's
own zeroshot_classification_templates.txt, else photo), photo ("a photo of a {}."),
openai-imagenet (CLIP's 80), fff-cifar, fff-food101, fff-caltech101, fff-cars, fff-dtd, fff-sun397,
fff-imagenet (FFF's appendix); or a file with one template per line using {}.

Metrics (CLIP_benchmark's): top-1, top-5 (with at least 5 classes), mean per-class recall; with a
multi-label `labels` column, mean average precision. Each comes with a 95% bootstrap interval and its
chance level. Image embeddings go through the embedding cache (--cache-dir).

Examples:

  vltool zeroshot emoji --where split=test --model runs/tiny

  vltool zeroshot emoji --where split=test --model runs/tiny --templates openai-imagenet --out zs.json

  vltool zeroshot my_data --model open_clip:RN50 --pretrained RN50.pt --class-prompts cupl.json --per-class

  vltool zeroshot cifar10 --split test --model hf:clip-vit-b32
"""


def zeroshot_command(
    ctx: typer.Context,
    data: DataArg,
    model: EvalModelOpt,
    pretrained: PretrainedOpt = None,
    templates: Annotated[str, typer.Option("--templates", help="Template set name or file (one template per line, {} for the class name); auto: the dataset's own (zeroshot_classification_templates.txt in its directory, as a CLIP_benchmark dataset imported by vltool import has), else photo.")] = "auto",
    classnames: Annotated[Optional[Path], typer.Option("--classnames", help="Class names, one per line in label order [default: the ClassLabel names].")] = None,
    class_prompts: Annotated[Optional[Path], typer.Option("--class-prompts", help="JSON {class name: [prompts]}; classes it lacks use --templates.")] = None,
    label_column: Annotated[Optional[str], typer.Option("--label-column", help="Label column [default: label, else labels (multi-label)].")] = None,
    per_class: Annotated[bool, typer.Option("--per-class", help="Print the per-class table too (the results JSON always has it).")] = False,
    present_only: Annotated[bool, typer.Option("--present-classes-only", help="Candidates are only the classes with a selected row (zero-shot on held-out classes).")] = False,
    bootstrap: BootstrapOpt = 1000,
    seed: SeedOpt = 0,
    where: WhereOpt = None,
    split: SplitOpt = None,
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
    num_proc: OldNumProcOpt = None,
    old_workers: OldWorkersOpt = None,
) -> None:
    # vltool.zeroshot (torch, datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.zeroshot import ZeroshotConfig, zeroshot

    decode_threads = decode_threads_option(ctx, decode_threads, old_workers, num_proc)
    config = ZeroshotConfig(
        model=model, pretrained=pretrained, templates=templates,
        classnames=str(classnames) if classnames else None, class_prompts=str(class_prompts) if class_prompts else None,
        label_column=label_column, per_class=per_class, present_classes_only=present_only, bootstrap=bootstrap, seed=seed, batch_size=batch_size, precision=precision,
        decode_threads=decode_threads, device=device, threads=threads, cache_dir=str(cache_dir) if cache_dir else None, progress=not no_progress, debias=str(debias) if debias else None, debias_text=debias_text,
        group_column=group_column,
    )
    record = zeroshot(data, config, where=where or [], split=split, out=out, overwrite=overwrite)
    n_cls = len(record["classnames"])
    p = record["protocol"]
    prompts = f"class prompts {p['class_prompts_file']}" if p["class_prompts_file"] else f"templates {p['templates']}"
    emit(record, f"zeroshot {data} ({record['data']['rows_evaluated']:,} images, {n_cls} classes, {prompts})", as_json)
    if per_class and not as_json:
        print_per_class(record)


def print_per_class(record: dict) -> None:
    stdout = console.out
    if not is_main():
        return
    rows = record["per_class"]
    multilabel = rows and "ap" in rows[0]
    t = Table(title="per class", show_header=True)
    t.add_column("class")
    t.add_column("positives" if multilabel else "images", justify="right")
    cols = ["ap"] if multilabel else [c for c in ("top1", "top5") if c in rows[0]]
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        n = r["positives"] if multilabel else r["support"]
        if n == 0:
            continue
        t.add_row(r["class"], str(n), *["-" if r[c] is None else f"{100 * r[c]:.1f}%" for c in cols])
    stdout.print(t)


def register(app: typer.Typer) -> None:
    app.command("zeroshot", help=HELP, short_help=short_help("zeroshot"))(
        handle_errors(zeroshot_command)
    )
