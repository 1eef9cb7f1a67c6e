"""Reading the provenance record (`vltool.json`) that a dataset or an output carries."""

from __future__ import annotations

from pathlib import Path

from vltool import columns as C
from vltool.checks import read_json


def read_provenance(path: Path | str) -> dict | None:
    f = Path(path) / C.PROVENANCE_FILE
    if not f.is_file():
        return None

    return read_json(f, "the provenance record")

