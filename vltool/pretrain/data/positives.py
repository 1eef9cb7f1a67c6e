"""--mined-positives: each training row's positives (the rows its `positives` ids name) by Arrow's lookup,
and the refusal of a listed id that names no row of the inputs."""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vltool import columns as C
from vltool.errors import UsageError
from vltool.io.digests import arrow_column, column_values


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
