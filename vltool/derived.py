"""A dataset derived from an input by a new text column and a row selection, without copying the input.

`deform` and `pick-caption` rewrite one text column of every row and drop some rows. At millions of rows
neither the images nor the new texts may be held in memory: the new columns are written a chunk at a
time (ColumnSpill: to an Arrow file memory-mapped back, or in memory for small data), and the output is
the input's own memory-mapped table beside them, with the kept rows as an indices mapping that
`save_to_disk` follows batch by batch (a filter or `add_column` on a selection would copy every column,
images included). `datasets` pickles such a table as its files, so `save_to_disk`'s worker processes do
not receive the data either.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np

from vltool.io.atomic import work_dir
from vltool.topology import launched_processes, process_state

# datasets and pyarrow are imported inside the functions that use them: commands import this module (through
# vltool.mine_positives and vltool.deform) at their top, and `vltool --help` must not load them.


@contextlib.contextmanager
def spill_beside(out: Path) -> Iterator[Path]:
    """A hidden directory beside `out` (io.work_dir) for the new columns while `out` is written, removed at
    the end. Call it inside io.output_scope() after check_output, so that `out`'s lock is held (no other
    write cleans it) and it never touches an input; one a killed run left is cleaned as stale. Under a
    launcher every process calls it: each waits until the main one has locked `out` and cleaned what killed
    runs left beside it (check_output), which would otherwise remove another process's directory."""
    if launched_processes() > 1:
        process_state().wait_for_everyone()
    spill = work_dir(out)
    spill.mkdir(parents=True)
    try:
        yield spill
    finally:
        shutil.rmtree(spill, ignore_errors=True)


class ColumnSpill:
    """Columns built a batch at a time: into an Arrow file at `path` and memory-mapped back by table() (their
    pages are then the file's, which the kernel can drop, not the process's memory), or, with no path, in
    memory."""

    def __init__(self, path: Path | None, schema) -> None:
        import pyarrow as pa

        self.path, self.schema, self.batches = path, schema, []
        self.sink = pa.OSFile(str(path), "wb") if path is not None else None
        self.writer = pa.ipc.new_stream(self.sink, schema) if path is not None else None

    def add(self, arrays: list) -> None:
        import pyarrow as pa

        batch = pa.record_batch(arrays, schema=self.schema)
        if self.writer is not None:
            self.writer.write_batch(batch)
        else:
            self.batches.append(batch)

    def table(self):
        """The columns as a `datasets` table (memory-mapped ones pickle as their file, not their data)."""
        import pyarrow as pa
        from datasets.table import InMemoryTable, MemoryMappedTable

        if self.writer is None:
            return InMemoryTable(pa.Table.from_batches(self.batches, schema=self.schema))
        self.writer.close()
        self.sink.close()
        return MemoryMappedTable.from_file(str(self.path))


def replace_text_column(
    ds, column: str, original: str, new, new_features: dict, keep: np.ndarray, *, fingerprint: str,
    spill: Path | None, chunk: int,
):
    """`ds` with its `column` replaced by `new[column]`, and only the rows where `keep`.

    new: a `datasets` table of len(ds) rows (ds's rows, after any selection), holding `column` and any
    other new columns (`new_features`: name -> datasets feature of each). The input's `column` is kept as
    `original`, unless `original` exists already (a second pass keeps the first's intact text) or `column`
    does not (nothing to keep); an input column named like another new column is replaced. The new
    `column` takes the input's column's place; `original` and the other new columns come last."""
    names = ds.data.column_names
    extra = [c for c in new.column_names if c != column]
    kept_names = [c for c in names if c not in extra]
    keeps_original = column in kept_names and original not in kept_names
    order = (kept_names if column in kept_names else [*kept_names, column]) + ([original] if keeps_original else []) + extra
    renamed = {column: original} if keeps_original else {}
    features = {**new_features, **({original: ds.features[column]} if keeps_original else {})}
    return with_columns(ds, new, features, keep, order=order, renamed=renamed, fingerprint=fingerprint, spill=spill, chunk=chunk)


def add_columns(ds, columns: dict, *, key: bytes, features: dict | None = None, in_place: bool = False):
    """`ds` with `columns` (name -> Arrow array of len(ds) rows: ds's rows, after any selection; or a
    `datasets` table of them, e.g. ColumnSpill.table()) beside its table, an input column of the same name replaced: last, as datasets' add_column puts it, or `in_place`.
    `features`: name -> datasets feature (default: from the Arrow types). The fingerprint is the input's and
    `key` (what the new columns were made from). A selection stays an indices mapping: nothing is copied."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable, Table

    new = columns if isinstance(columns, Table) else InMemoryTable(pa.table(columns))
    if features is None:
        features = dict(datasets.Features.from_arrow_schema(new.schema))
    kept = ds.column_names if in_place else [c for c in ds.column_names if c not in new.column_names]
    order = kept + [c for c in new.column_names if c not in kept]
    fingerprint = hashlib.blake2b(ds._fingerprint.encode() + b"\0" + key, digest_size=16).hexdigest()
    return with_columns(ds, new, features, np.ones(len(ds), dtype=bool), order=order, fingerprint=fingerprint,
                        spill=None, chunk=1 << 20)


def with_columns(
    ds, new, new_features: dict, keep: np.ndarray, *, order: list[str], renamed: dict | None = None, fingerprint: str,
    spill: Path | None, chunk: int,
):
    """`ds` with the columns of `new` (a `datasets` table of len(ds) rows, ds's rows after any selection;
    `new_features`: name -> datasets feature, also for renamed columns' new names), the input's columns
    `renamed` (old -> new name), an input column named like a new one replaced, the columns in `order`,
    and only the rows where `keep` (an indices mapping over the input's table: nothing is copied)."""
    import datasets
    import pyarrow as pa
    from datasets.table import ConcatenationTable, InMemoryTable

    renamed = renamed or {}
    n = len(ds)
    table = ds.data
    if ds._indices is None:
        rows = None
    else:  # the selected rows' values go to their places in the whole table (other places: null, never read)
        rows = ds._indices.column(0).to_numpy()  # (n,) rows of the table
        inverse = np.full(len(table), -1, dtype=np.int64)
        inverse[rows] = np.arange(n)
        scatter = pa.array(inverse, mask=inverse < 0)
        new = InMemoryTable(pa.table({c: new.column(c).take(scatter) for c in new.column_names}))
    replaced = [c for c in table.column_names if c in new.column_names and c not in renamed]
    base = table.drop(replaced) if replaced else table
    if renamed:
        base = base.rename_columns([renamed.get(c, c) for c in base.column_names])
    whole = ConcatenationTable.from_tables([base, new], axis=1).select(order)
    kinds = {**{renamed.get(c, c): ds.features[c] for c in table.column_names if c not in replaced}, **new_features}
    features = datasets.Features({c: kinds[c] for c in order})
    indices = None
    if rows is not None or not keep.all():  # the kept rows of the whole table, in order
        kept = ColumnSpill(spill and spill / "indices.arrow", pa.schema([("indices", pa.uint64())]))
        for a in range(0, n, chunk):
            k = np.flatnonzero(keep[a : a + chunk]) + a
            kept.add([pa.array(k if rows is None else rows[k], type=pa.uint64())])
        indices = kept.table()
    return datasets.Dataset(whole, info=datasets.DatasetInfo(features=features), indices_table=indices, fingerprint=fingerprint)
