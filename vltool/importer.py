"""`vltool import`: image-text data from the formats of open_clip's ecosystem into the dataset contract.

Sources (docs/import-export-info.md):
- `csv` / `tsv` / `jsonl` / `parquet` tables with an image-path column and a caption column (open_clip's
  CSV convention `filepath` / `title` is found by default; a `.csv` whose header holds a tab is read as
  tab-separated, as open_clip writes it). Relative paths are resolved against `--image-root`, by default
  the table's directory.
- `imagefolder`: one sub-folder per class; the folder names are the classes (`label`).
- `webdataset`: tar shards (`KEY.jpg` + `KEY.txt` + `KEY.json`, as img2dataset writes them) and `parquet`
  shards with the image bytes in a column (img2dataset's `jpg`, or a `datasets` image struct).
- `coco`: a caption annotation file (`captions_train2017.json`) and its image directory; all of an image's
  captions go into `captions`, the first into `caption`.
- `clip_benchmark`: CLIP_benchmark's WebDataset layout of its datasets (`DIR/{train,test}/N.tar` with
  `nshards.txt`, `classnames.txt`, `zeroshot_classification_templates.txt`, `dataset_type.txt`): a
  DatasetDict with one split per folder, and the class names and templates files copied beside it, which
  `vltool zeroshot` uses (`import_clip_benchmark`).

How it scales: the source is cut into units (a shard, a row group, or a chunk of a few thousand table
rows written by one streaming pass over the table), `datasets.Dataset.from_generator` turns the units
into Arrow in bounded memory, `num_proc` workers each take a contiguous run of units (the output order is
the source order whatever `num_proc`), and the result is saved atomically. A bad row (missing file,
undecodable image, empty caption, duplicate id) is skipped, counted, and listed in `skipped.jsonl`
inside the output directory; a bad shard ends that shard only.
"""

from __future__ import annotations

import codecs
import csv
import glob
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

from vltool import columns as C
from vltool import provenance
from vltool.cache import EmbeddingCache
from vltool.console import progress_enabled
from vltool.errors import UsageError, VltoolError
from vltool.io import OutputBusy, atomic_output, check_output, duplicate_rows, image_size_policy, write_json_atomic
from vltool.shards import (  # noqa: F401 (re-exported)
    BAD_SHARD, DUPLICATE_ID, EMPTY_CAPTION, IMAGE_EXTS, NO_IMAGE, TAR_SUFFIXES, clean_captions, expand_braces, iter_samples,
    iter_tar, split_member, text_value,
)
from vltool.templates import DATASET_TEMPLATES, parse_templates
from vltool.topology import is_main, process_state, warn

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


# --------------------------------------------------------------------------------------------------
# Finding the source files


def expand_sources(specs: Sequence[str]) -> list[Path]:
    """Every path named by the SOURCE arguments: braces expanded, then globs; each must exist."""
    paths: list[Path] = []
    for spec in specs:
        for pat in expand_braces(os.path.expanduser(spec)):
            if any(ch in pat for ch in "*?["):
                found = sorted(glob.glob(pat))
                if not found:
                    raise UsageError(f"SOURCE {spec!r}: the pattern {pat!r} matches no file")
                paths.extend(Path(p) for p in found)
            else:
                p = Path(pat)
                if not p.exists():
                    raise UsageError(f"SOURCE {spec!r}: {pat} does not exist")
                paths.append(p)
    seen: set = set()
    unique = []
    for p in paths:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def _is_tar(p: Path) -> bool:
    return p.name.lower().endswith(TAR_SUFFIXES)


def _file_format(p: Path) -> str | None:
    name = p.name.lower()
    if name.endswith(TAR_SUFFIXES):
        return "webdataset"
    ext = name.rsplit(".", 1)[-1] if "." in name else ""
    return {"csv": "csv", "tsv": "tsv", "jsonl": "jsonl", "ndjson": "jsonl", "parquet": "parquet", "json": "coco"}.get(ext)


def _listdir(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if not p.name.startswith("."))


