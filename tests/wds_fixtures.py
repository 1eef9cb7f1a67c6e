"""Small WebDataset shards in img2dataset's layout, for the streaming tests."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from _squares import COLORS, WORDS, jpg


def make_shards(root, shards: int = 4, per_shard: int = 12, stats: bool = True, bad=(), empty=()) -> str:
    """`shards` tar files root/00000.tar ... as img2dataset writes them (key.jpg, key.txt, key.json, and
    NNNNN_stats.json beside each with `successes`); sample k (counted over all shards) is a square of colour
    k % 8 captioned with its colour. Sample numbers in `bad` get bytes that are no image, in `empty` no text.
    Returns the brace pattern naming them."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    k = 0
    for s in range(shards):
        with tarfile.open(root / f"{s:05d}.tar", "w") as tar:
            for j in range(per_shard):
                key = f"{s:05d}{j:04d}"
                c = k % len(WORDS)
                caption = "" if k in empty else f"a {WORDS[c]} square"
                files = {"jpg": b"not an image" if k in bad else jpg(COLORS[c], seed=k), "txt": caption.encode(),
                         "json": json.dumps({"key": key, "caption": caption, "url": f"http://x/{k}.jpg", "status": "success"}).encode()}
                for ext, data in files.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                k += 1
        if stats:
            (root / f"{s:05d}_stats.json").write_text(json.dumps({"count": per_shard, "successes": per_shard, "failed_to_download": 0}))
    return str(root / f"{{00000..{shards - 1:05d}}}.tar")
