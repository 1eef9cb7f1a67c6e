"""One way to read pixels (issue 40): every command that feeds images to a model hands the model's own
processor or transform the image in its own mode. On transparent images (RGBA, LA, palette with
transparency) each command's encoder input equals, bit for bit, what the model's library makes of the same
file: transformers' image processor (which composites transparency on white) or open_clip's transform."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _pngs() -> list[bytes]:
    """RGBA, LA and palette-with-transparency images whose hidden (transparent) pixels are coloured, and one RGB."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    rgba = rng.integers(0, 256, size=(20, 24, 4), dtype=np.uint8)
    rgba[:, :10, 3] = 0  # fully transparent, hidden colour kept
    rgba[:, 10:14, 3] = 90  # half transparent
    la = rng.integers(0, 256, size=(22, 18, 2), dtype=np.uint8)
    la[5:15, :, 1] = 0
    pal = Image.fromarray(rng.integers(0, 256, size=(18, 18, 3), dtype=np.uint8)).quantize(16)
    pal.info["transparency"] = 3
    for im in (Image.fromarray(rgba, "RGBA"), Image.fromarray(la, "LA"), pal,
               Image.fromarray(rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8), "RGB")):
        buf = io.BytesIO()
        im.save(buf, format="PNG", **({"transparency": 3} if im.mode == "P" else {}))
        out.append(buf.getvalue())
    return out


def _opened(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data))


@pytest.fixture(scope="module")
def pngs():
    ims = [_opened(b) for b in _pngs()]
    assert [im.mode for im in ims] == ["RGBA", "LA", "P", "RGB"] and "transparency" in ims[2].info
    return _pngs()


@pytest.fixture(scope="module")
def data(pngs, tmp_path_factory):
    import datasets

    from vltool.io import load_dataset

    path = tmp_path_factory.mktemp("data") / "transparent"
    n = len(pngs)
    ds = datasets.Dataset.from_dict(
        {"id": [f"r{i}" for i in range(n)], "image": [{"bytes": b, "path": None} for b in pngs],
         "caption": [f"thing {i}" for i in range(n)], "label": [i % 2 for i in range(n)]},
        features=datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(),
                                    "caption": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"])}))
    ds.save_to_disk(str(path))
    return load_dataset(str(path))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """An hf:DIR CLIP (transformers' processor) and an open_clip local-dir (open_clip's transform)."""
    from tests.fixtures.hf_models import make_hf_clip
    from vltool.model import ModelSpec, create_model, export_open_clip

    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    model, _ = create_model(ModelSpec(arch="vltool-micro"))
    return {"hf": f"hf:{make_hf_clip(root / 'clip')}", "open_clip": f"local-dir:{export_open_clip(model, root / 'oc')}"}


def library_transform(spec: str):
    """The model's own library's preprocessing, on a PIL image: (3, H, W)."""
    if spec.startswith("hf:"):
        import transformers

        proc = transformers.AutoImageProcessor.from_pretrained(spec[3:])
        return lambda im: proc(images=im, return_tensors="pt")["pixel_values"][0]
    import open_clip

    _, _, preprocess = open_clip.create_model_and_transforms(spec)
    return preprocess


def capture(monkeypatch, module, n: int) -> list:
    """Replace module.run_batches so that the batch `prepare` builds for rows [0, n) is kept."""
    got = []
    real = module.run_batches

    def spy(total, batch_size, prepare, forward, **kw):
        got.append(prepare(0, n))
        return real(total, batch_size, prepare, forward, **kw)

    monkeypatch.setattr(module, "run_batches", spy)
    return got


@pytest.mark.parametrize("kind", ["hf", "open_clip"])
def test_encoding_reads_pixels_as_the_library(kind, models, data, pngs, monkeypatch):
    """zeroshot, retrieve, probe, debias, mine-positives (vltool.encode.encode_images)."""
    import vltool.encode as enc

    got = capture(monkeypatch, enc, len(pngs))
    enc.encode_images(enc.load_eval_model(models[kind]), data, progress=False, batch_size=len(pngs))
    lib = library_transform(models[kind])
    expected = torch.stack([lib(_opened(b)) for b in pngs])
    assert torch.equal(got[0], expected)


@pytest.mark.parametrize("kind", ["hf", "open_clip"])
def test_pseudolabel_views_read_pixels_as_the_library(kind, models, data, pngs, monkeypatch):
    """pseudolabel's crops are cut from the image in its own mode and handed to the model's transform: the
    same pixels zeroshot and training feed the model (before, RGBA/LA views kept their hidden colours)."""
    import vltool.pseudolabel as pl
    from vltool.encode import load_eval_model

    config = pl.PseudolabelConfig(model=models[kind], crops=2, batch_size=len(pngs))
    got = capture(monkeypatch, pl, len(pngs))
    pl.encode_views(load_eval_model(models[kind]), data, config, None)
    lib = library_transform(models[kind])
    expected = []
    for i, b in enumerate(pngs):
        im = _opened(b)
        rng = np.random.default_rng(pl.view_seed(config.seed, f"r{i}"))
        expected += [lib(im.crop(pl.crop_box(im.width, im.height, rng))) for _ in range(config.crops)]
    assert torch.equal(got[0], torch.stack(expected))


def test_recaption_reads_pixels_as_the_library(data, pngs, tmp_path):
    """recaption hands BLIP's processor the image in its own mode: its pixel values equal the processor's
    on the same file (transparency composited on white, not dropped)."""
    import transformers

    from bench.tiny_models import make_blip
    from vltool.recaption import RecaptionConfig, inspect_model, load_batch, load_generator

    blip = make_blip(tmp_path / "blip")
    config = RecaptionConfig(model=str(blip))
    gen = load_generator(inspect_model(config.model_path, False), config, "cpu")
    cols = data.dataset.select_columns(["id", "image"])
    import datasets

    cols = cols.cast_column("image", datasets.Image(decode=False))
    _, keep, _, prepared, bad = load_batch(cols, "image", True, gen, (0, len(pngs)))
    assert bad == 0 and keep == list(range(len(pngs)))
    proc = transformers.AutoProcessor.from_pretrained(str(blip))
    expected = proc(images=[_opened(b) for b in pngs], return_tensors="pt")["pixel_values"]
    assert torch.equal(prepared["pixel_values"], expected)
