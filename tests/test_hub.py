"""Models straight from the Hugging Face Hub (hf:ORG/NAME[@REVISION]) and from open_clip's pretrained tags
(open_clip:ARCH/TAG, open_clip:hf-hub:ORG/NAME), read through huggingface_hub's cache.

No network: each test lays out a cache by hand in a temporary HF_HOME (hub/models--ORG--NAME/snapshots/SHA/,
refs/main) with HF_HUB_OFFLINE=1. The models are tiny and random, saved as transformers 5 saves them
(CLIPProcessor / SiglipProcessor: processor_config.json), with real tokenizers (CLIP's BPE; SigLIP's
SiglipTokenizer on a sentencepiece model trained here). What vltool gives equals what the model's own
library gives: transformers for hf:, open_clip for open_clip:.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.fixtures.hf_models import make_hf_clip_v5, make_hf_siglip_sp, put_in_hub_cache

SHA = {"clip": "c1" * 20, "siglip": "51" * 20, "oc": "0c" * 20}
OLD = "01d" * 13 + "0"
MAKERS = {"clip": make_hf_clip_v5, "siglip": make_hf_siglip_sp}
TEMPLATE = "a photo of a {}."


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny models' folders (built once) and an open_clip repository of vltool-micro."""
    from vltool.model import ModelSpec, create_model, export_open_clip

    root = tmp_path_factory.mktemp("models")
    dirs = {kind: make(root / kind) for kind, make in MAKERS.items()}
    torch.manual_seed(3)
    model, _ = create_model(ModelSpec(arch="vltool-micro"))
    dirs["oc"] = export_open_clip(model, root / "oc")  # open_clip_config.json + open_clip_model.safetensors
    return dirs


@pytest.fixture
def hub(tmp_path, built, monkeypatch):
    """A Hugging Face cache holding the three repositories, offline."""
    home = tmp_path / "hf-home"
    for kind, repo in (("clip", "testorg/tiny-clip"), ("siglip", "testorg/tiny-siglip"), ("oc", "testorg/tiny-open-clip")):
        put_in_hub_cache(home, repo, built[kind], SHA[kind])
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture(scope="module")
def test_split():
    import datasets

    from vltool.io import load_dataset

    ds = load_dataset("emoji", where=["split=test"]).dataset
    return ds.cast_column("image", datasets.Image(decode=True)), ds.features["label"].names


