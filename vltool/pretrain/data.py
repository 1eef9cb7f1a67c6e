"""The training rows and the order a step sees them in.

- `load_train_data` / `load_unicl_data`: the inputs concatenated, their columns checked, rows without text
  dropped (counted), and what an objective needs per row (mined positives, UniCL labels) attached.
- `EpochBatches` / `BalancedEpochBatches`: global micro-batch k of epoch e is a slice of a permutation that
  depends on (seed, e) only; process r takes its r-th part. So N processes with --accum-steps A see what
  one process with batch A x N x B sees, and a resumed run continues exactly.
- `PairDataset` + `Collate`: item (epoch, row) -> image tensor and text(s); each row's augmentation and
  caption draw come from a generator seeded by (seed, epoch, row), whatever the number of workers.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tarfile
from dataclasses import dataclass, field
from typing import Any, Sequence

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from vltool import columns as C
from vltool.cache import row_filter
from vltool.checks import has_text, text_column
from vltool.derived import add_columns
from vltool.distinct import duplicate
from vltool.errors import UsageError, VltoolError, out_of_resources
from vltool.io.atomic import atomic_file
from vltool.io.digests import arrow_column, column_values
from vltool.io.images import decode_image, decode_pixels, jpeg_for_device
from vltool.io.index import default_cache_dir, shard_index
from vltool.io.loading import load_dataset, read_from_disk
from vltool.io.records import read_provenance
from vltool.pretrain.config import PretrainConfig
from vltool.pretrain.workers import guarded, worker_init
from vltool.shards import DUPLICATE_ID, iter_samples, load_shards, sample_id, sample_image, sample_text
from vltool.templates import load_templates
from vltool.topology import is_local_main, warn


@dataclass
class TrainData:
    """The concatenated training rows: ids, images (undecoded) and texts."""

    dataset: Any  # datasets.Dataset with id, image (decode=False) and the text column
    text_column: str
    inputs: list  # LoadedDataset of each input (provenance)
    rows_in: int  # rows after --where, before dropping empty texts
    empty_text_ids: list[str]
    positives: dict | None = None  # --mined-positives: row -> rows of its `positives` ids in the training rows
    labels: Any = None  # unicl: (rows,) int64 label of each row (classes first, then one per image-text row)
    templated: Any = None  # unicl: (rows,) bool, the row's text is a class name to put in a random template
    templates: list | None = None  # unicl: the templates
    rows_key: dict | None = None  # which rows these are, for cache keys: the inputs' fingerprints and filters, rows dropped
    text_source: str = ""  # the dataset column(s) the texts come from, for cache keys

    @property
    def ids(self) -> list:
        return column_values(self.dataset, C.ID)


def rows_key(loaded, role: Sequence[str], prefix_ids: bool, dropped: Sequence[int]) -> dict:
    """What identifies the training rows without reading them: each input's on-disk fingerprint and row
    filter (vltool.cache's convention), and the rows dropped for having no text."""
    return {
        "inputs": [{**_input_key(s), "role": r} for s, r in zip(loaded, role)],
        "prefix_ids": prefix_ids,
        "dropped": hashlib.sha256(np.asarray(dropped, dtype=np.int64).tobytes()).hexdigest(),
    }


def _input_key(src) -> dict:
    """An input's part of a key: its on-disk fingerprint and row filter (vltool.cache's convention)."""
    return {"fingerprint": src.fingerprint, **row_filter(src.split, src.where)}


def texts_of(value, sampling: str | None) -> list[str]:
    if sampling is None:
        return [value] if isinstance(value, str) and value.strip() else []
    return [t for t in (value or []) if isinstance(t, str) and t.strip()]


def load_train_data(
    data: Sequence[str], config: PretrainConfig, where: Sequence[str] = (), split: str | None = None, what: str = "input"
) -> TrainData:
    """Load and concatenate the inputs, check their columns, drop rows without text (counted)."""
    lists = bool(config.caption_sampling) or config.captions_per_image > 1
    text_col = C.CAPTIONS if lists else config.text_column
    needed = [C.ID, C.IMAGE, text_col]
    if config.mined_positives and what == "input":
        needed.append(C.POSITIVES)
    split_option = "--eval-split" if what == "--eval-data" else "--split"
    loaded = [load_dataset(spec, split=split, where=where, required=needed, split_option=split_option) for spec in data]
    for src in loaded:
        if src.index is not None:  # shards read through their index, which left out the samples repeating an id
            refuse_repeated_ids(src.spec, src.index.path)
        if lists:
            text_column(src.dataset, text_col, src.spec, option="the column --caption-sampling and --captions-per-image read,", list_only=True)
        else:
            text_column(src.dataset, text_col, src.spec,
                        hint="; a row's several texts are sampled with --caption-sampling (which reads 'captions')")
        if not isinstance(src.dataset.features[C.IMAGE], datasets.Image):
            raise UsageError(f"column {C.IMAGE!r} of {src.spec!r} is not an image column (it is {src.dataset.features[C.IMAGE]})")
    # The rows are checked on the inputs as loaded, before any column is selected or cast (each of those
    # makes new Arrow objects for every record batch, and the check's transient memory adds to them
    # otherwise). The verdict (the rows without text of inputs whose ids passed) is kept in the cache under
    # the inputs' fingerprints and filters, so a resume, a later run and the other processes of a later
    # launch skip the check.
    verdict = _verdict_file(loaded, text_col, lists, config.prefix_ids)
    dropped = _read_verdict(verdict)
    if dropped is None:
        dropped = check_rows(loaded, text_col, lists, prefixed=config.prefix_ids and len(loaded) > 1)
        _write_verdict(verdict, dropped)
    parts = []
    for k, src in enumerate(loaded):
        ds = src.dataset.select_columns(needed).cast_column(C.IMAGE, datasets.Image(decode=False))
        if config.prefix_ids and len(loaded) > 1:
            prefix = pa.scalar(f"{k}:")
            new = {C.ID: pc.binary_join_element_wise(prefix, arrow_column(ds, C.ID), "")}
            if C.POSITIVES in needed:  # each list's ids prefixed; a missing list is an empty one
                new[C.POSITIVES] = pa.chunked_array([
                    type(c).from_arrays(c.offsets, pc.binary_join_element_wise(prefix, c.values, ""))
                    for c in arrow_column(ds, C.POSITIVES).chunks])
            ds = add_columns(ds, new, key=f"prefix-ids:{k}".encode(), in_place=True)
        parts.append(ds.select_columns(needed) if ds.column_names != needed else ds)  # (each select costs a Python step per record batch)
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    rows_in = len(ds)
    empty_ids = []
    if len(dropped):
        empty_ids = arrow_column(ds, C.ID).take(pa.array(dropped)).to_pylist()
        keep = np.ones(rows_in, dtype=bool)
        keep[dropped] = False
        ds = ds.select(np.flatnonzero(keep))
    dropped = dropped.tolist()
    if len(ds) == 0:
        raise UsageError(f"the {what} has no rows with text in {text_col!r}")
    if config.captions_per_image > 1 and what == "input":
        most = pc.max(pc.list_value_length(arrow_column(ds, text_col))).as_py()
        if (most or 0) <= 1:  # k copies of one caption: the plain loss under another name (issue 39)
            raise UsageError(f"--captions-per-image {config.captions_per_image}: every training row has one caption in "
                             f"{text_col!r}; give data with several captions per image (e.g. from vltool recaption "
                             f"--num-captions N) or drop --captions-per-image")
    positives = None
    if C.POSITIVES in needed:
        positives, unfound = _positive_rows(ds, with_unfound=True)
        refuse_unknown_positives(loaded, unfound, config.prefix_ids and len(loaded) > 1)
    key = rows_key(loaded, ["pairs"] * len(loaded), config.prefix_ids, dropped)
    return TrainData(ds, text_col, loaded, rows_in, empty_ids, positives, rows_key=key, text_source=text_col)


def check_ids(named_ids: list, prefixed: bool, hint: str = "") -> None:
    """Raise on duplicate ids within an input, and on an id in two inputs unless `prefixed` (--prefix-ids:
    '<input index>:<id>' cannot clash). named_ids: (spec, its Arrow id column) of each input. By their
    sorted 64-bit hashes (vltool.distinct: 8 bytes a row, where Arrow's count_distinct kept 0.7 GB at 10M
    ids); only the offending ids become Python objects."""
    for spec_, ids in named_ids:
        repeated, an_id = duplicate(ids)
        if repeated:
            raise UsageError(f"{spec_!r} has duplicate ids (e.g. {an_id!r}); ids must be unique")
    if len(named_ids) > 1 and not prefixed:
        columns = [ids for _, ids in named_ids]
        clashes, clash = duplicate(pa.chunked_array([c for ids in columns for c in ids.chunks], type=columns[0].type))
        if clashes:
            first, second = [spec_ for spec_, ids in named_ids if pc.any(pc.equal(ids, clash)).as_py()][:2]
            raise UsageError(
                f"id {clash!r} is in both {first!r} and {second!r}; "
                f"pass --prefix-ids to make ids unique as '<input index>:<id>'{hint}"
            )


def check_rows(loaded, text_col: str, lists: bool, prefixed: bool) -> np.ndarray:
    """(dropped,) int64: the rows of the concatenated inputs without text; raises on duplicate ids within an
    input, and on an id in two inputs unless `prefixed` (--prefix-ids: '<input index>:<id>' cannot clash).

    Whole-column work in Arrow and numpy, no per-row Python: ids by check_ids, texts by a vectorised test."""
    check_ids([(src.spec, arrow_column(src.dataset, C.ID)) for src in loaded], prefixed)
    dropped, offset = [], 0
    for src in loaded:
        dropped.append(np.flatnonzero(~has_text(arrow_column(src.dataset, text_col), lists)) + offset)
        offset += len(src.dataset)
    pa.default_memory_pool().release_unused()  # the slices' transient arrays, which Arrow's pool would keep for the run
    return np.concatenate(dropped).astype(np.int64)


VERDICT_DIR = "checked-rows"  # <cache-dir>/checked-rows/<key>.npy: the rows without text of inputs whose ids passed
VERDICT_VERSION = 1  # part of the key: a change to what is checked makes new verdicts


def _verdict_file(loaded, text_col: str, lists: bool, prefix_ids: bool):
    """Where the verdict on these inputs is kept: keyed by each input's on-disk fingerprint and row filter
    (vltool.cache's convention), the text column and how it is read, and --prefix-ids."""
    key = {"version": VERDICT_VERSION, "text": text_col, "lists": lists, "prefix_ids": prefix_ids and len(loaded) > 1,
           "inputs": [{**_input_key(s), "rows": s.rows} for s in loaded]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return default_cache_dir() / VERDICT_DIR / f"{digest}.npy"


def _read_verdict(path) -> np.ndarray | None:
    """The cached rows without text (int64), or None when there is no readable verdict."""
    try:
        dropped = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return dropped if dropped.dtype == np.int64 and dropped.ndim == 1 else None


def _write_verdict(path, dropped: np.ndarray) -> None:
    """Keep the verdict (atomically, by the first process of a node; a cache that cannot be written is
    skipped: the verdict is only a shortcut)."""
    if not is_local_main():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, np.asarray(dropped, dtype=np.int64), allow_pickle=False)
    except OSError:
        pass


SLICE_ROWS = 1 << 18  # rows per Arrow call of the positives' lookup (a saved image dataset has a record batch per 100 rows)


def _positive_rows(ds, with_unfound: bool = False):
    """Row -> rows of its mined positives, in the order listed (`positives` ids outside the training rows, and
    a row's own id, are ignored). Arrow's lookup of the listed ids among the training ids, SLICE_ROWS
    rows at a time: Python objects for the rows that have positives only (the plain loop over rows,
    `_positive_rows_reference`, took a dict of every id). `with_unfound`: also the listed ids that are not
    training rows' ids (distinct, an Arrow array), for refuse_unknown_positives."""
    ids = arrow_column(ds, C.ID).combine_chunks()
    listed = arrow_column(ds, C.POSITIVES)
    positives: dict[int, list[int]] = {}
    unfound = []
    for a in range(0, len(listed), SLICE_ROWS):
        part = listed.slice(a, SLICE_ROWS).combine_chunks()
        parent = pc.list_parent_indices(part).to_numpy().astype(np.int64) + a  # (listed,) the row listing each id
        flat = pc.list_flatten(part)
        found = pc.fill_null(pc.index_in(flat, value_set=ids), -1).to_numpy().astype(np.int64)  # (listed,)
        if with_unfound and (found < 0).any():
            unfound.append(pc.unique(flat.filter(pa.array(found < 0))))
        ok = (found >= 0) & (found != parent)
        parent, found = parent[ok], found[ok]
        if len(parent):
            starts = np.flatnonzero(np.r_[True, parent[1:] != parent[:-1]])
            for row, rows_ in zip(parent[starts].tolist(), np.split(found, starts[1:])):
                positives[row] = rows_.tolist()
    if not with_unfound:
        return positives
    return positives, (pc.unique(pa.concat_arrays([u.cast(pa.large_string()) for u in unfound])) if unfound else None)


def refuse_unknown_positives(loaded, unfound, prefixed: bool) -> None:
    """--mined-positives: a listed id that is no row's id in the inputs (before --where: positives among the
    rows --where leaves out are ignored, as the research hygiene asks) names nothing; the positives were
    mined on other data, or keyed by other ids (with --prefix-ids, '<input index>:<id>': each input's
    positives are prefixed with its own index, so an id of another input is no row's). Refused, not ignored:
    the loss would train without the positives asked for."""
    if unfound is None or len(unfound) == 0:
        return
    whole = []
    for k, src in enumerate(loaded):
        ids = src.dataset.data.column(C.ID)  # the table under the --where selection (an indices mapping): every row
        ids = pa.chunked_array([c.cast(pa.large_string()) for c in ids.chunks], type=pa.large_string())
        whole.append(pc.binary_join_element_wise(pa.scalar(f"{k}:", pa.large_string()), ids, pa.scalar("", pa.large_string())) if prefixed else ids)
    known = pa.chunked_array([c for w in whole for c in w.chunks], type=pa.large_string())
    missing = unfound.filter(pc.invert(pc.is_in(unfound, value_set=known.combine_chunks())))
    if len(missing):
        specs = ", ".join(repr(src.spec) for src in loaded)
        hint = (" (with --prefix-ids the ids are '<input index>:<id>', and each input's positives are prefixed with its "
                "own index)" if prefixed else "")
        raise UsageError(
            f"--mined-positives: {len(missing):,} ids listed in {C.POSITIVES!r} are not the id of any row of {specs} "
            f"(e.g. {missing[0].as_py()!r}){hint}; the positives must name rows of the same data: mine them on it with "
            "`vltool mine-positives`"
        )


def _positive_rows_reference(ds) -> dict[int, list[int]]:
    """`_positive_rows` row by row in Python (the tests' reference)."""
    row_of = {i: r for r, i in enumerate(column_values(ds, C.ID))}
    positives = {}
    for r, ps in enumerate(column_values(ds, C.POSITIVES)):
        rows_ = [row_of[p] for p in (ps or []) if p in row_of and row_of[p] != r]
        if rows_:
            positives[r] = rows_
    return positives


UNICL_TEXT = "_unicl_text"  # unicl's internal text column: the caption, or the class name of a label row


def load_unicl_data(config: PretrainConfig, where: Sequence[str] = (), split: str | None = None) -> TrainData:
    """UniCL's two roles, concatenated (label inputs first): image-label rows get their class's label and
    the class name as text (a template is drawn per sample); image-text rows get a label each.

    Whole-column work, no per-row Python (as load_train_data): ids checked by vltool.distinct, texts by the
    blank-text test, class names numbered in order of first appearance by Arrow's `unique` and each label
    row's class found by Arrow's lookup. A caption or string label column becomes the text column as it
    is, memory-mapped (rows without text are dropped, so their values are never read); a ClassLabel
    column's names are taken into a new column."""
    specs = [(s, "label") for s in config.label_data] + [(s, "text") for s in config.text_data]
    if not specs:
        raise UsageError("--loss unicl needs --label-data and/or --text-data (or DATA, taken as --text-data)")
    prefixed = config.prefix_ids and len(specs) > 1
    classes: dict[str, int] = {}  # class name -> class index; equal names in several label inputs are one class
    parts, loaded, named_ids, keep, is_label = [], [], [], [], []
    for k, (spec_, role) in enumerate(specs):
        col = config.label_column if role == "label" else config.text_column
        src = load_dataset(spec_, split=split, where=where, required=[C.ID, C.IMAGE, col])
        loaded.append(src)
        ds = src.dataset
        texts = _role_texts(ds, col, role, spec_)  # (rows,) the caption or class name, as Arrow strings
        texted = has_text(texts, lists=False)  # (rows,) bool
        if role == "label":
            named = pc.unique(pc.filter(texts, pa.array(texted)))  # in order of first appearance
            for name in named.to_pylist():
                classes.setdefault(name, len(classes))
        ids = arrow_column(ds, C.ID)
        named_ids.append((spec_, ids))
        sub = ds.select_columns([C.ID, C.IMAGE, col]).cast_column(C.IMAGE, datasets.Image(decode=False))
        new = {}
        if isinstance(ds.features[col], datasets.ClassLabel):  # the class names, one per row
            new[UNICL_TEXT] = pa.chunked_array(texts).cast(pa.string())
        else:  # the input's own column, memory-mapped
            sub = sub.rename_column(col, UNICL_TEXT)
            if ds.features[col] != datasets.Value("string"):
                sub = sub.cast_column(UNICL_TEXT, datasets.Value("string"))
        if prefixed:
            new[C.ID] = pc.binary_join_element_wise(pa.scalar(f"{k}:"), ids, "")
        if new:
            sub = add_columns(sub, new, key=f"unicl:{k}".encode(), in_place=True)
        keep.append(texted)
        is_label.append(np.full(len(ds), role == "label"))
        parts.append(sub.select_columns([C.ID, C.IMAGE, UNICL_TEXT]))
    check_ids(named_ids, prefixed, hint=" (e.g. one dataset in both roles)")
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    rows_in = len(ds)
    keep, is_label = np.concatenate(keep), np.concatenate(is_label)  # (rows_in,) each
    dropped = np.flatnonzero(~keep)
    empty_ids = arrow_column(ds, C.ID).take(pa.array(dropped)).to_pylist() if len(dropped) else []
    if len(dropped):
        ds = ds.select(np.flatnonzero(keep))
        is_label = is_label[keep]
    if len(ds) == 0:
        raise UsageError("the unicl inputs have no rows with a label or text")
    names = pa.array(list(classes), pa.string())
    class_of = pc.fill_null(pc.index_in(arrow_column(ds, UNICL_TEXT), value_set=names), -1).to_numpy()  # (rows,)
    labels = np.where(is_label, class_of, len(classes) + np.arange(len(ds)))
    _, templates = load_templates(config.templates)
    key = rows_key(loaded, [r for _, r in specs], config.prefix_ids, dropped.tolist())
    data = TrainData(ds, UNICL_TEXT, loaded, rows_in, empty_ids, rows_key=key,
                     text_source=f"label:{config.label_column}|text:{config.text_column}")
    data.labels = labels.astype(np.int64)
    data.templated = is_label
    data.templates = templates
    return data


def _role_texts(ds, col: str, role: str, spec_: str):
    """(rows,) Arrow strings: a label row's class name (null for a missing class), or a row's caption."""
    feat = ds.features[col]
    values = arrow_column(ds, col)
    if role == "label":
        if isinstance(feat, datasets.ClassLabel):
            known = pc.if_else(pc.greater_equal(values, 0), values, pa.scalar(None, values.type))  # -1: no label
            return pc.take(pa.array(feat.names, pa.string()), known)
        if isinstance(feat, datasets.Value) and feat.dtype in ("string", "large_string"):
            return values
        raise UsageError(f"--label-column {col!r} of {spec_!r} must be a ClassLabel or string column (it is {feat})")
    text_column(ds, col, spec_)
    return values


class BalancedEpochBatches:
    """UniCL B.2: epoch e holds every image-label row and min(#label, #text) image-text rows drawn anew
    (without replacement, seeded by (seed, e)), shuffled together; batching as EpochBatches."""

    def __init__(self, label_rows, text_rows, batch: int, world: int, rank: int, seed: int, start: int, stop: int, accum: int = 1):
        self.label_rows, self.text_rows = np.asarray(label_rows), np.asarray(text_rows)
        self.n = len(self.label_rows) + min(len(self.label_rows), len(self.text_rows))
        self.inner = EpochBatches(self.n, batch, world, rank, seed, start, stop, accum)
        self.inner.perm = self.perm
        self.per_epoch = self.inner.per_epoch

    def perm(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.inner.seed, 7919, epoch])
        drawn = rng.choice(self.text_rows, size=self.n - len(self.label_rows), replace=False)
        return rng.permutation(np.concatenate([self.label_rows, drawn]))

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        return iter(self.inner)


