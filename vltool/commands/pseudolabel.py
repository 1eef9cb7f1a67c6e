"""`vltool pseudolabel`: the Typer layer. The work is vltool.pseudolabel.pseudolabel."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.topology import is_main
from vltool.commands import short_help
from vltool.commands.common import AllowTestDataOpt, DeviceOpt, ThreadsOpt, NoProgressOpt, CacheDirOpt, DataArg, JsonOpt, OutOpt, OverwriteOpt, SeedOpt, SplitOpt, WhereOpt, handle_errors
from vltool.commands.evaluation import EvalModelOpt, PretrainedOpt

HELP = """Pseudo bag-of-words captions for images that have none ("A Fistful of Words", 2.3).

Each unaligned image gives --crops seeded random crops; each crop retrieves its --neighbors nearest
intact captions of the aligned data (`caption_original` when it was deformed, else `caption`), with a
model trained on the aligned data. The words of all retrieved captions (tokenised as deform does) are
ranked by --strategy: maxcount, rmtop-maxcount, rmtop-rand, or weighted-count (the paper's best:
count in the neighbours / count in the aligned captions). The top --words become `caption`; the
output has `pseudo_words` (with scores) and `is_pseudo`, and trains together with the aligned data:
`vltool pretrain ALIGNED OUT`. Unaligned images must come from training rows, never evaluation rows.

Examples:

  vltool pseudolabel emoji_unaligned --aligned emoji_aligned --model runs/aligned --out emoji_pseudo

  vltool pseudolabel imgs --aligned cc --model runs/cc --strategy rmtop-maxcount --top-t 1000 --words 4 --out pseudo

  vltool pseudolabel emoji_unaligned --aligned emoji_aligned --model hf:clip-vit-b32 --out emoji_pseudo
"""


def pseudolabel_command(
    data: DataArg,
    aligned: Annotated[str, typer.Option("--aligned", help="The aligned image-caption dataset (or 'emoji').", show_default=False)],
    model: EvalModelOpt,
    out: OutOpt,
    pretrained: PretrainedOpt = None,
    crops: Annotated[int, typer.Option("--crops", min=1, help="Augmented views per image (vltool's choice: 5).")] = 5,
    neighbors: Annotated[int, typer.Option("--neighbors", min=1, help="Nearest captions per view.")] = 10,
    strategy: Annotated[str, typer.Option("--strategy", help="maxcount, rmtop-maxcount, rmtop-rand or weighted-count (the paper's best).")] = "weighted-count",
    top_t: Annotated[int, typer.Option("--top-t", min=0, help="rmtop-*: remove the T most frequent aligned words.")] = 1000,
    words: Annotated[int, typer.Option("--words", min=1, help="Words per pseudo caption.")] = 4,
    where: WhereOpt = None,
    split: SplitOpt = None,
    aligned_where: Annotated[Optional[list[str]], typer.Option("--aligned-where", help="--where for the aligned data.")] = None,
    aligned_split: Annotated[Optional[str], typer.Option("--aligned-split", help="--split for the aligned data.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Images per encoding batch (each gives --crops views).")] = 32,
    cache_dir: CacheDirOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = None,
    overwrite: OverwriteOpt = False,
    allow_test_data: AllowTestDataOpt = False,
    as_json: JsonOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.pseudolabel (datasets, faiss) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.pseudolabel import PseudolabelConfig, pseudolabel

    config = PseudolabelConfig(
        model=model, pretrained=pretrained, crops=crops, neighbors=neighbors, strategy=strategy, top_t=top_t,
        words=words, batch_size=batch_size, cache_dir=str(cache_dir) if cache_dir else None, seed=seed, device=device, threads=threads,
        allow_test_data=allow_test_data,
    )
    prov = pseudolabel(data, aligned, out, config, where=where or [], split=split, aligned_where=aligned_where or [],
                       aligned_split=aligned_split, overwrite=overwrite)
    if not is_main():  # under accelerate launch: one report, from the process that wrote the output
        return
    s = prov["stats"]
    if as_json:
        print_json(s)
        return

    stdout = console.out
    t = Table(title=f"pseudolabel ({config.strategy}) -> {out}")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    t.add_row("unaligned images", f"{s['rows_in']:,}")
    t.add_row("pseudo-captioned rows", f"{s['rows_out']:,}")
    t.add_row("dropped (no words / bad image)", f"{s['dropped_no_words']:,} / {s['bad_images']:,}")
    t.add_row("words per pseudo caption", f"{s['words_per_caption']:.2f}")
    t.add_row("most frequent pseudo words", ", ".join(f"{w} ({c})" for w, c in s["top_pseudo_words"][:10]))
    if s.get("withheld_caption_check"):
        c = s["withheld_caption_check"]
        t.add_row("shares a word with the withheld caption", f"{100 * c['share_with_a_true_word']:.1f}% "
                  f"(shuffled images: {100 * c['permutation_baseline']:.1f}%)")
    for ex in s["examples"][:5]:
        t.add_row(f"example {ex['id']}", ex["caption"])
    stdout.print(t)


def register(app: typer.Typer) -> None:
    app.command("pseudolabel", help=HELP, short_help=short_help("pseudolabel"))(
        handle_errors(pseudolabel_command)
    )
