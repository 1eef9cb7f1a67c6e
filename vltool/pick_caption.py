"""`vltool pick-caption`: one caption per image, chosen from a list column.

Datasets with several captions per image (COCO's five, emoji's name and keywords) are trained on one fixed
caption in CLIP and on all of them in CLIPS (Santurkar et al., section 2). This command writes the one-caption
version: `caption` becomes an entry of `--from` (default `captions`), chosen per row by --strategy; the
previous caption is kept in `caption_original`. The random choice depends only on --seed and the row's id,
so it does not change when rows are filtered or reordered.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass

import datasets
import numpy as np
import pyarrow as pa

from vltool import columns as C
from vltool import provenance
from vltool.checks import text_column
from vltool.derived import ColumnSpill, replace_text_column, spill_beside
from vltool.errors import UsageError
from vltool.io.atomic import save_dataset
from vltool.io.digests import arrow_column
from vltool.io.loading import load_dataset
from vltool.io.locks import output_scope
from vltool.io.outputs import check_output

STRATEGIES = ("random", "first", "last", "longest", "shortest")


@dataclass
class PickConfig:
    """Options of `vltool pick-caption`, one field per option of the same name (`--from` for source_column;
    help: `vltool pick-caption --help`)."""

    source_column: str = "captions"
    strategy: str = "random"  # ties: the earlier entry
    exclude_caption: bool = False
    seed: int = 0


def row_rng(seed: int, row_id: str) -> random.Random:
    digest = hashlib.blake2b(f"{seed}\x00{row_id}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def pick(candidates: list[str], strategy: str, rng: random.Random) -> str:
    if strategy == "random":
        return rng.choice(candidates)
    if strategy == "first":
        return candidates[0]
    if strategy == "last":
        return candidates[-1]
    if strategy == "longest":
        return max(candidates, key=lambda t: len(t.split()))  # max keeps the first of equal lengths
    return min(candidates, key=lambda t: len(t.split()))


CHUNK = 50_000  # rows whose captions are Python strings at a time


def pick_caption(data: str, out, config: PickConfig, *, where=(), split_name=None, overwrite: bool = False) -> dict:
    """Load `data`, pick one caption per row, write it atomically to `out` with its `vltool.json`.

    CHUNK rows at a time from the Arrow columns (memory does not grow with the rows): the picked captions go
    to a spill file beside `out` and the output is built on the input's table (vltool.derived), so the
    images are never copied into memory."""
    if config.strategy not in STRATEGIES:
        raise UsageError(f"--strategy {config.strategy!r}: choose one of {', '.join(STRATEGIES)}")
    timer = provenance.Timer()
    src = load_dataset(data, split=split_name, where=where, required=[C.ID, config.source_column])
    text_column(src.dataset, config.source_column, data, option="--from", list_only=True)
    with output_scope():  # out's lock until the end, so no write cleans the spill
        out = check_output(out, overwrite, inputs=[*src.reads])
        with spill_beside(out) as spill:
            ds, stats = pick_dataset(src.dataset, config, spill)
            if len(ds) == 0:
                raise UsageError(f"no row of {data!r} has a caption in {config.source_column!r} to pick"
                                 + (" other than its 'caption' (--exclude-caption)" if config.exclude_caption else ""))
            prov = provenance.make("pick-caption", config, [src], rows_in=src.rows, rows_out=len(ds), stats=stats, timer=timer)
            save_dataset(ds, out, prov, overwrite=overwrite)
    return prov


def pick_dataset(ds, config: PickConfig, spill=None):
    """(the dataset with `caption` picked from config.source_column, rows without a candidate dropped; stats).
    The previous `caption` is kept as `caption_original` (unless that exists already)."""
    n = len(ds)
    ids_col, lists_col = arrow_column(ds, C.ID), arrow_column(ds, config.source_column)
    current_col = arrow_column(ds, C.CAPTION) if C.CAPTION in ds.column_names else None
    picked_cols = ColumnSpill(spill and spill / "caption.arrow", pa.schema([(C.CAPTION, pa.string())]))
    keep = np.zeros(n, dtype=bool)  # (n,) rows with a candidate
    dropped, n_dropped, changed, words = [], 0, 0, 0
    for a in range(0, n, CHUNK):
        ids = ids_col.slice(a, CHUNK).to_pylist()
        lists = lists_col.slice(a, CHUNK).to_pylist()
        current = current_col.slice(a, CHUNK).to_pylist() if current_col is not None else [None] * len(ids)
        picked = []
        for k, (rid, texts, cap) in enumerate(zip(ids, lists, current)):
            cands = [t for t in (texts or []) if isinstance(t, str) and t.strip()]
            if config.exclude_caption and cap is not None:
                cands = [t for t in cands if t != cap]
            if not cands:
                picked.append(None)
                n_dropped += 1
                if len(dropped) < 100:
                    dropped.append(rid)
                continue
            p = pick(cands, config.strategy, row_rng(config.seed, rid))
            picked.append(p)
            keep[a + k] = True
            changed += p != cap
            words += len(p.split())
        picked_cols.add([pa.array(picked, type=pa.string())])
    rows_out = int(keep.sum())
    out = replace_text_column(
        ds, C.CAPTION, C.CAPTION_ORIGINAL, picked_cols.table(), {C.CAPTION: datasets.Value("string")}, keep,
        fingerprint=_fingerprint(ds._fingerprint, config), spill=spill, chunk=CHUNK,
    )
    stats = {
        "rows_in": n, "rows_out": rows_out, "dropped_no_candidate": n_dropped, "dropped_ids": dropped,
        "caption_changed": changed,
        "avg_caption_words": round(words / rows_out, 3) if rows_out else None,
    }
    return out, stats


def _fingerprint(parent: str, config: PickConfig) -> str:
    payload = f"pick-caption\x00{parent}\x00{sorted(asdict(config).items())}"
    return hashlib.blake2b(payload.encode(), digest_size=16).hexdigest()
