"""What docs/models.md says of open_clip's tags, checked by building them, not by reading the registry:
every kind of model vltool runs (one representative tag of each family: vltool's towers, a CoCa, a
Hugging Face text tower, a timm image tower, a Hugging Face tokenizer with or without an organisation in
its id, SigLIP's timm tower with its tokenizer, a Hugging Face text tower with a timm tower) is built
offline from a Hugging Face cache laid out by hand (HF_HUB_OFFLINE=1), with open_clip's real config made
small and random weights of its shapes, and gives open_clip's own embeddings and tokens
(create_model_and_transforms + get_tokenizer on the same cache). The tokenizer of every tag (each distinct
tokenizer setting once) resolves through the cache as open_clip's get_tokenizer resolves it.

Also `open_clip:hf-hub:ORG/NAME` and `local-dir:PATH` of an architecture vltool does not rebuild
(timm/ViT-SO400M-14-SigLIP-384, as open_clip's model cards spell it) run as open_clip's own model, and
`vltool zeroshot` on it ranks every image's class as open_clip's own model does."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from tests.fixtures.hf_models import emoji_words, put_in_hub_cache, train_sentencepiece

COMMIT = "0c" * 20
TEXTS = ["a photo of a red heart.", "grinning face", "a photo of the flag of france."]

# family -> (ARCH, TAG, tokenizer kind of its Hugging Face tokenizer, tiny timm trunk standing in for its own)
FAMILIES = {
    "rebuilt": ("ViT-B-32", "laion2b_s34b_b79k", None, None),
    "coca": ("coca_ViT-B-32", "laion2b_s13b_b90k", None, None),
    "hf_text": ("roberta-ViT-B-32", "laion2b_s12b_b32k", "wordpiece", None),  # roberta-base: no organisation
    "timm": ("convnext_base", "laion400m_s13b_b51k", None, "convnext_atto"),
    "hf_tokenizer": ("ViT-L-14-CLIPA", "datacomp1b", "wordpiece", None),  # bert-base-uncased: no organisation
    "hf_tokenizer+timm": ("ViT-B-16-SigLIP", "webli", "sentencepiece", "vit_tiny_patch16_224"),
    "hf_text+timm": ("nllb-clip-base-siglip", "v1", "wordpiece", "vit_tiny_patch16_224"),
}


def family(cfg: dict, kind: str) -> str:
    """The family of a tag: how vltool runs it and which parts of open_clip's own it needs."""
    if kind == "rebuilt":
        return "rebuilt"
    text, vision = cfg.get("text_cfg", {}), cfg.get("vision_cfg", {})
    parts = ["coca"] if "multimodal_cfg" in cfg else []
    parts += ["hf_text"] if text.get("hf_model_name") else ["hf_tokenizer"] if text.get("hf_tokenizer_name") else []
    parts += ["timm"] if vision.get("timm_model_name") else []
    return "+".join(parts)


def save_tokenizer(kind: str, out, work) -> object:
    """A real tokenizer of the kind, saved with save_pretrained into `out`: BERT's wordpiece over the emoji
    words (CLIPA's bert-base-uncased is one), or SigLIP's sentencepiece trained on them."""
    from transformers import BertTokenizer, SiglipTokenizer

    out.mkdir(parents=True, exist_ok=True)
    if kind == "wordpiece":
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *emoji_words()]
        tok = BertTokenizer(vocab={w: i for i, w in enumerate(dict.fromkeys(words))})
    else:
        work.mkdir(parents=True, exist_ok=True)
        tok = SiglipTokenizer(vocab_file=str(train_sentencepiece(work / "spiece", emoji_words())))
    tok.save_pretrained(str(out))
    return tok


def shrink(cfg: dict, vocab_size: int, timm_name: str | None) -> dict:
    """open_clip's config of the architecture, small: one layer of width 64 in each open_clip tower, a tiny
    timm trunk, 32x32 images for open_clip's ViT, the tokenizer's vocabulary; everything else as open_clip has it."""
    cfg = copy.deepcopy(cfg)
    cfg["embed_dim"] = 32
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    if "timm_model_name" in vision:
        vision.update(timm_model_name=timm_name, image_size=224)  # (the tiny trunk's own size)
    else:
        vision.update(width=64, layers=1, patch_size=16, image_size=32, head_width=32)
    if not text.get("hf_model_name"):
        text.update(width=64, heads=2, layers=1, vocab_size=vocab_size)
    if "multimodal_cfg" in cfg:
        cfg["multimodal_cfg"].update(width=64, heads=2, layers=1, vocab_size=vocab_size)
    return cfg


