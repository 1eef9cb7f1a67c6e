"""Checks every command shares on what it reads: the type of a text or image column, what counts as a
text, and results that would be meaningless (docs/conventions.md, "Bad input").

    text_column(ds, "caption", spec)          # a string column (or, with allow_list, a list of strings)
    image_column(ds, "image", spec)           # a datasets.Image column; path strings are named as such
    clean_text(value) / clean_texts(values)   # None, "" and whitespace are all "no text"
    require_unique_ids(ids, spec)             # an error naming a repeated id (ids identify rows)
    finite(x, "...")                          # an error instead of a NaN metric
    read_json(path, "...")                    # a JSON object a command reads (a model config, run.json):
                                              # unreadable or malformed is one line, not a traceback

A leaf module: it imports only vltool.errors (and `datasets`, and the leaf vltool.distinct, inside the functions).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from vltool.distinct import duplicate
from vltool.errors import UsageError, VltoolError

# datasets and pyarrow are imported inside the functions that use them: commands import this module (through
# vltool.deform and vltool.mine_positives) at their top, and `vltool --help` must not load them.

IMPORT_HINT = "make an image dataset from files with `vltool import` (e.g. a CSV with filepath and caption columns)"


def _is_string(feature) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _is_bytes(feature) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype in ("binary", "large_binary")


def _list_inner(feature):
    """The item feature of a list column (datasets.List / Sequence / LargeList / [feature]), else None."""
    import datasets

    if isinstance(feature, list) and len(feature) == 1:
        return feature[0]
    kinds = tuple(k for k in (getattr(datasets, "List", None), getattr(datasets, "LargeList", None), datasets.Sequence) if k is not None)
    if isinstance(feature, kinds):
        return feature.feature
    return None


def text_column(ds, column: str, what: str, *, option: str = "--text-column", allow_list: bool = False,
                list_only: bool = False, hint: str = "") -> bool:
    """Check that `column` of `ds` holds text: one string per row, or (allow_list) a list of strings, or
    (list_only) only lists of strings.

    Returns True for a list column. Bytes are refused (decode them to UTF-8 strings first): a caption is
    never written as b'...'. `what` names the dataset in the message; `hint` ends it (how to fix it).
    """
    if column not in ds.column_names:
        raise UsageError(f"{what!r} has no column {column!r} (it has: {', '.join(ds.column_names)})")
    feature = ds.features[column]
    inner = _list_inner(feature)
    if _is_string(feature):
        if list_only:
            raise UsageError(f"{option} {column!r} of {what!r} holds one string per row, not lists of strings{hint}")
        return False
    if inner is not None and _is_string(inner):
        if allow_list or list_only:
            return True
        raise UsageError(f"{option} {column!r} of {what!r} holds lists of texts, not one string per row{hint}")
    kinds = ("lists of strings" if list_only else "text (strings, or lists of strings)" if allow_list
             else "text (one string per row)")
    if _is_bytes(feature) or (inner is not None and _is_bytes(inner)):
        raise UsageError(f"{option} {column!r} of {what!r} holds bytes, not {kinds}; decode it to UTF-8 strings first")
    raise UsageError(f"{option} {column!r} of {what!r} is not a text column: it must hold {kinds}, not {_describe(feature)}{hint}")


def image_column(ds, column: str, what: str) -> None:
    """Check that `column` of `ds` is a datasets.Image column (path strings are named as such)."""
    import datasets

    if column not in ds.column_names:
        raise UsageError(f"{what!r} has no column {column!r} (it has: {', '.join(ds.column_names)})")
    feature = ds.features[column]
    if isinstance(feature, datasets.Image):
        return
    if _is_string(feature):
        raise UsageError(f"column {column!r} of {what!r} holds strings (file paths?), not images: it is not an image column; {IMPORT_HINT}")
    raise UsageError(f"column {column!r} of {what!r} is not an image column (it holds {_describe(feature)}); {IMPORT_HINT}")


def _describe(feature) -> str:
    import datasets

    if isinstance(feature, datasets.Value):
        return {"binary": "bytes", "large_binary": "bytes"}.get(feature.dtype, feature.dtype)
    inner = _list_inner(feature)
    if inner is not None:
        return f"lists of {_describe(inner)}"
    return type(feature).__name__


def clean_text(value: Any) -> str | None:
    """A text, or None when there is none: None, "" and whitespace-only strings all count as missing."""
    if isinstance(value, str) and value.strip():
        return value
    return None


def nonblank(strings):
    """(n,) bool numpy: clean_text's test on an Arrow string array (None and whitespace-only are blank)."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.not_equal(pc.utf8_trim_whitespace(strings), ""), False).to_numpy(zero_copy_only=False)


