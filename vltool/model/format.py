"""The vltool model format: the file names of a model directory (`RUN_DIR/model`) and of open_clip's local-dir
export (`RUN_DIR/open_clip`), the format and its version, and what every model config shares (the normalisations,
the logit scale's clamp, the `preprocess` entry and its square image size).
"""

from __future__ import annotations

from vltool.errors import UsageError


FORMAT = "vltool-model"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
MODEL_DIR = "model"  # RUN_DIR/model
OPEN_CLIP_DIR = "open_clip"  # RUN_DIR/open_clip, the open_clip local-dir export
OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_WEIGHTS = "open_clip_model.safetensors"

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TEXT_POOLINGS = ("mean", "cls")
LOGIT_SCALE_MAX = 100.0  # CLIP's clamp of the multiplier


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