def hf_text_config(name: str, vocab_size: int, pad_id: int):
    """A tiny config of the Hugging Face text tower open_clip names (its model type kept)."""
    from transformers import M2M100Config, RobertaConfig

    size = dict(vocab_size=vocab_size, pad_token_id=pad_id, max_position_embeddings=80)
    if "nllb" in name:
        return M2M100Config(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                            encoder_ffn_dim=64, decoder_ffn_dim=64, **size)
    return RobertaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, **size)


def _offline(monkeypatch, home):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # (open_clip's own download, read at import)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))  # (transformers' AutoConfig, as a process started with HF_HOME reads it)


def _no_config(snap):
    """huggingface_hub's record that the Hub has no config.json in this repository (as it remembers a 404),
    which is how transformers' AutoTokenizer knows offline that there is none."""
    (snap.parents[1] / ".no_exist" / snap.name).mkdir(parents=True, exist_ok=True)
    (snap.parents[1] / ".no_exist" / snap.name / "config.json").touch()


def lay_out_tag(arch: str, tag: str, tok_kind, timm_name, tmp_path, monkeypatch):
    """The Hub repositories of ARCH/TAG in a cache laid out by hand: the weights repository the tag names
    (random weights of the small config's shapes), the Hugging Face tokenizer's and text tower's repositories
    under the ids open_clip names them by. Registers the small config as ARCH's."""
    import open_clip
    from open_clip import factory
    from safetensors.torch import save_file

    home = tmp_path / "hf-home"
    cfg = open_clip.get_model_config(arch)
    text = cfg["text_cfg"]
    vocab, pad = 49408, 0
    names = {n for n in (text.get("hf_tokenizer_name"), text.get("hf_model_name")) if n}
    for name in names:  # (the tokenizer's repository is the text tower's)
        src = tmp_path / "src" / name.replace("/", "--")
        tok = save_tokenizer(tok_kind, src, tmp_path / "spm")
        vocab, pad = len(tok), tok.pad_token_id
        if name == text.get("hf_model_name"):
            hf_text_config(name, vocab, pad).save_pretrained(str(src))
        snap = put_in_hub_cache(home, name, src, COMMIT)
        if name != text.get("hf_model_name"):
            _no_config(snap)
    _offline(monkeypatch, home)  # (open_clip reads a Hugging Face text tower's config.json from the cache)
    small = shrink(cfg, vocab, timm_name)
    monkeypatch.setitem(factory._MODEL_CONFIGS, arch, small)
    hub_id = open_clip.get_pretrained_cfg(arch, tag)["hf_hub"]
    repo, _, file = hub_id.rstrip("/").rpartition("/") if not hub_id.endswith("/") else (hub_id[:-1], "", "open_clip_model.safetensors")
    file = file[:-4] + ".safetensors" if file.endswith((".bin", ".pth")) else file
    torch.manual_seed(3)
    model = open_clip.create_model(arch, pretrained_text=False)
    src = tmp_path / "weights"
    src.mkdir()
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(src / file))
    put_in_hub_cache(home, repo, src, COMMIT)  # (SigLIP's weights share their repository with its tokenizer)
    return home


def _images(n=3):
    from vltool.io import load_dataset

    return load_dataset("emoji", where=["split=test"]).dataset.select(range(n))["image"]


@pytest.mark.filterwarnings("ignore:QuickGELU mismatch")  # (roberta-ViT-B-32's own, as open_clip warns it)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_builds_offline_and_equals_open_clip(name, tmp_path, monkeypatch):
    """The representative tag of each family, built by vltool from the hand-laid cache: open_clip's own
    preprocessing, tokens and embeddings (vltool's own towers: the same to float rounding)."""
    import open_clip

    from vltool.model import load_model, open_clip_tag_support

    arch, tag, tok_kind, timm_name = FAMILIES[name]
    assert family(open_clip.get_model_config(arch), open_clip_tag_support(arch, tag)[0]) == name
    home = lay_out_tag(arch, tag, tok_kind, timm_name, tmp_path, monkeypatch)
    m = load_model(f"open_clip:{arch}/{tag}")
    model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=tag, cache_dir=str(home / "hub"))
    tokenizer = open_clip.get_tokenizer(arch, cache_dir=str(home / "hub"))
    model.eval()
    images = _images()
    pixels = torch.stack([preprocess(im) for im in images])  # (N, 3, H, W)
    with torch.no_grad():
        img = model.encode_image(pixels, normalize=True)  # (N, D)
        txt = model.encode_text(tokenizer(TEXTS), normalize=True)  # (T, D)
    assert torch.equal(m.tokenize(TEXTS), tokenizer(TEXTS))
    assert torch.equal(torch.stack([m.preprocess(im) for im in images]), pixels)
    mine_img, mine_txt = m.encode_image(pixels), m.encode_text(m.tokenize(TEXTS))
    if name == "rebuilt":
        assert torch.allclose(mine_img, img, atol=1e-6) and torch.allclose(mine_txt, txt, atol=1e-6)
    else:
        assert torch.equal(mine_img, img) and torch.equal(mine_txt, txt)
        assert m.revision["tag"] == tag and m.revision["commit"] == COMMIT


def test_every_tag_is_in_a_family_that_builds_and_none_is_refused():
    """docs/models.md's count: every tag of the installed open_clip runs (none refused), each in one of the
    families built above, so the table's claim rests on those builds."""
    import open_clip

    from vltool.model import open_clip_tag_support

    seen = {}
    for arch, tag in open_clip.list_pretrained():
        kind, why = open_clip_tag_support(arch, tag)
        assert kind != "refused", (arch, tag, why)
        seen.setdefault(family(open_clip.get_model_config(arch), kind), []).append(f"{arch}/{tag}")
    assert set(seen) <= set(FAMILIES), set(seen) - set(FAMILIES)


def _tokenizer_key(arch: str) -> str:
    """What decides open_clip.get_tokenizer(arch): its text config's tokenizer settings (and, with no Hugging
    Face tokenizer, whether the name says SigLIP)."""
    import open_clip

    text = open_clip.get_model_config(arch).get("text_cfg", {})
    keys = ("hf_tokenizer_name", "context_length", "tokenizer_kwargs", "tokenizer_mode")
    return json.dumps([{k: text.get(k) for k in keys}, not text.get("hf_tokenizer_name") and "siglip" in arch.lower()], sort_keys=True)


def test_every_tags_tokenizer_resolves_from_the_cache_as_open_clips(tmp_path, monkeypatch):
    """For every tag: the tokenizer vltool makes for it (its Hugging Face tokenizer resolved through
    huggingface_hub's cache under the id open_clip names, with or without an organisation, or open_clip's
    BPE) gives open_clip.get_tokenizer's tokens; each distinct tokenizer setting is checked once."""
    import open_clip

    from vltool.model import config_from_open_clip, open_clip_tag_support, source_tokenizer
    from vltool.model.open_clip_source import _open_clip_native_tokenizer

    home = tmp_path / "hf-home"
    names = {open_clip.get_model_config(a)["text_cfg"].get("hf_tokenizer_name") for a, _ in open_clip.list_pretrained()} - {None, ""}
    assert {"bert-base-uncased", "roberta-base", "xlm-roberta-base"} <= names  # (the ids without an organisation)
    src = tmp_path / "tok"
    save_tokenizer("wordpiece", src, tmp_path / "spm")
    for name in names:
        _no_config(put_in_hub_cache(home, name, src, COMMIT))
    _offline(monkeypatch, home)
    checked = {}
    for arch, tag in open_clip.list_pretrained():
        key = _tokenizer_key(arch)
        if key in checked:
            continue
        cfg = open_clip.get_model_config(arch)
        if open_clip_tag_support(arch, tag)[0] == "rebuilt":
            mine = source_tokenizer(config_from_open_clip(cfg, arch=arch))
        else:
            mine = _open_clip_native_tokenizer(f"open_clip:{arch}/{tag}", arch, cfg)
            if cfg["text_cfg"].get("hf_tokenizer_name"):
                assert mine.config["hf_tokenizer_commit"] == COMMIT
        theirs = open_clip.get_tokenizer(arch, cache_dir=str(home / "hub"))
        assert torch.equal(mine(TEXTS), theirs(TEXTS)), arch
        checked[key] = arch
    assert len(checked) >= 5