def detect_format(paths: Sequence[Path], fmt: str) -> tuple[str, list[Path]]:
    """(format, files): the format (given or detected) and the files to read (a directory's shards listed)."""
    if len(paths) == 1 and paths[0].is_dir():
        d = paths[0]
        entries = _listdir(d)
        tars = [p for p in entries if p.is_file() and _is_tar(p)]
        parquets = [p for p in entries if p.is_file() and p.suffix.lower() == ".parquet"]
        subdirs = [p for p in entries if p.is_dir()]
        if fmt == "auto" and is_clip_benchmark(d):
            fmt = "clip_benchmark"
        if fmt == "clip_benchmark":
            if not clip_benchmark_splits(d):
                raise UsageError(f"SOURCE {d}: not CLIP_benchmark's layout (no split folder with {CB_NSHARDS} or .tar shards)")
            return fmt, [d]
        if fmt == "auto":
            # img2dataset's webdataset output holds NNNNN.tar and NNNNN.parquet (metadata only): the tars win.
            fmt = "webdataset" if tars else "parquet" if parquets else "imagefolder" if subdirs else ""
            if not fmt:
                raise UsageError(
                    f"SOURCE {d}: found no .tar or .parquet shards and no class sub-folders; "
                    "give the table or annotation file itself, or --format"
                )
        if fmt == "webdataset":
            if not tars:
                raise UsageError(f"SOURCE {d}: no .tar shards in this directory")
            return fmt, tars
        if fmt == "parquet":
            if not parquets:
                raise UsageError(f"SOURCE {d}: no .parquet files in this directory")
            return fmt, parquets
        if fmt == "imagefolder":
            if not subdirs:
                raise UsageError(f"SOURCE {d}: an image folder needs one sub-folder per class; found none")
            return fmt, [d]
        raise UsageError(f"SOURCE {d} is a directory; --format {fmt} needs a file")
    if any(p.is_dir() for p in paths):
        raise UsageError("SOURCE: give one directory, or files (several files must all have the same format)")
    if fmt == "imagefolder":
        raise UsageError("--format imagefolder needs one directory with a sub-folder per class")
    if fmt == "auto":
        kinds = {_file_format(p) for p in paths}
        if None in kinds:
            bad = next(p for p in paths if _file_format(p) is None)
            raise UsageError(
                f"SOURCE {bad}: cannot tell the format from the extension; "
                f"give --format ({', '.join(FORMATS[1:])})"
            )
        if len(kinds) > 1:
            raise UsageError(f"SOURCE: the files have different formats ({', '.join(sorted(kinds))}); import them separately")
        fmt = kinds.pop()
    if fmt == "coco" and len(paths) != 1:
        raise UsageError("--format coco reads one annotation file (e.g. captions_train2017.json)")
    return fmt, list(paths)


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


def _image_bytes(value: Any, base: Path) -> tuple[bytes | None, tuple | None]:
    """A parquet image cell: raw bytes, or a datasets image struct {bytes, path}."""
    if isinstance(value, dict):
        if value.get("bytes"):
            return value["bytes"], None
        if value.get("path"):
            p = Path(value["path"])
            return _read_file(str(p if p.is_absolute() else base / p))
        return None, (NO_IMAGE, "the image cell is empty")
    if value is None or value == b"":
        return None, (NO_IMAGE, "the image cell is empty")
    if isinstance(value, str):
        p = Path(value)
        return _read_file(str(p if p.is_absolute() else base / p))
    return bytes(value), None


def _gen_parquet(unit: tuple, plan: _Plan, skips: _Skips) -> Iterator[dict]:
    """One row group of a parquet file with image bytes in a column (img2dataset's parquet output)."""
    _, path, row_group, first_row, stem = unit
    pf = pq.ParquetFile(path)
    names = set(pf.schema_arrow.names)
    cols = [c for c in {plan.image_column, plan.caption_column, plan.id_column, plan.label_column, *plan.extras} if c and c in names]
    base = Path(path).parent
    r = first_row
    for batch in pf.iter_batches(batch_size=256, row_groups=[row_group], columns=cols):
        for rec in batch.to_pylist():
            key = rec.get(plan.id_column) if plan.id_column else None
            key = str(key) if key not in (None, "") else f"{stem}-{r}"
            where = f"{Path(path).name} row {r}"
            r += 1
            data, err = _image_bytes(rec.get(plan.image_column), base)
            caps = _clean_captions(rec.get(plan.caption_column))
            row = _row(plan, skips, where, key, caps, data, err, rec.get(plan.label_column) if plan.label_column else None, rec)
            if row is not None:
                yield row


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


_GENERATORS = {"rows": _gen_rows, "parquet": _gen_parquet, "webdataset": _gen_webdataset}


def _generate(units: list, plan: _Plan) -> Iterator[dict]:
    """`from_generator`'s generator: each worker gets a contiguous run of `units`."""
    for unit in units:
        skips = _Skips(plan, unit[0])
        try:
            yield from _GENERATORS[plan.kind](unit, plan, skips)
        finally:
            skips.close()


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


def _sort_labels(names: set[str]) -> list[str]:
    if names and all(re.fullmatch(r"-?\d+", n) for n in names):
        return sorted(names, key=int)
    return sorted(names)


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


def _table_encoding(path: Path) -> str:
    """The text encoding of a CSV / TSV by its byte-order mark: UTF-16 (what spreadsheets write as "Unicode
    text"), else UTF-8 with or without a BOM."""
    with open(path, "rb") as f:
        head = f.read(4)
    return "utf-16" if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig"


def _csv_separator(path: Path, fmt: str) -> str:
    if fmt == "tsv":
        return "\t"
    with open(path, encoding=_table_encoding(path), errors="replace", newline="") as f:
        header = f.readline()
    return "\t" if "\t" in header else ","


def _csv_header(header: list[str], path: Path) -> list[str]:
    """The column names of a CSV / TSV header (spaces around them stripped); a name given twice is refused
    (a dict of the row would keep one of the two columns, and the caption could come from the wrong one)."""
    header = [h.strip() for h in header]
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:
        where = "; ".join(f"{h!r} in columns {', '.join(str(i + 1) for i, x in enumerate(header) if x == h)}" for h in twice)
        raise UsageError(f"{path}: the header names a column twice ({where}); give each column its own name")
    return header


