"""`vltool pick-caption`: the Typer layer. The work is vltool.pick_caption.pick_caption."""

from __future__ import annotations

from typing import Annotated

import typer

from vltool import console
from vltool.console import print_json
from vltool.commands import short_help
from vltool.commands.common import NoProgressOpt, DataArg, JsonOpt, OutOpt, OverwriteOpt, SeedOpt, SplitOpt, WhereOpt, handle_errors

HELP = """One caption per image, chosen from a list column: the single-caption data CLIP trains on.

`caption` becomes an entry of --from (default `captions`), per row: random (seeded by --seed and the row
id), first, last, longest or shortest. The previous caption is kept in `caption_original`; rows with no
candidate are dropped and counted. --exclude-caption never picks the current caption (e.g. emoji: a
keyword instead of the name).

Examples:

  vltool pick-caption coco --where split=train --out coco_one_caption

  vltool pick-caption emoji --where split=train --exclude-caption --out emoji_keywords
"""


def pick_caption_command(
    data: DataArg,
    out: OutOpt,
    source: Annotated[str, typer.Option("--from", help="The list-of-strings column to pick from.")] = "captions",
    strategy: Annotated[str, typer.Option("--strategy", help="random | first | last | longest | shortest (ties: the earlier entry).")] = "random",
    exclude_caption: Annotated[bool, typer.Option("--exclude-caption", help="Never pick the row's current caption.")] = False,
    where: WhereOpt = None,
    split_name: SplitOpt = None,
    seed: SeedOpt = 0,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.pick_caption (datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.pick_caption import PickConfig, pick_caption

    prov = pick_caption(data, out, PickConfig(source_column=source, strategy=strategy, exclude_caption=exclude_caption, seed=seed),
                        where=where or [], split_name=split_name, overwrite=overwrite)
    s = prov["stats"]
    if as_json:
        print_json(s)
        return
    stdout = console.out
    stdout.print(f"{s['rows_out']:,} of {s['rows_in']:,} rows, {s['caption_changed']:,} captions changed "
                 f"({s['dropped_no_candidate']:,} rows without a candidate dropped), {s['avg_caption_words']} words on average -> {out}")


def register(app: typer.Typer) -> None:
    app.command("pick-caption", help=HELP, short_help=short_help("pick-caption"))(
        handle_errors(pick_caption_command)
    )
