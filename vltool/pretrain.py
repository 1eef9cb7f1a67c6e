"""`vltool pretrain`: two-tower contrastive training (CLIP's symmetric InfoNCE by default) through Accelerate.

One function, `pretrain(data, out, config, ...)`, runs unchanged in one process or under
`accelerate launch`. What it guarantees (docs/pretrain.md):
- N processes with --batch-size B train as one process with batch N*B: the loss sees the global batch
  (vltool.losses), tower gradients are summed over processes, the data order depends only on the seed.
- The data a step sees depends only on (seed, epoch, position): a seeded permutation per epoch, and each
  row's augmentation and caption drawn from a generator seeded by (seed, epoch, row). So `--resume`
  continues exactly, whatever the number of data-loader workers.
- Checkpoints in RUN_DIR/checkpoints/step_NNNNNNNN/ (written to a temporary directory, then renamed):
  model, loss state, optimizer, scaler, step, RNG states. The final model is RUN_DIR/model/
  (vltool.model's format) and, when expressible, RUN_DIR/open_clip/ (open_clip's local-dir layout).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vltool import columns as C
from vltool.errors import UsageError, VltoolError
from vltool.io import decode_image

RUN_FILE = "run.json"  # what the run was started with; --resume reads it
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
PLOT_FILE = "loss.png"
OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = ("no", "bf16", "fp16")
SCHEDULES = ("cosine", "constant")
CAPTION_SAMPLING = ("random", "first")


@dataclass
class PretrainConfig:
    """Options of `vltool pretrain` (every field is a command-line option of the same name)."""

    # The model.
    arch: str = "vltool-tiny"  # open_clip or vltool architecture of a new model
    image_tower: str | None = None  # torchvision:NAME, a pretrained image tower (with image_weights)
    image_weights: str | None = None  # local torchvision weights file of image_tower
    text_tower: str | None = None  # hf:LOCAL_DIR, a pretrained Hugging Face text encoder
    text_pooling: str = "mean"  # mean | cls pooling of the hf tower
    embed_dim: int | None = None  # shared embedding size [default: the arch's]
    image_size: int | None = None  # input image size [default: the arch's]
    context_length: int | None = None  # text tokens [default: the arch's; 64 for hf towers]
    init: str | None = None  # start from this trained vltool model instead of a new one
    loss: str = "clip"  # training objective (vltool.losses registry)
    logit_scale_init: float | None = None  # initial multiplier of a new model [default: the loss's, CLIP 1/0.07]
    logit_scale_learnable: bool | None = None  # learn the logit scale [default: the loss's, CLIP yes]
    lock_image: bool = False  # freeze the image tower (a projection vltool adds stays trainable)
    lock_text: bool = False  # freeze the text tower (likewise)
    unfreeze_image_last: int = 0  # with lock_image: train only the last N blocks of the image tower
    unfreeze_text_last: int = 0  # with lock_text: train only the last N blocks of the text tower
    cache_frozen: bool = True  # compute a wholly frozen tower's features once when its input is fixed
    sync_bn: bool = False  # SyncBatchNorm across processes (GPUs only)
    # Loss-specific options (docs/objectives.md).
    bias_init: str | None = None  # sigmoid: a number (the logit bias's start) or "search" (FFF 4.4) [default: the loss's, -10]
    bias_search_batches: int = 4  # sigmoid with bias_init=search: batches encoded to choose the bias
    captions_per_image: int = 1  # batch text augmentation (FFF 4.2): k captions of each image in the batch, all positives
    mined_positives: bool = False  # sigmoid: image i and text j are positives when j's id is in row i's `positives`
    label_data: list[str] = field(default_factory=list)  # unicl: image-label inputs (text = class name in a random template)
    text_data: list[str] = field(default_factory=list)  # unicl: image-text inputs (each row its own label); DATA args join these
    label_column: str = C.LABEL  # unicl: the ClassLabel (or string) column of --label-data
    templates: str = "openai-imagenet"  # unicl: prompt templates of --label-data rows (name or file), one drawn per sample
    critic_dim: int | None = None  # jsd: output size of the critic projections [default: the embedding size]
    memory_bank: int = 0  # clip: K > 0 contrasts against a queue of K keys of EMA towers (000_e1055e0826afe142.txt 2.1)
    temperature: float = 0.02  # memory bank: the fixed temperature tau (the logit scale is 1/tau, not learned)
    ema_momentum: float = 0.999  # memory bank: EMA momentum of the key towers (vltool's choice; the paper gives none)
    export_ema: bool = False  # memory bank: RUN_DIR/model is the EMA model instead of the online one
    balanced: bool = False  # unicl: every epoch, all image-label rows and as many image-text rows drawn anew (UniCL B.2)
    # The data.
    text_column: str = C.CAPTION  # the text column (ignored with caption_sampling, which reads captions)
    caption_sampling: str | None = None  # random | first: one caption of the `captions` list per step
    prefix_ids: bool = False  # make ids of several inputs unique as "<input index>:<id>"
    augment: str = "clip"  # none | clip (random resized crop 0.9-1) | simclr
    workers: int = 0  # data-loader worker processes per training process
    # The optimisation.
    batch_size: int = 64  # rows per process per step; the global batch is batch_size * processes
    epochs: float | None = None  # passes over the data (default 1 when steps is not given)
    steps: int | None = None  # optimizer steps (overrides epochs)
    optimizer: str = "adamw"  # adamw | sgd (with momentum)
    lr: float = 5e-4  # peak learning rate
    lr_schedule: str = "cosine"  # cosine (to min_lr) | constant, after warmup
    warmup_steps: int = 0  # linear warmup from 0
    min_lr: float = 0.0  # final learning rate of the cosine schedule
    weight_decay: float = 0.1  # not applied to gains, biases, the logit scale or bias
    beta1: float = 0.9  # AdamW
    beta2: float = 0.98  # AdamW (CLIP's)
    eps: float = 1e-6  # AdamW
    momentum: float = 0.9  # SGD
    grad_clip_norm: float | None = None  # clip the global gradient norm
    accum_steps: int = 1  # micro-batches per optimizer step (negatives come from each micro-batch)
    precision: str = "no"  # no | bf16 | fp16 mixed precision through Accelerate
    seed: int = 0  # weights of a new model, data order, augmentation, caption draws
    # Logging and checkpoints.
    log_every: int = 10  # steps between lines of metrics.jsonl
    checkpoint_every: int = 200  # steps between checkpoints (and one at the end)
    keep_checkpoints: int = 2  # most recent checkpoints kept
    eval_every: int = 0  # steps between evaluations on eval_data (0: only at the end, if eval_data)
    cpu: bool = False  # train on CPU even when a GPU is there

    def model_spec(self):
        from vltool.model import ModelSpec

        return ModelSpec(
            arch=self.arch,
            image_tower=self.image_tower,
            image_weights=self.image_weights,
            text_tower=self.text_tower,
            text_pooling=self.text_pooling,
            embed_dim=self.embed_dim,
            image_size=self.image_size,
            context_length=self.context_length,
        )

    def validate(self) -> None:
        """Report every problem at once."""
        from vltool.losses import LOSSES
        from vltool.transforms import AUGMENTATIONS

        problems = []
        if self.init is None:
            problems += self.model_spec().validate()
            if self.image_tower is None or self.text_tower is None:
                from vltool.model import _check_open_clip_cfg, arch_config

                try:
                    _check_open_clip_cfg(arch_config(self.arch), f"--arch {self.arch}")
                except UsageError as e:
                    problems.append(str(e))
        else:
            given = [f"--{n.replace('_', '-')}" for n in ("image_tower", "text_tower", "embed_dim", "image_size", "context_length") if getattr(self, n) is not None]
            if given:
                problems.append(f"--init starts from a trained model, so {', '.join(given)} cannot change it")
        if self.loss not in LOSSES:
            problems.append(f"--loss {self.loss!r}: unknown; available: {', '.join(sorted(LOSSES))}")
        if self.bias_init is not None:
            if self.loss != "sigmoid":
                problems.append("--bias-init is an option of --loss sigmoid")
            elif self.bias_init != "search":
                try:
                    float(self.bias_init)
                except ValueError:
                    problems.append(f"--bias-init must be a number or 'search', got {self.bias_init!r}")
        if self.bias_search_batches < 1:
            problems.append(f"--bias-search-batches must be >= 1, got {self.bias_search_batches}")
        if self.captions_per_image < 1:
            problems.append(f"--captions-per-image must be >= 1, got {self.captions_per_image}")
        elif self.captions_per_image > 1 and self.loss != "sigmoid":
            problems.append("--captions-per-image > 1 needs a loss with several positives per image (--loss sigmoid)")
        if self.critic_dim is not None and (self.loss != "jsd" or self.critic_dim < 1):
            problems.append("--critic-dim is an option of --loss jsd and must be >= 1")
        if self.memory_bank < 0 or (self.memory_bank and self.loss != "clip"):
            problems.append("--memory-bank K needs --loss clip and K >= 1")
        if not self.temperature > 0:
            problems.append(f"--temperature must be > 0, got {self.temperature}")
        if not 0 <= self.ema_momentum < 1:
            problems.append(f"--ema-momentum must be in [0, 1), got {self.ema_momentum}")
        if self.export_ema and not self.memory_bank:
            problems.append("--export-ema needs --memory-bank")
        if self.loss == "simclr" and self.augment != "simclr":
            problems.append("--loss simclr contrasts two augmented views: use --augment simclr")
        if self.mined_positives and self.loss != "sigmoid":
            problems.append("--mined-positives needs --loss sigmoid")
        if (self.label_data or self.text_data or self.balanced) and self.loss != "unicl":
            problems.append("--label-data, --text-data and --balanced are options of --loss unicl")
        if self.balanced and not self.label_data:
            problems.append("--balanced needs --label-data (it draws as many image-text rows as image-label rows)")
        if self.label_data:
            from vltool.templates import load_templates

            try:
                load_templates(self.templates)
            except UsageError as e:
                problems.append(str(e))
        if self.loss == "unicl" and (self.caption_sampling or self.captions_per_image > 1):
            problems.append("--loss unicl reads --text-column of --text-data (not --caption-sampling / --captions-per-image)")
        if self.logit_scale_init is not None and not 0 < self.logit_scale_init <= 100:
            problems.append(f"--logit-scale-init must be in (0, 100], got {self.logit_scale_init}")
        for name in ("unfreeze_image_last", "unfreeze_text_last", "warmup_steps", "workers"):
            if getattr(self, name) < 0:
                problems.append(f"--{name.replace('_', '-')} must be >= 0")
        if self.unfreeze_image_last and not self.lock_image:
            problems.append("--unfreeze-image-last needs --lock-image")
        if self.unfreeze_text_last and not self.lock_text:
            problems.append("--unfreeze-text-last needs --lock-text")
        if self.caption_sampling is not None and self.caption_sampling not in CAPTION_SAMPLING:
            problems.append(f"--caption-sampling {self.caption_sampling!r}: use random or first")
        if self.augment not in AUGMENTATIONS:
            problems.append(f"--augment {self.augment!r}: use {', '.join(AUGMENTATIONS)}")
        for name in ("batch_size", "accum_steps", "log_every", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.epochs is not None and self.epochs <= 0:
            problems.append(f"--epochs must be > 0, got {self.epochs}")
        if self.steps is not None and self.steps < 1:
            problems.append(f"--steps must be >= 1, got {self.steps}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"--optimizer {self.optimizer!r}: use adamw or sgd")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            problems.append(f"--lr must be > 0, got {self.lr}")
        if self.min_lr < 0 or self.min_lr > self.lr:
            problems.append(f"--min-lr must be in [0, --lr], got {self.min_lr}")
        if self.lr_schedule not in SCHEDULES:
            problems.append(f"--lr-schedule {self.lr_schedule!r}: use cosine or constant")
        if self.weight_decay < 0:
            problems.append(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            problems.append("--beta1 and --beta2 must be in [0, 1)")
        if self.eps <= 0:
            problems.append("--eps must be > 0")
        if not 0 <= self.momentum < 1:
            problems.append("--momentum must be in [0, 1)")
        if self.grad_clip_norm is not None and self.grad_clip_norm <= 0:
            problems.append(f"--grad-clip-norm must be > 0, got {self.grad_clip_norm}")
        if self.precision not in PRECISIONS:
            problems.append(f"--precision {self.precision!r}: use no, bf16 or fp16")
        if self.eval_every < 0:
            problems.append("--eval-every must be >= 0")
        if problems:
            raise UsageError("; ".join(problems))


# ----------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------


@dataclass
class TrainData:
    """The concatenated training rows: ids, images (undecoded) and texts."""

    dataset: Any  # datasets.Dataset with id, image (decode=False) and the text column
    text_column: str
    inputs: list  # LoadedDataset of each input (provenance)
    rows_in: int  # rows after --where, before dropping empty texts
    empty_text_ids: list[str]
    positives: dict | None = None  # --mined-positives: row -> rows of its `positives` ids in the training rows
    labels: Any = None  # unicl: (rows,) int64 label of each row (classes first, then one per image-text row)
    templated: Any = None  # unicl: (rows,) bool, the row's text is a class name to put in a random template
    templates: list | None = None  # unicl: the templates


def _texts_of(value, sampling: str | None) -> list[str]:
    if sampling is None:
        return [value] if isinstance(value, str) and value.strip() else []
    return [t for t in (value or []) if isinstance(t, str) and t.strip()]


def load_train_data(
    data: Sequence[str], config: PretrainConfig, where: Sequence[str] = (), split: str | None = None, what: str = "input"
) -> TrainData:
    """Load and concatenate the inputs, check their columns, drop rows without text (counted)."""
    import datasets

    from vltool.io import load_dataset

    lists = bool(config.caption_sampling) or config.captions_per_image > 1
    text_col = C.CAPTIONS if lists else config.text_column
    needed = [C.ID, C.IMAGE, text_col]
    if config.mined_positives and what == "input":
        needed.append(C.POSITIVES)
    loaded = [load_dataset(spec, split=split, where=where, required=needed) for spec in data]
    for src in loaded:
        feat = src.dataset.features[text_col]
        if lists:
            if not (isinstance(feat, (datasets.Sequence, getattr(datasets, "List", datasets.Sequence))) or isinstance(feat, list)):
                raise UsageError(f"--caption-sampling and --captions-per-image read the list column {C.CAPTIONS!r}, but in {src.spec!r} it is {feat}")
        elif not (isinstance(feat, datasets.Value) and feat.dtype in ("string", "large_string")):
            raise UsageError(f"--text-column {text_col!r} of {src.spec!r} is not a text column (it is {feat})")
        if not isinstance(src.dataset.features[C.IMAGE], datasets.Image):
            raise UsageError(f"column {C.IMAGE!r} of {src.spec!r} is not an image column (it is {src.dataset.features[C.IMAGE]})")
    parts = []
    seen: dict[str, int] = {}
    for k, src in enumerate(loaded):
        ds = src.dataset.select_columns(needed).cast_column(C.IMAGE, datasets.Image(decode=False))
        ids = ds[C.ID]
        if config.prefix_ids and len(loaded) > 1:
            ids = [f"{k}:{i}" for i in ids]
            ds = ds.remove_columns([C.ID]).add_column(C.ID, ids)
            if C.POSITIVES in needed:
                pos = [[f"{k}:{p}" for p in (ps or [])] for ps in ds[C.POSITIVES]]
                ds = ds.remove_columns([C.POSITIVES]).add_column(C.POSITIVES, pos)
        if len(set(ids)) != len(ids):
            raise UsageError(f"{src.spec!r} has duplicate ids; ids must be unique")
        for i in ids:
            if i in seen:
                raise UsageError(
                    f"id {i!r} is in both {loaded[seen[i]].spec!r} and {src.spec!r}; "
                    "pass --prefix-ids to make ids unique as '<input index>:<id>'"
                )
            seen[i] = k
        parts.append(ds.select_columns(needed))
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    rows_in = len(ds)
    texts = ds[text_col]
    keep = [i for i, t in enumerate(texts) if _texts_of(t, "first" if lists else None)]
    empty_ids = []
    if len(keep) != rows_in:
        all_ids = ds[C.ID]
        keep_set = set(keep)
        empty_ids = [all_ids[i] for i in range(rows_in) if i not in keep_set]
        ds = ds.select(keep)
    if len(ds) == 0:
        raise UsageError(f"the {what} has no rows with text in {text_col!r}")
    positives = None
    if C.POSITIVES in needed:
        # row -> rows of its positives (ids outside the training rows are ignored)
        row_of = {i: r for r, i in enumerate(ds[C.ID])}
        positives = {}
        for r, ps in enumerate(ds[C.POSITIVES]):
            rows_ = [row_of[p] for p in (ps or []) if p in row_of and row_of[p] != r]
            if rows_:
                positives[r] = rows_
    return TrainData(ds, text_col, loaded, rows_in, empty_ids, positives)


UNICL_TEXT = "_unicl_text"  # unicl's internal text column: the caption, or the class name of a label row


def load_unicl_data(config: PretrainConfig, where: Sequence[str] = (), split: str | None = None) -> TrainData:
    """UniCL's two roles, concatenated (label inputs first): image-label rows get their class's label and
    the class name as text (a template is drawn per sample); image-text rows get a label each."""
    import datasets

    from vltool.io import load_dataset
    from vltool.templates import load_templates

    specs = [(s, "label") for s in config.label_data] + [(s, "text") for s in config.text_data]
    if not specs:
        raise UsageError("--loss unicl needs --label-data and/or --text-data (or DATA, taken as --text-data)")
    classes: dict[str, int] = {}  # class name -> class index; equal names in several label inputs are one class
    parts, loaded, empty_ids, seen = [], [], [], {}
    rows_in = 0
    for k, (spec_, role) in enumerate(specs):
        col = config.label_column if role == "label" else config.text_column
        src = load_dataset(spec_, split=split, where=where, required=[C.ID, C.IMAGE, col])
        loaded.append(src)
        ds = src.dataset
        rows_in += len(ds)
        feat = ds.features[col]
        if role == "label":
            if isinstance(feat, datasets.ClassLabel):
                names = [None if v is None or v < 0 else feat.names[v] for v in ds[col]]
            elif isinstance(feat, datasets.Value) and feat.dtype in ("string", "large_string"):
                names = ds[col]
            else:
                raise UsageError(f"--label-column {col!r} of {spec_!r} must be a ClassLabel or string column (it is {feat})")
            texts = [n if isinstance(n, str) and n.strip() else None for n in names]
            for n in texts:
                if n is not None and n not in classes:
                    classes[n] = len(classes)
        else:
            if not (isinstance(feat, datasets.Value) and feat.dtype in ("string", "large_string")):
                raise UsageError(f"--text-column {col!r} of {spec_!r} is not a text column (it is {feat})")
            texts = [t if isinstance(t, str) and t.strip() else None for t in ds[col]]
        ids = ds[C.ID]
        if config.prefix_ids and len(specs) > 1:
            ids = [f"{k}:{i}" for i in ids]
        for i in ids:
            if i in seen:
                raise UsageError(
                    f"id {i!r} is in both {specs[seen[i]][0]!r} and {spec_!r}; "
                    "pass --prefix-ids to make ids unique as '<input index>:<id>' (e.g. one dataset in both roles)"
                )
            seen[i] = k
        keep = [j for j, t in enumerate(texts) if t is not None]
        empty_ids += [ids[j] for j, t in enumerate(texts) if t is None]
        sub = ds.select_columns([C.IMAGE]).cast_column(C.IMAGE, datasets.Image(decode=False)).select(keep)
        sub = sub.add_column(C.ID, [ids[j] for j in keep]).add_column(UNICL_TEXT, [texts[j] for j in keep])
        sub = sub.add_column("_role_label", [role == "label"] * len(keep))
        parts.append(sub)
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(ds) == 0:
        raise UsageError("the unicl inputs have no rows with a label or text")
    is_label = np.array(ds["_role_label"], dtype=bool)
    txt = ds[UNICL_TEXT]
    labels = np.where(is_label, [classes.get(t, -1) for t in txt], len(classes) + np.arange(len(ds)))
    _, templates = load_templates(config.templates)
    data = TrainData(ds, UNICL_TEXT, loaded, rows_in, empty_ids)
    data.labels = labels.astype(np.int64)
    data.templated = is_label
    data.templates = templates
    return data


class BalancedEpochBatches:
    """UniCL B.2: epoch e holds every image-label row and min(#label, #text) image-text rows drawn anew
    (without replacement, seeded by (seed, e)), shuffled together; batching as EpochBatches."""

    def __init__(self, label_rows, text_rows, batch: int, world: int, rank: int, seed: int, start: int, stop: int):
        self.label_rows, self.text_rows = np.asarray(label_rows), np.asarray(text_rows)
        self.n = len(self.label_rows) + min(len(self.label_rows), len(self.text_rows))
        self.inner = EpochBatches(self.n, batch, world, rank, seed, start, stop)
        self.inner.perm = self.perm
        self.per_epoch = self.inner.per_epoch

    def perm(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.inner.seed, 7919, epoch])
        drawn = rng.choice(self.text_rows, size=self.n - len(self.label_rows), replace=False)
        return rng.permutation(np.concatenate([self.label_rows, drawn]))

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        return iter(self.inner)


def make_sampler(train: TrainData, config: PretrainConfig, world: int, rank: int, start: int, stop: int):
    if config.balanced and train.templated is not None:
        rows = np.arange(len(train.dataset))
        return BalancedEpochBatches(rows[train.templated], rows[~train.templated], config.batch_size, world, rank, config.seed, start, stop)
    return EpochBatches(len(train.dataset), config.batch_size, world, rank, config.seed, start, stop)


def row_seed(seed: int, epoch: int, row: int) -> int:
    """The seed of one row's augmentation and caption draw."""
    return int(np.random.SeedSequence([seed, epoch, row]).generate_state(1, dtype=np.uint64)[0] >> 1)


class PairDataset:
    """Item (epoch, row) -> {"row", "id", "image" tensor, "text"}; {"row", "id", "bad": True} for a bad image."""

    def __init__(self, ds, text_column: str, sampling: str | None, transform, seed: int, load_images: bool = True,
                 captions_per_image: int = 1, templated=None, templates=None, two_views: bool = False):
        self.two_views = two_views  # simclr: a second augmented view "image2" from another seed
        self.templated, self.templates = templated, templates  # unicl: rows whose text is a class name to template
        self.captions_per_image = captions_per_image  # > 1: "texts", k captions (shuffled when sampling is random, cycled)
        self.ds = ds
        self.text_column = text_column
        self.sampling = sampling
        self.transform = transform
        self.seed = seed
        self.load_images = load_images  # False when image features are cached

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, key):
        import torch

        epoch, row = key
        rec = self.ds[int(row)]
        out = {"row": int(row), "id": rec[C.ID]}
        s = row_seed(self.seed, epoch, row)
        k = self.captions_per_image
        texts = _texts_of(rec[self.text_column], self.sampling or ("first" if k > 1 else None))
        if k > 1:
            if self.sampling == "random":
                texts = random.Random(s).sample(texts, len(texts))
            out["texts"] = [texts[i % len(texts)] for i in range(k)]
        elif self.templated is not None and self.templated[int(row)]:
            out["text"] = random.Random(s).choice(self.templates).format(texts[0])  # UniCL: a random template per sample
        else:
            out["text"] = random.Random(s).choice(texts) if self.sampling == "random" else texts[0]
        if self.load_images:
            im = decode_image(rec[C.IMAGE])
            if im is None:
                return {**out, "bad": True}
            g = torch.random.default_generator  # torchvision draws from it; CPU only, unlike torch.manual_seed
            saved = g.get_state()
            g.manual_seed(s)
            try:
                out["image"] = self.transform(im)
                if self.two_views:
                    g.manual_seed(int(np.random.SeedSequence([self.seed, epoch, int(row), 2]).generate_state(1, dtype=np.uint64)[0] >> 1))
                    out["image2"] = self.transform(im)
            finally:
                g.set_state(saved)
        return out


