"""`vltool split`: the Typer layer. The work is vltool.split.split."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vltool import console
from vltool.console import print_json
from vltool.commands import short_help
from vltool.commands.common import (
    NoProgressOpt,
    DataArg, JsonOpt, OldColumnOpt, OutOpt, OverwriteOpt, SeedOpt, SplitOpt, WhereOpt, handle_errors, renamed,
)

HELP = """Assign rows to named parts, whole groups at a time, in a new column (--part-column, default `part`).

Groups (--by, e.g. base_id) are shuffled with --seed and cut at the fractions of --parts, so rows of one
group never straddle two parts. Select a part afterwards with --where part=NAME.

Examples:

  vltool split emoji --where split=train --by base_id --parts aligned=0.5,unaligned=0.5 --out emoji_halves

  vltool pseudolabel emoji_halves --where part=unaligned --aligned emoji_halves --aligned-where part=aligned ...

  vltool split emoji --where split=train --by base_id --parts aligned=0.5,unaligned=0.5 --separate --out halves
  (then halves/aligned and halves/unaligned are datasets of their own)
"""


def split_command(
    ctx: typer.Context,
    data: DataArg,
    out: OutOpt,
    parts: Annotated[str, typer.Option("--parts", help="NAME=FRACTION,... summing to 1.")] = "a=0.5,b=0.5",
    by: Annotated[Optional[str], typer.Option("--by", help="Group column: rows sharing a value go to the same part.")] = None,
    part_column: Annotated[str, typer.Option("--part-column", help="The column written: each row's part name.")] = "part",
    replace_column: Annotated[bool, typer.Option("--replace-column", help="Let --part-column replace a column the data already has (refused otherwise).")] = False,
    separate: Annotated[bool, typer.Option("--separate", help="Write each part as its own dataset, OUT/NAME (instead of one dataset).")] = False,
    where: WhereOpt = None,
    split_name: SplitOpt = None,
    seed: SeedOpt = 0,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    column: OldColumnOpt = None,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.split (datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.split import SplitConfig, split

    part_column = renamed(ctx, "--column", "--part-column", column, part_column)
    prov = split(data, out, SplitConfig(parts=parts, by=by, part_column=part_column, seed=seed, separate=separate, replace_column=replace_column), where=where or [],
                 split_name=split_name, overwrite=overwrite)
    s = prov["stats"]
    if as_json:
        print_json(s)
        return
    stdout = console.out
    rows = ", ".join(f"{k}: {v:,}" for k, v in s["rows"].items())
    stdout.print(f"{s['groups']:,} groups{' of ' + s['by'] if s['by'] else ''} -> {rows} rows in column {s['column']!r} -> {out}")


def register(app: typer.Typer) -> None:
    app.command("split", help=HELP, short_help=short_help("split"))(
        handle_errors(split_command)
    )
