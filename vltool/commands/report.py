"""`vltool report`: the Typer layer. The work is vltool.report; this module prints the table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vltool import console
from vltool.commands import short_help
from vltool.commands.common import NoProgressOpt, OverwriteOpt, SeedOpt, handle_errors
from vltool.commands.evaluation import BootstrapOpt

HELP = """Gather a recipe's runs into one table over seeds, paired by seed, as JSON, Markdown and a PNG chart.

RUNS_DIR holds one directory per run, RUNS_DIR/<variant>/seed<N>/, with the JSON files of its
evaluations (zeroshot, retrieve, probe) or any vltool.json. A metric is [LABEL=]RELPATH:KEY: the file
RELPATH in each run directory (".json" may be left off) and KEY in its "metrics", else a dotted path
into the file. The table gives mean +- sd over seeds, the mean 95% bootstrap half-width of one run, the
chance level, and with --baseline each variant's difference from the baseline with its 95% paired
bootstrap interval over the same test examples (from the runs' per-example outcomes, X.examples.npz;
whole groups resampled when the runs were evaluated with --group-column; from 3 seeds, the seeds
resampled too), marked "differs" when the interval excludes 0 and "borderline" when its bootstrap
p-value is within 2 Monte Carlo standard errors of 0.025 after up to --bootstrap-max resamples; --pair A=B adds A's paired difference
from B. With --style, each metric is set beside the same metric in another style of the same test
examples (its file named with the style's suffix), and a last table says where each difference holds:
in every style, in one only, or in none. See docs/evaluation.md.

Examples:

  vltool report runs/fistful --out results/fistful-of-words --baseline intact \\
      --variant intact=Intact --variant bow=Only-BoW \\
      --metric "ZS top-1=zeroshot:top1" --metric "I2T R@1=retrieve:image_to_text_R@1"

  vltool report runs/fff --out results/fff --baseline sigmoid --metric "ZS top-1=zeroshot:top1" \\
      --style "Noto=" --style "OpenMoji=-style2"     # also zeroshot-style2.json: both styles, side by side

  vltool report runs/fff --out results/fff --metric "mined precision=mined/vltool.json:stats.groups.precision"
"""


def report_command(
    runs_dir: Annotated[Path, typer.Argument(help="The recipe's output: RUNS_DIR/<variant>/seed<N>/.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Path stem: writes STEM.json, STEM.md, STEM.png (atomically; an earlier report's are replaced with --overwrite).")],
    metric: Annotated[list[str], typer.Option("--metric", help="[LABEL=]RELPATH:KEY, repeatable, in column order.")],
    variant: Annotated[Optional[list[str]], typer.Option("--variant", help="DIR[=LABEL], repeatable, in row order [default: every variant found].")] = None,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="The variant the others are compared with, on the same test examples and seeds.")] = None,
    pair: Annotated[Optional[list[str]], typer.Option("--pair", help="VARIANT=REFERENCE, repeatable: also the paired difference of VARIANT from REFERENCE (a contrast the baseline table does not hold).")] = None,
    paper: Annotated[Optional[list[str]], typer.Option("--paper", help="VARIANT=TEXT: the paper's finding for the same comparison (a column).")] = None,
    note: Annotated[Optional[list[str]], typer.Option("--note", help="A line below the table (repeatable).")] = None,
    style: Annotated[Optional[list[str]], typer.Option("--style", help="NAME=SUFFIX, repeatable: the same test examples in another art style, its files named with SUFFIX before .json; NAME= (empty) names the metrics as given. Adds each metric's twin and a verdict of where each difference holds.")] = None,
    title: Annotated[Optional[str], typer.Option("--title", help="The table's heading.")] = None,
    recipe: Annotated[Optional[str], typer.Option("--recipe", help="The recipe that made the runs (recorded).")] = None,
    chart: Annotated[bool, typer.Option("--chart/--no-chart", help="Draw STEM.png.")] = True,
    bootstrap: BootstrapOpt = 1000,
    bootstrap_max: Annotated[int, typer.Option("--bootstrap-max", min=0, help="A paired verdict whose bootstrap p-value is within 2 Monte Carlo standard errors of 0.025 draws more resamples (x4 at a time) up to this many before it is reported as borderline.")] = 80_000,  # vltool.outcomes.MAX_RESAMPLES
    allow_mixed_threads: Annotated[bool, typer.Option("--allow-mixed-threads", help="Pair runs whose records name different torch thread counts (their bits may differ; see docs/pretrain.md).")] = False,
    seed: SeedOpt = 0,
    overwrite: OverwriteOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.report (numpy, through vltool.outcomes) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.report import (ReportConfig, build_report, check_report_out, parse_metric, parse_pairs, parse_styles,
                               parse_variant_pairs, render_markdown, write_report)

    config = ReportConfig(
        metrics=[parse_metric(m) for m in metric],
        variants=parse_pairs(variant or [], "--variant"),
        baseline=baseline,
        title=title,
        recipe=recipe,
        paper=dict(parse_pairs(paper or [], "--paper")),
        notes=list(note or []),
        styles=parse_styles(style or []),
        pairs=parse_variant_pairs(pair or []),
        bootstrap=bootstrap,
        bootstrap_max=bootstrap_max,
        allow_mixed_threads=allow_mixed_threads,
        seed=seed,
    )
    check_report_out(runs_dir, out, overwrite)
    report = build_report(runs_dir, config)
    files = write_report(report, out, chart=chart)
    stdout = console.out
    stdout.print(render_markdown(report), markup=False, highlight=False, soft_wrap=True)
    stdout.print("wrote " + ", ".join(files.values()), markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("report", help=HELP, short_help=short_help("report"))(handle_errors(report_command))