class FrozenText:
    """Trunk features of a wholly frozen text tower, computed once: one per row when each row's text is
    fixed (`per_row`, (N, W)), or one per distinct text when captions are sampled from lists (`table`,
    (U, W), with `index` text -> row of the table)."""

    def __init__(self, per_row=None, table=None, index: dict | None = None):
        self.per_row, self.table, self.index = per_row, table, index

    def __call__(self, batch: dict, device):
        if self.per_row is not None:
            return self.per_row[batch["rows"]].to(device)  # (B, W)
        return self.table[batch["text_index"]].to(device)  # (B*k, W)


class Collate:
    def __init__(self, tokenizer, tokenize: bool = True, text_index: dict | None = None):
        self.tokenizer = tokenizer
        self.tokenize = tokenize  # False when text features are cached
        self.text_index = text_index  # text -> row of the frozen text tower's feature table (sampled captions)

    def __call__(self, items: list[dict]) -> dict:
        import torch

        good = [it for it in items if not it.get("bad")]
        batch = {
            "rows": torch.tensor([it["row"] for it in good], dtype=torch.long),
            "bad_ids": [it["id"] for it in items if it.get("bad")],
            "n": len(good),
        }
        if good and "image" in good[0]:
            batch["images"] = torch.stack([it["image"] for it in good])
        if good and "image2" in good[0]:
            batch["images2"] = torch.stack([it["image2"] for it in good])
        if good and "texts" in good[0]:  # k captions per image, image-major: texts of image i are i*k .. i*k+k-1
            k = len(good[0]["texts"])
            batch["text_rows"] = batch["rows"].repeat_interleave(k)
            texts = [t for it in good for t in it["texts"]]
        else:
            texts = [it["text"] for it in good]
        if self.text_index is not None:
            batch["text_index"] = torch.tensor([self.text_index[t] for t in texts], dtype=torch.long)
        elif good and self.tokenize:
            batch["tokens"] = self.tokenizer(texts)
        return batch


