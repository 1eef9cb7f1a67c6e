"""Hugging Face CLIP / SigLIP as vltool loads them (`hf:DIR`, `hf:ORG/NAME[@REVISION]`): the folder, its image
processor and tokenizer, and the vltool config of the model with both.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vltool import hub
from vltool.errors import UsageError, VltoolError
from vltool.model.architecture import TwoTower
from vltool.model.format import CONFIG_FILE, FORMAT, FORMAT_VERSION, LOGIT_SCALE_MAX, OPENAI_MEAN, OPENAI_STD, TOKENIZER_DIR, _preprocess_cfg
from vltool.model.hf_towers import HF_DUAL, hf_dual_class
from vltool.model.tokenizer import Tokenizer, _first_line, _tokenizer_problem


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
