"""Image transforms: the deterministic eval transform, and for training none, CLIP's random resized crop,
SimCLR's augmentations.

Training transforms come in two forms. `train_transform` is the reference: PIL image -> normalised float
tensor, as torchvision and open_clip compose it. `train_pixels` is what the trainer runs (docs/pretrain.md,
"The data path"): a data-loader worker makes uint8 (3,H,W) crops, and the float conversion and normalisation
run on the training device (`Pixels.normalise`, the same float operations as ToTensor + Normalize, so the
result is bit for bit the reference's wherever the crop is made by the same code: `none` and `simclr`).
`clip` crops and resizes the decoded uint8 tensor (torchvision.transforms.v2: the reference's crop box from
the same draws, bicubic with antialias), which differs from PIL's resampling by a few levels at a few pixels.

Imports torch, PIL and torchvision; open_clip's transform (vltool.open_clip_parts, a leaf) and transformers inside
the functions that use them, and no other vltool module.
vltool.model.load builds a loaded model's `preprocess` with `eval_transform`.
Training transforms draw from torch's global RNG; the trainer seeds it per row (seed, epoch, row), so an
augmentation does not depend on the worker, the process count or a resume.
"""

from __future__ import annotations

from typing import Callable

import torch
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
        import transformers

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
    from vltool.open_clip_parts import part  # (open_clip's transform, without open_clip's model families)

    t = part("transform")
    cfg = t.PreprocessCfg(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in preprocess.items() if k in t.PreprocessCfg.__dataclass_fields__})
    return t.image_transform_v2(cfg, is_train=False)


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


# ---- the trainer's form: uint8 crops in the workers, normalised on the device


class _ToUint8:
    """PIL RGB image -> (3,H,W) uint8 tensor: the integer half of ToTensor (which then divides by 255)."""

    def __call__(self, im):
        if isinstance(im, torch.Tensor):
            return im
        return T.functional.pil_to_tensor(im)

    def __repr__(self) -> str:
        return "ToUint8()"


