"""Features of wholly frozen towers, computed once, and the model inputs of a batch.

A tower whose parameters are all frozen gives the same trunk features for the same input every step, so
when its input is fixed (no image augmentation; one fixed caption per row) they are computed once before
training. Captions sampled from lists (CLIPS, k captions per image, UniCL's templates) come from a finite
set of texts: a frozen text tower's features are then computed once per distinct text (a table).

They go through the embedding cache every command shares (vltool.cache), so a second run with the same
frozen tower and rows reads them back. The key: the tower's weight fingerprint, the training rows (each
input's on-disk fingerprint and row filter, and the rows dropped for having no text; no per-row hashing),
the column, the preprocessing (the image transform or the tokenizer, and the precision), and how they were
computed (`computed_by`: the encoding batch, the device, on a CPU the threads and kernels' instruction set). A row whose
image could not be decoded is stored as NaN and left out of every batch. Several processes compute their
share of the rows and gather them, without the cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from vltool import columns as C
from vltool.cache import CacheKey, EmbeddingCache, texts_digest
from vltool.io.images import decode_image
from vltool.losses import gather_keep_grad
from vltool.model.load import to_device
from vltool.model.pinning import fingerprint
from vltool.pretrain.data.rows import TrainData, texts_of

TEXTS_COLUMN = "<texts>"  # the column of a text table's cache key: a list of distinct texts, not a dataset column


class FrozenText:
    """Trunk features of a wholly frozen text tower: one per row when each row's text is fixed
    (`per_row`, (N, W)), or one per distinct text (`table`, (U, W), with `index` text -> row of the table)."""

    def __init__(self, per_row=None, table=None, index: dict | None = None):
        self.per_row, self.table, self.index = per_row, table, index

    def __call__(self, batch: dict, device):
        if self.per_row is not None:
            return self.per_row[batch["rows"]].to(device, non_blocking=True)  # (B, W)
        return self.table[batch["text_index"]].to(device, non_blocking=True)  # (B*k, W)


@dataclass
class FrozenFeatures:
    """What is computed once: the image trunk's features per row, the text trunk's per row or per text."""

    image: torch.Tensor | None = None  # (N, W) float32, rows of bad images NaN
    text: FrozenText | None = None
    bad_rows: set = field(default_factory=set)  # rows whose image could not be decoded
    reused: dict = field(default_factory=dict)  # side -> read from the cache

    def describe(self) -> dict:
        table = self.text is not None and self.text.table is not None
        return {"image": self.image is not None, "text": "per distinct text" if table else self.text is not None,
                "reused_from_store": self.reused}


def frozen_features(model, tokenizer, train: TrainData, config, frozen: dict, uses_text: bool, transform, accelerator) -> FrozenFeatures:
    """The features of the wholly frozen towers whose input is fixed (config.cache_frozen)."""
    fixed_text = config.caption_sampling != "random" and config.captions_per_image == 1
    templated = train.templated is not None and bool(train.templated.any())
    do_image = config.cache_frozen and frozen["image"] and config.augment == "none" and uses_text
    do_text = config.cache_frozen and frozen["text"] and uses_text
    out = FrozenFeatures()
    # the tokenizer's settings and the digest of its files (a tokenizer-only change is a different key)
    tok_key = {**(model.config.get("tokenizer") or {}), "files_sha256": tokenizer.files_digest() if hasattr(tokenizer, "files_digest") else None}
    apart = {"before_projection": True} if getattr(model, "projections_apart", False) else {}  # (a whole CLIP's, trained)
    apart["computed"] = computed_by(config, accelerator)
    if do_image:
        out.image, out.bad_rows, out.reused["image"] = _through_cache(
            _key(model.visual, train, C.IMAGE, {"kind": "image-trunk", "transform": model.config["preprocess"], "precision": config.precision, **apart}),
            lambda: _encode_rows(model, train, config, accelerator, image=transform), accelerator)
    if do_text and fixed_text and not templated:
        pre = {"kind": "text-trunk", "tokenizer": tok_key, "caption_sampling": config.caption_sampling,
               "source": train.text_source, "precision": config.precision, **apart}
        per_row, _, out.reused["text"] = _through_cache(
            _key(model.text, train, train.text_column, pre),
            lambda: _encode_rows(model, train, config, accelerator, tokenizer=tokenizer), accelerator)
        out.text = FrozenText(per_row=per_row)
    elif do_text:
        texts = table_texts(train)
        pre = {"kind": "text-trunk", "tokenizer": tok_key, "precision": config.precision, **apart}
        table, _, out.reused["text"] = _through_cache(
            _key(model.text, None, TEXTS_COLUMN, pre, texts=texts),
            lambda: _encode_texts(model, tokenizer, texts, config, accelerator), accelerator)
        out.text = FrozenText(table=table, index={t: i for i, t in enumerate(texts)})
    return out


CPU_MATH_ENV = ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA")  # what pins the CPU's kernels (docs/pretrain.md)


def computed_by(config, accelerator) -> dict:
    """What the features' bits depend on beyond the tower and its input, part of their cache key: the
    encoding batch (padding and matrix shapes change the rounding), the device and, on a CPU, the threads,
    the instruction set torch's kernels use and what pins MKL's and oneDNN's. A chaotic run (CLIP-Lite's
    JSD at one seed) trained on features computed another way gives other numbers, so features computed
    under other conditions are never read back as these."""
    rec = {"batch": max(64, config.batch_size), "device": accelerator.device.type}
    if accelerator.device.type == "cpu":
        rec |= {"threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                **{k.lower(): os.environ[k] for k in CPU_MATH_ENV if os.environ.get(k)}}
    return rec


def model_inputs(batch: dict, features: FrozenFeatures, tokenizer, image_size: int, device) -> dict:
    """The keyword arguments of TwoTower.forward for a batch: images or cached image trunk features,
    tokens or cached text trunk features (empty tensors for a process whose rows were all bad images)."""
    kw = {}
    if features.image is not None:
        kw["image_trunk"] = features.image[batch["rows"]].to(device, non_blocking=True)  # (B, W)
    else:
        kw["images"] = batch.get("images", torch.zeros(0, 3, image_size, image_size)).to(device, non_blocking=True)  # (B, 3, H, W)
    if features.text is not None:
        kw["text_trunk"] = features.text(batch, device)  # (B*k, W)
    elif "tokens" in batch:
        kw["tokens"] = to_device(batch["tokens"], device)
    else:
        tokens = tokenizer(["x"])
        kw["tokens"] = {k: v[:0].to(device) for k, v in tokens.items()} if isinstance(tokens, dict) else tokens[:0].to(device)
    return kw


def table_texts(train: TrainData) -> list[str]:
    """Every distinct text a step can draw: the caption lists' entries, or UniCL's templates around each
    class name; sorted by length, so that a batch of them needs little padding."""
    values = train.dataset[train.text_column]
    if train.templated is not None and train.templated.any():
        texts = set()
        for v, tpl in zip(values, train.templated.tolist()):
            for t in texts_of(v, None if isinstance(v, str) else "random"):
                texts.update([f.format(t) for f in train.templates] if tpl else [t])
    else:
        texts = {t for v in values for t in texts_of(v, "random")}
    return sorted(texts, key=lambda t: (len(t), t))


# ---- the embedding cache


def _key(tower, train: TrainData | None, column: str, preprocessing: dict, texts: list[str] | None = None):
    if texts is not None:
        return CacheKey(model=fingerprint(tower, {}), dataset=texts_digest(texts), rows={}, column=column, preprocessing=preprocessing)
    return CacheKey(model=fingerprint(tower, {}), dataset="pretrain-rows", rows=train.rows_key, column=column, preprocessing=preprocessing)


def _through_cache(key, compute, accelerator) -> tuple[torch.Tensor, set, bool]:
    """(features (N, W) float32, rows that are NaN (bad images), read from the cache)."""
    if accelerator.num_processes > 1:
        feats = compute()
        return feats, _nan_rows(feats), False
    cache = EmbeddingCache()
    hit = cache.get(key)
    if hit is not None:
        feats = torch.from_numpy(hit)
        return feats, _nan_rows(feats), True
    feats = compute()
    try:
        cache.put(key, feats.numpy())
    except OSError:
        pass  # an unwritable cache only costs the recomputation next time
    return feats, _nan_rows(feats), False


def _nan_rows(feats: torch.Tensor) -> set:
    return set(torch.isnan(feats).any(1).nonzero().flatten().tolist())


# ---- computing them (processes split the rows, then share them)


@torch.no_grad()
def _encode_rows(model, train: TrainData, config, accelerator, image=None, tokenizer=None) -> torch.Tensor:
    """The image trunk's features of every row (`image`: the transform; bad images NaN), or the text
    trunk's of every row's first caption (`tokenizer`). (N, W) float32 on the CPU."""
    ds, n = train.dataset, len(train.dataset)
    world, rank = accelerator.num_processes, accelerator.process_index
    lo, hi = rank * n // world, (rank + 1) * n // world
    bs = max(64, config.batch_size)
    size = int(model.config["preprocess"]["size"])
    sampling = "first" if config.caption_sampling else None
    parts = []
    model.eval()
    with accelerator.autocast():
        for a in range(lo, hi, bs):
            if image is not None:
                ims = [decode_image(v, rgb=False) for v in ds[a : min(hi, a + bs)][C.IMAGE]]
                x = torch.stack([image(im) if im is not None else torch.zeros(3, size, size) for im in ims])  # (b, 3, H, W)
                f = model.image_trunk(x.to(accelerator.device)).float().cpu()  # (b, W)
                f[[j for j, im in enumerate(ims) if im is None]] = float("nan")
            else:
                texts = [texts_of(t, sampling)[0] for t in ds[a : min(hi, a + bs)][train.text_column]]
                f = model.text_trunk(to_device(tokenizer(texts), accelerator.device)).float().cpu()
            parts.append(f)
    return gather_keep_grad(torch.cat(parts).to(accelerator.device))[0].cpu()  # (N, W), in row order


@torch.no_grad()
def _encode_texts(model, tokenizer, texts: list[str], config, accelerator) -> torch.Tensor:
    """The text trunk's features of each text of the table, (U, W) float32 on the CPU."""
    world, rank = accelerator.num_processes, accelerator.process_index
    n = len(texts)
    lo, hi = (rank * n // world, (rank + 1) * n // world) if n >= world else (0, n)
    bs = max(64, config.batch_size)
    feats = []
    model.eval()
    with accelerator.autocast():
        for a in range(lo, hi, bs):
            feats.append(model.text_trunk(to_device(tokenizer(texts[a : min(hi, a + bs)]), accelerator.device)).float().cpu())
    table = torch.cat(feats)  # (U_local, W)
    if n >= world:
        table = gather_keep_grad(table.to(accelerator.device))[0].cpu()  # (U, W), in text order
    return table