class EpochBatches:
    """Micro-batches of this process from micro-batch `start` to `stop` (exclusive).

    Global micro-batch k of epoch e is rows perm_e[k*G:(k+1)*G] (G = batch * processes, the last
    incomplete one dropped); process r takes its r-th slice of B rows. perm_e depends on (seed, e) only.
    """

    def __init__(self, n: int, batch: int, world: int, rank: int, seed: int, start: int, stop: int):
        self.n, self.batch, self.world, self.rank, self.seed = n, batch, world, rank, seed
        self.per_epoch = n // (batch * world)
        self.start, self.stop = start, stop

    def perm(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, 7919, epoch]).permutation(self.n)

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self):
        cached = (None, None)
        for mb in range(self.start, self.stop):
            epoch, k = divmod(mb, self.per_epoch)
            if cached[0] != epoch:
                cached = (epoch, self.perm(epoch))
            g0 = k * self.batch * self.world + self.rank * self.batch
            yield [(epoch, int(r)) for r in cached[1][g0 : g0 + self.batch]]


# ----------------------------------------------------------------------------------------------------
# Model set-up: freezing, parameter groups, gradient sync
# ----------------------------------------------------------------------------------------------------


def _freeze(modules) -> None:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(False)


def _unfreeze(modules) -> None:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(True)