TEXT_SLICE_ROWS = 1 << 18  # rows per Arrow call of has_text (a saved image dataset has a record batch per 100 rows)


def has_text(column, lists: bool) -> np.ndarray:
    """(rows,) bool: the row has a text that is not blank (clean_text's test, on a whole Arrow column): a
    string, or a list with at least one such string. One Arrow call per TEXT_SLICE_ROWS rows, whatever
    their record batches (a Python call per batch was 2 s of start-up at 10M rows), and memory for that
    many rows' texts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(column, pa.ChunkedArray):
        column = pa.chunked_array([column])
    out = []
    for a in range(0, len(column), TEXT_SLICE_ROWS):
        part = column.slice(a, TEXT_SLICE_ROWS)
        if not lists:
            out.append(nonblank(part))
        else:
            part = part.combine_chunks()  # list_parent_indices counts from the start of one array
            parent = pc.list_parent_indices(part).to_numpy()
            out.append(np.bincount(parent[nonblank(pc.list_flatten(part))], minlength=len(part)) > 0)
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


def clean_texts(values: Iterable) -> list:
    """clean_text of each value; a list value (several texts of a row) keeps its real texts only."""
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.append([t for t in (clean_text(x) for x in v) if t is not None])
        else:
            out.append(clean_text(v))
    return out


def missing_text_warning(n_missing: int, n: int, column: str) -> str | None:
    """The one wording every command uses for rows without text (empty, whitespace-only or None)."""
    if n_missing == 0:
        return None
    return f"{n_missing} of {n} rows have no text in {column!r} (empty, whitespace or missing); they are left out"


def require_texts(n_with_text: int, n: int, column: str, what: str) -> None:
    """An error when no row has text: every caption empty gives no meaningful result."""
    if n_with_text == 0:
        raise UsageError(f"no row of {what!r} has text in {column!r} ({n} rows; every one is empty, whitespace or missing)")


def require_unique_ids(ids, what: str) -> None:
    """A usage error naming one repeated id when the Arrow id column `ids` of `what` holds a value twice: a
    row's id names it in `positives`, provenance and every later command (vltool.distinct: 8 bytes a row)."""
    repeated, an_id = duplicate(ids)
    if repeated:
        raise UsageError(f"{what!r} has duplicate ids (e.g. {an_id!r}); ids must be unique")


def finite(value: float | None, what: str) -> float | None:
    """`value`, or an error naming `what` when it is NaN or infinite (never a NaN in a result)."""
    if value is not None and not math.isfinite(float(value)):
        raise VltoolError(f"{what} is undefined ({value})")
    return value


def require_decoded(bad, what: str) -> None:
    """An error when not one image of `what` could be decoded (`bad`: the mask of undecodable images):
    every metric would be computed on zero rows."""
    n = len(bad)
    if n and int(sum(bool(b) for b in bad)) == n:
        raise VltoolError(
            f"none of the {n} images of {what!r} could be decoded (corrupt, missing files, or over the size limit); "
            "there is nothing to compute on"
        )


def read_json(path: Path | str, what: str, error: type[VltoolError] = VltoolError) -> dict:
    """The JSON object in `path`, or an error naming `what` (e.g. "the model config") when the file cannot
    be read, is not JSON, or holds something other than an object."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except OSError as e:
        raise error(f"cannot read {what} {path} ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{what} {path} is not valid JSON ({getattr(e, 'msg', e)}); is it damaged?") from None
    if not isinstance(obj, dict):
        raise error(f"{what} {path} holds a JSON {type(obj).__name__}, not an object; is it damaged?")
    return obj
