"""`vltool export`: a dataset back out in the layouts open_clip's trainer reads unchanged.

- `webdataset`: `OUT/00000.tar, 00001.tar, ...`, `--shard-size` samples each; a sample is `KEY.jpg` (or
  `.png`), `KEY.txt` (the caption) and `KEY.json` (every other column: id, captions, label and label_name,
  ...). `OUT/sizes.json` gives each shard's sample count, which open_clip reads, so
  `python -m open_clip_train.main --dataset-type webdataset --train-data 'OUT/{00000..0000N}.tar'` trains on
  it without `--train-num-samples`.
- `csv`: `OUT/data.csv`, tab-separated with open_clip's default columns `filepath` (absolute path of the
  image) and `title` (the caption), plus `id` and `label`; the images in `OUT/images/NNNNN/KEY.jpg`.

- `hf` (a model, not a dataset): a vltool model started from a Hugging Face CLIP or SigLIP (`pretrain --init
  hf:DIR`) written in transformers' layout (config.json, model.safetensors, tokenizer and image processor
  files), so `transformers.AutoModel.from_pretrained(OUT)` and `AutoProcessor.from_pretrained(OUT)` load it
  unchanged; `export_hf_model` (vltool.model.export.export_hf does the writing).

KEY is the row's id when every id is a safe file name (letters, digits, `_`, `-`), else the row number
(`000000042`); the `.json` and the CSV always carry the id. `--image-format jpg` copies JPEG images byte
for byte and re-encodes the others (transparent pixels composited on white); `png` does the same for PNG.
"""

from __future__ import annotations

import csv
import io
import json
import multiprocessing as mp
import re
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import datasets
from PIL import Image

from vltool import columns as C
from vltool import provenance
from vltool.console import Bar
from vltool.errors import UsageError, VltoolError
from vltool.io.atomic import atomic_output, write_json_atomic
from vltool.io.digests import column_values
from vltool.io.images import image_bytes, image_size_policy
from vltool.io.loading import load_dataset
from vltool.io.outputs import check_output
from vltool.io.records import read_provenance
from vltool.topology import warn

TARGETS = ("webdataset", "csv", "hf")
DATASET_TARGETS = ("webdataset", "csv")
IMAGE_FORMATS = ("jpg", "png")
CSV_FILE = "data.csv"
SIZES_FILE = "sizes.json"
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


@dataclass
class ExportConfig:
    """Options of `vltool export`, one field per option of the same name (help: `vltool export --help`)."""

    to: str = "webdataset"
    shard_size: int = 10_000
    image_format: str = "jpg"
    jpeg_quality: int = 95
    num_proc: int = 1  # each worker writes whole shards

    def validate(self) -> None:
        problems = []
        if self.to not in TARGETS:
            problems.append(f"--to {self.to!r}: choose webdataset or csv (a dataset), or hf (a model)")
        if self.shard_size < 1:
            problems.append(f"--shard-size must be >= 1, got {self.shard_size}")
        if self.image_format not in IMAGE_FORMATS:
            problems.append(f"--image-format {self.image_format!r}: choose jpg or png")
        if not 1 <= self.jpeg_quality <= 100:
            problems.append(f"--jpeg-quality must be in [1, 100], got {self.jpeg_quality}")
        if self.num_proc < 1:
            problems.append(f"--num-proc must be >= 1, got {self.num_proc}")
        if problems:
            raise UsageError("; ".join(problems))


def _flatten_alpha(im):
    """RGB, with any transparency composited on white (what a viewer shows; dropping alpha gives black)."""
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return im.convert("RGB")


