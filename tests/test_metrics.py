"""vltool.metrics against hand-computed cases and plain reference implementations.

Each fast metric has a slow, obvious twin here: sorting the full score matrix, enumerating every
tie-breaking order, scikit-learn's functions, or resampling the data explicitly.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from vltool.metrics import (
    AveragePrecision,
    Resampling,
    ClassificationItems,
    bootstrap,
    class_ranks,
    expected_rank,
    hit_probability,
    mean_per_class_recall,
    retrieval_chance,
    retrieval_ranks,
    weighted_median,
    _stratified_draw,
)

# ----------------------------------------------------------------------------------------------------
# reference implementations
# ----------------------------------------------------------------------------------------------------


def ref_tie_break(scores: np.ndarray, correct: np.ndarray, k: int) -> tuple[float, float]:
    """(P(hit@k), E[rank of the first correct]) over every order of tied scores, by enumeration."""
    hits, ranks, n = 0.0, 0.0, 0
    groups = sorted(set(scores.tolist()), reverse=True)
    blocks = [np.flatnonzero(scores == g) for g in groups]
    for perms in itertools.product(*[list(itertools.permutations(b)) for b in blocks]):
        order = np.concatenate([np.array(p, dtype=int) for p in perms])
        first = int(np.flatnonzero(correct[order])[0])
        hits += first < k
        ranks += first + 1
        n += 1
    return hits / n, ranks / n


def ref_retrieval(images, texts, owner, k):
    """CLIP_benchmark-style: the full score matrix, sorted per query (no ties in the data)."""
    s = images.astype(np.float64) @ texts.astype(np.float64).T  # (N_i, N_t)
    pos = np.zeros_like(s, dtype=bool)
    pos[owner, np.arange(len(owner))] = True
    i2t_hit, i2t_rank = [], []
    for i in range(len(images)):
        order = np.argsort(-s[i])
        first = int(np.flatnonzero(pos[i, order])[0])
        i2t_hit.append(first < k)
        i2t_rank.append(first + 1)
    t2i_hit, t2i_rank = [], []
    for t in range(len(texts)):
        order = np.argsort(-s[:, t])
        first = int(np.flatnonzero(pos[order, t])[0])
        t2i_hit.append(first < k)
        t2i_rank.append(first + 1)
    return np.array(i2t_hit, float), np.array(i2t_rank, float), np.array(t2i_hit, float), np.array(t2i_rank, float)


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# ----------------------------------------------------------------------------------------------------
# ties
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_hit_probability_and_rank_equal_enumeration_of_tie_orders(k):
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(2, 7))
        scores = rng.integers(0, 3, n).astype(float)  # many ties
        correct = rng.random(n) < 0.35
        correct[int(rng.integers(n))] = True
        best = scores[correct].max()
        g = int(((scores > best) & ~correct).sum())
        t = int(((scores == best) & ~correct).sum())
        p = int(((scores == best) & correct).sum())
        ref_hit, ref_rank = ref_tie_break(scores, correct, k)
        assert hit_probability(np.array([g]), np.array([t]), k, np.array([p]))[0] == pytest.approx(ref_hit)
        assert expected_rank(np.array([g]), np.array([t]), np.array([p]))[0] == pytest.approx(ref_rank)


def test_hand_cases_of_ties():
    # true class tied with 3 others at the top: top-1 is 1/4, top-2 is 1/2, top-4 and beyond certain
    assert hit_probability(np.array([0]), np.array([3]), 1)[0] == pytest.approx(0.25)
    assert hit_probability(np.array([0]), np.array([3]), 2)[0] == pytest.approx(0.5)
    assert hit_probability(np.array([0]), np.array([3]), 4)[0] == 1.0
    # two wrong items above: top-2 misses whatever the ties
    assert hit_probability(np.array([2]), np.array([5]), 2)[0] == 0.0
    # two correct items tied with one wrong one at the top: P(miss at 1) = 1/3
    assert hit_probability(np.array([0]), np.array([1]), 1, np.array([2]))[0] == pytest.approx(2 / 3)
    assert expected_rank(np.array([4]), np.array([2]), 1)[0] == pytest.approx(6.0)


# ----------------------------------------------------------------------------------------------------
# classification
# ----------------------------------------------------------------------------------------------------


def test_topk_and_mean_per_class_recall_hand_case():
    scores = np.array([
        [0.9, 0.1, 0.0],  # true 0: rank 1
        [0.5, 0.4, 0.3],  # true 1: rank 2
        [0.2, 0.2, 0.1],  # true 0: tied with class 1 at the top -> 1/2 at top-1
        [0.1, 0.2, 0.3],  # true 2: rank 1
    ])
    target = np.array([0, 1, 0, 2])
    items = ClassificationItems.from_scores(scores, target)
    assert items.top5 is None  # fewer than 5 classes: no top-5, as CLIP_benchmark
    m = items.metrics()
    assert m["top1"] == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    # class 0: (1 + 0.5) / 2, class 1: 0, class 2: 1
    assert m["mean_per_class_recall"] == pytest.approx((0.75 + 0 + 1) / 3)
    assert "top5" not in m
    np.testing.assert_allclose(items.rank, [1, 2, 1.5, 1])


def test_classification_equals_topk_and_balanced_accuracy_without_ties():
    import torch
    from sklearn.metrics import balanced_accuracy_score

    rng = np.random.default_rng(1)
    scores = rng.normal(size=(300, 12))
    target = rng.integers(0, 12, 300)
    target[:12] = np.arange(12)
    m = ClassificationItems.from_scores(scores, target).metrics()
    t = torch.from_numpy(scores)
    top = t.topk(5, dim=1).indices.numpy()
    assert m["top1"] == pytest.approx(np.mean(top[:, 0] == target))
    assert m["top5"] == pytest.approx(np.mean((top == target[:, None]).any(axis=1)))
    assert m["mean_per_class_recall"] == pytest.approx(balanced_accuracy_score(target, scores.argmax(1)))


def test_nan_scores_never_win():
    scores = np.array([[np.nan, np.nan, np.nan], [0.1, np.nan, 0.3]])
    g, t = class_ranks(scores, np.array([0, 1]))
    hits = hit_probability(g, t, 1)
    assert hits[0] == pytest.approx(1 / 3)  # all NaN: a tie, chance level
    assert hits[1] == 0.0


def test_weighted_metrics_equal_metrics_on_resampled_data():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(50, 6))
    target = rng.integers(0, 6, 50)
    items = ClassificationItems.from_scores(scores, target)
    idx = rng.integers(0, 50, 50)
    w = np.bincount(idx, minlength=50).astype(float)
    direct = ClassificationItems.from_scores(scores[idx], target[idx], 6).metrics()
    got = items.metrics(w)
    assert {k: got[k] for k in ("top1", "top5")} == pytest.approx({k: direct[k] for k in ("top1", "top5")})
    # mean per-class recall keeps the data's class weights 1 / n_c (issue 42): each class's recall on the
    # resampled data, weighted by how often its items were drawn relative to its size, n*_c / n_c
    n0, ns = np.bincount(target, minlength=6), np.bincount(target[idx], minlength=6)
    rec = np.bincount(target[idx], weights=items.top1[idx], minlength=6) / np.maximum(ns, 1)
    assert got["mean_per_class_recall"] == pytest.approx(float((ns / n0) @ rec / (ns / n0).sum()))
    # a resample that keeps every class's count (stratified) gives the resampled data's own balanced accuracy
    strat = np.concatenate([rng.choice(np.flatnonzero(target == c), (target == c).sum()) for c in range(6)])
    ws = np.bincount(strat, minlength=50).astype(float)
    same = ClassificationItems.from_scores(scores[strat], target[strat], 6).metrics()
    assert items.metrics(ws) == pytest.approx(same)


def test_mean_per_class_recall_ignores_absent_classes():
    hit = np.array([1.0, 0.0, 1.0])
    target = np.array([0, 0, 3])
    assert mean_per_class_recall(hit, target, 5) == pytest.approx((0.5 + 1.0) / 2)


def _vanishing_classes(seed=0):
    """10 classes of 20 images that the model never gets right and 10 classes of one image that it always
    does: mean per-class recall 0.5. A resample of the 210 images misses each one-image class with
    probability (1 - 1/210)^210 = 0.37."""
    target = np.concatenate([np.repeat(np.arange(10), 20), np.arange(10, 20)])
    hit = np.concatenate([np.zeros(200), np.ones(10)])
    greater = (1 - hit).astype(np.int64)
    return ClassificationItems.from_ranks(greater, np.zeros_like(greater), target, 20)


def test_mean_per_class_recall_lies_inside_its_interval_when_classes_vanish_from_resamples():
    """issue 42: the classes a resample misses must not drop out of its mean. Averaging the classes present
    put every replicate near 6.3 / 16.3 = 0.39, and the interval (about [0.29, 0.47]) below its own
    estimate 0.5; with the data's class weights the replicates centre on the estimate."""
    items = _vanishing_classes()
    est = items.metrics()["mean_per_class_recall"]
    assert est == 0.5
    plan = Resampling.make(len(items.target), items.target)  # one-image classes: too small to be strata
    assert not plan.stratified
    iv = bootstrap(len(items.target), items.metrics, 2000, 0, resampling=plan)["mean_per_class_recall"]
    assert iv.low < est < iv.high
    dropped = bootstrap(len(items.target), lambda w: {"m": _present_classes_mean(items, w)}, 2000, 0, resampling=plan)["m"]
    assert dropped.high < est  # what the old definition gave


