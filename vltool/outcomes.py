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

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from vltool import columns as C
from vltool.errors import UsageError, VltoolError
from vltool.io.atomic import atomic_file
from vltool.io.digests import arrow_column, column_values
from vltool.metrics import (AveragePrecision, ClassificationItems, QueryRanks, Replicates, Resampling, RetrievalItems, far_side_share,
                            percentile_interval)

FORMAT = "vltool-examples/1"
MIN_SEEDS_RESAMPLED = 3  # paired_difference draws the seeds too from 3 seeds on; fewer: the interval is the test set's only
MAX_RESAMPLES = 80_000  # a borderline verdict draws more replicates, up to this many, before it is reported as borderline
BORDERLINE_SE = 2.0  # borderline: the bootstrap p-value within this many Monte Carlo standard errors of (1 - level) / 2


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

    values = column_values(ds, column)  # (whole column; iterating ds[column] formats row by row)
    missing = sum(v is None or (isinstance(v, str) and not v.strip()) for v in values)
    if missing:
        raise UsageError(f"--group-column {column!r}: {missing} selected rows of {spec!r} have no value; every row needs its group")
    if any(isinstance(v, (list, dict, tuple)) for v in values):
        raise UsageError(f"--group-column {column!r} must hold one value per row (a string or a number), not lists")
    return np.asarray([str(v) for v in values], dtype=str)


def example_ids(ds) -> np.ndarray:
    """Each selected row's id (N,) as text; "#<i>" when the data has no id column."""
    if C.ID in ds.column_names:  # slice by slice: no Python string of every row at once

        col, step = arrow_column(ds, C.ID), 1 << 16
        parts = [np.asarray([str(v) for v in col.slice(a, step).to_pylist()], dtype=str) for a in range(0, len(col), step)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype="<U1")  # (to the widest slice's width)
    return np.char.add("#", np.arange(len(ds)).astype(f"<U{len(str(max(len(ds) - 1, 0)))}"))


def base_arrays(task: str, kind: str, ids: np.ndarray, groups: np.ndarray | None, group_column: str | None) -> dict:
    ids = np.asarray(ids, dtype=str)
    return {
        "format": np.asarray(FORMAT), "task": np.asarray(task), "metric_kind": np.asarray(kind),
        "id": ids, "group": ids if groups is None else np.asarray(groups, dtype=str),
        "group_column": np.asarray(group_column or ""),
    }


def write_examples(path: str | Path, arrays: dict) -> Path:
    """Write the arrays as a compressed .npz, atomically (a temporary file, then a rename)."""
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
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:  # truncated, damaged
            raise VltoolError(f"{path}: not a per-example outcomes file, or damaged ({type(e).__name__}: {e})") from None
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
    groups = base.groups if base.group_column else None
    return Resampling.make(len(base), base.strata, groups)


def paired_difference(
    pairs: Sequence[tuple[Outcomes, Outcomes]],
    keys: Sequence[str],
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    max_boot: int = MAX_RESAMPLES,
) -> dict:
    """The paired bootstrap of (variant - baseline), pooled over seeds.

    pairs: one (variant, baseline) per seed; within a seed both on the same test examples. For each metric
    k the difference is D_k(w) = mean over seeds s of [metric_k(variant_s, w_s) - metric_k(baseline_s, w_s)].
    One resample draws whole groups of the union of the seeds' test examples and feeds each run the weights
    of its own examples (w_s), so both models of a seed, and every seed that tests a group, see the same
    draw. When every seed has the same test examples (the usual recipe) this is one draw over the shared
    test set, within classes when the groups nest in them. When the seeds test different examples (e.g.
    each seed holds out its own classes), the groups are drawn within the set of seeds that test them, so
    that every seed keeps its number of groups in every resample (and, when an example has the same class
    in every seed, within its class too). With MIN_SEEDS_RESAMPLED (3) seeds or more, each resample also
    draws the seeds with replacement (a hierarchical bootstrap: seed-to-seed variation, usually the larger
    part of the noise at 3 seeds, is inside the interval); with fewer, the interval is the test set's only,
    and the record says so. With seeds that agree exactly, drawing them changes nothing: the interval is
    the test-set-only one (the groups' draws come from the same generator either way). The interval is the
    percentile interval of D_k over the resamples; "differs" when it excludes 0.

    Monte Carlo error: the bootstrap p-value p (the share of replicates at or beyond 0, `far_side_share`)
    has the MC standard error sqrt(p (1 - p) / B). A verdict whose p lies within BORDERLINE_SE (2) of them
    of (1 - level) / 2 could flip with another draw of B replicates: that metric draws more replicates
    from the same generators (x4 at a time, the first B unchanged, up to `max_boot`) and, when it is still
    that close at `max_boot`, its verdict is "borderline". A metric settled at `n_boot` keeps the interval
    of its first `n_boot` replicates, so it is the same as without this step.
    Returns {"unit", "interval", "seeds_resampled", "resampling", "resamples", "seed", "level", "test_sets",
    "metrics": {k: {"delta", "ci_low", "ci_high", "differs", "verdict", "resamples", "ci_low_mc_se",
    "ci_high_mc_se", "p_value", "p_value_mc_se", "per_seed", "seed_sd"}}}.
    """
    if not pairs:
        raise ValueError("no (variant, baseline) pairs")
    aligned, plan, index, unit, shared = _paired_draw(pairs)
    first = aligned[0][1]
    keys = list(keys)
    resample_seeds = len(aligned) >= MIN_SEEDS_RESAMPLED
    diff, per_seed = _seed_differences(aligned, index, keys, resample_seeds, seed)
    point, seeds_point = diff(), per_seed()
    metrics = {}
    if n_boot > 0 and plan.n_items > 0:
        reps = Replicates(plan.n_items, diff, seed, plan, keys)
        for j, k in enumerate(keys):
            metrics[k] = _settled_entry(reps, j, n_boot, max(n_boot, max_boot), level, point[k], [float(x[k]) for x in seeds_point])
    else:
        metrics = {k: _paired_entry(point[k], percentile_interval(np.zeros(0), level), [float(x[k]) for x in seeds_point])
                   for k in keys}
    if first.kind == "retrieval":
        unit += ", each image with all its texts" if plan.grouped else " (with all its texts)"
    n_seeds = len(aligned)
    if resample_seeds:
        interval = f"test groups and seeds: each resample draws the {n_seeds} seeds with replacement and the test units"
    else:
        interval = f"test set only: {n_seeds} seed{'s' if n_seeds != 1 else ''}, fewer than {MIN_SEEDS_RESAMPLED}, are not resampled"
    return {
        "unit": unit,
        "interval": interval,
        "seeds_resampled": resample_seeds,
        "resampling": plan.record(first.group_column or None),
        "resamples": int(n_boot),
        "seed": int(seed),
        "level": level,
        "test_sets": "shared" if shared else "per seed",
        "metrics": metrics,
    }