def make_sampler(train: TrainData, config: PretrainConfig, world: int, rank: int, start: int, stop: int):
    if config.balanced and train.templated is not None:
        rows = np.arange(len(train.dataset))
        return BalancedEpochBatches(rows[train.templated], rows[~train.templated], config.batch_size, world, rank, config.seed, start,
                                    stop, config.accum_steps)
    return EpochBatches(len(train.dataset), config.batch_size, world, rank, config.seed, start, stop, config.accum_steps)


def row_seed(seed: int, epoch: int, row: int) -> int:
    """The seed of one row's augmentation and caption draw."""
    return int(np.random.SeedSequence([seed, epoch, row]).generate_state(1, dtype=np.uint64)[0] >> 1)


class PairDataset:
    """Item (epoch, row) -> {"row", "id", "image" tensor, "text"}; {"row", "id", "bad": True} for a bad image.
    `transform` is a vltool.transforms.Pixels (uint8 crops, normalised on the device) or any callable of a
    PIL image."""

    def __init__(self, ds, text_column: str, sampling: str | None, transform, seed: int, load_images: bool = True,
                 captions_per_image: int = 1, templated=None, templates=None, two_views: bool = False):
        self.two_views = two_views  # simclr: a second augmented view "image2" from another seed
        self.templated, self.templates = templated, templates  # unicl: rows whose text is a class name to template
        self.captions_per_image = captions_per_image  # > 1: "texts", k captions (shuffled when sampling is random, cycled)
        self.ds = ds
        self.text_column = text_column
        self.sampling = sampling
        self.transform = transform
        self.seed = seed
        self.load_images = load_images  # False when image features are cached

    def __len__(self) -> int:
        return len(self.ds)

    @staticmethod
    def _seeded(seed: int, fn):
        g = torch.random.default_generator  # torchvision draws from it; CPU only, unlike torch.manual_seed
        saved = g.get_state()
        g.manual_seed(seed)
        try:
            return fn()
        finally:
            g.set_state(saved)

    def _warn_cpu_decoded(self, id_) -> None:
        if not getattr(self, "_warned_cpu_decoded", False):
            self._warned_cpu_decoded = True
            print(f"warning: --decode gpu: sample {id_!r} is not a JPEG that nvjpeg decodes (baseline or progressive, RGB or "
                  "grayscale); such samples are decoded in the data-loader workers (this worker says so once)",
                  file=sys.stderr, flush=True)

    def decode(self, image: dict | None):
        """A stored image as the transform takes it: a uint8 tensor (vltool.transforms.Pixels that take one),
        else a PIL image in its own mode (the transform converts it as the model's library does)."""
        if getattr(self.transform, "takes", "pil") == "tensor":
            return decode_pixels(image, composite=self.transform.composite)
        return decode_image(image, rgb=False)

    def __getitem__(self, key):
        epoch, row = key
        rec = self.ds[int(row)]
        return self.item(epoch, int(row), rec[C.ID], rec[self.text_column], rec[C.IMAGE])

    def item(self, epoch: int, row: int, id_: str, text, image: dict | None) -> dict:
        """One training item from a row's id, text value and undecoded image ({"bytes", "path"})."""
        out = {"row": row, "id": id_}
        s = row_seed(self.seed, epoch, row)
        k = self.captions_per_image
        texts = texts_of(text, self.sampling or ("first" if k > 1 else None))
        if not texts:  # a streamed sample without text (a dataset's rows without text were dropped at load time)
            return {**out, "bad": True, "no_text": True}
        if k > 1:
            if self.sampling == "random":
                texts = random.Random(s).sample(texts, len(texts))
            out["texts"] = [texts[i % len(texts)] for i in range(k)]
        elif self.templated is not None and self.templated[int(row)]:
            out["text"] = random.Random(s).choice(self.templates).format(texts[0])  # UniCL: a random template per sample
        else:
            out["text"] = random.Random(s).choice(texts) if self.sampling == "random" else texts[0]
        if self.load_images:
            if getattr(self.transform, "on_device", False):  # --decode gpu: a JPEG crosses as its bytes and crop box
                found = jpeg_for_device(image)
                if found is not None:
                    data, hw = found
                    out["jpeg"] = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # (bytes,)
                    out["box"] = self._seeded(s, lambda: self.transform.transform.box(hw))
                    return out
                self._warn_cpu_decoded(id_)
            im = self.decode(image)
            if im is None:
                return {**out, "bad": True}
            g = torch.random.default_generator  # torchvision draws from it; CPU only, unlike torch.manual_seed
            saved = g.get_state()
            g.manual_seed(s)
            try:
                out["image"] = self.transform(im)
                if self.two_views:
                    g.manual_seed(int(np.random.SeedSequence([self.seed, epoch, int(row), 2]).generate_state(1, dtype=np.uint64)[0] >> 1))
                    out["image2"] = self.transform(im)
            finally:
                g.set_state(saved)
        return out


