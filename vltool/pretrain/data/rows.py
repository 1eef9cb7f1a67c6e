"""`TrainData`, the concatenated training rows, and `load_train_data`: the inputs loaded, their columns
checked, rows without text dropped (counted), mined positives attached; `rows_key`, which rows these are
for cache keys; `texts_of`, a row's texts."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vltool import columns as C
from vltool.checks import text_column
from vltool.derived import add_columns
from vltool.errors import UsageError
from vltool.io.digests import arrow_column, column_values
from vltool.io.loading import load_dataset
from vltool.pretrain.config import PretrainConfig
from vltool.pretrain.data.checks import _input_key, _read_verdict, _verdict_file, _write_verdict, check_rows, refuse_repeated_ids
from vltool.pretrain.data.positives import _positive_rows, refuse_unknown_positives


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