def _csv_records(reader, header: list[str], path: Path, fmt: str) -> Iterator[tuple[int, dict]]:
    """(row number, {column: value}) of each data row of a CSV / TSV read by `reader` (after its header).
    A quoted field may hold line breaks and separators. A row with fewer or more fields than the header (a
    field missing, a separator not quoted) and a quote that is never closed (csv would read the rest of the
    file as one field) are refused, naming the row and its line: such a table cannot be read row by row."""
    line = reader.line_num
    r = -1
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise UsageError(f"{path}: the {fmt.upper()} row {r + 1} from line {line + 1} cannot be read ({e}): a quote is not "
                             'closed, or text follows a closing quote; quote the whole field and double the quotes in it ("")') from None
        first, line = line + 1, reader.line_num
        if not values:
            continue
        r += 1
        if len(values) != len(header):
            lines = f"line {first}" if line == first else f"lines {first}-{line}"
            raise UsageError(f"{path}: row {r} ({lines}) has {len(values)} fields where the header has {len(header)}; every row "
                             "needs one field per column: quote a field that holds the separator, fill in a missing one")
        yield r, dict(zip(header, values))


def _scan_tables(files: Sequence[Path], fmt: str, config: ImportConfig, writer: _ChunkWriter, skips: _Skips) -> dict:
    """Stream every table once, writing the rows into chunks; return which columns were used."""
    csv.field_size_limit(1 << 30)
    used: dict = {}
    several = len(files) > 1
    for path in files:
        root = Path(config.image_root).expanduser() if config.image_root else path.resolve().parent
        prefix = f"{path.stem}-" if several else ""

        def add(r: int, rec: dict, cols: _TableColumns) -> None:
            key = rec.get(cols.id) if cols.id else None
            key = str(key).strip() if key is not None and str(key).strip() else f"{prefix}{r}"
            writer.add(
                key, f"{path.name} row {r}", _resolve_path(rec.get(cols.image), root), rec.get(cols.caption),
                rec.get(cols.label) if cols.label else None, rec,
            )

        if fmt in ("csv", "tsv"):
            sep = _csv_separator(path, fmt)
            with open(path, encoding=_table_encoding(path), errors="replace", newline="") as f:
                reader = csv.reader(f, delimiter=sep, strict=True)
                try:
                    header = next(reader, None)
                except csv.Error as e:
                    raise UsageError(f"{path}: its header line cannot be read ({e})") from None
                if not header:
                    raise UsageError(f"{path} is empty (no header line)")
                header = _csv_header(header, path)
                cols = _table_columns(header, config, str(path))
                for r, rec in _csv_records(reader, header, path, fmt):
                    add(r, rec, cols)
        elif fmt == "jsonl":
            cols = None
            with open(path, encoding="utf-8-sig", errors="replace") as f:
                r = -1
                for line in f:
                    if not line.strip():
                        continue
                    r += 1
                    try:
                        rec = json.loads(line)
                        if not isinstance(rec, dict):
                            raise ValueError("not a JSON object")
                    except ValueError as e:
                        skips.add(f"{path.name} row {r}", None, BAD_ROW, str(e))
                        continue
                    if cols is None:
                        cols = _table_columns(list(rec), config, str(path))
                    add(r, rec, cols)
            if cols is None:
                raise UsageError(f"{path} holds no JSON rows")
        else:  # parquet with image paths
            pf = pq.ParquetFile(path)
            cols = _table_columns(pf.schema_arrow.names, config, str(path))
            names = [c for c in {cols.image, cols.caption, cols.id, cols.label, *config.extra_columns} if c]
            r = 0
            for batch in pf.iter_batches(batch_size=4096, columns=names):
                for rec in batch.to_pylist():
                    add(r, rec, cols)
                    r += 1
        used = {"image_column": cols.image, "caption_column": cols.caption, "id_column": cols.id, "label_column": cols.label}
    writer.flush()
    return used


