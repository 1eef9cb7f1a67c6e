"""Reading inputs, writing outputs: the dataset contract every command shares (docs/conventions.md).

- `load_dataset` reads a `save_to_disk` directory (or `emoji`), picks `--split`, applies `--where`.
- `atomic_output` gives a temporary directory beside the target and renames it into place at the end,
  so a failed or interrupted run leaves nothing half-written; an existing output needs `overwrite`.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from vltool import columns as C
from vltool.errors import UsageError, VltoolError

ASSETS = Path(__file__).resolve().parent / "assets"
BUILTIN_DATASETS = {"emoji": ASSETS / "emoji"}


@dataclass
class Where:
    """One `--where` clause: COLUMN=VALUE or COLUMN!=VALUE."""

    column: str
    value: str
    negate: bool = False

    @classmethod
    def parse(cls, text: str) -> "Where":
        if "!=" in text:
            col, _, val = text.partition("!=")
            negate = True
        elif "=" in text:
            col, _, val = text.partition("=")
            negate = False
        else:
            raise UsageError(f"--where {text!r}: expected COLUMN=VALUE or COLUMN!=VALUE, e.g. --where split=train")
        col = col.strip()
        if not col:
            raise UsageError(f"--where {text!r}: the column name is empty")
        return cls(col, val, negate)

    def __str__(self) -> str:
        return f"{self.column}{'!=' if self.negate else '='}{self.value}"


@dataclass
class LoadedDataset:
    """An input dataset and what provenance needs to know about it."""

    spec: str  # what the user typed
    path: Path
    split: str | None
    where: list[str]
    fingerprint: str  # the on-disk dataset's fingerprint (datasets' state.json), before filtering
    rows_on_disk: int
    dataset: Any = field(repr=False)  # datasets.Dataset after --where

    @property
    def rows(self) -> int:
        return len(self.dataset)

    def provenance(self) -> dict:
        prov = {
            "spec": self.spec,
            "path": str(self.path),
            "split": self.split,
            "where": self.where,
            "fingerprint": self.fingerprint,
            "rows_on_disk": self.rows_on_disk,
            "rows": self.rows,
        }
        upstream = self.path / C.PROVENANCE_FILE
        if upstream.is_file():  # follow the chain: which command made this input
            try:
                up = json.loads(upstream.read_text())
                prov["made_by"] = {k: up.get(k) for k in ("command", "vltool_version", "created")}
            except (OSError, json.JSONDecodeError):
                pass
        return prov


def resolve_dataset_path(spec: str) -> Path:
    if spec in BUILTIN_DATASETS:
        path = BUILTIN_DATASETS[spec]
        if not path.is_dir():
            raise VltoolError(f"the built-in {spec!r} dataset is missing from the installation ({path})")
        return path
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageError(f"dataset {spec!r} does not exist (give a directory written by save_to_disk, or 'emoji')")
    if not path.is_dir() or not ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        raise UsageError(
            f"{spec!r} is not a dataset saved with datasets' save_to_disk "
            "(no state.json or dataset_dict.json); use `vltool import` for other formats"
        )
    return path


def load_dataset(
    spec: str,
    *,
    split: str | None = None,
    where: Sequence[str | Where] = (),
    required: Sequence[str] = (),
) -> LoadedDataset:
    """Load a dataset directory (or the built-in `emoji`), choose a split, keep the rows matching `where`.

    `where` clauses on the same column are OR-ed, on different columns AND-ed.
    `required` columns are checked after loading; missing ones are named with the columns found.
    """
    import datasets

    datasets.disable_progress_bars()  # vltool shows its own progress; datasets' bars are noise here
    # Inputs are never modified: without this, datasets writes cache-*.arrow files of every .map/.filter
    # into the input's directory. Transforms then go to a temporary directory instead.
    datasets.disable_caching()
    path = resolve_dataset_path(spec)
    try:
        obj = datasets.load_from_disk(str(path))
    except Exception as e:  # corrupt directory: datasets raises many kinds
        raise VltoolError(f"cannot read dataset {spec!r}: {e}") from e
    if isinstance(obj, datasets.DatasetDict):
        names = list(obj.keys())
        if split is None:
            if len(names) != 1:
                raise UsageError(f"{spec!r} holds splits {names}; choose one with --split")
            split = names[0]
        if split not in obj:
            raise UsageError(f"{spec!r} has no split {split!r}; its splits are {names}")
        ds = obj[split]
    else:
        if split is not None:
            raise UsageError(
                f"{spec!r} is a single dataset, not a DatasetDict, so --split does not apply; "
                f"select rows with --where (e.g. --where split={split})"
            )
        ds = obj
    fingerprint = ds._fingerprint
    rows_on_disk = len(ds)
    clauses = [w if isinstance(w, Where) else Where.parse(w) for w in where]
    if clauses:
        ds = apply_where(ds, clauses, spec)
    require_columns(ds, required, spec)
    return LoadedDataset(spec, path, split, [str(w) for w in clauses], fingerprint, rows_on_disk, ds)


def column_values(ds, name: str) -> list:
    """A column as a Python list, honouring a selection (indices mapping) without reading other columns."""
    arr = ds.data.column(name)
    if ds._indices is not None:
        arr = arr.take(ds._indices.column(0))
    return arr.to_pylist()


def require_columns(ds, names: Sequence[str], what: str = "the dataset") -> None:
    missing = [n for n in names if n not in ds.column_names]
    if missing:
        raise UsageError(
            f"{what} has no column {', '.join(repr(m) for m in missing)} "
            f"(it has: {', '.join(ds.column_names)})"
        )


def _coerce(feature, column: str, value: str):
    """Turn the text of a --where value into the column's type."""
    import datasets

    if isinstance(feature, datasets.ClassLabel):
        if value in feature.names:
            return feature.str2int(value)
        if value.lstrip("-").isdigit() and 0 <= int(value) < feature.num_classes:
            return int(value)
        raise UsageError(f"--where {column}={value}: not a class of {column!r} (e.g. {feature.names[:3]})")
    if isinstance(feature, datasets.Value):
        dtype = feature.dtype
        if dtype == "bool":
            low = value.lower()
            if low in ("true", "1", "yes"):
                return True
            if low in ("false", "0", "no"):
                return False
            raise UsageError(f"--where {column}={value}: {column!r} is boolean; use true or false")
        if dtype.startswith(("int", "uint")):
            try:
                return int(value)
            except ValueError:
                raise UsageError(f"--where {column}={value}: {column!r} holds integers") from None
        if dtype.startswith("float"):
            try:
                return float(value)
            except ValueError:
                raise UsageError(f"--where {column}={value}: {column!r} holds numbers") from None
        return value
    raise UsageError(f"--where {column}=...: column {column!r} is not a scalar column and cannot be filtered")


