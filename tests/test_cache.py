"""The embedding cache: one encoding per key, reused; any change of a key part is a new encoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fixtures.eval_data import make_colors, make_model
from tests.fixtures.launch import launch
from vltool.cache import CacheKey, EmbeddingCache, row_filter


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model") / "run", seed=0)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model2") / "run", seed=1)


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return make_colors(tmp_path_factory.mktemp("data") / "colors")


@pytest.fixture(scope="module")
def loaded_model(model_dir):
    from vltool.model import load_model

    return load_model(str(model_dir))


def key(**kw):
    parts = dict(model="m", dataset="d", rows=row_filter(None, ["a=1", "b=2"]), column="image", preprocessing={"size": 32})
    parts.update(kw)
    return CacheKey(**parts)


def test_every_key_part_changes_the_key_and_where_order_does_not():
    base = key().digest
    assert key(rows=row_filter(None, ["b=2", "a=1"])).digest == base
    changed = [
        key(model="m2"), key(dataset="d2"), key(rows=row_filter("train", ["a=1", "b=2"])),
        key(rows=row_filter(None, ["a=1"])), key(column="caption"), key(preprocessing={"size": 64}),
    ]
    assert len({k.digest for k in changed} | {base}) == len(changed) + 1


def test_put_get_roundtrip_atomic_and_checked(tmp_path):
    cache = EmbeddingCache(tmp_path)
    k = key()
    arr = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert cache.get(k) is None
    npy, meta = cache.put(k, arr, ids="abc"), cache.paths(k)[1]
    assert sorted(p.name for p in cache.dir.iterdir()) == sorted([npy.name, meta.name])  # no temporary files left
    np.testing.assert_array_equal(cache.get(k, rows=4, ids="abc"), arr)
    assert json.loads(meta.read_text())["key"]["column"] == "image"
    assert cache.get(k, rows=5) is None  # not the rows expected
    assert cache.get(k, ids="other") is None  # not the same rows
    npy.write_bytes(b"garbage")
    assert cache.get(k) is None  # unreadable: a miss, never an error
    cache.put(k, arr)
    meta.unlink()
    assert cache.get(k) is None  # an entry without its description is incomplete


def test_encoding_is_reused_and_invalidated_by_each_key_part(loaded_model, other_model_dir, colors, tmp_path, monkeypatch):
    import datasets

    import vltool.encode as enc
    from vltool.io import load_dataset
    from vltool.model import load_model

    cache = EmbeddingCache(tmp_path / "cache")
    m = loaded_model
    data = load_dataset(colors, where=["split=test"])
    first = enc.encode_images(m, data, cache=cache, progress=False)
    assert not first.hit and first.embeddings.shape == (12, 32)

    calls = []
    real = enc.run_batches
    monkeypatch.setattr(enc, "run_batches", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = enc.encode_images(m, load_dataset(colors, where=["split=test"]), cache=cache, batch_size=5, progress=False)
    assert again.hit and not calls  # nothing encoded: read from the cache
    np.testing.assert_array_equal(again.embeddings, first.embeddings)

    def misses(encoded):
        return not encoded.hit

    assert misses(enc.encode_images(m, load_dataset(colors, where=["split=train"]), cache=cache, progress=False))  # row filter
    assert misses(enc.encode_images(m, data, features="pre", cache=cache, progress=False))  # preprocessing / features
    assert misses(enc.encode_images(load_model(str(other_model_dir)), data, cache=cache, progress=False))  # weights
    ds = datasets.load_from_disk(colors).map(lambda r: {"caption": r["caption"].upper()})
    ds.save_to_disk(str(tmp_path / "changed"))
    changed = load_dataset(str(tmp_path / "changed"), where=["split=test"])
    assert changed.fingerprint != data.fingerprint
    assert misses(enc.encode_images(m, changed, cache=cache, progress=False))  # dataset fingerprint
    cap = enc.encode_texts(m, data, column="caption", cache=cache, progress=False)
    caps = enc.encode_texts(m, data, column="captions", cache=cache, progress=False)
    assert cap.key != caps.key and not caps.hit  # column
    assert enc.encode_texts(m, data, column="captions", cache=cache, progress=False).hit
    # the first image encoding, the 4 image misses, and 2 text columns: 7 entries, each an .npy and a .json
    assert len(list(cache.dir.glob("*.npy"))) == 7 and len(list(cache.dir.glob("*.json"))) == 7


def test_text_owner_and_batching_do_not_change_embeddings(loaded_model, colors):
    from vltool.encode import encode_images, encode_texts
    from vltool.io import load_dataset

    data = load_dataset(colors, where=["split=test"])
    caps = encode_texts(loaded_model, data, column="captions", cache=None, progress=False)
    np.testing.assert_array_equal(caps.owner, np.repeat(np.arange(12), 2))
    single = encode_texts(loaded_model, data, column="caption", cache=None, progress=False)
    np.testing.assert_allclose(caps.embeddings[::2], single.embeddings, atol=1e-6)  # the first caption is `caption`
    a = encode_images(loaded_model, data, cache=None, batch_size=1, progress=False).embeddings
    b = encode_images(loaded_model, data, cache=None, batch_size=64, workers=2, progress=False).embeddings
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1, atol=1e-5)


def test_undecodable_images_are_nan_rows(loaded_model, tmp_path):
    from vltool.encode import encode_images
    from vltool.io import load_dataset

    path = make_colors(tmp_path / "bad", per_class=2, bad_rows=(1, 4))
    enc = encode_images(loaded_model, load_dataset(path), cache=EmbeddingCache(tmp_path / "c"), progress=False)
    assert enc.bad.tolist() == [i in (1, 4) for i in range(12)]
    assert np.isnan(enc.embeddings[[1, 4]]).all() and np.isfinite(enc.embeddings[~enc.bad]).all()
    assert encode_images(loaded_model, load_dataset(path), cache=EmbeddingCache(tmp_path / "c"), progress=False).bad.sum() == 2


def test_pre_projection_features(loaded_model, colors):
    from vltool.encode import encode_images
    from vltool.io import load_dataset

    data = load_dataset(colors, where=["split=test"])
    pre = encode_images(loaded_model, data, features="pre", cache=None, progress=False).embeddings
    post = encode_images(loaded_model, data, features="post", cache=None, progress=False).embeddings
    v = loaded_model.model.visual
    assert pre.shape[1] == v.proj.shape[0]  # the ViT's width, before visual.proj
    proj = pre @ v.proj.detach().numpy()
    np.testing.assert_allclose(proj / np.linalg.norm(proj, axis=1, keepdims=True), post, atol=1e-5)
    assert v.proj is not None  # restored


@pytest.mark.slow
def test_two_processes_encode_the_same_as_one(model_dir, colors, tmp_path):
    """`accelerate launch --multi_gpu` with 2 CPU processes (gloo; `--cpu` would run one): each encodes every
    other batch; the result is identical."""

    script = tmp_path / "enc.py"
    script.write_text(
        "import sys, numpy as np\n"
        "from vltool.model import load_model\nfrom vltool.io import load_dataset\nfrom vltool.encode import encode_images, process_state\n"
        "from vltool.cache import EmbeddingCache\n"
        f"m = load_model({str(model_dir)!r})\n"
        f"e = encode_images(m, load_dataset({colors!r}), cache=EmbeddingCache(sys.argv[2]), batch_size=4, progress=False)\n"
        "st = process_state()\n"
        "if st.is_main_process: np.save(sys.argv[1], e.embeddings); open(sys.argv[1] + '.world', 'w').write(str(st.num_processes))\n"
    )
    launch([script, tmp_path / "one.npy", tmp_path / "c1"], 1, in_process=False)
    launch([script, tmp_path / "two.npy", tmp_path / "c2"], 2)
    assert (tmp_path / "two.npy.world").read_text() == "2"  # really two processes
    np.testing.assert_array_equal(np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy"))
    assert len(list((tmp_path / "c2" / "embeddings").glob("*.npy"))) == 1


def test_a_cached_entry_holding_nan_is_encoded_again_never_read_as_bad_images(loaded_model, tmp_path, capsys):
    """Issue 44: a cache entry whose array holds NaN where no image was undecodable (a damaged entry) was
    read as data: its rows became "images that could not be decoded". The entry records its NaN rows
    (`nan_rows`: the undecodable images); any other NaN or inf is a miss, encoded again with a warning."""
    from vltool.encode import encode_images, encode_texts
    from vltool.io import load_dataset

    data = load_dataset(make_colors(tmp_path / "bad", per_class=2, bad_rows=(1, 4)))
    cache = EmbeddingCache(tmp_path / "c")
    first = encode_images(loaded_model, data, cache=cache, progress=False)
    npy, meta = cache.dir / f"{first.key}.npy", cache.dir / f"{first.key}.json"
    assert json.loads(meta.read_text())["nan_rows"] == [1, 4]
    assert encode_images(loaded_model, data, cache=cache, progress=False).hit  # the undecodable images' NaN rows are fine
    for damage in ("nan_row", "one_nan", "inf"):
        arr = np.load(npy)
        arr[{"nan_row": 7, "one_nan": 2, "inf": 9}[damage]] = np.nan if damage == "nan_row" else arr[0]
        if damage == "one_nan":
            arr[2, 3] = np.nan
        elif damage == "inf":
            arr[9, 0] = np.inf
        np.save(npy, arr)
        capsys.readouterr()
        again = encode_images(loaded_model, data, cache=cache, progress=False)
        assert not again.hit, damage
        assert again.bad.tolist() == [i in (1, 4) for i in range(12)], damage
        np.testing.assert_array_equal(again.embeddings[~again.bad], first.embeddings[~first.bad])
        assert f"the cached embeddings {npy} hold NaN or inf" in capsys.readouterr().err
        assert encode_images(loaded_model, data, cache=cache, progress=False).hit  # written again, whole
    txt = encode_texts(loaded_model, data, column="caption", cache=cache, progress=False)
    npy = cache.dir / f"{txt.key}.npy"
    arr = np.load(npy)
    arr[0] = np.nan
    np.save(npy, arr)
    again = encode_texts(loaded_model, data, column="caption", cache=cache, progress=False)
    assert not again.hit and np.isfinite(again.embeddings).all()


def test_a_tokenizer_or_processor_only_change_misses_the_cache(tmp_path, monkeypatch):
    """issue 40: the same weights with other tokenizer files (a Hub commit that fixes the tokenizer, an edited
    hf:DIR) or another image processor config are new entries; the key's parts are in the entry."""
    import gzip

    import vltool.encode as enc
    from tests.fixtures.hf_models import make_hf_clip, put_in_hub_cache
    from vltool.model import load_model

    cache = EmbeddingCache(tmp_path / "cache")
    prompts = ["a red square", "a blue square"]
    colors = load_dataset_colors(tmp_path)
    src = make_hf_clip(tmp_path / "clip")

    def prompts_of(spec):
        return enc.encode_prompts(load_model(spec), prompts, cache=cache, progress=False)

    first = prompts_of(f"hf:{src}")
    assert not first.hit and prompts_of(f"hf:{src}").hit
    entry = json.loads((cache.dir / f"{first.key}.json").read_text())
    assert entry["key"]["preprocessing"]["tokenizer"]["files_sha256"]

    # a Hub repository's new commit: the same weights, a fixed tokenizer file
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    put_in_hub_cache(home, "testorg/clip", src, "a" * 40)
    fixed = put_in_hub_cache(home, "testorg/clip", src, "b" * 40)
    (fixed / "tokenizer_config.json").unlink()  # (a link in a real cache: the new commit's own file)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    (fixed / "tokenizer_config.json").write_text(json.dumps({**cfg, "model_max_length": 77}))
    prompts_of("hf:testorg/clip@" + "a" * 40)
    old, new = prompts_of("hf:testorg/clip@" + "a" * 40), prompts_of("hf:testorg/clip@" + "b" * 40)
    assert old.hit and not new.hit  # same weights, same config entry: only the tokenizer's files differ
    from vltool.info import info

    why = {o["entry"]: o["differs_in"] for o in info(str(cache.dir / f"{new.key}.json"))["same_dataset_and_column"]}
    assert set(why[old.key]) == {"preprocessing.tokenizer.files_sha256"}  # `vltool info` says why they differ

    # an edited tokenizer file inside an hf:DIR
    vocab = json.loads((src / "vocab.json").read_text())
    vocab["a</w>"], vocab["b</w>"] = vocab["b</w>"], vocab["a</w>"]
    (src / "vocab.json").write_text(json.dumps(vocab))
    assert not prompts_of(f"hf:{src}").hit

    # the image processor's config alone
    m = load_model(f"hf:{src}")
    before = enc.encode_images(m, colors, cache=cache, progress=False)
    assert enc.encode_images(load_model(f"hf:{src}"), colors, cache=cache, progress=False).hit
    pp = json.loads((src / "preprocessor_config.json").read_text())
    (src / "preprocessor_config.json").write_text(json.dumps({**pp, "image_mean": [0.5, 0.5, 0.5]}))
    after = enc.encode_images(load_model(f"hf:{src}"), colors, cache=cache, progress=False)
    assert not after.hit and after.key != before.key

    # a vltool model directory (read lazily): its tokenizer file's bytes, then its transform
    run = make_model(tmp_path / "run")
    lazy = enc.load_eval_model(str(run), cache_dir=tmp_path / "cache")
    assert not enc.encode_prompts(lazy, prompts, cache=cache, progress=False).hit
    assert enc.encode_prompts(enc.load_eval_model(str(run), cache_dir=tmp_path / "cache"), prompts, cache=cache, progress=False).hit
    bpe = next((run / "model").rglob("*.gz"))
    text = gzip.decompress(bpe.read_bytes())
    bpe.write_bytes(gzip.compress(text + b"x y\n"))  # (past the merges open_clip reads: the tokens are the same)
    assert not enc.encode_prompts(enc.load_eval_model(str(run), cache_dir=tmp_path / "cache"), prompts, cache=cache, progress=False).hit
    im = enc.encode_images(enc.load_eval_model(str(run), cache_dir=tmp_path / "cache"), colors, cache=cache, progress=False)
    config = json.loads((run / "model" / "config.json").read_text())
    config["preprocess"]["interpolation"] = "bilinear" if config["preprocess"]["interpolation"] != "bilinear" else "bicubic"
    (run / "model" / "config.json").write_text(json.dumps(config))
    assert not enc.encode_images(enc.load_eval_model(str(run), cache_dir=tmp_path / "cache"), colors, cache=cache, progress=False).hit
    assert im.key


def load_dataset_colors(tmp_path):
    from vltool.io import load_dataset

    return load_dataset(make_colors(tmp_path / "colors"), where=["split=test"])