def imagefolder_class_names(folders: list[str], classnames: Path | None) -> list[str]:
    """The class name of each folder: its name with underscores as spaces ("animal_bird" -> "animal bird", the
    words zero-shot prompts read), or line i of --classnames for the i-th folder in sorted order."""
    if classnames is None:
        names = [re.sub(r"\s+", " ", f.replace("_", " ")).strip() or f for f in folders]
        what = "the folder names with underscores as spaces"
    else:
        try:
            names = [line.strip() for line in Path(classnames).expanduser().read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as e:
            raise UsageError(f"--classnames {classnames}: cannot read it ({e.strerror or e})") from None
        if len(names) != len(folders):
            raise UsageError(f"--classnames {classnames}: {len(names)} names for {len(folders)} class folders; "
                             "give one name a line, in the order of the sorted folder names")
        what = f"--classnames {classnames}"
    seen: dict[str, str] = {}
    for f, n in zip(folders, names):
        if n in seen:
            raise UsageError(f"class folders {seen[n]!r} and {f!r} both become the class name {n!r} ({what}); "
                             "give distinct names with --classnames FILE")
        seen[n] = f
    return names


def _scan_imagefolder(root: Path, config: ImportConfig, writer: _ChunkWriter) -> dict:
    classes = [p.name for p in _listdir(root) if p.is_dir()]
    names = imagefolder_class_names(classes, config.classnames)
    ignored = 0
    for cls, name in zip(classes, names):
        label = name if config.classnames is not None else re.sub(r"[_-]+", " ", cls).strip()
        caption = config.caption_template.format(label=label)
        for dirpath, dirnames, filenames in os.walk(root / cls, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fn in sorted(filenames):
                if fn.startswith(".") or fn.rsplit(".", 1)[-1].lower() not in IMAGE_EXTS or "." not in fn:
                    ignored += 1
                    continue
                p = Path(dirpath) / fn
                rel = p.relative_to(root).as_posix()
                writer.add(rel.rsplit(".", 1)[0], rel, str(p), caption, cls)
    writer.flush()
    return {"classes": classes, "names": names, "ignored_files": ignored}


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


# --------------------------------------------------------------------------------------------------
# Shard sources: units without a first pass


def _plan_parquet_shards(files: Sequence[Path], config: ImportConfig) -> tuple[list[tuple], dict, set]:
    """Units (file, row group) for parquet files whose image column holds bytes; the columns used; labels."""
    units: list[tuple] = []
    labels: set = set()
    used: dict = {}
    several = len(files) > 1
    for path in files:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        cols = _table_columns(names, config, str(path))
        if cols.id is None and "key" in names:
            cols.id = "key"
        first = 0
        for g in range(pf.num_row_groups):
            units.append((len(units), str(path), g, first, path.stem if several else path.stem))
            first += pf.metadata.row_group(g).num_rows
        if cols.label:
            col = pq.read_table(path, columns=[cols.label]).column(0)
            col = pc.cast(col, pa.string()) if not pa.types.is_string(col.type) else col
            labels |= {v for v in pc.unique(col).to_pylist() if v is not None and v.strip()}
        used = {"image_column": cols.image, "caption_column": cols.caption, "id_column": cols.id, "label_column": cols.label}
    return units, used, labels


@contextmanager
def _reading(fmt: str, files) -> Iterator[None]:
    """Arrow's errors reading a source (a CSV given as --format parquet, a damaged file) as one line."""
    try:
        yield
    except pa.ArrowException as e:
        shown = ", ".join(str(f) for f in list(files)[:3]) + (", ..." if len(files) > 3 else "")
        raise VltoolError(f"cannot read {shown} as {fmt}: {' '.join(str(e).split())}") from None


def _parquet_has_image_bytes(path: Path, config: ImportConfig) -> bool:
    schema = pq.ParquetFile(path).schema_arrow
    col = _pick(schema.names, config.image_column, IMAGE_COLUMN_CANDIDATES, "image", "--image-column", str(path))
    t = schema.field(col).type
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_struct(t)


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


# --------------------------------------------------------------------------------------------------
# The command


def _merge_skips(skip_dir: Path) -> list[dict]:
    records = []
    for p in sorted(skip_dir.glob("*.jsonl")):
        with open(p, encoding="utf-8") as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def _drop_duplicate_ids(ds, records: list[dict]):
    """Keep the first row of each id; the others become skip records (vltool.io.duplicate_rows)."""
    drop = duplicate_rows(ds.data.column(C.ID))
    if not drop:
        return ds
    ids = ds.data.column(C.ID)
    for row in drop:
        records.append({"source": None, "id": ids[row].as_py(), "reason": DUPLICATE_ID, "detail": f"row {row} of the import repeats an earlier id"})
    keep = np.ones(len(ds), dtype=bool)
    keep[drop] = False
    return ds.select(np.flatnonzero(keep))


def _features(plan: _Plan):
    feats = {C.ID: datasets.Value("string"), C.IMAGE: datasets.Image(), C.CAPTION: datasets.Value("string")}
    if plan.multi:
        feats[C.CAPTIONS] = datasets.List(datasets.Value("string"))
    if plan.label_names is not None:
        feats[C.LABEL] = datasets.ClassLabel(names=plan.label_names)
    for name in plan.extras:
        feats[name] = datasets.Value("string")
    return datasets.Features(feats)


@dataclass
class _Sources:
    """What the SOURCE arguments name: the specs as given, the paths they expand to, the format and the files to read."""

    specs: list[str]
    paths: list[Path]
    fmt: str
    files: list[Path]


@dataclass
class _Imported:
    """The rows the workers built, with the skip records of every row left out."""

    ds: Any  # datasets.Dataset, None when no row was read
    records: list[dict]
    reasons: Counter
    rows_in: int
    rows_out: int


def import_data(sources: Sequence[str] | str, out, config: ImportConfig, *, overwrite: bool = False) -> dict:
    """Read `sources` into a dataset at `out` (with `vltool.json` and `skipped.jsonl`); return the provenance record."""
    timer = provenance.Timer()
    config.validate()
    src = resolve_sources(sources, config)
    if src.fmt == "clip_benchmark":
        return import_clip_benchmark(src.files[0], out, config, overwrite=overwrite, spec=src.specs[0])
    refuse_options_for_format(src.fmt, config)
    out = check_output(out, overwrite, inputs=[p.resolve() for p in src.paths] + ([Path(config.image_root)] if config.image_root else []))
    with _progress_bars_restored(), _work_dir(out, parents=False) as work:
        plan, units, stats = plan_import(src, config, work, out)
        imported = collect_skips(generate_rows(units, plan, work, config), Path(plan.skip_dir), src.specs)
        return write_import(imported, src, plan, stats, config, out, overwrite, timer)


def resolve_sources(sources: Sequence[str] | str, config: ImportConfig) -> _Sources:
    """The SOURCE arguments expanded (braces, globs) and their format given or detected."""
    specs = [sources] if isinstance(sources, (str, Path)) else list(sources)
    specs = [str(s) for s in specs]
    if not specs:
        raise UsageError("give at least one SOURCE")
    paths = expand_sources(specs)
    fmt, files = detect_format(paths, config.format)
    return _Sources(specs, paths, fmt, files)


def refuse_options_for_format(fmt: str, config: ImportConfig) -> None:
    """Options the format has no use for are refused, not ignored."""
    if fmt in ("imagefolder", "coco"):
        given = [o for o, v in (("--image-column", config.image_column), ("--caption-column", config.caption_column),
                                ("--label-column", config.label_column), ("--id-column", config.id_column)) if v]
        if given:
            raise UsageError(f"{', '.join(given)} apply to table and shard sources, not to --format {fmt}")
    if fmt != "imagefolder" and config.caption_template != "{label}":
        raise UsageError("--caption-template applies to image folders only")
    if fmt != "imagefolder" and config.classnames is not None:
        raise UsageError("--classnames applies to image folders only (a CLIP_benchmark folder brings its classnames.txt)")
    if fmt == "webdataset" and (config.label_column or config.id_column):
        raise UsageError("--label-column and --id-column apply to tables; WebDataset ids are the sample keys")


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


def plan_import(src: _Sources, config: ImportConfig, work: Path, out: Path) -> tuple[_Plan, list[tuple], dict]:
    """(plan, units, stats): what the workers need to know, the units of work they share, and what the planning
    found. Shards are units as they are; tables, image folders and COCO files are read once into chunk files first."""
    fmt, files = src.fmt, src.files
    stats: dict = {"format": fmt, "files": len(files)}
    skip_dir = work / "skips"
    skip_dir.mkdir()
    plan = _Plan(kind="rows", skip_dir=str(skip_dir), max_side=config.max_side, multi=False, label_names=None,
                 extras=list(config.extra_columns))
    with _reading(fmt, files):  # a file that is not what --format says: one line, not a traceback
        if fmt == "webdataset":
            units = _plan_webdataset(files, config, plan)
        elif fmt == "parquet" and _parquet_has_image_bytes(files[0], config):
            units = _plan_parquet(files, config, plan, stats)
        else:
            units = _first_pass(fmt, files, config, plan, stats, work, out)
    if plan.label_names is not None:
        plan.label_index = {n: i for i, n in enumerate(plan.label_names)}
        if plan.label_folders is not None:  # the rows carry their folder's name
            plan.label_index = {f: i for i, f in enumerate(plan.label_folders)}
        stats["classes"] = len(plan.label_names)
    return plan, units, stats


def _plan_webdataset(files: Sequence[Path], config: ImportConfig, plan: _Plan) -> list[tuple]:
    """One unit per tar shard."""
    plan.kind = "webdataset"
    plan.image_column, plan.caption_column = config.image_column, config.caption_column
    plan.multi = _peek_webdataset_captions(files[0])
    return [(i, str(p)) for i, p in enumerate(files)]


def _plan_parquet(files: Sequence[Path], config: ImportConfig, plan: _Plan, stats: dict) -> list[tuple]:
    """One unit per row group of parquet files holding the image bytes."""
    units, used, labels = _plan_parquet_shards(files, config)
    plan.kind = "parquet"
    plan.image_column, plan.caption_column = used["image_column"], used["caption_column"]
    plan.id_column, plan.label_column = used["id_column"], used["label_column"]
    if used["label_column"]:
        plan.label_names = _sort_labels(labels)
    cap_type = pq.ParquetFile(files[0]).schema_arrow.field(used["caption_column"]).type
    plan.multi = pa.types.is_list(cap_type) or pa.types.is_large_list(cap_type)
    stats.update(used)
    return units


def _first_pass(fmt: str, files: Sequence[Path], config: ImportConfig, plan: _Plan, stats: dict, work: Path, out: Path) -> list[tuple]:
    """Tables, an image folder or a COCO file read once into chunk files (image paths, not bytes): one unit per chunk."""
    writer = _ChunkWriter(work, config.extra_columns)
    scan_skips = _Skips(plan, 99_999_999)  # rows the first pass could not read, listed after the others
    try:
        if fmt in TABLE_FORMATS:
            stats.update(_scan_tables(files, fmt, config, writer, scan_skips))
        elif fmt == "imagefolder":
            found = _scan_imagefolder(files[0], config, writer)
            stats.update(classes=len(found["classes"]), ignored_files=found["ignored_files"])
            writer.labels = set(found["classes"])
            plan.label_folders = found["classes"]
            plan.label_names = found["names"]
            stats["class_names"] = dict(zip(found["classes"], found["names"]))  # folder -> class name, recorded
        elif fmt == "coco":
            stats.update(_scan_coco(files[0], config, writer))
    finally:
        scan_skips.close()
    plan.multi = writer.multi
    _check_out_spares_images(out, writer.image_dirs)
    if plan.label_names is None and (config.label_column is not None):
        plan.label_names = _sort_labels(writer.labels)
    return writer.units


def generate_rows(units: list[tuple], plan: _Plan, work: Path, config: ImportConfig):
    """The rows of every unit as a dataset in bounded memory (`num_proc` workers, each a contiguous run of
    units); None when there is no unit or every row was skipped."""
    if not units:
        return None
    num_proc = min(config.num_proc, len(units))
    # the "Generating train split" bar is the import's progress (--no-progress: none)
    datasets.enable_progress_bars() if progress_enabled() else datasets.disable_progress_bars()
    try:
        return datasets.Dataset.from_generator(
            _generate,
            features=_features(plan),
            cache_dir=str(work / "cache"),
            gen_kwargs={"units": units, "plan": plan},
            num_proc=num_proc if num_proc > 1 else None,
            fingerprint=uuid.uuid4().hex,  # never reuse a cache: the source files may have changed
        )
    except ValueError as e:  # every row skipped: datasets refuses to build an empty split
        if "corresponds to no data" not in str(e):
            raise
        return None
    finally:
        datasets.disable_progress_bars()


def collect_skips(ds, skip_dir: Path, specs: Sequence[str]) -> _Imported:
    """The workers' skip records merged, repeated ids dropped (and recorded); no row imported is an error."""
    records = _merge_skips(skip_dir)
    if ds is not None:
        ds = _drop_duplicate_ids(ds, records)
    rows_out = len(ds) if ds is not None else 0
    reasons = Counter(r["reason"] for r in records)
    rows_in = rows_out + sum(n for r, n in reasons.items() if r != BAD_SHARD)
    if rows_out == 0:
        first = "; ".join(f"{r.get('source')}: {r['reason']} {r.get('detail', '')}".strip() for r in records[:3])
        raise VltoolError(
            f"no row could be imported from {', '.join(specs)} ({rows_in} read, all skipped: "
            f"{dict(reasons) or 'the source is empty'}){'; e.g. ' + first if first else ''}"
        )
    return _Imported(ds, records, reasons, rows_in, rows_out)


def write_import(imported: _Imported, src: _Sources, plan: _Plan, stats: dict, config: ImportConfig, out: Path, overwrite: bool,
                 timer) -> dict:
    """The dataset, `skipped.jsonl` and `vltool.json` written atomically to `out`; the provenance record."""
    records, reasons, rows_in, rows_out = imported.records, imported.reasons, imported.rows_in, imported.rows_out
    stats.update(
        rows_read=rows_in,
        rows_out=rows_out,
        rows_skipped=rows_in - rows_out,
        skipped=dict(sorted(reasons.items())),
        report=REPORT_FILE if records else None,
        captions_column=plan.multi,
        max_side=config.max_side,
    )
    inputs = [{"spec": s, "path": os.path.abspath(os.path.expanduser(s)), "format": src.fmt} for s in src.specs]
    inputs[0]["files"] = len(src.files)
    prov = provenance.make("import", config, inputs, rows_in=rows_in, rows_out=rows_out, stats=stats, timer=timer)
    with atomic_output(out, overwrite) as tmp:
        imported.ds.save_to_disk(str(tmp), num_proc=config.num_proc if config.num_proc > 1 and rows_out >= 10_000 else None)
        if records:
            with open(tmp / REPORT_FILE, "w", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
        prov["wall_time_s"] = round(timer.seconds, 3)
        write_json_atomic(tmp / C.PROVENANCE_FILE, prov)
    imported.ds = None
    return prov


# --------------------------------------------------------------------------------------------------
# CLIP_benchmark's WebDataset layout

CB_NSHARDS = "nshards.txt"
CB_CLASSNAMES = "classnames.txt"
CB_TEMPLATES = DATASET_TEMPLATES  # the name the output carries too (vltool zeroshot --templates auto reads it)
CB_TYPE = "dataset_type.txt"
CB_TYPES = ("classification", "multilabel", "retrieval")
CB_IMAGE_EXTS = ("webp", "png", "jpg", "jpeg", "0.webp")  # CLIP_benchmark's order


def clip_benchmark_splits(d: Path) -> dict[str, list[Path]]:
    """{split: its shards in order}: `{0..n-1}.tar` by nshards.txt, else every .tar of the folder by number."""
    out = {}
    for sub in _listdir(d):
        if not sub.is_dir():
            continue
        tars = [p for p in sub.iterdir() if p.is_file() and p.name.endswith(".tar")]
        nfile = sub / CB_NSHARDS
        if nfile.is_file():
            try:
                n = int(nfile.read_text().strip())
            except ValueError:
                raise UsageError(f"{nfile}: expected the number of shards, got {nfile.read_text()[:40]!r}") from None
            shards = [sub / f"{i}.tar" for i in range(n)]
            missing = [p.name for p in shards if not p.is_file()]
            if missing:
                raise UsageError(f"{sub}: {CB_NSHARDS} says {n} shards; missing {', '.join(missing[:3])}")
            out[sub.name] = shards
        elif tars:
            out[sub.name] = sorted(tars, key=lambda p: (len(p.stem), p.stem))
    return out


def is_clip_benchmark(d: Path) -> bool:
    """CLIP_benchmark's layout: split folders holding nshards.txt, or its metadata files (classnames.txt,
    ...) beside a split folder of .tar shards. (An image folder with a classnames.txt is not one.)"""
    subs = [sub for sub in _listdir(d) if sub.is_dir()]
    if any((sub / CB_NSHARDS).is_file() for sub in subs):
        return True
    return any((d / f).is_file() for f in (CB_CLASSNAMES, CB_TEMPLATES, CB_TYPE)) and any(
        any(p.name.endswith(".tar") and p.is_file() for p in sub.iterdir()) for sub in subs)


def _cb_rows(shards: Sequence[Path], kind: str, n_classes: int | None, skipped: Counter) -> Iterator[dict]:
    """Rows of one split: a sample is KEY.<image> with KEY.cls (classification), KEY.npy (multilabel: a 0/1
    vector over the classes) or KEY.txt (retrieval: one caption per line)."""
    for shard in shards:
        key, files = None, {}

        def row():
            image = next((files[e] for e in CB_IMAGE_EXTS if e in files), None)
            if image is None:
                skipped[NO_IMAGE] += 1
                return None
            out = {C.ID: key, C.IMAGE: {"bytes": image, "path": None}}
            if kind == "retrieval":
                caps = _clean_captions(files.get("txt", b"").decode("utf-8", errors="replace").splitlines())
                if not caps:
                    skipped[EMPTY_CAPTION] += 1
                    return None
                out[C.CAPTIONS], out[C.CAPTION] = caps, caps[0]
            elif kind == "multilabel":
                if "npy" not in files:
                    skipped[MISSING_LABEL] += 1
                    return None
                vec = np.load(io.BytesIO(files["npy"]), allow_pickle=False).reshape(-1)
                out[C.LABELS] = [int(i) for i in np.flatnonzero(vec)]
            else:
                try:
                    label = int(files["cls"].decode().strip())
                except (KeyError, ValueError, UnicodeDecodeError):
                    skipped[MISSING_LABEL] += 1
                    return None
                if not 0 <= label < n_classes:
                    skipped[LABEL_BEYOND_CLASSES] += 1
                    return None
                out[C.LABEL] = label
            return out

        try:
            for key, files in iter_samples(str(shard)):
                if (r := row()) is not None:
                    yield r
        except (tarfile.TarError, OSError, EOFError) as e:
            raise VltoolError(f"{shard}: unreadable shard ({type(e).__name__}: {e})") from None


@dataclass
class _CBLayout:
    """A CLIP_benchmark layout as read from its folder: the dataset type, each split's shards, the class names."""

    root: Path
    kind: str  # one of CB_TYPES
    splits: dict[str, list[Path]]
    classnames: list[str] | None  # None: retrieval


def import_clip_benchmark(root: Path, out, config: ImportConfig, *, overwrite: bool = False, spec: str | None = None) -> dict:
    """CLIP_benchmark's layout at `root` -> a DatasetDict at `out` (id, image, and label | labels | captions +
    caption), with classnames.txt and zeroshot_classification_templates.txt copied beside it."""
    timer = provenance.Timer()
    layout = read_clip_benchmark_layout(Path(root), config)
    out = check_output(out, overwrite, inputs=[layout.root.resolve()])
    with _progress_bars_restored(), _work_dir(out, parents=True) as work:
        datasets.enable_progress_bars() if progress_enabled() else datasets.disable_progress_bars()
        parts, skipped = read_clip_benchmark_splits(layout, work)
        return write_clip_benchmark(datasets.DatasetDict(parts), skipped, layout, config, out, overwrite, spec, timer)


def read_clip_benchmark_layout(root: Path, config: ImportConfig) -> _CBLayout:
    """The layout's dataset type, splits and class names; options the layout fixes, an unknown type, a missing or
    repeated class name and a bad templates file refused before anything is read."""
    given = [o for o, v in (("--image-column", config.image_column), ("--caption-column", config.caption_column),
                            ("--label-column", config.label_column), ("--id-column", config.id_column),
                            ("--extra-column", config.extra_columns), ("--max-side", config.max_side)) if v]
    if given:
        raise UsageError(f"{', '.join(given)} do not apply to --format clip_benchmark (its layout fixes the columns)")
    kind = (root / CB_TYPE).read_text().strip().lower() if (root / CB_TYPE).is_file() else "classification"
    if kind not in CB_TYPES:
        raise UsageError(f"{root / CB_TYPE}: {kind!r} is not one of {', '.join(CB_TYPES)}")
    splits = clip_benchmark_splits(root)
    classnames = None
    if kind != "retrieval":
        if not (root / CB_CLASSNAMES).is_file():
            raise UsageError(f"SOURCE {root}: a {kind} dataset needs {CB_CLASSNAMES} (one class name per line)")
        classnames = [line.strip() for line in (root / CB_CLASSNAMES).read_text().splitlines() if line.strip()]
        if len(set(classnames)) != len(classnames):
            raise UsageError(f"{root / CB_CLASSNAMES}: repeated class names")
    if (root / CB_TEMPLATES).is_file():
        parse_templates((root / CB_TEMPLATES).read_text().splitlines(), str(root / CB_TEMPLATES))  # refuse a bad file now
    return _CBLayout(root, kind, splits, classnames)


def _cb_features(layout: _CBLayout):
    feats = {C.ID: datasets.Value("string"), C.IMAGE: datasets.Image()}
    if layout.kind == "classification":
        feats[C.LABEL] = datasets.ClassLabel(names=layout.classnames)
    elif layout.kind == "multilabel":
        feats[C.LABELS] = datasets.List(datasets.ClassLabel(names=layout.classnames))
    else:
        feats[C.CAPTIONS] = datasets.List(datasets.Value("string"))
        feats[C.CAPTION] = datasets.Value("string")
    return datasets.Features(feats)


def read_clip_benchmark_splits(layout: _CBLayout, work: Path) -> tuple[dict, dict[str, Counter]]:
    """({split: dataset}, {split: skipped samples by reason}); a split with no sample, a class index the class
    names do not name, or repeated sample keys refused."""
    root, classnames = layout.root, layout.classnames
    features = _cb_features(layout)
    skipped: dict[str, Counter] = {}
    parts = {}
    for name, shards in layout.splits.items():
        skipped[name] = Counter()
        try:  # streamed into Arrow in bounded memory (a split of 50,000 images is several GB)
            ds = datasets.Dataset.from_generator(
                _cb_rows, features=features, cache_dir=str(work / "cache"), fingerprint=uuid.uuid4().hex,
                gen_kwargs={"shards": shards, "kind": layout.kind, "n_classes": len(classnames) if classnames else None,
                            "skipped": skipped[name]})
        except ValueError as e:  # every sample skipped: datasets refuses an empty split
            if "corresponds to no data" not in str(e):
                raise
            _refuse_unnamed_labels(root, name, skipped[name], len(classnames or ()))
            raise VltoolError(f"split {name!r} of {root}: no sample could be read ({dict(skipped[name]) or 'no samples'})") from None
        _refuse_unnamed_labels(root, name, skipped[name], len(classnames or ()))
        ids = ds[C.ID]
        if len(set(ids)) != len(ids):
            raise VltoolError(f"split {name!r} of {root}: sample keys repeat, so they cannot be the ids")
        parts[name] = ds
    return parts, skipped


def write_clip_benchmark(dd, skipped: dict[str, Counter], layout: _CBLayout, config: ImportConfig, out: Path, overwrite: bool,
                         spec: str | None, timer) -> dict:
    """The DatasetDict, the class names and templates files and `vltool.json` written atomically to `out`."""
    root, classnames = layout.root, layout.classnames
    rows_out = sum(len(v) for v in dd.values())
    rows_in = rows_out + sum(sum(v.values()) for v in skipped.values())
    stats = {
        "format": "clip_benchmark",
        "files": sum(len(v) for v in layout.splits.values()),
        "rows_read": rows_in,
        "rows_out": rows_out,
        "rows_skipped": rows_in - rows_out,
        "skipped": {f"{k}: {r}": n for k, v in skipped.items() for r, n in sorted(v.items())},
        "dataset_type": layout.kind,
        "splits": {k: len(v) for k, v in dd.items()},
        "classes": len(classnames) if classnames else None,
        "templates": CB_TEMPLATES if (root / CB_TEMPLATES).is_file() else None,
        "captions_column": layout.kind == "retrieval",
    }
    inputs = [{"spec": spec or str(root), "path": str(root.resolve()), "format": "clip_benchmark"}]
    prov = provenance.make("import", config, inputs, rows_in=rows_in, rows_out=rows_out, stats=stats, timer=timer)
    with atomic_output(out, overwrite) as tmp:
        dd.save_to_disk(str(tmp))
        for f in (CB_CLASSNAMES, CB_TEMPLATES):
            if (root / f).is_file():
                shutil.copyfile(root / f, tmp / f)
        prov["wall_time_s"] = round(timer.seconds, 3)
        write_json_atomic(tmp / C.PROVENANCE_FILE, prov)
    return prov


def _refuse_unnamed_labels(root: Path, split: str, skipped: Counter, n_classes: int) -> None:
    """A class index classnames.txt does not name: every number computed on the split would be on the
    samples left and against the wrong class list (a short classnames.txt dropped 24 of 36 samples)."""
    n = skipped.get(LABEL_BEYOND_CLASSES, 0)
    if n:
        raise UsageError(f"{root / CB_CLASSNAMES} names {n_classes} classes, but {n} sample(s) of split {split!r} have a "
                         f"class index beyond them (0 to {n_classes - 1}); give every class of the .cls files a name")


CB_CACHE = "clip_benchmark"  # <cache-dir>/clip_benchmark/<name>-<digest>: CLIP_benchmark layouts given directly


def _layout_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(root)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def clip_benchmark_input(spec: str, cache_dir: str | Path | None) -> str:
    """A dataset spec as `vltool.io.load_dataset` reads it: a CLIP_benchmark layout given directly is imported
    once into `<cache-dir>/clip_benchmark/<name>-<digest of its files' names, sizes and times>` and that
    copy is read; anything else is returned as is."""
    root = Path(str(spec)).expanduser()
    if not root.is_dir() or (root / "dataset_dict.json").is_file() or (root / "state.json").is_file() or not is_clip_benchmark(root):
        return str(spec)
    dest = EmbeddingCache(cache_dir).root / CB_CACHE / f"{root.resolve().name}-{_layout_digest(root)}"
    said = False
    while not (dest / "dataset_dict.json").is_file() and is_main():
        if not said:
            warn(f"{spec}: CLIP_benchmark's layout, imported into {dest} (once; later runs read that copy)")
            said = True
        try:
            import_clip_benchmark(root, dest, ImportConfig(format="clip_benchmark"), overwrite=True, spec=str(spec))
        except OutputBusy:  # another command is importing it: wait for its copy (or import it if that one fails)
            time.sleep(0.5)
    state = process_state()
    if state.num_processes > 1:
        state.wait_for_everyone()
    return str(dest)
