"""open_clip's torch-only parts (its ViT and text transformer, ModifiedResNet, BPE tokenizer, eval transform)
without open_clip's package `__init__`, which imports every model family it has: transformers (its Hugging
Face text towers), timm and the CoCa model, about 2 s of CPU on a 2-core machine. A vltool model whose towers
are open_clip's own ViT, text transformer or ModifiedResNet (vltool-tiny and the other vltool/configs)
needs none of them, so loading one costs torch, torchvision and these few modules only.

`part(name)` is open_clip's module `open_clip.<name>`, the very module open_clip itself uses (the classes,
the init and the numbers are open_clip's). When open_clip has not been imported yet, the package is made
without running its `__init__`; the first name asked of it that the parts do not define (`open_clip.
create_model`, after a later `import open_clip`) runs the `__init__` then, in place, so the whole package is
there for whoever needs it and shares these modules. (`"open_clip.factory" in sys.modules` tells whether
it ran.)

`build_vision_tower` / `build_text_tower` build a tower as open_clip.model's `_build_vision_tower` /
`_build_text_tower` do, for the configs whose keys are all `PLAIN_*` (tests/test_open_clip_parts.py holds them equal
to open_clip's builders, parameters and outputs, for every vltool config); any other config goes to
open_clip's own builder, through the whole package.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

PARTS = ("transformer", "modified_resnet", "tokenizer", "transform", "constants", "utils", "pos_embed")

# the config keys these builders pass on unchanged (VisionTransformer's and TextTransformer's own defaults for
# the keys a config leaves out are CLIPVisionCfg's and CLIPTextCfg's, which the tests check)
PLAIN_VISION = {"image_size", "layers", "width", "head_width", "patch_size", "mlp_ratio"}
PLAIN_RESNET = {"image_size", "layers", "width", "head_width"}
PLAIN_TEXT = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"}


def part(name: str):
    """The module open_clip.<name> (one of PARTS), imported without open_clip's package __init__ when open_clip
    is not imported yet."""
    if name not in PARTS:
        raise ValueError(f"open_clip.{name} is not one of the torch-only parts {PARTS}")
    full = f"open_clip.{name}"
    if full in sys.modules:
        return sys.modules[full]
    if "open_clip" in sys.modules:
        return importlib.import_module(full)
    spec = importlib.util.find_spec("open_clip")
    package = importlib.util.module_from_spec(spec)  # the package, its __init__ not run yet

    def complete(name: str):  # the first name the parts do not define: open_clip's __init__ runs, in place
        del package.__dict__["__getattr__"]
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = complete
    sys.modules["open_clip"] = package
    return importlib.import_module(full)


def _is_plain(cfg: dict, keys: set, required: set) -> bool:
    return set(cfg) <= keys and required <= set(cfg)


def build_vision_tower(embed_dim: int, vision_cfg: dict, quick_gelu: bool):
    """open_clip.model._build_vision_tower(embed_dim, vision_cfg, quick_gelu, None)."""
    cfg = dict(vision_cfg)
    resnet = isinstance(cfg.get("layers"), (tuple, list))
    keys, required = (PLAIN_RESNET, PLAIN_RESNET) if resnet else (PLAIN_VISION, PLAIN_VISION - {"mlp_ratio"})
    if not _is_plain(cfg, keys, required):
        from open_clip.model import _build_vision_tower

        return _build_vision_tower(embed_dim, vision_cfg, quick_gelu, None)
    if resnet:
        return part("modified_resnet").ModifiedResNet(layers=cfg["layers"], output_dim=embed_dim, heads=cfg["width"] * 32 // cfg["head_width"],
                                                      image_size=cfg["image_size"], width=cfg["width"])
    t = part("transformer")
    heads = cfg["width"] // cfg.pop("head_width")
    return t.VisionTransformer(heads=heads, mlp_ratio=cfg.pop("mlp_ratio", 4.0), output_dim=embed_dim,
                               act_layer=t.QuickGELU if quick_gelu else t.nn.GELU, norm_layer=t.LayerNorm, **cfg)


def build_text_tower(embed_dim: int, text_cfg: dict, quick_gelu: bool):
    """open_clip.model._build_text_tower(embed_dim, text_cfg, quick_gelu, None)."""
    if not _is_plain(text_cfg, PLAIN_TEXT, set()):
        from open_clip.model import _build_text_tower

        return _build_text_tower(embed_dim, text_cfg, quick_gelu, None)
    t = part("transformer")
    return t.TextTransformer(output_dim=embed_dim, act_layer=t.QuickGELU if quick_gelu else t.nn.GELU, norm_layer=t.LayerNorm, **text_cfg)

