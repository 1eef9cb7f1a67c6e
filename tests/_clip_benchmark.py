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


class _Pairs(list):
    """(PIL image, label) pairs with the attributes CLIP_benchmark's converter reads (classes, templates)."""

    def __init__(self, pairs, classes, templates):
        super().__init__(pairs)
        self.classes, self.templates = classes, templates


def make_cb_classification(root: Path, per_class=(4, 2), shards: int = 2, seed: int = 0, colors=None) -> Path:
    """Colour squares, label = colour: train/ (per_class[0] per colour) and test/ (per_class[1]), `shards`
    shards each, written by CLIP_benchmark's own converter (clip_benchmark.webdataset_builder.convert_dataset,
    as `clip_benchmark_export_wds` runs it; PNG images): KEY.png + KEY.cls, keys s0000000... numbered anew in
    every split, classnames.txt, zeroshot_classification_templates.txt, SPLIT/nshards.txt."""
    import contextlib

    from PIL import Image
    from clip_benchmark.webdataset_builder import PIL_to_bytes, convert_dataset

    root = Path(root)
    rng = np.random.default_rng(seed)
    names = list(colors or COLORS)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "test"), per_class):
        samples = [(Image.open(io.BytesIO(_png(COLORS[name], rng))).convert("RGB"), c) for c, name in enumerate(names) for _ in range(n)]
        order = rng.permutation(len(samples))
        pairs = _Pairs([samples[j] for j in order], names, list(TEMPLATES))
        with contextlib.redirect_stdout(io.StringIO()):
            convert_dataset(pairs, split, str(root), transform=PIL_to_bytes("png"), image_format="png",
                            max_count=-(-len(pairs) // shards), verbose=False)
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
