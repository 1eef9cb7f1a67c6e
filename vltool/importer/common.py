"""What every source format of `vltool import` shares: the options (`ImportConfig`), the skip reasons, the
plan the workers receive, one output row built from an image and its captions (`prepare_image` decodes and
resizes), the chunk files a first pass writes, the choice of a table's columns, and the work folder."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from vltool import columns as C
from vltool.errors import UsageError
from vltool.io import image_size_policy
from vltool.shards import EMPTY_CAPTION, clean_captions, text_value

# What --format accepts (here beside ImportConfig, which checks it); vltool.importer.core holds the table of
# formats: the module that reads each.
FORMATS = ("auto", "csv", "tsv", "jsonl", "parquet", "webdataset", "imagefolder", "coco", "clip_benchmark")
TABLE_FORMATS = ("csv", "tsv", "jsonl", "parquet")

# Column names tried, in order, when --image-column / --caption-column / --id-column are not given.
IMAGE_COLUMN_CANDIDATES = ("filepath", "image", "image_path", "img_path", "path", "file", "filename", "file_name", "img", "jpg", "png")
CAPTION_COLUMN_CANDIDATES = ("title", "caption", "text", "txt", "captions", "sentence")
ID_COLUMN_CANDIDATES = ("id", "key")

REPORT_FILE = "skipped.jsonl"
CHUNK_ROWS = 4096  # table rows per unit of work

# Why a row was skipped (the `reason` field of skipped.jsonl).
# (NO_IMAGE, EMPTY_CAPTION, DUPLICATE_ID, BAD_SHARD: vltool.shards', which the shard index counts alike)
MISSING_FILE = "missing file"
UNDECODABLE = "undecodable image"
TOO_LARGE = "image over the size limit"  # PIL's MAX_IMAGE_PIXELS (DecompressionBomb): vltool.io.image_size_policy
MISSING_LABEL = "missing label"
LABEL_BEYOND_CLASSES = "label beyond the class names"  # clip_benchmark: a class index classnames.txt does not name (refused)
BAD_ROW = "unreadable row"


@dataclass
class ImportConfig:
    """Options of `vltool import`, one field per option of the same name (`--extra-column`, repeatable, for
    extra_columns; help: `vltool import --help`)."""

    format: str = "auto"  # one of FORMATS
    image_column: str | None = None
    caption_column: str | None = None
    label_column: str | None = None
    id_column: str | None = None
    image_root: Path | None = None
    extra_columns: list[str] = field(default_factory=list)
    max_side: int | None = None
    caption_template: str = "{label}"
    num_proc: int = 1
    classnames: Path | None = None  # image folders: the class names, one a line, in the folders' sorted order

    def validate(self) -> None:
        problems = []
        if self.format not in FORMATS:
            problems.append(f"--format {self.format!r}: choose one of {', '.join(FORMATS)}")
        if self.max_side is not None and self.max_side < 1:
            problems.append(f"--max-side must be >= 1, got {self.max_side}")
        if self.num_proc < 1:
            problems.append(f"--num-proc must be >= 1, got {self.num_proc}")
        if "{label}" not in self.caption_template:
            problems.append(f"--caption-template {self.caption_template!r} must contain {{label}}, e.g. 'a photo of a {{label}}'")
        reserved = {C.ID, C.IMAGE, C.CAPTION, C.CAPTIONS, C.LABEL}
        clash = [c for c in self.extra_columns if c in reserved]
        if clash:
            problems.append(f"--extra-column {', '.join(clash)}: these names are the dataset contract's own columns")
        if len(set(self.extra_columns)) != len(self.extra_columns):
            problems.append("--extra-column: a column is given twice")
        if problems:
            raise UsageError("; ".join(problems))


def _listdir(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if not p.name.startswith("."))


def _sort_labels(names: set[str]) -> list[str]:
    if names and all(re.fullmatch(r"-?\d+", n) for n in names):
        return sorted(names, key=int)
    return sorted(names)


# --------------------------------------------------------------------------------------------------
# Images


def prepare_image(data: bytes, max_side: int | None) -> bytes:
    """Decode `data` fully (a truncated or corrupt file raises); resize if its longer side exceeds `max_side`.

    An image that needs no resizing is kept byte for byte. A resized image is re-encoded: JPEG sources as
    JPEG (quality 95), every other format as PNG (lossless, alpha kept).
    """
    image_size_policy()  # an image over the size limit raises: skipped and counted as undecodable
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        if not max_side or max(w, h) <= max_side:
            im.load()
            return data
        scale = max_side / max(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        fmt = im.format
        if fmt == "JPEG":
            im.draft(im.mode, size)  # decode at a reduced scale (>= size): much faster for large JPEGs
        im.load()
        small = im.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
    buf = io.BytesIO()
    if fmt == "JPEG":
        if small.mode not in ("RGB", "L", "CMYK"):
            small = small.convert("RGB")
        small.save(buf, format="JPEG", quality=95)
    else:
        if small.mode not in ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"):
            small = small.convert("RGBA")
        small.save(buf, format="PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------
# The plan: what the workers need to know, picklable


@dataclass
class _Plan:
    kind: str  # rows (pre-resolved chunk files), parquet (image bytes in a column), webdataset
    skip_dir: str
    max_side: int | None
    multi: bool  # write `captions`
    label_names: list[str] | None
    extras: list[str]
    image_column: str | None = None  # parquet: the bytes column; webdataset: the image extension
    caption_column: str | None = None  # parquet: the caption column; webdataset: extension or .json key
    id_column: str | None = None  # parquet
    label_column: str | None = None  # parquet
    label_index: dict = field(default_factory=dict)
    label_folders: list[str] | None = None  # image folders: the folder of each class of label_names


class _Skips:
    """Skip records of one unit of work, appended to its own file (workers run in other processes)."""

    def __init__(self, plan: _Plan, unit_index: int):
        self.path = Path(plan.skip_dir) / f"{unit_index:08d}.jsonl"
        self.f = None

    def add(self, source: str, key: str | None, reason: str, detail: str = "") -> None:
        if self.f is None:
            self.f = open(self.path, "a", encoding="utf-8")
        self.f.write(json.dumps({"source": source, "id": key, "reason": reason, "detail": detail[:300]}, ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def _as_text(v: Any) -> str | None:
    """An --extra-column value as a string (lists and objects as JSON)."""
    if v is None or isinstance(v, str):
        return v
    return json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else str(v)


_text = text_value  # a caption cell as text: bytes decoded as UTF-8 (never written as b'...')
_clean_captions = clean_captions


def _row(
    plan: _Plan, skips: _Skips, source: str, key: str, captions: list[str], image: bytes | None, image_error: tuple | None,
    label: Any, extras: dict, caption: str | None = None,
) -> dict | None:
    """One output row, or None after recording why it was skipped. `caption` defaults to `captions[0]`."""
    if image_error is not None:
        skips.add(source, key, *image_error)
        return None
    caption = caption or (captions[0] if captions else None)
    if not caption:
        skips.add(source, key, EMPTY_CAPTION)
        return None
    row: dict = {C.ID: key}
    if plan.label_names is not None:
        if label is None or str(label).strip() == "":
            skips.add(source, key, MISSING_LABEL)
            return None
        row[C.LABEL] = plan.label_index[str(label)]
    try:
        data = prepare_image(image, plan.max_side)
    except Exception as e:  # PIL raises many kinds (OSError, SyntaxError, DecompressionBombError, ...)
        if type(e).__name__ in ("DecompressionBombWarning", "DecompressionBombError"):
            skips.add(source, key, TOO_LARGE, " ".join(str(e).split(", could be")[0].split()))
            return None
        detail = "not a format PIL can read" if type(e).__name__ == "UnidentifiedImageError" else f"{type(e).__name__}: {e}"
        skips.add(source, key, UNDECODABLE, detail)
        return None
    row[C.IMAGE] = {"bytes": data, "path": None}
    row[C.CAPTION] = caption
    if plan.multi:
        row[C.CAPTIONS] = captions or [caption]
    for name in plan.extras:
        row[name] = _as_text(extras.get(name))
    return row


def _read_file(path: str) -> tuple[bytes | None, tuple | None]:
    if re.match(r"^[a-z][a-z0-9+.-]*://", path):
        return None, (MISSING_FILE, f"{path}: URLs are not downloaded (img2dataset fetches them)")
    try:
        with open(path, "rb") as f:
            return f.read(), None
    except OSError as e:
        return None, (MISSING_FILE, f"{path}: {e.strerror or e}")


def _gen_rows(unit: tuple, plan: _Plan, skips: _Skips) -> Iterator[dict]:
    """A chunk file written by the first pass: key, where, image (path), captions, label, extras."""
    for rec in pq.read_table(unit[1]).to_pylist():
        key, where = rec["key"], rec["where"]
        if rec["image"] is None or rec["image"] == "":
            data, err = None, (MISSING_FILE, "the image path is empty")
        else:
            data, err = _read_file(rec["image"])
        row = _row(plan, skips, where, key, _clean_captions(rec["captions"]), data, err, rec["label"], rec)
        if row is not None:
            yield row


# --------------------------------------------------------------------------------------------------
# First pass over table-like sources: a stream of plain records, cut into chunk files


class _ChunkWriter:
    """Writes records (key, where, image path, captions, label, extras) into parquet chunks of CHUNK_ROWS."""

    def __init__(self, work: Path, extras: Sequence[str]):
        self.dir = work / "chunks"
        self.dir.mkdir()
        self.extras = list(extras)
        self.buf: list[dict] = []
        self.units: list[tuple] = []
        self.multi = False
        self.labels: set[str] = set()
        self.rows = 0
        self.image_dirs: set[str] = set()  # folders holding the image files read: inputs, never replaced

    def add(self, key: str, where: str, image: str | None, captions: Any, label: Any = None, extras: dict | None = None) -> None:
        if isinstance(captions, (list, tuple)):
            self.multi = True
            caps = [_text(c) for c in captions]
        else:
            caps = None if captions is None else [_text(captions)]
        if image:
            self.image_dirs.add(os.path.dirname(image) or ".")
        lab = None if label is None or str(label).strip() == "" else str(label)
        if lab is not None:
            self.labels.add(lab)
        rec = {"key": key, "where": where, "image": image, "captions": caps, "label": lab}
        for name in self.extras:
            rec[name] = _as_text((extras or {}).get(name))
        self.buf.append(rec)
        self.rows += 1
        if len(self.buf) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.buf:
            return
        schema = pa.schema(
            [("key", pa.string()), ("where", pa.string()), ("image", pa.string()), ("captions", pa.list_(pa.string())),
             ("label", pa.string())] + [(n, pa.string()) for n in self.extras]
        )
        path = self.dir / f"{len(self.units):08d}.parquet"
        pq.write_table(pa.Table.from_pylist(self.buf, schema=schema), path)
        self.units.append((len(self.units), str(path)))
        self.buf = []


def _check_out_spares_images(out: Path, image_dirs: set[str]) -> None:
    """The image files an import reads are inputs: --out may not be, nor contain, a folder holding them
    (replacing it would delete them, and the files the table never listed), --overwrite or not."""
    target = out.expanduser().resolve()
    for d in sorted(image_dirs):
        folder = Path(d).expanduser().resolve()
        if folder == target or target in folder.parents:
            raise UsageError(
                f"--out {out} would replace {folder}, which holds the images this import reads; "
                "inputs are never modified: choose another --out"
            )


def _pick(columns: Sequence[str], given: str | None, candidates: Sequence[str], what: str, option: str, source: str) -> str:
    if given is not None:
        if given not in columns:
            raise UsageError(f"{source} has no column {given!r} for {option} (it has: {', '.join(columns)})")
        return given
    for c in candidates:
        if c in columns:
            return c
    raise UsageError(
        f"{source}: found no {what} column (tried {', '.join(candidates)}; it has: {', '.join(columns)}); name it with {option}"
    )


def _resolve_path(value: Any, root: Path) -> str | None:
    if value is None:
        return None
    s = str(value).strip()
    if not s or re.match(r"^[a-z][a-z0-9+.-]*://", s):
        return s or None
    p = Path(os.path.expanduser(s))
    return str(p if p.is_absolute() else root / p)


@dataclass
class _TableColumns:
    image: str
    caption: str
    id: str | None
    label: str | None


def _table_columns(columns: Sequence[str], config: ImportConfig, source: str) -> _TableColumns:
    problems = []
    picked: dict = {}
    for name, given, cands, what, opt in (
        ("image", config.image_column, IMAGE_COLUMN_CANDIDATES, "image", "--image-column"),
        ("caption", config.caption_column, CAPTION_COLUMN_CANDIDATES, "caption", "--caption-column"),
    ):
        try:
            picked[name] = _pick(columns, given, cands, what, opt, source)
        except UsageError as e:
            problems.append(str(e))
    for name, given, opt in (("label", config.label_column, "--label-column"), ("id", config.id_column, "--id-column")):
        if given is not None and given not in columns:
            problems.append(f"{source} has no column {given!r} for {opt} (it has: {', '.join(columns)})")
    missing_extra = [c for c in config.extra_columns if c not in columns]
    if missing_extra:
        problems.append(f"{source} has no column {', '.join(map(repr, missing_extra))} for --extra-column (it has: {', '.join(columns)})")
    if problems:
        raise UsageError("; ".join(problems))
    id_col = config.id_column or next((c for c in ID_COLUMN_CANDIDATES if c in columns), None)
    return _TableColumns(picked["image"], picked["caption"], id_col, config.label_column)


# --------------------------------------------------------------------------------------------------
# The work folder


@contextmanager
def _progress_bars_restored() -> Iterator[None]:
    """datasets' progress bars switched off again on the way out when they were off on the way in."""
    bars_were_on = datasets.is_progress_bar_enabled()
    try:
        yield
    finally:
        if not bars_were_on:
            datasets.disable_progress_bars()


@contextmanager
def _work_dir(out: Path, *, parents: bool) -> Iterator[Path]:
    """`.OUT.work-*` beside `out` (chunks, skip records, datasets' cache), removed on the way out.
    parents: create the work folder's parents (else `out`'s parent is created first)."""
    work = out.parent / f".{out.name}.work-{uuid.uuid4().hex[:8]}"
    if parents:
        work.mkdir(parents=True)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        work.mkdir()
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