def _present_classes_mean(items, w):
    w = np.ones(len(items.target)) if w is None else w
    n_c = np.bincount(items.target, weights=w, minlength=items.num_classes)
    h_c = np.bincount(items.target, weights=w * items.top1, minlength=items.num_classes)
    return float(np.mean(h_c[n_c > 0] / n_c[n_c > 0]))


def test_mean_per_class_recall_interval_covers_the_truth_at_its_nominal_rate():
    """A small simulation: 30 classes, a third of them of one or two images (never strata), each with its
    own true recall, the small ones somewhat higher (0.2 to 0.5 against 0.1 to 0.4); the truth is the mean
    of the true recalls over the classes. The 95% interval (unstratified, 400 resamples) covers it in 93% of
    200 simulated test sets; the old definition's replicates, biased towards the large classes, in 85%.
    (With much larger differences between the classes' recalls the weights n*_c / n_c add variance and
    the interval errs wide: 99% at 0.5 to 0.9 against 0.05 to 0.4, where the old one gave 82%.)"""
    rng = np.random.default_rng(42)
    sizes = np.concatenate([rng.integers(1, 3, 10), rng.integers(8, 30, 20)])
    p = np.concatenate([rng.uniform(0.2, 0.5, 10), rng.uniform(0.1, 0.4, 20)])
    target = np.repeat(np.arange(30), sizes)
    truth = p.mean()
    covered = covered_old = 0
    n_sets = 200
    for i in range(n_sets):
        hit = (rng.random(len(target)) < p[target]).astype(np.int64)
        items = ClassificationItems.from_ranks(1 - hit, np.zeros_like(hit), target, 30)
        plan = Resampling.make(len(target), target)

        def both(w, items=items):
            return {"new": items.metrics(w)["mean_per_class_recall"], "old": _present_classes_mean(items, w)}

        iv = bootstrap(len(target), both, 400, i, resampling=plan)
        covered += iv["new"].low <= truth <= iv["new"].high
        covered_old += iv["old"].low <= truth <= iv["old"].high
    assert 0.90 <= covered / n_sets <= 0.98
    assert covered_old / n_sets <= covered / n_sets - 0.05