def _hf_predictions(path: Path, kind: str, images, names) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' own logits_per_image: its processor's pixels, its tokenizer's ids padded to the model's
    length (SigLIP: input_ids only, as the model card encodes texts), (N, C)."""
    import transformers

    model = transformers.AutoModel.from_pretrained(str(path)).eval()
    proc = transformers.AutoProcessor.from_pretrained(str(path))
    length = model.config.text_config.max_position_embeddings
    texts = [TEMPLATE.format(n) for n in names]
    enc = proc.tokenizer(texts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"]} if kind == "siglip" else {k: enc[k] for k in ("input_ids", "attention_mask")}
    pixels = proc.image_processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model(pixel_values=pixels, **inputs).logits_per_image, pixels


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_zeroshot_from_a_hub_id_gives_transformers_predictions(kind, hub, test_split, cli, tmp_path):
    """`vltool zeroshot emoji --model hf:ORG/NAME` (transformers 5's processor layout, HF_HUB_OFFLINE=1):
    every test image's rank of its class equals transformers' own, and the record names the commit."""
    ds, names = test_split
    tpl = tmp_path / "t.txt"
    tpl.write_text(TEMPLATE + "\n")
    out = tmp_path / "zs.json"
    r = cli("zeroshot", "emoji", "--where", "split=test", "--model", f"hf:testorg/tiny-{kind}", "--templates", tpl,
            "--bootstrap", "0", "--json", "--out", out, "--cache-dir", tmp_path / "cache")
    assert r.exit_code == 0, r.stderr
    rec = json.loads(out.read_text())
    assert rec["model"]["revision"] == {"repo": f"testorg/tiny-{kind}", "revision": "main", "commit": SHA[kind]}
    assert rec["model"]["arch"] == f"hf:{kind}"
    ex = np.load(out.with_name("zs.examples.npz"))
    snapshot = hub / "hub" / f"models--testorg--tiny-{kind}" / "snapshots" / SHA[kind]
    logits, _ = _hf_predictions(snapshot, kind, list(ds["image"]), names)
    target = torch.as_tensor(np.asarray(ds["label"]))
    own = logits.gather(1, target[:, None])
    assert np.array_equal(ex["greater"][0], (logits > own).sum(1).numpy())  # per image: classes ranked above its own
    tied = (logits == own).sum(1).numpy() - 1  # (prompts that tokenize alike score alike)
    assert np.array_equal(ex["tied"][0], tied)
    top1 = float(np.mean((ex["greater"][0] == 0) / (tied + 1)))  # ties broken uniformly at random, in expectation
    assert rec["metrics"]["top1"]["value"] == pytest.approx(top1, abs=1e-12)


def test_a_pinned_revision_and_main_resolve_to_their_own_commits(hub, built, tmp_path):
    """hf:ORG/NAME follows refs/main; hf:ORG/NAME@SHA reads that snapshot; both name their commit."""
    from vltool.model import load_model

    put_in_hub_cache(hub, "testorg/tiny-clip", built["clip"], OLD, ref="v1")
    new = load_model("hf:testorg/tiny-clip")
    old = load_model(f"hf:testorg/tiny-clip@{OLD}")
    tagged = load_model("hf:testorg/tiny-clip@v1")
    assert new.revision["commit"] == SHA["clip"] and old.revision["commit"] == OLD and tagged.revision["commit"] == OLD
    assert old.revision["revision"] == OLD and tagged.revision["revision"] == "v1"
    assert new.source == "hf:testorg/tiny-clip"


def test_an_id_missing_from_the_cache_is_one_line(hub, cli, tmp_path):
    for spec in ("hf:testorg/not-there", f"hf:testorg/tiny-clip@{'f' * 40}", "open_clip:hf-hub:testorg/not-there"):
        r = cli("zeroshot", "emoji", "--where", "split=test", "--model", spec, "--bootstrap", "0")
        assert r.exit_code == 2, (spec, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "testorg/" in r.stderr and str(hub / "hub") in r.stderr and "HF_HUB_OFFLINE" in r.stderr
    r = cli("pretrain", "emoji", "--where", "split=train", "--init", "hf:testorg/not-there", "--steps", "1", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "not in the Hugging Face cache" in r.stderr and not (tmp_path / "run").exists()


def test_transformers5_processor_layout_is_read(built):
    """CLIPProcessor.save_pretrained writes processor_config.json, no preprocessor_config.json: vltool reads
    it through transformers' own AutoImageProcessor, as transformers does."""
    from vltool.model import load_model

    assert not (built["clip"] / "preprocessor_config.json").exists() and (built["clip"] / "processor_config.json").is_file()
    m = load_model(f"hf:{built['clip']}")
    assert m.config["preprocess"]["hf_image_processor"]["image_processor_type"].startswith("CLIPImageProcessor")


def test_siglip_text_is_encoded_without_a_mask(built):
    """SigLIP was trained on texts padded to max_length with no attention mask: vltool passes input_ids
    only (a real SiglipTokenizer returns a mask too), and its embeddings are transformers' without the mask,
    which differ from those with it."""
    import transformers

    from vltool.model import load_model

    path = built["siglip"]
    m = load_model(f"hf:{path}")
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    assert type(tok).__name__ == "SiglipTokenizer" and "attention_mask" in tok.model_input_names
    texts = ["a photo of a face smiling.", "cat face", "a photo of a country flag."]
    tokens = m.tokenize(texts)
    assert list(tokens) == ["input_ids"]
    enc = tok(texts, padding="max_length", max_length=12, truncation=True, return_tensors="pt")
    assert torch.equal(tokens["input_ids"], enc["input_ids"])
    hf = transformers.AutoModel.from_pretrained(str(path)).eval()
    with torch.no_grad():
        plain = F.normalize(hf.get_text_features(input_ids=enc["input_ids"]).pooler_output, dim=-1)
        masked = F.normalize(hf.get_text_features(**enc).pooler_output, dim=-1)
    ours = m.encode_text(tokens)
    assert torch.equal(ours, plain)
    assert (ours - masked).abs().max() > 1e-2  # the mask would change them


def _open_clip_siglip_text(hf):
    """open_clip's SigLIP text tower (TextTransformer: no causal mask, last-token pooling, a linear head
    with bias) holding the weights of a transformers SiglipTextModel."""
    from open_clip.transformer import TextTransformer

    c = hf.config.text_config
    tower = TextTransformer(context_length=c.max_position_embeddings, vocab_size=c.vocab_size, width=c.hidden_size,
                            heads=c.num_attention_heads, layers=c.num_hidden_layers, mlp_ratio=c.intermediate_size / c.hidden_size,
                            output_dim=c.hidden_size, no_causal_mask=True, pool_type="last", proj_type="linear", proj_bias=True,
                            norm_layer=lambda d: torch.nn.LayerNorm(d, eps=c.layer_norm_eps),
                            act_layer=lambda: torch.nn.GELU(approximate="tanh")).eval()
    t = hf.text_model
    sd = {"token_embedding.weight": t.embeddings.token_embedding.weight, "positional_embedding": t.embeddings.position_embedding.weight,
          "ln_final.weight": t.final_layer_norm.weight, "ln_final.bias": t.final_layer_norm.bias,
          "text_projection.weight": t.head.weight, "text_projection.bias": t.head.bias}
    for i, layer in enumerate(t.encoder.layers):
        a, p = layer.self_attn, f"transformer.resblocks.{i}."
        sd.update({p + "attn.in_proj_weight": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                   p + "attn.in_proj_bias": torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]),
                   p + "attn.out_proj.weight": a.out_proj.weight, p + "attn.out_proj.bias": a.out_proj.bias,
                   p + "ln_1.weight": layer.layer_norm1.weight, p + "ln_1.bias": layer.layer_norm1.bias,
                   p + "ln_2.weight": layer.layer_norm2.weight, p + "ln_2.bias": layer.layer_norm2.bias,
                   p + "mlp.c_fc.weight": layer.mlp.fc1.weight, p + "mlp.c_fc.bias": layer.mlp.fc1.bias,
                   p + "mlp.c_proj.weight": layer.mlp.fc2.weight, p + "mlp.c_proj.bias": layer.mlp.fc2.bias})
    tower.load_state_dict({k: v.detach() for k, v in sd.items()}, strict=True)
    return tower


