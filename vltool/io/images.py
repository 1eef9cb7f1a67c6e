"""Image decoding: the one place vltool turns a stored image into pixels.

`decode_image` reads datasets' undecoded image ({bytes, path}: embedded bytes, a file, or a
`tar://MEMBER::SHARD` path into a WebDataset shard, read by offset) and returns a PIL image, or None for
a bad one; `image_size_policy` makes an image over PIL's size limit a bad image (never a raw warning);
`require_a_decodable_image` refuses a column in which no image decodes.
"""

from __future__ import annotations

import io
import warnings

from vltool.checks import require_decoded
from vltool.errors import out_of_resources
from vltool.shards import parse_tar_url, read_member

# datasets, pyarrow and PIL are imported inside the functions that use them, not here: `vltool --help` loads this
# module (through commands/common.py), and importing them costs about a second.


def image_size_policy() -> None:
    """vltool's policy on huge images: one over PIL's limit (PIL.Image.MAX_IMAGE_PIXELS, about 89
    megapixels) is a bad image, skipped and counted like an undecodable one, never a raw
    DecompressionBombWarning. Every reader of images (decode_image, import, export) calls this first.

    The rule is put back in front of the warning filters whenever something (a notebook's or a test's
    warnings.catch_warnings, a library) has replaced or shadowed it."""
    from PIL import Image

    first = warnings.filters[0] if warnings.filters else None
    if first is not None and first[0] == "error" and first[2] is Image.DecompressionBombWarning:
        return
    warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def image_bytes(value) -> bytes | None:
    """The encoded bytes of datasets' undecoded image ({bytes, path}): its bytes, the shard member a
    `tar://MEMBER::SHARD` path names (one pread, vltool.shards.read_member), or the file a path names.
    Raises OSError/KeyError when the file or member cannot be read; None when the value holds neither."""
    if value is None:
        return None
    if value.get("bytes") is not None:
        return value["bytes"]
    path = value.get("path")
    if not path:
        return None

    if parse_tar_url(path) is not None:
        return read_member(path)
    with open(path, "rb") as f:
        return f.read()


def decode_image(value, rgb: bool = True):
    """datasets' undecoded image ({bytes, path}) -> RGB PIL image, or None when it cannot be decoded.
    `rgb=False` keeps the image's own mode (RGBA, P, L, ...) for a model's transform that converts it
    itself, as open_clip's and transformers' do (vltool.transforms.eval_transform).

    Training, encoding and pseudo-labelling all read images through this, so they agree on what a bad
    image is (skipped and counted; images over the size limit too, see image_size_policy). A path
    `tar://MEMBER::SHARD` (the shard index's) is read from the shard by offset."""
    try:
        opened = _opened(value)
        if opened is None:
            return None
        im = opened[1]
        im.load()
        return im.convert("RGB") if rgb else im
    except Exception as e:
        if out_of_resources(e):  # out of open files or memory: not a bad image (every later one would be "bad")
            raise
        return None


def _opened(value):
    """(the encoded bytes, a PIL image opened from their header only) of datasets' undecoded image, or None
    when the value holds no image; raises what reading the file or header raises (the size limit included)."""
    from PIL import Image

    image_size_policy()
    data = image_bytes(value)
    if data is None:
        return None
    return data, Image.open(io.BytesIO(data))


def _jpeg_that_decode_jpeg_takes(im) -> bool:
    """A baseline or progressive JPEG in RGB or grayscale: what torchvision.io.decode_jpeg (libjpeg-turbo, or
    nvjpeg on a GPU) decodes to the pixels PIL gives (CMYK and YCCK JPEGs go through PIL's conversion)."""
    return im.format == "JPEG" and im.mode in ("RGB", "L")


def _quiet_torchvision_io() -> None:
    """torchvision 0.29 warns on every decode_jpeg call that its decoders are deprecated in favour of
    TorchCodec's; vltool pins torchvision, so the warning says nothing to a user (one filter, appended: the
    size-limit rule stays first)."""
    if not any(f[1] is not None and f[1].pattern.startswith(_TV_DEPRECATED) for f in warnings.filters):
        warnings.filterwarnings("ignore", message=_TV_DEPRECATED, category=DeprecationWarning, append=True)


_TV_DEPRECATED = "The image decoding and encoding capabilities of TorchVision"


def decode_pixels(value, composite: bool = False):
    """datasets' undecoded image ({bytes, path}) -> (3,H,W) uint8 RGB tensor, or None when it cannot be
    decoded (the same bad images as decode_image: size limit included, read from the header first).

    A baseline or progressive JPEG in RGB or grayscale is decoded by torchvision.io.decode_jpeg
    (libjpeg-turbo, as PIL; no PIL image is made); any other image through PIL, converted to RGB as the
    model's library converts it: PIL's convert (alpha dropped), or with `composite` transparency composited
    on white (a Hugging Face model's processor)."""
    import torch
    from PIL import Image

    try:
        opened = _opened(value)  # the header only: format, mode, size (and the size limit)
        if opened is None:
            return None
        data, im = opened
        if _jpeg_that_decode_jpeg_takes(im):
            from torchvision.io import ImageReadMode, decode_jpeg

            _quiet_torchvision_io()

            try:
                return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
            except RuntimeError:
                pass  # what libjpeg-turbo refuses (a truncated file PIL reads to its end, ...): PIL below
        im.load()
        if composite and im.mode != "RGB":
            rgba = im.convert("RGBA")
            im = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255)), rgba)
        from torchvision.transforms.functional import pil_to_tensor

        return pil_to_tensor(im.convert("RGB"))
    except Exception as e:
        if out_of_resources(e):  # out of open files or memory: not a bad image (every later one would be "bad")
            raise
        return None


def jpeg_for_device(value):
    """datasets' undecoded image -> (its bytes, (height, width)) when it is a JPEG that nvjpeg decodes as
    decode_pixels would (baseline or progressive, RGB or grayscale: the same test as decode_pixels'), read from
    the header only; None for any other image, or one that cannot be read (the size limit included)."""
    try:
        opened = _opened(value)
        if opened is not None and _jpeg_that_decode_jpeg_takes(opened[1]):
            return opened[0], (opened[1].height, opened[1].width)
    except Exception as e:
        if out_of_resources(e):  # out of open files or memory: not a bad image (every later one would be "bad")
            raise
        return None
    return None


def require_a_decodable_image(ds, column: str, what: str) -> None:
    """An error before any work when not one image of `column` decodes (every image corrupt, missing or
    too large). Cheap when the data are fine: the scan stops at the first image that decodes."""
    import datasets

    if isinstance(ds.features[column], datasets.Image) and ds.features[column].decode:
        ds = ds.cast_column(column, datasets.Image(decode=False))
    for lo in range(0, len(ds), 256):
        if any(decode_image(v) is not None for v in ds[lo : lo + 256][column]):
            return
    require_decoded([True] * len(ds), what)

