"""A row as the step takes it: `PairDataset`, item (epoch, row) -> image and text(s), each row's augmentation
and caption draw seeded by (seed, epoch, row) whatever the number of workers; `Collate`, items -> a batch."""

from __future__ import annotations

import random
import sys

import numpy as np
import torch

from vltool import columns as C
from vltool.io.images import decode_image, decode_pixels, jpeg_for_device
from vltool.pretrain.data.rows import texts_of


def row_seed(seed: int, epoch: int, row: int) -> int:
    """The seed of one row's augmentation and caption draw."""
    return int(np.random.SeedSequence([seed, epoch, row]).generate_state(1, dtype=np.uint64)[0] >> 1)


class PairDataset:
    """Item (epoch, row) -> {"row", "id", "image" tensor, "text"}; {"row", "id", "bad": True} for a bad image.
    `transform` is a vltool.transforms.Pixels (uint8 crops, normalised on the device) or any callable of a
    PIL image."""

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

    @staticmethod
    def _seeded(seed: int, fn):
        g = torch.random.default_generator  # torchvision draws from it; CPU only, unlike torch.manual_seed
        saved = g.get_state()
        g.manual_seed(seed)
        try:
            return fn()
        finally:
            g.set_state(saved)

    def _warn_cpu_decoded(self, id_) -> None:
        if not getattr(self, "_warned_cpu_decoded", False):
            self._warned_cpu_decoded = True
            print(f"warning: --decode gpu: sample {id_!r} is not a JPEG that nvjpeg decodes (baseline or progressive, RGB or "
                  "grayscale); such samples are decoded in the data-loader workers (this worker says so once)",
                  file=sys.stderr, flush=True)

    def decode(self, image: dict | None):
        """A stored image as the transform takes it: a uint8 tensor (vltool.transforms.Pixels that take one),
        else a PIL image in its own mode (the transform converts it as the model's library does)."""
        if getattr(self.transform, "takes", "pil") == "tensor":
            return decode_pixels(image, composite=self.transform.composite)
        return decode_image(image, rgb=False)

    def __getitem__(self, key):
        epoch, row = key
        rec = self.ds[int(row)]
        return self.item(epoch, int(row), rec[C.ID], rec[self.text_column], rec[C.IMAGE])

    def item(self, epoch: int, row: int, id_: str, text, image: dict | None) -> dict:
        """One training item from a row's id, text value and undecoded image ({"bytes", "path"})."""
        out = {"row": row, "id": id_}
        s = row_seed(self.seed, epoch, row)
        k = self.captions_per_image
        texts = texts_of(text, self.sampling or ("first" if k > 1 else None))
        if not texts:  # a streamed sample without text (a dataset's rows without text were dropped at load time)
            return {**out, "bad": True, "no_text": True}
        if k > 1:
            if self.sampling == "random":
                texts = random.Random(s).sample(texts, len(texts))
            out["texts"] = [texts[i % len(texts)] for i in range(k)]
        elif self.templated is not None and self.templated[int(row)]:
            out["text"] = random.Random(s).choice(self.templates).format(texts[0])  # UniCL: a random template per sample
        else:
            out["text"] = random.Random(s).choice(texts) if self.sampling == "random" else texts[0]
        if self.load_images:
            if getattr(self.transform, "on_device", False):  # --decode gpu: a JPEG crosses as its bytes and crop box
                found = jpeg_for_device(image)
                if found is not None:
                    data, hw = found
                    out["jpeg"] = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # (bytes,)
                    out["box"] = self._seeded(s, lambda: self.transform.transform.box(hw))
                    return out
                self._warn_cpu_decoded(id_)
            im = self.decode(image)
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
    "bad_ids", the ids of the rows left out because their image could not be decoded (or, streamed, they have
    no text: "no_text" counts those)."""

    def __init__(self, tokenizer, tokenize: bool = True, text_index: dict | None = None, bad_rows=frozenset()):
        self.tokenizer = tokenizer
        self.tokenize = tokenize  # False when text features are cached
        self.text_index = text_index  # text -> row of the frozen text tower's feature table (sampled captions)
        self.bad_rows = bad_rows  # rows whose image failed to decode when the image features were cached

    def __call__(self, items: list[dict]) -> dict:
        bad = [it.get("bad", False) or it["row"] in self.bad_rows for it in items]
        good = [it for it, b in zip(items, bad) if not b]
        batch = {
            "rows": torch.tensor([it["row"] for it in good], dtype=torch.long),
            "bad_ids": [it["id"] for it, b in zip(items, bad) if b],
            "no_text": sum(1 for it in items if it.get("no_text")),
            "n": len(good),
        }
        if any("jpeg" in it for it in good):  # --decode gpu: the JPEGs' bytes end to end (one tensor), the rest decoded
            at = [i for i, it in enumerate(good) if "jpeg" in it]
            batch["jpeg"] = torch.cat([good[i]["jpeg"] for i in at])  # (total bytes,)
            batch["jpeg_sizes"] = torch.tensor([good[i]["jpeg"].numel() for i in at], dtype=torch.long)  # (J,)
            batch["jpeg_boxes"] = torch.tensor([good[i]["box"] for i in at], dtype=torch.long)  # (J, 4) top, left, h, w
            batch["jpeg_at"] = torch.tensor(at, dtype=torch.long)  # (J,) places in the batch
            rest = [i for i, it in enumerate(good) if "image" in it]
            if rest:
                batch["images"] = torch.stack([good[i]["image"] for i in rest])  # (n - J, 3, H, W)
                batch["images_at"] = torch.tensor(rest, dtype=torch.long)
        elif good and "image" in good[0]:
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
