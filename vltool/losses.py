"""Training objectives. A loss is an `nn.Module` with its own parameters and state (memory banks, EMA
encoders, learned biases), saved in checkpoints with its `state_dict`.

The contract, so that N processes train as one:
- The trainer gathers the features of every process (`gather_keep_grad`: the local rows keep their
  gradient, the others are constants) and hands the loss the whole global batch in `LossInput`, in the
  order a single process with batch N*B would see it. A loss is written as if it ran in one process.
- Every process computes the same global loss. The trainer sums the tower gradients over processes
  (each process holds the gradient through its own rows) and keeps the gradient of parameters that see
  the whole batch (the logit scale, the loss's own parameters) as it is, since each process already
  has all of it. A loss whose parameters act on local features before the gather would break this rule.
- A loss declares its logit-scale default (init multiplier, learnable or fixed) and the extra columns
  it needs (e.g. `label`), which the trainer gathers like the features.

Register a loss with `@register_loss("name")`; `--loss NAME` builds it with `build_loss`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from vltool.errors import UsageError


@dataclass
class LossInput:
    """The global batch a loss sees (every process sees the same)."""

    image_features: torch.Tensor  # (N, D) L2-normalised, global batch; only local rows carry gradient
    text_features: torch.Tensor  # (N, D)
    logit_scale: torch.Tensor  # () the multiplier exp(log scale), with gradient when learnable
    logit_bias: torch.Tensor | None = None  # () when the model has one
    extra: dict = field(default_factory=dict)  # gathered columns the loss asked for, e.g. "label": (N,)
    local_slice: slice = field(default_factory=lambda: slice(None))  # rows of this process in the global batch


class Loss(nn.Module):
    """Base class of vltool's training objectives."""

    name: ClassVar[str] = ""
    logit_scale_init: ClassVar[float] = 1 / 0.07  # default initial multiplier of a new model
    logit_scale_learnable: ClassVar[bool] = True
    needs: ClassVar[tuple[str, ...]] = ()  # extra columns to gather, e.g. ("label",)

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        """Returns {"loss": scalar, ...other scalar metrics to log}."""
        raise NotImplementedError


LOSSES: dict[str, type[Loss]] = {}


def register_loss(name: str):
    def deco(cls: type[Loss]) -> type[Loss]:
        cls.name = name
        LOSSES[name] = cls
        return cls

    return deco


def build_loss(name: str, **kwargs) -> Loss:
    if name not in LOSSES:
        raise UsageError(f"--loss {name!r}: unknown loss; available: {', '.join(sorted(LOSSES))}")
    return LOSSES[name](**kwargs)


@register_loss("clip")
class ClipLoss(Loss):
    """CLIP's symmetric InfoNCE over the global batch (Radford et al. 2021, Figure 3).

    logits = s * img @ txt.T; the i-th image and i-th text are the positive pair; the loss is the mean
    of the image->text and text->image cross-entropies.
    """

    logit_scale_init = 1 / 0.07
    logit_scale_learnable = True

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        img, txt = batch.image_features, batch.text_features
        logits = batch.logit_scale * img @ txt.T  # (N_img, N_txt)
        if batch.logit_bias is not None:
            logits = logits + batch.logit_bias
        labels = torch.arange(logits.shape[0], device=logits.device)
        loss_i2t = F.cross_entropy(logits.float(), labels)
        loss_t2i = F.cross_entropy(logits.float().T, labels)
        with torch.no_grad():
            acc = (logits.argmax(1) == labels).float().mean()
        return {"loss": (loss_i2t + loss_t2i) / 2, "acc_i2t": acc}


def clip_loss_reference(img: torch.Tensor, txt: torch.Tensor, scale: float) -> float:
    """The same loss by explicit sums over pairs (for tests)."""
    n = img.shape[0]
    sims = [[scale * float(img[i] @ txt[j]) for j in range(n)] for i in range(n)]
    i2t = sum(-sims[i][i] + math.log(sum(math.exp(s) for s in sims[i])) for i in range(n)) / n
    t2i = sum(-sims[j][j] + math.log(sum(math.exp(sims[i][j]) for i in range(n))) for j in range(n)) / n
    return (i2t + t2i) / 2


def gather_keep_grad(x: torch.Tensor) -> tuple[torch.Tensor, slice]:
    """All processes' `x` concatenated in rank order, and the rows of this process.

    The local rows keep their gradient; the others are constants. Local batch sizes may differ (rows
    skipped for bad images): sizes are exchanged first and the tensors padded to the largest. With one
    process `x` is returned unchanged.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, slice(0, x.shape[0])
    world, rank = dist.get_world_size(), dist.get_rank()
    n = torch.tensor([x.shape[0]], device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    sizes = [int(s) for s in sizes]
    pad = max(sizes)
    xp = x.detach()
    if x.shape[0] < pad:
        xp = torch.cat([xp, xp.new_zeros((pad - x.shape[0], *x.shape[1:]))])
    parts = [torch.empty_like(xp) for _ in range(world)]
    dist.all_gather(parts, xp.contiguous())
    parts = [p[:s] for p, s in zip(parts, sizes)]
    parts[rank] = x  # the local part, with its gradient
    start = sum(sizes[:rank])
    return torch.cat(parts), slice(start, start + sizes[rank])
