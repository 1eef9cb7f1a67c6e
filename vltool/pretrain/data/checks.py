"""The training rows' checks: ids unique within an input and across inputs (unless --prefix-ids), by their
sorted 64-bit hashes (vltool.distinct), also for shards (their index's count of repeated ids); the rows
without text; the verdict on a set of inputs kept in the cache under their fingerprints and filters, so a
resume, a later run and the other processes of a launch skip the check."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vltool import columns as C
from vltool.cache import row_filter
from vltool.checks import has_text
from vltool.distinct import duplicate
from vltool.errors import UsageError
from vltool.io.atomic import atomic_file
from vltool.io.digests import arrow_column
from vltool.io.index import default_cache_dir
from vltool.io.records import read_provenance
from vltool.shards import DUPLICATE_ID
from vltool.topology import is_local_main


def _input_key(src) -> dict:
    """An input's part of a key: its on-disk fingerprint and row filter (vltool.cache's convention)."""
    return {"fingerprint": src.fingerprint, **row_filter(src.split, src.where)}


def check_ids(named_ids: list, prefixed: bool, hint: str = "") -> None:
    """Raise on duplicate ids within an input, and on an id in two inputs unless `prefixed` (--prefix-ids:
    '<input index>:<id>' cannot clash). named_ids: (spec, its Arrow id column) of each input. By their
    sorted 64-bit hashes (vltool.distinct: 8 bytes a row, where Arrow's count_distinct kept 0.7 GB at 10M
    ids); only the offending ids become Python objects."""
    for spec_, ids in named_ids:
        repeated, an_id = duplicate(ids)
        if repeated:
            raise UsageError(f"{spec_!r} has duplicate ids (e.g. {an_id!r}); ids must be unique")
    if len(named_ids) > 1 and not prefixed:
        columns = [ids for _, ids in named_ids]
        clashes, clash = duplicate(pa.chunked_array([c for ids in columns for c in ids.chunks], type=columns[0].type))
        if clashes:
            first, second = [spec_ for spec_, ids in named_ids if pc.any(pc.equal(ids, clash)).as_py()][:2]
            raise UsageError(
                f"id {clash!r} is in both {first!r} and {second!r}; "
                f"pass --prefix-ids to make ids unique as '<input index>:<id>'{hint}"
            )


def check_rows(loaded, text_col: str, lists: bool, prefixed: bool) -> np.ndarray:
    """(dropped,) int64: the rows of the concatenated inputs without text; raises on duplicate ids within an
    input, and on an id in two inputs unless `prefixed` (--prefix-ids: '<input index>:<id>' cannot clash).

    Whole-column work in Arrow and numpy, no per-row Python: ids by check_ids, texts by a vectorised test."""
    check_ids([(src.spec, arrow_column(src.dataset, C.ID)) for src in loaded], prefixed)
    dropped, offset = [], 0
    for src in loaded:
        dropped.append(np.flatnonzero(~has_text(arrow_column(src.dataset, text_col), lists)) + offset)
        offset += len(src.dataset)
    pa.default_memory_pool().release_unused()  # the slices' transient arrays, which Arrow's pool would keep for the run
    return np.concatenate(dropped).astype(np.int64)


VERDICT_DIR = "checked-rows"  # <cache-dir>/checked-rows/<key>.npy: the rows without text of inputs whose ids passed


VERDICT_VERSION = 1  # part of the key: a change to what is checked makes new verdicts


def _verdict_file(loaded, text_col: str, lists: bool, prefix_ids: bool):
    """Where the verdict on these inputs is kept: keyed by each input's on-disk fingerprint and row filter
    (vltool.cache's convention), the text column and how it is read, and --prefix-ids."""
    key = {"version": VERDICT_VERSION, "text": text_col, "lists": lists, "prefix_ids": prefix_ids and len(loaded) > 1,
           "inputs": [{**_input_key(s), "rows": s.rows} for s in loaded]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return default_cache_dir() / VERDICT_DIR / f"{digest}.npy"


def _read_verdict(path) -> np.ndarray | None:
    """The cached rows without text (int64), or None when there is no readable verdict."""
    try:
        dropped = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return dropped if dropped.dtype == np.int64 and dropped.ndim == 1 else None


def _write_verdict(path, dropped: np.ndarray) -> None:
    """Keep the verdict (atomically, by the first process of a node; a cache that cannot be written is
    skipped: the verdict is only a shortcut)."""
    if not is_local_main():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, np.asarray(dropped, dtype=np.int64), allow_pickle=False)
    except OSError:
        pass


def refuse_repeated_ids(spec: str, index_path) -> None:
    """The rule of check_ids for shards: ids are unique. Their index keeps the first sample of a repeated id
    and counts the others (its vltool.json, stats.skipped), which a stream would train on too."""
    repeated = ((read_provenance(index_path) or {}).get("stats") or {}).get("skipped", {}).get(DUPLICATE_ID, 0)
    if repeated:
        raise UsageError(f"{spec!r} has duplicate ids ({repeated:,} samples repeat the id, json 'id' or key, of an earlier "
                         "one); ids must be unique")
