"""`vltool deform`: the Typer layer. The work is vltool.deform.deform."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.commands import short_help
from vltool.commands.common import (
    NoProgressOpt,
    DataArg,
    JsonOpt,
    NumProcOpt,
    OldColumnOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SplitOpt,
    WhereOpt,
    handle_errors,
    renamed,
)
from vltool.deform import DeformConfig, base_ops, deform, ops_help  # vltool.deform keeps datasets lazy: light to import

HELP = f"""Turn captions into bags of words ("A Fistful of Words", section 2.2).

Operations (comma-separated in --ops; Keep is always applied last, the others are filters whose order
does not matter):

{ops_help()}

A seeded --base-frac of the rows (default 10%) stays intact as the base set; {base_ops()}
count words on those rows only. Rows whose caption becomes empty are dropped and counted.

Examples:

  vltool deform emoji --out bow --ops default --where split=train

  vltool deform my_data --out only_bow --ops shuffle,rmstop,keep4 --base-frac 0
"""


def deform_command(
    ctx: typer.Context,
    data: DataArg,
    out: OutOpt,
    ops: Annotated[str, typer.Option("--ops", help="Operations, comma-separated, or 'default'.")] = DeformConfig.ops,
    base_frac: Annotated[
        float, typer.Option("--base-frac", help="Fraction of rows kept intact as the base set; 0 deforms all rows.")
    ] = DeformConfig.base_frac,
    text_column: Annotated[str, typer.Option("--text-column", help="The text column to deform.")] = DeformConfig.text_column,
    where: WhereOpt = None,
    split: SplitOpt = None,
    seed: SeedOpt = DeformConfig.seed,
    num_proc: NumProcOpt = DeformConfig.num_proc,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    column: OldColumnOpt = None,
    no_progress: NoProgressOpt = False,
) -> None:
    text_column = renamed(ctx, "--column", "--text-column", column, text_column)
    config = DeformConfig(ops=ops, base_frac=base_frac, text_column=text_column, seed=seed, num_proc=num_proc)
    prov = deform(data, out, config, where=where or [], split=split, overwrite=overwrite)
    for w in prov["stats"].get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    if as_json:
        print_json(prov["stats"] | {"out": str(out)})
    else:
        print_stats(prov["stats"], out)


def print_stats(s: dict, out) -> None:
    stdout = console.out
    t = Table(title=f"deform {s['ops']} -> {out}", show_header=True)
    t.add_column("statistic")
    t.add_column("value", justify="right")
    rows = [
        ("rows in", f"{s['rows_in']:,}"),
        ("base rows (intact)", f"{s['base_rows']:,}"),
        ("deformed rows", f"{s['deformed_rows']:,}"),
        ("rows dropped (empty)", f"{s['rows_dropped_empty']:,}"),
        ("rows out", f"{s['rows_out']:,}"),
        ("dataset size change", f"{s['dataset_size_change_pct']:+.2f}%"),
        ("avg caption length before (words)", f"{s['avg_caption_len_before']:.2f}"),
        ("avg caption length after (words)", f"{s['avg_caption_len_after']:.2f}"),
    ]
    if s.get("base_vocab_size") is not None:
        rows.append(("base vocabulary", f"{s['base_vocab_size']:,}"))
    if s["rmtopfreq_words"]:
        rows.append(("most frequent base words (removed)", ", ".join(w for w, _ in s["rmtopfreq_words"][:10])))
    rows.append(("top removed words", ", ".join(f"{w} ({c})" for w, c in s["top_removed_words"][:10]) or "-"))
    rows.append(("stop words", s["stopwords"]))
    for k, v in rows:
        t.add_row(k, v)
    stdout.print(t)


def register(app: typer.Typer) -> None:
    app.command("deform", help=HELP, short_help=short_help("deform"))(
        handle_errors(deform_command)
    )
