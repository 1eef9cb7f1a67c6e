"""Reading inputs, writing outputs: the dataset contract every command shares (docs/conventions.md).

- `load_dataset` reads a `save_to_disk` directory (or `emoji`), picks `--split`, applies `--where`;
  WebDataset shards are read through their index (`shard_index`: built once in the cache, images left in
  the shards as `tar://MEMBER::SHARD` paths, which `decode_image` reads by offset).
- `atomic_output` gives a temporary directory beside the target and renames it into place at the end,
  so a failed or interrupted run leaves nothing half-written; an existing output needs `overwrite`.
- `check_output` refuses an output that is, contains or lies inside anything the command reads
  (`model_inputs` names what a --model reads), checks that its directory is writable, and inside an
  `output_scope()` (every CLI command runs in one) takes the output's lock: `.OUT.lock` beside it, an
  advisory flock held until the command ends. A second writer gets a one-line error; the holder removes
  the stale `.OUT.tmp-*` / `.OUT.work-*` a killed run left beside its output.
"""

from __future__ import annotations

import atexit
import errno
import glob
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tarfile
import tempfile
import time
import uuid
import warnings
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from vltool import checks, provenance
from vltool import columns as C
from vltool.checks import read_json, require_decoded
from vltool.console import Bar
from vltool.distinct import duplicate, string_hashes
from vltool.errors import DiskFull, UsageError, VltoolError, disk_full_cause, disk_full_message
from vltool.shards import (
    BAD_SHARD, DUPLICATE_ID, EMPTY_CAPTION, IMAGE_EXTS, NO_IMAGE, TAR_SUFFIXES, clean_captions, index_samples, is_compressed,
    is_shard_spec, load_shards, parse_tar_url, read_member, sample_meta, tar_url,
)
from vltool.topology import is_local_main, is_main, launch_token, launched_processes, process_state, warn

# datasets, pyarrow and PIL are imported inside the functions that use them, not here: `vltool --help` loads this
# module (through commands/common.py), and importing them costs about a second.

ASSETS = Path(__file__).resolve().parent / "assets"
# `emoji-openmoji`: emoji's test-split emoji in OpenMoji's art style (test only; vltool/assets/EMOJI_LICENSES.md).
BUILTIN_DATASETS = {"emoji": ASSETS / "emoji", "emoji-openmoji": ASSETS / "emoji-openmoji"}
TEST_ONLY_DATASETS = ("emoji-openmoji",)  # built-in data for evaluation only: refused as training input (test_only_inputs)


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


def model_inputs(spec: str | Path | None, pretrained: str | Path | None = None) -> list[Path]:
    """What a --model value reads, protected like an input dataset: a vltool RUN_DIR (or RUN_DIR/model)
    as given, local-dir:PATH's PATH, hf:DIR's DIR, open_clip:ARCH's weights file, and huggingface_hub's
    cache for a Hub id or an open_clip tag (its files are read from there)."""
    if spec is None or not str(spec).strip():
        return []
    s = str(spec)
    if s.startswith("open_clip:"):  # --pretrained FILE or open_clip:ARCH/FILE; a tag's or a Hub id's files are in the Hub cache
        files = [pretrained] if pretrained else [s[len("open_clip:"):].partition("/")[2]]
        local = [Path(f).expanduser() for f in files if f and Path(f).expanduser().is_file()]
        return local or (_hub_cache() if any(files) else [])
    if s.startswith("local-dir:"):
        if not s[len("local-dir:"):].strip():  # (Path("") is the current directory, which --out would then "overwrite")
            raise UsageError(f"{s!r} names no directory: expected local-dir:PATH (open_clip's local-dir layout)")
        return [Path(s[len("local-dir:"):]).expanduser()]
    if s.startswith("hf:"):  # a local folder; hf:ORG/NAME's files are in the Hub cache
        path = Path(s[len("hf:"):]).expanduser()
        if not s[len("hf:"):]:
            return []
        return [path] if path.exists() else _hub_cache()
    return [Path(s).expanduser()]


def _hub_cache() -> list[Path]:
    """huggingface_hub's cache, where a Hub id's files are read from."""
    from vltool.hub import hub_cache  # (lazy: vltool --help loads this module; huggingface_hub is not needed there)

    return [hub_cache()]


def _overlaps(out: Path, inp: Path) -> bool:
    """`out` equals `inp`, contains it, or lies inside it (symlinks resolved)."""
    resolved, inp = out.resolve(), Path(inp).expanduser().resolve()
    return resolved == inp or inp in resolved.parents or resolved in inp.parents


