"""The `vltool` command: the subcommands of vltool.commands.TABLE. Nothing heavy is imported here, and a
command's module is imported only when that command runs or prints its own help (`LazyCommands`)."""

from __future__ import annotations

import copy
import functools
import importlib
import re
import sys
from collections.abc import MutableMapping

from typing import Annotated, Optional

import typer
import typer.core
from rich.markup import escape

from vltool import __version__
from vltool.commands import TABLE, click_exceptions


def as_markup(text: str) -> str:
    """Rich markup that renders as `text`: `[...]` escaped, and emoji codes (`RELPATH:KEY:` holds `:key:`)
    cut by an empty style, so that rich prints every character as written."""
    return re.sub(r":(?=\S*?:)", ":[b][/b]", escape(text))


def reflow(text: str) -> str:
    """Paragraphs of prose joined into one line each, so the terminal wraps them; paragraphs holding an
    indented line (examples, lists) are kept as written."""
    paragraphs = text.split("\n\n")
    return "\n\n".join(p if any(line.startswith((" ", "\t")) for line in p.splitlines()) else " ".join(p.split("\n"))
                       for p in paragraphs)


def _markup_escaped(command):
    """A copy of `command` whose help texts (its own and its parameters') are plain text made markup."""
    command = copy.copy(command)
    for attr in ("help", "short_help", "epilog"):
        if getattr(command, attr, None):
            setattr(command, attr, as_markup(reflow(getattr(command, attr))))
    command.params = [copy.copy(p) for p in command.params]
    for param in command.params:
        if getattr(param, "help", None):
            param.help = as_markup(param.help)
    return command


# Options whose empty value means something; any other option given "" (or only spaces) is refused: an empty
# value was read as "not given" (`--init ''` trained from scratch, `--group-column ''` resampled single images,
# `split --by ''` split rows, `--image-root ''` read the current directory). --out has its own check
# (vltool.io.require_output_name); debias --zeroshot-label '' means "no zero-shot accuracy".
EMPTY_MEANS_SOMETHING = {"--out", "--zeroshot-label"}


def empty_option(command, ctx, args: list[str]) -> str | None:
    """The first option of `command` given an empty value in the command line `args`, or None. Read from the
    raw values, before Typer makes a Path of "" (which is "."). A line that does not parse is left to click."""
    if any(h in args for h in ctx.help_option_names):
        return None
    try:
        opts, _, _ = command.make_parser(ctx).parse_args(args=list(args))
    except Exception:  # click's own parse reports it, with the usual message
        return None
    for p in command.get_params(ctx):
        if p.param_type_name != "option" or getattr(p, "is_flag", False) or p.name not in opts:
            continue
        values = opts[p.name]
        values = values if isinstance(values, (list, tuple)) else [values]
        if p.opts[0] not in EMPTY_MEANS_SOMETHING and any(isinstance(v, str) and not v.strip() for v in values):
            return p.opts[0]
    return None


def _parse_refusing_empty_values(command, parse_args, ctx, args):
    opt = empty_option(command, ctx, args)
    if opt is not None:
        raise click_exceptions().UsageError(f"{opt} is empty (''); an empty value is not taken as \"not given\": give a "
                                            f"value, or leave {opt} out for its default", ctx=ctx)
    return parse_args(command, ctx, args)


class LazyCommands(MutableMapping):
    """click's `Group.commands` over vltool.commands.TABLE: a command's module is imported, and its click
    command built, when the command is first looked up. `vltool --help` lists the table's one-line helps
    without looking any command up (PlainHelpGroup.format_help), so it imports no command module."""

    def __init__(self, rich_markup_mode):
        self._built: dict = {}
        self._rich_markup_mode = rich_markup_mode

    def __getitem__(self, name):
        if name not in self._built:
            if name not in TABLE:
                raise KeyError(name)
            sub = typer.Typer()
            importlib.import_module(f"vltool.commands.{TABLE[name][0]}").register(sub)
            (info,) = sub.registered_commands
            self._built[name] = typer.main.get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode=self._rich_markup_mode)
        return self._built[name]

    def __setitem__(self, name, command):
        self._built[name] = command

    def __delitem__(self, name):
        raise TypeError("vltool's commands are those of vltool.commands.TABLE")

    def __iter__(self):
        return iter(dict.fromkeys([*TABLE, *self._built]))

    def __len__(self):
        return sum(1 for _ in self)


class PlainHelpGroup(typer.core.TyperGroup):
    """vltool's help strings are plain text: `[default: ...]` and `{name: [prompts]}` print as written.

    Typer renders help as rich markup, where `[...]` is a style tag and vanishes (and `:key:` becomes an
    emoji). The commands this group hands out (to run them, or to list them in `vltool --help`) are copies
    whose help strings went through as_markup; the command tree itself (typer.main.get_command(app)
    .commands) keeps the strings as written. Plain (non-rich) help is left alone; the panels
    (rich_help_panel) and the layout stay typer's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(self.rich_markup_mode)
        self._listing = False

    def format_help(self, ctx, formatter):
        """The group's help lists the commands by their TABLE lines, importing none of their modules."""
        self._listing = True
        try:
            return super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def list_commands(self, ctx) -> list[str]:
        return list(self.commands)  # (the names: typer's own reads every command, which imports its module)

    def _rich(self) -> bool:
        return self.rich_markup_mode == "rich" and getattr(typer.core, "HAS_RICH", True)

    def get_command(self, ctx, cmd_name):
        if self._listing:  # a line of the group's help: the name and the one-line help
            return typer.core.TyperCommand(cmd_name, short_help=TABLE[cmd_name][1]) if cmd_name in TABLE else None
        command = super().get_command(ctx, cmd_name)
        if command is None:
            return None
        command = _markup_escaped(command) if self._rich() else copy.copy(command)
        command.parse_args = functools.partial(_parse_refusing_empty_values, command, type(command).parse_args)
        return command

    def invoke(self, ctx):
        """A bad command line (an unknown option, a value out of range, a missing argument) is one line on
        stderr, exit 2, as every other usage error is (docs/conventions.md, "Output and errors")."""
        exceptions = click_exceptions()
        try:
            return super().invoke(ctx)
        except exceptions.NoArgsIsHelpError:
            raise
        except exceptions.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else ctx.command_path
            message = " ".join(e.format_message().split())
            print(f"error: {message} (see `{where} --help`)", file=sys.stderr)
            raise typer.Exit(e.exit_code) from None


app = typer.Typer(
    name="vltool",
    help="What language supervision contributes to CLIP-style models: the methods of five papers as "
    "composable commands over Hugging Face datasets saved on disk.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainHelpGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"vltool {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """vltool: run the methods of five papers on language supervision for CLIP-style models on your data."""


def main() -> None:
    if sys.argv[1:] == ["--version"]:  # (the answer without building the command line)
        print(f"vltool {__version__}")
        return
    app()


if __name__ == "__main__":
    main()
