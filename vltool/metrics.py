"""Evaluation metrics, their bootstrap intervals and their chance levels (docs/evaluation.md).

Definitions follow CLIP_benchmark (`clip_benchmark.metrics`), the field's reference:
- top-k accuracy: the true class is among the k highest scores;
- mean per-class recall: scikit-learn's `balanced_accuracy_score` of the arg-max prediction (the mean, over
  the classes present in the targets, of the fraction of their items predicted right);
- mean average precision (multi-label): the mean over classes of the average precision, precision at each
  positive's rank averaged over the positives;
- retrieval Recall@K: a query is a hit when at least one of its correct items is among the K best
  (CLIP_benchmark's `recall_at_k(...) > 0`); the metric is the fraction of queries that are hits.

Ranks are found by counting, never by sorting: for each query, `greater` = how many wrong items score
above its best correct item, `tied` = how many wrong items score the same. Ties are broken uniformly at
random and a metric is its expectation over that draw, so a model whose scores are all equal sits at
chance level instead of scoring 100% (with no ties this is exactly CLIP_benchmark's number). Scores are
computed in float64 from the float32 embeddings, so the score of one pair is the same (to ~1e-15) in
every product it takes part in; two scores within `TIE_TOL` are tied.

Average precision is scikit-learn's `average_precision_score` definition (tied scores form one threshold);
without ties it equals CLIP_benchmark's. Classes with no positive item are left out of the mean.

Bootstrap: resample the evaluated units with replacement, recompute every metric, report the 2.5th and
97.5th percentiles (`bootstrap`). A replicate is a weight vector (how often each item was drawn), so no
metric needs the resampled data copied. The unit is the item (image), or with groups (`Resampling`) a
whole group of items (near-duplicates such as the skin tones of one emoji): an item's weight is then the
number of times its group was drawn, and every metric works unchanged.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from vltool.errors import UsageError

TIE_TOL = 1e-10  # |a - b| <= TIE_TOL is a tie; float64 scores of unit vectors are accurate to ~1e-15
DEFAULT_BLOCK_BYTES = 64 * 2**20  # size of one block of scores in the chunked retrieval loop
CPU_BLOCK = (1024, 1024)  # the largest block (images x texts) torch's ranking pass uses on a CPU


# ----------------------------------------------------------------------------------------------------
# Ties
# ----------------------------------------------------------------------------------------------------

_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])  # (scipy.special.gammaln costs 0.6 s to import)


def gammaln(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return _lgamma(x) if x.size else x


def hit_probability(greater: np.ndarray, tied: np.ndarray, k: int, tied_pos: np.ndarray | int = 1) -> np.ndarray:
    """P(a correct item is in the top k) when ties are broken uniformly at random.

    greater: wrong items above the best correct item; tied: wrong items tied with it; tied_pos (>= 1):
    correct items tied with it, itself included. With m = k - greater free places, the tie block of
    tied + tied_pos items fills them in random order: P(miss) = C(tied, m) / C(tied + tied_pos, m).
    """
    g = np.asarray(greater, dtype=np.float64)
    t = np.asarray(tied, dtype=np.float64)
    p = np.broadcast_to(np.asarray(tied_pos, dtype=np.float64), g.shape)
    m = k - g
    out = np.zeros(g.shape, dtype=np.float64)
    full = m > t  # more free places than wrong tied items: a correct one is always in
    out[full] = 1.0
    part = (m >= 1) & ~full
    if part.any():
        mm, tt, pp = m[part], t[part], p[part]
        log_miss = gammaln(tt + 1) - gammaln(tt - mm + 1) - gammaln(tt + pp + 1) + gammaln(tt + pp - mm + 1)
        out[part] = 1.0 - np.exp(log_miss)
    return out


def expected_rank(greater: np.ndarray, tied: np.ndarray, tied_pos: np.ndarray | int = 1) -> np.ndarray:
    """Expected 1-based rank of the first correct item under random tie-breaking."""
    g = np.asarray(greater, dtype=np.float64)
    return g + 1.0 + np.asarray(tied, dtype=np.float64) / (np.asarray(tied_pos, dtype=np.float64) + 1.0)


# ----------------------------------------------------------------------------------------------------
# Classification
# ----------------------------------------------------------------------------------------------------


def finite_scores(scores: np.ndarray) -> np.ndarray:
    """float64 scores with NaN (a diverged classifier) as the lowest score: NaNs tie, they never win."""
    s = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(s).all():
        s = np.nan_to_num(s, nan=-1e300, posinf=1e300, neginf=-1e300)
    return s


def class_ranks(scores: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scores (N, C), target (N,) -> greater (N,), tied (N,): classes above / tied with the true class."""
    s = finite_scores(scores)
    true = s[np.arange(len(s)), target][:, None]  # (N, 1)
    greater = (s > true + TIE_TOL).sum(axis=1)
    tied = (np.abs(s - true) <= TIE_TOL).sum(axis=1) - 1
    return greater, tied


@dataclass
class ClassificationItems:
    """Per-item values from which every single-label metric (and its bootstrap) is computed."""

    target: np.ndarray  # (N,) int
    top1: np.ndarray  # (N,) P(hit) at k=1
    top5: np.ndarray | None  # (N,) P(hit) at k=5; None with fewer than 5 classes
    rank: np.ndarray  # (N,) expected rank of the true class
    num_classes: int

    greater: np.ndarray | None = None  # (N,) classes scoring above the true class (the per-example outcome kept)
    tied: np.ndarray | None = None  # (N,) other classes tied with it

    @classmethod
    def from_scores(cls, scores: np.ndarray, target: np.ndarray, num_classes: int | None = None) -> "ClassificationItems":
        scores = np.asarray(scores)
        c = int(num_classes if num_classes is not None else scores.shape[1])
        greater, tied = class_ranks(scores, np.asarray(target, dtype=np.int64))
        return cls.from_ranks(greater, tied, target, c)

    @classmethod
    def from_ranks(cls, greater: np.ndarray, tied: np.ndarray, target: np.ndarray, num_classes: int) -> "ClassificationItems":
        """From each item's count of classes above / tied with its true class (what a per-example file keeps)."""
        greater = np.asarray(greater, dtype=np.int64)
        tied = np.asarray(tied, dtype=np.int64)
        c = int(num_classes)
        top5 = hit_probability(greater, tied, 5) if c >= 5 else None
        return cls(np.asarray(target, dtype=np.int64), hit_probability(greater, tied, 1), top5, expected_rank(greater, tied), c, greater, tied)

    def metrics(self, w: np.ndarray | None = None) -> dict[str, float]:
        """CLASSIFICATION_METRICS on the items weighted by `w` (counts of a bootstrap draw; None = each once)."""
        w = np.ones(len(self.target)) if w is None else np.asarray(w, dtype=np.float64)
        iw = ItemWeights(w, w.sum())
        return {m.name: m.value(self, iw, None) for m in CLASSIFICATION_METRICS if m.applies(self)}