def test_siglip_text_equals_open_clips_siglip_text_path(built):
    """The same SigLIP text weights in open_clip's SigLIP text tower, which takes token ids only (no mask):
    vltool's embeddings agree with it, and not with transformers' masked encoding."""
    import transformers

    from vltool.model import load_model

    path = built["siglip"]
    m = load_model(f"hf:{path}")
    hf = transformers.AutoModel.from_pretrained(str(path)).eval()
    tower = _open_clip_siglip_text(hf)
    texts = ["a photo of a face smiling.", "cat face", "a photo of a country flag.", "flag"]
    tokens = m.tokenize(texts)
    with torch.no_grad():
        theirs = F.normalize(tower(tokens["input_ids"]), dim=-1)
        masked = F.normalize(hf.get_text_features(**hf_tokens(path, texts)).pooler_output, dim=-1)
    ours = m.encode_text(tokens)
    assert torch.allclose(ours, theirs, rtol=0, atol=2e-6)
    assert not torch.allclose(masked, theirs, rtol=0, atol=1e-2)


def hf_tokens(path, texts):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    return tok(texts, padding="max_length", max_length=12, truncation=True, return_tensors="pt")


def test_a_sentencepiece_tokenizer_without_sentencepiece_says_what_to_install(built, monkeypatch, tmp_path):
    """Without sentencepiece (and protobuf) transformers cannot read SigLIP's tokenizer: the error names
    the packages and the pip command, not empty parentheses."""
    import importlib.util

    import transformers

    from vltool.errors import UsageError
    from vltool.model import load_model

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("sentencepiece", "google") else real(name, *a))

    def no_tokenizer(*a, **k):
        raise ValueError("")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_tokenizer)
    with pytest.raises(UsageError) as e:
        load_model(f"hf:{built['siglip']}")
    assert "SiglipTokenizer needs sentencepiece protobuf: pip install sentencepiece protobuf" in str(e.value)
    assert "()" not in str(e.value)