# ----------------------------------------------------------------------------------------------------
# average precision
# ----------------------------------------------------------------------------------------------------


def tnt_ap(scores, targets):
    """CLIP_benchmark's average_precision_per_class (from torchnet), in numpy."""
    ap = []
    for k in range(scores.shape[1]):
        order = np.argsort(-scores[:, k], kind="stable")
        truth = targets[order, k]
        tp = np.cumsum(truth)
        prec = tp / np.arange(1, len(truth) + 1)
        ap.append(prec[truth.astype(bool)].sum() / max(truth.sum(), 1))
    return np.array(ap)


def test_average_precision_equals_sklearn_with_ties_and_clip_benchmark_without():
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(3)
    targets = rng.random((80, 5)) < 0.3
    targets[0] = True
    tied = rng.integers(0, 4, (80, 5)).astype(float)  # heavy ties
    ap = AveragePrecision(tied, targets).per_class()
    for c in range(5):
        assert ap[c] == pytest.approx(average_precision_score(targets[:, c], tied[:, c]))
    smooth = rng.normal(size=(80, 5))
    np.testing.assert_allclose(AveragePrecision(smooth, targets).per_class(), tnt_ap(smooth, targets.astype(float)))


def test_average_precision_hand_case_and_classes_without_positives():
    scores = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
    targets = np.array([[1, 0], [0, 0], [1, 0]], dtype=bool)
    ap = AveragePrecision(scores, targets)
    assert ap.per_class()[0] == pytest.approx((1 / 1 + 2 / 3) / 2)
    assert np.isnan(ap.per_class()[1])
    assert ap.mean() == pytest.approx((1 + 2 / 3) / 2)  # the class without positives is left out


def test_weighted_average_precision_equals_resampled_data():
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(4)
    scores = rng.normal(size=(40, 3))
    targets = rng.random((40, 3)) < 0.4
    targets[:3] = True
    idx = rng.integers(0, 40, 40)
    w = np.bincount(idx, minlength=40).astype(float)
    got = AveragePrecision(scores, targets).per_class(w)
    for c in range(3):
        if targets[idx, c].any():
            assert got[c] == pytest.approx(average_precision_score(targets[idx, c], scores[idx, c]))


# ----------------------------------------------------------------------------------------------------
# retrieval
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_bytes", [8 * 7 * 5, 8 * 64 * 64, 2**26])
def test_retrieval_ranks_equal_full_sort_with_several_captions(block_bytes):
    rng = np.random.default_rng(5)
    n_i = 37
    images = unit(rng.normal(size=(n_i, 8)))
    owner = np.concatenate([np.arange(n_i), rng.integers(0, n_i, 60)])  # 1 to several captions per image
    texts = unit(images[owner] + rng.normal(scale=1.0, size=(len(owner), 8)))
    i2t, t2i = retrieval_ranks(images, texts, owner, block_bytes=block_bytes)
    for k in (1, 5, 10):
        ih, ir, th, tr = ref_retrieval(images, texts, owner, k)
        np.testing.assert_allclose(i2t.hits(k), ih)
        np.testing.assert_allclose(t2i.hits(k), th)
    np.testing.assert_allclose(i2t.rank(), ir)
    np.testing.assert_allclose(t2i.rank(), tr)
    assert (i2t.tied == 0).all() and (t2i.tied == 0).all()