def check_output(
    out: Path | str,
    overwrite: bool,
    inputs: Sequence[Path | str] = (),
    *,
    related: Sequence[str] = (),
    lock: bool | None = None,
    kind: str = "dir",
) -> Path:
    """Refuse a bad output before any work, and (inside an output_scope) lock it for the command.

    Refused always, --overwrite or not: an output that is, contains or lies inside one of `inputs` (every
    path the command reads: datasets, models, subspaces, files), or vltool's built-in data. Refused: an
    output whose directory cannot be written (a file on the way, read-only, no permission), and an existing
    output without `overwrite`. `related` are the names of other files written beside `out` (stale
    temporaries of theirs are cleaned too); `lock` (default: the main process) takes the lock.

    `kind` is what the command writes at `out`: a directory ("dir") or a file ("file"). Refused always, as
    nothing vltool writes could replace it: a device, pipe or socket (`--out /dev/null`), and for a
    directory output an existing file or a non-empty directory vltool did not write (`--out ~`).
    """
    out = require_output_name(out)
    for inp in inputs:
        if inp is None or not str(inp).strip():
            continue
        if _overlaps(out, Path(inp)):
            raise UsageError(
                f"--out {out} would overwrite the input {Path(inp).expanduser().resolve()}; inputs are never modified: choose another --out"
            )
    resolved = out.resolve()
    if resolved == ASSETS or ASSETS in resolved.parents:
        raise UsageError(f"--out {out} is inside vltool's built-in data; choose another --out")
    check_writable(out)
    locks = lock if lock is not None else is_main_process()  # the process that locks `out` (of a launch: the main one)
    if locks:  # (the other processes of a launch find `out` locked by their own main process)
        refuse_if_busy(out)
    not_ours = _not_replaceable(out, kind)
    if not_ours:
        raise UsageError(f"--out {out} {not_ours}; vltool replaces only what it wrote (even with --overwrite): choose another --out")
    if out.exists() and not overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    if _SCOPES and locks:
        hold_output_lock(out, related=related)
    return out


# What marks a directory as an output of vltool (or a dataset, which vltool reads and writes alike).
OUTPUT_MARKS = (C.PROVENANCE_FILE, "state.json", "dataset_dict.json", "run.json")


def _not_replaceable(out: Path, kind: str) -> str | None:
    """Why an existing `out` may not be replaced by a `kind` output ("dir" or "file"), or None."""
    try:
        mode = os.stat(out).st_mode  # (through a symlink: what it points to)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be inspected ({e.strerror})"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "is a device, pipe or socket, not a file or directory"
    if kind == "dir" and stat.S_ISREG(mode):
        return "is an existing file, not an output directory"
    if kind == "dir" and stat.S_ISDIR(mode):
        try:
            entries = os.listdir(out)
        except OSError as e:
            return f"cannot be listed ({e.strerror})"
        if entries and not any(m in entries for m in OUTPUT_MARKS):
            return f"is a directory vltool did not write (no {C.PROVENANCE_FILE}; it holds {len(entries)} entries)"
    return None


def require_output_name(out: Path | str) -> Path:
    """`out`, or an error when it names no new file or directory: "" (which arrives as "."), ".", "..", "/"."""
    out = Path(out).expanduser()
    if out.name in ("", ".", ".."):
        raise UsageError(f"--out {str(out)!r} names no new file or directory (the current, a parent or the root directory); "
                         "give a name, e.g. --out results/NAME")
    return out


def check_writable(out: Path | str) -> None:
    """A one-line error when `out` cannot be created: a file where a directory should be, or a directory
    that is read-only or not ours to write."""
    out = Path(out).expanduser().absolute()
    p = out.parent
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise UsageError(f"--out {out}: {p} is not a directory, so nothing can be written under it")
    why = not_writable(p)
    if why:
        raise UsageError(f"--out {out}: cannot write in {p} ({why}); choose another --out")


def not_writable(p: Path | str) -> str | None:
    """Why the directory `p` cannot be written in ("read-only file system", "permission denied"), or None."""
    if os.access(p, os.W_OK | os.X_OK) and not _read_only_fs(Path(p)):
        return None
    return "read-only file system" if _read_only_fs(Path(p)) else "permission denied"


def _read_only_fs(p: Path) -> bool:
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def is_main_process() -> bool:
    """Whether this is the main process of a launch (`accelerate launch`, torchrun set RANK), read from the
    environment without starting anything: only it takes output locks."""
    return os.environ.get("RANK", "0") in ("", "0")


# ---- output locks: one writer per output (docs/conventions.md, "Writes")

_SCOPES: list[dict] = []  # output_scope() stack: the locks and directories taken inside each
_HELD: dict[str, "_Lock"] = {}  # resolved output path -> the lock this process holds on it

STALE_MARKS = (".tmp-", ".work-", ".old-")


class OutputBusy(VltoolError):
    """Another live process holds the output's lock."""


@dataclass
class _Lock:
    out: Path
    path: Path
    fd: int

    def release(self) -> None:
        _HELD.pop(str(self.out.resolve()), None)
        try:
            os.unlink(self.path)  # while still holding it: a waiting opener re-checks the inode
        except OSError:
            pass
        os.close(self.fd)


