"""Image transforms: the deterministic eval transform, and for training none, CLIP's random resized crop,
SimCLR's augmentations.

A leaf module (torchvision and open_clip, imported inside the functions; no other vltool module):
vltool.model.load builds a loaded model's `preprocess` with `eval_transform`.
Training transforms draw from torch's global RNG; the trainer seeds it per row (seed, epoch, row), so an
augmentation does not depend on the worker, the process count or a resume.
"""

from __future__ import annotations

from typing import Callable

import transformers
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

AUGMENTATIONS = ("none", "clip", "simclr")


def _interp(name: str):
    return {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR}.get(name, InterpolationMode.BICUBIC)


def blur_kernel(size: int) -> int:
    """SimCLR's Gaussian blur kernel: 10% of the image side, odd, at least 3 (23 px at 224)."""
    k = max(3, int(round(0.1 * size)))
    return k if k % 2 == 1 else k + 1


class HFImageTransform:
    """A Hugging Face image processor (from its to_dict()) as a transform: PIL.Image -> (3,H,W) float tensor,
    exactly the processor's pixel_values."""

    def __init__(self, processor: dict):
        self.processor = getattr(transformers, processor["image_processor_type"]).from_dict(processor)

    def __call__(self, im):
        # the image as decoded: the processor converts it to RGB itself (transparency composited on white)
        return self.processor(images=im, return_tensors="pt")["pixel_values"][0]


def composite_on_white(im):
    """transformers' convert_rgb: a transparent image composited on white (PIL's convert drops the alpha)."""
    if im.mode == "RGB":
        return im
    rgba = im.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255)), rgba).convert("RGB")


def eval_transform(preprocess: dict) -> Callable:
    """Deterministic eval transform: resize the shorter side, centre crop, normalise (open_clip's); a
    Hugging Face model's own image processor when the model has one ("hf_image_processor").

    Both take an image in its own mode (vltool.io.decode_image(v, rgb=False)) and convert it as their
    library does: open_clip after resizing (PIL's convert: alpha dropped), transformers' processors first
    (transparency composited on white)."""
    if preprocess.get("hf_image_processor"):
        return HFImageTransform(preprocess["hf_image_processor"])
    cfg = PreprocessCfg(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in preprocess.items() if k in PreprocessCfg.__dataclass_fields__})
    return image_transform_v2(cfg, is_train=False)


def train_transform(preprocess: dict, augment: str) -> Callable:
    """PIL.Image -> (3,H,W) float tensor with the model's normalisation and the chosen augmentation."""
    if augment == "none":
        return eval_transform(preprocess)
    size = int(preprocess["size"])
    interp = _interp(preprocess.get("interpolation", "bicubic"))
    norm = T.Normalize(mean=preprocess["mean"], std=preprocess["std"])
    # to RGB first: a Hugging Face model's images composited on white, as its processor does; PIL's convert else
    rgb = T.Lambda(composite_on_white if preprocess.get("hf_image_processor") else (lambda im: im.convert("RGB")))
    if augment == "clip":  # open_clip's training transform: RandomResizedCrop(scale 0.9-1)
        return T.Compose([rgb, T.RandomResizedCrop(size, scale=(0.9, 1.0), interpolation=interp), T.ToTensor(), norm])
    if augment == "simclr":  # Chen et al. 2020, as Santurkar et al. use it
        return T.Compose(
            [
                rgb,
                T.RandomResizedCrop(size, scale=(0.08, 1.0), interpolation=interp),
                T.RandomHorizontalFlip(),
                T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                T.RandomGrayscale(p=0.2),
                T.RandomApply([T.GaussianBlur(blur_kernel(size), sigma=(0.1, 2.0))], p=0.5),
                T.ToTensor(),
                norm,
            ]
        )
    raise ValueError(f"unknown augmentation {augment!r}")
