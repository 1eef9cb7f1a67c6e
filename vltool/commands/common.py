"""Options shared by every command, spelled once (docs/conventions.md, "Options")."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from vltool.errors import VltoolError

OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Where to write the result (created atomically).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace --out if it exists.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same output.")]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", min=1, help="Rows per batch.")]
NumProcOpt = Annotated[
    int, typer.Option("--num-proc", min=1, help="Worker processes sharing the rows (CPU work; the output does not depend on it).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout instead of a table.")]
WhereOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--where",
        help="Keep rows where COLUMN=VALUE (or COLUMN!=VALUE). Repeatable: the same column OR-ed, "
        "different columns AND-ed. E.g. --where split=train.",
    ),
]
SplitOpt = Annotated[Optional[str], typer.Option("--split", help="Split to read when the input is a DatasetDict.")]
CacheDirOpt = Annotated[
    Optional[Path],
    typer.Option("--cache-dir", help="Derived data such as embeddings [default: $VLTOOL_CACHE, else ~/.cache/vltool]."),
]
ModelOpt = Annotated[Path, typer.Option("--model", help="A trained vltool model (RUN_DIR or RUN_DIR/model).")]
DataArg = Annotated[str, typer.Argument(help="A dataset saved with save_to_disk, or 'emoji' (the built-in data).", show_default=False)]

# Old spellings, hidden, kept for one release (docs/conventions.md, "Options"). A command declares the old
# spelling beside the new option and resolves the pair with `renamed()`.
OldColumnOpt = Annotated[Optional[str], typer.Option("--column", hidden=True)]
OldEvalOpt = Annotated[Optional[str], typer.Option("--eval", hidden=True)]
OldNumProcOpt = Annotated[Optional[int], typer.Option("--num-proc", hidden=True)]


def renamed(ctx: typer.Context, old: str, new: str, old_value, new_value, *, means=None):
    """The value of option `new`, or of `old`, its hidden old spelling, when that was given.

    The old spelling prints a one-line warning on stderr; giving both is a usage error. `means` is the
    value an old flag stands for (`--cpu` meaning `--device cpu`); old_value None or False: not given.
    """
    from vltool.errors import UsageError

    if old_value is None or old_value is False:
        return new_value
    target = new if means is None else f"{new} {means}"
    name = next(p.name for p in ctx.command.params if new in getattr(p, "opts", ()))
    source = ctx.get_parameter_source(name)
    if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
        raise UsageError(f"{old} is the old name of {new}: give only {new}")
    print(f"warning: {old} is renamed {target}; the old name goes in the next release", file=sys.stderr)
    return old_value if means is None else means


def handle_errors(fn: Callable) -> Callable:
    """Print a VltoolError on one line and exit with its code; VLTOOL_DEBUG=1 shows the traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except VltoolError as e:
            if os.environ.get("VLTOOL_DEBUG"):
                raise
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted: nothing was written", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper
