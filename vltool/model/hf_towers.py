"""The Hugging Face towers: a transformers text encoder (`--text-tower hf:DIR`), and the two towers of a whole
Hugging Face `CLIPModel` / `SiglipModel` (`hf_dual`), built from transformers' own modules.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from vltool.errors import UsageError


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
