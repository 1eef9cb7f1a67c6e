"""Hugging Face CLIPModel / SiglipModel as vltool models (--model hf:DIR, pretrain --init hf:DIR, export --to hf):
vltool's embeddings and logits equal transformers' own, on tiny random models saved locally (tests/fixtures/hf_models.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.fixtures.eval_data import COLORS, make_colors
from tests.fixtures.hf_models import make_hf_clip, make_hf_siglip

MAKERS = {"clip": make_hf_clip, "siglip": make_hf_siglip}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {kind: make(root / kind) for kind, make in MAKERS.items()}


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return make_colors(tmp_path_factory.mktemp("data") / "colors", per_class=3)


def _transformers(path):
    import transformers

    model = transformers.AutoModel.from_pretrained(str(path)).eval()
    return model, transformers.AutoImageProcessor.from_pretrained(str(path)), transformers.AutoTokenizer.from_pretrained(str(path))


def _images(n=4):
    from PIL import Image

    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (20 + 7 * i, 40, 3), dtype=np.uint8)) for i in range(n)]


def _hf_text_inputs(tok, texts, length):
    enc = tok(texts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    return {k: enc[k] for k in tok.model_input_names if k in ("input_ids", "attention_mask")}


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_embeddings_and_logits_equal_transformers(kind, hf_dirs):
    from vltool.model import load_model

    path = hf_dirs[kind]
    m = load_model(f"hf:{path}")
    hf, proc, tok = _transformers(path)
    ims = _images()
    texts = ["a photo of a red square.", "dog", "a green thing"]
    pixels = proc(images=ims, return_tensors="pt")["pixel_values"]
    assert torch.equal(torch.stack([m.preprocess(im) for im in ims]), pixels)  # the model's own processor
    tokens = m.tokenize(texts)
    inputs = _hf_text_inputs(tok, texts, m.config["tokenizer"]["max_length"])
    assert tokens.keys() == inputs.keys() and all(torch.equal(tokens[k], inputs[k]) for k in inputs)
    if kind == "siglip":
        assert list(tokens) == ["input_ids"]  # SigLIP's text model sees no attention mask
    with torch.no_grad():
        img = hf.get_image_features(pixel_values=pixels).pooler_output
        txt = hf.get_text_features(**inputs).pooler_output
        out = hf(pixel_values=pixels, **inputs)
    ei, et = m.encode_image(pixels), m.encode_text(tokens)
    assert torch.allclose(ei, F.normalize(img, dim=-1), rtol=0, atol=1e-7)  # get_image_features, normalised
    assert torch.allclose(et, F.normalize(txt, dim=-1), rtol=0, atol=1e-7)
    # exactly: the model's own normalised embeddings and logits
    assert torch.equal(ei, out.image_embeds) and torch.equal(et, out.text_embeds)
    assert torch.equal(m.logits(ei, et), out.logits_per_image)
    assert m.logit_scale == pytest.approx(float(hf.logit_scale.detach().exp()))
    from vltool.encode import image_forward

    with torch.no_grad():  # --features pre: the pooled output before CLIP's projection (SigLIP: its head's)
        assert torch.equal(image_forward(m, "pre")(pixels), hf.vision_model(pixel_values=pixels).pooler_output)
    assert (m.model.logit_bias is not None) == (kind == "siglip")


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_zeroshot_cli_equals_transformers_argmax(kind, hf_dirs, colors, cli, tmp_path):
    """`vltool zeroshot --model hf:DIR` with one template: its top-1 is transformers' argmax of logits_per_image."""
    import datasets

    path = hf_dirs[kind]
    tpl = tmp_path / "t.txt"
    tpl.write_text("a photo of a {}.\n")
    r = cli("zeroshot", colors, "--model", f"hf:{path}", "--templates", tpl, "--bootstrap", "0", "--json", "--out", tmp_path / "zs.json")
    assert r.exit_code == 0, r.stderr
    rec = json.loads((tmp_path / "zs.json").read_text())
    assert rec["model"]["spec"] == f"hf:{path}" and rec["model"]["arch"] == f"hf:{kind}"

    hf, proc, tok = _transformers(path)
    ds = datasets.load_from_disk(colors)
    pixels = proc(images=[im.convert("RGB") for im in ds["image"]], return_tensors="pt")["pixel_values"]
    names = list(COLORS)
    inputs = _hf_text_inputs(tok, [f"a photo of a {c}." for c in names], hf.config.text_config.max_position_embeddings)
    with torch.no_grad():
        pred = hf(pixel_values=pixels, **inputs).logits_per_image.argmax(1).numpy()
    assert rec["metrics"]["top1"]["value"] == pytest.approx(float(np.mean(pred == np.asarray(ds["label"]))), abs=1e-12)


