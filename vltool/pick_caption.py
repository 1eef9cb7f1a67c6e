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
from dataclasses import dataclass

from vltool.errors import UsageError

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


def pick_caption(data: str, out, config: PickConfig, *, where=(), split_name=None, overwrite: bool = False) -> dict:
    import datasets

    from vltool import columns as C
    from vltool import provenance
    from vltool.io import check_output, load_dataset, save_dataset

    if config.strategy not in STRATEGIES:
        raise UsageError(f"--strategy {config.strategy!r}: choose one of {', '.join(STRATEGIES)}")
    timer = provenance.Timer()
    src = load_dataset(data, split=split_name, where=where, required=[C.ID, config.source_column])
    out = check_output(out, overwrite, inputs=[*src.reads])
    ds = src.dataset
    from vltool.checks import text_column

    text_column(ds, config.source_column, data, option="--from", list_only=True)
    current = ds[C.CAPTION] if C.CAPTION in ds.column_names else [None] * len(ds)
    picked, keep, dropped = [], [], []
    for i, (rid, texts, cap) in enumerate(zip(ds[C.ID], ds[config.source_column], current)):
        cands = [t for t in (texts or []) if isinstance(t, str) and t.strip()]
        if config.exclude_caption and cap is not None:
            cands = [t for t in cands if t != cap]
        if not cands:
            dropped.append(rid)
            continue
        keep.append(i)
        picked.append(pick(cands, config.strategy, row_rng(config.seed, rid)))
    ds = ds.select(keep)
    if C.CAPTION in ds.column_names:
        if C.CAPTION_ORIGINAL not in ds.column_names:
            ds = ds.rename_column(C.CAPTION, C.CAPTION_ORIGINAL)
        else:
            ds = ds.remove_columns([C.CAPTION])
    ds = ds.add_column(C.CAPTION, picked, feature=datasets.Value("string"))
    changed = sum(p != c for p, c in zip(picked, [current[i] for i in keep]))
    stats = {
        "rows_in": src.rows, "rows_out": len(ds), "dropped_no_candidate": len(dropped), "dropped_ids": dropped[:100],
        "caption_changed": changed,
        "avg_caption_words": round(sum(len(p.split()) for p in picked) / len(picked), 3) if picked else None,
    }
    prov = provenance.make("pick-caption", config, [src], rows_in=src.rows, rows_out=len(ds), stats=stats, timer=timer)
    save_dataset(ds, out, prov, overwrite=overwrite)
    return prov