@pytest.mark.parametrize("case", ["spread", "ties", "crowded"])
def test_retrieval_ranks_in_torch_equal_numpy(case, monkeypatch):
    """The blocks in torch (the default; on a GPU in retrieve, here on the CPU), the near-threshold scores
    redone in float64, a few blocks' worth at a time: the same counts, exactly, as the plain numpy pass
    (device=None), with many exact ties (duplicated embeddings) and with blocks so crowded near the
    thresholds that they fall back to float64."""
    import torch

    import vltool.metrics as metrics

    near_calls = []
    real_near = metrics._near_exact
    monkeypatch.setattr(metrics, "_near_exact", lambda *a, **k: near_calls.append(len(a[2])) or real_near(*a, **k))

    rng = np.random.default_rng(7)
    n_i = 53
    images = unit(rng.normal(size=(n_i, 16)))
    owner = np.concatenate([np.arange(n_i), rng.integers(0, n_i, 40)])
    texts = unit(images[owner] + rng.normal(scale=0.8, size=(len(owner), 16)))
    if case == "ties":  # copies of images and texts: scores equal to the thresholds
        images[10:20] = images[0]
        texts[30:60] = texts[owner == 0][0]
    if case == "crowded":  # nearly one direction: most scores within rounding of each other
        images = unit(np.ones((n_i, 16)) + 1e-7 * rng.normal(size=(n_i, 16)))
        texts = unit(np.ones((len(owner), 16)) + 1e-7 * rng.normal(size=(len(owner), 16)))
    before = torch.backends.cuda.matmul.allow_tf32
    for block_bytes, cpu_block, flush in ((8 * 16 * 16, (1024, 1024), 1 << 16), (2**26, (1024, 1024), 1 << 16), (2**26, (16, 16), 1)):
        monkeypatch.setattr(metrics, "CPU_BLOCK", cpu_block)  # (16, 16): blocks of 16 x 1024 texts at most
        monkeypatch.setattr(metrics._TorchBlocks, "FLUSH_PAIRS", flush)  # 1: redone after every block
        ref = retrieval_ranks(images, texts, owner, block_bytes=block_bytes, device=None)
        near_calls.clear()
        for got in (retrieval_ranks(images, texts, owner, block_bytes=block_bytes),
                    retrieval_ranks(images, texts, owner, block_bytes=block_bytes, device=torch.device("cpu"))):
            for a, b in zip(ref, got):
                for field in ("greater", "tied", "tied_pos"):
                    assert np.array_equal(getattr(a, field), getattr(b, field)), field
        if case == "spread":  # (the others' blocks are crowded enough to be redone whole in float64)
            assert near_calls and all(near_calls), "the torch pass redid some near scores in float64"
    if case != "spread":
        assert (ref[0].tied > 0).any() or (ref[1].tied > 0).any()
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_retrieval_hand_case_any_caption_counts():
    # 3 images on the axes; image 0 has two captions, one of which is closer to image 1
    images = np.eye(3, dtype=np.float32)
    texts = unit(np.array([[0.2, 1.0, 0.0], [1.0, 0.0, 0.1], [0.0, 1.0, 0.3], [0.0, 0.1, 1.0]]))
    owner = np.array([0, 0, 1, 2])
    i2t, t2i = retrieval_ranks(images, texts, owner)
    # image 0: its caption 1 is its best text: rank 1 (caption 0 is not a "wrong" item for it)
    # image 1: text 0 (of image 0) scores above its own text 2: rank 2
    np.testing.assert_allclose(i2t.rank(), [1, 2, 1])
    np.testing.assert_allclose(i2t.hits(1), [1, 0, 1])
    # text 0 ranks image 1 first, its own image 0 second
    np.testing.assert_allclose(t2i.rank(), [2, 1, 1, 1])


def test_retrieval_duplicate_texts_are_ties_not_wins():
    images = unit(np.array([[1.0, 0.0], [0.0, 1.0]]))
    texts = unit(np.array([[1.0, 1.0], [1.0, 1.0]]))  # the same text for both images
    i2t, t2i = retrieval_ranks(images, texts, np.array([0, 1]))
    np.testing.assert_allclose(i2t.hits(1), [0.5, 0.5])  # its own text tied with the other image's
    np.testing.assert_allclose(t2i.hits(1), [0.5, 0.5])  # both images score the same
    np.testing.assert_allclose(t2i.rank(), [1.5, 1.5])


