"""The architecture: `TwoTower` (image tower -> projection, text tower -> projection, a logit scale and bias) and
CLIP-Lite's critic head (`CriticProjection`). Which tower a config names is built here; the towers live in
torchvision_tower.py, hf_towers.py and open_clip.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F

from vltool.errors import UsageError, VltoolError
from vltool.model.checkpointing import set_sequential_checkpointing
from vltool.model.format import LOGIT_SCALE_MAX
from vltool.model.hf_towers import HF_DUAL, HFDualTower, HFTextTower, build_hf_dual
from vltool.model.torchvision_tower import TorchvisionTower


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
            from vltool.open_clip_parts import build_vision_tower

            self.visual = build_vision_tower(d, it["vision_cfg"], quick_gelu)
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
            from vltool.open_clip_parts import build_text_tower

            self.text = build_text_tower(d, tt["text_cfg"], quick_gelu)
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
