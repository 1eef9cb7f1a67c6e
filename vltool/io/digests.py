"""Whole-column reads and digests of inputs: Arrow columns without a Python object per row, their
SHA-256 digests (the encode cache's keys), and the ids two inputs share (`rows_in_both`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Sequence

from vltool import columns as C
from vltool.io.images import image_bytes

if TYPE_CHECKING:  # (an annotation only)
    from vltool.io.loading import LoadedDataset

# datasets, pyarrow and PIL are imported inside the functions that use them, not here: `vltool --help` loads this
# module (through commands/common.py), and importing them costs about a second.


def arrow_column(ds, name: str):
    """A column as a pyarrow ChunkedArray (memory-mapped when the dataset is on disk), honouring a selection
    (indices mapping) without reading other columns: for whole-column work in Arrow's compute functions,
    never row by row in Python (iterating `ds[name]` formats every row: ~7 us each)."""
    arr = ds.data.column(name)
    if ds._indices is not None:
        arr = arr.take(ds._indices.column(0))
    return arr


def values_digest(values) -> str:
    """SHA-256 of the values in order, each as text followed by a NUL (vltool.cache.ids_digest)."""
    return hashlib.sha256("".join(f"{v}\0" for v in values).encode()).hexdigest()


def column_digest(ds, name: str) -> str:
    """values_digest (vltool.cache.ids_digest) of a column's values (SHA-256 of each value as text, each followed by a NUL),
    computed on the Arrow column (strings_digest): no Python object per row."""
    import pyarrow as pa

    arr = arrow_column(ds, name)
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)) or arr.null_count:
        return values_digest(column_values(ds, name))
    return strings_digest(arr)


def strings_digest(strings) -> str:
    """values_digest of an Arrow string array without nulls (each string followed by a NUL, SHA-256),
    joined and hashed 2^16 strings at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    h = hashlib.sha256()
    for a in range(0, len(strings), 1 << 16):
        part = strings.slice(a, 1 << 16).combine_chunks().cast(pa.large_string())
        one = pa.LargeListArray.from_arrays(pa.array([0, len(part)], pa.int64()), part)
        h.update(pc.binary_join(one, pa.scalar("\0", pa.large_string()))[0].as_buffer())
        h.update(b"\0")
    return h.hexdigest()


def shared_ids(a, b) -> list[str]:
    """The ids that datasets `a` and `b` share, sorted: Arrow's set lookup of the larger one's ids among the
    smaller one's (no Python object per row; memory for the smaller set)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    small, large = sorted((arrow_column(a, C.ID), arrow_column(b, C.ID)), key=len)
    if small.type != large.type:  # ids of two kinds (numbers, strings) compare as text
        small, large = small.cast(pa.string()), large.cast(pa.string())
    return sorted(set(large.filter(pc.is_in(large, value_set=small.combine_chunks())).to_pylist()))


def rows_in_both(a: "LoadedDataset", b: "LoadedDataset") -> list[str]:
    """The ids of rows that are in both inputs (a training set and its eval set), sorted.

    An id names a row within one dataset. Two different splits of one DatasetDict may number their rows
    alike (CLIP_benchmark's converter starts every split at s0000000), so there a shared id is the same row
    only when its image is byte for byte the same too."""
    shared = shared_ids(a.dataset, b.dataset)
    other_split = a.split != b.split and a.path.expanduser().resolve() == b.path.expanduser().resolve()
    if not shared or not other_split or C.IMAGE not in a.dataset.column_names or C.IMAGE not in b.dataset.column_names:
        return shared
    da, db = _image_digests(a.dataset, shared), _image_digests(b.dataset, shared)
    return [i for i in shared if da.get(i) is not None and da.get(i) == db.get(i)]


def _image_digests(ds, ids: Sequence[str]) -> dict[str, str]:
    """id -> sha256 of the image's encoded bytes, for the rows whose id is in `ids`."""
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc

    col = arrow_column(ds, C.ID)
    wanted = pa.array(list(ids)).cast(col.type) if col.type != pa.string() else pa.array(list(ids))
    rows = pc.indices_nonzero(pc.is_in(col, value_set=wanted)).to_pylist()
    sub = ds.select(rows).select_columns([C.ID, C.IMAGE])
    if isinstance(sub.features[C.IMAGE], datasets.Image):
        sub = sub.cast_column(C.IMAGE, datasets.Image(decode=False))
    out = {}
    for lo in range(0, len(sub), 256):
        chunk = sub[lo : lo + 256]
        for i, v in zip(chunk[C.ID], chunk[C.IMAGE]):
            try:
                data = image_bytes(v) if isinstance(v, dict) else None
            except (OSError, KeyError):
                data = None
            out[str(i)] = hashlib.sha256(data).hexdigest() if data is not None else None
    return out


def column_values(ds, name: str) -> list:
    """A column as a Python list, honouring a selection (indices mapping) without reading other columns."""
    return arrow_column(ds, name).to_pylist()