def apply_freezing(model, config: PretrainConfig) -> dict:
    """Freeze towers as asked; return which parts are wholly frozen."""
    def lock(tower, last: int, blocks, head, side: str) -> None:
        _freeze([tower])
        if last:
            blocks = blocks()
            if last > len(blocks):
                raise UsageError(f"--unfreeze-{side}-last {last}: the {side} tower has {len(blocks)} blocks")
            _unfreeze(blocks[-last:] + head())
            for p in model.open_clip_projection_params():  # an open_clip tower's projection trains with its last blocks
                if any(p is q for q in tower.parameters()):
                    p.requires_grad_(True)

    if config.lock_image:
        lock(model.visual, config.unfreeze_image_last, model.image_blocks, model.image_head, "image")
    if config.lock_text:
        lock(model.text, config.unfreeze_text_last, model.text_blocks, model.text_head, "text")
    return {
        "image": not any(p.requires_grad for p in model.visual.parameters()),
        "text": not any(p.requires_grad for p in model.text.parameters()),
    }


def set_train_mode(model) -> None:
    """model.train(), with frozen parts in eval mode (BatchNorm statistics and dropout of frozen parts fixed)."""
    model.train()
    for tower in (model.visual, model.text):
        params = list(tower.parameters())
        if params and not any(p.requires_grad for p in params):
            tower.eval()
            continue
        for m in tower.modules():
            ps = list(m.parameters())
            if ps and not any(p.requires_grad for p in ps):
                m.eval()


def param_groups(named_params, weight_decay: float) -> list[dict]:
    """AdamW groups: no decay for gains, biases (1-d tensors) and the logit scale / bias."""
    decay, no_decay = [], []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        if p.ndim < 2 or "logit_scale" in name or "logit_bias" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def sum_gradients(params) -> None:
    """All-reduce (sum) the gradients of parameters each process only sees through its own rows."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:  # e.g. a process whose micro-batch was all bad images
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch._utils._flatten_dense_tensors([p.grad for p in params])
    dist.all_reduce(flat)
    for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, [p.grad for p in params])):
        p.grad.copy_(g)


def lr_at(step: int, total: int, config: PretrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to min_lr or constant."""
    if config.warmup_steps and step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return config.lr
    span = max(1, total - config.warmup_steps)
    t = min(1.0, (step - config.warmup_steps) / span)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * t))


# ----------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    d = Path(run_dir) / CHECKPOINTS
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.startswith("step_") and (p / "state.json").is_file())