# ----------------------------------------------------------------------------------------------------
# open_clip:hf-hub:ORG/NAME and local-dir:PATH of an architecture vltool does not rebuild
# ----------------------------------------------------------------------------------------------------

HUB_REPO = "timm/ViT-SO400M-14-SigLIP-384"


@pytest.fixture(scope="module")
def siglip_repo(tmp_path_factory):
    """timm/ViT-SO400M-14-SigLIP-384's files as open_clip saves a repository (open_clip_config.json,
    open_clip_model.safetensors, its tokenizer), its config made small: a vit_tiny trunk, a 1-layer text tower."""
    import open_clip
    from open_clip import factory
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("so400m")
    src = root / "repo"
    tok = save_tokenizer("sentencepiece", src, root / "spm")
    cfg = shrink(open_clip.get_model_config("ViT-SO400M-14-SigLIP-384"), tok.vocab_size, "vit_tiny_patch16_224")
    cfg["text_cfg"].update(hf_tokenizer_name=HUB_REPO, width=192, heads=3, context_length=16)
    cfg["embed_dim"] = 192
    pp = {k: list(v) if isinstance(v, tuple) else v for k, v in open_clip.get_pretrained_cfg("ViT-SO400M-14-SigLIP-384", "webli").items()
          if k in ("mean", "std", "interpolation", "resize_mode")}
    (src / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": pp}))
    factory._MODEL_CONFIGS["test-so400m"] = cfg
    try:
        torch.manual_seed(5)
        model = open_clip.create_model("test-so400m")
        with torch.no_grad():
            model.logit_bias.fill_(-2.5)
            model.logit_scale.fill_(1.5)
    finally:
        factory._MODEL_CONFIGS.pop("test-so400m", None)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(src / "open_clip_model.safetensors"))
    return src


@pytest.fixture
def so400m_hub(siglip_repo, tmp_path, monkeypatch):
    home = tmp_path / "hf-home"
    _no_config(put_in_hub_cache(home, HUB_REPO, siglip_repo, COMMIT))
    _offline(monkeypatch, home)
    return home


