"""`--format clip_benchmark`: CLIP_benchmark's WebDataset layout (`DIR/{train,test}/N.tar` with `nshards.txt`,
`classnames.txt`, `zeroshot_classification_templates.txt`, `dataset_type.txt`) imported whole into a DatasetDict
with the class names and templates beside it; a layout given directly to an evaluation is imported once into the
cache (`clip_benchmark_input`)."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import datasets
import numpy as np

from vltool import columns as C
from vltool import provenance
from vltool.cache import EmbeddingCache
from vltool.console import progress_enabled
from vltool.errors import UsageError, VltoolError
from vltool.importer.common import (
    LABEL_BEYOND_CLASSES, MISSING_LABEL, ImportConfig, _clean_captions, _listdir, _progress_bars_restored, _work_dir,
)
from vltool.io import OutputBusy, atomic_output, check_output, write_json_atomic
from vltool.shards import EMPTY_CAPTION, NO_IMAGE, iter_samples
from vltool.templates import DATASET_TEMPLATES, parse_templates
from vltool.topology import is_main, process_state, warn


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


def clip_benchmark_layout(spec: str | Path) -> Path | None:
    """The folder of a CLIP_benchmark layout given directly as a dataset argument (not a saved dataset, not
    vltool's import of one), else None."""
    root = Path(str(spec)).expanduser()
    if not root.is_dir() or any((root / f).is_file() for f in ("dataset_dict.json", "state.json")):
        return None
    return root if is_clip_benchmark(root) else None


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
    root = clip_benchmark_layout(spec)
    if root is None:
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
