"""`vltool retrieve`: the Typer layer. The work is vltool.retrieve.retrieve."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vltool.commands import short_help
from vltool.commands.common import (
    CacheDirOpt, DataArg, JsonOpt, OldNumProcOpt, OldWorkersOpt, DecodeThreadsOpt, DeviceOpt, ThreadsOpt, decode_threads_option, OverwriteOpt, SeedOpt, SplitOpt, WhereOpt, handle_errors,
)
from vltool.commands.evaluation import (
    BootstrapOpt, EncodeBatchOpt, EncodePrecisionOpt, EvalModelOpt, DebiasOpt, DebiasTextOpt, GroupColumnOpt, NoProgressOpt, PretrainedOpt, ResultsOutOpt, emit,
)

HELP = """Image-to-text and text-to-image retrieval: Recall@K, mean and median rank.

Each row is an image and its text(s) from --text-column: a string column, or a list column such as
`captions`, where every text of an image is a correct match and image-to-text counts a hit when any of
them is in the top K (CLIP_benchmark's rule; COCO and Flickr30k have 5 captions per image). Ranks are
counted block by block, never from the full similarity matrix. Each metric comes with a 95% bootstrap
interval (resampling images with all their texts) and the score of a random ranking (chance).

Examples:

  vltool retrieve emoji --where split=test --model runs/tiny

  vltool retrieve emoji --where split=test --model runs/tiny --text-column captions --recall-k 1,5,10 --out r.json

  vltool retrieve coco_5k --model local-dir:runs/tiny/open_clip --json

  vltool retrieve flickr8k --split test --text-column captions --model hf:siglip-base
"""


def retrieve_command(
    ctx: typer.Context,
    data: DataArg,
    model: EvalModelOpt,
    pretrained: PretrainedOpt = None,
    text_column: Annotated[Optional[str], typer.Option("--text-column", show_default=False, help="Text column: a string, or a list of strings per image (e.g. captions) [default: captions on a CLIP_benchmark retrieval set (every caption of an image, as CLIP_benchmark scores it), else caption].")] = None,
    recall_k: Annotated[str, typer.Option("--recall-k", help="The K of Recall@K, comma-separated.")] = "1,5,10",
    bootstrap: BootstrapOpt = 1000,
    seed: SeedOpt = 0,
    where: WhereOpt = None,
    split: SplitOpt = None,
    batch_size: EncodeBatchOpt = None,
    precision: EncodePrecisionOpt = "no",
    text_batch_size: Annotated[int, typer.Option("--text-batch-size", min=1, help="Texts per encoding batch.")] = 256,
    decode_threads: DecodeThreadsOpt = None,
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = None,
    block_mb: Annotated[int, typer.Option("--block-mb", min=1, help="Memory of one block of scores in the ranking pass (MiB).")] = 64,
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
    # vltool.retrieve (datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.retrieve import RetrieveConfig, retrieve

    decode_threads = decode_threads_option(ctx, decode_threads, old_workers, num_proc)
    config = RetrieveConfig(
        model=model, pretrained=pretrained, text_column=text_column, recall_k=recall_k, bootstrap=bootstrap, seed=seed,
        batch_size=batch_size, precision=precision, text_batch_size=text_batch_size, decode_threads=decode_threads, device=device, threads=threads, block_mb=block_mb, cache_dir=str(cache_dir) if cache_dir else None,
        progress=not no_progress, debias=str(debias) if debias else None, debias_text=debias_text,
        group_column=group_column,
    )
    record = retrieve(data, config, where=where or [], split=split, out=out, overwrite=overwrite)
    d = record["data"]
    emit(record, f"retrieve {data} ({d['images']:,} images, {d['texts']:,} texts from {d['text_column']!r})", as_json)


def register(app: typer.Typer) -> None:
    app.command("retrieve", help=HELP, short_help=short_help("retrieve"))(
        handle_errors(retrieve_command)
    )