def _paired_draw(pairs: Sequence[tuple[Outcomes, Outcomes]]) -> tuple:
    """Each seed's (variant, baseline) aligned on the same examples, and how one resample draws them:
    (aligned, plan, index, unit, shared) with index[s] seed s's positions in the draw (None: the shared set)."""
    aligned = [(v.aligned_to(b), b) for v, b in pairs]
    first = aligned[0][1]
    shared = all(len(b) == len(first) and set(b.ids.tolist()) == set(first.ids.tolist()) for _, b in aligned)
    if not shared:
        plan, index, unit = _union_resampling([b for _, b in aligned])
        return aligned, plan, index, unit, shared
    aligned = [(v.aligned_to(first), b.aligned_to(first)) for v, b in aligned]
    plan = resampling_of(first)
    return aligned, plan, [None] * len(aligned), plan.unit("image", first.group_column or None), shared


def _seed_differences(aligned, index, keys: list[str], resample_seeds: bool, seed: int):
    """diff(w): the mean over seeds of (variant - baseline) under test weights w, the seeds drawn with
    replacement in each replicate when `resample_seeds`; per_seed(w): each seed's differences."""
    stats = [(v.statistic(), b.statistic()) for v, b in aligned]
    n_seeds = len(aligned)
    seed_rng = np.random.default_rng([seed, 5])  # the seeds' draws; the test groups' come from bootstrap's own

    scales: list[dict] = []  # per seed, the larger |metric| of the two models (the last per_seed call's)

    def per_seed(w=None) -> list[dict]:
        out = []
        scales.clear()
        for (fv, fb), ix in zip(stats, index):
            ws = w if w is None or ix is None else w[ix]  # this seed's examples' weights
            mv, mb = fv(ws), fb(ws)
            scale = {k: max(1.0, abs(mv[k]), abs(mb[k])) for k in keys}
            scales.append(scale)
            out.append({k: exact_zero(mv[k] - mb[k], scale[k]) for k in keys})
        return out

    def diff(w=None):
        d = per_seed(w)
        sc = scales
        if w is not None and resample_seeds:  # a replicate draws the seeds too, with replacement
            drawn = seed_rng.integers(0, n_seeds, n_seeds)
            d, sc = [d[i] for i in drawn], [sc[i] for i in drawn]
        return {k: exact_zero(float(np.mean([x[k] for x in d])), max(x[k] for x in sc)) for k in keys}

    return diff, per_seed


TIE_RTOL = 1e-12  # a difference within this share of its metric's size is float rounding of an exact tie


def exact_zero(d: float, scale: float) -> float:
    """`d`, or 0.0 where it is a tie in count terms that floating point left at about 1e-17: the metrics are
    means of per-example outcomes (counts, ranks, their tie expectations), so two models' equal counts over
    the same examples give differences of exactly 0, but their sums in another order (the mean over seeds of
    +a and -a) leave a few ulps. Any real difference is a whole outcome over at most millions of examples,
    orders of magnitude above TIE_RTOL of the metric's size; rounding is below it. Compared with 0 (p-values,
    "excludes 0"), an exact tie is then a tie."""
    return 0.0 if abs(d) <= TIE_RTOL * scale else d


