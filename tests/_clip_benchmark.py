"""Small datasets in CLIP_benchmark's WebDataset layout (DIR/{train,test}/N.tar, nshards.txt, classnames.txt,
zeroshot_classification_templates.txt, dataset_type.txt), written here with tarfile."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np

from tests._eval_helpers import COLORS, _png

TEMPLATES = ["a photo of a {c}.", "a {c} square."]


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def make_cb_classification(root: Path, per_class=(4, 2), shards: int = 2, seed: int = 0, colors=None) -> Path:
    """Colour squares, label = colour: train/ (per_class[0] per colour) and test/ (per_class[1]), `shards`
    shards each, as CLIP_benchmark's clip_benchmark_export_wds writes them (KEY.webp + KEY.cls)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    names = list(colors or COLORS)
    root.mkdir(parents=True, exist_ok=True)
    (root / "classnames.txt").write_text("\n".join(names) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("\n".join(TEMPLATES) + "\n")
    i = 0
    for split, n in zip(("train", "test"), per_class):
        samples = []
        for c, name in enumerate(names):
            for _ in range(n):
                samples.append([(f"s{i:07d}.png", _png(COLORS[name], rng)), (f"s{i:07d}.cls", str(c).encode())])
                i += 1
        order = rng.permutation(len(samples))
        (root / split).mkdir(exist_ok=True)
        for s in range(shards):
            _tar(root / split / f"{s}.tar", [m for j in order[s::shards] for m in samples[j]])
        (root / split / "nshards.txt").write_text(f"{shards}\n")
    return root


def make_cb_retrieval(root: Path, per_color: int = 2, seed: int = 0) -> Path:
    """Colour squares with two captions each (KEY.jpg-less: KEY.png + KEY.txt, one caption per line), test/ only."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    (root / "test").mkdir(parents=True, exist_ok=True)
    (root / "dataset_type.txt").write_text("retrieval\n")
    members, i = [], 0
    for name in COLORS:
        for _ in range(per_color):
            members += [(f"s{i:07d}.png", _png(COLORS[name], rng)), (f"s{i:07d}.txt", f"a {name} square\n{name} thing {i}\n".encode())]
            i += 1
    _tar(root / "test" / "0.tar", members)
    (root / "test" / "nshards.txt").write_text("1\n")
    return root
