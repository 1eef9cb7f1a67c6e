"""Tiny models and datasets for the evaluation tests (zeroshot, retrieve, probe, the cache)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30), "purple": (150, 40, 180), "grey": (128, 128, 128)}


def make_model(out: Path, seed: int = 0) -> Path:
    """A randomly initialised vltool-micro model (32x32 images, 32-d embeddings) saved as a vltool model dir."""
    import torch

    from vltool.model import ModelSpec, create_model, save_model

    torch.manual_seed(seed)
    model, tok = create_model(ModelSpec(arch="vltool-micro"))
    save_model(model, tok, Path(out) / "model")
    return Path(out)


def _png(rgb, rng, size=16) -> bytes:
    from PIL import Image

    arr = np.clip(np.array(rgb)[None, None, :] + rng.normal(scale=12, size=(size, size, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def make_colors(path: Path, per_class: int = 6, seed: int = 0, multilabel: bool = False, bad_rows: tuple = ()) -> str:
    """Solid-colour squares with noise: label = colour (ClassLabel), caption 'a <colour> square <i>',
    captions [caption, '<colour> thing <i>'], split train (first two thirds of each colour) / test."""
    import datasets

    rng = np.random.default_rng(seed)
    names = list(COLORS)
    rows = {"id": [], "image": [], "caption": [], "captions": [], "label": [], "split": []}
    if multilabel:
        rows["labels"] = []
    i = 0
    for c, name in enumerate(names):
        for j in range(per_class):
            rows["id"].append(f"r{i:03d}")
            png = b"not a png" if i in bad_rows else _png(COLORS[name], rng)
            rows["image"].append({"bytes": png, "path": None})
            rows["caption"].append(f"a {name} square {i}")
            rows["captions"].append([f"a {name} square {i}", f"{name} thing {i}"])
            rows["label"].append(c)
            rows["split"].append("train" if j < per_class * 2 // 3 else "test")
            if multilabel:
                rows["labels"].append(sorted({c, (c + 1) % len(names)} if j % 2 else {c}))
            i += 1
    feats = {
        "id": datasets.Value("string"),
        "image": datasets.Image(),
        "caption": datasets.Value("string"),
        "captions": datasets.List(datasets.Value("string")),
        "label": datasets.ClassLabel(names=names),
        "split": datasets.Value("string"),
    }
    if multilabel:
        feats["labels"] = datasets.List(datasets.ClassLabel(names=names))
    ds = datasets.Dataset.from_dict(rows, features=datasets.Features(feats))
    ds.save_to_disk(str(path))
    return str(path)
