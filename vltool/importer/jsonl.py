"""`--format jsonl`: a JSON Lines table of image paths and captions (one object a line; `.ndjson` too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from vltool.errors import UsageError
from vltool.importer.common import BAD_ROW, ImportConfig, _Skips, _table_columns, _TableColumns


def read_jsonl(path: Path, fmt: str, config: ImportConfig, skips: _Skips, add: Callable[[int, dict, _TableColumns], None]) -> _TableColumns:
    """Every JSON object of one JSON Lines file passed to `add` (row number, record, columns); a line that is not
    a JSON object is skipped and recorded; the columns used (those of the first object)."""
    cols = None
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        r = -1
        for line in f:
            if not line.strip():
                continue
            r += 1
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                skips.add(f"{path.name} row {r}", None, BAD_ROW, str(e))
                continue
            if cols is None:
                cols = _table_columns(list(rec), config, str(path))
            add(r, rec, cols)
    if cols is None:
        raise UsageError(f"{path} holds no JSON rows")
    return cols
