"""Loading inputs: a dataset argument to a dataset, `--split`, and `--where` selection.

`load_dataset` reads a `save_to_disk` directory (or a built-in dataset such as `emoji`), or WebDataset
shards through their index (vltool.io.index), picks `--split`, applies `--where` (`Where`, `apply_where`)
and checks the columns a command needs; `LoadedDataset` is the result and what provenance records of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vltool import checks
from vltool import columns as C
from vltool.errors import UsageError, VltoolError
from vltool.io.builtin import BUILTIN_DATASETS
from vltool.io.index import ShardIndex, shard_index
from vltool.io.records import read_provenance
from vltool.shards import parse_tar_url

# datasets, pyarrow and PIL are imported inside the functions that use them, not here: `vltool --help` loads this
# module (through commands/common.py), and importing them costs about a second.


@dataclass
class Where:
    """One `--where` clause: COLUMN=VALUE or COLUMN!=VALUE."""

    column: str
    value: str
    negate: bool = False

    @classmethod
    def parse(cls, text: str) -> "Where":
        """The first '=' splits the clause ('!=' when a '!' is right before it); the value is the rest,
        verbatim, so it may hold '=' or '!' (`--where caption=!`); only a value starting with '=' (the
        `==` typo) is refused."""
        at = text.find("=")
        if at < 0:
            raise UsageError(f"--where {text!r}: expected COLUMN=VALUE or COLUMN!=VALUE, e.g. --where split=train")
        negate = at > 0 and text[at - 1] == "!"
        raw_col, val = text[: at - 1 if negate else at], text[at + 1 :]
        col = raw_col.strip()
        if not col:
            raise UsageError(f"--where {text!r}: the column name is empty")
        op = "!=" if negate else "="
        if val.lstrip().startswith("="):
            raise UsageError(f"--where {text!r}: write COLUMN{op}VALUE with a single {op!r}, e.g. --where {col}{op}{val.lstrip('= ') or 'VALUE'}")
        if val != val.strip() or raw_col != col:
            raise UsageError(
                f"--where {text!r}: no spaces around {op!r} or at the ends of the value (they would be part of it); "
                f"write --where {col}{op}{val.strip() or 'VALUE'}"
            )
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
    index: "ShardIndex | None" = None  # WebDataset shards given directly: the index read (path is the shards' folder)

    @property
    def rows(self) -> int:
        return len(self.dataset)

    @property
    def reads(self) -> list[Path]:
        """Every path this input reads, for check_output: the dataset, and the WebDataset shards its images
        live in. Shards given directly are `path`; a dataset made from shards keeps `tar://` paths into
        them, and its provenance chain (inputs[].path, followed through the datasets that made it) names
        them as inputs of format "wds"."""
        paths, seen, todo = [self.path], set(), [self.path]
        while todo and len(seen) < 64:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            rec = read_provenance(p) if p.is_dir() else None
            for inp in (rec or {}).get("inputs") or []:
                if not isinstance(inp, dict) or not isinstance(inp.get("path"), str):
                    continue
                up = Path(inp["path"])
                if inp.get("format") == "wds":
                    paths.append(up)
                else:
                    todo.append(up)
        return list(dict.fromkeys(paths))

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
        if self.index is not None:
            prov.update(format="wds", shards=len(self.index.source.shards), index=str(self.index.path))
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
        if path.is_dir() and ((path / "classnames.txt").is_file() or any(path.glob("*/nshards.txt"))):
            raise UsageError(
                f"{spec!r} is a dataset in CLIP_benchmark's WebDataset layout: read it once with "
                f"`vltool import {spec} --out DATA` (then --split test); zeroshot, retrieve, probe and benchmark "
                "also take it directly"
            )
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
    images: Sequence[str] = (),
    texts: Sequence[str] = (),
    text_lists: bool = False,
    text_option: str = "--text-column",
    cache_dir: str | Path | None = None,
    split_option: str = "--split",
) -> LoadedDataset:
    """Load a dataset directory (or the built-in `emoji`), choose a split, keep the rows matching `where`.

    WebDataset shards in img2dataset's layout (a pattern such as `shards/{00000..00099}.tar`, a glob, or a
    folder of .tar files) are read through their index (`shard_index`: built once under `cache_dir`,
    `$VLTOOL_CACHE` by default); the images stay in the shards.

    `where` clauses on the same column are OR-ed, on different columns AND-ed; a filter that matches no
    row is an error naming it, as is a dataset without rows.
    `required` columns are checked after loading; missing ones are named with the columns found.
    `images` must be image columns and `texts` text columns (strings; lists of strings too with
    `text_lists`), checked here by vltool.checks so that every command refuses the same inputs alike.
    `split_option` is the option that gave `split` (`--eval-split` for a second dataset), named in the errors
    with its --where twin.
    """
    import datasets

    datasets.disable_progress_bars()  # vltool shows its own progress; datasets' bars are noise here
    # Inputs are never modified: without this, datasets writes cache-*.arrow files of every .map/.filter
    # into the input's directory. Transforms then go to a temporary directory instead.
    datasets.disable_caching()
    index = shard_index(spec, cache_dir)
    path = index.path if index is not None else resolve_dataset_path(spec)
    obj = read_from_disk(path, spec)
    if isinstance(obj, datasets.DatasetDict):
        names = list(obj.keys())
        if split is None:
            if len(names) != 1:
                raise UsageError(f"{spec!r} holds splits {names}; choose one with {split_option}")
            split = names[0]
        if split not in obj:
            raise UsageError(f"{split_option} {split}: {spec!r} has no split {split!r}; its splits are {names}")
        ds = obj[split]
    else:
        if split is not None:
            where_option = split_option.replace("split", "where")
            raise UsageError(
                f"{spec!r} is a single dataset, not a DatasetDict, so {split_option} does not apply; "
                f"select rows with {where_option} (e.g. {where_option} split={split})"
            )
        ds = obj
    fingerprint = ds._fingerprint
    rows_on_disk = len(ds)
    clauses = [w if isinstance(w, Where) else Where.parse(w) for w in where]
    if rows_on_disk == 0:
        raise UsageError(f"dataset {spec!r}{f' (split {split!r})' if split else ''} has no rows")
    if clauses:
        ds = apply_where(ds, clauses, spec)
    require_columns(ds, [*required, *images, *texts], spec)
    for column in images:
        checks.image_column(ds, column, spec)
    for column in texts:
        checks.text_column(ds, column, spec, option=text_option, allow_list=text_lists)
    where_ = [str(w) for w in clauses]
    if index is not None:  # the shards are what is read (and what --out may not touch)
        return LoadedDataset(spec, index.source.path, split, where_, fingerprint, rows_on_disk, ds, index)
    return LoadedDataset(spec, path, split, where_, fingerprint, rows_on_disk, ds)


def read_from_disk(path: Path | str, spec: str | None = None):
    """datasets.load_from_disk, with a one-line error for a directory it cannot read; a dataset saved with
    no rows (which datasets cannot load back) is read as an empty dataset with its columns."""
    import datasets

    path = Path(path)
    spec = str(path) if spec is None else spec
    tar_paths_add_no_bytes()
    try:
        return datasets.load_from_disk(str(path))
    except Exception as e:  # corrupt directory: datasets raises many kinds
        empty = _empty_saved_dataset(path)
        if empty is not None:
            return empty
        raise VltoolError(f"cannot read dataset {spec!r}: {e}") from e


def tar_paths_add_no_bytes() -> None:
    """Make datasets' save_to_disk count nothing for an image at a `tar://MEMBER::SHARD` path (installed
    once per process, by every read of a dataset).

    save_to_disk estimates a dataset's size from the files its image paths name (xgetsize of the first
    1,000 rows' paths, through fsspec, which indexes a whole shard with tarfile) to choose its number of
    files and rows per record batch. An image in a shard is not written (datasets embeds local files
    only), so it adds nothing; counted, 10M rows of 30 KB images would cut a 1 GB index into 600 files of
    tiny record batches, and a damaged first shard would stop every save."""
    import datasets.arrow_dataset as ad

    real = ad.xgetsize
    if getattr(real, "vltool_tar", False):
        return

    def xgetsize(path, *args, **kw):
        return 0 if parse_tar_url(path) is not None else real(path, *args, **kw)

    xgetsize.vltool_tar = True
    ad.xgetsize = xgetsize


def _empty_saved_dataset(path: Path):
    """The 0-row dataset (or DatasetDict of them) saved at `path`, or None when it is something else."""
    import datasets

    try:
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
            parts = {name: (datasets.load_from_disk(str(path / name)) if _saved_rows(path / name) else _empty_saved_dataset(path / name))
                     for name in splits}
            return None if any(v is None for v in parts.values()) else datasets.DatasetDict(parts)
        if _saved_rows(path) != 0:
            return None
        info = json.loads((path / "dataset_info.json").read_text())
        features = datasets.Features.from_dict(info["features"])
        return datasets.Dataset.from_dict({name: [] for name in features}, features=features)
    except Exception:
        return None


def _saved_rows(path: Path) -> int | None:
    """0 when `path` is a dataset saved without any data file, 1 when it has data files, None otherwise."""
    try:
        files = json.loads((path / "state.json").read_text())["_data_files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return 1 if files else 0


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
        if not col_mask.any():
            shown = " ".join(f"--where {w}" for w in ws)
            raise UsageError(f"{shown} matches no row of {what!r}; {column!r} holds {_some_values(arr, feature)}")
        keep &= col_mask
    if not keep.any():
        shown = " ".join(f"--where {w}" for w in clauses)
        raise UsageError(f"no row of {what!r} matches {shown} (each column matches some rows, but no row matches them all)")
    if keep.all():
        return ds
    return ds.select(np.flatnonzero(keep))


def _some_values(arr, feature, k: int = 5) -> str:
    """A few distinct values of a column, as --where would write them (ClassLabel by name)."""
    import datasets
    import pyarrow.compute as pc

    values = [v for v in pc.unique(arr).to_pylist() if v is not None]
    if isinstance(feature, datasets.ClassLabel):
        values = [feature.names[v] if 0 <= v < feature.num_classes else v for v in values]
    values = [str(v).lower() if isinstance(v, bool) else v for v in values]
    values = sorted(values, key=str)
    more = f", ... ({len(values)} distinct values)" if len(values) > k else ""
    return ("values such as " + ", ".join(repr(str(v)) for v in values[:k]) + more) if values else "no values (all empty)"

