"""The oracle: `vltool zeroshot` and `vltool retrieve` give CLIP_benchmark's own numbers.

A vltool-micro model is trained for a few steps by `vltool pretrain` on the emoji train split; its open_clip
export (RUN_DIR/open_clip) is loaded by open_clip itself and evaluated on the emoji test split by
`clip_benchmark.metrics.zeroshot_classification.evaluate` and `zeroshot_retrieval.evaluate` (amp off, on
CPU). vltool evaluates the same model through both of its formats (RUN_DIR and local-dir:), and the
numbers must be equal. CLIP_benchmark is a test dependency only (`pip install clip-benchmark`); the test
is skipped when it does not import. Its `accuracy` helper calls float() on a 1-element array, which
NumPy 2 refuses; the test patches that helper (not site-packages).

Ties: CLIP_benchmark breaks tied scores by torch.topk's order, vltool takes the expectation over random
tie-breaking; the retrieval data here has no repeated image and no text shared by two images, so both
must agree exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

cb_zs = pytest.importorskip("clip_benchmark.metrics.zeroshot_classification")
cb_ret = pytest.importorskip("clip_benchmark.metrics.zeroshot_retrieval")


def _accuracy_numpy2(output, target, topk=(1,)):
    """clip_benchmark's accuracy with .item() instead of float(ndarray) (NumPy 2)."""
    pred = output.topk(max(topk), 1, True, True)[1].t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    n = len(target)
    return [float(correct[:k].reshape(-1).float().sum(0).item()) / n for k in topk]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from vltool.pretrain import PretrainConfig, pretrain

    out = tmp_path_factory.mktemp("oracle") / "run"
    config = PretrainConfig(arch="vltool-micro", steps=4, batch_size=32, augment="none", seed=0, log_every=100, checkpoint_every=100)
    pretrain(["emoji"], out, config, where=["split=train"], progress=False)
    assert (out / "open_clip").is_dir()
    return out


@pytest.fixture(scope="module")
def test_split(tmp_path_factory):
    """Every third row of the emoji test split (223 rows, to keep the test short), saved to disk."""
    from vltool.io import load_dataset

    ds = load_dataset("emoji", where=["split=test"]).dataset
    ds = _without_repeated_images(ds.select(range(0, len(ds), 3)))
    path = tmp_path_factory.mktemp("oracle_data") / "test"
    ds.save_to_disk(str(path))
    return str(path), ds


class _Rows:
    """A torch map-style dataset over the emoji rows: (open_clip preprocess(image), target)."""

    def __init__(self, ds, preprocess, target):
        from vltool.encode import decode_image
        import datasets

        self.raw = ds.cast_column("image", datasets.Image(decode=False))
        self.decode = decode_image
        self.preprocess = preprocess
        self.target = target
        self.classes = ds.features["label"].names

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        return self.preprocess(self.decode(self.raw[i]["image"])), self.target[i]


def _collate_texts(batch):
    import torch

    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


def _open_clip(run_dir):
    import open_clip

    model, preprocess = open_clip.create_model_from_pretrained(f"local-dir:{run_dir / 'open_clip'}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{run_dir / 'open_clip'}")
    return model.eval(), preprocess, tokenizer


def _without_repeated_images(ds):
    """Rows whose image bytes no earlier row has (the emoji test split renders two families alike):
    identical images tie in text -> image retrieval."""
    import hashlib

    import datasets

    raw = ds.cast_column("image", datasets.Image(decode=False))["image"]
    seen, keep = set(), []
    for i, v in enumerate(raw):
        h = hashlib.sha256(v["bytes"]).hexdigest()
        if h not in seen:
            seen.add(h)
            keep.append(i)
    return ds.select(keep)


def _unique_captions(ds):
    """Each row's `captions` without any text that another row also has (no tied texts across images)."""
    from collections import Counter

    owners = Counter(t for caps in ds["captions"] for t in set(caps))
    return [[t for t in dict.fromkeys(caps) if owners[t] == 1] for caps in ds["captions"]]


def test_zeroshot_equals_clip_benchmark(run_dir, test_split, monkeypatch, tmp_path):
    import torch

    from vltool.templates import load_templates
    from vltool.zeroshot import ZeroshotConfig, zeroshot

    monkeypatch.setattr(cb_zs, "accuracy", _accuracy_numpy2)
    model, preprocess, tokenizer = _open_clip(run_dir)
    path, ds = test_split
    classnames = ds.features["label"].names
    for template_set in ("photo", "fff-cars"):
        _, templates = load_templates(template_set)
        loader = torch.utils.data.DataLoader(_Rows(ds, preprocess, ds["label"]), batch_size=64)
        ref = cb_zs.evaluate(model, loader, tokenizer, classnames, [t.replace("{}", "{c}") for t in templates], "cpu", amp=False)
        for spec in (str(run_dir), f"local-dir:{run_dir / 'open_clip'}"):
            got = zeroshot(path, ZeroshotConfig(model=spec, templates=template_set, bootstrap=0, progress=False, cache_dir=str(tmp_path)))
            m = {k: v["value"] for k, v in got["metrics"].items()}
            assert m["top1"] == pytest.approx(ref["acc1"], abs=1e-12), (template_set, spec)
            assert m["top5"] == pytest.approx(ref["acc5"], abs=1e-12), (template_set, spec)
            assert m["mean_per_class_recall"] == pytest.approx(ref["mean_per_class_recall"], abs=1e-12), (template_set, spec)


@pytest.mark.parametrize("column", ["caption", "captions"])
def test_retrieve_equals_clip_benchmark(run_dir, test_split, tmp_path, column):
    import datasets
    import torch

    from vltool.retrieve import RetrieveConfig, retrieve

    model, preprocess, tokenizer = _open_clip(run_dir)
    ds = test_split[1]
    if column == "captions":
        caps = _unique_captions(ds)
        keep = [i for i, c in enumerate(caps) if c]
        ds = ds.select(keep)
        ds = ds.remove_columns(["captions"]).add_column("captions", [caps[i] for i in keep], feature=datasets.List(datasets.Value("string")))
        texts = list(ds["captions"])
    else:
        texts = [[c] for c in ds["caption"]]
    path = tmp_path / "data"
    ds.save_to_disk(str(path))
    loader = torch.utils.data.DataLoader(_Rows(ds, preprocess, texts), batch_size=64, collate_fn=_collate_texts)
    ref = cb_ret.evaluate(model, loader, tokenizer, "cpu", amp=False, recall_k_list=[1, 5, 10])
    for spec in (str(run_dir), f"local-dir:{run_dir / 'open_clip'}"):
        got = retrieve(str(path), RetrieveConfig(model=spec, text_column=column, recall_k="1,5,10", bootstrap=0, progress=False, cache_dir=str(tmp_path / "cache")))
        m = {k: v["value"] for k, v in got["metrics"].items()}
        assert got["stats"]["image_to_text_queries_with_ties"] == 0
        for k in (1, 5, 10):
            # CLIP_benchmark's "image_retrieval" is text -> image, "text_retrieval" is image -> text
            # (CLIP_benchmark averages in float32: the same count of hits, to float32 precision)
            assert m[f"text_to_image_R@{k}"] == pytest.approx(ref[f"image_retrieval_recall@{k}"], rel=1e-6), (column, spec, k)
            assert m[f"image_to_text_R@{k}"] == pytest.approx(ref[f"text_retrieval_recall@{k}"], rel=1e-6), (column, spec, k)
    assert np.isfinite(m["image_to_text_mean_rank"])