class Collate:
    """Items -> a batch: "rows" (B,), "images" (B, 3, H, W) [and "images2"], "tokens" of the texts (or
    "text_index" into a frozen text tower's feature table), "text_rows" (B*k,) with k captions per image,
    "bad_ids", the ids of the rows left out because their image could not be decoded (or, streamed, they have
    no text: "no_text" counts those)."""

    def __init__(self, tokenizer, tokenize: bool = True, text_index: dict | None = None, bad_rows=frozenset()):
        self.tokenizer = tokenizer
        self.tokenize = tokenize  # False when text features are cached
        self.text_index = text_index  # text -> row of the frozen text tower's feature table (sampled captions)
        self.bad_rows = bad_rows  # rows whose image failed to decode when the image features were cached

    def __call__(self, items: list[dict]) -> dict:
        bad = [it.get("bad", False) or it["row"] in self.bad_rows for it in items]
        good = [it for it, b in zip(items, bad) if not b]
        batch = {
            "rows": torch.tensor([it["row"] for it in good], dtype=torch.long),
            "bad_ids": [it["id"] for it, b in zip(items, bad) if b],
            "no_text": sum(1 for it in items if it.get("no_text")),
            "n": len(good),
        }
        if any("jpeg" in it for it in good):  # --decode gpu: the JPEGs' bytes end to end (one tensor), the rest decoded
            at = [i for i, it in enumerate(good) if "jpeg" in it]
            batch["jpeg"] = torch.cat([good[i]["jpeg"] for i in at])  # (total bytes,)
            batch["jpeg_sizes"] = torch.tensor([good[i]["jpeg"].numel() for i in at], dtype=torch.long)  # (J,)
            batch["jpeg_boxes"] = torch.tensor([good[i]["box"] for i in at], dtype=torch.long)  # (J, 4) top, left, h, w
            batch["jpeg_at"] = torch.tensor(at, dtype=torch.long)  # (J,) places in the batch
            rest = [i for i, it in enumerate(good) if "image" in it]
            if rest:
                batch["images"] = torch.stack([good[i]["image"] for i in rest])  # (n - J, 3, H, W)
                batch["images_at"] = torch.tensor(rest, dtype=torch.long)
        elif good and "image" in good[0]:
            batch["images"] = torch.stack([it["image"] for it in good])
        if good and "image2" in good[0]:
            batch["images2"] = torch.stack([it["image2"] for it in good])
        if good and "texts" in good[0]:  # k captions per image, image-major: texts of image i are i*k .. i*k+k-1
            k = len(good[0]["texts"])
            batch["text_rows"] = batch["rows"].repeat_interleave(k)
            texts = [t for it in good for t in it["texts"]]
        else:
            texts = [it["text"] for it in good]
        if self.text_index is not None:
            batch["text_index"] = torch.tensor([self.text_index[t] for t in texts], dtype=torch.long)
        elif good and self.tokenize:
            batch["tokens"] = self.tokenizer(texts)
        return batch


