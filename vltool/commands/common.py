"""Options shared by every command, spelled once (docs/conventions.md, "Options")."""

from __future__ import annotations

import errno
import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import click
import typer

from vltool.console import progress_setting
from vltool.errors import UsageError, VltoolError, open_files_message
from vltool.io.locks import output_scope
from vltool.topology import DEVICES

OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Where to write the result (created atomically).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace --out if it exists.")]
SEED_MAX = 2**32 - 1  # numpy's and torch's generators take any seed in 0..2**32-1 (torch's alone goes to 2**64-1)


def _check_seed(value: int) -> int:
    """--seed, checked once for every command: a whole number 0 .. SEED_MAX (a negative seed was an internal error)."""
    if value is not None and not 0 <= value <= SEED_MAX:
        raise typer.BadParameter(f"{value} is not a seed; give a whole number from 0 to {SEED_MAX}, e.g. --seed 0")
    return value


SeedOpt = Annotated[int, typer.Option("--seed", callback=_check_seed,
                                      help=f"Random seed, 0 to {SEED_MAX}; the same seed gives the same output.")]
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
NoProgressOpt = Annotated[bool, typer.Option("--no-progress", help="No progress bars on stderr.")]
AllowTestDataOpt = Annotated[bool, typer.Option(
    "--allow-test-data", help="Use built-in test-only data (emoji-openmoji, or data made from it) as training input anyway; recorded in the options.")]
DataArg = Annotated[str, typer.Argument(help="A dataset saved with save_to_disk, or 'emoji' (the built-in data).", show_default=False)]

# The options of every command that computes with torch (docs/conventions.md, "Options"): where, and on how many
# threads. `vltool.topology.compute_scope` applies them; each output's "runtime" records what was used.


def _check_device(value: str) -> str:
    """--device: one of DEVICES; cuda refused at once on a machine without a CUDA GPU (a usage error)."""
    if value not in DEVICES:
        raise typer.BadParameter(f"{value!r}: use {', '.join(DEVICES)}")
    if value == "cuda":
        import torch  # (only when cuda is asked for: a plain `--help` or CPU run never pays for it here)

        if not torch.cuda.is_available():
            raise typer.BadParameter("cuda: this machine has no CUDA GPU that torch can see (use auto or cpu)")
    return value


DeviceOpt = Annotated[str, typer.Option(
    "--device", callback=_check_device,
    help="auto (this process's GPU when there is one: under `accelerate launch`, the GPU of its local rank; else the CPU) | cpu | cuda.")]
ThreadsOpt = Annotated[Optional[int], typer.Option(
    "--threads", min=1, show_default=False,
    help="torch intra-op threads of this process [default: torch's own: OMP_NUM_THREADS, else the CPU cores]; recorded in the output's runtime.")]
DecodeThreadsOpt = Annotated[Optional[int], typer.Option(
    "--decode-threads", min=1, show_default=False,
    help="Threads decoding and preprocessing images ahead of the model [default: 1 on CPU; on a GPU the cores this process may use - 1, at most 8].")]

# Old spellings, hidden, kept for one release (docs/conventions.md, "Options"). A command declares the old
# spelling beside the new option and resolves the pair with `renamed()`.
OldColumnOpt = Annotated[Optional[str], typer.Option("--column", hidden=True)]
OldEvalOpt = Annotated[Optional[str], typer.Option("--eval", hidden=True)]
OldNumProcOpt = Annotated[Optional[int], typer.Option("--num-proc", hidden=True)]
OldWorkersOpt = Annotated[Optional[int], typer.Option("--workers", hidden=True)]  # the evaluation commands' --decode-threads
OldDtypeOpt = Annotated[Optional[str], typer.Option("--dtype", hidden=True)]  # recaption's --precision (float32 | float16 | bfloat16 | auto)


def renamed(ctx: typer.Context, old: str, new: str, old_value, new_value, *, means=None):
    """The value of option `new`, or of `old`, its hidden old spelling, when that was given.

    The old spelling prints a one-line warning on stderr; giving both is a usage error. `means` is the
    value an old flag stands for (`--cpu` meaning `--device cpu`); old_value None or False: not given.
    """
    if old_value is None or old_value is False:
        return new_value
    target = new if means is None else f"{new} {means}"
    name = next(p.name for p in ctx.command.params if new in getattr(p, "opts", ()))
    source = ctx.get_parameter_source(name)
    if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
        raise UsageError(f"{old} is the old name of {new}: give only {new}")
    print(f"warning: {old} is renamed {target}; the old name goes in the next release", file=sys.stderr)
    return old_value if means is None else means


def decode_threads_option(ctx: typer.Context, decode_threads, old_workers, num_proc):
    """--decode-threads, or its old spellings --workers and --num-proc (hidden, each with a warning)."""
    value = renamed(ctx, "--num-proc", "--decode-threads", num_proc, decode_threads)
    return renamed(ctx, "--workers", "--decode-threads", old_workers, value)


def handle_errors(fn: Callable) -> Callable:
    """Run a command the way every command runs (docs/conventions.md, "Output and errors"):

    - a VltoolError prints `error: <message>` on one line and exits with its code (1, or 2 for usage);
    - an OSError (disk full, a file that vanished, permission denied while writing) prints one line too;
    - anything else is a bug: one line naming it, exit 1; VLTOOL_DEBUG=1 shows every traceback;
    - the outputs it checks (vltool.io.check_output) stay locked until it ends (vltool.io.output_scope);
    - `--no-progress` turns every progress bar off (vltool.console.progress_setting).
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        debug = bool(os.environ.get("VLTOOL_DEBUG"))
        try:
            with output_scope(), progress_setting(not kwargs.get("no_progress", False)):
                return fn(*args, **kwargs)
        except VltoolError as e:
            if debug:
                raise
            print(f"error: {one_line(str(e))}", file=sys.stderr)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted: nothing was written", file=sys.stderr)
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort, typer.TyperException, click.exceptions.Exit, click.exceptions.Abort, click.ClickException):  # (typer's own click, and click's)
            raise
        except OSError as e:
            if debug:
                raise
            print(f"error: {os_error(e)}", file=sys.stderr)
            raise typer.Exit(1) from None
        except Exception as e:
            if debug:
                raise
            print(f"error: internal error ({type(e).__name__}: {one_line(str(e))[:300]}); this is a bug in vltool, "
                  "please report it with the output of VLTOOL_DEBUG=1", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper


def one_line(text: str) -> str:
    """The message on one line. An error re-raised from a DataLoader worker ("Caught X in DataLoader worker
    process N. Original Traceback ...") is reduced to the worker's own message."""
    if text.startswith("Caught ") and "\nOriginal Traceback" in text:
        last = [line for line in text.splitlines() if line.strip()][-1]  # "module.Class: message"
        text = last.split(": ", 1)[1] if ": " in last else last
    return " ".join(text.split())


def os_error(e: OSError) -> str:
    """An OSError as one line: what failed, on which file (too many open files: the limit and how to raise it)."""
    what = e.strerror or one_line(str(e)) or type(e).__name__
    files = [f for f in (e.filename, getattr(e, "filename2", None)) if f]
    if e.errno == errno.EMFILE or f"[Errno {errno.EMFILE}]" in what:
        return open_files_message(f"opening {' -> '.join(map(str, files))}" if files else "")
    return f"{what}: {' -> '.join(map(str, files))}" if files else what
