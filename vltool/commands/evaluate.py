"""`vltool evaluate`: several evaluation commands in one process. Not a library function: its input is command lines."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from vltool.commands import click_exceptions, short_help
from vltool.commands.common import NoProgressOpt, handle_errors
from vltool.errors import UsageError

EVALUATIONS = ("zeroshot", "retrieve", "probe")  # the commands a plan's lines may run

HELP = """Run several evaluation commands in one process: each line of PLAN is one `vltool zeroshot`,
`retrieve` or `probe` command, written as after `vltool` (shell quoting; blank lines and # comments are
skipped). The libraries are imported once and each model is loaded once, so a recipe's evaluations of a model
cost one start-up instead of one per command. Each line writes exactly the files it writes when run alone,
and its record names that command; the lines run in order and the first that fails stops the plan, with its
own error and exit code. Every line is parsed, and two lines writing one --out refused, before any runs.

Examples:

  vltool evaluate plan.txt

  vltool evaluate plan.txt --model runs/tiny   (plan.txt: "zeroshot emoji --where split=test --out zs.json", ...)
"""


@dataclass
class EvaluateConfig:
    """Options of `vltool evaluate`, one field per option of the same name."""

    model: str | None = None  # the --model of every line that gives none
    progress: bool = True  # False: --no-progress, added to every line


@dataclass
class Line:
    number: int  # in PLAN, from 1
    words: list[str]  # the command and its arguments, as after `vltool`


def read_plan(group, path: Path, config: EvaluateConfig) -> list[Line]:
    """PLAN's commands; each checked against `group` (vltool's click group): an evaluation command whose
    arguments parse, one --out per line."""
    if str(path) == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise UsageError(f"PLAN {path}: {e.strerror or e}") from None
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        try:
            words = shlex.split(raw, comments=True)
        except ValueError as e:
            raise UsageError(f"PLAN line {number}: {e}") from None
        if not words:
            continue
        if words[0] not in EVALUATIONS:
            raise UsageError(f"PLAN line {number}: {words[0]!r} is not an evaluation command ({', '.join(EVALUATIONS)})")
        if config.model is not None and not any(w == "--model" or w.startswith("--model=") for w in words):
            words = [*words, "--model", config.model]
        if not config.progress and "--no-progress" not in words:
            words = [*words, "--no-progress"]
        lines.append(Line(number, words))
    if not lines:
        raise UsageError(f"PLAN {path}: no command in it")
    _check(group, lines, path)
    return lines


def _check(group, lines: list[Line], plan: Path) -> None:
    """Parse every line as its command of `group` (vltool's click group) would (types, ranges, the option
    checks) and refuse two lines writing one file, before anything runs."""
    written, ClickException = {}, click_exceptions().ClickException
    if str(plan) != "-":
        written[Path(plan).expanduser().resolve()] = 0
    for line in lines:
        command = group.get_command(None, line.words[0])
        try:
            ctx = command.make_context(f"vltool {line.words[0]}", list(line.words[1:]), resilient_parsing=False)
        except typer.Exit:  # --help inside a plan
            raise UsageError(f"PLAN line {line.number}: --help is not an evaluation") from None
        except ClickException as e:
            raise UsageError(f"PLAN line {line.number} ({line.words[0]}): {e.format_message()}") from None
        out = ctx.params.get("out")
        if out is not None:
            path = Path(out).expanduser().resolve()
            if path in written:
                what = "PLAN itself" if written[path] == 0 else f"line {written[path]}"
                raise UsageError(f"PLAN line {line.number}: --out {out} is also written by {what}")
            written[path] = line.number


def run_plan(group, lines: list[Line]) -> int:
    """Run the lines in order, each as `vltool WORDS` of `group` (vltool's click group) would (its record's
    command line is that command); the exit code of the first that fails, else 0."""
    from vltool.encode import shared_models

    argv, ClickException = sys.argv, click_exceptions().ClickException
    with shared_models():
        for i, line in enumerate(lines):
            sys.argv = ["vltool", *line.words]
            try:
                code = group.main(args=list(line.words), prog_name="vltool", standalone_mode=False)
            except ClickException as e:
                e.show()
                code = e.exit_code
            finally:
                sys.argv = argv
            if code:
                rest = len(lines) - i - 1
                print(f"evaluate: PLAN line {line.number} ({line.words[0]}) failed" + (f"; {rest} later line(s) not run" if rest else ""),
                      file=sys.stderr)
                return int(code)
    return 0


def evaluate_command(
    ctx: typer.Context,
    plan: Annotated[Path, typer.Argument(help="A file of evaluation commands, one a line (as after `vltool`); - reads stdin.", show_default=False)],
    model: Annotated[Optional[str], typer.Option("--model", help="The model of every line that gives no --model of its own (any spelling the commands take).", show_default=False)] = EvaluateConfig.model,
    no_progress: NoProgressOpt = False,
) -> None:
    config = EvaluateConfig(model=model, progress=not no_progress)
    group = ctx.find_root().command  # vltool's own group, which is running this command (no import of vltool.cli)
    code = run_plan(group, read_plan(group, plan, config))
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("evaluate", help=HELP, short_help=short_help("evaluate"))(handle_errors(evaluate_command))