def test_install_brings_sentencepiece_and_protobuf():
    """scripts/install.sh installs the project with its dependencies: a real SigLIP's (and BLIP's) tokenizer
    needs sentencepiece and protobuf."""
    import tomllib

    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps}
    assert {"sentencepiece", "protobuf"} <= names


# ----------------------------------------------------------------------------------------------------
# open_clip
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def micro_tag(monkeypatch):
    """open_clip's registry knows a pretrained tag `testtag` of vltool-micro, kept on the Hub in
    testorg/tiny-open-clip (as laion2b_s34b_b79k of ViT-B-32 is kept in laion/CLIP-ViT-B-32-laion2B-s34B-b79K)."""
    from open_clip import pretrained

    monkeypatch.setitem(pretrained._PRETRAINED, "vltool-micro", {"testtag": pretrained._pcfg(hf_hub="testorg/tiny-open-clip/")})


def _rgba_image(side=40):
    from PIL import Image

    arr = np.zeros((side, side, 4), np.uint8)  # transparent black, as emoji art is stored
    arr[8:30, 6:34] = [200, 40, 30, 255]
    arr[14:20, 10:28, 3] = 90  # half transparent
    return Image.fromarray(arr, "RGBA")


def test_open_clip_hf_hub_id_equals_open_clip(hub, built, monkeypatch):
    """open_clip:hf-hub:ORG/NAME: the embeddings open_clip's own create_model_and_transforms('hf-hub:...')
    gives from the same cache, an RGBA image preprocessed as open_clip does (resize, then convert)."""
    import open_clip
    from huggingface_hub import constants

    from vltool.model import load_model

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    m = load_model("open_clip:hf-hub:testorg/tiny-open-clip")
    assert m.revision["commit"] == SHA["oc"] and m.revision["file"] == "open_clip_model.safetensors"
    model, _, preprocess = open_clip.create_model_and_transforms("hf-hub:testorg/tiny-open-clip", cache_dir=str(hub / "hub"))
    tokenizer = open_clip.get_tokenizer("hf-hub:testorg/tiny-open-clip", cache_dir=str(hub / "hub"))
    model.eval()
    im = _rgba_image()
    texts = ["a photo of a heart.", "flag"]
    with torch.no_grad():
        img = model.encode_image(preprocess(im)[None], normalize=True)
        txt = model.encode_text(tokenizer(texts), normalize=True)
    assert torch.equal(m.preprocess(im), preprocess(im))
    assert torch.equal(m.encode_image(m.preprocess(im)[None]), img)
    assert torch.equal(m.encode_text(m.tokenize(texts)), txt)


def test_open_clip_tag_loads_the_weights_its_repository_holds(hub, built, micro_tag):
    from safetensors.torch import load_file

    from vltool.model import load_model

    m = load_model("open_clip:vltool-micro/testtag")
    also = load_model("open_clip:vltool-micro", pretrained="testtag")  # open_clip's own spelling: name + pretrained tag
    weights = load_file(str(built["oc"] / "open_clip_model.safetensors"))
    assert all(torch.equal(m.model.state_dict()[k], v) for k, v in weights.items())
    assert m.fingerprint == also.fingerprint
    rev = m.revision
    assert rev["arch"] == "vltool-micro" and rev["tag"] == "testtag" and rev["repo"] == "testorg/tiny-open-clip"
    assert rev["commit"] == SHA["oc"] and rev["file"] == "open_clip_model.safetensors"
    import hashlib

    assert rev["sha256"] == hashlib.sha256((built["oc"] / "open_clip_model.safetensors").read_bytes()).hexdigest()


def test_a_real_open_clip_tag_resolves_to_its_repository_file(tmp_path, monkeypatch):
    """open_clip:ViT-B-32/laion2b_s34b_b79k is laion/CLIP-ViT-B-32-laion2B-s34B-b79K's open_clip_model.safetensors
    (open_clip's registry), read from the cache (a stand-in file: only its path and digest are checked)."""
    from vltool import hub

    home = tmp_path / "home"
    src = tmp_path / "src"
    src.mkdir()
    (src / "open_clip_model.safetensors").write_bytes(b"stand-in")
    put_in_hub_cache(home, "laion/CLIP-ViT-B-32-laion2B-s34B-b79K", src, SHA["oc"])
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = hub.resolve_open_clip_tag("open_clip:ViT-B-32/laion2b_s34b_b79k", "ViT-B-32", "laion2b_s34b_b79k", {})
    assert found.path.read_bytes() == b"stand-in"
    assert found.revision["repo"] == "laion/CLIP-ViT-B-32-laion2B-s34B-b79K" and found.revision["commit"] == SHA["oc"]
    assert found.preprocess_cfg["mean"] == [0.48145466, 0.4578275, 0.40821073] and found.preprocess_cfg["resize_mode"] == "shortest"


def test_pretrain_init_from_an_open_clip_tag_and_a_file_fine_tunes(hub, built, micro_tag, cli, tmp_path):
    """`pretrain --init open_clip:ARCH/TAG` (and open_clip:ARCH/FILE) starts from those weights, trains,
    and records the tag, its file's sha256 and the commit; without weights it is refused in one line."""
    from safetensors.torch import load_file

    weights = load_file(str(built["oc"] / "open_clip_model.safetensors"))
    for name, init in (("tag", "open_clip:vltool-micro/testtag"), ("file", f"open_clip:vltool-micro/{built['oc'] / 'open_clip_model.safetensors'}")):
        run = tmp_path / name
        r = cli("pretrain", "emoji", "--where", "split=train", "--init", init, "--steps", "2", "--batch-size", "8",
                "--lock-image", "--out", run, "--no-progress")
        assert r.exit_code == 0, r.stderr
        trained = load_file(str(run / "model" / "model.safetensors"))
        assert all(torch.equal(trained[k], v) for k, v in weights.items() if k.startswith("visual."))  # locked: the tag's
        assert any(not torch.equal(trained[k], v) for k, v in weights.items() if k.startswith("text."))  # trained
        options = json.loads((run / "vltool.json").read_text())["options"]
        assert options["init"] == init and options["init_revision"]["sha256"]
        if name == "tag":
            assert options["init_revision"]["commit"] == SHA["oc"] and options["init_revision"]["tag"] == "testtag"
        assert (run / "open_clip" / "open_clip_config.json").is_file()  # still an open_clip model
    r = cli("pretrain", "emoji", "--where", "split=train", "--init", "open_clip:vltool-micro", "--steps", "1", "--out", tmp_path / "bare")
    assert r.exit_code == 2 and "open_clip:vltool-micro/TAG" in r.stderr and not (tmp_path / "bare").exists()


def test_pretrain_init_from_a_hub_id_records_and_pins_its_commit(hub, cli, tmp_path):
    run = tmp_path / "run"
    r = cli("pretrain", "emoji", "--where", "split=train", "--init", "hf:testorg/tiny-clip", "--steps", "1", "--batch-size", "8",
            "--out", run, "--no-progress")
    assert r.exit_code == 0, r.stderr
    assert json.loads((run / "vltool.json").read_text())["options"]["init_revision"]["commit"] == SHA["clip"]
    r = cli("export", run, "--to", "hf", "--out", tmp_path / "hf_out")  # issue 40: the export names the commit too
    assert r.exit_code == 0, r.stderr
    stats = json.loads((tmp_path / "hf_out" / "vltool.json").read_text())["stats"]
    assert stats["started_from"] == f"testorg/tiny-clip@{SHA['clip']}" and stats["started_from_revision"]["commit"] == SHA["clip"]
    from vltool.model import pinned_spec

    assert pinned_spec("hf:testorg/tiny-clip", {"commit": SHA["clip"]}) == f"hf:testorg/tiny-clip@{SHA['clip']}"


