"""The `vltool` command: registers the subcommands that exist. Nothing heavy is imported here."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vltool import __version__
from vltool.commands import (
    debias,
    deform,
    export,
    import_,
    info,
    mine_positives,
    pick_caption,
    pretrain,
    probe,
    pseudolabel,
    recaption,
    report,
    retrieve,
    split,
    zeroshot,
)
from vltool.commands import filter as filter_

app = typer.Typer(
    name="vltool",
    help="What language supervision contributes to CLIP-style models: the methods of five papers as "
    "composable commands over Hugging Face datasets saved on disk.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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


deform.register(app)
import_.register(app)
export.register(app)
info.register(app)
pretrain.register(app)
recaption.register(app)
filter_.register(app)
zeroshot.register(app)
retrieve.register(app)
probe.register(app)
mine_positives.register(app)
pseudolabel.register(app)
debias.register(app)
split.register(app)
report.register(app)
pick_caption.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