def apply_where(ds, clauses: Sequence[Where], what: str = "the dataset"):
    """Keep rows matching every column's clauses (OR within a column, AND across columns)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    require_columns(ds, sorted({w.column for w in clauses}), what)
    by_column: dict[str, list[Where]] = {}
    for w in clauses:
        by_column.setdefault(w.column, []).append(w)
    keep = np.ones(len(ds), dtype=bool)
    for column, ws in by_column.items():
        arr = ds.data.column(column)
        if ds._indices is not None:
            arr = arr.take(ds._indices.column(0))
        feature = ds.features[column]
        col_mask = np.zeros(len(ds), dtype=bool)
        for w in ws:
            value = _coerce(feature, column, w.value)
            m = pc.fill_null(pc.equal(arr, pa.scalar(value, type=arr.type)), False)
            m = np.asarray(m.to_numpy(zero_copy_only=False), dtype=bool)
            col_mask |= ~m if w.negate else m
        keep &= col_mask
    if keep.all():
        return ds
    return ds.select(np.flatnonzero(keep))


def check_output(out: Path | str, overwrite: bool, inputs: Sequence[Path] = ()) -> Path:
    """Refuse an output that exists (unless overwrite) or that is, or lies inside, an input."""
    out = Path(out).expanduser()
    resolved = out.resolve()
    for inp in inputs:
        inp = Path(inp).resolve()
        if resolved == inp or inp in resolved.parents or resolved in inp.parents:
            raise UsageError(f"--out {out} would overwrite the input {inp}; inputs are never modified: choose another --out")
    if resolved == ASSETS or ASSETS in resolved.parents:
        raise UsageError(f"--out {out} is inside vltool's built-in data; choose another --out")
    if out.exists() and not overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    return out


@contextmanager
def atomic_output(out: Path | str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `out`; on success rename it to `out`.

    On any error the temporary directory is removed and `out` is untouched.
    """
    out = Path(out).expanduser()
    if out.exists() and not overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_path(tmp, out, overwrite)


