"""`vltool import`: image-text data from the formats of open_clip's ecosystem into the dataset contract. This module
holds the table of formats and the dispatch: finding the source files and their format, planning the units of
work, the workers' generator, and writing the output; each format's reading lives in its own module of
`vltool.importer` (csv_tsv, jsonl, parquet, webdataset, imagefolder, coco, clip_benchmark), what they share in
`vltool.importer.common`.

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

import glob
import json
import os
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import datasets
import numpy as np
import pyarrow as pa

from vltool import columns as C
from vltool import provenance
from vltool.console import progress_enabled
from vltool.errors import UsageError, VltoolError
from vltool.importer.clip_benchmark import CB_NSHARDS, clip_benchmark_splits, import_clip_benchmark, is_clip_benchmark
from vltool.importer.coco import _scan_coco
from vltool.importer.common import (
    FORMATS, REPORT_FILE, TABLE_FORMATS, ImportConfig, _check_out_spares_images, _ChunkWriter, _gen_rows, _listdir, _Plan,
    _progress_bars_restored, _resolve_path, _Skips, _sort_labels, _TableColumns, _work_dir,
)
from vltool.importer.csv_tsv import read_csv
from vltool.importer.imagefolder import _scan_imagefolder
from vltool.importer.jsonl import read_jsonl
from vltool.importer.parquet import _gen_parquet, _parquet_has_image_bytes, _plan_parquet, read_parquet
from vltool.importer.webdataset import _gen_webdataset, _plan_webdataset
from vltool.io import atomic_output, check_output, duplicate_rows, write_json_atomic
from vltool.shards import BAD_SHARD, DUPLICATE_ID, TAR_SUFFIXES, expand_braces


# --------------------------------------------------------------------------------------------------
# The table of formats (FORMATS, vltool.importer.common, names them; detect_format tells them apart)
#
# - tables of image paths (csv, tsv, jsonl, parquet without image bytes): read once into chunk files by the
#   reader of their module, one file at a time (TABLE_READERS);
# - imagefolder and coco: read once into chunk files by their module's scan (_first_pass);
# - webdataset and parquet with the image bytes: units of work as they are (_plan_webdataset, _plan_parquet);
# - clip_benchmark: imported whole by its module (import_clip_benchmark).
# The workers turn each kind of unit into rows with its generator (_GENERATORS).

TABLE_READERS: dict[str, Callable[..., _TableColumns]] = {
    "csv": read_csv, "tsv": read_csv, "jsonl": read_jsonl, "parquet": read_parquet,
}


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
# The workers' generator


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
# Planning: tables, image folders and COCO files read once; shards as they are


def _scan_tables(files: Sequence[Path], fmt: str, config: ImportConfig, writer: _ChunkWriter, skips: _Skips) -> dict:
    """Stream every table once, writing the rows into chunks; return which columns were used."""
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

        cols = TABLE_READERS[fmt](path, fmt, config, skips, add)
        used = {"image_column": cols.image, "caption_column": cols.caption, "id_column": cols.id, "label_column": cols.label}
    writer.flush()
    return used


@contextmanager
def _reading(fmt: str, files) -> Iterator[None]:
    """Arrow's errors reading a source (a CSV given as --format parquet, a damaged file) as one line."""
    try:
        yield
    except pa.ArrowException as e:
        shown = ", ".join(str(f) for f in list(files)[:3]) + (", ..." if len(files) > 3 else "")
        raise VltoolError(f"cannot read {shown} as {fmt}: {' '.join(str(e).split())}") from None


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
