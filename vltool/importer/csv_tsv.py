"""`--format csv` / `tsv`: a delimited table of image paths and captions, read row by row (its encoding by the
byte-order mark, a `.csv` whose header holds a tab read as tab-separated, a malformed row refused by its line)."""

from __future__ import annotations

import codecs
import csv
from pathlib import Path
from typing import Callable, Iterator

from vltool.errors import UsageError
from vltool.importer.common import ImportConfig, _Skips, _table_columns, _TableColumns


def _table_encoding(path: Path) -> str:
    """The text encoding of a CSV / TSV by its byte-order mark: UTF-16 (what spreadsheets write as "Unicode
    text"), else UTF-8 with or without a BOM."""
    with open(path, "rb") as f:
        head = f.read(4)
    return "utf-16" if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig"


def _csv_separator(path: Path, fmt: str) -> str:
    if fmt == "tsv":
        return "\t"
    with open(path, encoding=_table_encoding(path), errors="replace", newline="") as f:
        header = f.readline()
    return "\t" if "\t" in header else ","


def _csv_header(header: list[str], path: Path) -> list[str]:
    """The column names of a CSV / TSV header (spaces around them stripped); a name given twice is refused
    (a dict of the row would keep one of the two columns, and the caption could come from the wrong one)."""
    header = [h.strip() for h in header]
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:
        where = "; ".join(f"{h!r} in columns {', '.join(str(i + 1) for i, x in enumerate(header) if x == h)}" for h in twice)
        raise UsageError(f"{path}: the header names a column twice ({where}); give each column its own name")
    return header


def _csv_records(reader, header: list[str], path: Path, fmt: str) -> Iterator[tuple[int, dict]]:
    """(row number, {column: value}) of each data row of a CSV / TSV read by `reader` (after its header).
    A quoted field may hold line breaks and separators. A row with fewer or more fields than the header (a
    field missing, a separator not quoted) and a quote that is never closed (csv would read the rest of the
    file as one field) are refused, naming the row and its line: such a table cannot be read row by row."""
    line = reader.line_num
    r = -1
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise UsageError(f"{path}: the {fmt.upper()} row {r + 1} from line {line + 1} cannot be read ({e}): a quote is not "
                             'closed, or text follows a closing quote; quote the whole field and double the quotes in it ("")') from None
        first, line = line + 1, reader.line_num
        if not values:
            continue
        r += 1
        if len(values) != len(header):
            lines = f"line {first}" if line == first else f"lines {first}-{line}"
            raise UsageError(f"{path}: row {r} ({lines}) has {len(values)} fields where the header has {len(header)}; every row "
                             "needs one field per column: quote a field that holds the separator, fill in a missing one")
        yield r, dict(zip(header, values))


def read_csv(path: Path, fmt: str, config: ImportConfig, skips: _Skips, add: Callable[[int, dict, _TableColumns], None]) -> _TableColumns:
    """Every data row of one CSV / TSV passed to `add` (row number, record, columns); the columns used."""
    csv.field_size_limit(1 << 30)
    sep = _csv_separator(path, fmt)
    with open(path, encoding=_table_encoding(path), errors="replace", newline="") as f:
        reader = csv.reader(f, delimiter=sep, strict=True)
        try:
            header = next(reader, None)
        except csv.Error as e:
            raise UsageError(f"{path}: its header line cannot be read ({e})") from None
        if not header:
            raise UsageError(f"{path} is empty (no header line)")
        header = _csv_header(header, path)
        cols = _table_columns(header, config, str(path))
        for r, rec in _csv_records(reader, header, path, fmt):
            add(r, rec, cols)
    return cols