def test_every_model_command_takes_hf(hf_dirs, colors, cli, tmp_path):
    """retrieve, probe, mine-positives, pseudolabel and debias run on hf:DIR (a SigLIP) and record it."""
    spec = f"hf:{hf_dirs['siglip']}"
    runs = {
        "retrieve": ["retrieve", colors, "--model", spec, "--bootstrap", "0", "--out", tmp_path / "r.json"],
        "probe": ["probe", colors, "--where", "split=train", "--eval-data", colors, "--eval-where", "split=test", "--model", spec,
                  "--bootstrap", "0", "--out", tmp_path / "p.json"],
        "mine-positives": ["mine-positives", colors, "--model", spec, "--out", tmp_path / "mined"],
        "pseudolabel": ["pseudolabel", colors, "--where", "split=test", "--aligned", colors, "--aligned-where", "split=train",
                        "--model", spec, "--out", tmp_path / "pseudo"],
        "debias": ["debias", "--model", spec, "--out", tmp_path / "sub"],
    }
    for name, args in runs.items():
        r = cli(*args)
        assert r.exit_code == 0, (name, r.stderr)
    for out in ("r.json", "p.json"):
        assert json.loads((tmp_path / out).read_text())["model"]["spec"] == spec
    for out in ("mined", "pseudo", "sub"):
        assert spec in json.dumps(json.loads((tmp_path / out / "vltool.json").read_text())["options"])


def test_bad_hf_dirs_are_one_line_errors(tmp_path, colors, cli, hf_dirs):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    r = cli("zeroshot", colors, "--model", f"hf:{bert}")
    assert r.exit_code == 2 and "model_type 'bert' is not a dual encoder" in r.stderr and "clip (CLIPModel), siglip (SiglipModel)" in r.stderr
    r = cli("zeroshot", colors, "--model", f"hf:{tmp_path / 'missing'}")
    assert r.exit_code == 2 and "no such directory" in r.stderr and "not a Hub id ORG/NAME" in r.stderr
    r = cli("zeroshot", colors, "--model", f"hf:{tmp_path}")
    assert r.exit_code == 2 and "no config.json" in r.stderr
    r = cli("mine-positives", colors, "--model", f"hf:{hf_dirs['clip']}", "--out", hf_dirs["clip"] / "mined")
    assert r.exit_code == 2 and "inputs are never modified" in r.stderr
    assert "Traceback" not in r.stderr
    # pretrain refuses before making RUN_DIR
    r = cli("pretrain", colors, "--out", tmp_path / "run", "--init", f"hf:{bert}", "--steps", "1", "--batch-size", "4")
    assert r.exit_code == 2 and "model_type 'bert'" in r.stderr and not (tmp_path / "run").exists()
    (bert / "config.json").write_text(json.dumps({"model_type": "siglip"}))
    r = cli("pretrain", colors, "--out", tmp_path / "run", "--init", f"hf:{bert}", "--steps", "1", "--batch-size", "4")
    assert r.exit_code == 2 and "no image processor" in r.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind,loss", [("siglip", "sigmoid"), ("clip", "clip")])
