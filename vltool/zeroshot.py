"""`vltool zeroshot`: zero-shot classification with class prompts (CLIP_benchmark's definitions).

Each class embedding is the renormalised mean of the L2-normalised embeddings of its prompts (its
templates filled with its name, or its `--class-prompts`); an image's scores are its cosine similarities
with the class embeddings. Single-label data (`label`): top-1, top-5 (with at least 5 classes), mean
per-class recall. Multi-label data (`labels`, lists of class indices): mean average precision. Every
metric has a 95% bootstrap interval over the images and its chance level (docs/evaluation.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from vltool import columns as C
from vltool.errors import UsageError, VltoolError, check
from vltool.io import column_values
from vltool.evaluation import EvalCommon


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
        from vltool.templates import AUTO, load_templates

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
    import dataclasses

    if labels.multilabel:
        raise UsageError("--present-classes-only is for single-label data")
    present = np.flatnonzero(np.bincount(labels.target, minlength=len(labels.classnames)) > 0)
    remap = np.full(len(labels.classnames), -1, dtype=np.int64)
    remap[present] = np.arange(len(present))
    return dataclasses.replace(labels, classnames=[labels.classnames[i] for i in present], target=remap[labels.target])


def read_labels(ds, column: str | None, classnames_file: str | None, spec: str) -> LabelInfo:
    """The label column, its class names and the targets of the rows."""
    import datasets

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
        from vltool.templates import load_classnames

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
    import torch
    import torch.nn.functional as F

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
    from vltool.metrics import class_ranks

    greater = np.empty(len(x), np.int64)
    tied = np.empty(len(x), np.int64)
    for a in range(0, len(x), ROW_BLOCK):
        b = min(len(x), a + ROW_BLOCK)
        scores = x[a:b].astype(np.float64) @ cls64.T  # (block, C) cosine similarities
        greater[a:b], tied[a:b] = class_ranks(scores, target[a:b])
    return greater, tied


def zeroshot(
    data: str,
    config: ZeroshotConfig,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    argv: Sequence[str] | None = None,
) -> dict:
    """Evaluate zero-shot classification of `config.model` on `data`; returns the results record."""
    from vltool import provenance
    from vltool.cache import EmbeddingCache
    from vltool.checks import require_decoded
    from vltool.encode import encode_images, encode_prompts, load_eval_model, model_record
    from vltool.evaluation import bootstrap_record, check_out, debias_edit, entry, finish
    from vltool.topology import process_state, warn
    from vltool.io import load_dataset
    from vltool.metrics import AveragePrecision, ClassificationItems, Resampling, bootstrap, majority_rate, per_class_recall, topk_chance
    from vltool.outcomes import base_arrays, example_ids, read_groups
    from vltool.templates import class_prompts, load_class_prompts, resolve_templates

    timer = provenance.Timer()
    config.validate()
    from vltool.importer import clip_benchmark_input

    loaded = load_dataset(clip_benchmark_input(data, config.cache_dir), split=split, where=where, images=[C.IMAGE],
                          cache_dir=config.cache_dir)
    loaded.spec = data
    files = [config.classnames, config.class_prompts, config.templates if Path(config.templates).expanduser().is_file() else None]
    out_path = check_out(out, overwrite, [*loaded.reads, Path(data).expanduser(), *[Path(f) for f in files if f]], config)
    labels = read_labels(loaded.dataset, config.label_column, config.classnames, data)
    groups = read_groups(loaded.dataset, config.group_column, data)
    if loaded.rows == 0:
        raise UsageError(f"no rows of {data!r} are selected (--where {list(where)})")
    all_classes = len(labels.classnames)
    if config.present_classes_only:
        labels = only_present_classes(labels)
    template_name, templates = resolve_templates(config.templates, loaded.path)
    custom = load_class_prompts(config.class_prompts, labels.classnames) if config.class_prompts else None
    prompts = class_prompts(labels.classnames, templates, custom)
    if custom is not None and len(custom) < len(labels.classnames):
        warn(f"--class-prompts covers {len(custom)} of {len(labels.classnames)} classes; the others use --templates {config.templates}")

    m = load_eval_model(config.model, config.pretrained, config.cache_dir)
    cache = EmbeddingCache(config.cache_dir)
    img = encode_images(m, loaded, cache=cache, batch_size=config.batch_size, workers=config.workers, progress=config.progress)
    flat = [p for ps in prompts for p in ps]
    txt = encode_prompts(m, flat, cache=cache, batch_size=max(config.batch_size, 256), progress=config.progress)
    cls = class_embeddings(txt.embeddings, [len(p) for p in prompts])  # (C, D)
    edit = debias_edit(m, config)
    if edit is not None:
        cls = edit.texts(cls)

    keep = ~img.bad
    require_decoded(img.bad, data)
    if not keep.all():
        warn(f"{int((~keep).sum())} images could not be decoded and are left out")
    x = img.embeddings[keep]
    if edit is not None:
        x = edit.images(x)
    cls64 = cls.astype(np.float64)
    n_cls = len(labels.classnames)
    target = labels.target[keep]
    n = len(x)
    task = "zeroshot-multilabel" if labels.multilabel else "zeroshot"
    kept_groups = groups[keep] if groups is not None else None
    plan = Resampling.make(n, None if labels.multilabel else target, kept_groups)
    examples = base_arrays(task, "map" if labels.multilabel else "classification", example_ids(loaded.dataset)[keep], kept_groups, config.group_column)

    if labels.multilabel:
        scores = x.astype(np.float64) @ cls64.T  # (N, C) cosine similarities: AP needs them all
        ap = AveragePrecision(scores, target)
        per_ap = ap.per_class()
        value = ap.mean()
        iv = bootstrap(n, lambda w: {"mAP": ap.mean(w)}, config.bootstrap, config.seed, resampling=plan)
        examples.update(scores=scores, targets=target)
        prevalence = target.mean(axis=0)
        chance_map = float(np.mean(prevalence[target.any(axis=0)])) if target.any() else float("nan")
        metrics = {"mAP": entry(value, iv["mAP"], chance_map)}
        chance = {"mAP": chance_map}
        per_class = [
            {"class": c, "positives": int(target[:, j].sum()), "ap": None if np.isnan(per_ap[j]) else float(per_ap[j])}
            for j, c in enumerate(labels.classnames)
        ]
    else:
        greater, tied = ranks_in_blocks(x, cls64, target)
        items = ClassificationItems.from_ranks(greater, tied, target, n_cls)
        point = items.metrics()
        iv = bootstrap(n, items.metrics, config.bootstrap, config.seed, resampling=plan)
        examples.update({"class": target, "greater": items.greater[None].astype(np.int32), "tied": items.tied[None].astype(np.int32),
                         "num_classes": np.asarray(n_cls, dtype=np.int64)})
        chance = {
            "top1": 1 / n_cls,
            "top5": topk_chance(n_cls, 5) if n_cls >= 5 else None,
            "mean_per_class_recall": 1 / n_cls,
            "majority_class": majority_rate(target, n_cls),
        }
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
            for j, c in enumerate(labels.classnames)
        ]

    stats = {
        "rows_evaluated": int(n),
        "bad_images": int((~keep).sum()),
        "classes": n_cls,
        "classes_in_label_column": all_classes,
        "classes_present": int((np.bincount(target, minlength=n_cls) > 0).sum()) if not labels.multilabel else int(target.any(axis=0).sum()),
        "prompts": len(flat),
        "processes": process_state().num_processes,
        "cache": {"images": img.summary(), "prompts": txt.summary()},
    }
    record = provenance.make(
        "zeroshot", config, [loaded], rows_in=loaded.rows, rows_out=int(n), stats=stats, timer=timer, argv=argv
    )
    record.update({
        "task": task,
        "model": model_record(m, config.model, config.pretrained),
        "data": {"spec": data, "fingerprint": loaded.fingerprint, "split": loaded.split, "where": loaded.where, "rows": loaded.rows, "rows_evaluated": int(n), "label_column": labels.column},
        "protocol": {
            "templates": template_name,
            "template_list": templates,
            "class_prompts_file": str(config.class_prompts) if config.class_prompts else None,
            "class_prompts": custom,
            "class_embedding": "renormalised mean of the L2-normalised prompt embeddings",
            "debias": edit.record if edit is not None else None,
            "score": "cosine similarity of L2-normalised embeddings (float64)",
            "ties": "broken uniformly at random; metrics are the expectation (exact when no ties)",
            "metrics": "CLIP_benchmark zeroshot_classification: acc1, acc5 (>= 5 classes), mean_per_class_recall; mAP for multi-label",
            "bootstrap": bootstrap_record(config.bootstrap, config.seed, plan.unit("image", config.group_column), plan, config.group_column),
        },
        "classnames": labels.classnames,
        "metrics": metrics,
        "chance": chance,
        "per_class": per_class,
    })
    record["wall_time_s"] = round(timer.seconds, 3)
    return finish(record, out_path, overwrite, examples)
