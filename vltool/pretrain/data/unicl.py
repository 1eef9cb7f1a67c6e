"""UniCL's training rows (--loss unicl): image-label rows (the class name as text, drawn into a template
per sample) and image-text rows, concatenated, each with its label."""

from __future__ import annotations

from typing import Sequence

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vltool import columns as C
from vltool.checks import has_text, text_column
from vltool.derived import add_columns
from vltool.errors import UsageError
from vltool.io.digests import arrow_column
from vltool.io.loading import load_dataset
from vltool.pretrain.config import PretrainConfig
from vltool.pretrain.data.checks import check_ids
from vltool.pretrain.data.rows import TrainData, rows_key
from vltool.templates import load_templates


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
