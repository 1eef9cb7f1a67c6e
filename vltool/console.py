"""Where things are printed: results on stdout, logs and progress on stderr."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

out = Console(soft_wrap=True)  # results
err = Console(stderr=True)  # logs, progress bars


def log(message: str) -> None:
    err.print(message, highlight=False)


def print_json(obj: Any) -> None:
    """JSON for machines on stdout, plain (no rich markup)."""
    print(json.dumps(obj, indent=2, default=str, ensure_ascii=False))