def test_init_one_step_export_roundtrip(kind, loss, hf_dirs, colors, cli, tmp_path):
    """pretrain --init hf:DIR (one step, image tower locked) -> export --to hf -> transformers loads it and its
    features equal vltool's encoding of the RUN_DIR; the locked image tower is unchanged, the text tower moved."""
    from safetensors.torch import load_file

    from vltool.model import load_model

    path = hf_dirs[kind]
    run = tmp_path / "run"
    r = cli("pretrain", colors, "--where", "split=train", "--out", run, "--init", f"hf:{path}", "--loss", loss,
            "--lock-image", "--steps", "1", "--batch-size", "6", "--lr", "1e-2", "--no-progress")
    assert r.exit_code == 0, r.stderr
    r = cli("export", run, "--to", "hf", "--out", tmp_path / "hf_out")
    assert r.exit_code == 0, r.stderr
    assert json.loads((tmp_path / "hf_out" / "vltool.json").read_text())["stats"]["model_type"] == kind

    hf, proc, tok = _transformers(tmp_path / "hf_out")
    assert type(hf).__name__ == {"clip": "CLIPModel", "siglip": "SiglipModel"}[kind]
    m = load_model(run)
    ims, texts = _images(3), ["a red square", "a photo of a dog."]
    pixels = proc(images=ims, return_tensors="pt")["pixel_values"]
    inputs = _hf_text_inputs(tok, texts, m.config["tokenizer"]["max_length"])
    with torch.no_grad():
        img = hf.get_image_features(pixel_values=pixels).pooler_output
        out = hf(pixel_values=pixels, **inputs)
    ei, et = m.encode_image(pixels), m.encode_text(m.tokenize(texts))
    assert torch.allclose(ei, F.normalize(img, dim=-1), rtol=0, atol=1e-7)
    assert torch.equal(ei, out.image_embeds) and torch.equal(et, out.text_embeds)
    assert torch.equal(m.logits(ei, et), out.logits_per_image)
    back = load_model(f"hf:{tmp_path / 'hf_out'}")  # the export read back by vltool: the same model
    assert torch.equal(back.encode_image(pixels), ei) and torch.equal(back.encode_text(back.tokenize(texts)), et)

    before, after = load_file(str(path / "model.safetensors")), load_file(str(tmp_path / "hf_out" / "model.safetensors"))
    assert before.keys() == after.keys()
    vision = [k for k in before if k.startswith("vision_model.") or k == "visual_projection.weight"]
    text = [k for k in before if k.startswith("text_model.")]
    assert all(torch.equal(before[k], after[k]) for k in vision)  # --lock-image: projection included
    assert any(not torch.equal(before[k], after[k]) for k in text)


