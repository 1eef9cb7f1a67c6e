"""The training rows and the order a step sees them in.

- `load_train_data` / `load_unicl_data`: the inputs concatenated, their columns checked, rows without text
  dropped (counted), and what an objective needs per row (mined positives, UniCL labels) attached.
- `EpochBatches` / `BalancedEpochBatches`: global micro-batch k of epoch e is a slice of a permutation that
  depends on (seed, e) only; process r takes its r-th part. So N processes with --accum-steps A see what
  one process with batch A x N x B sees, and a resumed run continues exactly.
- `PairDataset` + `Collate`: item (epoch, row) -> image tensor and text(s); each row's augmentation and
  caption draw come from a generator seeded by (seed, epoch, row), whatever the number of workers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from vltool import columns as C
from vltool.errors import UsageError
from vltool.io import decode_image
from vltool.pretrain.config import PretrainConfig


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
    rows_key: dict | None = None  # which rows these are, for cache keys: the inputs' fingerprints and filters, rows dropped
    text_source: str = ""  # the dataset column(s) the texts come from, for cache keys

    @property
    def ids(self) -> list:
        return self.dataset[C.ID]


def rows_key(loaded, role: Sequence[str], prefix_ids: bool, dropped: Sequence[int]) -> dict:
    """What identifies the training rows without reading them: each input's on-disk fingerprint and row
    filter (vltool.cache's convention), and the rows dropped for having no text."""
    import hashlib

    from vltool.cache import row_filter

    return {
        "inputs": [{"fingerprint": s.fingerprint, "role": r, **row_filter(s.split, s.where)} for s, r in zip(loaded, role)],
        "prefix_ids": prefix_ids,
        "dropped": hashlib.sha256(np.asarray(dropped, dtype=np.int64).tobytes()).hexdigest(),
    }


def texts_of(value, sampling: str | None) -> list[str]:
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
    from vltool.checks import text_column

    for src in loaded:
        if lists:
            text_column(src.dataset, text_col, src.spec, option="the column --caption-sampling and --captions-per-image read,", list_only=True)
        else:
            text_column(src.dataset, text_col, src.spec,
                        hint="; a row's several texts are sampled with --caption-sampling (which reads 'captions')")
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
    keep = [i for i, t in enumerate(texts) if texts_of(t, "first" if lists else None)]
    empty_ids, dropped = [], []
    if len(keep) != rows_in:
        all_ids = ds[C.ID]
        keep_set = set(keep)
        dropped = [i for i in range(rows_in) if i not in keep_set]
        empty_ids = [all_ids[i] for i in dropped]
        ds = ds.select(keep)
    if len(ds) == 0:
        raise UsageError(f"the {what} has no rows with text in {text_col!r}")
    positives = _positive_rows(ds) if C.POSITIVES in needed else None
    key = rows_key(loaded, ["pairs"] * len(loaded), config.prefix_ids, dropped)
    return TrainData(ds, text_col, loaded, rows_in, empty_ids, positives, rows_key=key, text_source=text_col)


def _positive_rows(ds) -> dict[int, list[int]]:
    """Row -> rows of its mined positives (`positives` ids outside the training rows are ignored)."""
    row_of = {i: r for r, i in enumerate(ds[C.ID])}
    positives = {}
    for r, ps in enumerate(ds[C.POSITIVES]):
        rows_ = [row_of[p] for p in (ps or []) if p in row_of and row_of[p] != r]
        if rows_:
            positives[r] = rows_
    return positives


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
    parts, loaded, empty_ids, seen, dropped = [], [], [], {}, []
    rows_in = 0
    for k, (spec_, role) in enumerate(specs):
        col = config.label_column if role == "label" else config.text_column
        src = load_dataset(spec_, split=split, where=where, required=[C.ID, C.IMAGE, col])
        loaded.append(src)
        ds = src.dataset
        texts = _role_texts(ds, col, role, spec_, classes)
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
        dropped += [rows_in + j for j, t in enumerate(texts) if t is None]
        rows_in += len(ds)
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
    key = rows_key(loaded, [r for _, r in specs], config.prefix_ids, dropped)
    data = TrainData(ds, UNICL_TEXT, loaded, rows_in, empty_ids, rows_key=key,
                     text_source=f"label:{config.label_column}|text:{config.text_column}")
    data.labels = labels.astype(np.int64)
    data.templated = is_label
    data.templates = templates
    return data


def _role_texts(ds, col: str, role: str, spec_: str, classes: dict[str, int]) -> list:
    """Each row's text (None when missing): a label row's class name (new names join `classes`), or a caption."""
    import datasets

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
        from vltool.checks import text_column

        text_column(ds, col, spec_)
        texts = [t if isinstance(t, str) and t.strip() else None for t in ds[col]]
    return texts


class BalancedEpochBatches:
    """UniCL B.2: epoch e holds every image-label row and min(#label, #text) image-text rows drawn anew
    (without replacement, seeded by (seed, e)), shuffled together; batching as EpochBatches."""

    def __init__(self, label_rows, text_rows, batch: int, world: int, rank: int, seed: int, start: int, stop: int, accum: int = 1):
        self.label_rows, self.text_rows = np.asarray(label_rows), np.asarray(text_rows)
        self.n = len(self.label_rows) + min(len(self.label_rows), len(self.text_rows))
        self.inner = EpochBatches(self.n, batch, world, rank, seed, start, stop, accum)
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
        return BalancedEpochBatches(rows[train.templated], rows[~train.templated], config.batch_size, world, rank, config.seed, start,
                                    stop, config.accum_steps)
    return EpochBatches(len(train.dataset), config.batch_size, world, rank, config.seed, start, stop, config.accum_steps)


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
        texts = texts_of(rec[self.text_column], self.sampling or ("first" if k > 1 else None))
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


class Collate:
    """Items -> a batch: "rows" (B,), "images" (B, 3, H, W) [and "images2"], "tokens" of the texts (or
    "text_index" into a frozen text tower's feature table), "text_rows" (B*k,) with k captions per image,
    and "bad_ids", the ids of the rows left out because their image could not be decoded."""

    def __init__(self, tokenizer, tokenize: bool = True, text_index: dict | None = None, bad_rows=frozenset()):
        self.tokenizer = tokenizer
        self.tokenize = tokenize  # False when text features are cached
        self.text_index = text_index  # text -> row of the frozen text tower's feature table (sampled captions)
        self.bad_rows = bad_rows  # rows whose image failed to decode when the image features were cached

    def __call__(self, items: list[dict]) -> dict:
        import torch

        bad = [it.get("bad", False) or it["row"] in self.bad_rows for it in items]
        good = [it for it, b in zip(items, bad) if not b]
        batch = {
            "rows": torch.tensor([it["row"] for it in good], dtype=torch.long),
            "bad_ids": [it["id"] for it, b in zip(items, bad) if b],
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

    Global micro-batch k of epoch e is rows perm_e[k*G:(k+1)*G] (G = batch * processes); process r takes
    its r-th slice of B rows. perm_e depends on (seed, e) only. An epoch holds whole optimizer steps of
    `accum` micro-batches (the last incomplete step dropped), so step s takes exactly the rows, in order,
    that one process with batch accum * processes * B takes at its step s.
    """

    def __init__(self, n: int, batch: int, world: int, rank: int, seed: int, start: int, stop: int, accum: int = 1):
        self.n, self.batch, self.world, self.rank, self.seed = n, batch, world, rank, seed
        self.per_epoch = n // (batch * world * accum) * accum
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
