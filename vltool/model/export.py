"""Export of a vltool model to the other libraries' layouts: open_clip's local-dir (`RUN_DIR/open_clip`) and
transformers' (`export --to hf`, a model started from hf:DIR).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import safetensors.torch  # (save_file through the module: tests replace it)
import torch

from vltool.errors import UsageError
from vltool.model.architecture import TwoTower
from vltool.model.format import OPEN_CLIP_CONFIG, OPEN_CLIP_WEIGHTS
from vltool.model.hf_towers import HF_DUAL, HF_DUAL_TYPES, build_hf_dual
from vltool.model.model_dir import state_dict_for_save
from vltool.model.tokenizer import Tokenizer


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
