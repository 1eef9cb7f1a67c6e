"""Per-example outcomes of an evaluation, and the paired comparison of two models on the same examples.

`zeroshot`, `retrieve` and `probe` with `--out X.json` also write `X.examples.npz` (the results JSON names
it under "examples"): for every evaluated example its id, its group and the outcome from which each
metric of the JSON is recomputed exactly (docs/evaluation.md, "Per-example outcomes"). Format
"vltool-examples/1", a numpy .npz (`np.load(path)` reads it; no pickle):

    format        ()      "vltool-examples/1"
    task          ()      zeroshot | zeroshot-multilabel | retrieval | linear-probe
    metric_kind   ()      classification | map | retrieval: which arrays follow
    id            (N,)    the example's `id` (without an id column: "#<position among the selected rows>")
    group         (N,)    its --group-column value as text (without one: its id, each example its own group)
    group_column  ()      the column, "" without --group-column
  classification (zeroshot, probe clip-benchmark / santurkar / fff):
    class         (N,)    int, the true class
    greater       (S, N)  int, classes scoring above the true class (S: the probe's seeds; 1 for zeroshot)
    tied          (S, N)  int, other classes tied with it (ties are broken at random: the metrics are expectations)
    num_classes   ()      int; the rank of the true class is greater + 1 (+ tied / 2), top-k a hit when below k
  map (zeroshot on multi-label data, probe voc07-svm):
    scores        (N, C)  float64, the scores of the classes the mean AP is over
    targets       (N, C)  bool
    class         (N,)    int, the true class (single-label data only; the bootstrap's strata)
  retrieval (N images, T texts):
    i2t_greater, i2t_tied, i2t_tied_pos  (N,) int: per image query, wrong texts above / tied with its best
                  correct text, and its correct texts tied with it (its rank: greater + 1 + tied / (tied_pos + 1))
    text_owner    (T,)    int, the image (0..N-1) each text belongs to
    t2i_greater, t2i_tied  (T,) int: per text query, other images above / tied with its image
    recall_k      (K,)    int, the K of Recall@K

`paired_difference` is the report's comparison of a variant with the baseline (docs/evaluation.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from vltool.errors import UsageError, VltoolError

FORMAT = "vltool-examples/1"


def examples_path(json_path: str | Path) -> Path:
    """X.json -> X.examples.npz (beside it)."""
    p = Path(json_path)
    stem = p.name[: -len(".json")] if p.name.endswith(".json") else p.name
    return p.with_name(stem + ".examples.npz")


def read_groups(ds, column: str | None, spec: str = "the data") -> np.ndarray | None:
    """The --group-column values of the selected rows as text (N,), or None without the option."""
    if column is None:
        return None
    if column not in ds.column_names:
        raise UsageError(f"--group-column {column!r}: {spec!r} has no such column (it has: {', '.join(ds.column_names)})")
    from vltool.io import column_values

    values = column_values(ds, column)  # (whole column; iterating ds[column] formats row by row)
    missing = sum(v is None or (isinstance(v, str) and not v.strip()) for v in values)
    if missing:
        raise UsageError(f"--group-column {column!r}: {missing} selected rows of {spec!r} have no value; every row needs its group")
    if any(isinstance(v, (list, dict, tuple)) for v in values):
        raise UsageError(f"--group-column {column!r} must hold one value per row (a string or a number), not lists")
    return np.asarray([str(v) for v in values], dtype=str)


def example_ids(ds) -> np.ndarray:
    """Each selected row's id (N,) as text; "#<i>" when the data has no id column."""
    from vltool import columns as C

    if C.ID in ds.column_names:
        from vltool.io import column_values

        return np.asarray([str(v) for v in column_values(ds, C.ID)], dtype=str)
    return np.asarray([f"#{i}" for i in range(len(ds))], dtype=str)


def base_arrays(task: str, kind: str, ids: np.ndarray, groups: np.ndarray | None, group_column: str | None) -> dict:
    ids = np.asarray(ids, dtype=str)
    return {
        "format": np.asarray(FORMAT), "task": np.asarray(task), "metric_kind": np.asarray(kind),
        "id": ids, "group": ids if groups is None else np.asarray(groups, dtype=str),
        "group_column": np.asarray(group_column or ""),
    }