def encode_image(data: bytes, image_format: str, jpeg_quality: int = 95) -> tuple[bytes, bool]:
    """(bytes in `image_format`, whether it was re-encoded). Raises on an undecodable image."""
    image_size_policy()  # an image over the size limit raises: skipped and counted as undecodable
    with Image.open(io.BytesIO(data)) as im:
        if image_format == "jpg" and im.format == "JPEG" and im.mode in ("RGB", "L"):
            return data, False
        if image_format == "png" and im.format == "PNG":
            return data, False
        im.load()
        buf = io.BytesIO()
        if image_format == "jpg":
            _flatten_alpha(im).save(buf, format="JPEG", quality=jpeg_quality)
        else:
            (im if im.mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16") else im.convert("RGBA")).save(buf, format="PNG")
        return buf.getvalue(), True


def _image_data(value) -> bytes | None:
    """The image's bytes (embedded, a file, or a shard member: vltool.io.image_bytes), None when unreadable."""
    try:
        return image_bytes(value) or None
    except (OSError, KeyError, ValueError):
        return None


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # the same dataset gives byte-identical shards
    tar.addfile(info, io.BytesIO(data))


# Worker state for fork-based multiprocessing: set before the pool starts, inherited by the workers.
_WORK: dict = {}


class CsvRows:
    """open_clip's tab-separated CSV, quoted so that every field reads back whole, with `vltool import` and
    with pandas.read_csv(sep="\t") (open_clip's reader): csv's minimal quoting quotes a tab, a quote and a
    line feed, but not a lone carriage return, which both readers take as a line end; a row holding one
    is written with every field quoted."""

    def __init__(self, f):
        self.minimal = csv.writer(f, delimiter="\t", lineterminator="\n")
        self.quoted = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_ALL)

    def writerow(self, row: list[str]) -> None:
        (self.quoted if any("\r" in str(v) for v in row) else self.minimal).writerow(row)

    def writerows(self, rows) -> None:
        for row in rows:
            self.writerow(row)


def _write_shard(shard: tuple[int, int, int]) -> dict:
    """Write rows [lo, hi) as shard `index`; return counts (and, for csv, the table rows)."""
    index, lo, hi = shard
    w = _WORK
    config: ExportConfig = w["config"]
    ds, keys, label_names = w["ds"], w["keys"], w["label_names"]
    name = f"{index:0{w['width']}d}"
    skipped: Counter = Counter()
    written, reencoded = 0, 0
    csv_rows: list[list[str]] = []
    tar = tarfile.open(Path(w["tmp"]) / f"{name}.tar", "w", format=tarfile.PAX_FORMAT) if config.to == "webdataset" else None
    image_dir = Path(w["tmp"]) / "images" / name
    if config.to == "csv":
        image_dir.mkdir(parents=True, exist_ok=True)
    try:
        i = lo
        for batch in ds.select(range(lo, hi)).iter(batch_size=256):
            cols = list(batch)
            for j in range(len(batch[C.ID])):
                row = {c: batch[c][j] for c in cols}
                key = keys[i]
                i += 1
                caption = (row.get(C.CAPTION) or "").strip()
                if not caption:
                    skipped["empty caption"] += 1
                    continue
                data = _image_data(row.get(C.IMAGE))
                if data is None:
                    skipped["no image"] += 1
                    continue
                try:
                    img, changed = encode_image(data, config.image_format, config.jpeg_quality)
                except Exception as e:  # PIL raises many kinds
                    too_large = type(e).__name__ in ("DecompressionBombWarning", "DecompressionBombError")
                    skipped["image over the size limit" if too_large else "undecodable image"] += 1
                    continue
                reencoded += changed
                if tar is not None:
                    meta = {k: v for k, v in row.items() if k != C.IMAGE}
                    for col, names in label_names.items():
                        v = meta.get(col)
                        if isinstance(v, int) and 0 <= v < len(names):
                            meta[f"{col}_name"] = names[v]
                    _add(tar, f"{key}.{config.image_format}", img)
                    _add(tar, f"{key}.txt", caption.encode("utf-8"))
                    _add(tar, f"{key}.json", json.dumps(meta, ensure_ascii=False, default=str).encode("utf-8"))
                else:
                    (image_dir / f"{key}.{config.image_format}").write_bytes(img)
                    label = row.get(C.LABEL)
                    if C.LABEL in label_names and isinstance(label, int) and 0 <= label < len(label_names[C.LABEL]):
                        label = label_names[C.LABEL][label]
                    csv_rows.append([
                        str(Path(w["final"]) / "images" / name / f"{key}.{config.image_format}"),
                        caption, row[C.ID], "" if label is None else str(label),
                    ])
                written += 1
    finally:
        if tar is not None:
            tar.close()
    return {"index": index, "name": name, "written": written, "reencoded": reencoded, "skipped": skipped, "csv_rows": csv_rows}


def _keys(ids: list[str]) -> tuple[list[str], str]:
    if len(set(ids)) == len(ids) and all(isinstance(i, str) and _SAFE_KEY.match(i) for i in ids):
        return ids, "id"
    width = max(9, len(str(len(ids) - 1)))
    return [f"{i:0{width}d}" for i in range(len(ids))], "row number"


