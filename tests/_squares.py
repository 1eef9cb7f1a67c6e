"""Coloured squares captioned with their colour: the images of the small training fixtures (a dataset on
disk in test_pretrain.make_pairs, WebDataset shards in wds_fixtures.make_shards)."""

from __future__ import annotations

import io

import numpy as np

WORDS = ["red", "green", "blue", "yellow", "cyan", "magenta", "white", "black"]
COLORS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255), (255, 255, 255), (0, 0, 0)]


def square(color, size: int = 24, seed: int = 0, fmt: str = "PNG") -> bytes:
    """A `size` x `size` square of `color` with seeded noise of +-30 per channel, encoded as `fmt`."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    a = np.clip(np.array(color)[None, None] + rng.integers(-30, 30, (size, size, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def png(color, size: int = 24, seed: int = 0) -> bytes:
    return square(color, size, seed, "PNG")


def jpg(color, size: int = 24, seed: int = 0) -> bytes:
    return square(color, size, seed, "JPEG")