def replace_path(src: Path, out: Path, overwrite: bool) -> None:
    """Rename `src` onto `out`; an existing `out` is moved aside first and removed after."""
    if out.exists() or out.is_symlink():
        if not overwrite:
            shutil.rmtree(src, ignore_errors=True) if src.is_dir() else src.unlink(missing_ok=True)
            raise UsageError(f"{out} exists; pass --overwrite to replace it")
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        os.rename(src, out)
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    else:
        os.rename(src, out)


@contextmanager
def atomic_file(path: Path | str) -> Iterator[Path]:
    """Yield a temporary file path beside `path` (same suffix); on success rename it to `path`."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.stem}.tmp-{uuid.uuid4().hex[:8]}{path.suffix}"
    try:
        yield tmp
        if tmp.exists():
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json_atomic(path: Path | str, obj: Any, overwrite: bool = True) -> Path:
    """Write a JSON file through a temporary file and a rename."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(obj, indent=2, default=str, ensure_ascii=False) + "\n")
    if path.exists() and not overwrite:
        tmp.unlink()
        raise UsageError(f"{path} exists; pass --overwrite to replace it")
    os.replace(tmp, path)
    return path


def save_dataset(ds, out: Path | str, provenance: dict, *, overwrite: bool = False, num_proc: int | None = None) -> Path:
    """Write `ds` and its `vltool.json` atomically to `out`."""
    out = Path(out).expanduser()
    if len(ds) == 0:
        raise VltoolError(f"nothing to write to {out}: no row is left (every row was filtered out or dropped)")
    with atomic_output(out, overwrite) as tmp:
        # Shard writing in parallel only pays off for large data (images); it spawns processes.
        big = num_proc and num_proc > 1 and ds.data.nbytes > 2**30
        ds.save_to_disk(str(tmp), num_proc=num_proc if big else None)
        write_json_atomic(tmp / C.PROVENANCE_FILE, provenance)
    return out


def read_provenance(path: Path | str) -> dict | None:
    f = Path(path) / C.PROVENANCE_FILE
    if not f.is_file():
        return None
    return json.loads(f.read_text())


def default_cache_dir() -> Path:
    """`$VLTOOL_CACHE`, else `~/.cache/vltool`."""
    env = os.environ.get("VLTOOL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vltool"


def decode_image(value):
    """datasets' undecoded image ({bytes, path}) -> RGB PIL image, or None when it cannot be decoded.

    Training, encoding and pseudo-labelling all read images through this, so they agree on what a bad
    image is (skipped and counted)."""
    import io

    from PIL import Image

    try:
        if value is None:
            return None
        if value.get("bytes") is not None:
            im = Image.open(io.BytesIO(value["bytes"]))
        elif value.get("path"):
            im = Image.open(value["path"])
        else:
            return None
        im.load()
        return im.convert("RGB")
    except Exception:
        return None

