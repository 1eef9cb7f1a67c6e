"""The embedding cache every encoding command shares (docs/conventions.md, "The embedding cache").

    <cache-dir>/embeddings/<key>.npy    the embeddings, float32 (rows, dim), in the order of the rows
    <cache-dir>/embeddings/<key>.json   what the key is made of, and what the array must look like

The key is the SHA-256 of a canonical JSON of five parts: the model's weight fingerprint, the dataset
fingerprint (of the dataset on disk, before --where), the row filter (--split and the --where clauses,
sorted: their order does not change the rows), the column encoded, and the preprocessing (image size and
normalisation or the image processor's config; or the tokenizer's settings and the digest of its files;
plus which features, e.g. before the projection). Any change of any part
is a different key, so a stale entry is never read; an entry is never modified, only written whole.

Writes go through a temporary file and a rename, the `.npy` first and the `.json` last: an entry is
complete when its `.json` exists. A reader checks the array against the `.json` (shape, dtype, the
digest of the row ids, and which rows are NaN: `nan_rows`, the rows of undecodable images) and treats
any mismatch or unreadable file as a miss; an array holding NaN or inf anywhere else is a damaged entry,
encoded again with a warning naming it, never read as data. Deleting the whole directory, or any entry,
is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vltool import __version__
from vltool.io.digests import values_digest
from vltool.io.index import default_cache_dir

SUBDIR = "embeddings"
KEY_VERSION = 2  # bump when what an entry holds changes meaning (2: the tokenizer's files are in the key)


def canonical(obj: Any) -> str:
    """A canonical JSON text: sorted keys, no whitespace, tuples as lists."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


def ids_digest(ids: Sequence[str]) -> str:
    """SHA-256 of the row ids in order: what rows an array holds, and in which order."""
    return values_digest(ids)


def texts_digest(texts: Sequence[str]) -> str:
    return ids_digest(texts)


def row_filter(split: str | None, where: Sequence[str]) -> dict:
    """The row filter part of a key: --split and the --where clauses, order-free."""
    return {"split": split, "where": sorted(str(w) for w in where)}


def nan_rows(arr: np.ndarray) -> list[int]:
    """The rows of `arr` that are NaN on purpose (every value NaN: an undecodable image), in order; a row
    with some values NaN or any inf is not one of them: [-1] (a damaged array matches no description)."""
    if arr.size == 0 or np.isfinite(arr).all():
        return []
    flat = arr.reshape(arr.shape[0], -1)
    finite = np.isfinite(flat)
    rows = ~finite.all(axis=1)
    if not np.isnan(flat[rows]).all():
        return [-1]
    return np.flatnonzero(rows).tolist()


@dataclass(frozen=True)
class CacheKey:
    """The five parts of a key; `digest` is the file name."""

    model: str  # the model's weight fingerprint
    dataset: str  # dataset fingerprint (or the digest of a list of texts)
    rows: dict  # row filter: {"split", "where"}
    column: str  # the column encoded ("image", "caption", "captions", or "<prompts>")
    preprocessing: dict  # image transform or tokenizer, and which features

    def parts(self) -> dict:
        return {
            "key_version": KEY_VERSION,
            "model": self.model,
            "dataset": self.dataset,
            "rows": self.rows,
            "column": self.column,
            "preprocessing": self.preprocessing,
        }

    @property
    def digest(self) -> str:
        return hashlib.sha256(canonical(self.parts()).encode()).hexdigest()


class EmbeddingCache:
    """`<cache_dir>/embeddings/`. `cache_dir=None` means `$VLTOOL_CACHE`, else `~/.cache/vltool`."""

    def __init__(self, cache_dir: str | Path | None = None):
        self.root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.dir = self.root / SUBDIR

    def paths(self, key: CacheKey) -> tuple[Path, Path]:
        d = key.digest
        return self.dir / f"{d}.npy", self.dir / f"{d}.json"

    def get(self, key: CacheKey, *, rows: int | None = None, ids: str | None = None) -> np.ndarray | None:
        """The cached array, or None (missing, incomplete, or not matching `rows` / the ids digest)."""
        npy, meta_path = self.paths(key)
        if not meta_path.is_file() or not npy.is_file():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            arr = np.load(npy, allow_pickle=False)
        except (OSError, ValueError, json.JSONDecodeError):
            return None
        if list(arr.shape) != meta.get("shape") or str(arr.dtype) != meta.get("dtype"):
            return None
        if meta.get("key") != key.parts():
            return None  # a hash collision or a hand-edited file: never trust it
        if rows is not None and arr.shape[0] != rows:
            return None
        if ids is not None and meta.get("ids_sha256") not in (None, ids):
            return None
        if nan_rows(arr) != (meta.get("nan_rows") or []):
            print(f"warning: the cached embeddings {npy} hold NaN or inf where no input was bad (a damaged cache "
                  "entry); encoding again", file=sys.stderr)
            return None
        return arr

    def put(self, key: CacheKey, arr: np.ndarray, *, ids: str | None = None, extra: dict | None = None) -> Path | None:
        """Write an entry atomically (the array, then the description that completes it). A cache that
        cannot be written (read-only, full, not a directory) is skipped with one warning: the command
        runs on without it. Returns the entry's path, or None when it was not written."""
        try:
            return self._put(key, arr, ids=ids, extra=extra)
        except OSError as e:
            cant_write(self.root, e)
            return None

    def _put(self, key: CacheKey, arr: np.ndarray, *, ids: str | None = None, extra: dict | None = None) -> Path:
        arr = np.ascontiguousarray(arr)
        npy, meta_path = self.paths(key)
        self.dir.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:8]
        tmp_npy = self.dir / f".{npy.stem}.tmp-{tag}.npy"
        tmp_meta = self.dir / f".{meta_path.stem}.tmp-{tag}.json"
        meta = {
            "key": key.parts(),
            "digest": key.digest,
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
            "ids_sha256": ids,
            "nan_rows": nan_rows(arr),  # the rows left NaN on purpose (undecodable images)
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "vltool_version": __version__,
            **(extra or {}),
        }
        try:
            with open(tmp_npy, "wb") as f:
                np.save(f, arr, allow_pickle=False)
            os.replace(tmp_npy, npy)
            tmp_meta.write_text(json.dumps(meta, indent=2, default=str, ensure_ascii=False) + "\n")
            os.replace(tmp_meta, meta_path)
        finally:
            tmp_npy.unlink(missing_ok=True)
            tmp_meta.unlink(missing_ok=True)
        return npy


_WARNED: set = set()


def cant_write(root: Path, e: OSError) -> None:
    """The one warning for a cache directory that cannot be written (printed once per directory)."""
    if str(root) in _WARNED:
        return
    _WARNED.add(str(root))
    print(f"warning: the cache {root} cannot be written ({e.strerror or e}); running without caching", file=sys.stderr)
