"""vltool.pretrain.loop: large contrastive batches on few devices, and a GPU node used well (issue 18).

- Gradient caching (`--accum-steps A`): A micro-batches of B give the loss and the gradients of one batch
  of A x B, for every objective, in 1 process and in 2 (`-m slow`).
- `--grad-checkpointing`: the same gradients (and BatchNorm statistics) with less activation memory, for
  open_clip, torchvision and Hugging Face towers.
- The overlapped gradient sum (optim.GradientSync) keeps 2 processes = 1 (also tests/test_pretrain.py).
- The data loader with workers equals without; `--compile` on CPU equals eager; the GPU-only choices
  (fused AdamW, channels_last) are picked by device and keep the arithmetic.

Everything runs on CPU with `vltool-micro` on small synthetic data.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.launch import launch
from tests.fixtures.training import MINILM, MOBILENET, assert_same_weights, make_pairs, metrics, micro, needs_minilm, needs_mobilenet, weights

REPO = Path(__file__).resolve().parent.parent

GRAD_TOL = dict(atol=1e-5, rtol=1e-4)  # float32 sums in another order (observed: <= 4e-6)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """The inputs of every variant: pairs (32 rows), pairs with mined positives, UniCL label and text data."""
    import datasets

    from tests.fixtures.squares import WORDS

    root = tmp_path_factory.mktemp("scaling")
    pairs = make_pairs(root / "pairs", n=32)
    ds = datasets.load_from_disk(pairs)
    ds.add_column("positives", [[f"p{j}" for j in range(i + 1, 32) if j % 8 == i % 8] for i in range(32)]).save_to_disk(str(root / "pos"))
    lab = ds.add_column("label", [i % 8 for i in range(32)]).cast_column("label", datasets.ClassLabel(names=WORDS))
    lab.select(range(16)).remove_columns(["caption", "captions"]).save_to_disk(str(root / "lab"))
    lab.select(range(16, 32)).save_to_disk(str(root / "txt"))
    return {"pairs": pairs, "pos": str(root / "pos"), "lab": str(root / "lab"), "txt": str(root / "txt")}


# variant -> (input, options): every objective whose loss is over the batch, frozen features, checkpointing
VARIANTS = {
    "clip": ("pairs", dict(caption_sampling="random")),
    "sigmoid": ("pos", dict(loss="sigmoid", captions_per_image=2, caption_sampling="random", mined_positives=True,
                            bias_init="search", bias_search_batches=1)),
    "unicl": ("unicl", dict(loss="unicl")),
    "jsd": ("pairs", dict(loss="jsd")),
    "memory-bank": ("pairs", dict(memory_bank=16, ema_momentum=0.9)),
    "simclr": ("pairs", dict(loss="simclr", augment="simclr")),
    "frozen-image": ("pairs", dict(lock_image=True, augment="none")),
    "checkpointing": ("pairs", dict(grad_checkpointing=True)),
}

RUN_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    torch.set_num_threads(1)
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from vltool.pretrain import PretrainConfig, pretrain

    grads = []
    def capture(opt, args, kwargs):
        grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for g in opt.param_groups for p in g["params"]])
    register_optimizer_step_pre_hook(capture)
    out, runs = sys.argv[1], json.loads(sys.argv[2])
    for name, (inputs, opts) in runs.items():
        grads.clear()
        # float32: the variants equal to float32's rounding (--precision auto is bf16 on a CPU with AVX-512 BF16)
        base = dict(arch="vltool-micro", steps=2, optimizer="sgd", lr=0.05, log_every=1, augment="clip", precision="no")
        pretrain(inputs, out + "/" + name, PretrainConfig(**{**base, **opts}), progress=False)
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            continue
        torch.save(grads[0], out + "/" + name + "/grads.pt")  # the first step's gradients (same weights in every run)
    """
)


def _runs(data: dict, names, **sizes) -> dict:
    runs = {}
    for name in names:
        kind, opts = VARIANTS[name]
        opts = {**opts, **sizes}
        if kind == "unicl":
            inputs, opts = [], {**opts, "label_data": [data["lab"]], "text_data": [data["txt"]]}
        else:
            inputs = [data[kind]]
        runs[name] = (inputs, opts)
    return runs


def train_variants(tmp_path: Path, label: str, data: dict, names, nproc: int = 1, **sizes) -> Path:
    """Train each variant for 2 steps (SGD) with `sizes` (batch_size, accum_steps) in `nproc` processes;
    RUN/<variant>/ holds the run and the first step's gradients."""
    script = tmp_path / "scaling_runs.py"
    script.write_text(RUN_SCRIPT)
    out = tmp_path / label
    out.mkdir()
    launch([script, out, json.dumps(_runs(data, names, **sizes))], nproc, timeout=600)
    return out