class EpochBatches:
    """Micro-batches of this process from micro-batch `start` to `stop` (exclusive).

    Global micro-batch k of epoch e is rows perm_e[k*G:(k+1)*G] (G = batch * processes); process r takes
    its r-th slice of B rows. perm_e depends on (seed, e) only. An epoch holds whole optimizer steps of
    `accum` micro-batches (the last incomplete step dropped), so step s takes exactly the rows, in order,
    that one process with batch accum * processes * B takes at its step s.
    """

    def __init__(self, n: int, batch: int, world: int, rank: int, seed: int, start: int, stop: int, accum: int = 1):
        self.n, self.batch, self.world, self.rank, self.seed = n, batch, world, rank, seed
        self.per_epoch = n // (batch * world * accum) * accum
        self.start, self.stop = start, stop

    def perm(self, epoch: int) -> np.ndarray:
        """(n,) the epoch's order of the rows: Generator.permutation(n)'s, shuffled in place in 4-byte rows
        where they fit (the same draws, so the same order: 40 MB at 10M rows, not 80)."""
        order = np.arange(self.n, dtype=np.int32 if self.n < 2**31 else np.int64)
        np.random.default_rng([self.seed, 7919, epoch]).shuffle(order)
        return order

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self):
        cached = (None, None)
        for mb in range(self.start, self.stop):
            epoch, k = divmod(mb, self.per_epoch)
            if cached[0] != epoch:
                cached = (epoch, self.perm(epoch))
            g0 = k * self.batch * self.world + self.rank * self.batch
            yield [(epoch, int(r)) for r in cached[1][g0 : g0 + self.batch]]


