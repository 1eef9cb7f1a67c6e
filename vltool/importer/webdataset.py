"""`--format webdataset`: tar shards (`KEY.jpg` + `KEY.txt` + `KEY.json`, as img2dataset writes them), one unit of
work per shard, read as a stream; a damaged shard ends that shard only."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Iterator, Sequence

from vltool import columns as C
from vltool.importer.common import ImportConfig, _clean_captions, _Plan, _row, _Skips
from vltool.shards import BAD_SHARD, IMAGE_EXTS, NO_IMAGE, iter_samples, iter_tar, split_member


def _peek_webdataset_captions(path: Path) -> bool:
    """Whether the first sample's .json carries a `captions` list (vltool's own export writes one)."""
    try:
        first = None
        for member, data in iter_tar(str(path)):
            parts = split_member(member)
            if parts is None:
                continue
            if first is None:
                first = parts[0]
            elif parts[0] != first:
                return False
            if parts[1] == "json":
                meta = json.loads(data.decode("utf-8"))
                return isinstance(meta, dict) and isinstance(meta.get(C.CAPTIONS), list)
    except (tarfile.TarError, OSError, EOFError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return False
    return False


def _plan_webdataset(files: Sequence[Path], config: ImportConfig, plan: _Plan) -> list[tuple]:
    """One unit per tar shard."""
    plan.kind = "webdataset"
    plan.image_column, plan.caption_column = config.image_column, config.caption_column
    plan.multi = _peek_webdataset_captions(files[0])
    return [(i, str(p)) for i, p in enumerate(files)]


def _wds_sample_row(plan: _Plan, skips: _Skips, source: str, key: str, files: dict) -> dict | None:
    meta: dict = {}
    if "json" in files:
        try:
            meta = json.loads(files["json"].decode("utf-8"))
            if not isinstance(meta, dict):
                meta = {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            meta = {}
    row_id = meta.get("id") if isinstance(meta.get("id"), str) and meta.get("id") else key
    if plan.image_column:
        image = files.get(plan.image_column)
    else:
        image = next((files[e] for e in IMAGE_EXTS if e in files), None)
    err = None if image else (NO_IMAGE, f"the sample has no image file ({', '.join(sorted(files)) or 'nothing'})")
    cap_key = plan.caption_column or "txt"
    if cap_key in files:
        caps = _clean_captions(files[cap_key].decode("utf-8", errors="replace"))
    else:
        caps = _clean_captions(meta.get(cap_key if plan.caption_column else "caption"))
    caption = caps[0] if caps else None
    if plan.multi and isinstance(meta.get(C.CAPTIONS), list):  # vltool's export: the captions list verbatim
        caps = _clean_captions(meta[C.CAPTIONS])
    return _row(plan, skips, source, row_id, caps, image, err, None, meta, caption=caption)


def _gen_webdataset(unit: tuple, plan: _Plan, skips: _Skips) -> Iterator[dict]:
    """One tar shard, read as a stream: consecutive members with the same key form a sample."""
    path = unit[1]
    name = Path(path).name
    key = None  # the last whole sample read: the damage lies after it
    try:
        for key, files in iter_samples(path):
            row = _wds_sample_row(plan, skips, name, key, files)
            if row is not None:
                yield row
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        skips.add(name, key, BAD_SHARD, f"the rest of the shard is lost: {type(e).__name__}: {e}")