def assert_same_training(a: Path, b: Path, name: str) -> None:
    """Same losses (both steps), same first-step gradients, same weights after 2 steps."""
    np.testing.assert_allclose([m["loss"] for m in metrics(b)], [m["loss"] for m in metrics(a)], rtol=1e-5, err_msg=name)
    ga, gb = torch.load(a / "grads.pt", weights_only=True), torch.load(b / "grads.pt", weights_only=True)
    assert len(ga) == len(gb)
    for i, (x, y) in enumerate(zip(ga, gb)):
        torch.testing.assert_close(y, x, **GRAD_TOL, msg=lambda m: f"{name}: parameter {i}: {m}")
    assert_same_weights(weights(a), weights(b), atol=2e-5)  # the second step's gradients amplify the first's rounding (jsd)
    sa, sb = (json.loads((d / "vltool.json").read_text())["stats"] for d in (a, b))
    assert sa["global_batch"] == sb["global_batch"] == 16 and sa["samples_seen"] == sb["samples_seen"] == 32
    assert sa["searched_logit_bias"] == pytest.approx(sb["searched_logit_bias"], abs=1e-6) if sa["searched_logit_bias"] else True


# ---------------------------------------------------------------------------------------------------
# Gradient caching
# ---------------------------------------------------------------------------------------------------


def test_accumulated_batch_takes_the_rows_of_one_batch():
    """Step s with A micro-batches of B (N processes) takes the rows, in order, one batch of A*N*B takes;
    an epoch holds whole steps."""
    from vltool.pretrain.data import EpochBatches

    one = list(EpochBatches(50, 12, 1, 0, seed=3, start=0, stop=8))  # 4 steps per epoch
    acc = list(EpochBatches(50, 3, 1, 0, seed=3, start=0, stop=8 * 4, accum=4))
    two = [list(EpochBatches(50, 2, 2, r, seed=3, start=0, stop=8 * 3, accum=3)) for r in (0, 1)]
    assert EpochBatches(50, 3, 1, 0, 3, 0, 0, accum=4).per_epoch == 16  # 50 // 12 steps of 4
    for s in range(8):
        assert one[s] == sum(acc[4 * s : 4 * s + 4], [])
        assert one[s] == sum((two[0][3 * s + a] + two[1][3 * s + a] for a in range(3)), [])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_accumulation_equals_one_batch(tmp_path, data, name):
    """4 micro-batches of 4 = one batch of 16: losses, gradients, weights (1 process)."""
    one = train_variants(tmp_path, "one", data, [name], batch_size=16, accum_steps=1)
    acc = train_variants(tmp_path, "acc", data, [name], batch_size=4, accum_steps=4)
    assert_same_training(one / name, acc / name, name)


@pytest.mark.slow
def test_accumulation_two_processes_equal_one(tmp_path, data):
    """2 processes x 4 micro-batches of 2 = 1 process with one batch of 16, for every variant (one launch)."""
    names = list(VARIANTS)
    one = train_variants(tmp_path, "one", data, names, batch_size=16, accum_steps=1)
    two = train_variants(tmp_path, "two", data, names, nproc=2, batch_size=2, accum_steps=4)
    for name in names:
        assert_same_training(one / name, two / name, name)
    s = json.loads((two / "clip" / "vltool.json").read_text())["stats"]
    assert s["num_processes"] == 2 and s["accum_steps"] == 4


@pytest.mark.slow
def test_checkpointing_two_processes_equal_one(tmp_path, data):
    one = train_variants(tmp_path, "one", data, ["checkpointing", "jsd"], batch_size=16)
    two = train_variants(tmp_path, "two", data, ["checkpointing", "jsd"], nproc=2, batch_size=8)
    for name in ("checkpointing", "jsd"):
        assert_same_training(one / name, two / name, name)


def test_accumulation_resume_equals_uninterrupted(tmp_path, data):
    from vltool.pretrain import pretrain

    cfg = micro(steps=4, batch_size=4, accum_steps=2, memory_bank=16, caption_sampling="random")
    pretrain([data["pairs"]], tmp_path / "full", cfg, progress=False)
    assert pretrain([data["pairs"]], tmp_path / "part", cfg, stop_after_steps=2, progress=False)["status"] == "stopped"
    pretrain(resume=tmp_path / "part", progress=False)
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "part"), atol=0)
    assert [m["loss"] for m in metrics(tmp_path / "part")] == [m["loss"] for m in metrics(tmp_path / "full")]