# ---- WebDataset shards, streamed (docs/pretrain.md, "Streaming shards")


@dataclass
class ShardData:
    """Training data read as a stream from WebDataset shards: no row is read before training starts."""

    inputs: list  # vltool.shards.ShardSource of each DATA argument
    shards: list  # every shard, in the order of the arguments
    text_column: str
    rows: int | None  # samples with an image and a text, counted by the shards' index (None: not counted, below)
    empty_text_ids: list = field(default_factory=list)  # (samples without text are skipped in their batch, as bad images)
    positives: dict | None = None
    labels: Any = None
    templated: Any = None
    templates: list | None = None
    rows_key: dict | None = None
    text_source: str = ""

    @property
    def rows_in(self) -> int | None:
        return self.rows


def load_shard_data(data: Sequence[str], config: PretrainConfig, where: Sequence[str] = (), split: str | None = None) -> ShardData:
    """The shards of every DATA argument (patterns expanded, each shard checked to exist); what streaming
    cannot do is refused here, before anything is written."""
    problems = []
    if where or split:
        problems.append("--where and --split select rows of a dataset; shards are streamed whole (select before sharding)")
    if config.loss == "unicl" or config.mined_positives or config.balanced:
        problems.append("--loss unicl, --mined-positives and --balanced need the whole table of rows: import the shards first (vltool import)")
    if config.bias_init == "search":
        problems.append("--bias-init search reads the first batches before training: give a number with shards")
    if problems:
        raise UsageError("; ".join(problems))
    lists = bool(config.caption_sampling) or config.captions_per_image > 1
    sources = [load_shards(spec) for spec in data]
    shards = [p for s in sources for p in s.shards]
    indexes = [shard_samples_index(source) for source in sources]  # counted and their ids checked, as a dataset's
    for source, index in zip(sources, indexes):
        source.rows = counted_samples(source, len(index))
    if len(sources) > 1:
        check_ids([(s.spec, arrow_column(index, C.ID)) for s, index in zip(sources, indexes)], config.prefix_ids)
    return ShardData(sources, shards, C.CAPTIONS if lists else config.text_column, sum(s.rows for s in sources))