def write_examples(path: str | Path, arrays: dict) -> Path:
    """Write the arrays as a compressed .npz, atomically (a temporary file, then a rename)."""
    from vltool.io import atomic_file

    path = Path(path)
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
    return path


@dataclass
class Outcomes:
    """One evaluation's per-example outcomes (read from its .examples.npz)."""

    arrays: dict[str, np.ndarray]
    path: str = ""

    @classmethod
    def read(cls, path: str | Path) -> "Outcomes":
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise VltoolError(f"{path}: not a per-example outcomes file ({e})") from None
        fmt = str(arrays.get("format", ""))
        if fmt != FORMAT:
            raise VltoolError(f"{path}: format {fmt!r}, expected {FORMAT!r}")
        return cls(arrays, str(path))

    @property
    def task(self) -> str:
        return str(self.arrays["task"])

    @property
    def kind(self) -> str:
        return str(self.arrays["metric_kind"])

    @property
    def ids(self) -> np.ndarray:
        return self.arrays["id"]

    @property
    def groups(self) -> np.ndarray:
        return self.arrays["group"]

    @property
    def group_column(self) -> str:
        return str(self.arrays["group_column"])

    @property
    def strata(self) -> np.ndarray | None:
        """The class of each example for single-label data (the bootstrap's strata), else None."""
        return self.arrays.get("class")

    def __len__(self) -> int:
        return len(self.ids)

    def statistic(self) -> Callable[[np.ndarray | None], dict[str, float]]:
        """statistic(w): the metrics of the results JSON with example weights w (None: each once)."""
        from vltool.metrics import AveragePrecision, ClassificationItems, QueryRanks, RetrievalItems

        a = self.arrays
        if self.kind == "classification":
            items = [ClassificationItems.from_ranks(g, t, a["class"], int(a["num_classes"])) for g, t in zip(a["greater"], a["tied"])]

            def stat(w=None):
                vals = [it.metrics(w) for it in items]
                return {k: float(np.mean([v[k] for v in vals])) for k in vals[0]}

            return stat
        if self.kind == "map":
            ap = AveragePrecision(a["scores"], a["targets"])
            return lambda w=None: {"mAP": ap.mean(w)}
        if self.kind == "retrieval":
            n_i, n_t = len(a["i2t_greater"]), len(a["t2i_greater"])
            i2t = QueryRanks(a["i2t_greater"], a["i2t_tied"], a["i2t_tied_pos"], n_t, np.bincount(a["text_owner"], minlength=n_i))
            t2i = QueryRanks(a["t2i_greater"], a["t2i_tied"], np.ones(n_t, np.int64), n_i, np.ones(n_t, np.int64))
            items = RetrievalItems.from_ranks([int(k) for k in a["recall_k"]], i2t, t2i, a["text_owner"])
            return items.metrics
        raise VltoolError(f"{self.path}: unknown metric_kind {self.kind!r}")

    def aligned_to(self, base: "Outcomes") -> "Outcomes":
        """These outcomes in `base`'s example order (paired by id); an error when the examples differ."""
        if self.kind != base.kind or self.task != base.task:
            raise VltoolError(f"{self.path} ({self.task}) and {base.path} ({base.task}) are not the same kind of evaluation")
        if len(self.ids) == len(base.ids) and np.array_equal(self.ids, base.ids):
            out = self
        else:
            a, b = set(self.ids.tolist()), set(base.ids.tolist())
            if a != b or len(a) != len(self.ids) or len(b) != len(base.ids):
                only_a, only_b = sorted(a - b), sorted(b - a)
                example = f"e.g. {only_a[0]!r} only in the first" if only_a else f"e.g. {only_b[0]!r} only in the second" if only_b else "repeated ids"
                raise VltoolError(
                    f"the test examples differ: {self.path} has {len(self.ids)}, {base.path} has {len(base.ids)} ({example}); "
                    "a paired comparison needs the same examples (the same data and --where)"
                )
            out = self._reordered(base)
        if not np.array_equal(out.groups, base.groups) or out.group_column != base.group_column:
            raise VltoolError(
                f"{self.path} (--group-column {self.group_column or 'none'}) and {base.path} (--group-column "
                f"{base.group_column or 'none'}) group the examples differently; evaluate both with the same --group-column"
            )
        if out.kind == "retrieval" and not np.array_equal(out.arrays["text_owner"], base.arrays["text_owner"]):
            raise VltoolError(f"{self.path} and {base.path} have different texts (the same --text-column is needed)")
        if out.kind == "classification" and not np.array_equal(out.arrays["class"], base.arrays["class"]):
            raise VltoolError(f"{self.path} and {base.path} give the same examples different classes")
        return out

    def _reordered(self, base: "Outcomes") -> "Outcomes":
        pos = {v: i for i, v in enumerate(self.ids.tolist())}
        perm = np.asarray([pos[v] for v in base.ids.tolist()], dtype=np.int64)  # self index of base's i-th example
        a = dict(self.arrays)
        n = len(perm)
        for k in ("id", "group", "class", "scores", "targets", "i2t_greater", "i2t_tied", "i2t_tied_pos"):
            if k in a:
                a[k] = a[k][perm]
        for k in ("greater", "tied"):
            if k in a:
                a[k] = a[k][:, perm]
        if "text_owner" in a:  # texts follow their images, each image's texts in their own order
            inv = np.empty(n, np.int64)
            inv[perm] = np.arange(n)
            owner = inv[a["text_owner"]]
            t_order = np.argsort(owner, kind="stable")
            a["text_owner"] = owner[t_order]
            for k in ("t2i_greater", "t2i_tied"):
                a[k] = a[k][t_order]
        return Outcomes(a, self.path)


