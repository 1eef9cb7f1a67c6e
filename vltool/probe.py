"""`vltool probe`: a linear classifier on frozen image features, with the papers' protocols as presets.

Features come through the embedding cache (vltool.encode): `post` the projection (the model's L2-normalised
embedding) or `pre` it (the image tower's pooled features). Protocols (docs/evaluation.md):

- `clip-benchmark` CLIP_benchmark's `linear_probe.evaluate`: a linear layer trained with cross-entropy,
                   AdamW (lr 0.1), cosine schedule, 10 epochs, batch 64, on normalised features; weight
                   decay chosen on a validation split (`--val-frac`) by its coarse-to-fine search over
                   97 log-spaced values in [1e-6, 1e2] (7 coarse points, then spans 8, 4, 2, 1 around the
                   peak), refit on train+val (few-shot: on the few-shot rows only).
- `santurkar`      Santurkar et al., appendix A.3: SGD, momentum 0.9, weight decay 1e-6, batch 256, 250
                   epochs, loss reweighted for class imbalance, learning rate chosen on the validation split
                   from {0.03, 0.1, 0.3, 1, 3, 10} by class-balanced accuracy, 3 seeds (intervals resample
                   the test items and the seeds), features before the projection.
- `fff`            FFF, appendix A.2: AdamW, lr 0.1, no weight decay, cosine schedule, 20 epochs (batch 64, as
                   CLIP_benchmark, whose code FFF ran), on cached normalised features.
- `voc07-svm`      CLIP-Lite / VirTex: one linear SVM per class (scikit-learn `LinearSVC`, squared hinge,
                   positive class weight 2) on L2-normalised features before the projection, C in
                   {0.01, 0.1, 1, 10} chosen by 3-fold cross-validation on average precision, refit on all
                   training rows; mean average precision (single-label data: one-vs-rest).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from joblib import Parallel, delayed

from vltool import columns as C
from vltool import provenance
from vltool.cache import EmbeddingCache
from vltool.checks import image_column, require_decoded
from vltool.console import log as console_log
from vltool.errors import UsageError, VltoolError, check
from vltool.evaluation import (EvalCommon, Edit, bootstrap_record, check_out, classification_chance, debias_edit, encode_eval_images, entry,
                               load_eval_input, open_model, write_results)
from vltool.io.digests import rows_in_both
from vltool.io.loading import LoadedDataset
from vltool.metrics import MAP, AveragePrecision, ClassificationItems, Resampling, bootstrap, per_class_recall
from vltool.outcomes import base_arrays, example_ids, read_groups
from vltool.topology import computes, is_main, process_state, warn
from vltool.zeroshot import LabelInfo, read_labels

PROTOCOLS = ("clip-benchmark", "santurkar", "fff", "voc07-svm")


@dataclass(frozen=True)
class Preset:
    optimizer: str  # adamw | sgd | svm
    lr: float | None  # None: searched
    epochs: int
    batch_size: int
    weight_decay: float | None  # None: searched
    schedule: str  # cosine | constant
    momentum: float = 0.0
    reweight: bool = False  # cross-entropy weighted by inverse class frequency
    seeds: int = 1
    select_on: str = "top1"  # validation metric of the search
    features: str = "post"
    normalize: bool = True
    lr_grid: tuple = ()
    svm_costs: tuple = ()


PRESETS = {
    "clip-benchmark": Preset("adamw", 0.1, 10, 64, None, "cosine"),
    "fff": Preset("adamw", 0.1, 20, 64, 0.0, "cosine"),
    "santurkar": Preset(
        "sgd", None, 250, 256, 1e-6, "constant", momentum=0.9, reweight=True, seeds=3,
        select_on="mean_per_class_recall", features="pre", normalize=False, lr_grid=(0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
    ),
    "voc07-svm": Preset("svm", None, 0, 0, None, "", features="pre", normalize=True, svm_costs=(0.01, 0.1, 1.0, 10.0)),
}
WD_GRID = np.logspace(-6, 2, num=97)  # CLIP_benchmark's weight decay grid
WD_COARSE = [i for i, v in enumerate(WD_GRID.tolist()) if v in np.logspace(-6, 2, num=7).tolist()]  # its 7 coarse points (0, 16, ..., 96)


@dataclass
class ProbeConfig(EvalCommon):
    """Options of `vltool probe` (and, from EvalCommon, those of every evaluation command), one field per
    option of the same name (help: `vltool probe --help`)."""

    protocol: str = "clip-benchmark"  # a key of PRESETS
    features: str | None = None  # None: the protocol's
    normalize: bool | None = None  # None: the protocol's
    val_frac: float = 0.2
    fewshot_k: int | None = None
    label_column: str | None = None
    epochs: int | None = None
    lr: float | None = None

    def validate(self) -> Preset:
        problems = self.common_problems()
        preset = PRESETS.get(self.protocol)
        if preset is None:
            problems.append(f"--protocol {self.protocol!r}: use one of {', '.join(PROTOCOLS)}")
        if self.features is not None and self.features not in ("pre", "post"):
            problems.append(f"--features {self.features!r}: use pre or post")
        if not 0 <= self.val_frac < 1:
            problems.append(f"--val-frac must be in [0, 1), got {self.val_frac}")
        if self.fewshot_k is not None and self.fewshot_k < 1:
            problems.append(f"--fewshot-k must be >= 1, got {self.fewshot_k}")
        if self.protocol == "voc07-svm" and self.fewshot_k is not None:
            problems.append("--fewshot-k does not apply to --protocol voc07-svm")
        if self.epochs is not None and self.epochs < 1:
            problems.append(f"--epochs must be >= 1, got {self.epochs}")
        if self.lr is not None and self.lr <= 0:
            problems.append(f"--lr must be > 0, got {self.lr}")
        if self.debias_text and self.debias:
            problems.append("--debias-text edits text embeddings, and a probe reads image features only: leave it out")
        elif self.debias and preset is not None and (self.features or preset.features) != "post":
            problems.append("--debias edits the shared embedding space: use --features post with it")
        if preset is not None and preset.optimizer != "svm":
            searches = preset.weight_decay is None or (preset.lr is None and self.lr is None)
            if searches and self.val_frac == 0:
                problems.append(f"--protocol {self.protocol} chooses a hyper-parameter on a validation split; --val-frac must be > 0")
        check(problems)
        return preset


# ----------------------------------------------------------------------------------------------------
# Linear classifiers on features
# ----------------------------------------------------------------------------------------------------


def cosine_lr(base_lr: float, step: int, total: int) -> float:
    """CLIP_benchmark's cosine schedule without warmup."""
    return 0.5 * (1 + math.cos(math.pi * step / total)) * base_lr