def shard_samples_index(source):
    """The index of a DATA argument's shards (vltool.io.shard_index: built once, one pass over the shards'
    headers and small members, then read from the cache): one row per sample with an image and a text.
    Shards whose samples repeat an id are refused, as a dataset whose ids repeat is (check_ids)."""
    path = shard_index(source.spec).path
    refuse_repeated_ids(source.spec, path)
    return read_from_disk(path, source.spec)


def refuse_repeated_ids(spec: str, index_path) -> None:
    """The rule of check_ids for shards: ids are unique. Their index keeps the first sample of a repeated id
    and counts the others (its vltool.json, stats.skipped), which a stream would train on too."""
    repeated = ((read_provenance(index_path) or {}).get("stats") or {}).get("skipped", {}).get(DUPLICATE_ID, 0)
    if repeated:
        raise UsageError(f"{spec!r} has duplicate ids ({repeated:,} samples repeat the id, json 'id' or key, of an earlier "
                         "one); ids must be unique")


def counted_samples(source, indexed: int) -> int:
    """The samples an epoch of `source` holds: the index's count. img2dataset's statistics files
    (`successes`), when every shard has one, are only compared with it: a disagreement is a warning."""
    if source.rows is not None and source.rows != indexed:
        warn(f"{source.spec}: img2dataset's statistics files (*_stats.json) count {source.rows:,} samples, but the shards "
             f"hold {indexed:,} with an image and a text; an epoch is the {indexed:,}")
    return indexed


