"""`vltool mine-positives`: the Typer layer. The work is vltool.mine_positives.mine_positives."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.topology import is_main
from vltool.commands import short_help
from vltool.commands.common import (
    NoProgressOpt,
    CacheDirOpt, DataArg, JsonOpt, OldNumProcOpt, OldWorkersOpt, DecodeThreadsOpt, DeviceOpt, ThreadsOpt, decode_threads_option, OverwriteOpt, SeedOpt, SplitOpt, WhereOpt, handle_errors,
)
from vltool.commands.evaluation import EncodeBatchOpt, EvalModelOpt, PretrainedOpt
from vltool.mine_positives import (  # vltool.mine_positives keeps datasets lazy: light to import
    P_II, P_IT, P_IT_TT, P_TT, MinePositivesConfig, mine_positives,
)

HELP = f"""Repair false negatives: FFF's positive mining over the whole dataset (FFF, 4.1 and 4.3).

Image i and the text of row j are positives when
M_ij = (S_it > p1) OR (S_ii > p2) OR ((S_tt > p3) AND (S_it > p1')),
with cosine similarities from --model (defaults: FFF's p1={P_IT}, p2={P_II}, p3={P_TT}, p1'={P_IT_TT},
chosen for its model: use --calibrate to see this model's true-pair similarities). Every pair is found
with faiss range searches; writes `positives` (ids of the rows whose text is a positive for this row's
image, never the row itself) and `positive_scores` ([S_it, S_ii, S_tt] of each), which
`vltool pretrain --loss sigmoid` reads. Mine training rows only (--where split=train).

Examples:

  vltool mine-positives emoji --where split=train --model runs/tiny --out emoji_mined --group-column base_id

  vltool mine-positives emoji --where split=train --model runs/tiny --calibrate --dry-run

  vltool mine-positives emoji --where split=train --model hf:siglip-base --out emoji_mined
"""


def mine_positives_command(
    ctx: typer.Context,
    data: DataArg,
    model: EvalModelOpt,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="The output dataset (not needed with --dry-run).")] = None,
    pretrained: PretrainedOpt = MinePositivesConfig.pretrained,
    p_it: Annotated[float, typer.Option("--p-it", help="p1: image-text threshold.")] = P_IT,
    p_ii: Annotated[float, typer.Option("--p-ii", help="p2: image-image threshold.")] = P_II,
    p_tt: Annotated[float, typer.Option("--p-tt", help="p3: text-text threshold (with --p-it-tt).")] = P_TT,
    p_it_tt: Annotated[float, typer.Option("--p-it-tt", help="p1': the image-text threshold of the third term.")] = P_IT_TT,
    calibrated: Annotated[bool, typer.Option("--calibrated-thresholds", help="Set p1 and p1' from this model's true pairs as FFF did (mean S_it - 0.02 and - 0.05); p2, p3 stay.")] = MinePositivesConfig.calibrated_thresholds,
    terms: Annotated[str, typer.Option("--terms", help="Terms of M used, a subset of it,ii,tt (FFF Table 5's ablation).")] = MinePositivesConfig.terms,
    text_column: Annotated[str, typer.Option("--text-column", help="caption, or a list column such as captions (section 4.3).")] = MinePositivesConfig.text_column,
    max_positives: Annotated[int, typer.Option("--max-positives", min=1, help="Cap on positives per row.")] = MinePositivesConfig.max_positives,
    index: Annotated[str, typer.Option("--index", help="flat (exact, faiss), ivf (approximate, faiss; reports its recall) or blocked (exact: torch matmul in blocks, bf16 on a GPU with an exact float32 recheck near the thresholds; the queries spread over the processes of `accelerate launch`).")] = MinePositivesConfig.index,
    nprobe: Annotated[int, typer.Option("--nprobe", min=1, help="ivf: cells visited per query.")] = MinePositivesConfig.nprobe,
    recall_sample: Annotated[int, typer.Option("--recall-sample", min=1, help="ivf: rows whose exact positives measure its recall.")] = MinePositivesConfig.recall_sample,
    group_column: Annotated[Optional[str], typer.Option("--group-column", help="Report how many mined pairs share this column's value (e.g. base_id).")] = MinePositivesConfig.group_column,
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Print the true pairs' S_it and the thresholds FFF's recipe gives.")] = MinePositivesConfig.calibrate,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Statistics for a grid of thresholds; write nothing.")] = MinePositivesConfig.dry_run,
    where: WhereOpt = None,
    split: SplitOpt = None,
    batch_size: EncodeBatchOpt = MinePositivesConfig.batch_size,
    decode_threads: DecodeThreadsOpt = MinePositivesConfig.decode_threads,
    device: DeviceOpt = MinePositivesConfig.device,
    threads: ThreadsOpt = MinePositivesConfig.threads,
    cache_dir: CacheDirOpt = MinePositivesConfig.cache_dir,
    seed: SeedOpt = MinePositivesConfig.seed,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
    num_proc: OldNumProcOpt = None,
    old_workers: OldWorkersOpt = None,
    no_progress: NoProgressOpt = False,
) -> None:
    decode_threads = decode_threads_option(ctx, decode_threads, old_workers, num_proc)
    config = MinePositivesConfig(
        model=model, pretrained=pretrained, p_it=p_it, p_ii=p_ii, p_tt=p_tt, p_it_tt=p_it_tt, terms=terms, calibrated_thresholds=calibrated, text_column=text_column,
        max_positives=max_positives, index=index, nprobe=nprobe, recall_sample=recall_sample, group_column=group_column, calibrate=calibrate,
        dry_run=dry_run, batch_size=batch_size, decode_threads=decode_threads, device=device, threads=threads, cache_dir=str(cache_dir) if cache_dir else None, seed=seed,
    )
    prov = mine_positives(data, out, config, where=where or [], split=split, overwrite=overwrite)
    if not is_main():  # under accelerate launch: one report, from the process that wrote the output
        return
    if as_json:
        print_json(prov["stats"])
        return
    print_report(prov["stats"], config, out)


def print_report(s: dict, config, out) -> None:
    stdout = console.out
    if config.calibrate or config.dry_run:
        c = s["calibration"]
        t = Table(title=f"S_it of the {c['true_pairs']:,} true pairs (calibration)")
        for k in ["mean", "std", *c["quantiles"]]:
            t.add_column(k, justify="right")
        t.add_row(f"{c['mean']:.4f}", f"{c['std']:.4f}", *[f"{v:.4f}" for v in c["quantiles"].values()])
        stdout.print(t)
        sg = c["suggested"]
        stdout.print(f"FFF's recipe for this model: --p-it {sg['p_it']} --p-it-tt {sg['p_it_tt']} "
                     f"(--p-ii {sg['p_ii']} --p-tt {sg['p_tt']} as published)")
    if config.dry_run:
        t = Table(title="dry run: positives for a grid of thresholds (nothing written)")
        for k in ["p_it", "p_ii", "p_tt", "p_it_tt", "rows with positives", "pairs", "mean/row", "capped"]:
            t.add_column(k, justify="right")
        has_groups = any("groups" in g for g in s["grid"])
        if has_groups:
            t.add_column("same group", justify="right")
        for g in s["grid"]:
            th = g["thresholds"]
            row = [f"{th['p_it']:.3f}", f"{th['p_ii']:.3f}", f"{th['p_tt']:.3f}", f"{th['p_it_tt']:.3f}",
                   f"{g['rows_with_positives']:,}", f"{g['pairs']:,}", f"{g['mean_positives_per_row']:.2f}", f"{g['rows_capped']:,}"]
            if has_groups:
                p = g["groups"]["precision"]
                row.append("-" if p is None else f"{100 * p:.1f}%")
            t.add_row(*row)
        stdout.print(t)
        return
    t = Table(title=f"mine-positives -> {out}")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    t.add_row("rows mined", f"{s['rows_mined']:,} (skipped {s['rows_skipped']:,})")
    t.add_row("rows that gained positives", f"{s['rows_with_positives']:,}")
    t.add_row("positive pairs", f"{s['pairs']:,} (mean {s['mean_positives_per_row']:.2f} per row, max {s['max_positives_per_row']})")
    t.add_row("rows at the cap", f"{s['rows_capped']:,} (--max-positives {config.max_positives})")
    for k, v in s["share_by_term"].items():
        t.add_row(f"share found by {k}", f"{100 * v:.1f}% (only this term: {100 * s['share_only_term'][k]:.1f}%)")
    if "groups" in s:
        g = s["groups"]
        prec = "-" if g["precision"] is None else f"{100 * g['precision']:.1f}%"
        rec = "-" if g["recall"] is None else f"{100 * g['recall']:.1f}%"
        t.add_row(f"mined pairs sharing {g['column']}", f"{prec} (random pairs: {100 * g['random_pair_rate']:.2f}%)")
        t.add_row(f"same-{g['column']} pairs recovered", rec)
    if "ivf_recall" in s:
        t.add_row("ivf recall vs exact", f"{s['ivf_recall']['recall']} on {s['ivf_recall']['sample_rows']:,} rows")
    stdout.print(t)
    h = Table(title="positives per row")
    for k in s["histogram"]:
        h.add_column(k, justify="right")
    h.add_row(*[f"{v:,}" for v in s["histogram"].values()])
    stdout.print(h)


def register(app: typer.Typer) -> None:
    app.command("mine-positives", help=HELP, short_help=short_help("mine-positives"))(
        handle_errors(mine_positives_command)
    )
