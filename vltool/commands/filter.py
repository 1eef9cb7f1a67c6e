"""`vltool filter`: the Typer layer. The work is vltool.filter.filter."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.commands import short_help
from vltool.commands.common import (
    AllowTestDataOpt,
    NoProgressOpt,
    BatchSizeOpt,
    DataArg,
    JsonOpt,
    OldColumnOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SplitOpt,
    WhereOpt,
    handle_errors,
    renamed,
)

HELP = """Keep the captions that look like a reference set's (Santurkar et al., section 4, appendix A.7).

A fastText-style linear classifier on hashed unigrams and bigrams learns to tell REF's captions (e.g.
human-written descriptive ones, COCO-like) from DATA's; it trains on a random 80% of each set and
reports its accuracy on the other 20%. Every DATA row then gets `quality_score`, the probability that
its caption is reference-like, and the rows with quality_score >= --threshold (default 0.5: the rows
classified reference-like, as the paper keeps the COCO-like ones) are kept; --keep-frac keeps a fraction
of the rows, highest scores first, instead.

The classifier is fitted on the DATA rows you select (select training rows: --where split=train) and on
the reference set; no other rows reach it.

Examples:

  vltool filter cc --where split=train --reference coco_val --out cc_filtered

  vltool filter yfcc --reference coco --reference-column captions --keep-frac 0.3 --out yfcc_top30
"""


def filter_command(
    ctx: typer.Context,
    data: DataArg,
    out: OutOpt,
    reference: Annotated[
        str, typer.Option("--reference", help="The reference captions: a save_to_disk dataset or 'emoji'.", show_default=False)
    ],
    threshold: Annotated[
        Optional[float], typer.Option("--threshold", help="Keep rows with quality_score >= this [default: 0.5].")
    ] = None,
    keep_frac: Annotated[
        Optional[float], typer.Option("--keep-frac", help="Instead of --threshold: keep this fraction, highest scores first.")
    ] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="DATA's text column (one string per row).")] = "caption",
    reference_column: Annotated[
        Optional[str],
        typer.Option("--reference-column", help="REF's text column, a string or a list of strings [default: --text-column]."),
    ] = None,
    reference_where: Annotated[
        Optional[list[str]], typer.Option("--reference-where", help="Rows of REF to use, as --where (repeatable).")
    ] = None,
    reference_split: Annotated[Optional[str], typer.Option("--reference-split", help="REF's split if a DatasetDict.")] = None,
    folds: Annotated[
        int, typer.Option("--folds", help="Cross-fitting: k classifiers, each scoring the 1/k it did not train on; 1: one classifier.")
    ] = 5,
    ngrams: Annotated[int, typer.Option("--ngrams", help="Longest word n-gram (2: unigrams and bigrams, the paper's).")] = 2,
    buckets: Annotated[int, typer.Option("--buckets", help="Hashed n-gram buckets.")] = 1 << 20,
    dim: Annotated[int, typer.Option("--dim", help="Embedding size of the classifier.")] = 8,
    epochs: Annotated[int, typer.Option("--epochs", help="Training passes (more for small sets, see --min-steps).")] = 5,
    min_steps: Annotated[int, typer.Option("--min-steps", help="At least this many optimizer steps.")] = 100,
    lr: Annotated[float, typer.Option("--lr", help="Adam learning rate (decays linearly to 0).")] = 0.05,
    l2: Annotated[float, typer.Option("--l2", help="L2 penalty on the classifier's weights.")] = 0.01,
    num_examples: Annotated[int, typer.Option("--num-examples", help="Kept and dropped captions shown.")] = 5,
    where: WhereOpt = None,
    split: SplitOpt = None,
    seed: SeedOpt = 0,
    batch_size: BatchSizeOpt = 256,
    overwrite: OverwriteOpt = False,
    allow_test_data: AllowTestDataOpt = False,
    as_json: JsonOpt = False,
    column: OldColumnOpt = None,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.filter (torch, datasets) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.filter import FilterConfig, filter as run_filter

    text_column = renamed(ctx, "--column", "--text-column", column, text_column)
    config = FilterConfig(
        text_column=text_column, reference_column=reference_column, threshold=threshold, keep_frac=keep_frac,
        folds=folds, ngrams=ngrams, buckets=buckets, dim=dim, epochs=epochs, min_steps=min_steps, lr=lr, l2=l2,
        batch_size=batch_size, seed=seed, num_examples=num_examples, allow_test_data=allow_test_data,
    )
    prov = run_filter(
        data, reference, out, config, where=where or [], split=split, reference_where=reference_where or [],
        reference_split=reference_split, overwrite=overwrite,
    )
    if as_json:
        print_json(prov["stats"] | {"out": str(out)})
    else:
        print_stats(prov["stats"], out)


def print_stats(s: dict, out) -> None:
    stdout = console.out
    h = s["heldout"]
    t = Table(title=f"filter -> {out}")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    if h.get("accuracy") is not None:
        lo, hi = h["accuracy_ci95"]
        acc = f"{h['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] (chance {h['chance_accuracy']:.3f}; n={h['heldout_rows']:,})"
        bal = f"{h['balanced_accuracy']:.3f} (chance 0.500)"
    else:
        acc = bal = "- (no held-out rows)"
    for k, v in (
        ("classifier held-out accuracy [95% CI]", acc),
        ("balanced accuracy", bal),
        ("training rows (source / reference)", f"{s['train_source_rows']:,} / {s['train_reference_captions']:,}"),
        ("rows in", f"{s['rows_in']:,}"),
        ("rows kept", f"{s['rows_out']:,} ({100 * s['kept_frac']:.1f}%)"),
        ("rule", s["rule"]),
        ("most reference-like n-grams", ", ".join(g for g, _ in s["top_ngrams"]["reference_like"][:8]) or "-"),
        ("most source-like n-grams", ", ".join(g for g, _ in s["top_ngrams"]["source_like"][:8]) or "-"),
    ):
        t.add_row(k, v)
    stdout.print(t)
    for title, key in (("kept", "examples_kept"), ("dropped", "examples_dropped")):
        if s[key]:
            stdout.print(f"{title}:", highlight=False)
            for ex in s[key]:
                stdout.print(f"  {ex['quality_score']:.3f}  {ex['caption']}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("filter", help=HELP, short_help=short_help("filter"))(
        handle_errors(filter_command)
    )
