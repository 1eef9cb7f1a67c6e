"""Where things are printed: results on stdout, logs and progress on stderr."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.text import Text

out = Console(soft_wrap=True)  # results
err = Console(stderr=True)  # logs, progress bars


def log(message: str) -> None:
    err.print(message, highlight=False)


def print_json(obj: Any) -> None:
    """JSON for machines on stdout, plain (no rich markup)."""
    print(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


# ---- progress bars: every long loop shows one on stderr (count, rate, time left); --no-progress, on every
# command, turns them all off (the CLI sets it for the command's duration with progress_setting).

_PROGRESS = [True]


def progress_enabled() -> bool:
    return _PROGRESS[-1]


class progress_setting:
    """`with progress_setting(False): ...` turns every progress bar off inside the block."""

    def __init__(self, enabled: bool):
        self.enabled = bool(enabled)

    def __enter__(self):
        _PROGRESS.append(self.enabled)
        return self

    def __exit__(self, *exc):
        _PROGRESS.pop()
        return False


class Bar:
    """A progress bar on stderr: done/total, rate (UNIT/s) and time left. Disabled: does nothing."""

    def __init__(self, label: str, total: int | None, *, unit: str = "rows", enabled: bool = True, info: bool = False):
        self.prog = None
        if not (enabled and progress_enabled()) or total == 0:
            return
        # rich.progress (about 20 ms) is imported when a bar is shown, not at the top: `vltool --help` loads this module
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn

        class Rate(ProgressColumn):
            def render(self, task):
                speed = task.finished_speed or task.speed
                return Text("" if speed is None else f"{speed:,.1f} {unit}/s" if speed < 100 else f"{speed:,.0f} {unit}/s")

        columns = [TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(), Rate(), TimeRemainingColumn()]
        if info:
            columns.append(TextColumn("{task.fields[info]}"))
        self.prog = Progress(*columns, console=err, transient=False)
        self.task = self.prog.add_task(label, total=total, info="")
        self.prog.start()

    def advance(self, n: int = 1, info: str | None = None) -> None:
        if self.prog is not None:
            self.prog.update(self.task, advance=n, **({"info": info} if info is not None else {}))

    def update(self, completed: int, info: str | None = None) -> None:
        if self.prog is not None:
            self.prog.update(self.task, completed=completed, **({"info": info} if info is not None else {}))

    def close(self) -> None:
        if self.prog is not None:
            self.prog.stop()
            self.prog = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