# ----------------------------------------------------------------------------------------------------
# Transparent images: as the model's own library converts them
# ----------------------------------------------------------------------------------------------------


def _rgba_dataset(path: Path) -> str:
    import datasets

    buf = io.BytesIO()
    _rgba_image().save(buf, format="PNG")
    ds = datasets.Dataset.from_dict({"id": ["a"], "image": [{"bytes": buf.getvalue(), "path": None}], "caption": ["x"]},
                                    features=datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(),
                                                                "caption": datasets.Value("string")}))
    ds.save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("kind", ["clip", "oc"])
def test_a_transparent_image_is_converted_as_the_models_library_does(kind, built, tmp_path):
    """An RGBA image encoded by vltool equals the model's library on the same RGBA image: transformers'
    processor composites it on white; open_clip's transform resizes it, then drops the alpha."""
    import open_clip
    import transformers

    from vltool.encode import encode_images, load_eval_model
    from vltool.io import load_dataset

    data = load_dataset(_rgba_dataset(tmp_path / "rgba"))
    spec = f"hf:{built['clip']}" if kind == "clip" else f"local-dir:{built['oc']}"
    m = load_eval_model(spec)
    emb = encode_images(m, data, progress=False).embeddings
    if kind == "clip":
        proc = transformers.AutoImageProcessor.from_pretrained(str(built["clip"]))
        pixels = proc(images=_rgba_image(), return_tensors="pt")["pixel_values"]
    else:
        _, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{built['oc']}")
        pixels = preprocess(_rgba_image())[None]
    expected = m.encode_image(pixels).numpy()
    assert np.array_equal(emb, expected)
    flattened = m.encode_image(m.preprocess(_rgba_image().convert("RGB"))[None]).numpy()  # converted first (black)
    assert not np.allclose(emb, flattened, atol=1e-4)


def test_an_empty_pretrained_is_refused_not_fresh_weights(cli):
    """`--model open_clip:ARCH --pretrained ""` started encoding with random weights: refused in one line."""
    r = cli("zeroshot", "emoji", "--where", "split=test", "--model", "open_clip:vltool-micro", "--pretrained", "", "--bootstrap", "0")
    assert r.exit_code == 2 and "--pretrained is empty" in r.stderr


def test_a_missing_model_path_names_every_spelling(cli, tmp_path):
    r = cli("zeroshot", "emoji", "--model", str(tmp_path / "nope"), "--bootstrap", "0")
    assert r.exit_code == 2 and "does not exist" in r.stderr
    assert all(s in r.stderr for s in ("hf:ORG/NAME", "open_clip:ARCH/TAG", "open_clip:hf-hub:", "local-dir:PATH"))


def test_out_may_not_touch_the_hub_cache_a_model_is_read_from(hub, cli):
    """A Hub id's files are an input like a local model folder: --out inside huggingface_hub's cache is refused."""
    snapshot = hub / "hub" / "models--testorg--tiny-clip" / "snapshots" / SHA["clip"]
    for spec in ("hf:testorg/tiny-clip", "open_clip:hf-hub:testorg/tiny-open-clip"):
        r = cli("mine-positives", "emoji", "--where", "split=test", "--model", spec, "--out", snapshot / "mined")
        assert r.exit_code == 2 and "inputs are never modified" in r.stderr, r.stderr
    assert not (snapshot / "mined").exists()