def lock_file(out: Path | str) -> Path:
    out = Path(out).expanduser()
    return out.parent / f".{out.name}.lock"


@contextmanager
def output_scope() -> Iterator[None]:
    """Locks taken by check_output inside the block are held until it ends; directories it created for an
    output are removed again (when empty) if the block fails. Every CLI command runs in one."""
    scope: dict = {"locks": [], "created": []}
    _SCOPES.append(scope)
    ok = False
    try:
        yield
        ok = True
    except Exception as e:
        full = None if isinstance(e, VltoolError) else disk_full_cause(e)
        if full is None:
            raise
        raise DiskFull(disk_full_message(_written_path(full, [lk.out for lk in scope["locks"]]))) from e
    finally:
        _SCOPES.remove(scope)
        for lk in reversed(scope["locks"]):
            lk.release()
        if not ok:
            for d in reversed(scope["created"]):
                try:
                    d.rmdir()
                except OSError:
                    pass


def _written_path(error: BaseException, outputs: Sequence[Path]) -> str | None:
    """What a write that failed with `error` was writing, for the user: the output (`--out`) when the file
    is the output, inside it or a temporary beside it (`.OUT.tmp-*`, `.OUT.work-*`), else the file named by
    the error, else the command's outputs."""
    filename = getattr(error, "filename", None)
    if filename is None:
        return ", ".join(map(str, outputs)) or None
    failed = Path(os.fsdecode(filename)).absolute()
    for out in outputs:
        if any(p == out.absolute() or (p.parent == out.absolute().parent and p.name.startswith(f".{out.name}."))
               for p in (failed, *failed.parents)):
            return str(out)
    return str(failed)


def hold_output_lock(out: Path | str, *, related: Sequence[str] = (), keep: Sequence[Path] = ()) -> None:
    """Take `out`'s lock for the innermost output_scope (re-entrant in one process) and remove stale
    temporaries beside it. Raises OutputBusy when another live process holds it."""
    out = Path(out).expanduser()
    if not _SCOPES or str(out.resolve()) in _HELD:
        return
    _make_parents(out)
    lk = _acquire(out)
    _SCOPES[-1]["locks"].append(lk)
    removed = clean_stale(out, related=related, keep=keep)
    if removed:
        shown = ", ".join(p.name for p in removed[:3]) + (", ..." if len(removed) > 3 else "")
        warn(f"removed what {len(removed)} killed or stopped write(s) of {out} left beside it ({shown})")


def _make_parents(out: Path) -> None:
    missing = []
    p = out.parent
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"--out {out}: cannot create {d} ({e.strerror})") from None
        if _SCOPES:
            _SCOPES[-1]["created"].append(d)


def _acquire(out: Path) -> _Lock:
    import fcntl  # POSIX only: imported where a lock is taken, so the module still imports elsewhere

    path = lock_file(out)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UsageError(f"--out {out}: cannot write in {path.parent} ({e.strerror}); choose another --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            busy = _busy_error(out, fd) if e.errno in LOCK_HELD_ERRNOS else None
            os.close(fd)
            if busy is not None:
                raise busy from None
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # else the previous holder removed the file between our open and flock: take the new one
            break
        os.close(fd)
    _write_holder(fd, path, out)
    lk = _Lock(out, path, fd)
    _HELD[str(out.resolve())] = lk
    return lk


LOCK_HELD_ERRNOS = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)  # flock(LOCK_NB) on a lock another process holds


def _busy_error(out: Path, fd: int) -> OutputBusy:
    """The error for a second writer of `out`, naming the holder's pid from the lock file (`fd`) when readable."""
    try:
        holder = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        holder = ""
    return OutputBusy(f"{out} is being written by another vltool process{f' (pid {holder})' if holder.isdigit() else ''}; "
                      "wait for it to finish or choose another --out")


def refuse_if_busy(out: Path | str) -> None:
    """Raise OutputBusy when another live process holds `out`'s lock (looked at without taking it): a second
    writer of `out` is told that, not what the first one's output looks like half made (a run directory
    with run.json only, a directory vltool "did not write")."""
    import fcntl  # (POSIX only: see _acquire)

    out = Path(out).expanduser()
    if str(out.resolve()) in _HELD:
        return
    try:
        fd = os.open(lock_file(out), os.O_RDONLY)
    except OSError:  # no lock file: nobody writes `out`
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in LOCK_HELD_ERRNOS:
            raise _busy_error(out, fd) from None
    finally:
        os.close(fd)


