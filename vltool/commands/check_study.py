"""`vltool check-study`: the Typer layer. The work is vltool.study.check_study."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vltool import console
from vltool.commands import short_help
from vltool.commands.common import NoProgressOpt, handle_errors

HELP = """Check a study's variables in seconds, before its first expensive step; the recipes run it first.

Each NAME=VALUE is one variable of the recipes (docs/recipes.md); an empty value is unset. The first that
cannot be used is refused in one line naming it ("ZEROSHOT_BENCH=/data/flickr: ... is a retrieval set"),
exit 2: a path that does not exist or holds the wrong kind of data for its task, a benchmark without its
splits, test-only training data, an INIT or CAPTIONER that does not resolve, a number that does not parse,
a LAUNCH whose program is not installed. The data are read from their metadata (splits, columns, class
names), never their images; a CLIP_benchmark folder from its layout.

Examples:

  vltool check-study TRAIN_DATA=shards/ ZEROSHOT_BENCH=benchmarks/cifar10 RETRIEVAL_BENCH=benchmarks/flickr8k EVAL_SPLIT=test

  vltool check-study LAUNCH="accelerate launch --multi_gpu --num_processes 8" BATCH=4096 THREADS=1
"""


def _epilog() -> str:
    from vltool.study import VARIABLES  # (no heavy import: the checks import what they read when they run)

    return "Variables: " + "; ".join(f"{v.name}: {v.help}" for v in VARIABLES.values()) + "."


def check_study_command(
    assignments: Annotated[Optional[list[str]], typer.Argument(help="NAME=VALUE, one per variable (e.g. TRAIN_DATA=shards/).", show_default=False)] = None,
    no_progress: NoProgressOpt = False,
) -> None:
    from vltool.study import check_study, parse_assignments

    checked = check_study(parse_assignments(assignments or []))
    console.out.print(f"checked {', '.join(checked) if checked else 'nothing (no variable set)'}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("check-study", help=HELP, epilog=_epilog(), short_help=short_help("check-study"))(handle_errors(check_study_command))