def mean_per_class_recall(hit: np.ndarray, target: np.ndarray, num_classes: int, w: np.ndarray | None = None) -> float:
    """Mean over the classes present of the mean hit of their items (scikit-learn's balanced accuracy).

    With bootstrap weights `w` the replicate estimates the same quantity: balanced accuracy is the accuracy
    with each item weighted 1 / n_c, n_c its class's count in the data (scikit-learn computes it so), and a
    replicate keeps those weights, fixed by the data, and draws the items: sum(w u hit) / sum(w u), u = 1 /
    n_c. Each class then counts in proportion to how often its items were drawn, n*_c / n_c, whose
    expectation is 1 for every class: a class absent from a replicate (n*_c = 0, frequent for a class of
    one or two base_id groups) weighs 0 there, and twice in another. Averaging the recalls of the classes
    present with equal weights instead drops a class whenever it is absent, so small classes count less
    than in the estimate and the replicates are biased towards the large classes' recall (an interval that
    can exclude its own estimate, issue 42). When every class keeps its count (a stratified resample) both
    are the same number, computed the same way."""
    n0 = np.bincount(target, minlength=num_classes).astype(np.float64)
    n_c = n0 if w is None else np.bincount(target, weights=w, minlength=num_classes)
    if w is None or np.array_equal(n_c, n0):
        wt = np.ones(len(target)) if w is None else w
        h_c = np.bincount(target, weights=wt * hit, minlength=num_classes)
        present = n_c > 0
        return float(np.mean(h_c[present] / n_c[present])) if present.any() else float("nan")
    u = np.asarray(w, dtype=np.float64) / n0[target]  # (the items' classes are all present in the data: n0 >= 1)
    total = u.sum()
    return float(u @ hit / total) if total > 0 else float("nan")


