"""`vltool export`: the Typer layer. The work is vltool.export.export."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.errors import UsageError
from vltool.commands import short_help
from vltool.commands.common import NoProgressOpt, DataArg, JsonOpt, NumProcOpt, OutOpt, OverwriteOpt, SplitOpt, WhereOpt, handle_errors

HELP = """Write a dataset as WebDataset shards or open_clip's CSV layout, for open_clip's trainer as is; or a
model fine-tuned from a Hugging Face CLIP / SigLIP back in transformers' layout.

  webdataset   OUT/00000.tar, ...: KEY.jpg + KEY.txt (caption) + KEY.json (the other columns), and
               OUT/sizes.json, so open_clip needs no --train-num-samples

  csv          OUT/data.csv (tab-separated: filepath, title, id, label) and OUT/images/

  hf           (DATA is a model: a RUN_DIR of `vltool pretrain --init hf:DIR`) OUT/config.json,
               model.safetensors, the tokenizer and image processor files:
               transformers.AutoModel.from_pretrained(OUT) loads it unchanged

The printed open_clip command trains on the result unchanged.

Examples:

  vltool export emoji --to webdataset --out emoji_wds --where split=train

  python -m open_clip_train.main --dataset-type webdataset --train-data 'emoji_wds/{00000..00000}.tar' ...

  vltool export my_data --to csv --out my_csv

  vltool export runs/siglip-ft --to hf --out siglip-ft
"""


def export_command(
    data: DataArg,
    out: OutOpt,
    to: Annotated[str, typer.Option("--to", help="webdataset or csv (DATA is a dataset); hf (DATA is a model started from hf:DIR).")] = "webdataset",
    shard_size: Annotated[int, typer.Option("--shard-size", min=1, help="Samples per tar shard (csv: per image folder).")] = 10_000,
    image_format: Annotated[str, typer.Option("--image-format", help="jpg or png: the format of every image written.")] = "jpg",
    jpeg_quality: Annotated[int, typer.Option("--jpeg-quality", min=1, max=100, help="Quality of re-encoded JPEGs (JPEG sources are copied unchanged).")] = 95,
    where: WhereOpt = None,
    split: SplitOpt = None,
    num_proc: NumProcOpt = 1,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.export (datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.export import ExportConfig, export, export_hf_model

    if to == "hf":
        d = ExportConfig  # the options' defaults: an option at its default was not given
        dataset_only = [o for o, given in (("--where", bool(where)), ("--split", split is not None), ("--shard-size", shard_size != d.shard_size),
                                           ("--image-format", image_format != d.image_format), ("--jpeg-quality", jpeg_quality != d.jpeg_quality),
                                           ("--num-proc", num_proc != d.num_proc)) if given]
        if dataset_only:
            raise UsageError(f"--to hf writes a model: {', '.join(dataset_only)} apply to datasets only")
        prov = export_hf_model(data, out, overwrite=overwrite)
        if as_json:
            print_json(prov["stats"] | {"out": str(out)})
        else:
            console.out.print(f"export (hf) -> {out}\nload with: {prov['stats']['load_with']}", highlight=False, markup=False)
        return
    config = ExportConfig(to=to, shard_size=shard_size, image_format=image_format, jpeg_quality=jpeg_quality, num_proc=num_proc)
    prov = export(data, out, config, where=where or [], split=split, overwrite=overwrite)
    if as_json:
        print_json(prov["stats"] | {"out": str(out)})
    else:
        print_stats(prov["stats"], out)


def print_stats(s: dict, out) -> None:
    stdout = console.out
    t = Table(title=f"export ({s['to']}) -> {out}")
    t.add_column("statistic")
    t.add_column("value", overflow="fold")
    t.add_row("rows in", f"{s['rows_in']:,}")
    t.add_row("samples written", f"{s['rows_out']:,}")
    for reason, n in s["skipped"].items():
        t.add_row(f"  skipped: {reason}", f"{n:,}")
    if s.get("shards") is not None:
        t.add_row("shards", f"{s['shards']:,}")
    t.add_row("images re-encoded", f"{s['images_reencoded']:,} ({s['image_format']})")
    t.add_row("sample keys", s["keys_from"])
    t.add_row("train data", s["train_data"])
    stdout.print(t)
    stdout.print(f"train with open_clip:\n  {s['open_clip_command']}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("export", help=HELP, short_help=short_help("export"))(handle_errors(export_command))