def test_export_hf_refuses_other_models(tmp_path, cli):
    from tests.fixtures.eval_data import make_model

    run = make_model(tmp_path / "run")
    r = cli("export", run, "--to", "hf", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "only a model started from hf:DIR" in r.stderr
    r = cli("export", run, "--to", "hf", "--out", tmp_path / "o", "--shard-size", "3")
    assert r.exit_code == 2 and "--shard-size apply to datasets only" in r.stderr


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_lock_and_unfreeze_last_blocks_of_hf_towers(kind, hf_dirs):
    """--lock-image --unfreeze-image-last 1 --lock-text: the image tower's last block, final LayerNorm and
    SigLIP's head / CLIP's projection train; the whole text tower (its projection included) is frozen."""
    from vltool.model import load_hf_dual
    from vltool.pretrain.config import PretrainConfig
    from vltool.pretrain.optim import apply_freezing

    model, _, _ = load_hf_dual(f"hf:{hf_dirs[kind]}")
    frozen = apply_freezing(model, PretrainConfig(lock_image=True, unfreeze_image_last=1, lock_text=True))
    assert frozen == {"image": False, "text": True}
    trainable = {n.split(".")[0] if not n.startswith("visual.") else ".".join(n.split(".")[:4])
                 for n, p in model.named_parameters() if p.requires_grad}
    head = {"clip": {"visual.proj.weight"}, "siglip": {"visual.model.head.probe", "visual.model.head.attention",
                                                       "visual.model.head.layernorm", "visual.model.head.mlp"}}[kind]
    assert trainable == {"logit_scale", *(["logit_bias"] if kind == "siglip" else []), "visual.model.encoder.layers",
                         "visual.model.post_layernorm.weight", "visual.model.post_layernorm.bias", *head}
    assert all(n.startswith("visual.model.encoder.layers.1.") for n, p in model.named_parameters()
               if p.requires_grad and n.startswith("visual.model.encoder."))


def test_resume_from_hf_init_equals_uninterrupted(hf_dirs, colors, tmp_path):
    """A run started from hf:DIR, stopped after 2 steps and resumed, ends with the weights of one run of 4."""
    from safetensors.torch import load_file

    from vltool.pretrain import PretrainConfig, pretrain

    cfg = PretrainConfig(init=f"hf:{hf_dirs['siglip']}", loss="sigmoid", batch_size=6, steps=4, lr=1e-2, log_every=1,
                         checkpoint_every=100, augment="clip")
    pretrain([colors], tmp_path / "full", cfg, where=["split=train"], progress=False)
    r = pretrain([colors], tmp_path / "part", cfg, where=["split=train"], stop_after_steps=2, progress=False)
    assert r["status"] == "stopped" and r["step"] == 2
    r = pretrain(resume=tmp_path / "part", progress=False)
    assert r["status"] == "finished" and r["stats"]["resumed_from_step"] == 2
    full, part = (load_file(str(tmp_path / d / "model" / "model.safetensors")) for d in ("full", "part"))
    assert full.keys() == part.keys() and all(torch.equal(full[k], part[k]) for k in full)


def test_a_whole_clip_as_text_tower_is_one_line(hf_dirs, colors, cli, tmp_path):
    """--text-tower hf:DIR with a CLIPModel folder (both towers) was an internal error ("'CLIPConfig' object
    has no attribute 'hidden_size'"): one line pointing at --init, before RUN_DIR is made."""
    r = cli("pretrain", colors, "--out", tmp_path / "run", "--text-tower", f"hf:{hf_dirs['clip']}", "--steps", "1", "--batch-size", "4")
    assert r.exit_code == 2 and "is a whole CLIPModel (both towers), not a text encoder" in r.stderr, r.stderr
    assert f"--init hf:{hf_dirs['clip']}" in r.stderr and "Traceback" not in r.stderr and not (tmp_path / "run").exists()


def test_both_towers_locked_train_a_whole_clips_projections(hf_dirs, colors, cli, tmp_path):
    """--init hf:CLIP --lock-image --lock-text trained one parameter, the logit scale: the projections were locked
    with the towers they live in. Now they train, as two towers' projections do (issue 39); a model with no
    projections of its own (SigLIP) is refused in one line instead of training only its logit scale and bias."""
    from vltool.model import load_hf_dual, load_model

    run = tmp_path / "run"
    r = cli("pretrain", colors, "--where", "split=train", "--out", run, "--init", f"hf:{hf_dirs['clip']}", "--lock-image",
            "--lock-text", "--steps", "1", "--batch-size", "6", "--lr", "1e-2", "--no-progress")
    assert r.exit_code == 0, r.stderr
    before = dict(load_hf_dual(f"hf:{hf_dirs['clip']}")[0].named_parameters())
    after = dict(load_model(run).model.named_parameters())
    assert before.keys() == after.keys()
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert moved == {"visual.proj.weight", "text.proj.weight", "logit_scale"}
    r = cli("pretrain", colors, "--where", "split=train", "--out", tmp_path / "sig", "--init", f"hf:{hf_dirs['siglip']}",
            "--loss", "sigmoid", "--lock-image", "--lock-text", "--steps", "1", "--batch-size", "6", "--no-progress")
    assert r.exit_code == 2 and "only the logit scale would train" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "sig").exists()
