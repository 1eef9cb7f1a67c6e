"""Architectures by name: vltool's own (vltool/configs/*.json, open_clip's format) and open_clip's registry of
model configs, and the vltool model config of an open_clip model config.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from vltool.errors import UsageError
from vltool.model.format import FORMAT, FORMAT_VERSION, LOGIT_SCALE_MAX, TOKENIZER_DIR, _as_int_size, _preprocess_cfg


CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"  # vltool/configs


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


def _check_open_clip_cfg(model_cfg: dict, what: str) -> None:
    """An open_clip architecture that vltool's own towers do not rebuild cannot be trained from scratch here."""
    problems = open_clip_native_reasons(model_cfg)
    if problems:
        raise UsageError(
            f"{what}: vltool cannot build it offline from scratch: it has {'; '.join(problems)}. Use a plain open_clip "
            "architecture (e.g. RN50, ViT-B-32), a vltool config, or --image-tower torchvision:NAME / --text-tower hf:DIR"
        )


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
