"""`vltool zeroshot`: zero-shot classification with class prompts (CLIP_benchmark's definitions).

Each class embedding is the renormalised mean of the L2-normalised embeddings of its prompts (its
templates filled with its name, or its `--class-prompts`); an image's scores are its cosine similarities
with the class embeddings. Single-label data (`label`): top-1, top-5 (with at least 5 classes), mean
per-class recall. Multi-label data (`labels`, lists of class indices): mean average precision. Every
metric has a 95% bootstrap interval over the images and its chance level (docs/evaluation.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import datasets
import numpy as np
import torch
import torch.nn.functional as F

from vltool import columns as C
from vltool import provenance
from vltool.checks import require_decoded
from vltool.encode import encode_prompts
from vltool.errors import UsageError, VltoolError, check
from vltool.evaluation import (EvalCommon, Edit, bootstrap_record, check_out, classification_chance, data_record, debias_edit,
                               encode_eval_images, entry, load_eval_input, open_model, require_selected, write_results)
from vltool.io.digests import column_values
from vltool.io.loading import LoadedDataset
from vltool.metrics import MAP, AveragePrecision, ClassificationItems, Resampling, bootstrap, class_ranks, per_class_recall
from vltool.outcomes import base_arrays, example_ids, read_groups
from vltool.templates import AUTO, class_prompts, load_class_prompts, load_classnames, load_templates, resolve_templates
from vltool.topology import computes, process_state, warn


@dataclass
class ZeroshotConfig(EvalCommon):
    """Options of `vltool zeroshot` (and, from EvalCommon, those of every evaluation command), one field per
    option of the same name (help: `vltool zeroshot --help`)."""

    templates: str = "auto"  # a name in vltool.templates, a file, or auto (the dataset's own, else photo)
    classnames: str | None = None
    class_prompts: str | None = None
    label_column: str | None = None
    per_class: bool = False
    present_classes_only: bool = False

    def validate(self) -> None:
        problems = self.common_problems()
        try:
            if self.templates != AUTO:
                load_templates(self.templates)
        except UsageError as e:
            problems.append(str(e))
        for opt, val in (("--classnames", self.classnames), ("--class-prompts", self.class_prompts)):
            if val is not None and not Path(val).expanduser().is_file():
                problems.append(f"{opt} {val}: no such file")
        check(problems)


@dataclass
class LabelInfo:
    column: str
    multilabel: bool
    classnames: list[str]
    target: np.ndarray  # (N,) int, or (N, C) bool for multi-label


def only_present_classes(labels: LabelInfo) -> LabelInfo:
    """The classes with at least one selected row, and the targets renumbered among them (zero-shot on a
    held-out subset of classes, as UniCL's Table 6: the other classes are not candidates)."""
    if labels.multilabel:
        raise UsageError("--present-classes-only is for single-label data")
    present = np.flatnonzero(np.bincount(labels.target, minlength=len(labels.classnames)) > 0)
    remap = np.full(len(labels.classnames), -1, dtype=np.int64)
    remap[present] = np.arange(len(present))
    return dataclasses.replace(labels, classnames=[labels.classnames[i] for i in present], target=remap[labels.target])


def read_labels(ds, column: str | None, classnames_file: str | None, spec: str) -> LabelInfo:
    """The label column, its class names and the targets of the rows."""
    if column is None:
        column = C.LABEL if C.LABEL in ds.column_names else C.LABELS if C.LABELS in ds.column_names else None
        if column is None:
            raise UsageError(f"{spec!r} has no 'label' or 'labels' column (it has: {', '.join(ds.column_names)}); name one with --label-column")
    elif column not in ds.column_names:
        raise UsageError(f"{spec!r} has no column {column!r} (it has: {', '.join(ds.column_names)})")
    feat = ds.features[column]
    inner = getattr(feat, "feature", None)
    multilabel = isinstance(feat, (datasets.Sequence, datasets.List)) or (inner is not None and not isinstance(feat, datasets.ClassLabel))
    names: list[str] | None = None
    if isinstance(feat, datasets.ClassLabel):
        names = list(feat.names)
    elif multilabel and isinstance(inner, datasets.ClassLabel):
        names = list(inner.names)
    values = column_values(ds, column)
    if not multilabel and not isinstance(feat, datasets.ClassLabel):
        if not (isinstance(feat, datasets.Value) and feat.dtype.startswith(("int", "uint"))):
            raise UsageError(f"label column {column!r} must be a ClassLabel, integers or lists of integers (it is {feat})")
    if classnames_file is not None:
        names = load_classnames(classnames_file, len(names) if names is not None else None)
    if names is None:
        raise UsageError(f"label column {column!r} has no class names (not a ClassLabel); give them with --classnames FILE")
    n_cls = len(names)
    if multilabel:
        target = np.zeros((len(values), n_cls), dtype=bool)
        for i, labs in enumerate(values):
            for lab in labs or []:
                if not 0 <= int(lab) < n_cls:
                    raise VltoolError(f"row {i}: class index {lab} of {column!r} is outside 0..{n_cls - 1}")
                target[i, int(lab)] = True
    else:
        if any(v is None for v in values):
            raise VltoolError(f"{spec!r}: some rows have no {column!r}; select labelled rows with --where")
        target = np.asarray(values, dtype=np.int64)
        if target.size and (target.min() < 0 or target.max() >= n_cls):
            raise VltoolError(f"{column!r} holds class indices outside 0..{n_cls - 1}")
    return LabelInfo(column, multilabel, names, target)


def class_embeddings(prompt_emb: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """(sum(counts), D) prompt embeddings -> (C, D): per class, the renormalised mean of the normalised prompts.

    Float32 torch, in CLIP_benchmark's order of operations (F.normalize, mean, divide by the norm).
    """
    e = torch.from_numpy(np.ascontiguousarray(prompt_emb, dtype=np.float32))
    out, a = [], 0
    for n in counts:
        c = F.normalize(e[a : a + n], dim=-1).mean(dim=0)
        c = c / c.norm()
        out.append(c)
        a += n
    return torch.stack(out).numpy()


ROW_BLOCK = 16_384  # images scored at once: the (block, C) float64 scores are all that exist at a time


def ranks_in_blocks(x: np.ndarray, cls64: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image, the classes scoring above / tied with its true class (metrics.class_ranks), from the
    embeddings x (N, D) and the class embeddings (C, D) float64, ROW_BLOCK images at a time: the (N, C)
    score matrix never exists (1M images x 1,000 classes would be 8 GB)."""
    greater = np.empty(len(x), np.int64)
    tied = np.empty(len(x), np.int64)
    for a in range(0, len(x), ROW_BLOCK):
        b = min(len(x), a + ROW_BLOCK)
        scores = x[a:b].astype(np.float64) @ cls64.T  # (block, C) cosine similarities
        greater[a:b], tied[a:b] = class_ranks(scores, target[a:b])
    return greater, tied


@dataclass
class ZeroshotInputs:
    """What zeroshot reads, checked: the selected rows, their labels and groups, and where the record goes."""

    loaded: LoadedDataset
    labels: LabelInfo
    groups: np.ndarray | None  # (N,) the --group-column's values, or None
    all_classes: int  # classes of the label column (before --present-classes-only)
    out_path: Path | None


@dataclass
class Prompts:
    """The class prompts: per class, its prompts (its `--class-prompts`, else the templates filled with its name)."""

    template_name: str
    templates: list[str]
    custom: dict[str, list[str]] | None  # --class-prompts
    per_class: list[list[str]]

    @property
    def flat(self) -> list[str]:
        return [p for ps in self.per_class for p in ps]


@dataclass
class Scores:
    """What scoring gives: the metrics with their intervals and chance levels, the per-class table, and the
    per-example arrays of vltool.outcomes."""

    metrics: dict
    chance: dict
    per_class: list[dict]
    arrays: dict


@computes
def zeroshot(
    data: str,
    config: ZeroshotConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    argv: Sequence[str] | None = None,
    examples_out: Path | None = None,
) -> dict:
    """Evaluate zero-shot classification of `config.model` on `data`; returns the results record.

    Stages: load_inputs -> make_prompts -> encode (images; class_embeddings of the prompts) -> keep_decoded
    -> score_single_label or score_multilabel -> write_results.
    """
    timer = provenance.Timer()
    config.validate()
    inputs = load_inputs(data, config, where, split, out, overwrite)
    loaded, labels = inputs.loaded, inputs.labels
    prompts = make_prompts(config, labels.classnames, loaded.path)

    m, cache = open_model(config)
    img = encode_eval_images(m, loaded, cache, config)
    txt = encode_prompts(m, prompts.flat, cache=cache, batch_size=max(config.batch_size, 256), progress=config.progress,
                         precision=config.precision)
    cls = class_embeddings(txt.embeddings, [len(p) for p in prompts.per_class])  # (C, D)
    edit = debias_edit(m, config)
    if edit is not None:
        cls = edit.texts(cls)

    keep = keep_decoded(img.bad, data)  # (N_rows,) bool
    x = img.embeddings[keep]  # (N, D)
    if edit is not None:
        x = edit.images(x)
    target = labels.target[keep]  # (N,) or (N, C)
    task = "zeroshot-multilabel" if labels.multilabel else "zeroshot"
    kept_groups = inputs.groups[keep] if inputs.groups is not None else None
    plan = Resampling.make(len(x), None if labels.multilabel else target, kept_groups)
    examples = base_arrays(task, "map" if labels.multilabel else "classification", example_ids(loaded.dataset)[keep], kept_groups, config.group_column)
    score = score_multilabel if labels.multilabel else score_single_label
    scores = score(x, cls.astype(np.float64), target, labels.classnames, plan, config)
    examples.update(scores.arrays)

    stats = zeroshot_stats(inputs, target, keep, prompts, img, txt)
    return write_results(
        "zeroshot", config, [loaded], m, task=task, rows_out=int(len(x)), stats=stats, timer=timer, argv=argv,
        data=data_record(data, loaded, rows_evaluated=int(len(x)), label_column=labels.column),
        protocol=zeroshot_protocol(config, prompts, edit, plan),
        results={"classnames": labels.classnames, "metrics": scores.metrics, "chance": scores.chance, "per_class": scores.per_class},
        out=inputs.out_path, overwrite=overwrite, examples=examples, examples_out=examples_out,
    )


def load_inputs(data: str, config: ZeroshotConfig, where: Sequence[str], split: str | None, out, overwrite: bool) -> ZeroshotInputs:
    """Load the data, refuse a bad --out (before any work), read the labels and groups, and keep the classes
    that are candidates (all of the label column's, or with --present-classes-only those with a row)."""
    loaded = load_eval_input(data, config, where, split, images=[C.IMAGE])
    files = [config.classnames, config.class_prompts, config.templates if Path(config.templates).expanduser().is_file() else None]
    out_path = check_out(out, overwrite, [*loaded.reads, Path(data).expanduser(), *[Path(f) for f in files if f]], config)
    labels = read_labels(loaded.dataset, config.label_column, config.classnames, data)
    groups = read_groups(loaded.dataset, config.group_column, data)
    require_selected(loaded, data, where)
    all_classes = len(labels.classnames)
    if config.present_classes_only:
        labels = only_present_classes(labels)
    return ZeroshotInputs(loaded, labels, groups, all_classes, out_path)


def make_prompts(config: ZeroshotConfig, classnames: list[str], dataset_dir: Path) -> Prompts:
    """Each class's prompts: --class-prompts where given, else the templates (--templates; auto: the
    dataset's own, else photo) filled with its name."""
    template_name, templates = resolve_templates(config.templates, dataset_dir)
    custom = load_class_prompts(config.class_prompts, classnames) if config.class_prompts else None
    prompts = Prompts(template_name, templates, custom, class_prompts(classnames, templates, custom))
    if custom is not None and len(custom) < len(classnames):
        warn(f"--class-prompts covers {len(custom)} of {len(classnames)} classes; the others use --templates {config.templates}")
    return prompts


def keep_decoded(bad: np.ndarray, data: str) -> np.ndarray:
    """The rows whose image decoded (N_rows,) bool; the others are left out with a warning (none decoded: an error)."""
    keep = ~bad
    require_decoded(bad, data)
    if not keep.all():
        warn(f"{int((~keep).sum())} images could not be decoded and are left out")
    return keep


def score_multilabel(x: np.ndarray, cls64: np.ndarray, target: np.ndarray, classnames: list[str], plan: Resampling, config: ZeroshotConfig) -> Scores:
    """Mean average precision over the classes, from the images (N, D) and the class embeddings (C, D)
    float64; `target` (N, C) bool. Chance: the mean prevalence of the classes with a positive."""
    scores = x.astype(np.float64) @ cls64.T  # (N, C) cosine similarities: AP needs them all
    ap = AveragePrecision(scores, target)
    per_ap = ap.per_class()
    value = MAP.value(ap, None, None)
    iv = bootstrap(len(x), lambda w: {MAP.name: MAP.value(ap, w, None)}, config.bootstrap, config.seed, resampling=plan)
    chance_map = MAP.chance(target, None)
    chance_map = float("nan") if chance_map is None else chance_map  # (no class with a positive: the record says NaN)
    per_class = [
        {"class": c, "positives": int(target[:, j].sum()), "ap": None if np.isnan(per_ap[j]) else float(per_ap[j])}
        for j, c in enumerate(classnames)
    ]
    return Scores({MAP.name: entry(value, iv[MAP.name], chance_map)}, {MAP.name: chance_map}, per_class, {"scores": scores, "targets": target})


def score_single_label(x: np.ndarray, cls64: np.ndarray, target: np.ndarray, classnames: list[str], plan: Resampling, config: ZeroshotConfig) -> Scores:
    """Top-1, top-5 (with at least 5 classes) and mean per-class recall, from each image's rank of its true
    class (ranks_in_blocks: the (N, C) scores never exist at once); `target` (N,) class indices."""
    n_cls = len(classnames)
    greater, tied = ranks_in_blocks(x, cls64, target)  # (N,) classes above / tied with the true one
    items = ClassificationItems.from_ranks(greater, tied, target, n_cls)
    point = items.metrics()
    iv = bootstrap(len(x), items.metrics, config.bootstrap, config.seed, resampling=plan)
    arrays = {"class": target, "greater": items.greater[None].astype(np.int32), "tied": items.tied[None].astype(np.int32),
              "num_classes": np.asarray(n_cls, dtype=np.int64)}
    chance = classification_chance(target, n_cls)
    metrics = {k: entry(v, iv[k], chance[k]) for k, v in point.items()}
    recall, support = per_class_recall(items.top1, target, n_cls)
    top5c = per_class_recall(items.top5, target, n_cls)[0] if items.top5 is not None else None
    per_class = [
        {
            "class": c,
            "support": int(support[j]),
            "top1": None if np.isnan(recall[j]) else float(recall[j]),
            **({"top5": None if np.isnan(top5c[j]) else float(top5c[j])} if top5c is not None else {}),
        }
        for j, c in enumerate(classnames)
    ]
    return Scores(metrics, chance, per_class, arrays)


def zeroshot_stats(inputs: ZeroshotInputs, target: np.ndarray, keep: np.ndarray, prompts: Prompts, img, txt) -> dict:
    """The record's "stats": rows, classes, prompts, processes and what the embedding cache served."""
    labels = inputs.labels
    n_cls = len(labels.classnames)
    present = int(target.any(axis=0).sum()) if labels.multilabel else int((np.bincount(target, minlength=n_cls) > 0).sum())
    return {
        "rows_evaluated": int(len(target)),
        "bad_images": int((~keep).sum()),
        "classes": n_cls,
        "classes_in_label_column": inputs.all_classes,
        "classes_present": present,
        "prompts": len(prompts.flat),
        "processes": process_state().num_processes,
        "cache": {"images": img.summary(), "prompts": txt.summary()},
    }


def zeroshot_protocol(config: ZeroshotConfig, prompts: Prompts, edit: Edit | None, plan: Resampling) -> dict:
    """The record's "protocol": the prompts, the class embedding, the score, ties, metrics and bootstrap."""
    return {
        "templates": prompts.template_name,
        "template_list": prompts.templates,
        "class_prompts_file": str(config.class_prompts) if config.class_prompts else None,
        "class_prompts": prompts.custom,
        "class_embedding": "renormalised mean of the L2-normalised prompt embeddings",
        "debias": edit.record if edit is not None else None,
        "score": "cosine similarity of L2-normalised embeddings (float64)",
        "ties": "broken uniformly at random; metrics are the expectation (exact when no ties)",
        "metrics": "CLIP_benchmark zeroshot_classification: acc1, acc5 (>= 5 classes), mean_per_class_recall; mAP for multi-label",
        "bootstrap": bootstrap_record(config.bootstrap, config.seed, plan.unit("image", config.group_column), plan, config.group_column),
    }