def _settled_entry(reps: Replicates, j: int, n_boot: int, max_boot: int, level: float, delta: float, by_seed: list[float]) -> dict:
    """Metric j's paired record from the first n_boot replicates, or more (x4 at a time, up to max_boot)
    while its verdict is borderline (`_paired_entry`)."""
    n = n_boot
    while True:
        col = reps.extend(n).rows(n)[:, j]
        e = _paired_entry(delta, percentile_interval(col, level), by_seed, far_side_share(col), level)
        if e["verdict"] != "borderline" or n >= max_boot:
            return e
        n = min(max_boot, 4 * n)


def _paired_entry(delta: float, iv, by_seed: list[float], p: tuple[float, float] = (float("nan"), float("nan")),
                  level: float = 0.95) -> dict:
    """One metric's paired record: Δ, its interval and verdict, the Monte Carlo error of its bounds and of
    its bootstrap p-value, each seed's difference and their sd. Verdict: "borderline" when the p-value is
    within BORDERLINE_SE MC standard errors of (1 - level) / 2, else "differs" when the interval excludes 0,
    else "within noise"."""
    lo, hi = iv.low, iv.high
    finite = np.isfinite(lo) and np.isfinite(hi)
    excludes = bool(finite and (lo > 0 or hi < 0))
    pv, pse = p
    borderline = bool(finite and np.isfinite(pv) and abs(pv - (1 - level) / 2) <= BORDERLINE_SE * pse)
    verdict = None if not finite else "borderline" if borderline else "differs" if excludes else "within noise"

    def num(x):
        return float(x) if finite and np.isfinite(x) else None

    return {
        "delta": delta,
        "ci_low": float(lo) if finite else None,
        "ci_high": float(hi) if finite else None,
        "differs": verdict == "differs",
        "verdict": verdict,
        "resamples": int(iv.replicates),
        "ci_low_mc_se": num(iv.low_mc_se),
        "ci_high_mc_se": num(iv.high_mc_se),
        "p_value": num(pv),
        "p_value_mc_se": num(pse),
        "per_seed": by_seed,
        "seed_sd": float(np.std(by_seed, ddof=1)) if len(by_seed) > 1 else None,
    }


def _union_resampling(bases: Sequence[Outcomes]) -> tuple:
    """The plan of one draw over the union of the seeds' test examples (paired_difference, seeds that test
    different examples): (plan, index, unit) with index[s] the union positions of seed s's examples in its
    own order. Strata: the set of seeds that test the example, and its class when every seed gives it the same."""
    col = bases[0].group_column
    for b in bases[1:]:
        if b.group_column != col or b.kind != bases[0].kind or b.task != bases[0].task:
            raise VltoolError(f"{b.path} and {bases[0].path} are not evaluated alike (task, --group-column); "
                              "a paired comparison over seeds needs the same evaluation")
    pos: dict = {}
    group, klass, member = [], [], []
    index = []
    for s, b in enumerate(bases):
        ix = np.empty(len(b), np.int64)
        cls = b.strata
        for i, (e, g) in enumerate(zip(b.ids.tolist(), b.groups.tolist())):
            j = pos.get(e)
            if j is None:
                j = pos[e] = len(group)
                group.append(g)
                klass.append(None if cls is None else int(cls[i]))
                member.append(0)
            elif group[j] != g:
                raise VltoolError(f"{b.path} puts example {e!r} in group {g!r}, another seed's run in {group[j]!r}; "
                                  "evaluate every seed with the same --group-column")
            elif klass[j] is not None and (cls is None or klass[j] != int(cls[i])):
                klass[j] = -1  # the seeds give it different classes: classes are not strata here
            member[j] |= 1 << s
            ix[i] = j
        index.append(ix)
    groups = np.asarray(group) if col else None
    # the set of seeds that test a unit is always a stratum (each seed keeps its number of units); its class
    # is one too when every seed gives it the same and each such stratum holds enough units to vary
    consistent = bases[0].strata is not None and -1 not in klass
    if consistent:
        labels = np.unique(np.asarray([f"{m}:{c}" for m, c in zip(member, klass)]), return_inverse=True)[1].reshape(-1)
        plan = Resampling.make(len(group), labels, groups)
        consistent = plan.stratified
    if not consistent:
        labels = np.unique(np.asarray([str(m) for m in member]), return_inverse=True)[1].reshape(-1)
        plan = Resampling.make(len(group), labels, groups, min_per_stratum=1)
    within = "within the set of seeds that test it" + (" and its class" if consistent else "")
    n = len(group)
    if plan.grouped:
        unit = f"{col} group ({plan.n_groups} groups of {n} images, the union of the seeds' test sets), "
        unit += within if plan.stratified else f"not stratified: {plan.spanning} groups span several strata"
    else:
        unit = f"image (the union of the seeds' test sets, {n} images), {within}"
    return plan, index, unit