def test_retrieval_chance_equals_enumeration():
    n, k = 7, 3
    for p in (1, 2, 4, 5):
        hits = [any(i < p for i in order[:k]) for order in itertools.permutations(range(n))]
        assert retrieval_chance(n, np.array([p]), k)[0] == pytest.approx(np.mean(hits))
    assert retrieval_chance(100, np.array([1]), 10)[0] == pytest.approx(0.1)
    assert retrieval_chance(5, np.array([1]), 10)[0] == 1.0
    many = np.array([5, 1, 2, 5, 4, 1, 7, 2])  # per query, computed once per distinct count: the same numbers
    assert retrieval_chance(9, many, 3).tolist() == [retrieval_chance(9, np.array([p]), 3)[0] for p in many]


# ----------------------------------------------------------------------------------------------------
# medians and the bootstrap
# ----------------------------------------------------------------------------------------------------


def test_weighted_median_equals_median_of_repeated_data():
    rng = np.random.default_rng(6)
    for _ in range(50):
        v = rng.integers(0, 20, int(rng.integers(1, 12))).astype(float)
        w = rng.integers(0, 4, len(v)).astype(float)
        if w.sum() == 0:
            continue
        assert weighted_median(v, w) == np.median(np.repeat(v, w.astype(int)))


def test_bootstrap_is_seeded_and_covers_the_mean():
    rng = np.random.default_rng(7)
    x = rng.normal(loc=2.0, size=400)

    def stat(w):
        return {"mean": float(x.mean()) if w is None else float(w @ x / w.sum())}

    a = bootstrap(len(x), stat, 500, seed=1)["mean"]
    b = bootstrap(len(x), stat, 500, seed=1)["mean"]
    assert (a.low, a.high) == (b.low, b.high)
    se = x.std() / math.sqrt(len(x))
    assert a.low < x.mean() < a.high
    assert a.high - a.low == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert math.isnan(bootstrap(len(x), stat, 0)["mean"].low)


def test_stratified_draw_keeps_every_class_and_its_support():
    strata = np.array([0, 0, 0, 1, 2, 2, 5])
    draw = _stratified_draw(strata, np.random.default_rng(0))
    for _ in range(20):
        idx = draw()
        assert np.array_equal(np.bincount(strata[idx], minlength=6), np.bincount(strata, minlength=6))


@pytest.mark.parametrize("kind", ["random", "quantised", "collapsed"])
def test_float32_blocks_with_exact_refinement_equal_float64(kind):
    """The fast path (float32 products, near-threshold scores redone in float64) equals all-float64 blocks,
    with duplicates and near-ties (quantised embeddings), and when every score ties (collapsed model)."""
    rng = np.random.default_rng(8)
    n_i, d = 60, 16
    images = rng.normal(size=(n_i, d))
    if kind == "quantised":
        images = np.round(images * 2) / 2
    if kind == "collapsed":
        images = np.ones((n_i, d))
    images = unit(images)
    owner = np.concatenate([np.arange(n_i), rng.integers(0, n_i, 90)])
    texts = images[owner] + (0 if kind == "collapsed" else rng.normal(scale=0.7, size=(len(owner), d)))
    texts = unit(np.round(texts * 4) / 4 if kind == "quantised" else texts)
    texts[5] = texts[6]  # a duplicate text
    for block in (8 * 16 * 16, 2**26):
        fast = retrieval_ranks(images, texts, owner, block_bytes=block)
        ref = retrieval_ranks(images, texts, owner, block_bytes=block, exact=True)
        for f, r in zip(fast, ref):
            np.testing.assert_array_equal(f.greater, r.greater)
            np.testing.assert_array_equal(f.tied, r.tied)
            np.testing.assert_array_equal(f.tied_pos, r.tied_pos)
    if kind == "collapsed":  # every score equal: chance level, not 100%
        i2t, t2i = fast
        assert t2i.hits(1).mean() == pytest.approx(1 / n_i)


# ----------------------------------------------------------------------------------------------------
# cluster bootstrap (--group-column)
# ----------------------------------------------------------------------------------------------------


def _class_data(n=60, classes=4, seed=3):
    rng = np.random.default_rng(seed)
    target = rng.integers(0, classes, n)
    hit = (rng.random(n) < 0.6).astype(float)
    return target, hit


def _stat(target, hit, classes=4):
    def stat(w):
        w = np.ones(len(hit)) if w is None else w
        return {"acc": float(w @ hit / w.sum()), "mpcr": mean_per_class_recall(hit, target, classes, w)}

    return stat


@pytest.mark.parametrize("stratified", [True, False])
def test_singleton_groups_are_the_item_bootstrap(stratified):
    """Each example its own group draws exactly what the item bootstrap draws with the same seed."""
    target, hit = _class_data()
    strata = target if stratified else None
    plain = bootstrap(len(hit), _stat(target, hit), 300, seed=5, strata=strata)
    grouped = bootstrap(len(hit), _stat(target, hit), 300, seed=5, strata=strata, groups=np.array([f"img{i}" for i in range(len(hit))]))
    assert {k: (v.low, v.high) for k, v in plain.items()} == {k: (v.low, v.high) for k, v in grouped.items()}