def _write_holder(fd: int, path: Path, out: Path) -> None:
    """Write this process's id into the lock file `path` (held through `fd`) for a second writer's message.
    When it cannot be written (a full disk), the lock file is removed and closed: nothing is left beside
    `out`, and the error names `out`."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        with suppress(OSError):
            os.unlink(path)
        os.close(fd)
        raise OSError(e.errno, e.strerror, str(out)) from None


def clean_stale(out: Path | str, *, related: Sequence[str] = (), keep: Sequence[Path] = ()) -> list[Path]:
    """Remove what killed writes of `out` (and of the `related` files beside it) left: `.NAME.tmp-*`,
    `.NAME.work-*`; a `.NAME.old-*` (an output moved aside while being replaced) is removed when NAME
    exists and moved back when it does not. Call only while holding `out`'s lock."""
    out = Path(out).expanduser()
    parent = out.parent
    keep_ = {Path(k).resolve() for k in keep}
    removed = []
    for name in [out.name, *related]:
        olds = []
        for p in parent.glob(f".{_glob_escape(name)}.*-*"):
            mark = next((m for m in STALE_MARKS if p.name.startswith(f".{name}{m}")), None)
            if mark is None or p.resolve() in keep_:
                continue
            if mark == ".old-":
                olds.append(p)
                continue
            _remove(p)
            removed.append(p)
        target = parent / name
        for p in sorted(olds, key=lambda q: q.stat().st_mtime, reverse=True):
            if not target.exists() and not target.is_symlink():
                os.rename(p, target)  # the swap was cut between its two renames: the old output comes back
            else:
                _remove(p)
                removed.append(p)
    return removed


def _glob_escape(name: str) -> str:
    return glob.escape(name)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


@contextmanager
def _write_lock(out: Path) -> Iterator[None]:
    """Hold `out`'s lock while writing it: the command's own when it has one, else taken for the write."""
    if str(out.resolve()) in _HELD or not is_main_process():
        yield
        return
    lk = _acquire(out)
    try:
        clean_stale(out)
        yield
    finally:
        lk.release()


def work_dir(out: Path | str, token: str | None = None) -> Path:
    """A hidden sibling directory in which `out` is built before it replaces `out` (`.OUT.work-TOKEN`)."""
    out = Path(out).expanduser()
    return out.parent / f".{out.name}.work-{token or uuid.uuid4().hex[:8]}"


def final_of_work_dir(path: Path | str) -> Path | None:
    """The output a work_dir() is built for, or None when `path` is not one."""
    path = Path(path)
    name = path.name
    if not name.startswith(".") or ".work-" not in name:
        return None
    return path.parent / name[1:].rsplit(".work-", 1)[0]


