"""`vltool import`: the Typer layer. The work is vltool.importer.import_data (`import` is a Python keyword)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.commands import short_help
from vltool.commands.common import NoProgressOpt, JsonOpt, NumProcOpt, OutOpt, OverwriteOpt, handle_errors

HELP = """Read image-text data into a vltool dataset (id, image, caption, optional captions and label).

SOURCE is one or more files, a directory, a glob ('shards/*.tar') or a brace pattern
('shards/{00000..00009}.tar'); the format comes from the extensions, or --format:

  csv / tsv / jsonl / parquet   a table with an image-path column and a caption column (open_clip's
                                filepath / title by default; relative paths from --image-root, by
                                default the table's directory)

  webdataset                    tar shards of KEY.jpg + KEY.txt + KEY.json (img2dataset's output)

  parquet                       img2dataset's parquet shards (image bytes in the `jpg` column)

  imagefolder                   a directory with one sub-folder per class (the label)

  coco                          a caption annotation file; the images are found beside it or in --image-root

  clip_benchmark                a dataset of CLIP_benchmark in its WebDataset layout (DIR/train/0.tar...,
                                DIR/test/..., nshards.txt, classnames.txt,
                                zeroshot_classification_templates.txt, dataset_type.txt): a DatasetDict
                                with one split per folder (id, image, label | labels | captions), the
                                class names and templates copied beside it; `vltool zeroshot OUT --split
                                test` uses them (zeroshot, retrieve, probe and benchmark also read DIR
                                directly, imported once into the cache)

Rows with a missing file, an undecodable image or an empty caption are skipped, counted, and listed in
OUT/skipped.jsonl. Ids come from the source's keys (id/key column, sample key, COCO image id, path in
the image folder), else from the row number.

Examples:

  vltool import train.csv --out my_data

  vltool import 'laion/{00000..00099}.tar' --out laion_subset --num-proc 2 --max-side 256

  vltool import annotations/captions_val2017.json --out coco_val --image-root val2017

  vltool import pets/ --out pets --caption-template 'a photo of a {label}'

  vltool import wds_cifar10/ --out cifar10          (CLIP_benchmark's wds_cifar10, downloaded beforehand)
"""


def import_command(
    sources: Annotated[list[str], typer.Argument(help="Files, a directory, a glob or a brace pattern.", show_default=False)],
    out: OutOpt,
    format: Annotated[
        str, typer.Option("--format", help="auto, csv, tsv, jsonl, parquet, webdataset, imagefolder, coco or clip_benchmark.")
    ] = "auto",
    image_column: Annotated[
        Optional[str], typer.Option("--image-column", help="Table column with image paths or bytes (WebDataset: the image extension). Default: filepath, image, path, ...")
    ] = None,
    caption_column: Annotated[
        Optional[str], typer.Option("--caption-column", help="Table column with the caption; a list column fills `captions`. Default: title, caption, text, ...")
    ] = None,
    label_column: Annotated[Optional[str], typer.Option("--label-column", help="Table column whose values become the ClassLabel `label`.")] = None,
    id_column: Annotated[Optional[str], typer.Option("--id-column", help="Table column with row ids. Default: id or key when present, else the row number.")] = None,
    image_root: Annotated[Optional[Path], typer.Option("--image-root", help="Base of relative image paths. Default: the table's directory (COCO: found beside the annotations).")] = None,
    extra_column: Annotated[
        Optional[list[str]], typer.Option("--extra-column", help="Copy this source column (or .json key) as a string column. Repeatable.")
    ] = None,
    max_side: Annotated[Optional[int], typer.Option("--max-side", min=1, help="Resize images whose longer side exceeds this many pixels (aspect kept).")] = None,
    caption_template: Annotated[
        str, typer.Option("--caption-template", help="Image folders: the caption of each image, from its class name.")
    ] = "{label}",
    classnames: Annotated[
        Optional[Path], typer.Option("--classnames", help="Image folders: a file with each class's name, one a line, in the order of the sorted folder names (default: the folder names, underscores as spaces).")
    ] = None,
    num_proc: NumProcOpt = 1,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.importer (datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.importer import ImportConfig, import_data

    config = ImportConfig(
        format=format, image_column=image_column, caption_column=caption_column, label_column=label_column,
        id_column=id_column, image_root=image_root, extra_columns=list(extra_column or []), max_side=max_side,
        caption_template=caption_template, num_proc=num_proc, classnames=classnames,
    )
    prov = import_data(sources, out, config, overwrite=overwrite)
    if as_json:
        print_json(prov["stats"] | {"out": str(out)})
    else:
        print_stats(prov["stats"], out)


def print_stats(s: dict, out) -> None:
    stdout = console.out
    t = Table(title=f"import ({s['format']}) -> {out}")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    t.add_row("source files", f"{s['files']:,}")
    t.add_row("rows read", f"{s['rows_read']:,}")
    t.add_row("rows imported", f"{s['rows_out']:,}")
    t.add_row("rows skipped", f"{s['rows_skipped']:,}")
    for reason, n in s["skipped"].items():
        t.add_row(f"  {reason}", f"{n:,}")
    if s.get("report"):
        t.add_row("skip report", str(Path(out) / s["report"]))
    if s.get("classes") is not None:
        t.add_row("classes", f"{s['classes']:,}")
    if s.get("splits"):
        t.add_row("splits", ", ".join(f"{k} {n:,}" for k, n in s["splits"].items()))
    if s.get("dataset_type"):
        t.add_row("dataset type", s["dataset_type"])
    if s.get("templates"):
        t.add_row("templates", s["templates"])
    for key in ("image_column", "caption_column", "id_column", "label_column", "image_root"):
        if s.get(key):
            t.add_row(key.replace("_", " "), str(s[key]))
    t.add_row("captions column", "yes" if s.get("captions_column") else "no")
    if s.get("max_side"):
        t.add_row("max side", str(s["max_side"]))
    stdout.print(t)


def register(app: typer.Typer) -> None:
    app.command("import", help=HELP, short_help=short_help("import"))(
        handle_errors(import_command)
    )