@pytest.mark.parametrize("stratified", [True, False])
def test_groups_of_identical_copies_give_the_interval_of_one_copy(stratified):
    """Every example twice, the two copies one group: the cluster bootstrap gives exactly the interval of the
    data without the copies; resampling images instead (the group column ignored) gives a narrower one,
    about 1/sqrt(2) as wide: perfectly correlated duplicates counted as independent evidence."""
    target, hit = _class_data(n=80)
    dup_t, dup_h = np.repeat(target, 2), np.repeat(hit, 2)
    groups = np.repeat([f"base{i}" for i in range(len(hit))], 2)
    strata, dup_strata = (target, dup_t) if stratified else (None, None)
    one = bootstrap(len(hit), _stat(target, hit), 400, seed=2, strata=strata)
    cluster = bootstrap(len(dup_h), _stat(dup_t, dup_h), 400, seed=2, strata=dup_strata, groups=groups)
    images = bootstrap(len(dup_h), _stat(dup_t, dup_h), 400, seed=2, strata=dup_strata)
    for k in one:
        assert (cluster[k].low, cluster[k].high) == pytest.approx((one[k].low, one[k].high), rel=1e-12, abs=1e-12)
        ratio = (images[k].high - images[k].low) / (cluster[k].high - cluster[k].low)
        assert 0.55 < ratio < 0.85, (k, ratio)


def test_resampling_draws_whole_groups_within_their_class():
    from vltool.metrics import Resampling

    target = np.array([0, 0, 0, 0, 1, 1, 1])
    groups = np.array(["a", "a", "b", "c", "d", "d", "e"])  # 3 groups in class 0, 2 in class 1
    plan = Resampling.make(len(target), target, groups, min_per_stratum=2)  # (the default asks 5 groups a class)
    assert plan.grouped and plan.stratified and plan.n_units == 5 and plan.spanning == 0
    assert plan.unit("image", "base_id") == "base_id group (5 groups of 7 images), within its class"
    assert plan.record("base_id") == {"group_column": "base_id", "units": 5, "stratified": True, "groups_spanning_strata": 0,
                                      "strata_below_min": 0, "min_units_per_stratum": 2}
    draw = plan.sampler(np.random.default_rng(0))
    seen = set()
    for _ in range(200):
        w = draw()
        assert w[0] == w[1] and w[4] == w[5]  # a group is drawn whole
        assert w[0] + w[2] + w[3] == 3 and w[4] + w[6] == 2  # each class keeps its 3 and 2 groups
        seen.add(tuple(w))
    assert len(seen) > 10


def test_groups_spanning_classes_are_drawn_without_strata():
    from vltool.metrics import Resampling

    target = np.array([0, 0, 1, 1, 1])
    groups = np.array(["a", "a", "a", "b", "c"])  # group a spans classes 0 and 1
    plan = Resampling.make(len(target), target, groups)
    assert plan.grouped and not plan.stratified and plan.spanning == 1
    assert plan.unit("image", "base_id") == "base_id group (3 groups of 5 images), not stratified: 1 groups span several classes"
    assert plan.record("base_id")["stratified"] is False
    draw = plan.sampler(np.random.default_rng(1))
    totals = set()
    for _ in range(100):
        w = draw()
        assert w[0] == w[1] == w[2]
        totals.add(w[0])
    assert 0 in totals and 2 in totals  # group a drawn 0..3 times: classes are not kept


def test_classes_with_too_few_groups_to_vary_are_not_strata():
    """A class holding one group draws that group in every stratified resample and adds no variance: with
    classes of 1-2 groups the stratified cluster bootstrap is no wider than the single-image one. So strata
    apply only when every class holds at least 5 groups (or 5 images, without groups); else whole groups are
    drawn without strata, and the record says why."""
    from vltool.metrics import MIN_UNITS_PER_STRATUM, Resampling, bootstrap

    assert MIN_UNITS_PER_STRATUM == 5
    # 4 classes: one group each holding 3 images, every image of a group with the same hit
    target = np.repeat(np.arange(4), 3)
    groups = np.repeat(np.array(["a", "b", "c", "d"]), 3)
    hits = np.repeat(np.array([1.0, 0.0, 1.0, 0.0]), 3)
    plan = Resampling.make(len(target), target, groups)
    assert plan.grouped and not plan.stratified and plan.small_strata == 4
    assert plan.unit("image", "base_id") == "base_id group (4 groups of 12 images), not stratified: 4 classes hold fewer than 5 groups"
    assert plan.record("base_id")["strata_below_min"] == 4 and plan.record("base_id")["stratified"] is False

    def acc(w=None):
        return {"top1": float(hits.mean() if w is None else (w @ hits) / w.sum())}

    plain = bootstrap(len(hits), acc, 2000, 0, resampling=plan)["top1"]
    forced = bootstrap(len(hits), acc, 2000, 0, resampling=Resampling.make(len(target), target, groups, min_per_stratum=1))["top1"]
    assert (forced.low, forced.high) == (0.5, 0.5)  # stratified: every class draws its only group, no variance at all
    assert plain.low <= 0.25 and plain.high >= 0.75  # 4 groups drawn with replacement: the mean varies
    # every class with 5 groups: stratified again
    target5 = np.repeat(np.arange(2), 5)
    plan5 = Resampling.make(10, target5, np.arange(10))
    assert plan5.stratified and plan5.unit("image", "base_id").endswith("within its class")
    # without groups, the same rule for images
    assert not Resampling.make(len(target), target).stratified
    assert Resampling.make(10, target5).stratified