@contextmanager
def atomic_output(out: Path | str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `out`; on success rename it to `out`.

    On any error the temporary directory is removed and `out` is untouched.
    """
    out = Path(out).expanduser()
    if out.exists() and not overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _write_lock(out):
        tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            replace_path(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def replace_path(src: Path, out: Path, overwrite: bool) -> None:
    """Rename `src` onto `out`; an existing `out` is moved aside first and removed after."""
    if out.exists() or out.is_symlink():
        if out.exists() and not (out.is_dir() or out.is_file()):  # a device or pipe (/dev/null) is never replaced
            raise UsageError(f"{out} is a device, pipe or socket; vltool replaces only what it wrote")
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
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}{path.suffix}"
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
    try:
        tmp.write_text(json.dumps(obj, indent=2, default=str, ensure_ascii=False) + "\n")
        if path.exists() and not overwrite:
            raise UsageError(f"{path} exists; pass --overwrite to replace it")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_dataset(ds, out: Path | str, provenance: dict, *, overwrite: bool = False, num_proc: int | None = None) -> Path:
    """Write `ds` and its `vltool.json` atomically to `out`.

    Under `accelerate launch` only the main process writes (the others return at once: no collective
    here, since some commands reach this line on the main process alone)."""
    out = Path(out).expanduser()
    if len(ds) == 0:
        raise VltoolError(f"nothing to write to {out}: no row is left (every row was filtered out or dropped)")

    if is_main():
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

    return read_json(f, "the provenance record")


def test_only_origin(loaded: "LoadedDataset") -> str | None:
    """The built-in test-only dataset (TEST_ONLY_DATASETS) `loaded` is, or was made from (its provenance
    chain, inputs[].path, followed as LoadedDataset.reads follows it), else None."""
    marks = {BUILTIN_DATASETS[name].resolve(): name for name in TEST_ONLY_DATASETS}
    seen, todo = set(), [Path(loaded.path)]
    while todo and len(seen) < 64:
        p = todo.pop()
        try:
            p = p.expanduser().resolve()
        except (OSError, RuntimeError):
            continue
        if p in marks:
            return marks[p]
        if p in seen:
            continue
        seen.add(p)
        try:
            rec = read_provenance(p) if p.is_dir() else None
        except VltoolError:  # a damaged record of an upstream dataset: nothing more to follow
            rec = None
        todo += [Path(i["path"]) for i in (rec or {}).get("inputs") or [] if isinstance(i, dict) and isinstance(i.get("path"), str)]
    return None


def test_only_inputs(loaded: Sequence["LoadedDataset"], role: str, allow: bool, option: str = "--allow-test-data") -> list[str]:
    """The inputs of `loaded` that are built-in test-only data (or made from it): a usage error naming the
    first, as `role` (e.g. "training input"), unless `allow` (`option`, recorded with the command's options;
    then a warning). Returns the spec of each such input, for the record."""
    found = [(src.spec, name) for src in loaded if (name := test_only_origin(src)) is not None]
    if not found:
        return []
    spec, name = found[0]
    made = "" if spec == name else f" (made from the built-in {name!r})"
    if not allow:
        raise UsageError(
            f"{spec!r}{made} is test-only data: the held-out emoji drawn in another art style, for evaluation only; "
            f"it is not a {role}. Train on other data, or pass {option} to use it anyway (recorded)"
        )
    warn(f"{spec!r}{made} is test-only data, used as {role} because of {option}")
    return [s for s, _ in found]


def default_cache_dir() -> Path:
    """`$VLTOOL_CACHE`, else `~/.cache/vltool`."""
    env = os.environ.get("VLTOOL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vltool"


def image_size_policy() -> None:
    """vltool's policy on huge images: one over PIL's limit (PIL.Image.MAX_IMAGE_PIXELS, about 89
    megapixels) is a bad image, skipped and counted like an undecodable one, never a raw
    DecompressionBombWarning. Every reader of images (decode_image, import, export) calls this first.

    The rule is put back in front of the warning filters whenever something (a notebook's or a test's
    warnings.catch_warnings, a library) has replaced or shadowed it."""
    from PIL import Image

    first = warnings.filters[0] if warnings.filters else None
    if first is not None and first[0] == "error" and first[2] is Image.DecompressionBombWarning:
        return
    warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def image_bytes(value) -> bytes | None:
    """The encoded bytes of datasets' undecoded image ({bytes, path}): its bytes, the shard member a
    `tar://MEMBER::SHARD` path names (one pread, vltool.shards.read_member), or the file a path names.
    Raises OSError/KeyError when the file or member cannot be read; None when the value holds neither."""
    if value is None:
        return None
    if value.get("bytes") is not None:
        return value["bytes"]
    path = value.get("path")
    if not path:
        return None

    if parse_tar_url(path) is not None:
        return read_member(path)
    with open(path, "rb") as f:
        return f.read()


def decode_image(value, rgb: bool = True):
    """datasets' undecoded image ({bytes, path}) -> RGB PIL image, or None when it cannot be decoded.
    `rgb=False` keeps the image's own mode (RGBA, P, L, ...) for a model's transform that converts it
    itself, as open_clip's and transformers' do (vltool.transforms.eval_transform).

    Training, encoding and pseudo-labelling all read images through this, so they agree on what a bad
    image is (skipped and counted; images over the size limit too, see image_size_policy). A path
    `tar://MEMBER::SHARD` (the shard index's) is read from the shard by offset."""
    from PIL import Image

    image_size_policy()
    try:
        data = image_bytes(value)
        if data is None:
            return None
        im = Image.open(io.BytesIO(data))
        im.load()
        return im.convert("RGB") if rgb else im
    except Exception:
        return None


def require_a_decodable_image(ds, column: str, what: str) -> None:
    """An error before any work when not one image of `column` decodes (every image corrupt, missing or
    too large). Cheap when the data are fine: the scan stops at the first image that decodes."""
    import datasets

    if isinstance(ds.features[column], datasets.Image) and ds.features[column].decode:
        ds = ds.cast_column(column, datasets.Image(decode=False))
    for lo in range(0, len(ds), 256):
        if any(decode_image(v) is not None for v in ds[lo : lo + 256][column]):
            return
    require_decoded([True] * len(ds), what)


# ---- WebDataset shards given directly: the shard index (docs/conventions.md, "Shards as input to every command")

SHARD_INDEX_DIR = "shards"  # <cache-dir>/shards/<name>-<digest>: the index of shards given directly
SHARD_INDEX_VERSION = 1  # part of the digest: a change to what the index holds builds new ones
SHARD_INDEX_COMMAND = "shard-index"  # the `command` of the index's vltool.json
RESERVED_COLUMNS = (C.ID, C.IMAGE, C.CAPTION, C.CAPTIONS, C.LABEL, C.LABELS, C.POSITIVES)  # never taken from the json


@dataclass
class ShardIndex:
    """WebDataset shards given as a dataset, and the index dataset that stands for them."""

    source: Any  # vltool.shards.ShardSource: the shards, their folder and fingerprint
    path: Path  # the index: a save_to_disk directory, one row per sample with an image and a text


def is_shard_input(spec: str | Path) -> bool:
    """Whether a dataset argument names WebDataset shards: a pattern or path ending in .tar (.tar.gz, .tgz),
    or a folder holding .tar files that is not a saved dataset (CLIP_benchmark's layout keeps its split
    folders' shards one level down, and is read by vltool.importer.clip_benchmark_input)."""
    text = str(spec)
    if text in BUILTIN_DATASETS:
        return False
    path = Path(text).expanduser()
    if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        return False  # a saved dataset (whatever its name)
    if is_shard_spec(text):
        return True
    if not path.is_dir():
        return False
    try:
        return any(p.name.lower().endswith(TAR_SUFFIXES) and p.is_file() for p in path.iterdir())
    except OSError:
        return False


def shard_index(spec: str | Path, cache_dir: str | Path | None = None) -> ShardIndex | None:
    """The index of the shards `spec` names (None when it names no shards), built on first use into
    `<cache-dir>/shards/<folder name>-<digest of the shards' paths, sizes and times>`.

    Built once: atomically (a temporary directory renamed into place), under the index's lock, so that a
    second command asking for it meanwhile waits and then reads it. Under `accelerate launch` the first
    process of each node builds it (a cache shared by the nodes: one of them, the others wait for its lock)
    and every process waits at a barrier. A cache that cannot be written: the index is built for this run
    in a temporary directory, with a warning."""
    if not is_shard_input(spec):
        return None
    source = load_shards(str(spec))
    packed = [p.name for p in source.shards if is_compressed(p)]
    if packed:
        raise UsageError(
            f"{spec!r}: compressed shards ({packed[0]}{', ...' if len(packed) > 1 else ''}) cannot be read by offset; "
            "decompress them (gunzip), or copy them into a dataset with `vltool import`"
        )
    digest = hashlib.sha256(f"v{SHARD_INDEX_VERSION}:{source.fingerprint}".encode()).hexdigest()[:16]
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    dest = root / SHARD_INDEX_DIR / f"{source.path.name or 'shards'}-{digest}"

    if is_local_main():
        while not _index_ready(dest):
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                lk = _acquire(dest)
            except OutputBusy:  # another command is building it: wait for it (or build it if that one fails)
                time.sleep(0.5)
                continue
            except (OSError, UsageError) as e:  # a cache that cannot be written
                dest = _run_index(digest)
                shutil.rmtree(dest.parent, ignore_errors=True)
                dest.parent.mkdir(parents=True)
                atexit.register(shutil.rmtree, dest.parent, ignore_errors=True)
                _warn(f"cannot write the index of {spec} into {root} ({getattr(e, 'strerror', None) or e}); it is built for this run only")
                _build_shard_index(source, dest, digest, spec)
                break
            try:
                clean_stale(dest)
                if not _index_ready(dest):
                    _build_shard_index(source, dest, digest, spec)
            finally:
                lk.release()
    if launched_processes() > 1:
        process_state().wait_for_everyone()
        if not _index_ready(dest):  # the node's first process built it for this run only: read that copy
            dest = _run_index(digest)
    return ShardIndex(source, dest)


def _index_ready(dest: Path) -> bool:
    return (dest / "state.json").is_file() and (dest / C.PROVENANCE_FILE).is_file()


def _run_index(digest: str) -> Path:
    """Where the index is built for this run alone when the cache cannot be written: in a temporary
    directory that every process of this launch on this node names alike (the builder removes it at exit)."""
    return Path(tempfile.gettempdir()) / f"vltool-shard-index-{digest}-{launch_token()}" / "index"


def _warn(message: str) -> None:
    if is_main_process():
        print(f"warning: {message}", file=sys.stderr)


def _json_columns(shards: Sequence[Path], peek: int = 8) -> tuple[dict[str, str], bool]:
    """({column: dtype}, captions?): the scalar fields of the json of the first sample that has one among
    the first samples of the first `peek` shards (img2dataset's url, width, height, status, ...; not the
    contract's own column names), typed by their values (null: string), and whether it carries a
    `captions` list (vltool export writes one)."""
    for shard in shards[:peek]:
        try:
            for _, files in index_samples(shard):
                if "json" not in files:
                    break  # (shards without json: no extra columns, and no pass over them)
                meta = sample_meta(files)
                cols = {}
                for k, v in meta.items():
                    if k in RESERVED_COLUMNS or isinstance(v, (dict, list)):
                        continue
                    cols[k] = ("bool" if isinstance(v, bool) else "int64" if isinstance(v, int) else
                               "float64" if isinstance(v, float) else "string")
                return cols, isinstance(meta.get(C.CAPTIONS), list)
        except (tarfile.TarError, OSError, ValueError):
            continue
    return {}, False


def _json_value(v, dtype: str):
    """A json field's value in its column's type, or None when it has another type."""
    if dtype == "string":
        return v if isinstance(v, str) or v is None else None if isinstance(v, (dict, list)) else json.dumps(v)
    if isinstance(v, bool) or v is None:
        return v if dtype == "bool" else None
    if dtype == "int64":
        return v if isinstance(v, int) else int(v) if isinstance(v, float) and v.is_integer() else None
    if dtype == "float64":
        return float(v) if isinstance(v, (int, float)) else None
    return None


def _index_rows(shards: list[str], columns: dict, captions: bool, stats: dict) -> Iterator[dict]:
    """A row per sample with an image and a text, as `vltool import` reads a sample (id: the json's `id`,
    else the key; the image: the first of IMAGE_EXTS, as its tar:// URL; caption: the txt, else the json's
    caption); skipped samples and damaged shards go to `stats`."""
    skipped = stats["skipped"]
    for shard in shards:
        key, n = None, 0
        try:
            for key, files in index_samples(shard, stats):
                stats["samples_read"] += 1
                image = next((files[e] for e in IMAGE_EXTS if e in files), None)  # (B) a Member, never read
                if image is None:
                    skipped[NO_IMAGE] = skipped.get(NO_IMAGE, 0) + 1
                    continue
                meta = sample_meta(files)
                caps = clean_captions(files["txt"].decode("utf-8", errors="replace") if "txt" in files else meta.get("caption"))
                caption = caps[0] if caps else None
                if captions and isinstance(meta.get(C.CAPTIONS), list):
                    caps = clean_captions(meta[C.CAPTIONS])
                caption = caption or (caps[0] if caps else None)
                if not caption:
                    skipped[EMPTY_CAPTION] = skipped.get(EMPTY_CAPTION, 0) + 1
                    continue
                row_id = meta.get("id") if isinstance(meta.get("id"), str) and meta.get("id") else key
                row = {C.ID: row_id, C.IMAGE: tar_url(image.name, shard), C.CAPTION: caption}  # (the image's path)
                if captions:
                    row[C.CAPTIONS] = caps or [caption]
                for name, dtype in columns.items():
                    row[name] = _json_value(meta.get(name), dtype)
                n += 1
                yield row
        except (tarfile.TarError, OSError, EOFError, ValueError) as e:
            after = f"after sample {key}" if key is not None else "from its start"
            stats["damaged_shards"].append({"shard": shard, "samples_indexed": n, "error": f"{type(e).__name__}: {e}"})
            _warn(f"{shard}: unreadable {after} ({type(e).__name__}: {e}); its {n} readable samples are indexed, "
                  "the rest of this shard is skipped")
        stats["progress"](1)


INDEX_DATA_FILE = "data-00000-of-00001.arrow"  # the index's one Arrow file (save_to_disk's name)
INDEX_BATCH = 1000  # rows per record batch (datasets' size for text; its 100 for image bytes would be 10x more batches)


def _build_shard_index(source, dest: Path, digest: str, spec) -> None:
    """Write the index of `source` (vltool.shards.ShardSource) at `dest` as save_to_disk lays a dataset out
    (one Arrow file, state.json, dataset_info.json) with vltool.json: one streaming pass over the shards
    into Arrow columns of INDEX_BATCH rows written by datasets' ArrowWriter (bounded memory, no per-row
    encoding by datasets), then duplicate ids dropped (the first kept) by a second pass when there are any."""
    import datasets

    timer = provenance.Timer()
    shards = [os.path.abspath(p) for p in source.shards]
    _warn(f"{spec}: WebDataset shards, indexed into {dest} (once: one pass over the shards' headers, captions "
          "and json; the images stay in the shards, and later runs read this index)")
    columns, captions = _json_columns(shards)
    feats = {C.ID: datasets.Value("string"), C.IMAGE: datasets.Image(), C.CAPTION: datasets.Value("string")}
    if captions:
        feats[C.CAPTIONS] = datasets.List(datasets.Value("string"))
    feats.update({k: datasets.Value(t) for k, t in columns.items()})
    features = datasets.Features(feats)
    bar = Bar(f"indexing {len(shards):,} shards", len(shards), unit="shards", enabled=is_main_process())
    stats: dict = {"samples_read": 0, "skipped": {}, "damaged_shards": [], "bytes_read": 0, "progress": bar.advance}
    try:
        with atomic_output(dest) as tmp:
            data = tmp / INDEX_DATA_FILE
            rows = _write_index_rows(data, features, _index_rows(shards, columns, captions, stats))
            bar.close()
            skipped = dict(stats["skipped"])
            if rows == 0:
                why = {**skipped, **({BAD_SHARD: len(stats["damaged_shards"])} if stats["damaged_shards"] else {})}
                raise VltoolError(f"{spec}: no sample of the {len(shards)} shards has an image and a text "
                                  f"({stats['samples_read']} read; {why or 'the shards are empty'})")
            ids = _read_arrow(data).column(C.ID)
            if duplicate(ids)[0]:
                drop = duplicate_rows(ids)
                skipped[DUPLICATE_ID] = len(drop)
                rows = _drop_index_rows(data, features, drop)
            del ids
            datasets.DatasetInfo(features=features).write_to_directory(str(tmp))
            state = {"_data_files": [{"filename": INDEX_DATA_FILE}], "_fingerprint": f"shard-index-{digest}",
                     "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
                     "_split": None}
            (tmp / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
            rows_in = stats["samples_read"]
            index_stats = {
                "shards": len(shards),
                "samples_read": rows_in,
                "rows_out": rows,
                "rows_skipped": rows_in - rows,
                "skipped": dict(sorted(skipped.items())),
                "damaged_shards": stats["damaged_shards"],
                "columns": list(feats),
                "json_columns": list(columns),
                "shard_bytes": sum(p.stat().st_size for p in source.shards),
                "bytes_read": stats["bytes_read"],
                "images": "tar://MEMBER::SHARD paths into the shards (read by offset; not copied)",
            }
            prov = provenance.make(SHARD_INDEX_COMMAND, {"version": SHARD_INDEX_VERSION}, [source], rows_in=rows_in,
                                   rows_out=rows, stats=index_stats, timer=timer)
            write_json_atomic(tmp / C.PROVENANCE_FILE, prov)
    finally:
        bar.close()


def _index_table(cols: dict[str, list], features):
    """A pyarrow Table of index rows from their columns (the image column holds the tar:// URLs)."""
    import pyarrow as pa

    schema = features.arrow_schema
    arrays = []
    for name in features:
        if name == C.IMAGE:  # datasets' Image storage, {bytes: null, path}
            paths = pa.array(cols[name], pa.string())
            arrays.append(pa.StructArray.from_arrays([pa.nulls(len(paths), pa.binary()), paths], names=["bytes", "path"]))
        else:
            arrays.append(pa.array(cols[name], type=schema.field(name).type))
    return pa.Table.from_arrays(arrays, names=list(features))


def _write_index_rows(path: Path, features, rows: Iterator[dict]) -> int:
    """Write `rows` to the Arrow file `path` in record batches of INDEX_BATCH rows; returns the count."""
    from datasets.arrow_writer import ArrowWriter

    writer = ArrowWriter(features=features, path=str(path), writer_batch_size=INDEX_BATCH)
    cols: dict[str, list] = {name: [] for name in features}
    n = 0
    try:
        for row in rows:
            for name, values in cols.items():
                values.append(row.get(name))
            n += 1
            if n % INDEX_BATCH == 0:
                writer.write_table(_index_table(cols, features))
                cols = {name: [] for name in features}
        if cols[C.ID]:
            writer.write_table(_index_table(cols, features))
        writer.finalize()
    finally:
        writer.close()
    return n


def _read_arrow(path: Path):
    """The table of an Arrow stream file written by datasets, memory-mapped (nothing copied)."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()


def _drop_index_rows(path: Path, features, drop: list[int]) -> int:
    """Rewrite the Arrow file `path` without the rows `drop`, batch by batch; returns the rows left."""
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter

    keep = np.ones(_read_arrow(path).num_rows, dtype=bool)  # (rows,)
    keep[drop] = False
    tmp = path.with_name(path.name + ".dedup")
    writer = ArrowWriter(features=features, path=str(tmp), writer_batch_size=INDEX_BATCH)
    try:
        at = 0
        for batch in _read_arrow(path).to_batches():
            writer.write_table(pa.Table.from_batches([batch]).filter(keep[at : at + batch.num_rows]))
            at += batch.num_rows
        writer.finalize()
    finally:
        writer.close()
    os.replace(tmp, path)
    return int(keep.sum())


def duplicate_rows(ids) -> list[int]:
    """The rows whose id repeats an earlier row's, in order (ids: a pyarrow Array or ChunkedArray).

    Memory is 16 bytes a row (a 64-bit hash of each id, vltool.distinct's, and a sort order), not a set of
    the ids: rows whose hashes collide are compared by their ids, so a collision never counts a row twice."""
    hashes = string_hashes(ids)
    order = np.argsort(hashes, kind="stable")  # equal hashes stay in row order
    sorted_h = hashes[order]
    same = np.flatnonzero(sorted_h[1:] == sorted_h[:-1])
    if same.size == 0:
        return []
    drop: list[int] = []
    starts = np.unique(np.concatenate([same, same + 1]))
    for group in np.split(starts, np.flatnonzero(np.diff(starts) > 1) + 1):  # runs of equal hashes
        seen: set = set()
        for row in sorted(order[group].tolist()):
            v = ids[row].as_py()
            if v in seen:
                drop.append(row)
            else:
                seen.add(v)
    return sorted(drop)