def test_resume_of_a_branch_started_run_reads_the_pinned_commit(hub, built, tmp_path):
    """issue 40: --init hf:ORG/NAME@BRANCH records the commit the branch resolved to, and --resume reads that
    commit after the branch has moved (to a commit with another projection size: a size mismatch before)."""
    from tests.fixtures.hf_models import make_hf_clip_v5
    from vltool.model import pinned_spec
    from vltool.pretrain import PretrainConfig, pretrain

    moved = "de" * 20
    put_in_hub_cache(hub, "testorg/tiny-clip", built["clip"], SHA["clip"], ref="dev")
    put_in_hub_cache(hub, "testorg/tiny-clip", built["clip"], OLD, ref="v1")
    assert pinned_spec("hf:testorg/tiny-clip@dev", {"commit": SHA["clip"]}) == f"hf:testorg/tiny-clip@{SHA['clip']}"
    assert pinned_spec("open_clip:hf-hub:testorg/tiny-open-clip@v1", {"commit": OLD}) == f"open_clip:hf-hub:testorg/tiny-open-clip@{OLD}"
    cfg = PretrainConfig(init="hf:testorg/tiny-clip@dev", batch_size=8, steps=2, log_every=1, checkpoint_every=100)
    r = pretrain(["emoji"], tmp_path / "run", cfg, where=["split=train"], stop_after_steps=1, progress=False)
    assert r["status"] == "stopped"
    other = make_hf_clip_v5(tmp_path / "other", seed=5)
    config = json.loads((other / "config.json").read_text())
    config["projection_dim"] = 8
    (other / "config.json").write_text(json.dumps(config))
    from transformers import CLIPModel

    CLIPModel.from_pretrained(str(other), ignore_mismatched_sizes=True).save_pretrained(str(other))
    put_in_hub_cache(hub, "testorg/tiny-clip", other, moved, ref="dev")  # the branch moves
    r = pretrain(resume=tmp_path / "run", progress=False)
    assert r["status"] == "finished"
    options = json.loads((tmp_path / "run" / "vltool.json").read_text())["options"]
    assert options["init_revision"]["commit"] == SHA["clip"] and options["init_revision"]["revision"] == "dev"


def test_a_results_record_pins_the_branch_or_tag_to_its_commit(hub, built, cli, tmp_path):
    """--model hf:ORG/NAME@TAG: the record names the commit the tag resolved to, as a spelling that reruns it."""
    put_in_hub_cache(hub, "testorg/tiny-clip", built["clip"], OLD, ref="v1")
    out = tmp_path / "zs.json"
    r = cli("zeroshot", "emoji", "--where", "split=test", "--model", "hf:testorg/tiny-clip@v1", "--bootstrap", "0",
            "--out", out, "--cache-dir", tmp_path / "cache", "--no-progress")
    assert r.exit_code == 0, r.stderr
    model = json.loads(out.read_text())["model"]
    assert model["spec"] == "hf:testorg/tiny-clip@v1" and model["pinned"] == f"hf:testorg/tiny-clip@{OLD}"
    assert model["revision"]["commit"] == OLD


def test_messages_name_what_the_user_gave(hub, cli):
    """issue 40: a typo'd architecture in --model open_clip:ARCH/TAG is not blamed on --arch; an hf: Hub id
    holding only open_clip's files points at open_clip:hf-hub:, not at save_pretrained into the Hub cache."""
    r = cli("zeroshot", "emoji", "--where", "split=test", "--model", "open_clip:ViT-B-33/laion2b_s34b_b79k", "--bootstrap", "0")
    assert r.exit_code == 2 and "--arch" not in r.stderr and "open_clip:ViT-B-33/laion2b_s34b_b79k" in r.stderr, r.stderr
    assert "unknown architecture 'ViT-B-33'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("zeroshot", "emoji", "--where", "split=test", "--model", "hf:testorg/tiny-open-clip", "--bootstrap", "0")
    assert r.exit_code == 2 and "open_clip:hf-hub:testorg/tiny-open-clip" in r.stderr, r.stderr
    assert "save_pretrained" not in r.stderr and "snapshots" not in r.stderr