def test_an_absurd_bootstrap_count_is_refused_with_the_memory_it_would_take(cli, tmp_path):
    """`--bootstrap 1000000000` was "internal error (MemoryError: Unable to allocate 22.4 GiB ...)" (issue 44):
    the replicates are kept for the percentiles, 8 bytes a metric each. Over MAX_BOOTSTRAP it is a usage error,
    at the option (before any work) and in bootstrap() itself (what the report's paired bootstrap calls)."""
    from vltool.errors import UsageError
    from vltool.metrics import MAX_BOOTSTRAP

    calls = []
    with pytest.raises(UsageError, match=r"--bootstrap 1000000000 resamples is over the limit of 1,000,000: .* 22\.4 GiB for 3 metrics"):
        bootstrap(10, lambda w: calls.append(1) or {"a": 0.0, "b": 0.0, "c": 0.0}, n_boot=10**9)
    assert len(calls) == 1  # (the names only: no resample was drawn)
    iv = bootstrap(4, lambda w: {"m": 0.0 if w is None else float(w[0])}, n_boot=MAX_BOOTSTRAP // 10000)
    assert iv["m"].low >= 0
    for command in ("zeroshot", "retrieve", "probe", "benchmark", "report"):
        r = cli(command, "--bootstrap", str(10**9), "emoji", "--out", tmp_path / command)
        assert r.exit_code == 2, (command, r.stderr)
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("error: Invalid value for '--bootstrap': 1000000000 resamples is over the limit of 1,000,000") \
            and "7.5 GiB per metric" in line and "give 1000" in line, (command, line)
        assert not (tmp_path / command).exists()


def test_a_bootstrap_just_over_the_limit_gives_the_reason_that_holds():
    """`--bootstrap 1000001` justified its limit with "their replicates alone would take 0.0 GiB per metric"
    (issue 53): the memory is named only where it is a reason."""
    from vltool.metrics import resamples_problem

    line = resamples_problem(1_000_001)
    assert "GiB" not in line and "recomputes every metric" in line and "give 1000" in line, line
    assert "7.5 GiB per metric" in resamples_problem(10**9)


# ----------------------------------------------------------------------------------------------------
# the metrics' registry (vltool.metrics.ALL_METRICS): one declaration per metric
# ----------------------------------------------------------------------------------------------------


def _retrieval_items(greater_i, greater_t, owner, ks):
    """RetrievalItems from per-query counts of wrong items above (no ties)."""
    from vltool.metrics import QueryRanks, RetrievalItems

    n_i, n_t = len(greater_i), len(greater_t)
    per_image = np.bincount(owner, minlength=n_i)
    z_i, z_t = np.zeros(n_i, dtype=np.int64), np.zeros(n_t, dtype=np.int64)
    i2t = QueryRanks(np.asarray(greater_i), z_i, z_i + 1, n_t, per_image)
    t2i = QueryRanks(np.asarray(greater_t), z_t, z_t + 1, n_i, np.ones(n_t, dtype=np.int64))
    return RetrievalItems.from_ranks(ks, i2t, t2i, owner)


def test_every_metric_declares_its_direction_chance_and_meaning():
    from vltool.metrics import ALL_METRICS

    names = [m.name for m in ALL_METRICS]
    assert len(set(names)) == len(names)
    for m in ALL_METRICS:
        assert isinstance(m.higher_is_better, bool), f"{m.name}: no direction (vltool.metrics)"
        assert callable(m.value) and callable(m.chance), f"{m.name}: no value or chance level (vltool.metrics)"
        assert m.chance_doc.strip() and m.meaning.strip(), f"{m.name}: its chance level is not described (vltool.metrics)"


def test_retrieval_results_and_chance_levels_name_the_registered_metrics_in_order():
    """The metrics RetrievalItems computes and the chance levels are both RETRIEVAL_METRICS, K by K, in its order."""
    from vltool.metrics import RETRIEVAL_METRICS, retrieval_chance_levels

    ks = [1, 2, 5]
    owner = np.array([0, 0, 1, 2, 3, 3, 4])
    items = _retrieval_items([0, 3, 1, 5, 0], [0, 1, 2, 0, 4, 1, 0], owner, ks)
    names = [name for m in RETRIEVAL_METRICS for name, _ in m.at(ks)]
    assert list(items.metrics()) == names == list(retrieval_chance_levels(ks, 5, 7, np.bincount(owner)))
    assert names[:5] == ["image_to_text_R@1", "image_to_text_R@2", "image_to_text_R@5", "image_to_text_mean_rank",
                         "image_to_text_median_rank"]
    w = np.array([2.0, 0, 1, 1, 1])
    assert list(items.metrics(w)) == names and all(np.isfinite(v) for v in items.metrics(w).values())


def test_classification_results_and_chance_levels_name_the_registered_metrics():
    from vltool.evaluation import classification_chance
    from vltool.metrics import CLASSIFICATION_METRICS

    rng = np.random.default_rng(0)
    for c in (3, 6):
        target = rng.integers(0, c, 40)
        items = ClassificationItems.from_scores(rng.normal(size=(40, c)), target)
        got = items.metrics()
        assert list(got) == [m.name for m in CLASSIFICATION_METRICS if m.applies(items)]
        assert ("top5" in got) == (c >= 5)
        chance = classification_chance(target, c)
        assert list(chance) == [m.name for m in CLASSIFICATION_METRICS] + ["majority_class"]
        assert all(chance[k] is not None for k in got)


def test_each_direction_puts_a_perfect_ranking_above_chance_and_the_worst_below():
    """A metric's direction is the side of its chance level a perfect ranking is on: every correct item first
    (better than chance), every correct item last (worse)."""
    from vltool.metrics import CLASSIFICATION_METRICS, MAP, RETRIEVAL_METRICS, ClassCounts, RetrievalCounts

    ks = [1, 3]
    owner = np.repeat(np.arange(6), 2)  # (12,) two texts an image
    n_i, n_t = 6, 12
    best = _retrieval_items(np.zeros(n_i, int), np.zeros(n_t, int), owner, ks).metrics()
    worst = _retrieval_items(np.full(n_i, n_t - 2), np.full(n_t, n_i - 1), owner, ks).metrics()
    counts = RetrievalCounts(n_i, n_t, np.bincount(owner))
    target = np.arange(8) % 6
    cls_best = ClassificationItems.from_ranks(np.zeros(8, int), np.zeros(8, int), target, 6)
    cls_worst = ClassificationItems.from_ranks(np.full(8, 5), np.zeros(8, int), target, 6)
    cases = [(m, name, k, best[name], worst[name], counts) for m in RETRIEVAL_METRICS for name, k in m.at(ks)]
    cases += [(m, m.name, None, cls_best.metrics()[m.name], cls_worst.metrics()[m.name], ClassCounts(target, 6))
              for m in CLASSIFICATION_METRICS]
    y = np.eye(6, dtype=bool)[np.arange(60) % 6]  # (60, 6): 10 positives a class
    jitter = np.random.default_rng(0).uniform(0, 0.1, y.shape)  # no ties: positives first, or last one by one
    cases.append((MAP, "mAP", None, MAP.value(AveragePrecision(y + jitter, y), None, None),
                  MAP.value(AveragePrecision(1.0 - y + jitter, y), None, None), y))
    for m, name, k, good, bad, data in cases:
        c = m.chance(data, k)
        sign = 1 if m.higher_is_better else -1
        assert sign * (good - c) > 0 and sign * (bad - c) < 0, f"{name}: higher_is_better={m.higher_is_better} is wrong"


def test_the_metrics_table_in_docs_is_the_registry():
    import re
    from pathlib import Path

    from vltool.metrics import ALL_METRICS, metrics_markdown

    doc = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text()
    m = re.search(r"<!-- metrics:[^>]*-->\n(.*?)<!-- /metrics -->", doc, re.S)
    assert m, "docs/evaluation.md has lost its <!-- metrics --> markers"
    assert m.group(1) == metrics_markdown(), (
        "docs/evaluation.md's metrics table is not vltool.metrics.ALL_METRICS's: put the output of\n"
        "  python -c 'from vltool.metrics import metrics_markdown; print(metrics_markdown(), end=\"\")'\nbetween its markers")
    for metric in ALL_METRICS:
        assert f"| `{metric.name.replace('{k}', 'K')}` | {'higher' if metric.higher_is_better else 'lower'} |" in m.group(1)


def test_benchmark_headlines_are_registered_metrics():
    from vltool.benchmark import HEADLINE
    from vltool.metrics import ALL_METRICS

    names = {name for m in ALL_METRICS for name, _ in m.at([1, 5, 10])}
    for task, headline in HEADLINE.items():
        assert set(headline) <= names, f"vltool.benchmark.HEADLINE[{task!r}] names an unregistered metric"
