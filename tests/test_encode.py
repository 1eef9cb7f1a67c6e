"""vltool.encode: texts read as Arrow columns (`arrow_texts`), and a model whose weights hold NaN or inf gives
no numbers (issue 44, items 6 and 7).

One check where embeddings are made (`vltool.encode.require_finite`): every command that encodes stops
with one line naming the model and the tower, exit 1, instead of R@1 = 100% (NaN similarities sort first),
an exact chance level, a probe score, mined pairs without their text terms, or a NaN image tower blamed
on the images. A cached embedding file holding NaN where no image was undecodable is encoded again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.fixtures.eval_data import make_colors


def broken_model(out: Path, parameter: str, value: float) -> Path:
    """A vltool-micro model with `parameter` (e.g. text.text_projection) filled with `value` (NaN, inf)."""
    import torch

    from vltool.model import ModelSpec, create_model, save_model

    torch.manual_seed(0)
    model, tok = create_model(ModelSpec(arch="vltool-micro"))
    with torch.no_grad():
        dict(model.named_parameters())[parameter].fill_(value)
    save_model(model, tok, out / "model")
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import datasets

    root = tmp_path_factory.mktemp("nonfinite")
    ds = datasets.load_from_disk(make_colors(root / "colors", per_class=3))
    ds.add_column("gender", ["man" if i % 2 else "woman" for i in range(len(ds))]).save_to_disk(str(root / "data"))
    return {
        "data": str(root / "data"),
        "text": broken_model(root / "nan_text", "text.text_projection", float("nan")),
        "image": broken_model(root / "inf_image", "visual.proj", float("inf")),
        "root": root,
    }


def argv(cmd: str, w: dict, model: Path, out: Path) -> list:
    data, m, cache = w["data"], str(model), ["--cache-dir", str(w["root"] / "cache")]
    return {
        "zeroshot": ["zeroshot", data, "--model", m, "--out", out / "r.json", *cache],
        "retrieve": ["retrieve", data, "--model", m, "--out", out / "r.json", *cache],
        "probe": ["probe", data, "--model", m, "--where", "split=train", "--eval-data", data, "--eval-where", "split=test",
                  "--epochs", "2", "--out", out / "r.json", *cache],
        "mine-positives": ["mine-positives", data, "--model", m, "--out", out / "mined", *cache],
        "pseudolabel": ["pseudolabel", data, "--where", "split=test", "--aligned", data, "--aligned-where", "split=train",
                        "--model", m, "--out", out / "pl", *cache],
        "debias": ["debias", "--model", m, "--out", out / "sub", *cache],  # a subspace: prompts through the text tower
        "debias-report": ["debias", "--model", m, "--subspace", w.get("sub", ""), "--eval-data", data, "--group-column", "gender",
                          "--out", out / "r.json", *cache],
    }[cmd]


CASES = [(cmd, tower) for cmd in ("zeroshot", "retrieve", "mine-positives", "pseudolabel", "debias") for tower in ("text", "image")]
CASES.remove(("debias", "image"))
CASES += [("probe", "image"), ("debias-report", "image")]  # (a probe, and debias's report, read the image tower only)


@pytest.mark.parametrize("cmd,tower", CASES)
def test_a_nan_or_inf_model_is_refused_naming_the_model_and_the_tower(world, cli, tmp_path, cmd, tower):
    model = world[tower]
    if cmd == "debias-report" and "sub" not in world:  # the image-broken model's text tower makes the subspace
        r = cli("debias", "--model", model, "--out", world["root"] / "sub", "--cache-dir", world["root"] / "cache", "--no-progress")
        assert r.exit_code == 0, r.stderr
        world["sub"] = world["root"] / "sub"
    r = cli(*argv(cmd, world, model, tmp_path), "--no-progress")
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.exit_code == 1, (r.exit_code, r.stdout[-800:], r.stderr[-800:])
    assert len(lines) == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    line = lines[0]
    assert "non-finite embeddings" in line and f"its {tower} tower" in line and str(model) in line, line
    assert "could not be decoded" not in r.stderr  # (was: a NaN image tower blamed on the images)
    assert not any(tmp_path.iterdir()), "something was written"


def test_undecodable_images_are_still_left_out_not_blamed_on_the_model(tmp_path):
    """The check leaves the rows NaN on purpose (undecodable images) alone."""
    from tests.fixtures.eval_data import make_model
    from vltool.cache import EmbeddingCache
    from vltool.encode import encode_images
    from vltool.io import load_dataset
    from vltool.model import load_model

    m = load_model(str(make_model(tmp_path / "run")))
    path = make_colors(tmp_path / "bad", per_class=2, bad_rows=(1, 4))
    enc = encode_images(m, load_dataset(path), cache=EmbeddingCache(tmp_path / "c"), progress=False)
    assert enc.bad.sum() == 2 and np.isfinite(enc.embeddings[~enc.bad]).all()


@pytest.mark.parametrize("slice_rows", [1, 3, 1 << 18])
def test_arrow_texts_equal_text_owner(monkeypatch, slice_rows):
    """The encoding commands' texts come from the Arrow column (arrow_texts, io.strings_digest): the same
    texts, owners and cache digest as the row-by-row text_owner and texts_digest, for strings and lists
    with None, blank and Unicode-whitespace texts, in slices of any size."""
    import random

    from vltool import checks
    from vltool.cache import texts_digest
    from vltool.encode import arrow_texts, text_owner
    from vltool.io import strings_digest

    monkeypatch.setattr(checks, "TEXT_SLICE_ROWS", slice_rows)
    rng = random.Random(1)
    pool = ["a dog", "", "  ", "\u3000\u2003", None, "café\n", "x", " two  words "]
    strings = [rng.choice(pool) for _ in range(23)]
    lists = [rng.choice([None, [], [rng.choice(pool) for _ in range(rng.randint(1, 3))]]) for _ in range(19)]
    for values, typ in ((strings, pa.string()), (lists, pa.list_(pa.string())), ([None, ""], pa.string())):
        column = pa.chunked_array([values[:7], values[7:]], type=typ)
        texts, owner = arrow_texts(column)
        want, want_owner = text_owner(values)
        assert texts.to_pylist() == want and owner.tolist() == want_owner.tolist()
        assert strings_digest(texts) == texts_digest(want)
