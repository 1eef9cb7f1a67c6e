"""open_clip tags whose architectures vltool does not rebuild (SigLIP with its Hugging Face tokenizer, timm
image towers, CoCa, Hugging Face text towers) run as open_clip's own model: the same preprocessing,
tokenizer, embeddings and logit bias as open_clip.create_model_and_transforms + get_tokenizer on the same
Hugging Face cache, laid out by hand here (HF_HUB_OFFLINE=1).

The architecture is SigLIP's as open_clip builds ViT-B-16-SigLIP (a timm image tower with attention
pooling, open_clip's text tower without a causal mask, a logit bias, an HF sentencepiece tokenizer), made
small enough for a test: registered here as `test-SigLIP` with a tag `webli` kept in testorg/test-siglip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.fixtures.hf_models import emoji_words, put_in_hub_cache, train_sentencepiece

ARCH, TAG, REPO, COMMIT = "test-SigLIP", "webli", "testorg/test-siglip", "5e" * 20


def siglip_cfg(vocab_size: int) -> dict:
    """ViT-B-16-SigLIP's config, shrunk: vit_tiny's timm trunk (width 192), a 2-layer text tower."""
    import open_clip

    cfg = open_clip.get_model_config("ViT-B-16-SigLIP")
    cfg["embed_dim"] = 192
    cfg["vision_cfg"]["timm_model_name"] = "vit_tiny_patch16_224"
    cfg["text_cfg"].update(width=192, heads=3, layers=2, vocab_size=vocab_size, context_length=16, hf_tokenizer_name=REPO)
    return cfg


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The repository's files: random weights of the right shapes and a SigLIP sentencepiece tokenizer."""
    import open_clip
    from open_clip import factory
    from safetensors.torch import save_file
    from transformers import SiglipTokenizer

    root = tmp_path_factory.mktemp("siglip")
    src = root / "repo"
    src.mkdir()
    tok = SiglipTokenizer(vocab_file=str(train_sentencepiece(root / "spiece", emoji_words())))
    tok.save_pretrained(str(src))
    cfg = siglip_cfg(tok.vocab_size)
    factory._MODEL_CONFIGS[ARCH] = cfg
    try:
        torch.manual_seed(7)
        model = open_clip.create_model(ARCH)
        with torch.no_grad():
            model.logit_bias.fill_(-3.5)
            model.logit_scale.fill_(2.0)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(src / "open_clip_model.safetensors"))
    finally:
        factory._MODEL_CONFIGS.pop(ARCH, None)
    return src, cfg


@pytest.fixture
def hub(repo, tmp_path, monkeypatch):
    from huggingface_hub import constants
    from open_clip import factory, pretrained

    src, cfg = repo
    home = tmp_path / "hf-home"
    snap = put_in_hub_cache(home, REPO, src, COMMIT)
    # the repository has no config.json (as timm/ViT-B-16-SigLIP): huggingface_hub remembers a file the Hub
    # answered 404 for, which is how transformers' AutoTokenizer knows offline that there is none
    (snap.parents[1] / ".no_exist" / COMMIT).mkdir(parents=True)
    (snap.parents[1] / ".no_exist" / COMMIT / "config.json").touch()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # (open_clip's own download, read at import)
    monkeypatch.setitem(factory._MODEL_CONFIGS, ARCH, cfg)
    monkeypatch.setitem(pretrained._PRETRAINED, ARCH, {TAG: pretrained._slpcfg(hf_hub=f"{REPO}/")})
    return home


