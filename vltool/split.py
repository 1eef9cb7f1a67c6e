"""`vltool split`: assign rows to named parts, whole groups at a time (e.g. aligned / unaligned halves).

The new column (default `part`) is then selected with `--where part=NAME` by every command. Groups
(`--by`, e.g. `base_id`) are shuffled with `--seed` and cut at the cumulative fractions, so near-duplicates
(an emoji and its skin tones) always land in the same part. Without `--by`, every row is its own group.
"""

from __future__ import annotations

from dataclasses import dataclass

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vltool import columns as C
from vltool import provenance
from vltool.derived import add_columns
from vltool.errors import UsageError
from vltool.io.atomic import atomic_output, save_dataset, write_json_atomic
from vltool.io.digests import arrow_column
from vltool.io.loading import load_dataset
from vltool.io.outputs import check_output


@dataclass
class SplitConfig:
    """Options of `vltool split`, one field per option of the same name (help: `vltool split --help`)."""

    parts: str = "a=0.5,b=0.5"
    by: str | None = None
    part_column: str = "part"
    seed: int = 0
    separate: bool = False
    replace_column: bool = False  # --part-column may name an existing column only with this

    def parsed(self) -> list[tuple[str, float]]:
        out = []
        for item in self.parts.split(","):
            name, _, frac = item.partition("=")
            try:
                out.append((name.strip(), float(frac)))
            except ValueError:
                raise UsageError(f"--parts {self.parts!r}: expected NAME=FRACTION,... e.g. aligned=0.5,unaligned=0.5") from None
        names = [n for n, _ in out]
        if len(out) < 2 or any(not n for n in names) or len(set(names)) != len(names):
            raise UsageError(f"--parts {self.parts!r}: give two or more distinct NAME=FRACTION items")
        if any(f <= 0 for _, f in out) or abs(sum(f for _, f in out) - 1) > 1e-6:
            raise UsageError(f"--parts {self.parts!r}: fractions must be positive and sum to 1")
        return out


def assign_parts(groups: list, parts: list[tuple[str, float]], seed: int) -> list[str]:
    """The part of each row: shuffled distinct groups, cut at round(cumulative fraction x groups)."""
    uniq = sorted(set(map(str, groups)))
    order = np.random.default_rng(seed).permutation(len(uniq))
    cuts = np.round(np.cumsum([f for _, f in parts]) * len(uniq)).astype(int)
    part_of = {}
    start = 0
    for (name, _), end in zip(parts, cuts):
        for k in order[start:end]:
            part_of[uniq[k]] = name
        start = end
    return [part_of[str(g)] for g in groups]


def assign_column(column, parts: list[tuple[str, float]], seed: int) -> tuple[np.ndarray, int]:
    """`assign_parts` on an Arrow column, by whole-column work: (rows,) int64, the index in `parts` of each
    row's part, and the number of groups. Python objects are made only for the distinct values of a column
    that is not text (a text column's values sort in Arrow: UTF-8 byte order is Python's code point order)."""
    text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
    if text:  # str(None) == "None": a missing value is the group "None", as assign_parts has it
        column = pc.fill_null(column, "None")
    values = pc.unique(column)  # (V,) distinct values
    if text:
        n_groups = len(values)
        rank = np.empty(n_groups, dtype=np.int64)  # (V,) each value's place among the sorted groups
        rank[pc.sort_indices(values).to_numpy()] = np.arange(n_groups)
    else:  # grouped by str(value), as assign_parts does
        names = [str(v) for v in values.to_pylist()]
        uniq = {name: k for k, name in enumerate(sorted(set(names)))}
        n_groups, rank = len(uniq), np.array([uniq[name] for name in names], dtype=np.int64)
    order = np.random.default_rng(seed).permutation(n_groups)  # assign_parts' shuffle of the sorted groups
    cuts = np.round(np.cumsum([f for _, f in parts]) * n_groups).astype(int)
    part_of_rank = np.empty(n_groups, dtype=np.int64)  # (G,) the part of each group, in sorted order
    for p, (start, end) in enumerate(zip([0, *cuts[:-1]], cuts)):
        part_of_rank[order[start:end]] = p
    where = pc.index_in(column, value_set=values).to_numpy(zero_copy_only=False)  # (rows,) each row's value
    return part_of_rank[rank][where], n_groups


def split(data: str, out, config: SplitConfig, *, where=(), split_name=None, overwrite: bool = False) -> dict:
    timer = provenance.Timer()
    parts = config.parsed()
    src = load_dataset(data, split=split_name, where=where, required=[C.ID] + ([config.by] if config.by else []))
    out = check_output(out, overwrite, inputs=[*src.reads])
    ds = src.dataset

    groups = arrow_column(ds, config.by or C.ID)
    part, n_groups = assign_column(groups, parts, config.seed)  # (rows,) index into parts
    if config.part_column in ds.column_names:
        if config.part_column in (C.ID, config.by) or not config.replace_column:
            why = ("it is the rows' id" if config.part_column == C.ID else "it is the --by column" if config.part_column == config.by
                   else "pass --replace-column to replace it")
            raise UsageError(f"--part-column {config.part_column!r}: {data!r} already has a column {config.part_column!r} ({why}); "
                             "name a new column, e.g. --part-column part")
    # the input's table with the part column beside it (replacing one of that name): add_column on a --where
    # selection would write every selected row anew, images included (vltool.derived)

    names = pa.array([n for n, _ in parts], pa.string())
    ds = add_columns(ds, {config.part_column: names.take(pa.array(part))}, features={config.part_column: datasets.Value("string")},
                     key=repr(("split", parts, config.seed, config.by)).encode())
    sizes = np.bincount(part, minlength=len(parts))
    counts = {n: int(sizes[k]) for k, (n, _) in enumerate(parts)}
    stats = {"rows": counts, "groups": n_groups, "by": config.by, "column": config.part_column}
    prov = provenance.make("split", config, [src], rows_in=src.rows, rows_out=len(ds), stats=stats, timer=timer)
    if not config.separate:
        save_dataset(ds, out, prov, overwrite=overwrite)
        return prov

    with atomic_output(out, overwrite) as tmp:  # OUT/<name>: one dataset per part
        for k, (name, _) in enumerate(parts):
            idx = np.flatnonzero(part == k)
            ds.select(idx).save_to_disk(str(tmp / name))
            write_json_atomic(tmp / name / C.PROVENANCE_FILE, prov | {"part": name, "rows_out": len(idx)})
        write_json_atomic(tmp / C.PROVENANCE_FILE, prov)
    return prov
