"""The trainer's pixels (vltool.transforms.train_pixels, vltool.io.decode_pixels; docs/pretrain.md, "The data
path"): uint8 crops made in the data-loader workers and normalised on the training device equal, bit for bit,
the reference PIL transform (train_transform: ToTensor + Normalize) for `--augment none` and `simclr`; `clip`
crops the decoded uint8 tensor with the reference's crop box and stays within 2 levels (mean under 0.02) of
PIL's resampling; decode_jpeg decodes as PIL does."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

CLIP_PP = {"size": 32, "mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711],
           "interpolation": "bicubic", "resize_mode": "shortest"}


def _photo_like(h: int, w: int, seed: int, fmt: str, mode: str = "RGB") -> bytes:
    """Smoothed noise with a sharp edge, encoded as `fmt` (JPEG at quality 90): enough texture for the
    resampling kernels to differ where they can."""
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    im = Image.fromarray(a).filter(ImageFilter.GaussianBlur(2))
    a = np.array(im)
    a[:, w // 2 :] = 255 - a[:, w // 2 :]  # an edge
    im = Image.fromarray(a)
    if mode == "RGBA":
        alpha = rng.integers(0, 256, (h, w), dtype=np.uint8)
        im = Image.fromarray(np.dstack([a, alpha]), "RGBA")
    elif mode == "L":
        im = im.convert("L")
    buf = io.BytesIO()
    im.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _value(data: bytes) -> dict:
    return {"bytes": data, "path": None}


def _seeded(seed: int, fn, *args):
    g = torch.random.default_generator
    saved = g.get_state()
    g.manual_seed(seed)
    try:
        return fn(*args)
    finally:
        g.set_state(saved)


def _trainer_pixels(pixels, value, seed):
    """What the trainer makes of one stored image: decoded and cropped as a worker does, normalised as the
    device does (here the CPU)."""
    from vltool.io.images import decode_image, decode_pixels

    im = decode_pixels(value, composite=pixels.composite) if pixels.takes == "tensor" else decode_image(value, rgb=False)
    x = _seeded(seed, pixels, im)
    return x, pixels.normalise(x[None])[0]


@pytest.mark.parametrize("augment", ["none", "simclr"])
@pytest.mark.parametrize("image", [("JPEG", "RGB"), ("PNG", "RGBA"), ("JPEG", "L")])
def test_uint8_crops_normalised_on_the_device_equal_the_reference_bit_for_bit(augment, image):
    from vltool.io.images import decode_image
    from vltool.transforms import train_pixels, train_transform

    value = _value(_photo_like(40, 52, 1, *image))
    reference, pixels = train_transform(CLIP_PP, augment), train_pixels(CLIP_PP, augment)
    for seed in range(4):
        x, y = _trainer_pixels(pixels, value, seed)
        assert x.dtype == torch.uint8 and x.shape == (3, 32, 32)  # what crosses from the worker: a quarter of float32
        assert torch.equal(y, _seeded(seed, reference, decode_image(value, rgb=False))), (augment, image, seed)


@pytest.mark.parametrize("side", [40, 64])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_clip_crops_of_the_decoded_tensor_stay_within_two_levels_of_pil(side, fmt):
    """The same crop box (the same draws), another resampler: at most 2 levels anywhere, a mean under 0.02
    levels (measured on real photographs at 256 and 384 px: at most 1-2, mean 0.001-0.005)."""
    from vltool.io.images import decode_image
    from vltool.transforms import train_pixels, train_transform

    value = _value(_photo_like(side, side * 4 // 3, side, fmt))
    reference, pixels = train_transform(CLIP_PP, "clip"), train_pixels(CLIP_PP, "clip")
    assert pixels.takes == "tensor"
    std = torch.tensor(CLIP_PP["std"]).view(3, 1, 1)
    means = []
    for seed in range(6):
        x, y = _trainer_pixels(pixels, value, seed)
        assert x.dtype == torch.uint8 and x.shape == (3, 32, 32)
        levels = ((y - _seeded(seed, reference, decode_image(value, rgb=False))) * std * 255).abs()
        assert levels.max() <= 2.0 + 1e-3, (seed, float(levels.max()))
        means.append(float(levels.mean()))
    assert np.mean(means) < 0.02
    # and the crops are random: two seeds give two crops (a test that the draws reach the crop)
    assert not torch.equal(_trainer_pixels(pixels, value, 0)[0], _trainer_pixels(pixels, value, 1)[0])


@pytest.mark.parametrize("image", [("JPEG", "RGB"), ("JPEG", "L"), ("PNG", "RGB"), ("PNG", "RGBA")])
def test_decode_pixels_is_pil_decoding_as_a_uint8_tensor(image):
    from PIL import Image

    from vltool.io.images import decode_image, decode_pixels

    value = _value(_photo_like(30, 44, 2, *image))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        x = decode_pixels(value)
    assert torch.equal(x, torch.from_numpy(np.array(decode_image(value))).permute(2, 0, 1))
    if image[1] == "RGBA":  # a Hugging Face model's rule: transparency composited on white
        from vltool.transforms import composite_on_white

        on_white = composite_on_white(Image.open(io.BytesIO(value["bytes"])))
        assert torch.equal(decode_pixels(value, composite=True), torch.from_numpy(np.array(on_white)).permute(2, 0, 1))
    assert decode_pixels(_value(b"not an image")) is None and decode_pixels(None) is None


def test_a_hugging_face_processor_keeps_its_own_float_pixels(tmp_path):
    """`--augment none` on a Hugging Face CLIP: its image processor's pixel_values, made in the worker and
    passed through by normalise unchanged (bit-equality with transformers is the processor's own)."""

    from transformers import CLIPImageProcessor

    from tests.fixtures.hf_models import make_hf_clip
    from vltool.io.images import decode_image
    from vltool.transforms import train_pixels

    d = make_hf_clip(tmp_path / "clip")
    processor = CLIPImageProcessor.from_pretrained(d)
    pp = {"size": 32, "mean": list(processor.image_mean), "std": list(processor.image_std), "hf_image_processor": processor.to_dict()}
    pixels = train_pixels(pp, "none")
    value = _value(_photo_like(40, 50, 3, "PNG", "RGBA"))
    x = pixels(decode_image(value, rgb=False))
    assert x.dtype == torch.float32 and pixels.normalise(x) is x
    assert torch.equal(x, processor(images=decode_image(value, rgb=False), return_tensors="pt")["pixel_values"][0])
