"""The shard index: WebDataset shards given directly, read through an index dataset built once in the cache.

`shard_index` builds (once, atomically, under a lock, into `<cache-dir>/shards/<name>-<digest>`;
`default_cache_dir` is `$VLTOOL_CACHE` or ~/.cache/vltool) a save_to_disk dataset with one row per sample
that has an image and a text; the images stay in the shards as `tar://MEMBER::SHARD` paths, which
vltool.io.images.decode_image reads by offset. docs/conventions.md, "Shards as input to every command".
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from vltool import columns as C
from vltool import provenance
from vltool.console import Bar
from vltool.distinct import duplicate, string_hashes
from vltool.errors import UsageError, VltoolError
from vltool.io.atomic import atomic_output, write_json_atomic
from vltool.io.builtin import BUILTIN_DATASETS
from vltool.io.locks import OutputBusy, _acquire, clean_stale, is_main_process
from vltool.shards import (
    BAD_SHARD, DUPLICATE_ID, EMPTY_CAPTION, IMAGE_EXTS, NO_IMAGE, TAR_SUFFIXES, clean_captions, index_samples, is_compressed, is_shard_spec,
    load_shards, sample_meta, tar_url,
)
from vltool.topology import is_local_main, launch_token, launched_processes, process_state

# datasets, pyarrow and PIL are imported inside the functions that use them, not here: `vltool --help` loads this
# module (through commands/common.py), and importing them costs about a second.


def default_cache_dir() -> Path:
    """`$VLTOOL_CACHE`, else `~/.cache/vltool`."""
    env = os.environ.get("VLTOOL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vltool"


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