# ---------------------------------------------------------------------------------------------------
# Gradient checkpointing
# ---------------------------------------------------------------------------------------------------


def _grads_and_stats(model, inputs: dict, checkpointing: bool, seed: int = 0):
    """Gradients of a CLIP loss on `inputs`, the BatchNorm running statistics after it, and the bytes of
    tensors autograd kept for the backward pass."""
    from vltool.losses import ClipLoss, LossInput

    model.set_grad_checkpointing(checkpointing)
    model.train()
    model.zero_grad(set_to_none=True)
    kept = [0]

    def pack(t):
        kept[0] += t.numel() * t.element_size()
        return t

    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        img, txt = model(**inputs)
        loss = ClipLoss()(LossInput(img, txt, model.logit_scale.exp()))["loss"]
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    bn = {n: b.clone() for n, b in model.named_buffers() if "running" in n or "num_batches" in n}
    return grads, bn, kept[0]


def _check_checkpointing(model, inputs: dict) -> None:
    import copy

    plain = _grads_and_stats(copy.deepcopy(model), inputs, False)
    ckpt = _grads_and_stats(copy.deepcopy(model), inputs, True)
    assert plain[0].keys() == ckpt[0].keys() and plain[0]
    for n in plain[0]:
        torch.testing.assert_close(ckpt[0][n], plain[0][n], atol=1e-6, rtol=1e-5, msg=n)
    for n in plain[1]:  # the recomputation does not move BatchNorm statistics a second time
        torch.testing.assert_close(ckpt[1][n], plain[1][n], atol=0, rtol=0, msg=n)
    assert ckpt[2] < 0.7 * plain[2], (ckpt[2], plain[2])  # activations kept for the backward pass


def test_grad_checkpointing_open_clip_towers():
    """vltool-micro (open_clip ViT and text transformer) and vltool-tiny-rn (ModifiedResNet, BatchNorm)."""
    from vltool.model import ModelSpec, create_model

    for arch, size in (("vltool-micro", 32), ("vltool-tiny-rn", 32)):
        torch.manual_seed(0)
        model, tok = create_model(ModelSpec(arch=arch, image_size=size))
        g = torch.Generator().manual_seed(1)
        _check_checkpointing(model, {"images": torch.randn(6, 3, size, size, generator=g), "tokens": tok([f"text {i}" for i in range(6)])})


@needs_mobilenet
@needs_minilm
def test_grad_checkpointing_torchvision_and_hf_towers():
    from vltool.model import ModelSpec, create_model

    spec = ModelSpec(arch="vltool-micro", image_tower="torchvision:mobilenet_v2", image_weights=str(MOBILENET),
                     text_tower=f"hf:{MINILM}", embed_dim=16, image_size=32)
    torch.manual_seed(0)
    model, tok = create_model(spec)
    g = torch.Generator().manual_seed(1)
    _check_checkpointing(model, {"images": torch.randn(4, 3, 32, 32, generator=g), "tokens": tok([f"text number {i}" for i in range(4)])})
    # the state dict keeps its keys (checkpointing swaps the class of the stage sequence, not its modules)
    keys = set(model.state_dict())
    model.set_grad_checkpointing(True)
    assert set(model.state_dict()) == keys