def substreams(batch: int, workers: int) -> list[int]:
    """Rows each data stream of a process gives to its micro-batch: `batch` split over max(1, workers)
    streams, the first ones taking one more when it does not divide."""
    w = max(1, workers)
    return [batch // w + (1 if i < batch % w else 0) for i in range(w)]


class ShardStream(torch.utils.data.IterableDataset):
    """The sample stream of each data-loader worker, read from the shards: an IterableDataset yielding
    {"stream", "items", "position"} with `items` the next b items of the worker's stream.

    With `collate`, the b items are collated in the worker ("batch" in place of "items"): the trainer gives each
    worker b = the whole micro-batch, so a micro-batch is built where it is read (stream_micro_batches).

    There are S = processes x max(1, workers) streams; stream s = worker * processes + rank (stream_of). Epoch e of stream s
    reads the shards perm_e[s::S] (perm_e a permutation of all shards seeded by (seed, e)) through a
    shuffle buffer of `buffer` samples seeded by (seed, e, s); a stream goes on into the next epoch when
    its shards are read (streams end their epochs independently). An item's augmentation is seeded by
    (seed, epoch, shard, sample index in the shard). `starts[worker]` = (epoch, samples consumed in it)
    resumes a stream: the samples before are read again without being decoded.
    """

    def __init__(self, shards: Sequence, make_item, text_column: str, world: int, rank: int, sizes: Sequence[int], seed: int,
                 buffer: int, starts: dict | None = None, collate=None, rotate: int = 0):
        super().__init__()
        self.collate = collate  # set: each sub-batch is collated where it is read (the worker), not by the trainer
        self.rotate = rotate  # DataLoader worker w reads the stream of worker (w + rotate) mod W (a resume's turn)
        self.shards = [str(p) for p in shards]
        self.make_item, self.text_column = make_item, text_column
        self.world, self.rank, self.sizes, self.seed, self.buffer = world, rank, list(sizes), seed, buffer
        self.starts = dict(starts or {})
        self.damaged: set[int] = set()  # shards found unreadable part-way (warned about once per data stream)
        self.streams = world * len(self.sizes)
        if len(self.shards) < self.streams:
            raise UsageError(
                f"{len(self.shards)} shard(s) for {world} process(es) x {len(self.sizes)} data stream(s) each: every stream "
                "reads whole shards, so give at least as many shards as processes x max(1, --workers)")

    def stream_of(self, worker: int) -> int:
        """The data stream a worker of this process reads: worker-major, s = worker x processes + rank, so that
        the processes' micro-batches of one turn together are the streams one process with processes x W
        workers reads in that many turns."""
        return worker * self.world + self.rank

    def shard_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, 7919, epoch]).permutation(len(self.shards))

    def raw_samples(self, stream: int, epoch: int):
        """(shard index, index in the shard, key, files) of the stream's epoch, in shard order (unshuffled).
        A damaged shard is read up to the damage, with a warning; the stream reads on from its next shard
        (the same samples every time, so a resumed run still sees exactly the uninterrupted run's)."""
        for shard in self.shard_order(epoch)[stream :: self.streams]:
            j = 0
            try:
                for j, (key, files) in enumerate(iter_samples(self.shards[shard]), start=1):
                    yield int(shard), j - 1, key, files
            except (tarfile.TarError, OSError, EOFError) as e:
                if out_of_resources(e):  # the machine's limit (open files), not the shard's damage
                    raise
                if shard not in self.damaged:
                    self.damaged.add(shard)
                    print(f"warning: {self.shards[shard]}: unreadable after {j} sample(s) ({type(e).__name__}: {e}); "
                          "the rest of this shard is skipped", file=sys.stderr, flush=True)

    def samples(self, stream: int, epoch: int, skip: int = 0):
        """(epoch, samples of the epoch consumed so far, raw sample) for ever, from `skip` samples into `epoch`."""
        while True:
            rng = np.random.default_rng([self.seed, 7919, epoch, stream])
            buf: list = []
            n = 0
            for raw in self.raw_samples(stream, epoch):
                if len(buf) < self.buffer:
                    buf.append(raw)
                    continue
                j = int(rng.integers(self.buffer))
                out, buf[j] = buf[j], raw
                n += 1
                if n > skip:
                    yield epoch, n, out
            while buf:  # the epoch's end: the buffer drained in a random order
                j = int(rng.integers(len(buf)))
                buf[j], buf[-1] = buf[-1], buf[j]
                out = buf.pop()
                n += 1
                if n > skip:
                    yield epoch, n, out
            if n == 0:
                raise VltoolError(f"data stream {stream} read no sample from its shards in epoch {epoch}")
            epoch, skip = epoch + 1, 0

    def item(self, epoch: int, raw) -> dict:
        shard, j, key, files = raw
        image = sample_image(files)
        return self.make_item(epoch, shard << 32 | j, sample_id(key, files), sample_text(files, self.text_column),
                              {"bytes": image, "path": None} if image is not None else None)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = ((info.id if info is not None else 0) + self.rotate) % len(self.sizes)
        stream = self.stream_of(worker)
        epoch, skip = self.starts.get(worker, (0, 0))
        it = self.samples(stream, epoch, skip)
        b = self.sizes[worker]
        while True:
            items, position = [], None
            for _ in range(b):
                epoch, n, raw = next(it)
                items.append(self.item(epoch, raw))
                position = (epoch, n)
            if self.collate is None:
                yield {"stream": worker, "items": items, "position": position}
            else:  # one image tensor and one token tensor cross to the trainer, not a tensor per sample
                yield {"stream": worker, "batch": self.collate(items), "position": position}