def per_class_recall(hit: np.ndarray, target: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(recall (C,) with NaN for absent classes, support (C,))."""
    n_c = np.bincount(target, minlength=num_classes).astype(np.float64)
    h_c = np.bincount(target, weights=hit, minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_c > 0, h_c / np.maximum(n_c, 1), np.nan), n_c.astype(np.int64)


class AveragePrecision:
    """Per-class average precision of scores (N, C) against binary targets (N, C), for any item weights.

    scikit-learn's definition: AP = sum over thresholds of (recall increase) x precision, where tied scores
    form one threshold. With weights w (bootstrap counts), an item drawn w times counts w times; its copies
    are tied with each other, so they share one threshold, as they would in the resampled data.
    """

    def __init__(self, scores: np.ndarray, targets: np.ndarray):
        s = finite_scores(scores)
        y = np.asarray(targets).astype(bool)
        self.n, self.c = s.shape
        self.order = np.argsort(-s, axis=0, kind="stable")  # (N, C) item indices, best first
        s_sorted = np.take_along_axis(s, self.order, axis=0)
        self.y_sorted = np.take_along_axis(y, self.order, axis=0)
        # end[i, c]: the last position of the tie group position i belongs to
        new_group_next = np.ones_like(s_sorted, dtype=bool)
        new_group_next[:-1] = (s_sorted[:-1] - s_sorted[1:]) > TIE_TOL
        idx = np.where(new_group_next, np.arange(self.n)[:, None], self.n)
        self.end = np.minimum.accumulate(idx[::-1], axis=0)[::-1]
        self.has_pos = y.any(axis=0)

    def per_class(self, w: np.ndarray | None = None) -> np.ndarray:
        """(C,) AP; NaN for classes with no positive (weighted) item."""
        if w is None:
            ws = np.ones((self.n, self.c))
        else:
            ws = np.asarray(w, dtype=np.float64)[self.order]  # (N, C)
        pos = ws * self.y_sorted
        cum_w = np.take_along_axis(np.cumsum(ws, axis=0), self.end, axis=0)
        cum_p = np.take_along_axis(np.cumsum(pos, axis=0), self.end, axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            prec = np.where(cum_w > 0, cum_p / np.where(cum_w > 0, cum_w, 1), 0.0)
            total = pos.sum(axis=0)
            ap = (pos * prec).sum(axis=0) / total
        return np.where(total > 0, ap, np.nan)

    def mean(self, w: np.ndarray | None = None) -> float:
        ap = self.per_class(w)
        return float(np.nanmean(ap)) if np.isfinite(ap).any() else float("nan")


# ----------------------------------------------------------------------------------------------------
# Retrieval
# ----------------------------------------------------------------------------------------------------


@dataclass
class QueryRanks:
    """Per query: wrong items above the best correct item, wrong items tied with it, correct items tied."""

    greater: np.ndarray  # (Q,) int64
    tied: np.ndarray  # (Q,) int64
    tied_pos: np.ndarray  # (Q,) int64, >= 1
    n_candidates: int
    n_positives: np.ndarray  # (Q,) correct items of each query

    def hits(self, k: int) -> np.ndarray:
        return hit_probability(self.greater, self.tied, k, self.tied_pos)

    def rank(self) -> np.ndarray:
        return expected_rank(self.greater, self.tied, self.tied_pos)


def retrieval_ranks(
    images: np.ndarray,
    texts: np.ndarray,
    owner: np.ndarray,
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Callable[[int], None] | None = None,
    exact: bool = False,
    device="cpu",
) -> tuple[QueryRanks, QueryRanks]:
    """Counting ranks for image->text and text->image retrieval in one pass over blocks of scores.

    images (N_i, D), texts (N_t, D) float32, owner (N_t,) the image of each text: text t is the correct match
    of image owner[t] and of no other. Scores are computed block by block (a block of images x a block of
    texts, about `block_bytes`); the full (N_i, N_t) matrix never exists. Each block updates both directions:
    - image i: texts of other images scoring above / tied with i's best caption;
    - text t: images other than owner[t] scoring above / tied with its image.

    Every comparison is decided on float64 scores. The block product runs in float32 (twice as fast); a
    score within `delta` of the threshold it is compared with, where `delta` bounds the float32 rounding
    error of a D-term dot product (2 D 2^-24 |a| |b|), is recomputed exactly in float64. `exact=True` (and
    any block where more than 2% of the scores need it) computes the whole block in float64 instead.

    `device` (a torch device: the CPU, or the GPU the model encoded on): the float32 blocks and their
    counting run there in torch (full float32 matmuls: TF32 is turned off for them, so the same error bound
    holds), and the few near-threshold scores are redone in float64 on the CPU as above. On a CPU the
    blocks are at most `CPU_BLOCK` (they stay in cache: larger ones are slower). None: the same pass in
    plain numpy, the reference the torch one is tested against (the same counts, exactly).
    """
    images = np.ascontiguousarray(images, dtype=np.float32)
    texts = np.ascontiguousarray(texts, dtype=np.float32)
    owner = np.asarray(owner, dtype=np.int64)
    n_i, n_t = len(images), len(texts)
    if n_t and (owner.min() < 0 or owner.max() >= n_i):
        raise ValueError("owner holds an image index out of range")
    n_pos = np.bincount(owner, minlength=n_i)
    if (n_pos == 0).any():
        raise ValueError("every image needs at least one text")
    # the score of each correct pair, and of each image's best caption (float64)
    pos = np.concatenate([  # (N_t,), in chunks: no float64 copy of all the texts
        np.einsum("td,td->t", texts[a : a + 8192].astype(np.float64), images[owner[a : a + 8192]].astype(np.float64))
        for a in range(0, n_t, 8192)
    ]) if n_t else np.zeros(0)
    best = np.full(n_i, -np.inf)
    np.maximum.at(best, owner, pos)
    img_tied_pos = np.bincount(owner, weights=(np.abs(pos - best[owner]) <= TIE_TOL), minlength=n_i).astype(np.int64)

    counts = _BlockCounts(n_i, n_t)
    cells = max(1, block_bytes // 8)  # a float32 block and its float32 mask (or one float64 block)
    if device is not None and not exact and str(device).startswith("cpu"):
        cells = min(cells, CPU_BLOCK[0] * CPU_BLOCK[1])
    bt = int(min(n_t, max(1024, math.isqrt(cells)), 1 << 23))  # (torch's counts are float32 sums: exact below 2^24)
    bi = int(max(1, min(n_i, cells // max(bt, 1), 1 << 23)))
    d = images.shape[1]
    norm = float(np.linalg.norm(images, axis=1).max(initial=0) * np.linalg.norm(texts, axis=1).max(initial=0))
    delta = 2 * d * 2.0**-24 * norm + 1e-6
    block32 = _block_float32 if device is None or exact else _TorchBlocks(images, texts, best, pos, delta, device)
    with _full_float32(device):
        for a in range(0, n_t, bt):
            b = min(n_t, a + bt)
            for c in range(0, n_i, bi):
                e = min(n_i, c + bi)
                if exact or not block32(images, texts, c, e, a, b, best, pos, delta, counts):
                    _block_float64(images, texts, c, e, a, b, best, pos, counts)
            if block32 is not _block_float32:
                block32.flush(images, texts, best, pos, counts)  # the counts are whole at each progress step
            if progress is not None:
                progress(b - a)
    # an image's own captions score at most its best (none above, img_tied_pos tied);
    # a text's own image scores pos (tied with itself).
    i2t = QueryRanks(counts.i_gt, counts.i_eq - img_tied_pos, img_tied_pos, n_t, n_pos)
    t2i = QueryRanks(counts.t_gt, counts.t_eq - 1, np.ones(n_t, np.int64), n_i, np.ones(n_t, np.int64))
    return i2t, t2i


class _BlockCounts:
    """Per image / per text: wrong-or-own items above the threshold (gt) and within TIE_TOL of it (eq)."""

    def __init__(self, n_i: int, n_t: int):
        self.i_gt = np.zeros(n_i, np.int64)
        self.i_eq = np.zeros(n_i, np.int64)
        self.t_gt = np.zeros(n_t, np.int64)
        self.t_eq = np.zeros(n_t, np.int64)


def _block_float64(images, texts, c, e, a, b, best, pos, counts: _BlockCounts) -> None:
    s = images[c:e].astype(np.float64) @ texts[a:b].astype(np.float64).T  # (bi, bt) image x text
    bst = best[c:e, None]
    counts.i_gt[c:e] += (s > bst + TIE_TOL).sum(axis=1)
    counts.i_eq[c:e] += (np.abs(s - bst) <= TIE_TOL).sum(axis=1)
    tp = pos[None, a:b]
    counts.t_gt[a:b] += (s > tp + TIE_TOL).sum(axis=0)
    counts.t_eq[a:b] += (np.abs(s - tp) <= TIE_TOL).sum(axis=0)


def _block_float32(images, texts, c, e, a, b, best, pos, delta, counts: _BlockCounts) -> bool:
    """float32 block, near-threshold scores redone in float64; False (nothing counted) when too many are near."""
    s = images[c:e] @ texts[a:b].T  # (bi, bt) float32 scores, image x text
    lo_i = (best[c:e] - delta).astype(np.float32)[:, None]
    hi_i = (best[c:e] + delta).astype(np.float32)[:, None]
    lo_t = (pos[a:b] - delta).astype(np.float32)[None, :]
    hi_t = (pos[a:b] + delta).astype(np.float32)[None, :]
    above_i, ge_i = s > hi_i, s >= lo_i
    above_t, ge_t = s > hi_t, s >= lo_t
    n_above_i, n_above_t = np.count_nonzero(above_i, axis=1), np.count_nonzero(above_t, axis=0)
    n_near_i = int(np.count_nonzero(ge_i)) - int(n_above_i.sum())
    n_near_t = int(np.count_nonzero(ge_t)) - int(n_above_t.sum())
    if n_near_i + n_near_t > 0.02 * s.size + 2 * (b - a):
        return False
    counts.i_gt[c:e] += n_above_i
    counts.t_gt[a:b] += n_above_t
    near_i = ge_i & ~above_i if n_near_i else None
    near_t = ge_t & ~above_t if n_near_t else None
    for near, n_near, side in ((near_i, n_near_i, "i"), (near_t, n_near_t, "t")):
        if n_near:
            r, t = np.nonzero(near)
            _near_exact(images, texts, r + c, t + a, side, best, pos, counts)
    return True


def _near_exact(images, texts, r, t, side: str, best, pos, counts: _BlockCounts) -> None:
    """Count the pairs (image r[k], text t[k]) whose float32 score was too near its threshold, on float64
    scores: for image r's side (side "i", threshold best[r]) or text t's (side "t", threshold pos[t])."""
    exact = np.einsum("kd,kd->k", images[r].astype(np.float64), texts[t].astype(np.float64))
    if side == "i":
        thr, idx, gt, eq = best[r], r, counts.i_gt, counts.i_eq
    else:
        thr, idx, gt, eq = pos[t], t, counts.t_gt, counts.t_eq
    np.add.at(gt, idx[exact > thr + TIE_TOL], 1)  # (not a bincount over all N: this runs once a block)
    np.add.at(eq, idx[np.abs(exact - thr) <= TIE_TOL], 1)


class _TorchBlocks:
    """`_block_float32` in torch on `device` (the CPU's cores or a GPU); the embeddings and thresholds are
    moved there once.

    Each side's counts are sums of 0/1 float32 masks (exact: a block is far narrower than 2^24), which
    vectorise where summing booleans does not. The near-threshold pairs are looked for only in the rows /
    columns whose counts say they hold one, and are redone in float64 a batch of blocks at a time
    (`flush`): per-block work of a few operations, not a few dozen.
    """

    FLUSH_PAIRS = 1 << 16  # near pairs held before they are redone in float64

    def __init__(self, images, texts, best, pos, delta, device):
        # torch is imported where the exact scorer runs, not at the top: vltool.outcomes (and so `vltool report`) imports this module without needing torch
        import torch

        self.device = torch.device(device)
        put = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(self.device)  # noqa: E731
        self.images, self.texts = put(images), put(texts)  # (N_i, D), (N_t, D) float32
        # the same float32 thresholds as _block_float32's (float64 -> float32, rounded to nearest)
        self.lo_i, self.hi_i = put((best - delta).astype(np.float32)), put((best + delta).astype(np.float32))
        self.lo_t, self.hi_t = put((pos - delta).astype(np.float32)), put((pos + delta).astype(np.float32))
        self._buf = None  # (2 bi bt,) float32: a block's scores, then its mask
        self._near: dict[str, list] = {"i": [], "t": []}  # side -> [(image rows, text columns), ...]
        self._n_near = 0

    def __call__(self, images, texts, c, e, a, b, best, pos, delta, counts: _BlockCounts) -> bool:
        import torch  # (lazy: see __init__)

        bi, bt = e - c, b - a
        if self._buf is None or self._buf.numel() < 2 * bi * bt:  # (the first block is the largest)
            self._buf = torch.empty(2 * bi * bt, dtype=torch.float32, device=self.device)
        # the scores and the mask in one buffer for every block: a new tensor per block fragments a CPU's heap
        s = torch.mm(self.images[c:e], self.texts[a:b].T, out=self._buf[: bi * bt].view(bi, bt))  # (bi, bt) float32 scores
        m = self._buf[bi * bt : 2 * bi * bt].view(bi, bt)  # (bi, bt) 1.0 where the comparison holds
        lo_i, hi_i, lo_t, hi_t = self.lo_i[c:e, None], self.hi_i[c:e, None], self.lo_t[None, a:b], self.hi_t[None, a:b]
        above_i = torch.gt(s, hi_i, out=m).sum(dim=1)  # (bi,)
        near_i = torch.ge(s, lo_i, out=m).sum(dim=1).sub_(above_i)  # (bi,) within delta of the image's threshold
        above_t = torch.gt(s, hi_t, out=m).sum(dim=0)  # (bt,)
        near_t = torch.ge(s, lo_t, out=m).sum(dim=0).sub_(above_t)  # (bt,)
        stats = torch.cat([above_i, near_i, above_t, near_t]).cpu().numpy().astype(np.int64)  # one transfer
        near_i, near_t = stats[bi : 2 * bi], stats[2 * bi + bt :]
        if near_i.sum() + near_t.sum() > 0.02 * s.numel() + 2 * bt:
            return False
        counts.i_gt[c:e] += stats[:bi]
        counts.t_gt[a:b] += stats[2 * bi : 2 * bi + bt]
        if near_i.any():
            rows = torch.from_numpy(np.flatnonzero(near_i)).to(self.device)  # (k,) rows holding a near score
            sub = s.index_select(0, rows)  # (k, bt)
            r, t = torch.nonzero((sub >= lo_i[rows]) & (sub <= hi_i[rows]), as_tuple=True)
            self._hold("i", rows[r].cpu().numpy() + c, t.cpu().numpy() + a)
        if near_t.any():
            cols = torch.from_numpy(np.flatnonzero(near_t)).to(self.device)  # (k,) columns holding one
            sub = s.index_select(1, cols)  # (bi, k); index_select is several times faster than s[:, cols]
            r, t = torch.nonzero((sub >= lo_t[:, cols]) & (sub <= hi_t[:, cols]), as_tuple=True)
            self._hold("t", r.cpu().numpy() + c, cols[t].cpu().numpy() + a)
        if self._n_near >= self.FLUSH_PAIRS:
            self.flush(images, texts, best, pos, counts)
        return True

    def _hold(self, side: str, r: np.ndarray, t: np.ndarray) -> None:
        self._near[side].append((r, t))
        self._n_near += len(r)

    def flush(self, images, texts, best, pos, counts: _BlockCounts) -> None:
        """Count the near pairs held so far on float64 scores."""
        for side, held in self._near.items():
            if held:
                r, t = (np.concatenate(x) for x in zip(*held))
                _near_exact(images, texts, r, t, side, best, pos, counts)
                held.clear()
        self._n_near = 0


@contextlib.contextmanager
def _full_float32(device):
    """CUDA float32 matmuls in full float32 inside, not TF32 (whose 10-bit mantissa the rounding bound
    `delta` does not cover); nothing to do without a device."""
    if device is None:
        yield
        return
    import torch  # (lazy: see _TorchBlocks.__init__)

    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def retrieval_chance(n_candidates: int, n_positives: np.ndarray, k: int) -> np.ndarray:
    """Per query, P(a uniformly random ranking puts a correct item in the top k): 1 - C(N-p, k) / C(N, k)."""
    n = float(n_candidates)
    p = np.asarray(n_positives, dtype=np.float64)
    if k >= n:
        return np.ones_like(p)
    values, where = np.unique(p, return_inverse=True)  # per distinct count (a few), not per query (millions)
    out = np.ones_like(values)
    some = n - values >= k  # fewer wrong items than k: a correct one is always in
    q = values[some]
    log_miss = gammaln(n - q + 1) - gammaln(n - q - k + 1) - gammaln(n + 1) + gammaln(n - k + 1)
    out[some] = 1.0 - np.exp(log_miss)
    return out[where.reshape(p.shape)]


def weighted_median(values: np.ndarray, w: np.ndarray | None = None, order: np.ndarray | None = None) -> float:
    """np.median of the data in which values[i] appears w[i] times (w: integer counts; None = once each)."""
    v = np.asarray(values, dtype=np.float64)
    if w is None:
        return float(np.median(v)) if v.size else float("nan")
    order = np.argsort(v, kind="stable") if order is None else order
    vs = v[order]
    cum = np.cumsum(np.asarray(w, dtype=np.float64)[order])
    total = int(round(cum[-1])) if cum.size else 0
    if total == 0:
        return float("nan")

    def at(p: int) -> float:  # the value at 0-based position p of the expanded sorted data
        return float(vs[np.searchsorted(cum, p, side="right")])

    if total % 2:
        return at((total - 1) // 2)
    return (at(total // 2 - 1) + at(total // 2)) / 2


@dataclass
class RetrievalItems:
    """Per-query values of both directions, from which the retrieval metrics and their bootstrap are computed."""

    ks: list[int]
    i2t_hits: dict[int, np.ndarray]  # k -> (N_i,)
    t2i_hits: dict[int, np.ndarray]  # k -> (N_t,)
    i2t_rank: np.ndarray  # (N_i,)
    t2i_rank: np.ndarray  # (N_t,)
    owner: np.ndarray  # (N_t,) image of each text
    _i_order: np.ndarray = field(init=False, repr=False)
    _t_order: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self._i_order = np.argsort(self.i2t_rank, kind="stable")
        self._t_order = np.argsort(self.t2i_rank, kind="stable")

    @classmethod
    def from_ranks(cls, ks: Sequence[int], i2t: QueryRanks, t2i: QueryRanks, owner: np.ndarray) -> "RetrievalItems":
        ks = list(ks)
        return cls(ks, {k: i2t.hits(k) for k in ks}, {k: t2i.hits(k) for k in ks}, i2t.rank(), t2i.rank(), np.asarray(owner))

    def metrics(self, w: np.ndarray | None = None) -> dict[str, float]:
        """RETRIEVAL_METRICS with image weights `w` (a bootstrap draw; a text weighs what its image weighs)."""
        wi = np.ones(len(self.i2t_rank)) if w is None else w
        wt = wi[self.owner]
        qw = QueryWeights(w is not None, wi, wt, wi.sum(), wt.sum())
        return {name: m.value(self, qw, k) for m in RETRIEVAL_METRICS for name, k in m.at(self.ks)}


# ----------------------------------------------------------------------------------------------------
# The metrics, declared once
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """One evaluation metric: its name in the results (`{k}` in it: one metric per K of --recall-k), which way is
    better, its value on weighted items, and its chance level (what a uniformly random ranking or guess scores,
    from the data's counts; None where there is none), with the chance level's formula and meaning in words
    (docs/evaluation.md's table, `metrics_markdown`)."""

    name: str
    higher_is_better: bool
    value: Callable[..., float]  # (items, weights, k) -> the metric
    chance: Callable[..., float | None]  # (counts, k) -> its chance level
    chance_doc: str
    meaning: str
    applies: Callable[..., bool] = lambda items: True  # whether the items have it (top5: at least 5 classes)

    def at(self, ks: Sequence[int] = ()) -> list[tuple[str, int | None]]:
        """(name, k) of each metric this declaration gives: one per K, or one."""
        return [(self.name.format(k=k), k) for k in ks] if "{k}" in self.name else [(self.name, None)]


@dataclass(frozen=True)
class ItemWeights:
    """Item weights (counts of a bootstrap draw, or ones) and their sum."""

    w: np.ndarray  # (N,)
    total: float


@dataclass(frozen=True)
class QueryWeights:
    """Image weights of a retrieval draw and the texts' (each its image's), with their sums."""

    drawn: bool  # False: each image once (the point estimate)
    image: np.ndarray  # (N_i,)
    text: np.ndarray  # (N_t,)
    image_sum: float
    text_sum: float


@dataclass(frozen=True)
class ClassCounts:
    """What single-label chance levels are computed from: the evaluated items' classes, and the classes."""

    target: np.ndarray  # (N,) int
    num_classes: int


@dataclass(frozen=True)
class RetrievalCounts:
    """What retrieval chance levels are computed from: images, texts, and each image's texts."""

    n_images: int
    n_texts: int
    per_image: np.ndarray  # (N_i,)


def _image_ranks(c: RetrievalCounts) -> np.ndarray:
    return (c.n_texts + 1) / (c.per_image + 1.0)  # (N_i,) expected rank of an image's first correct text, at random


CLASSIFICATION_METRICS: tuple[Metric, ...] = (
    Metric("top1", True, lambda it, iw, k: float(iw.w @ it.top1 / iw.total), lambda c, k: 1 / c.num_classes,
           "1/C", "C = classes of the label column (the classifier chooses among all of them)"),
    Metric("top5", True, lambda it, iw, k: float(iw.w @ it.top5 / iw.total),
           lambda c, k: topk_chance(c.num_classes, 5) if c.num_classes >= 5 else None,
           "min(5, C)/C", "only with at least 5 classes", applies=lambda it: it.top5 is not None),
    Metric("mean_per_class_recall", True, lambda it, iw, k: mean_per_class_recall(it.top1, it.target, it.num_classes, iw.w),
           lambda c, k: 1 / c.num_classes, "1/C", "scikit-learn's balanced accuracy; C as for top1"),
)

MAP = Metric("mAP", True, lambda ap, w, k: ap.mean(w), lambda targets, k: mean_prevalence(targets),
             "mean class prevalence", "the expected AP of a random ranking, approximately (the classes with a positive)")

RETRIEVAL_METRICS: tuple[Metric, ...] = (
    Metric("image_to_text_R@{k}", True, lambda it, qw, k: float(qw.image @ it.i2t_hits[k] / qw.image_sum),
           lambda c, k: float(np.mean(retrieval_chance(c.n_texts, c.per_image, k))),
           "mean over images of 1 − C(N_texts − p, K) / C(N_texts, K)", "p = the image's texts"),
    Metric("image_to_text_mean_rank", False, lambda it, qw, k: float(qw.image @ it.i2t_rank / qw.image_sum),
           lambda c, k: float(np.mean(_image_ranks(c))),
           "mean over images of (N_texts + 1)/(p + 1)", "expected rank of the first correct text in a random ranking"),
    Metric("image_to_text_median_rank", False,
           lambda it, qw, k: weighted_median(it.i2t_rank, qw.image if qw.drawn else None, it._i_order),
           lambda c, k: float(np.median(_image_ranks(c))), "median over images of (N_texts + 1)/(p + 1)",
           "the median of those expected ranks"),
    Metric("text_to_image_R@{k}", True, lambda it, qw, k: float(qw.text @ it.t2i_hits[k] / qw.text_sum),
           lambda c, k: min(k, c.n_images) / c.n_images, "K / N_images", "one correct image among N_images, uniformly random ranking"),
    Metric("text_to_image_mean_rank", False, lambda it, qw, k: float(qw.text @ it.t2i_rank / qw.text_sum),
           lambda c, k: (c.n_images + 1) / 2, "(N_images + 1)/2", "expected rank of the text's image in a random ranking"),
    Metric("text_to_image_median_rank", False,
           lambda it, qw, k: weighted_median(it.t2i_rank, qw.text if qw.drawn else None, it._t_order),
           lambda c, k: (c.n_images + 1) / 2, "(N_images + 1)/2", "every text's expected rank is the same"),
)

ALL_METRICS: tuple[Metric, ...] = (*CLASSIFICATION_METRICS, MAP, *RETRIEVAL_METRICS)


def retrieval_chance_levels(ks: Sequence[int], n_images: int, n_texts: int, per_image: np.ndarray) -> dict[str, float]:
    """What a uniformly random ranking scores on each retrieval metric (per query, then averaged like the metric).

    text->image: one correct image among n_images: R@K = K / n_images, rank (n_images + 1) / 2.
    image->text: p correct texts among n_texts: R@K = 1 - C(n_texts - p, K) / C(n_texts, K), expected rank
    of the first correct one (n_texts + 1) / (p + 1).
    """
    counts = RetrievalCounts(n_images, n_texts, per_image)
    return {name: m.chance(counts, k) for m in RETRIEVAL_METRICS for name, k in m.at(ks)}


def classification_chance_levels(target: np.ndarray, num_classes: int) -> dict[str, float | None]:
    """Each single-label metric's chance level (uniform guessing; top5: None with fewer than 5 classes)."""
    counts = ClassCounts(np.asarray(target), num_classes)
    return {m.name: m.chance(counts, None) for m in CLASSIFICATION_METRICS}


def mean_prevalence(targets: np.ndarray) -> float | None:
    """mAP's chance level: the mean, over the classes with a positive, of their share of positives; None when none has one.
    `targets` (N, C) bool."""
    present = targets.any(axis=0)  # (C,)
    return float(targets.mean(axis=0)[present].mean()) if present.any() else None


def metrics_markdown() -> str:
    """docs/evaluation.md's table of the metrics, which way is better, and their chance levels."""
    rows = [f"| `{m.name.replace('{k}', 'K')}` | {'higher' if m.higher_is_better else 'lower'} | {m.chance_doc} | {m.meaning} |"
            for m in ALL_METRICS]
    return "\n".join(["| metric | better | chance | meaning |", "|---|---|---|---|", *rows]) + "\n"


# ----------------------------------------------------------------------------------------------------
# Bootstrap
# ----------------------------------------------------------------------------------------------------


@dataclass
class Interval:
    """A percentile interval, with the number of replicates it was read from and the Monte Carlo standard
    error of each bound (how much the bound would move with another draw of as many replicates)."""

    low: float
    high: float
    replicates: int = 0
    low_mc_se: float = float("nan")
    high_mc_se: float = float("nan")


MIN_UNITS_PER_STRATUM = 5  # a stratum (class) with fewer units (groups, or images) hardly varies: no strata then


@dataclass
class Resampling:
    """What one bootstrap resample draws: items, or whole groups of items; within strata, or not.

    Build it with `Resampling.make(n_items, strata, groups)`:
    - no groups: items are drawn with replacement, within their stratum when `strata` is given and every
      stratum holds at least `min_per_stratum` items;
    - groups (N,) (any hashable values, e.g. base_id): whole groups are drawn with replacement and an
      item's weight is its group's draw count (a cluster bootstrap). The groups are drawn within their
      stratum only when every group lies in one stratum and every stratum holds at least
      `min_per_stratum` groups: a class of one group draws that group every time and adds no variance, so
      stratifying data whose classes hold one or two groups each makes the interval no wider than the
      single-image bootstrap's. Otherwise the groups are drawn without strata (`spanning` counts the groups
      in several strata, `small_strata` the strata with too few units).
    Group codes follow the items' order of first appearance, so singleton groups draw exactly what the
    item bootstrap draws with the same seed, and a group of identical copies draws what one copy would.
    """

    n_items: int
    strata: np.ndarray | None = None  # (N,) stratum of each item, as given
    codes: np.ndarray | None = None  # (N,) group of each item, 0..G-1 in order of first appearance
    n_groups: int = 0
    group_strata: np.ndarray | None = None  # (G,) stratum of each group (when the groups are drawn within strata)
    spanning: int = 0  # groups whose items lie in several strata
    small_strata: int = 0  # strata holding fewer than min_per_stratum units (groups, or items)
    min_per_stratum: int = MIN_UNITS_PER_STRATUM

    @classmethod
    def make(cls, n_items: int, strata: np.ndarray | None = None, groups: np.ndarray | None = None,
             min_per_stratum: int = MIN_UNITS_PER_STRATUM) -> "Resampling":
        strata = None if strata is None else np.asarray(strata)
        if strata is not None and len(strata) != n_items:
            raise ValueError(f"strata has {len(strata)} values for {n_items} items")
        if groups is None:
            small = _small_strata(strata, min_per_stratum) if strata is not None else 0
            return cls(n_items, strata, small_strata=small, min_per_stratum=min_per_stratum)
        groups = np.asarray(groups)
        if len(groups) != n_items:
            raise ValueError(f"groups has {len(groups)} values for {n_items} items")
        if n_items == 0:
            return cls(0, strata, np.zeros(0, np.int64), 0, min_per_stratum=min_per_stratum)
        _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        codes = rank[inverse.reshape(-1)].astype(np.int64)
        g = len(first)
        group_strata, spanning, small = None, 0, 0
        if strata is not None:
            gs = strata[first[order]]  # the stratum of each group's first item, in code order
            spanning = int(len(np.unique(codes[strata != gs[codes]])))
            small = _small_strata(gs, min_per_stratum)
            group_strata = gs if spanning == 0 and small == 0 else None
        return cls(n_items, strata, codes, g, group_strata, spanning, small, min_per_stratum)

    @property
    def grouped(self) -> bool:
        return self.codes is not None

    @property
    def stratified(self) -> bool:
        if self.grouped:
            return self.group_strata is not None
        return self.strata is not None and self.small_strata == 0

    @property
    def n_units(self) -> int:
        return self.n_groups if self.grouped else self.n_items

    def sampler(self, rng: np.random.Generator) -> Callable[[], np.ndarray]:
        """A function returning the item weights (N,) float64 of one resample."""
        n = self.n_units
        if self.stratified:
            draw = _stratified_draw(self.group_strata if self.grouped else self.strata, rng)
        else:
            def draw() -> np.ndarray:
                return rng.integers(0, n, n)
        if not self.grouped:
            return lambda: np.bincount(draw(), minlength=n).astype(np.float64)
        codes = self.codes
        return lambda: np.bincount(draw(), minlength=n).astype(np.float64)[codes]

    def unit(self, item: str = "image", group_column: str | None = None, stratum: str = "class") -> str:
        """The resampling unit in words, for the results record: e.g. 'base_id group (333 groups of 669
        images), not stratified: 80 classes hold fewer than 5 groups'."""
        plural = stratum + ("es" if stratum.endswith("s") else "s")
        if not self.grouped:
            if self.stratified:
                return item + f", within its {stratum}"
            if self.strata is not None:
                return item + f", not stratified: {self._too_small(stratum, plural)} {self.min_per_stratum} {item}s"
            return item
        text = f"{group_column or 'group'} group ({self.n_groups} groups of {self.n_items} {item}s)"
        if self.stratified:
            return text + f", within its {stratum}"
        if self.strata is not None and self.spanning:
            return text + f", not stratified: {self.spanning} groups span several {plural}"
        if self.strata is not None:
            return text + f", not stratified: {self._too_small(stratum, plural)} {self.min_per_stratum} groups"
        return text

    def _too_small(self, stratum: str, plural: str) -> str:
        n = self.small_strata
        return f"1 {stratum} holds fewer than" if n == 1 else f"{n} {plural} hold fewer than"

    def record(self, group_column: str | None = None) -> dict:
        """The resampling's facts for the results record's protocol.bootstrap."""
        return {
            "group_column": group_column if self.grouped else None,
            "units": int(self.n_units),
            "stratified": bool(self.stratified),
            **({"groups_spanning_strata": int(self.spanning)} if self.grouped and self.strata is not None else {}),
            **({"strata_below_min": int(self.small_strata), "min_units_per_stratum": int(self.min_per_stratum)}
               if self.strata is not None else {}),
        }


def _small_strata(strata: np.ndarray, min_units: int) -> int:
    """How many strata hold fewer than `min_units` units."""
    _, counts = np.unique(strata, return_counts=True)
    return int((counts < min_units).sum())


MAX_BOOTSTRAP = 1_000_000  # resamples: their replicates are kept for the percentiles (8 bytes x metrics each:
# 8 MB a metric at the limit, where 10^9 resamples needed 22 GiB for 3 metrics) and cost one statistic each
# (about 0.1 ms: 10^6 is minutes, 10^9 days); the Monte Carlo error of a 95% interval's ends is already
# small beside its width at 10^4.


def resamples_problem(n_boot: int, n_metrics: int | None = None) -> str | None:
    """Why `n_boot` resamples are refused (over MAX_BOOTSTRAP: each one recomputes every metric, and from
    about a hundred million on their replicates alone take GiBs), or None."""
    if n_boot <= MAX_BOOTSTRAP:
        return None
    size = n_boot * 8 * (n_metrics or 1) / 2**30
    memory = f"{size:,.1f} GiB for {n_metrics} metrics" if n_metrics else f"{size:,.1f} GiB per metric"
    why = "each resample recomputes every metric over the whole test set, so the time grows with them"
    if size >= 0.1:  # (the memory is a reason only where it is one: 1,000,001 resamples take 8 MB)
        why = f"their replicates alone would take {memory}, and {why}"
    return (f"{n_boot} resamples is over the limit of {MAX_BOOTSTRAP:,}: {why}; give 1000 (the default) to 10000, "
            "which make a stable 95% interval")


def check_resamples(n_boot: int, n_metrics: int | None = None) -> None:
    """A usage error naming --bootstrap for more than MAX_BOOTSTRAP resamples."""
    problem = resamples_problem(n_boot, n_metrics)
    if problem:
        raise UsageError(f"--bootstrap {problem}")


class Replicates:
    """The bootstrap replicates of every statistic, drawn in order from one generator: `extend(n)` draws
    more, and the first replicates never change (an interval read from the first B is the same whether or
    not more were drawn after it). rows(n): the first n replicates, (n, len(names))."""

    def __init__(self, n_units: int, statistic: Callable[[np.ndarray | None], dict[str, float]], seed: int = 0,
                 resampling: Resampling | None = None, names: Sequence[str] | None = None):
        plan = resampling if resampling is not None else Resampling.make(n_units)
        if plan.n_items != n_units:
            raise ValueError(f"the resampling is for {plan.n_items} items, not {n_units}")
        self.names = list(names) if names is not None else list(statistic(None).keys())
        self.statistic = statistic
        self.weights = plan.sampler(np.random.default_rng(seed))
        self.reps = np.empty((0, len(self.names)))

    def __len__(self) -> int:
        return len(self.reps)

    def extend(self, n: int) -> "Replicates":
        """Draw replicates until there are n."""
        if n > len(self.reps):
            more = np.empty((n - len(self.reps), len(self.names)))
            for b in range(len(more)):
                vals = self.statistic(self.weights())
                more[b] = [vals[k] for k in self.names]
            self.reps = np.concatenate([self.reps, more])
        return self

    def rows(self, n: int | None = None) -> np.ndarray:
        return self.reps if n is None else self.reps[:n]


def bootstrap(
    n_units: int,
    statistic: Callable[[np.ndarray | None], dict[str, float]],
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    strata: np.ndarray | None = None,
    groups: np.ndarray | None = None,
    resampling: Resampling | None = None,
) -> dict[str, Interval]:
    """Percentile intervals of every statistic over `n_boot` resamples of `n_units` items with replacement.

    `statistic(w)` gets the weight of each item in one resample (w[i] = times item i was drawn) and returns
    a dict of values. With `strata` (N,) (the class of each item) items are resampled within their stratum,
    so every resample keeps each class and its support. With `groups` (N,) whole groups are resampled (a
    cluster bootstrap; `Resampling` says how strata apply). `resampling` (a `Resampling.make(...)`) replaces
    `strata` and `groups`. Replicates where a value is NaN are left out of its interval. `n_boot=0` gives
    no intervals (NaN). Each interval carries its replicates and the Monte Carlo error of its bounds.
    """
    names = list(statistic(None).keys())
    if n_boot <= 0 or n_units == 0:
        return {k: Interval(float("nan"), float("nan")) for k in names}
    check_resamples(n_boot, len(names))
    plan = resampling if resampling is not None else Resampling.make(n_units, strata, groups)
    reps = Replicates(n_units, statistic, seed, plan, names).extend(n_boot)
    return percentile_intervals(reps.rows(), names, level)


def percentile_intervals(reps: np.ndarray, names: Sequence[str], level: float = 0.95) -> dict[str, Interval]:
    """(n_boot, len(names)) replicates -> the percentile interval of each column (NaN replicates left out)."""
    return {k: percentile_interval(reps[:, j], level) for j, k in enumerate(names)}


def percentile_interval(col: np.ndarray, level: float = 0.95) -> Interval:
    """The percentile interval of one statistic's replicates (NaN ones left out), with the Monte Carlo
    standard error of each bound (`percentile_mc_se`)."""
    alpha = (1 - level) / 2 * 100
    col = np.asarray(col, dtype=np.float64)
    col = col[np.isfinite(col)]
    if col.size == 0:
        return Interval(float("nan"), float("nan"))
    lo, hi = np.percentile(col, [alpha, 100 - alpha])
    return Interval(float(lo), float(hi), int(col.size), percentile_mc_se(col, alpha), percentile_mc_se(col, 100 - alpha))


def percentile_mc_se(col: np.ndarray, q: float) -> float:
    """The Monte Carlo standard error of the q-th percentile (0..100) of B replicates, read from the
    replicates themselves: the rank of the B·p-th order statistic (p = q/100) varies from one draw of B
    replicates to another with the binomial sd sqrt(B p (1-p)), so the bound's s.e. is half the distance
    between the percentiles p ± sqrt(p (1-p) / B) (an order-statistic estimate; no density is fitted).
    It is 0 where the replicates around the bound are tied (a discrete metric's plateau)."""
    col = np.asarray(col, dtype=np.float64)
    b = col.size
    if b < 2:
        return float("nan")
    p = q / 100
    d = math.sqrt(p * (1 - p) / b) * 100
    lo, hi = np.percentile(col, [max(0.0, q - d), min(100.0, q + d)])
    return float((hi - lo) / 2)


def far_side_share(col: np.ndarray) -> tuple[float, float]:
    """The bootstrap p-value of a difference and its Monte Carlo standard error: the share of the (finite)
    replicates at or beyond 0 on the side away from the bulk, min(share <= 0, share >= 0), and
    sqrt(p (1 - p) / B). A 95% percentile interval excludes 0 when this share is below 2.5%."""
    col = np.asarray(col, dtype=np.float64)
    col = col[np.isfinite(col)]
    if col.size == 0:
        return float("nan"), float("nan")
    p = float(min(np.mean(col <= 0), np.mean(col >= 0)))
    return p, math.sqrt(p * (1 - p) / col.size)


def _stratified_draw(strata: np.ndarray, rng: np.random.Generator) -> Callable[[], np.ndarray]:
    """A function drawing, for each stratum of n_s units, n_s of its units with replacement."""
    order = np.argsort(strata, kind="stable")  # units grouped by stratum
    _, start, count = np.unique(strata[order], return_index=True, return_counts=True)
    first = np.repeat(start, count)  # (N,) where each position's stratum starts in `order`
    size = np.repeat(count, count)  # (N,) the size of each position's stratum

    def draw() -> np.ndarray:
        pick = first + np.floor(rng.random(len(order)) * size).astype(np.int64)
        return order[pick]

    return draw


def majority_rate(target: np.ndarray, num_classes: int) -> float:
    """Accuracy of always predicting the most frequent class of the evaluated items."""
    if len(target) == 0:
        return float("nan")
    return float(np.bincount(target, minlength=num_classes).max() / len(target))


def topk_chance(num_classes: int, k: int) -> float:
    return min(k, num_classes) / num_classes