@dataclass
class Shards:
    """How the rows are cut into shards (webdataset) or image folders (csv), and named."""

    keys: list[str]  # each row's sample key
    key_from: str  # "id", or "row number" when the ids are not unique safe names
    spans: list[tuple[int, int, int]]  # (shard, first row, end row)
    width: int  # digits of a shard's name
    label_names: dict  # ClassLabel column -> its names

    @property
    def count(self) -> int:
        return len(self.spans)


@dataclass
class Written:
    """What the shards hold: samples per shard file, what was skipped and why, images re-encoded."""

    sizes: dict = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    reencoded: int = 0


def export(
    data: str,
    out,
    config: ExportConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Write `data` to `out` as WebDataset shards or open_clip's CSV layout; return the provenance record.

    Stages: load_input -> plan_shards -> write_shards -> train_command -> export_stats -> write the record.
    """
    timer = provenance.Timer()
    config.validate()
    if config.to not in DATASET_TARGETS:
        raise UsageError(f"--to {config.to} writes a model; call export_hf_model")
    src, ds, out = load_input(data, out, config, where, split, overwrite)
    n = len(ds)
    shards = plan_shards(ds, config)
    final = out.expanduser().resolve()
    with atomic_output(out, overwrite) as tmp:
        written = write_shards(ds, shards, config, tmp, final)
        rows_out = sum(written.sizes.values())
        if rows_out == 0:  # nothing to train on: no output, and no open_clip command
            why = ", ".join(f"{k}: {v:,}" for k, v in sorted(written.skipped.items()))
            raise VltoolError(f"no sample of {data!r} could be exported: all {n:,} rows were skipped ({why}); nothing was written")
        if config.to == "webdataset":
            write_json_atomic(tmp / SIZES_FILE, written.sizes)
        pattern, train = train_command(config, final, shards, rows_out)
        stats = export_stats(config, n, rows_out, written, shards, pattern, train)
        prov = provenance.make("export", config, [src], rows_in=n, rows_out=rows_out, stats=stats, timer=timer)
        write_json_atomic(tmp / C.PROVENANCE_FILE, prov)
    prov["wall_time_s"] = round(timer.seconds, 3)
    return prov


def load_input(data: str, out, config: ExportConfig, where: Sequence[str], split: str | None, overwrite: bool):
    """The data (id, image and caption checked), refused when no row is selected, its images as bytes
    (never decoded here: the workers re-encode them); and --out, checked."""
    src = load_dataset(data, split=split, where=where, required=[C.ID], images=[C.IMAGE], texts=[C.CAPTION], text_option="the caption column")
    out = check_output(out, overwrite, inputs=[*src.reads])
    ds = src.dataset
    if len(ds) == 0:
        raise UsageError(f"{data!r} has no rows to export{' after --where' if where else ''}")
    return src, ds.cast_column(C.IMAGE, datasets.Image(decode=False)), out


def plan_shards(ds, config: ExportConfig) -> Shards:
    """Sample keys (the ids when they are unique safe names, else row numbers), the shards' spans and names."""
    n = len(ds)
    label_names = {c: f.names for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}
    keys, key_from = _keys([str(i) for i in column_values(ds, C.ID)])
    n_shards = -(-n // config.shard_size)
    width = max(5, len(str(n_shards - 1)))
    spans = [(s, s * config.shard_size, min(n, (s + 1) * config.shard_size)) for s in range(n_shards)]
    return Shards(keys, key_from, spans, width, label_names)


def write_shards(ds, shards: Shards, config: ExportConfig, tmp: Path, final: Path) -> Written:
    """Every shard written into `tmp` (_write_shard; --num-proc forked workers, each writing whole shards),
    with open_clip's CSV (--to csv) written in shard order as they finish."""
    written = Written()
    _WORK.update(ds=ds, keys=shards.keys, label_names=shards.label_names, config=config, tmp=str(tmp), final=str(final), width=shards.width)
    csv_file = open(tmp / CSV_FILE, "w", encoding="utf-8", newline="") if config.to == "csv" else None
    try:
        writer = None
        if csv_file is not None:
            writer = CsvRows(csv_file)
            writer.writerow(["filepath", "title", C.ID, C.LABEL])
        num_proc = min(config.num_proc, shards.count)
        if num_proc > 1:
            pool = mp.get_context("fork").Pool(num_proc)
            results = pool.imap(_write_shard, shards.spans)
        else:
            pool, results = None, map(_write_shard, shards.spans)
        bar = Bar(f"export ({config.to})", len(ds), unit="rows")
        try:
            for (_, lo, hi), r in zip(shards.spans, results):
                written.sizes[f"{r['name']}.tar"] = r["written"]
                written.skipped.update(r["skipped"])
                written.reencoded += r["reencoded"]
                if writer is not None:
                    writer.writerows(r["csv_rows"])
                bar.advance(hi - lo)
        finally:
            bar.close()
            if pool is not None:
                pool.close()
                pool.join()
    finally:
        _WORK.clear()
        if csv_file is not None:
            csv_file.close()
    return written


def train_command(config: ExportConfig, final: Path, shards: Shards, rows_out: int) -> tuple[str, str]:
    """The --train-data of open_clip for the output, and the whole open_clip_train command."""
    if config.to == "webdataset":
        width = shards.width
        pattern = f"{final}/{{{0:0{width}d}..{shards.count - 1:0{width}d}}}.tar"
        return pattern, (
            f"python -m open_clip_train.main --dataset-type webdataset --train-data '{pattern}' "
            f"--train-num-samples {rows_out}"
        )
    pattern = str(final / CSV_FILE)
    return pattern, (
        f"python -m open_clip_train.main --dataset-type csv --train-data {pattern} "
        "--csv-img-key filepath --csv-caption-key title"
    )


def export_stats(config: ExportConfig, n: int, rows_out: int, written: Written, shards: Shards, pattern: str, train: str) -> dict:
    """The record's "stats": rows written and skipped (and why), shards, keys, the open_clip command."""
    return {
        "to": config.to,
        "rows_in": n,
        "rows_out": rows_out,
        "rows_skipped": n - rows_out,
        "skipped": dict(sorted(written.skipped.items())),
        "shards": shards.count if config.to == "webdataset" else None,
        "image_folders": shards.count if config.to == "csv" else None,
        "images_reencoded": written.reencoded,
        "image_format": config.image_format,
        "keys_from": shards.key_from,
        "train_data": pattern,
        "open_clip_command": train,
    }


def _init_revision(model_dir: Path) -> dict:
    """`pretrain --init`'s revision (the Hub repository and commit) from the training run's vltool.json, {} without one."""
    for d in (model_dir, model_dir.parent):
        prov = read_provenance(d)
        if prov:
            rev = (prov.get("options") or {}).get("init_revision")
            return dict(rev) if isinstance(rev, dict) else {}
    return {}


def export_hf_model(model: str, out, *, overwrite: bool = False) -> dict:
    """Write the vltool model `model` (a RUN_DIR or RUN_DIR/model started from hf:DIR) to `out` in
    transformers' layout, with vltool.json beside; return the provenance record."""
    # lazy: vltool.model imports torch and transformers, which exporting a dataset never needs
    from vltool.model.export import export_hf
    from vltool.model.hf_towers import HF_DUAL_TYPES
    from vltool.model.model_dir import read_model_dir, resolve_model_dir
    from vltool.model.pinning import fingerprint

    timer = provenance.Timer()
    model_dir = resolve_model_dir(model)
    out = check_output(out, overwrite, inputs=[Path(model).expanduser(), model_dir])
    twotower, tokenizer = read_model_dir(model_dir)
    with atomic_output(out, overwrite) as tmp:
        notes = export_hf(twotower, tokenizer, tmp)
        for n in notes:
            warn(n)
        hf = twotower.config["hf"]
        init = _init_revision(model_dir)
        stats = {
            "to": "hf",
            "model_type": hf["model_type"],
            "class": f"transformers.{HF_DUAL_TYPES[hf['model_type']]}",
            # the Hub repository at the commit training started from (hf:ORG/NAME@COMMIT), else the folder's name
            "started_from": f"{init['repo']}@{init['commit']}" if init.get("repo") and init.get("commit") else hf.get("source"),
            "started_from_revision": init or None,
            "model_fingerprint": fingerprint(twotower, twotower.config),
            "notes": notes,
            "load_with": f"transformers.AutoModel.from_pretrained({str(out.expanduser().resolve())!r})",
        }
        record = {"spec": str(model), "path": str(model_dir), "kind": "model"}
        prov = provenance.make("export", {"to": "hf"}, [record], stats=stats, timer=timer)
        write_json_atomic(tmp / C.PROVENANCE_FILE, prov)
    prov["wall_time_s"] = round(timer.seconds, 3)
    return prov