def _rng_state() -> dict:
    import torch

    st = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]), "python_pos": random.getstate()[2]}
    np_state = np.random.get_state()
    st["numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    st["numpy_pos"] = int(np_state[2])
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    import torch

    torch.set_rng_state(st["torch"])
    random.setstate((3, tuple(st["python"]), st["python_pos"]))
    np.random.set_state(("MT19937", st["numpy"].numpy().astype(np.uint32), st["numpy_pos"], 0, 0.0))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


# ----------------------------------------------------------------------------------------------------
# Evaluation during training
# ----------------------------------------------------------------------------------------------------


def evaluate(model, tokenizer, eval_data: TrainData, transform, loss_fn, batch: int, accelerator, seed: int) -> dict:
    """Validation loss (in chunks of the global batch) and image<->text R@1 over the whole set (first
    caption, eval transform). Every process computes the same. Zero-shot comes with the evaluation issue."""
    import torch

    from vltool.losses import LossInput

    ds = eval_data.dataset
    model.eval()
    imgs, txts = [], []
    sampling = "first" if eval_data.text_column == C.CAPTIONS else None
    with torch.no_grad(), accelerator.autocast():
        for lo in range(0, len(ds), batch):
            rows = ds[lo : lo + batch]
            good = [(decode_image(im), _texts_of(t, sampling)[0]) for im, t in zip(rows[C.IMAGE], rows[eval_data.text_column])]
            good = [(im, t) for im, t in good if im is not None]
            if not good:
                continue
            x = torch.stack([transform(im) for im, _ in good]).to(accelerator.device)
            from vltool.model import to_device

            i, t = model(x, to_device(tokenizer([t for _, t in good]), accelerator.device))
            imgs.append(i.float())
            txts.append(t.float())
    img, txt = torch.cat(imgs), torch.cat(txts)  # (N, D)
    scale = model.logit_scale.exp().detach().float()
    bias = model.logit_bias.detach().float() if model.logit_bias is not None else None
    losses = []
    with torch.no_grad():
        for lo in range(0, img.shape[0], batch):
            out = loss_fn(LossInput(img[lo : lo + batch], txt[lo : lo + batch], scale, bias))
            losses.append((float(out["loss"]), min(batch, img.shape[0] - lo)))
        sims = img @ txt.T  # (N, N)
        target = torch.arange(img.shape[0])
        res = {
            "val_loss": sum(l * n for l, n in losses) / sum(n for _, n in losses),
            "val_i2t_r1": float((sims.argmax(1).cpu() == target).float().mean()),
            "val_t2i_r1": float((sims.argmax(0).cpu() == target).float().mean()),
            "val_rows": int(img.shape[0]),
        }
    return res


# ----------------------------------------------------------------------------------------------------
# Plot
# ----------------------------------------------------------------------------------------------------


def plot_curves(metrics: list[dict], path: Path) -> str:
    """loss.png: training loss (and validation loss) over steps. matplotlib when installed, else PIL."""
    train = [(m["step"], m["loss"]) for m in metrics if "loss" in m and m.get("kind") == "train"]
    val = [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m]
    if not train:
        return "no points"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(*zip(*train), label="train loss")
        if val:
            ax.plot(*zip(*val), "o-", label="validation loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return "matplotlib"
    except ImportError:
        pass
    from PIL import Image, ImageDraw

    W, H, L, R, T, B = 640, 400, 60, 20, 20, 40
    im = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(im)
    pts = train + val
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def xy(p):
        return L + (p[0] - x0) / (x1 - x0) * (W - L - R), T + (y1 - p[1]) / (y1 - y0) * (H - T - B)

    d.rectangle([L, T, W - R, H - B], outline="black")
    for frac in (0, 0.5, 1):
        yv = y0 + frac * (y1 - y0)
        d.text((4, xy((x0, yv))[1] - 6), f"{yv:.3g}", fill="black")
        xv = x0 + frac * (x1 - x0)
        d.text((xy((xv, y0))[0] - 10, H - B + 6), f"{xv:.0f}", fill="black")
    d.line([xy(p) for p in train], fill=(31, 119, 180), width=2) if len(train) > 1 else None
    if val:
        d.line([xy(p) for p in val], fill=(255, 127, 14), width=2) if len(val) > 1 else None
        for p in val:
            x, y = xy(p)
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(255, 127, 14))
    d.text((L + 8, T + 6), "train loss", fill=(31, 119, 180))
    if val:
        d.text((L + 8, T + 20), "validation loss", fill=(255, 127, 14))
    d.text((W // 2 - 10, H - 16), "step", fill="black")
    im.save(path)
    return "PIL (matplotlib is not installed)"


# ----------------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------------


@dataclass
class RunSpec:
    """What a run was started with (RUN_DIR/run.json); --resume reads it back."""

    data: list[str]
    where: list[str]
    split: str | None
    eval_data: list[str]
    eval_where: list[str]
    config: dict
    num_processes: int
    command_line: str = ""


def _write_json(path: Path, obj) -> None:
    from vltool.io import write_json_atomic

    write_json_atomic(path, obj)


def pretrain(
    data: Sequence[str] = (),
    out: str | Path | None = None,
    config: PretrainConfig | None = None,
    *,
    where: Sequence[str] = (),
    split: str | None = None,
    eval_data: Sequence[str] = (),
    eval_where: Sequence[str] = (),
    overwrite: bool = False,
    resume: str | Path | None = None,
    stop_after_steps: int | None = None,
    progress: bool = True,
) -> dict:
    """Train a two-tower model on `data` into the run directory `out` (or continue the run `resume`).

    Returns the provenance record (also written to RUN_DIR/vltool.json) when training finished, or
    {"status": "stopped", ...} when `stop_after_steps` stopped it early (resume with `resume=RUN_DIR`).
    """
    import torch
    from accelerate import Accelerator

    from vltool import provenance
    from vltool.io import check_output

    timer = provenance.Timer()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if stop_after_steps is not None and stop_after_steps < 1:
        raise UsageError(f"--stop-after-steps must be >= 1, got {stop_after_steps}")

    # ---- what to run: a new run, or the saved options of the run being resumed
    if resume is not None:
        run_dir = Path(resume).expanduser()
        if not (run_dir / RUN_FILE).is_file():
            raise UsageError(f"--resume {run_dir}: not a vltool pretrain run directory (no {RUN_FILE})")
        if (run_dir / C.PROVENANCE_FILE).is_file():
            raise UsageError(f"--resume {run_dir}: this run has finished (its model is {run_dir / 'model'})")
        saved = json.loads((run_dir / RUN_FILE).read_text())
        spec = RunSpec(**saved)
        if data and list(data) != spec.data:
            raise UsageError(f"--resume {run_dir}: the run trains on {spec.data}, not {list(data)}; give no DATA with --resume")
        if out is not None and Path(out).expanduser().resolve() != run_dir.resolve():
            raise UsageError("--resume continues RUN_DIR in place; do not pass a different --out")
        config = PretrainConfig(**spec.config)
    else:
        if not data and not (config and (config.label_data or config.text_data)):
            raise UsageError("give at least one training dataset (or 'emoji')")
        if out is None:
            raise UsageError("--out RUN_DIR is required")
        run_dir = Path(out).expanduser()
        config = config or PretrainConfig()
        spec = RunSpec(list(data), list(where), split, list(eval_data), list(eval_where), asdict(config), 0)
    config.validate()

    # ---- processes
    cpu = config.cpu or not torch.cuda.is_available()
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state:  # an earlier run in this process (notebook, tests): new precision allowed
        AcceleratorState._reset_state()
    try:
        accelerator = Accelerator(cpu=cpu, mixed_precision=config.precision)
    except (ValueError, RuntimeError) as e:
        raise UsageError(f"--precision {config.precision}: {e}") from None
    world, rank, is_main = accelerator.num_processes, accelerator.process_index, accelerator.is_main_process
    device = accelerator.device
    if resume is not None and spec.num_processes != world:
        raise UsageError(
            f"--resume {run_dir}: the run was started with {spec.num_processes} process(es), now {world}; "
            "resume with the same number so the data order and batches stay the same"
        )
    if config.sync_bn and world > 1 and device.type == "cpu":
        raise UsageError("--sync-bn needs GPUs: torch's SyncBatchNorm does not run on CPU (freeze BatchNorm with --lock-image instead)")

    # ---- data (checked before anything is written)
    if config.loss == "unicl":
        if spec.data:
            config.text_data = list(config.text_data) + [d for d in spec.data if d not in config.text_data]
        train = load_unicl_data(config, spec.where, spec.split)
    else:
        train = load_train_data(spec.data, config, spec.where, spec.split)
    evald = load_train_data(spec.eval_data, config, spec.eval_where, None, what="--eval-data") if spec.eval_data else None
    if evald is not None:
        overlap = set(train.dataset[C.ID]) & set(evald.dataset[C.ID])
        if overlap:
            raise UsageError(
                f"{len(overlap)} rows of --eval-data are also training rows (e.g. id {sorted(overlap)[0]!r}); "
                "evaluation rows must not reach training (e.g. --where split=train --eval-where split=test)"
            )
    if resume is None:
        inputs = [s.path for s in train.inputs] + ([s.path for s in evald.inputs] if evald else [])
        check_output(run_dir, overwrite, inputs=inputs)
    n_rows = len(train.dataset)
    global_batch = config.batch_size * world
    epoch_rows = make_sampler(train, config, 1, 0, 0, 0).n  # rows an epoch draws (fewer with --balanced)
    per_epoch_micro = epoch_rows // global_batch
    if per_epoch_micro < config.accum_steps:
        raise UsageError(
            f"the training data has {epoch_rows} rows per epoch, fewer than one step needs "
            f"({config.batch_size} per process x {world} process(es) x {config.accum_steps} accumulation steps)"
        )
    steps_per_epoch = per_epoch_micro // config.accum_steps
    total_steps = config.steps if config.steps is not None else max(1, int(round((config.epochs or 1) * steps_per_epoch)))

    if resume is None:
        if config.init:
            from vltool.model import resolve_model_dir

            resolve_model_dir(config.init)
        accelerator.wait_for_everyone()
        if is_main:
            if run_dir.exists():
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True)
            spec.num_processes = world
            spec.command_line = provenance.command_line()
            _write_json(run_dir / RUN_FILE, asdict(spec))
        accelerator.wait_for_everyone()

    # ---- model, loss, optimizer
    from vltool.losses import LossInput, build_loss, gather_keep_grad
    from vltool.model import create_model, eval_transform, read_model_dir, resolve_model_dir, save_model, export_open_clip, to_device
    from vltool.transforms import train_transform

    torch.manual_seed(config.seed)
    loss_fn = build_loss(config.loss)
    if config.init:
        model, tokenizer = read_model_dir(resolve_model_dir(config.init))
        if config.logit_scale_init is not None:
            with torch.no_grad():
                model.logit_scale.fill_(math.log(config.logit_scale_init))
        if config.logit_scale_learnable is not None:
            model.logit_scale.requires_grad_(config.logit_scale_learnable)
            model.config["logit_scale"]["learnable"] = config.logit_scale_learnable
    else:
        try:
            import transformers

            transformers.utils.logging.disable_progress_bar()
        except Exception:
            pass
        scale0 = 1 / config.temperature if config.memory_bank else loss_fn.logit_scale_init
        learn0 = False if config.memory_bank else loss_fn.logit_scale_learnable
        model, tokenizer = create_model(
            config.model_spec(),
            logit_scale_init=config.logit_scale_init or scale0,
            logit_scale_learnable=learn0 if config.logit_scale_learnable is None else config.logit_scale_learnable,
        )
    bias_default = getattr(loss_fn, "logit_bias_init", None)
    if bias_default is not None and model.logit_bias is None:
        # a loss with a logit bias (sigmoid): a learnable bias on the model, saved in the model format
        b0 = float(config.bias_init) if config.bias_init not in (None, "search") else float(bias_default)
        model.logit_bias = torch.nn.Parameter(torch.tensor(b0))
        model.config["logit_bias_init"] = b0
    elif config.bias_init not in (None, "search") and model.logit_bias is not None and resume is None:
        with torch.no_grad():
            model.logit_bias.fill_(float(config.bias_init))
    if getattr(loss_fn, "needs_critic", False) and model.image_critic is None:
        model.add_critic({"dim": config.critic_dim or int(model.config["embed_dim"])})  # CLIP-Lite's critic, saved with the model
    image_only = bool(getattr(loss_fn, "image_only", False))
    if image_only:  # simclr: no text; the text tower is unused and frozen, the loss's head sees the image tower
        _freeze([model.text])
        loss_fn.build_head(int(model.config["embed_dim"]))
    frozen = apply_freezing(model, config)
    if config.sync_bn and world > 1:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(device)
    if config.memory_bank:
        from vltool.losses import MemoryBankLoss

        d = model.config["critic"]["dim"] if model.config.get("critic") else int(model.config["embed_dim"])
        loss_fn = MemoryBankLoss(config.memory_bank, d, config.temperature, config.ema_momentum)
        loss_fn.init_ema(model)
    loss_fn.to(device)
    # Parameters whose gradient each process holds only through its own rows (summed over processes),
    # and those that see the whole global batch (logit scale and bias, the loss's own).
    # The critic projections run on the gathered global batch (so their BatchNorm sees it all): global too.
    global_names = {"logit_scale", "logit_bias"}
    local_params = [p for n, p in model.named_parameters()
                    if n not in global_names and not n.startswith(("image_critic.", "text_critic.")) and p.requires_grad]
    named = list(model.named_parameters()) + [(f"loss.{n}", p) for n, p in loss_fn.named_parameters()]
    groups = param_groups(named, config.weight_decay)
    # torch picks the per-tensor loop on CPU; the multi-tensor (foreach) update is the same arithmetic in
    # a few fused calls, and on CPU it saves a Python loop over every parameter at every step.
    if config.optimizer == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, foreach=True)
    else:
        optimizer = torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, foreach=True)
    optimizer = accelerator.prepare_optimizer(optimizer)
    trainable = [p for g in groups for p in g["params"]]
    if not any(p.requires_grad for p in trainable):
        raise VltoolError("nothing to train: every parameter is frozen (both towers locked, and this model has no "
                          "projections of its own outside them); unlock a tower or its last blocks (--unfreeze-*-last)")

    # ---- feature caches of wholly frozen towers with fixed inputs
    pp = model.config["preprocess"]
    cache_image = config.cache_frozen and frozen["image"] and config.augment == "none" and not image_only
    cache_text = (config.cache_frozen and frozen["text"] and config.caption_sampling != "random" and config.captions_per_image == 1
                  and not (train.templated is not None and train.templated.any()) and not image_only)
    aug = train_transform(pp, config.augment)
    dataset = PairDataset(train.dataset, train.text_column, config.caption_sampling, aug, config.seed, load_images=not cache_image,
                          captions_per_image=config.captions_per_image, templated=train.templated, templates=train.templates,
                          two_views=image_only)
    # Captions sampled from lists (CLIPS, k captions per image) come from a finite set of texts: a frozen
    # text tower's features are computed once per distinct text.
    templated = train.templated is not None and bool(train.templated.any())
    table_text = (config.cache_frozen and frozen["text"] and not image_only and not cache_text
                  and (config.caption_sampling == "random" or config.captions_per_image > 1 or templated))
    image_cache = text_cache = None
    text_feats: FrozenText | None = None
    bad_cached: set[int] = set()
    reused: dict[str, bool] = {}
    if cache_image or cache_text:
        image_cache, text_cache, bad_cached = _stored_caches(
            model, tokenizer, train, config, eval_transform(pp), cache_image, cache_text, accelerator, reused
        )
        if text_cache is not None:
            text_feats = FrozenText(per_row=text_cache)
    if table_text:
        text_feats = _stored_text_table(model, tokenizer, train, config, accelerator, reused)

    # ---- resume state
    start_step, samples_seen, bad_ids, first_loss = 0, 0, set(), None
    ckpts = list_checkpoints(run_dir)
    if resume is not None and ckpts:
        start_step, samples_seen, bad_ids, first_loss = _load_checkpoint(ckpts[-1], model, loss_fn, optimizer, accelerator, rank)
    if resume is not None and is_main:
        _truncate_metrics(run_dir / METRICS_FILE, start_step)
    if start_step >= total_steps and resume is not None and ckpts:
        pass  # fall through to the end: write the model
    searched_bias = None
    if config.bias_init == "search" and resume is None and model.logit_bias is not None:
        searched_bias = _search_bias(model, tokenizer, dataset, train, config, loss_fn, image_cache, text_feats, accelerator)
        with torch.no_grad():
            model.logit_bias.fill_(searched_bias)
        model.config["logit_bias_init"] = searched_bias
        if is_main:
            with open(run_dir / METRICS_FILE, "a") as f:
                f.write(json.dumps({"kind": "bias_search", "step": 0, "logit_bias": searched_bias,
                                    "batches": config.bias_search_batches}) + "\n")
    elif config.bias_init == "search" and resume is not None:
        searched_bias = _searched_bias_of(run_dir)  # the weights come from the checkpoint; the config records it
        if searched_bias is not None:
            model.config["logit_bias_init"] = searched_bias

    # ---- data loader over the micro-batches still to do
    import torch.utils.data as tud

    sampler = make_sampler(train, config, world, rank, start_step * config.accum_steps, total_steps * config.accum_steps)
    loader = tud.DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=Collate(tokenizer, tokenize=text_feats is None, text_index=text_feats.index if text_feats is not None else None),
        num_workers=config.workers,
        persistent_workers=False,
        generator=torch.Generator().manual_seed(config.seed),
    )
    if cache_image and bad_cached:
        loader.collate_fn = _DropRows(loader.collate_fn, bad_cached, train.dataset)

    # ---- logging
    metrics_path = run_dir / METRICS_FILE
    tb = None
    if is_main:
        try:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(str(run_dir / "tensorboard"))
        except Exception:
            tb = None
    eval_tf = eval_transform(pp)

    def log_line(obj: dict) -> None:
        if is_main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(obj) + "\n")
            if tb is not None:
                for k, v in obj.items():
                    if isinstance(v, (int, float)) and k not in ("step", "kind"):
                        tb.add_scalar(k, v, obj["step"])

    def save_checkpoint(step: int) -> Path:
        return _save_checkpoint(run_dir, step, model, loss_fn, optimizer, accelerator, samples_seen, bad_ids, first_loss, config.keep_checkpoints)

    from vltool.console import err

    prog = None
    if progress and is_main:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        prog = Progress(
            TextColumn("[bold]pretrain[/] step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=err,
            transient=False,
        )
        task = prog.add_task("train", total=total_steps, completed=start_step, info="")
        prog.start()

    status = "finished"
    step = start_step
    # Adam's second moments of rarely-used rows (token embeddings) decay into denormal floats, which
    # are ~10x slower on CPU; flushing them to zero changes nothing measurable in training.
    flush_before = torch.set_flush_denormal(True) if device.type == "cpu" else None
    last_loss = None
    t_window, n_window = time.perf_counter(), 0
    train_time = 0.0
    samples_at_start = samples_seen
    t_train0 = time.perf_counter()
    try:
        it = iter(loader)
        set_train_mode(model)
        while step < total_steps:
            if stop_after_steps is not None and step - start_step >= stop_after_steps:
                status = "stopped"
                break
            lr = lr_at(step, total_steps, config)
            for g in optimizer.param_groups:
                g["lr"] = lr
            stats = {}
            for _ in range(config.accum_steps):
                batch = next(it)
                for b in batch["bad_ids"]:
                    bad_ids.add(b)
                rows = batch["rows"]
                if image_only:
                    with accelerator.autocast():
                        x = torch.cat([batch["images"], batch["images2"]]).to(device) if "images" in batch else torch.zeros(0, 3, pp["size"], pp["size"], device=device)
                        f = model.image_proj(model.visual(x))
                        nb = f.shape[0] // 2
                        img_g, local = gather_keep_grad(f[:nb])
                        txt_g, _ = gather_keep_grad(f[nb:])
                        out_ = loss_fn(LossInput(img_g, txt_g, model.logit_scale.exp(), None, local_slice=local))
                    loss = out_["loss"]
                    accelerator.backward(loss / config.accum_steps)
                    for k, v in out_.items():
                        stats[k] = stats.get(k, 0.0) + float(v.detach()) / config.accum_steps
                    samples_seen += img_g.shape[0]
                    n_window += img_g.shape[0]
                    continue
                with accelerator.autocast():
                    kw = {}
                    if image_cache is not None:
                        kw["image_trunk"] = image_cache[rows].to(device)
                    else:
                        kw["images"] = batch.get("images", torch.zeros(0, 3, pp["size"], pp["size"])).to(device)
                    if text_feats is not None:
                        kw["text_trunk"] = text_feats(batch, device)
                    else:
                        kw["tokens"] = to_device(batch["tokens"], device) if "tokens" in batch else _empty_tokens(tokenizer, device)
                    img, txt = model(**kw, head=False)
                    img_g, local = gather_keep_grad(img)
                    txt_g, _ = gather_keep_grad(txt)
                    img_g, txt_g = model.apply_critic(img_g, txt_g)
                    extra = batch_extra(loss_fn, batch, train, device)
                    if config.memory_bank:
                        ik, tk = loss_fn.encode_keys(**kw)
                        extra["image_keys"] = gather_keep_grad(ik)[0]
                        extra["text_keys"] = gather_keep_grad(tk)[0]
                        extra["ids"] = gather_keep_grad(rows.to(device))[0]
                    out_ = loss_fn(
                        LossInput(img_g, txt_g, model.logit_scale.exp(), model.logit_bias, extra=extra, local_slice=local)
                    )
                loss = out_["loss"]
                accelerator.backward(loss / config.accum_steps)
                if config.memory_bank:  # the global batch's keys, after its loss
                    loss_fn.enqueue(extra["image_keys"], extra["text_keys"], extra["ids"])
                for k, v in out_.items():
                    stats[k] = stats.get(k, 0.0) + float(v.detach()) / config.accum_steps
                samples_seen += img_g.shape[0]
                n_window += img_g.shape[0]
            if not math.isfinite(stats["loss"]):
                good = list_checkpoints(run_dir)
                where_ = f"the last good checkpoint is {good[-1]}" if good else "no checkpoint was written yet"
                raise VltoolError(
                    f"the loss became {stats['loss']} at step {step + 1}; training stopped ({where_}). "
                    "Try a lower --lr, --grad-clip-norm, or --precision no"
                )
            sum_gradients(local_params)
            if config.grad_clip_norm is not None:
                accelerator.clip_grad_norm_(trainable, config.grad_clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            model.clamp_logit_scale()
            if config.memory_bank:
                loss_fn.update_ema(model)
            step += 1
            last_loss = stats["loss"]
            if first_loss is None:
                first_loss = last_loss
            if step % config.log_every == 0 or step == total_steps or step == 1:
                now = time.perf_counter()
                sps = n_window / max(now - t_window, 1e-9)
                t_window, n_window = now, 0
                line = {
                    "kind": "train",
                    "step": step,
                    "epoch": round(step * config.accum_steps / per_epoch_micro, 4),
                    "samples": samples_seen,
                    **{k: round(v, 6) for k, v in stats.items()},
                    "lr": lr,
                    "logit_scale": round(float(model.logit_scale.detach().exp()), 4),
                    "samples_per_s": round(sps, 2),
                    "bad_images": len(bad_ids),
                }
                log_line(line)
                if prog is not None:
                    prog.update(task, info=f"loss {last_loss:.4f}  lr {lr:.2e}  scale {line['logit_scale']:.1f}  {sps:.0f} samples/s")
            if prog is not None:
                prog.update(task, completed=step)
            if evald is not None and config.eval_every and step % config.eval_every == 0 and step < total_steps:
                res = evaluate(model, tokenizer, evald, eval_tf, loss_fn, global_batch, accelerator, config.seed)
                log_line({"kind": "eval", "step": step, **res})
                set_train_mode(model)
            if step % config.checkpoint_every == 0 and step < total_steps:
                save_checkpoint(step)
        train_time = time.perf_counter() - t_train0
        if step > start_step or not ckpts or status == "stopped":
            save_checkpoint(step)
    finally:
        if flush_before is not None:
            torch.set_flush_denormal(False)
        if prog is not None:
            prog.stop()
        if tb is not None:
            tb.close()

    bad_all = _gather_set(bad_ids, accelerator)
    if status == "stopped":
        return {"status": "stopped", "step": step, "total_steps": total_steps, "run_dir": str(run_dir)}

    # ---- the end: final evaluation, model, export, plot, provenance
    final_eval = None
    if evald is not None:
        final_eval = evaluate(model, tokenizer, evald, eval_tf, loss_fn, global_batch, accelerator, config.seed)
        log_line({"kind": "eval", "step": step, **final_eval})
    model.eval()
    prov = None
    if is_main:
        from vltool.io import replace_path
        from vltool.model import MODEL_DIR, OPEN_CLIP_DIR

        plain = model.module if hasattr(model, "module") else model
        if config.sync_bn and world > 1:
            plain = _revert_sync_bn(plain)
        if config.export_ema:
            plain = loss_fn.ema  # --export-ema: the EMA towers are the model
        tmp = run_dir / f".{MODEL_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(plain, tokenizer, tmp)
        replace_path(tmp, run_dir / MODEL_DIR, overwrite=True)
        tmp = run_dir / f".{OPEN_CLIP_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        exported = export_open_clip(plain, tmp)
        if exported is not None:
            replace_path(tmp, run_dir / OPEN_CLIP_DIR, overwrite=True)
        metrics = [json.loads(l) for l in metrics_path.read_text().splitlines()] if metrics_path.is_file() else []
        plotted = plot_curves(metrics, run_dir / PLOT_FILE)
        from vltool.model import fingerprint

        n_params = sum(p.numel() for p in plain.parameters())
        n_train = sum(p.numel() for p in trainable)
        trained_now = samples_seen - samples_at_start
        stats = {
            "steps": step,
            "epochs": round(step * config.accum_steps / per_epoch_micro, 4),
            "samples_seen": samples_seen,
            "global_batch": global_batch * 1,
            "accum_steps": config.accum_steps,
            "num_processes": world,
            "first_loss": first_loss,
            "final_loss": last_loss,
            "final_logit_scale": float(plain.logit_scale.detach().exp()),
            "final_logit_bias": float(plain.logit_bias.detach()) if plain.logit_bias is not None else None,
            "searched_logit_bias": searched_bias,
            "final_eval": final_eval,
            "bad_images": len(bad_all),
            "bad_image_ids": sorted(bad_all)[:100],
            "empty_texts": len(train.empty_text_ids),
            "empty_text_ids": train.empty_text_ids[:100],
            "rows_used": n_rows,
            "parameters": n_params,
            "trainable_parameters": n_train,
            "frozen": frozen,
            "cached_features": {"image": bool(cache_image), "text": "per distinct text" if table_text else bool(cache_text),
                                "reused_from_store": reused},
            "train_seconds_this_invocation": round(train_time, 3),
            "samples_per_s_this_invocation": round(trained_now / train_time, 2) if train_time > 0 else None,
            "seconds_per_step_this_invocation": round(train_time / (step - start_step), 4) if step > start_step else None,
            "resumed_from_step": start_step if resume is not None else None,
            "model": str(run_dir / MODEL_DIR),
            "model_fingerprint": fingerprint(plain, plain.config),
            "open_clip_export": str(run_dir / OPEN_CLIP_DIR) if exported is not None else None,
            "plot": f"{PLOT_FILE} ({plotted})",
        }
        options = {**asdict(config), "data": spec.data, "where": spec.where, "split": spec.split,
                   "eval_data": spec.eval_data, "eval_where": spec.eval_where}
        inputs = train.inputs + (evald.inputs if evald else [])
        prov = provenance.make("pretrain", options, inputs, rows_in=train.rows_in, rows_out=None, stats=stats, timer=timer)
        _write_json(run_dir / C.PROVENANCE_FILE, prov)
    accelerator.wait_for_everyone()
    if prov is None:
        prov = {"status": "finished", "stats": {}}
    prov["status"] = "finished"
    return prov


def batch_extra(loss_fn, batch: dict, train: TrainData, device) -> dict:
    """The gathered per-row inputs a loss asks for (`loss_fn.needs`), over the global batch."""
    import torch

    from vltool.losses import gather_keep_grad, positive_mask

    extra = {}
    if "positive_mask" in getattr(loss_fn, "needs", ()):
        rows = batch["rows"].to(device)
        text_rows = batch.get("text_rows", batch["rows"]).to(device)
        rows_g, _ = gather_keep_grad(rows)
        text_rows_g, _ = gather_keep_grad(text_rows)
        if train.positives or not torch.equal(rows_g, text_rows_g):
            extra["positive_mask"] = positive_mask(rows_g, text_rows_g, train.positives)
    if "label" in getattr(loss_fn, "needs", ()) and train.labels is not None:
        extra["label"] = gather_keep_grad(torch.as_tensor(train.labels)[batch["rows"]].to(device))[0]
    return extra


def _search_bias(model, tokenizer, dataset, train: TrainData, config, loss_fn, image_cache, text_feats, accelerator) -> float:
    """FFF 4.4: encode the first --bias-search-batches global batches of epoch 0 with the fresh model and
    return the logit bias minimising their summed initial loss (grid over [-20, 0], refined to 0.1)."""
    import torch

    from vltool.losses import LossInput, gather_keep_grad, search_logit_bias
    from vltool.model import to_device

    world, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
    sampler = make_sampler(train, config, world, rank, 0, 0)
    inner = getattr(sampler, "inner", sampler)
    inner.stop = min(config.bias_search_batches, sampler.per_epoch)
    collate = Collate(tokenizer, tokenize=text_feats is None, text_index=text_feats.index if text_feats is not None else None)
    encoded = []
    was_training = model.training
    model.eval()
    with torch.no_grad(), accelerator.autocast():
        for keys in sampler:
            batch = collate([dataset[k] for k in keys])
            rows = batch["rows"]
            kw = {}
            if image_cache is not None:
                kw["image_trunk"] = image_cache[rows].to(device)
            else:
                kw["images"] = batch.get("images", torch.zeros(0, 3, transform_size(model), transform_size(model))).to(device)
            if text_feats is not None:
                kw["text_trunk"] = text_feats(batch, device)
            else:
                kw["tokens"] = to_device(batch["tokens"], device) if "tokens" in batch else _empty_tokens(tokenizer, device)
            img, txt = model(**kw)
            encoded.append((gather_keep_grad(img.float())[0], gather_keep_grad(txt.float())[0], batch_extra(loss_fn, batch, train, device)))
    model.train(was_training)
    scale = model.logit_scale.detach().exp().float()

    def losses_at(b: float) -> float:
        bias = torch.tensor(b, device=device)
        with torch.no_grad():
            return sum(float(loss_fn(LossInput(i, t, scale, bias, extra=e))["loss"]) for i, t, e in encoded)

    return search_logit_bias(losses_at)


def _searched_bias_of(run_dir: Path):
    path = Path(run_dir) / METRICS_FILE
    if path.is_file():
        for l in path.read_text().splitlines():
            m = json.loads(l)
            if m.get("kind") == "bias_search":
                return m["logit_bias"]
    return None


class _DropRows:
    """Collate wrapper: rows whose image could not be decoded when caching features are dropped."""

    def __init__(self, inner, bad_rows: set[int], ds):
        self.inner, self.bad_rows = inner, bad_rows
        self.ids = None
        self.ds = ds

    def __call__(self, items):
        keep = [it for it in items if it["row"] not in self.bad_rows]
        out = self.inner(keep)
        out["bad_ids"] = out["bad_ids"] + [it["id"] for it in items if it["row"] in self.bad_rows]
        return out


def _empty_tokens(tokenizer, device):
    """Tokens of zero texts, for a process whose micro-batch was all bad images."""
    import torch

    t = tokenizer(["x"])
    if isinstance(t, dict):
        return {k: v[:0].to(device) for k, v in t.items()}
    return t[:0].to(device)


def _compute_caches(model, tokenizer, train: TrainData, config, transform, do_image: bool, do_text: bool, accelerator):
    """Trunk features of the frozen towers for every row (processes split the rows, then share them)."""
    import torch

    from vltool.losses import gather_keep_grad
    from vltool.model import to_device

    ds = train.dataset
    n = len(ds)
    world, rank = accelerator.num_processes, accelerator.process_index
    lo, hi = rank * n // world, (rank + 1) * n // world
    bs = max(64, config.batch_size)
    imgs, txts, bad = [], [], []
    model.eval()
    sampling = "first" if config.caption_sampling else None
    with torch.no_grad(), accelerator.autocast():
        for a in range(lo, hi, bs):
            rows = ds[a : min(hi, a + bs)]
            if do_image:
                ims = [decode_image(v) for v in rows[C.IMAGE]]
                bad += [a + j for j, im in enumerate(ims) if im is None]
                x = torch.stack([transform(im) if im is not None else torch.zeros(3, transform_size(model), transform_size(model)) for im in ims])
                imgs.append(model.image_trunk(x.to(accelerator.device)).float().cpu())
            if do_text:
                texts = [_texts_of(t, sampling)[0] for t in rows[train.text_column]]
                txts.append(model.text_trunk(to_device(tokenizer(texts), accelerator.device)).float().cpu())
    image_cache = text_cache = None
    if do_image:
        image_cache = gather_keep_grad(torch.cat(imgs).to(accelerator.device))[0].cpu()
    if do_text:
        text_cache = gather_keep_grad(torch.cat(txts).to(accelerator.device))[0].cpu()
    from accelerate.utils import gather_object

    bad_all = set(gather_object(bad)) if world > 1 else set(bad)
    return image_cache, text_cache, bad_all


# ---- the trunk store: a frozen tower's features of the same rows are the same in every run, so they are
# kept under $VLTOOL_CACHE/pretrain-trunks, keyed by the tower's weights, the rows' content (ids, images or
# texts, in order), the input transform and the precision. A run that changes any of these computes anew.

TRUNK_STORE = "pretrain-trunks"


def _digest(*parts) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode() if not isinstance(p, bytes) else p)
        h.update(b"\x00")
    return h.hexdigest()[:40]


def _rows_digest(ds, column: str) -> str:
    """The ids and one column's content of every row, in order (images by their bytes or path)."""
    import hashlib

    h = hashlib.sha256()
    for batch in ds.select_columns([C.ID, column]).iter(batch_size=1024):
        for rid, v in zip(batch[C.ID], batch[column]):
            h.update(str(rid).encode() + b"\x00")
            if isinstance(v, dict):  # an undecoded image
                h.update(v.get("bytes") or str(v.get("path")).encode())
            else:
                h.update(json.dumps(v, default=str).encode())
            h.update(b"\x01")
    return h.hexdigest()


def _store_path(kind: str, tower, *material) -> Path:
    from vltool.io import default_cache_dir
    from vltool.model import fingerprint

    return default_cache_dir() / TRUNK_STORE / f"{kind}-{_digest(kind, fingerprint(tower, {}), *material)}.pt"


def _store_load(path: Path):
    import torch

    try:
        return torch.load(path, weights_only=True) if path.is_file() else None
    except Exception:  # a damaged entry is recomputed
        return None


def _store_save(path: Path, obj) -> None:
    import uuid

    import torch

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache directory only costs the recomputation next time


def _stored_caches(model, tokenizer, train: TrainData, config, transform, do_image: bool, do_text: bool, accelerator, reused: dict):
    """_compute_caches through the trunk store (one process only; several processes compute as before)."""
    if accelerator.num_processes > 1:
        return _compute_caches(model, tokenizer, train, config, transform, do_image, do_text, accelerator)
    ds = train.dataset
    img_path = txt_path = None
    image_cache = text_cache = None
    bad: set[int] = set()
    if do_image:
        img_path = _store_path("image", model.visual, _rows_digest(ds, C.IMAGE), model.config["preprocess"], config.precision)
        hit = _store_load(img_path)
        if hit is not None:
            image_cache, bad = hit["features"], set(hit["bad"])
    if do_text:
        txt_path = _store_path("text", model.text, _rows_digest(ds, train.text_column), config.caption_sampling,
                               model.config.get("tokenizer"), config.precision)
        hit = _store_load(txt_path)
        if hit is not None:
            text_cache = hit["features"]
    need_img, need_txt = do_image and image_cache is None, do_text and text_cache is None
    if need_img or need_txt:
        ic, tc, b = _compute_caches(model, tokenizer, train, config, transform, need_img, need_txt, accelerator)
        if need_img:
            image_cache, bad = ic, b
            _store_save(img_path, {"features": ic, "bad": sorted(b)})
        if need_txt:
            text_cache = tc
            _store_save(txt_path, {"features": tc})
    if do_image:
        reused["image"] = not need_img
    if do_text:
        reused["text"] = not need_txt
    return image_cache, text_cache, bad


def _stored_text_table(model, tokenizer, train: TrainData, config, accelerator, reused: dict) -> FrozenText:
    if accelerator.num_processes > 1:
        return _compute_text_table(model, tokenizer, train, config, accelerator)
    texts = _table_texts(train)
    path = _store_path("text-table", model.text, texts, model.config.get("tokenizer"), config.precision)
    hit = _store_load(path)
    reused["text"] = hit is not None
    if hit is not None:
        return FrozenText(table=hit["features"], index={t: i for i, t in enumerate(texts)})
    feats = _compute_text_table(model, tokenizer, train, config, accelerator)
    _store_save(path, {"features": feats.table})
    return feats


def _table_texts(train: TrainData) -> list[str]:
    values = train.dataset[train.text_column]
    if train.templated is not None and train.templated.any():  # unicl: every template around every class name
        texts = set()
        for v, tpl in zip(values, train.templated.tolist()):
            for t in _texts_of(v, None if isinstance(v, str) else "random"):
                texts.update([f.format(t) for f in train.templates] if tpl else [t])
    else:
        texts = {t for v in values for t in _texts_of(v, "random")}
    return sorted(texts, key=lambda t: (len(t), t))  # similar lengths in a batch: less padding


def _compute_text_table(model, tokenizer, train: TrainData, config, accelerator) -> FrozenText:
    """The frozen text trunk's features of every distinct text a step can draw: the caption lists' entries,
    or UniCL's templates around each class name (processes split them)."""
    import torch

    from vltool.losses import gather_keep_grad
    from vltool.model import to_device

    texts = _table_texts(train)
    world, rank = accelerator.num_processes, accelerator.process_index
    n = len(texts)
    lo, hi = (rank * n // world, (rank + 1) * n // world) if n >= world else (0, n)
    bs = max(64, config.batch_size)
    feats = []
    model.eval()
    with torch.no_grad(), accelerator.autocast():
        for a in range(lo, hi, bs):
            feats.append(model.text_trunk(to_device(tokenizer(texts[a : min(hi, a + bs)]), accelerator.device)).float().cpu())
    table = torch.cat(feats)  # (U_local, W)
    if n >= world:
        table = gather_keep_grad(table.to(accelerator.device))[0].cpu()  # (U, W), in text order
    return FrozenText(table=table, index={t: i for i, t in enumerate(texts)})


def transform_size(model) -> int:
    return int(model.config["preprocess"]["size"])


def _gather_set(items: set, accelerator) -> set:
    if accelerator.num_processes == 1:
        return set(items)
    from accelerate.utils import gather_object

    return set(gather_object(sorted(items)))


def _revert_sync_bn(model):
    return model  # SyncBatchNorm keeps BatchNorm's state dict keys; the saved weights load into BatchNorm


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after the checkpoint a run resumes from."""
    if not path.is_file():
        return
    keep = [l for l in path.read_text().splitlines() if l.strip() and json.loads(l).get("step", 0) <= step]
    path.write_text("".join(l + "\n" for l in keep))


def _save_checkpoint(run_dir: Path, step: int, model, loss_fn, optimizer, accelerator, samples_seen, bad_ids, first_loss, keep: int) -> Path:
    """RUN_DIR/checkpoints/step_NNNNNNNN/, written to a temporary directory and renamed when complete."""
    import torch
    from safetensors.torch import save_file

    from vltool.model import state_dict_for_save

    rank = accelerator.process_index
    base = run_dir / CHECKPOINTS
    final = base / f"step_{step:08d}"
    tmp = base / f".step_{step:08d}.tmp"
    bad_all = _gather_set(bad_ids, accelerator)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(_rng_state(), tmp / f"rng_{rank}.pt")
    if accelerator.is_main_process:
        plain = model.module if hasattr(model, "module") else model
        save_file(state_dict_for_save(plain), str(tmp / "model.safetensors"))
        loss_state = {k: v.detach().cpu().contiguous() for k, v in loss_fn.state_dict().items()}
        if loss_state:
            save_file(loss_state, str(tmp / "loss.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if accelerator.scaler is not None:
            torch.save(accelerator.scaler.state_dict(), tmp / "scaler.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"step": step, "samples_seen": samples_seen, "bad_image_ids": sorted(bad_all), "first_loss": first_loss,
                 "num_processes": accelerator.num_processes}
        (tmp / "state.json").write_text(json.dumps(state))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _load_checkpoint(ckpt: Path, model, loss_fn, optimizer, accelerator, rank: int):
    import torch
    from safetensors.torch import load_file

    plain = model.module if hasattr(model, "module") else model
    plain.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=True)
    if (ckpt / "loss.safetensors").is_file():
        loss_fn.load_state_dict(load_file(str(ckpt / "loss.safetensors")), strict=True)
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True))
    if accelerator.scaler is not None and (ckpt / "scaler.pt").is_file():
        accelerator.scaler.load_state_dict(torch.load(ckpt / "scaler.pt", weights_only=True))
    _set_rng_state(torch.load(ckpt / f"rng_{rank}.pt", weights_only=True))
    state = json.loads((ckpt / "state.json").read_text())
    return state["step"], state["samples_seen"], set(state["bad_image_ids"]), state.get("first_loss")