class _TensorRandomResizedCrop:
    """RandomResizedCrop on a (3,H,W) uint8 tensor: the crop box drawn exactly as torchvision's
    RandomResizedCrop draws it (the same generator calls, so the same box as the PIL reference for a seed),
    resized with torchvision.transforms.v2 (bicubic or bilinear, antialias), uint8 out."""

    def __init__(self, size: int, scale: tuple, interpolation):
        self.size, self.scale, self.ratio, self.interpolation = size, scale, (3 / 4, 4 / 3), interpolation

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.crop(x, self.box(x.shape[-2:]))

    def box(self, hw) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop of an image of size hw = (H, W): the draws __call__ makes."""
        shape = torch.empty((1, 1, 1), dtype=torch.uint8).expand(3, int(hw[0]), int(hw[1]))  # (3, H, W), no memory
        return tuple(int(v) for v in T.RandomResizedCrop.get_params(shape, list(self.scale), list(self.ratio)))

    def crop(self, x: torch.Tensor, box) -> torch.Tensor:
        """(3, H, W) uint8 (on any device) -> (3, size, size) uint8: the box, resized."""
        from torchvision.transforms.v2 import functional as F2

        i, j, h, w = box
        return F2.resized_crop(x, i, j, h, w, [self.size, self.size], interpolation=self.interpolation, antialias=True)

    def __repr__(self) -> str:
        return f"TensorRandomResizedCrop(size={self.size}, scale={self.scale}, interpolation={self.interpolation.value})"


class Pixels:
    """A training transform in the trainer's form. `__call__(image)` runs in a data-loader worker and gives a
    (3,H,W) tensor: uint8 when `mean` is set (normalised later, on the device, by `normalise`), else the
    normalised float tensor itself (a Hugging Face image processor, whose arithmetic is its own).
    `takes` is what it is called with: "pil" (an image in its own mode, vltool.io.decode_image(rgb=False)) or
    "tensor" (a (3,H,W) uint8 RGB tensor, vltool.io.decode_pixels)."""

    def __init__(self, transform: Callable, takes: str, mean=None, std=None, composite: bool = False, on_device: bool = False):
        self.transform, self.takes, self.mean, self.std = transform, takes, mean, std
        self.composite = composite  # "tensor": transparency composited on white (a Hugging Face model's rule)
        self.on_device = on_device  # --decode gpu: JPEGs cross as bytes and a crop box; device_images decodes and crops them
        self._on: dict = {}

    def __call__(self, image) -> torch.Tensor:
        return self.transform(image)

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """(B,3,H,W) uint8 on the device -> float32, exactly ToTensor's x/255 then Normalize's (x-mean)/std;
        a float tensor (already normalised) is returned as it is."""
        if x.dtype != torch.uint8:
            return x
        key = str(x.device)
        if key not in self._on:
            self._on[key] = tuple(torch.as_tensor(v, dtype=torch.float32, device=x.device).view(-1, 1, 1) for v in (self.mean, self.std))
        mean, std = self._on[key]
        return x.to(torch.float32).div_(255).sub_(mean).div_(std)


    def device_images(self, batch: dict, device) -> torch.Tensor:
        """--decode gpu: a batch's images as (n, 3, size, size) uint8 on `device`. Its JPEGs ("jpeg": their
        bytes end to end, "jpeg_sizes", "jpeg_boxes", "jpeg_at": their places in the batch) are decoded
        together by torchvision.io.decode_jpeg on the device (nvjpeg on a GPU) and cropped there; the
        samples their workers decoded ("images" at "images_at") are copied in."""
        from torchvision.io import ImageReadMode, decode_jpeg

        size = self.transform.size
        out = torch.empty((batch["n"], 3, size, size), dtype=torch.uint8, device=device)  # (n, 3, S, S)
        if "images" in batch:
            out[batch["images_at"].to(device)] = batch["images"].to(device, non_blocking=True)
        datas = list(torch.split(batch["jpeg"], batch["jpeg_sizes"].tolist()))
        decoded = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)  # [(3, H_k, W_k)] on the device
        for k, (x, box) in enumerate(zip(decoded, batch["jpeg_boxes"].tolist())):
            out[int(batch["jpeg_at"][k])] = self.transform.crop(x, box)
        return out


def _uint8_of(compose) -> tuple[Callable, list, list] | None:
    """A Compose ending in ToTensor + Normalize -> (the same Compose ending in a uint8 tensor, mean, std)."""
    steps = list(getattr(compose, "transforms", []))
    if len(steps) < 2 or not isinstance(steps[-1], T.Normalize) or not isinstance(steps[-2], T.ToTensor):
        return None
    return T.Compose(steps[:-2] + [_ToUint8()]), list(steps[-1].mean), list(steps[-1].std)


def train_pixels(preprocess: dict, augment: str, decode: str = "cpu") -> Pixels:
    """The trainer's form of train_transform(preprocess, augment) (module docstring); decode "gpu" (augment
    clip): JPEGs are decoded and cropped on the training device (Pixels.device_images), the same crops."""
    hf = bool(preprocess.get("hf_image_processor"))
    if augment == "clip":
        crop = _TensorRandomResizedCrop(int(preprocess["size"]), (0.9, 1.0), _interp(preprocess.get("interpolation", "bicubic")))
        return Pixels(crop, "tensor", list(preprocess["mean"]), list(preprocess["std"]), composite=hf, on_device=decode == "gpu")
    if decode == "gpu":
        raise ValueError("decode on the device is for --augment clip only")
    reference = train_transform(preprocess, augment)
    split = _uint8_of(reference)
    if split is None:  # a Hugging Face processor (augment none): its own float pixels, normalised in the worker
        return Pixels(reference, "pil")
    transform, mean, std = split
    return Pixels(transform, "pil", mean, std)