def shard_batches(loader, collate: Collate, streams: int, positions: dict):
    """Micro-batches of a process from a ShardStream loader without `collate` (items): the next sub-batch of
    each of its `streams` streams (the loader takes its workers in turn), collated here in stream order.
    The trainer uses stream_micro_batches instead (whole micro-batches built in the workers). `positions`
    (stream -> (epoch, samples consumed)) is updated as each micro-batch is taken."""
    it = iter(loader)
    while True:
        subs = [next(it) for _ in range(streams)]
        assert [s["stream"] for s in subs] == list(range(streams)), "data-loader workers out of turn"
        batch = collate([x for s in subs for x in s["items"]])
        positions.update({s["stream"]: tuple(s["position"]) for s in subs})
        yield batch


def loader_options(workers: int, pin: bool) -> dict:
    """The DataLoader options of the trainer (both kinds of data): `workers` processes, 4 batches each ahead,
    each ending at once when it cannot send a batch (vltool.pretrain.workers: read them with `guarded`)."""
    return dict(num_workers=workers, pin_memory=pin, persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None,
                worker_init_fn=worker_init if workers > 0 else None)


def stream_micro_batches(stream: ShardStream, workers: int, pin: bool = False, positions: dict | None = None):
    """The trainer's micro-batches of a ShardStream built with `collate` and sizes [B] x W: micro-batch j of
    this process is the next B samples of worker (rotate + j) mod W, built and collated in that worker and
    received whole (one image tensor and one token tensor; pinned by the DataLoader with `pin`). `positions`
    receives each worker's stream position as its micro-batches are taken. The trainer does no per-sample
    work and no copy of its own. A worker that fails ends it with one VltoolError (vltool.pretrain.workers)."""
    loader = torch.utils.data.DataLoader(stream, batch_size=None, **loader_options(workers, pin))
    w = len(stream.sizes)
    positions = {} if positions is None else positions
    j = 0
    for sub in guarded(loader):
        expected = (stream.rotate + j) % w
        assert sub["stream"] == expected, f"data-loader worker {sub['stream']} out of turn (expected {expected})"
        positions[sub["stream"]] = tuple(sub["position"])
        j += 1
        yield sub["batch"]