def resampling_of(base: Outcomes):
    """The bootstrap plan of a paired comparison: whole groups (when recorded), within classes when possible."""
    from vltool.metrics import Resampling

    groups = base.groups if base.group_column else None
    return Resampling.make(len(base), base.strata, groups)


def paired_difference(
    pairs: Sequence[tuple[Outcomes, Outcomes]],
    keys: Sequence[str],
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """The paired bootstrap of (variant - baseline), pooled over seeds.

    pairs: one (variant, baseline) per seed, all on the same test examples. For each metric k the
    difference is D_k(w) = mean over seeds s of [metric_k(variant_s, w) - metric_k(baseline_s, w)]; one
    resample draws whole groups (the same draw for every seed and both models: the test set is shared),
    within classes when the groups nest in them, and its w is fed to every model's metrics. The interval
    is the percentile interval of D_k over the resamples; "differs" when it excludes 0.
    Returns {"unit", "resampling", "seeds", "metrics": {k: {"delta", "ci_low", "ci_high", "differs"}}}.
    """
    from vltool.metrics import bootstrap

    if not pairs:
        raise ValueError("no (variant, baseline) pairs")
    base = pairs[0][1]
    aligned = [(v.aligned_to(base), b.aligned_to(base)) for v, b in pairs]
    stats = [(v.statistic(), b.statistic()) for v, b in aligned]
    keys = list(keys)

    def diff(w=None):
        out = {}
        per = [(fv(w), fb(w)) for fv, fb in stats]
        for k in keys:
            out[k] = float(np.mean([mv[k] - mb[k] for mv, mb in per]))
        return out

    point = diff()
    plan = resampling_of(base)
    iv = bootstrap(len(base), diff, n_boot, seed, level, resampling=plan)
    metrics = {}
    for k in keys:
        lo, hi = iv[k].low, iv[k].high
        finite = np.isfinite(lo) and np.isfinite(hi)
        metrics[k] = {
            "delta": point[k],
            "ci_low": float(lo) if finite else None,
            "ci_high": float(hi) if finite else None,
            "differs": bool(finite and (lo > 0 or hi < 0)),
        }
    unit = plan.unit("image", base.group_column or None)
    if base.kind == "retrieval":
        unit += ", each image with all its texts" if plan.grouped else " (with all its texts)"
    return {
        "unit": unit,
        "resampling": plan.record(base.group_column or None),
        "resamples": int(n_boot),
        "seed": int(seed),
        "level": level,
        "metrics": metrics,
    }