def test_grad_checkpointing_trains_like_without(tmp_path, data):
    from vltool.pretrain import pretrain

    a = pretrain([data["pairs"]], tmp_path / "a", micro(steps=3, arch="vltool-tiny-rn", image_size=32), progress=False)
    b = pretrain([data["pairs"]], tmp_path / "b", micro(steps=3, arch="vltool-tiny-rn", image_size=32, grad_checkpointing=True),
                 progress=False)
    assert a["stats"]["final_loss"] == pytest.approx(b["stats"]["final_loss"], rel=1e-5)
    assert_same_weights(weights(tmp_path / "a"), weights(tmp_path / "b"), atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# The GPU path's pieces, on CPU
# ---------------------------------------------------------------------------------------------------


def test_workers_equal_no_workers(tmp_path, data):
    """The data depend on (seed, epoch, row) only: 2 persistent, prefetching workers train as 0 workers."""
    from vltool.pretrain import pretrain

    cfg = dict(steps=3, caption_sampling="random", augment="simclr")
    pretrain([data["pairs"]], tmp_path / "w0", micro(**cfg), progress=False)
    pretrain([data["pairs"]], tmp_path / "w2", micro(**cfg, workers=2), progress=False)
    assert_same_weights(weights(tmp_path / "w0"), weights(tmp_path / "w2"), atol=0)


@pytest.mark.slow  # about a minute of compilation with a cold inductor cache
def test_compile_equals_eager_on_cpu(tmp_path, data):
    """--compile (torch.compile of both towers, inductor on CPU): 2 steps, the same losses to float tolerance."""
    from torch._dynamo.utils import counters

    from vltool.pretrain import pretrain

    cfg = dict(steps=2, augment="none", precision="no")  # float32's tolerance (auto is bf16 on a CPU with AVX-512 BF16)
    pretrain([data["pairs"]], tmp_path / "eager", micro(**cfg), progress=False)
    graphs = counters["stats"]["unique_graphs"]
    pretrain([data["pairs"]], tmp_path / "compiled", micro(**cfg, compile=True), progress=False)
    assert counters["stats"]["unique_graphs"] >= graphs + 2  # both towers went through dynamo
    np.testing.assert_allclose([m["loss"] for m in metrics(tmp_path / "compiled")], [m["loss"] for m in metrics(tmp_path / "eager")],
                               rtol=1e-4)
    assert_same_weights(weights(tmp_path / "eager"), weights(tmp_path / "compiled"), atol=1e-4)


def test_device_choices_keep_the_arithmetic():
    """Fused AdamW on CUDA and CPU; channels_last (chosen for convolutional towers on CUDA)
    gives the gradients of the default layout."""
    import copy

    from vltool.model import ModelSpec, create_model
    from vltool.pretrain.optim import optimizer_impl

    assert optimizer_impl("cuda") == "fused" and optimizer_impl(torch.device("cpu")) == "fused"
    torch.manual_seed(0)
    model, tok = create_model(ModelSpec(arch="vltool-tiny-rn", image_size=32))
    assert model.convolutional_image_tower() and not create_model(ModelSpec(arch="vltool-micro"))[0].convolutional_image_tower()
    inputs = {"images": torch.randn(4, 3, 32, 32), "tokens": tok(["a", "b", "c", "d"])}
    plain = _grads_and_stats(copy.deepcopy(model), inputs, False)[0]
    cl = copy.deepcopy(model)
    cl.set_channels_last(True)
    assert cl.visual.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    got = _grads_and_stats(cl, inputs, False)[0]
    for n in plain:  # float rounding differs with the layout (and the thread count): scale the tolerance
        scale = max(1.0, plain[n].abs().max().item())
        torch.testing.assert_close(got[n], plain[n], atol=2e-5 * scale, rtol=1e-4, msg=n)


def test_bf16_with_gradient_checkpointing_on_cpu_trains_like_without(tmp_path):
    """bf16 on CPU picks torch's math attention kernel (vltool's speed choice); with --grad-checkpointing
    the blocks recomputed in the backward pass must use it too. They did not (CheckpointError: recomputed
    values have another dtype, an "internal error" for the user). Now: the same losses and weights as
    without checkpointing."""
    from vltool.pretrain import pretrain

    data = make_pairs(tmp_path / "pairs", n=16)
    runs = [pretrain([data], tmp_path / name, micro(steps=2, precision="bf16", grad_checkpointing=ck), progress=False)
            for name, ck in (("plain", False), ("checkpointed", True))]
    assert all(r["stats"]["steps"] == 2 for r in runs)
    np.testing.assert_allclose([m["loss"] for m in metrics(tmp_path / "checkpointed")],
                               [m["loss"] for m in metrics(tmp_path / "plain")], rtol=1e-6)
    assert_same_weights(weights(tmp_path / "plain"), weights(tmp_path / "checkpointed"), atol=1e-6)


def test_workers_default_is_chosen_from_the_machine_and_recorded(tmp_path, monkeypatch):
    import json
    import os

    from tests.fixtures.training import micro
    from vltool.pretrain import pretrain
    from vltool.pretrain.runtime import default_workers

    assert default_workers("cpu", 1) == 0
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_workers("cuda", 16) == 8 - 1  # 64 cores / 8 local processes, less one
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_workers("cuda", 2) == 31  # every core this process may use: 16 (H200, 16 cores) -> 15
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert default_workers("cuda", 1) == 15
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert default_workers("cuda", 2) == 0
    data = make_pairs(tmp_path / "d", n=16)
    cfg = micro(steps=1)
    assert cfg.workers is None
    r = pretrain([data], tmp_path / "run", cfg, progress=False)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config"]["workers"] == 0  # on CPU
    assert r["options"]["workers"] == 0
