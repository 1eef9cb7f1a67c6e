"""`vltool split`: assign rows to named parts, whole groups at a time (e.g. aligned / unaligned halves).

The new column (default `part`) is then selected with `--where part=NAME` by every command. Groups
(`--by`, e.g. `base_id`) are shuffled with `--seed` and cut at the cumulative fractions, so near-duplicates
(an emoji and its skin tones) always land in the same part. Without `--by`, every row is its own group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vltool.errors import UsageError


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


def split(data: str, out, config: SplitConfig, *, where=(), split_name=None, overwrite: bool = False) -> dict:
    import datasets

    from vltool import columns as C
    from vltool import provenance
    from vltool.io import check_output, load_dataset, save_dataset

    timer = provenance.Timer()
    parts = config.parsed()
    src = load_dataset(data, split=split_name, where=where, required=[C.ID] + ([config.by] if config.by else []))
    out = check_output(out, overwrite, inputs=[*src.reads])
    ds = src.dataset
    groups = ds[config.by] if config.by else ds[C.ID]
    assigned = assign_parts(list(groups), parts, config.seed)
    if config.part_column in ds.column_names:
        if config.part_column in (C.ID, config.by) or not config.replace_column:
            why = ("it is the rows' id" if config.part_column == C.ID else "it is the --by column" if config.part_column == config.by
                   else "pass --replace-column to replace it")
            raise UsageError(f"--part-column {config.part_column!r}: {data!r} already has a column {config.part_column!r} ({why}); "
                             "name a new column, e.g. --part-column part")
        ds = ds.remove_columns([config.part_column])
    ds = ds.add_column(config.part_column, assigned, feature=datasets.Value("string"))
    counts = {n: assigned.count(n) for n, _ in parts}
    stats = {"rows": counts, "groups": len(set(map(str, groups))), "by": config.by, "column": config.part_column}
    prov = provenance.make("split", config, [src], rows_in=src.rows, rows_out=len(ds), stats=stats, timer=timer)
    if not config.separate:
        save_dataset(ds, out, prov, overwrite=overwrite)
        return prov
    from vltool.io import atomic_output, write_json_atomic

    with atomic_output(out, overwrite) as tmp:  # OUT/<name>: one dataset per part
        for name, _ in parts:
            idx = [i for i, p in enumerate(assigned) if p == name]
            ds.select(idx).save_to_disk(str(tmp / name))
            write_json_atomic(tmp / name / C.PROVENANCE_FILE, prov | {"part": name, "rows_out": len(idx)})
        write_json_atomic(tmp / C.PROVENANCE_FILE, prov)
    return prov