def train_linear(
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    *,
    optimizer: str,
    lr: float,
    epochs: int,
    batch_size: int,
    weight_decay: float,
    schedule: str,
    momentum: float = 0.0,
    class_weight: np.ndarray | None = None,
    seed: int = 0,
):
    """A torch nn.Linear trained with cross-entropy on (x, y); shuffled mini-batches (the last one partial).

    Runs on one intra-op thread: the matrices are tiny, and more threads only add synchronisation (5x
    slower per step on a busy 2-core machine).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_linear(x, y, num_classes, optimizer=optimizer, lr=lr, epochs=epochs, batch_size=batch_size,
                             weight_decay=weight_decay, schedule=schedule, momentum=momentum, class_weight=class_weight, seed=seed)
    finally:
        torch.set_num_threads(threads)


def _train_linear(x, y, num_classes, *, optimizer, lr, epochs, batch_size, weight_decay, schedule, momentum, class_weight, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torch.nn.Linear(x.shape[1], num_classes)
        gen = torch.Generator().manual_seed(seed)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    else:
        raise ValueError(optimizer)
    weight = torch.as_tensor(class_weight, dtype=torch.float32) if class_weight is not None else None
    loss_fn = torch.nn.CrossEntropyLoss(weight=weight)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    n = len(xt)
    per_epoch = math.ceil(n / batch_size)
    total = epochs * per_epoch
    step = 0
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for a in range(0, n, batch_size):
            idx = perm[a : a + batch_size]
            if schedule == "cosine":
                for g in opt.param_groups:
                    g["lr"] = cosine_lr(lr, step, total)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            step += 1
    return model


def predict(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).double().numpy()


def balanced_class_weight(y: np.ndarray, num_classes: int) -> np.ndarray:
    """n / (classes present x n_c) per class (scikit-learn's "balanced"); 0 for absent classes."""
    counts = np.bincount(y, minlength=num_classes).astype(np.float64)
    present = counts > 0
    w = np.zeros(num_classes)
    w[present] = len(y) / (present.sum() * counts[present])
    return w


# ----------------------------------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------------------------------


def val_split(n: int, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, val rows): a seeded random `frac` of the rows held out (at least one when frac > 0)."""
    if frac <= 0:
        return np.arange(n), np.arange(0)
    perm = np.random.default_rng([seed, 1]).permutation(n)
    n_val = max(1, int(round(frac * n)))
    if n_val >= n:
        raise UsageError(f"--val-frac {frac} leaves no training rows out of {n}")
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def fewshot_rows(y: np.ndarray, k: int, seed: int, classnames: Sequence[str]) -> np.ndarray:
    """k rows of each class present (seeded); a class with fewer than k rows is an error."""
    rng = np.random.default_rng([seed, 2])
    rows = []
    short = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        if len(idx) < k:
            short.append((classnames[c], len(idx)))
            continue
        rows.append(np.sort(rng.choice(idx, size=k, replace=False)))
    if short:
        raise UsageError(
            f"--fewshot-k {k}: {len(short)} classes have fewer training rows, e.g. "
            + ", ".join(f"{n!r} ({c})" for n, c in short[:3])
            + "; choose a smaller k or select rows with --where"
        )
    return np.sort(np.concatenate(rows))


# ----------------------------------------------------------------------------------------------------
# Protocols
# ----------------------------------------------------------------------------------------------------


@dataclass
class Fit:
    scores: list[np.ndarray]  # per seed: eval scores (N_eval, C)
    chosen: dict  # hyper-parameters chosen
    search: list[dict] = field(default_factory=list)  # what the search tried, with the validation metric


def _val_metric(scores: np.ndarray, y: np.ndarray, num_classes: int, name: str) -> float:
    return ClassificationItems.from_scores(scores, y, num_classes).metrics()[name]


def fit_softmax(x_tr, y_tr, x_ev, classnames: Sequence[str], preset: Preset, config: ProbeConfig, log) -> Fit:
    """The cross-entropy protocols: search on a validation split when the preset asks, refit, predict."""
    num_classes = len(classnames)
    epochs = config.epochs or preset.epochs
    base = dict(optimizer=preset.optimizer, epochs=epochs, batch_size=preset.batch_size, schedule=preset.schedule, momentum=preset.momentum)
    searched_wd = preset.weight_decay is None
    searched_lr = preset.lr is None and config.lr is None
    lr = config.lr if config.lr is not None else preset.lr
    wd = preset.weight_decay
    search: list[dict] = []

    def cw(y):
        return balanced_class_weight(y, num_classes) if preset.reweight else None

    tr, va = val_split(len(y_tr), config.val_frac, config.seed) if (searched_wd or searched_lr) else (np.arange(len(y_tr)), np.arange(0))
    if config.fewshot_k is not None:
        tr = tr[fewshot_rows(y_tr[tr], config.fewshot_k, config.seed, classnames)]
    if searched_wd or searched_lr:
        seen: dict[tuple[float, float], float] = {}

        def score(lr_, wd_):
            key = (lr_, wd_)
            if key not in seen:
                model = train_linear(x_tr[tr], y_tr[tr], num_classes, lr=lr_, weight_decay=wd_, class_weight=cw(y_tr[tr]), seed=config.seed, **base)
                seen[key] = _val_metric(predict(model, x_tr[va]), y_tr[va], num_classes, preset.select_on)
                search.append({"lr": lr_, "weight_decay": wd_, f"val_{preset.select_on}": seen[key]})
                log(f"probe: lr {lr_:g} weight decay {wd_:.3g}: validation {preset.select_on} {100 * seen[key]:.2f}%")
            return seen[key]

        if searched_wd:
            # CLIP_benchmark's find_peak: the best of the points tried (the first one on a tie)
            def peak(idxs):
                vals = [score(lr, float(WD_GRID[i])) for i in idxs]
                return idxs[int(np.argmax(vals))]

            p = peak(WD_COARSE)
            span = 8
            while span > 0:
                p = peak([max(p - span, 0), p, min(p + span, len(WD_GRID) - 1)])
                span //= 2
            wd = float(WD_GRID[p])
        if searched_lr:
            vals = [score(g, wd) for g in preset.lr_grid]
            lr = float(preset.lr_grid[int(np.argmax(vals))])
        # refit on train + val, except in few-shot (which would add rows beyond the k per class)
        if config.fewshot_k is None:
            tr = np.arange(len(y_tr))
    scores = []
    for s in range(preset.seeds):
        model = train_linear(x_tr[tr], y_tr[tr], num_classes, lr=lr, weight_decay=wd, class_weight=cw(y_tr[tr]), seed=config.seed + s, **base)
        scores.append(predict(model, x_ev))
    chosen = {"lr": lr, "weight_decay": wd, "epochs": epochs, "batch_size": preset.batch_size, "optimizer": preset.optimizer,
              "schedule": preset.schedule, "momentum": preset.momentum, "reweight": preset.reweight,
              "seeds": [config.seed + s for s in range(preset.seeds)], "train_rows": int(len(tr))}
    return Fit(scores, chosen, search)


def fit_svm(x_tr, y_tr, x_ev, classnames: Sequence[str], preset: Preset, config: ProbeConfig, log) -> Fit:
    """One LinearSVC per class (VirTex's VOC07 protocol); y_tr (N, C) bool. Classes without both a positive
    and a negative training row get no classifier (their eval scores are NaN and they are left out)."""
    from sklearn.exceptions import ConvergenceWarning  # (scikit-learn: for this protocol only)
    from sklearn.model_selection import cross_val_score
    from sklearn.svm import LinearSVC

    costs = preset.svm_costs
    num_classes = len(classnames)

    def one(c):
        y = y_tr[:, c].astype(int)
        if y.sum() == 0 or y.sum() == len(y):
            return c, None, None, []
        tried = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=ConvergenceWarning)
            warnings.simplefilter("ignore", category=UserWarning)
            warnings.simplefilter("ignore", category=RuntimeWarning)
            for cost in costs:
                clf = LinearSVC(C=cost, class_weight={1: 2, 0: 1}, intercept_scaling=1.0, penalty="l2", loss="squared_hinge", tol=1e-4, dual=True, max_iter=2000)
                folds = cross_val_score(clf, x_tr, y, cv=3, scoring="average_precision", error_score=np.nan)
                tried.append(float(np.nanmean(folds)) if np.isfinite(folds).any() else float("nan"))
            finite = [(v, i) for i, v in enumerate(tried) if np.isfinite(v)]
            best = costs[max(finite, key=lambda t: (t[0], -t[1]))[1]] if finite else 1.0
            clf = LinearSVC(C=best, class_weight={1: 2, 0: 1}, intercept_scaling=1.0, penalty="l2", loss="squared_hinge", tol=1e-4, dual=True, max_iter=2000)
            clf.fit(x_tr, y)
        return c, best, clf.decision_function(x_ev), tried

    results = Parallel(n_jobs=config.threads or 1, prefer="threads")(delayed(one)(c) for c in range(num_classes))
    scores = np.full((len(x_ev), num_classes), np.nan)
    chosen_c, search = {}, []
    for c, best, s, tried in results:
        if s is None:
            continue
        scores[:, c] = s
        chosen_c[classnames[c]] = best
        search.append({"class": classnames[c], "cv_ap": dict(zip(map(str, costs), tried)), "C": best})
    log(f"probe: {len(chosen_c)} of {num_classes} classes have an SVM")
    return Fit([scores], {"C": chosen_c, "costs": list(costs), "class_weight": {"positive": 2, "negative": 1}, "cv_folds": 3, "train_rows": int(len(x_tr))}, search)


# ----------------------------------------------------------------------------------------------------
# The command's function
# ----------------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------------
# The command: load and check the inputs -> features -> fit and score -> the record
# ----------------------------------------------------------------------------------------------------


@dataclass
class ProbeInputs:
    """The training and eval data, checked (rows selected, disjoint, the same classes), with their labels."""

    train: LoadedDataset
    evald: LoadedDataset
    out_path: Path | None
    lab_tr: LabelInfo
    lab_ev: LabelInfo
    groups: np.ndarray | None  # (N_eval,) --group-column values, or None


@dataclass
class ProbeFeatures:
    """The image features the probe fits and scores on, the decodable rows only."""

    x_tr: np.ndarray  # (N_train, D) float32
    x_ev: np.ndarray  # (N_eval, D)
    y_tr: np.ndarray  # (N_train,) class index, or (N_train, C) bool when multi-label
    y_ev: np.ndarray
    keep_tr: np.ndarray  # (rows,) bool: decoded
    keep_ev: np.ndarray
    cache: dict  # the embedding cache's summary of each side
    features: str  # post | pre
    normalize: bool
    edit: Edit | None  # --debias


@dataclass
class ProbeScores:
    """The fitted probe's metrics with intervals and chance, per class, and the per-example outcomes."""

    fit: Fit
    metrics: dict
    chance: dict
    per_class: list[dict]
    note: str
    examples: dict
    plan: Resampling


@computes
def probe(
    train_data: str,
    eval_data: str,
    config: ProbeConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    eval_where: Sequence[str] = (),
    eval_split: str | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    argv: Sequence[str] | None = None,
    examples_out: Path | None = None,
) -> dict:
    """Fit a linear probe on `train_data`'s image features and evaluate it on `eval_data`."""
    timer = provenance.Timer()
    preset = config.validate()
    inputs = load_probe_inputs(train_data, eval_data, config, preset, where, split, eval_where, eval_split, out, overwrite)
    m, cache = open_model(config)
    feats = probe_features(m, cache, inputs, config, preset)
    score = score_svm if preset.optimizer == "svm" else score_softmax
    scores = score(feats, inputs, config, preset)
    return write_probe_record(m, inputs, feats, scores, config, timer, argv, overwrite, examples_out)


def load_probe_inputs(train_data: str, eval_data: str, config: ProbeConfig, preset: Preset, where, split, eval_where, eval_split,
                      out, overwrite: bool) -> ProbeInputs:
    """Both datasets (or CLIP_benchmark folders) loaded; --out checked against every input; no rows, rows in
    both, labels that differ between the two, or multi-label data without the SVM protocol refused."""
    train = load_eval_input(train_data, config, where, split, required=[C.IMAGE])
    evald = load_eval_input(eval_data, config, eval_where, eval_split, required=[C.IMAGE], split_option="--eval-split")
    image_column(train.dataset, C.IMAGE, train_data)
    image_column(evald.dataset, C.IMAGE, eval_data)
    out_path = check_out(out, overwrite, [*train.reads, *evald.reads, Path(train_data).expanduser(), Path(eval_data).expanduser()], config)
    if train.rows == 0 or evald.rows == 0:
        raise UsageError(f"no rows selected: {train.rows} training rows (--where {list(where)}), {evald.rows} eval rows (--eval-where {list(eval_where)})")
    refuse_rows_in_both(train, evald)
    lab_tr = read_labels(train.dataset, config.label_column, None, train_data)
    lab_ev = read_labels(evald.dataset, lab_tr.column, None, eval_data)
    groups = read_groups(evald.dataset, config.group_column, eval_data)
    if lab_tr.classnames != lab_ev.classnames or lab_tr.multilabel != lab_ev.multilabel:
        raise UsageError(f"the label column {lab_tr.column!r} has different classes in the training and the eval data")
    if lab_tr.multilabel and preset.optimizer != "svm":
        raise UsageError(f"{lab_tr.column!r} is multi-label; use --protocol voc07-svm (mean average precision)")
    require_two_classes(lab_tr, lab_tr.target, f"the training rows of {train_data!r} (--where {list(where)})")
    return ProbeInputs(train, evald, out_path, lab_tr, lab_ev, groups)


def require_two_classes(labels, target: np.ndarray, what: str, error: type[VltoolError] = UsageError) -> None:
    """A probe separates classes: training rows of one class only would score 100% (every prediction that
    class) beside a chance level of 1/C. Single-label data only (the SVM protocol fits each class apart)."""
    if labels.multilabel:
        return
    present = np.unique(np.asarray(target))
    if len(present) < 2:
        only = f" ({labels.classnames[int(present[0])]!r})" if len(present) else ""
        raise error(
            f"{what} hold {len(present)} class{only} of {labels.column!r}; a probe needs at least 2 classes in its "
            "training rows: select rows of several classes"
        )


def refuse_rows_in_both(train: LoadedDataset, evald: LoadedDataset) -> None:
    """Evaluation rows never reach training (two splits of one dataset may number their rows alike:
    vltool.io.rows_in_both compares their images there)."""
    if C.ID not in train.dataset.column_names or C.ID not in evald.dataset.column_names:
        return
    shared = rows_in_both(train, evald)
    if shared:
        raise UsageError(
            f"{len(shared)} rows are in both the training and the eval data (e.g. id {shared[0]!r}); "
            "evaluation rows never reach training: select disjoint rows (e.g. --where split=train --eval-where split=test)"
        )


def probe_features(m, cache: EmbeddingCache, inputs: ProbeInputs, config: ProbeConfig, preset: Preset) -> ProbeFeatures:
    """Both sides' image features (through the cache), undecodable images left out (with a warning), the
    --debias edit applied, L2-normalised when the protocol asks."""
    features = config.features or preset.features
    normalize = preset.normalize if config.normalize is None else config.normalize
    enc_tr = encode_eval_images(m, inputs.train, cache, config, features=features)
    enc_ev = encode_eval_images(m, inputs.evald, cache, config, features=features)
    keep_tr, keep_ev = ~enc_tr.bad, ~enc_ev.bad
    require_decoded(enc_tr.bad, inputs.train.spec)
    require_decoded(enc_ev.bad, inputs.evald.spec)
    if (~keep_tr).any() or (~keep_ev).any():
        warn(f"{int((~keep_tr).sum())} training and {int((~keep_ev).sum())} eval images could not be decoded and are left out")
    x_tr, x_ev = enc_tr.embeddings[keep_tr], enc_ev.embeddings[keep_ev]  # (N_train, D), (N_eval, D)
    require_two_classes(inputs.lab_tr, inputs.lab_tr.target[keep_tr], f"the training images of {inputs.train.spec!r} that decode", VltoolError)
    edit = debias_edit(m, config)
    if edit is not None:
        if features != "post":
            raise UsageError("--debias edits the shared embedding space: use --features post with it")
        x_tr, x_ev = edit.images(x_tr), edit.images(x_ev)
    if normalize:
        x_tr = x_tr / np.maximum(np.linalg.norm(x_tr, axis=1, keepdims=True), 1e-12)
        x_ev = x_ev / np.maximum(np.linalg.norm(x_ev, axis=1, keepdims=True), 1e-12)
    return ProbeFeatures(x_tr, x_ev, inputs.lab_tr.target[keep_tr], inputs.lab_ev.target[keep_ev], keep_tr, keep_ev,
                         {"train": enc_tr.summary(), "eval": enc_ev.summary()}, features, normalize, edit)


def _progress_log(config: ProbeConfig):
    """The search's progress lines (main process, with --progress)."""

    def log(msg):
        if config.progress and is_main():
            console_log(msg)

    return log


def _resampling_and_examples(feats: ProbeFeatures, inputs: ProbeInputs, config: ProbeConfig, kind: str) -> tuple[Resampling, dict]:
    """How the bootstrap resamples the eval images (by --group-column groups, within classes), and the
    per-example file's common arrays."""
    kept_groups = inputs.groups[feats.keep_ev] if inputs.groups is not None else None
    plan = Resampling.make(len(feats.x_ev), None if inputs.lab_ev.multilabel else feats.y_ev, kept_groups)
    ids = example_ids(inputs.evald.dataset)[feats.keep_ev]
    return plan, base_arrays("linear-probe", kind, ids, kept_groups, config.group_column)


def score_svm(feats: ProbeFeatures, inputs: ProbeInputs, config: ProbeConfig, preset: Preset) -> ProbeScores:
    """voc07-svm: one SVM per class, mean average precision over the classes with an SVM and a positive."""
    classnames, n_cls = inputs.lab_tr.classnames, len(inputs.lab_tr.classnames)
    plan, examples = _resampling_and_examples(feats, inputs, config, "map")
    yt = feats.y_tr if inputs.lab_tr.multilabel else np.eye(n_cls, dtype=bool)[feats.y_tr]  # (N_train, C) bool
    ye = feats.y_ev if inputs.lab_ev.multilabel else np.eye(n_cls, dtype=bool)[feats.y_ev]  # (N_eval, C) bool
    fit = fit_svm(feats.x_tr, yt, feats.x_ev, classnames, preset, config, _progress_log(config))
    has_clf = np.isfinite(fit.scores[0]).all(axis=0)  # (C,) classes with an SVM
    scores = np.nan_to_num(fit.scores[0][:, has_clf], nan=0.0)  # (N_eval, C')
    ap = AveragePrecision(scores, ye[:, has_clf])
    iv = bootstrap(len(feats.x_ev), lambda w: {MAP.name: MAP.value(ap, w, None)}, config.bootstrap, config.seed, resampling=plan)
    examples.update(scores=scores, targets=ye[:, has_clf])
    if not inputs.lab_ev.multilabel:
        examples["class"] = feats.y_ev
    chance = {MAP.name: MAP.chance(ye[:, has_clf], None)}
    per_ap = np.full(n_cls, np.nan)
    per_ap[has_clf] = ap.per_class()
    per_class = [{"class": c, "positives": int(ye[:, j].sum()), "ap": None if np.isnan(per_ap[j]) else float(per_ap[j])} for j, c in enumerate(classnames)]
    return ProbeScores(fit, {MAP.name: entry(MAP.value(ap, None, None), iv[MAP.name], chance[MAP.name])}, chance, per_class,
                       "mean average precision over the classes with an SVM and an eval positive (scikit-learn's AP)", examples, plan)


def score_softmax(feats: ProbeFeatures, inputs: ProbeInputs, config: ProbeConfig, preset: Preset) -> ProbeScores:
    """A softmax probe per seed: top-1, top-5, mean per-class recall, the mean over seeds; the bootstrap
    resamples the eval images and, with several seeds, the seeds too."""
    classnames, n_cls = inputs.lab_tr.classnames, len(inputs.lab_tr.classnames)
    plan, examples = _resampling_and_examples(feats, inputs, config, "classification")
    fit = fit_softmax(feats.x_tr, feats.y_tr, feats.x_ev, classnames, preset, config, _progress_log(config))
    items = [ClassificationItems.from_scores(s, feats.y_ev, n_cls) for s in fit.scores]  # one per seed
    names = list(items[0].metrics().keys())

    def point(w=None):
        vals = [it.metrics(w) for it in items]
        return {k: float(np.mean([v[k] for v in vals])) for k in names}

    seed_rng = np.random.default_rng([config.seed, 3])

    def replicate(w):
        if w is None:
            return point()
        if len(items) == 1:
            return items[0].metrics(w)
        return items[int(seed_rng.integers(len(items)))].metrics(w)  # resample the seeds too

    value = point()
    iv = bootstrap(len(feats.x_ev), replicate, config.bootstrap, config.seed, resampling=plan)
    examples.update({"class": feats.y_ev, "greater": np.stack([it.greater for it in items]).astype(np.int32),
                     "tied": np.stack([it.tied for it in items]).astype(np.int32), "num_classes": np.asarray(n_cls, dtype=np.int64)})
    chance = classification_chance(feats.y_ev, n_cls)
    metrics = {k: entry(v, iv[k], chance[k]) for k, v in value.items()}
    recall, support = per_class_recall(np.mean([it.top1 for it in items], axis=0), feats.y_ev, n_cls)
    per_class = [{"class": c, "support": int(support[j]), "top1": None if np.isnan(recall[j]) else float(recall[j])} for j, c in enumerate(classnames)]
    return ProbeScores(fit, metrics, chance, per_class,
                       "top-1, top-5 (>= 5 classes), mean per-class recall (CLIP_benchmark's); the mean over seeds", examples, plan)


def write_probe_record(m, inputs: ProbeInputs, feats: ProbeFeatures, scores: ProbeScores, config: ProbeConfig, timer, argv,
                       overwrite: bool, examples_out: Path | None = None) -> dict:
    """The results record (provenance, model, data, protocol, metrics), written to --out with the examples."""
    train, evald, n = inputs.train, inputs.evald, int(len(feats.x_ev))
    stats = {
        "train_rows": int(len(feats.x_tr)),
        "eval_rows": n,
        "classes": len(inputs.lab_tr.classnames),
        "bad_images": int((~feats.keep_tr).sum() + (~feats.keep_ev).sum()),
        "feature_dim": int(feats.x_tr.shape[1]),
        "processes": process_state().num_processes,
        "cache": feats.cache,
    }
    data = {
        "train": {"spec": train.spec, "fingerprint": train.fingerprint, "split": train.split, "where": train.where, "rows": int(len(feats.x_tr))},
        "eval": {"spec": evald.spec, "fingerprint": evald.fingerprint, "split": evald.split, "where": evald.where, "rows": n},
        "label_column": inputs.lab_tr.column,
    }
    unit = scores.plan.unit("eval image", config.group_column) + (", and seed" if len(scores.fit.scores) > 1 else "")
    protocol = {
        "name": config.protocol,
        "debias": feats.edit.record if feats.edit is not None else None,
        "features": feats.features,
        "normalize": feats.normalize,
        "val_frac": config.val_frac,
        "fewshot_k": config.fewshot_k,
        "chosen": scores.fit.chosen,
        "search": scores.fit.search,
        "metrics": scores.note,
        "bootstrap": bootstrap_record(config.bootstrap, config.seed, unit, scores.plan, config.group_column),
    }
    results = {"classnames": inputs.lab_tr.classnames, "metrics": scores.metrics, "chance": scores.chance, "per_class": scores.per_class}
    return write_results("probe", config, [train, evald], m, task="linear-probe", data=data, protocol=protocol, results=results,
                         rows_out=n, stats=stats, timer=timer, argv=argv, out=inputs.out_path, overwrite=overwrite, examples=scores.examples,
                         examples_out=examples_out)
