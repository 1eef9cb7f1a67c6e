"""`--format coco`: a COCO caption annotation file (`captions_train2017.json`) and its image directory (found
near the file, or `--image-root`); all of an image's captions go into `captions`, the first into `caption`."""

from __future__ import annotations

import json
from pathlib import Path

from vltool.errors import UsageError
from vltool.importer.common import ImportConfig, _ChunkWriter, _resolve_path


def _guess_coco_root(ann: Path, first_file: str | None) -> Path | None:
    split = ann.stem.split("_")[-1]  # captions_train2017 -> train2017
    d = ann.resolve().parent
    for cand in (d.parent / split, d / split, d / "images" / split, d.parent / "images" / split, d / "images", d.parent / "images", d, d.parent):
        if cand.is_dir() and (first_file is None or (cand / first_file).is_file()):
            return cand
    return None


def _scan_coco(ann: Path, config: ImportConfig, writer: _ChunkWriter) -> dict:
    try:
        with open(ann, encoding="utf-8") as f:
            coco = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"{ann} is not a readable JSON file: {e}") from e
    if not isinstance(coco, dict) or not isinstance(coco.get("images"), list) or not isinstance(coco.get("annotations"), list):
        raise UsageError(f"{ann} is not a COCO annotation file (it needs 'images' and 'annotations' lists)")
    images = coco["images"]
    first = next((im.get("file_name") for im in images if isinstance(im, dict) and im.get("file_name")), None)
    if config.image_root:
        root = Path(config.image_root).expanduser()
        if not root.is_dir():
            raise UsageError(f"--image-root {root} is not a directory")
    else:
        root = _guess_coco_root(ann, first)
        if root is None:
            raise UsageError(f"{ann}: cannot find the image directory (looked for {first!r} near it); give --image-root")
    caps: dict = {}
    n_caps = 0
    for a in coco["annotations"]:
        if isinstance(a, dict) and "image_id" in a:
            caps.setdefault(a["image_id"], []).append(a.get("caption"))
            n_caps += 1
    missing_extra = [c for c in config.extra_columns if images and c not in images[0]]
    if missing_extra:
        raise UsageError(f"{ann}: the image records have no {', '.join(map(repr, missing_extra))} for --extra-column")
    del coco
    for i, im in enumerate(images):
        image_id = im.get("id")
        key = str(image_id) if image_id is not None else str(i)
        writer.add(key, f"{ann.name} image {key}", _resolve_path(im.get("file_name"), root), caps.get(image_id, []), None, im)
    writer.multi = True
    writer.flush()
    return {"image_root": str(root), "annotations": n_caps}