def test_hf_hub_repo_vltool_does_not_rebuild_zeroshot_equals_open_clip(so400m_hub, cli, tmp_path):
    """`vltool zeroshot --model open_clip:hf-hub:timm/ViT-SO400M-14-SigLIP-384`: open_clip's own model
    (create_model_and_transforms + get_tokenizer of hf-hub:...): the same pixels, tokens, embeddings and
    logits, and every image's rank of its class as open_clip's logits give it; local-dir: of the same
    folder is open_clip's local-dir model."""
    import open_clip

    from vltool.encode import load_eval_model
    from vltool.io import load_dataset

    spec = f"open_clip:hf-hub:{HUB_REPO}"
    small = tmp_path / "small"
    ds = load_dataset("emoji", where=["split=test"]).dataset.select(range(24))
    ds.save_to_disk(str(small))
    names = ds.features["label"].names
    m = load_eval_model(spec)
    assert m.revision["commit"] == COMMIT and m.config["tokenizer"]["hf_tokenizer_commit"] == COMMIT
    model, _, preprocess = open_clip.create_model_and_transforms(f"hf-hub:{HUB_REPO}", cache_dir=str(so400m_hub / "hub"))
    tokenizer = open_clip.get_tokenizer(f"hf-hub:{HUB_REPO}", cache_dir=str(so400m_hub / "hub"))
    model.eval()
    texts = [f"a photo of a {n}." for n in names]
    pixels = torch.stack([preprocess(im) for im in ds["image"]])  # (N, 3, H, W)
    with torch.no_grad():
        img = model.encode_image(pixels, normalize=True)  # (N, D)
        txt = model.encode_text(tokenizer(texts), normalize=True)  # (C, D)
        logits = img @ txt.T * model.logit_scale.exp() + model.logit_bias  # (N, C)
    assert torch.equal(m.tokenize(texts), tokenizer(texts))
    assert torch.equal(m.preprocess(ds["image"][0]), pixels[0])
    assert torch.equal(m.encode_image(pixels), img) and torch.equal(m.encode_text(m.tokenize(texts)), txt)
    assert torch.allclose(m.logits(img, txt), logits, atol=1e-5)

    tpl = tmp_path / "t.txt"
    tpl.write_text("a photo of a {}.\n")
    out = tmp_path / "zs.json"
    r = cli("zeroshot", small, "--model", spec, "--templates", tpl, "--bootstrap", "0", "--out", out,
            "--cache-dir", tmp_path / "c", "--no-progress")
    assert r.exit_code == 0, r.stderr
    rec = json.loads(out.read_text())
    assert rec["model"]["revision"]["commit"] == COMMIT and rec["model"]["revision"]["repo"] == HUB_REPO
    ex = np.load(out.with_name("zs.examples.npz"))
    target = torch.as_tensor(np.asarray(ds["label"]))
    own = logits.gather(1, target[:, None])  # (N, 1)
    assert np.array_equal(ex["greater"][0], (logits > own).sum(1).numpy())
    tied = (logits == own).sum(1).numpy() - 1
    top1 = float(np.mean((ex["greater"][0] == 0) / (tied + 1)))
    assert rec["metrics"]["top1"]["value"] == pytest.approx(top1, abs=1e-12)

    snap = so400m_hub / "hub" / ("models--" + HUB_REPO.replace("/", "--")) / "snapshots" / COMMIT
    local = load_eval_model(f"local-dir:{snap}")
    oc_local, _, pp_local = open_clip.create_model_and_transforms(f"local-dir:{snap}")
    oc_local.eval()
    with torch.no_grad():
        assert torch.equal(local.encode_image(pixels), oc_local.encode_image(pixels, normalize=True))
        assert torch.equal(local.tokenize(texts), open_clip.get_tokenizer(f"local-dir:{snap}")(texts))
    assert torch.equal(local.preprocess(ds["image"][0]), pp_local(ds["image"][0]))


def test_hf_hub_refusals_come_before_the_weights_are_fetched(so400m_hub, cli, tmp_path, monkeypatch):
    """What cannot run (a tokenizer missing from the cache offline), and pretrain --init from an
    architecture vltool does not rebuild, are refused in one line with the weights never looked up."""
    import vltool.hub as vh

    fetched = []
    real = vh.hub_file
    monkeypatch.setattr(vh, "hub_file", lambda s, repo, name, *a, **k: fetched.append(name) or real(s, repo, name, *a, **k))
    r = cli("pretrain", "emoji", "--where", "split=train", "--init", f"open_clip:hf-hub:{HUB_REPO}", "--steps", "1",
            "--out", tmp_path / "run")
    assert r.exit_code == 2 and "does not fine-tune it" in r.stderr and not (tmp_path / "run").exists(), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and fetched == ["open_clip_config.json"]
    snap = so400m_hub / "hub" / ("models--" + HUB_REPO.replace("/", "--")) / "snapshots" / COMMIT
    r = cli("pretrain", "emoji", "--where", "split=train", "--init", f"local-dir:{snap}", "--steps", "1", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "does not fine-tune it" in r.stderr and not (tmp_path / "run").exists(), r.stderr
    cfg = json.loads((snap / "open_clip_config.json").read_text())
    cfg["model_cfg"]["text_cfg"]["hf_tokenizer_name"] = "not-in-the-cache"  # (an id without an organisation)
    (snap / "open_clip_config.json").unlink()
    (snap / "open_clip_config.json").write_text(json.dumps(cfg))
    fetched.clear()
    r = cli("zeroshot", "emoji", "--where", "split=test", "--model", f"open_clip:hf-hub:{HUB_REPO}", "--bootstrap", "0")
    assert r.exit_code == 2 and "not-in-the-cache" in r.stderr and fetched == ["open_clip_config.json"], r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
