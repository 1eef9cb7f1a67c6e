"""`--format parquet`: a parquet table of image paths (read once, like a CSV), or parquet shards holding the
image bytes in a column (img2dataset's output, a `datasets` image struct): one unit of work per row group."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vltool.importer.common import (
    IMAGE_COLUMN_CANDIDATES, ImportConfig, _clean_captions, _pick, _Plan, _read_file, _row, _Skips, _sort_labels, _table_columns,
    _TableColumns,
)
from vltool.shards import NO_IMAGE


def read_parquet(path: Path, fmt: str, config: ImportConfig, skips: _Skips, add: Callable[[int, dict, _TableColumns], None]) -> _TableColumns:
    """Every row of one parquet table of image paths passed to `add` (row number, record, columns); the columns used."""
    pf = pq.ParquetFile(path)
    cols = _table_columns(pf.schema_arrow.names, config, str(path))
    names = [c for c in {cols.image, cols.caption, cols.id, cols.label, *config.extra_columns} if c]
    r = 0
    for batch in pf.iter_batches(batch_size=4096, columns=names):
        for rec in batch.to_pylist():
            add(r, rec, cols)
            r += 1
    return cols


def _parquet_has_image_bytes(path: Path, config: ImportConfig) -> bool:
    schema = pq.ParquetFile(path).schema_arrow
    col = _pick(schema.names, config.image_column, IMAGE_COLUMN_CANDIDATES, "image", "--image-column", str(path))
    t = schema.field(col).type
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_struct(t)


def _plan_parquet_shards(files: Sequence[Path], config: ImportConfig) -> tuple[list[tuple], dict, set]:
    """Units (file, row group) for parquet files whose image column holds bytes; the columns used; labels."""
    units: list[tuple] = []
    labels: set = set()
    used: dict = {}
    several = len(files) > 1
    for path in files:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        cols = _table_columns(names, config, str(path))
        if cols.id is None and "key" in names:
            cols.id = "key"
        first = 0
        for g in range(pf.num_row_groups):
            units.append((len(units), str(path), g, first, path.stem if several else path.stem))
            first += pf.metadata.row_group(g).num_rows
        if cols.label:
            col = pq.read_table(path, columns=[cols.label]).column(0)
            col = pc.cast(col, pa.string()) if not pa.types.is_string(col.type) else col
            labels |= {v for v in pc.unique(col).to_pylist() if v is not None and v.strip()}
        used = {"image_column": cols.image, "caption_column": cols.caption, "id_column": cols.id, "label_column": cols.label}
    return units, used, labels


def _plan_parquet(files: Sequence[Path], config: ImportConfig, plan: _Plan, stats: dict) -> list[tuple]:
    """One unit per row group of parquet files holding the image bytes."""
    units, used, labels = _plan_parquet_shards(files, config)
    plan.kind = "parquet"
    plan.image_column, plan.caption_column = used["image_column"], used["caption_column"]
    plan.id_column, plan.label_column = used["id_column"], used["label_column"]
    if used["label_column"]:
        plan.label_names = _sort_labels(labels)
    cap_type = pq.ParquetFile(files[0]).schema_arrow.field(used["caption_column"]).type
    plan.multi = pa.types.is_list(cap_type) or pa.types.is_large_list(cap_type)
    stats.update(used)
    return units


def _image_bytes(value: Any, base: Path) -> tuple[bytes | None, tuple | None]:
    """A parquet image cell: raw bytes, or a datasets image struct {bytes, path}."""
    if isinstance(value, dict):
        if value.get("bytes"):
            return value["bytes"], None
        if value.get("path"):
            p = Path(value["path"])
            return _read_file(str(p if p.is_absolute() else base / p))
        return None, (NO_IMAGE, "the image cell is empty")
    if value is None or value == b"":
        return None, (NO_IMAGE, "the image cell is empty")
    if isinstance(value, str):
        p = Path(value)
        return _read_file(str(p if p.is_absolute() else base / p))
    return bytes(value), None


def _gen_parquet(unit: tuple, plan: _Plan, skips: _Skips) -> Iterator[dict]:
    """One row group of a parquet file with image bytes in a column (img2dataset's parquet output)."""
    _, path, row_group, first_row, stem = unit
    pf = pq.ParquetFile(path)
    names = set(pf.schema_arrow.names)
    cols = [c for c in {plan.image_column, plan.caption_column, plan.id_column, plan.label_column, *plan.extras} if c and c in names]
    base = Path(path).parent
    r = first_row
    for batch in pf.iter_batches(batch_size=256, row_groups=[row_group], columns=cols):
        for rec in batch.to_pylist():
            key = rec.get(plan.id_column) if plan.id_column else None
            key = str(key) if key not in (None, "") else f"{stem}-{r}"
            where = f"{Path(path).name} row {r}"
            r += 1
            data, err = _image_bytes(rec.get(plan.image_column), base)
            caps = _clean_captions(rec.get(plan.caption_column))
            row = _row(plan, skips, where, key, caps, data, err, rec.get(plan.label_column) if plan.label_column else None, rec)
            if row is not None:
                yield row