def test_zeroshot_equals_open_clips_own_model(hub, cli, tmp_path):
    """`vltool zeroshot emoji --model open_clip:test-SigLIP/webli` equals create_model_and_transforms +
    get_tokenizer: every image embedding, every prompt embedding, and the logits with the bias."""
    import open_clip

    from vltool.encode import encode_images, encode_prompts, load_eval_model
    from vltool.io import load_dataset

    spec = f"open_clip:{ARCH}/{TAG}"
    data = load_dataset("emoji", where=["split=test"])
    ds = data.dataset.select(range(24))
    m = load_eval_model(spec)
    assert m.revision["commit"] == COMMIT and m.revision["tag"] == TAG
    assert m.config["tokenizer"]["hf_tokenizer_commit"] == COMMIT
    model, _, preprocess = open_clip.create_model_and_transforms(ARCH, pretrained=TAG, cache_dir=str(hub / "hub"))
    tokenizer = open_clip.get_tokenizer(ARCH, cache_dir=str(hub / "hub"))
    model.eval()
    names = data.dataset.features["label"].names[:30]
    texts = [f"a photo of {n}." for n in names]
    with torch.no_grad():
        img = model.encode_image(torch.stack([preprocess(im) for im in ds["image"]]), normalize=True)
        txt = model.encode_text(tokenizer(texts), normalize=True)
        logits = img @ txt.T * model.logit_scale.exp() + model.logit_bias
    assert torch.equal(m.tokenize(texts), tokenizer(texts))
    im = ds["image"][0]
    assert torch.equal(m.preprocess(im), preprocess(im))
    with torch.no_grad():
        assert torch.equal(m.encode_image(m.preprocess(im)[None]), model.encode_image(preprocess(im)[None], normalize=True))
    import datasets

    small = tmp_path / "small"
    ds.save_to_disk(str(small))
    enc_img = encode_images(m, load_dataset(str(small)), progress=False).embeddings
    enc_txt = encode_prompts(m, texts, progress=False).embeddings
    assert np.array_equal(enc_img, img.numpy()) and np.array_equal(enc_txt, txt.numpy())
    assert torch.equal(m.logits(torch.from_numpy(enc_img), torch.from_numpy(enc_txt)), logits)
    assert isinstance(ds.features["image"], datasets.Image)

    out = tmp_path / "zs.json"  # the command itself
    r = cli("zeroshot", small, "--model", spec, "--bootstrap", "0", "--out", out, "--cache-dir", tmp_path / "c", "--no-progress")
    assert r.exit_code == 0, r.stderr
    rec = json.loads(out.read_text())
    assert rec["model"]["revision"]["commit"] == COMMIT and rec["model"]["arch"] == ARCH


def test_a_tag_that_cannot_run_is_refused_before_anything_is_fetched(hub, repo, cli, tmp_path, monkeypatch):
    """A timm tower the installed timm lacks: refused in one line, the weights never read or fetched; the
    same for a tokenizer missing from the cache (nothing downloaded offline, no weights looked up)."""
    from open_clip import factory

    import vltool.hub as vh

    fetched = []
    real = vh.hub_file
    monkeypatch.setattr(vh, "hub_file", lambda *a, **k: fetched.append(a) or real(*a, **k))
    cfg = json.loads(json.dumps(repo[1]))
    cfg["vision_cfg"]["timm_model_name"] = "vit_not_in_timm_224"
    monkeypatch.setitem(factory._MODEL_CONFIGS, ARCH, cfg)
    r = cli("zeroshot", "emoji", "--where", "split=test", "--model", f"open_clip:{ARCH}/{TAG}", "--bootstrap", "0")
    assert r.exit_code == 2 and "vit_not_in_timm_224" in r.stderr and "nothing was fetched" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not fetched
    cfg["vision_cfg"]["timm_model_name"] = "vit_tiny_patch16_224"
    cfg["text_cfg"]["hf_tokenizer_name"] = "testorg/not-in-the-cache"
    r = cli("zeroshot", "emoji", "--where", "split=test", "--model", f"open_clip:{ARCH}/{TAG}", "--bootstrap", "0")
    assert r.exit_code == 2 and "testorg/not-in-the-cache" in r.stderr and not fetched, r.stderr


def test_init_from_a_tag_vltool_does_not_rebuild_is_refused_before_fetching(hub, cli, tmp_path, monkeypatch):
    import vltool.hub as vh

    fetched = []
    real = vh.hub_file
    monkeypatch.setattr(vh, "hub_file", lambda *a, **k: fetched.append(a) or real(*a, **k))
    r = cli("pretrain", "emoji", "--where", "split=train", "--init", f"open_clip:{ARCH}/{TAG}", "--steps", "1",
            "--out", tmp_path / "run")
    assert r.exit_code == 2 and "does not fine-tune it" in r.stderr and not fetched and not (tmp_path / "run").exists(), r.stderr


def test_docs_list_the_tags_open_clips_registry_holds():
    """docs/models.md's list of open_clip tags is the one scripts/open_clip_tags.py makes from open_clip's registry."""
    from pathlib import Path

    from scripts import open_clip_tags

    root = Path(__file__).resolve().parents[1]

    assert open_clip_tags.main(["--check", str(root / "docs" / "models.md")]) == 0
