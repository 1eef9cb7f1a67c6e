"""Freezing, train mode, parameter groups, the optimizer, gradient sums over processes, the schedule."""

from __future__ import annotations

import math

import torch

from vltool.errors import UsageError, VltoolError
from vltool.pretrain.config import PretrainConfig


def _freeze(modules) -> None:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(False)


def _unfreeze(modules) -> None:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(True)


def apply_freezing(model, config: PretrainConfig) -> dict:
    """Freeze towers as asked; return which parts are wholly frozen."""
    def lock(tower, last: int, blocks, head, side: str) -> None:
        _freeze([tower])
        if last:
            blocks = blocks()
            if last > len(blocks):
                raise UsageError(f"--unfreeze-{side}-last {last}: the {side} tower has {len(blocks)} blocks")
            _unfreeze(blocks[-last:] + head())
            for p in model.open_clip_projection_params():  # an open_clip tower's projection trains with its last blocks
                if any(p is q for q in tower.parameters()):
                    p.requires_grad_(True)

    if config.lock_image:
        lock(model.visual, config.unfreeze_image_last, model.image_blocks, model.image_head, "image")
    if config.lock_text:
        lock(model.text, config.unfreeze_text_last, model.text_blocks, model.text_head, "text")
    return {
        "image": not any(p.requires_grad for p in model.visual.parameters()),
        "text": not any(p.requires_grad for p in model.text.parameters()),
    }


def set_train_mode(model) -> None:
    """model.train(), with frozen parts in eval mode (BatchNorm statistics and dropout of frozen parts fixed)."""
    model.train()
    for tower in (model.visual, model.text):
        params = list(tower.parameters())
        if params and not any(p.requires_grad for p in params):
            tower.eval()
            continue
        for m in tower.modules():
            ps = list(m.parameters())
            if ps and not any(p.requires_grad for p in ps):
                m.eval()


def param_groups(named_params, weight_decay: float) -> list[dict]:
    """AdamW groups: no decay for gains, biases (1-d tensors) and the logit scale / bias."""
    decay, no_decay = [], []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        if p.ndim < 2 or "logit_scale" in name or "logit_bias" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def sum_gradients(params) -> None:
    """All-reduce (sum) the gradients of parameters each process only sees through its own rows."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:  # e.g. a process whose micro-batch was all bad images
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch._utils._flatten_dense_tensors([p.grad for p in params])
    dist.all_reduce(flat)
    for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, [p.grad for p in params])):
        p.grad.copy_(g)


def lr_at(step: int, total: int, config: PretrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to min_lr or constant."""
    if config.warmup_steps and step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return config.lr
    span = max(1, total - config.warmup_steps)
    t = min(1.0, (step - config.warmup_steps) / span)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * t))


def build_optimizer(model, loss, config: PretrainConfig):
    """AdamW or SGD over the trainable parameters of the model and the loss; (optimizer, trainable params)."""
    named = list(model.named_parameters()) + [(f"loss.{n}", p) for n, p in loss.named_parameters()]
    groups = param_groups(named, config.weight_decay)
    # torch picks the per-tensor loop on CPU; the multi-tensor (foreach) update is the same arithmetic in
    # a few fused calls, and on CPU it saves a Python loop over every parameter at every step.
    if config.optimizer == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, foreach=True)
    else:
        optimizer = torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, foreach=True)
    trainable = [p for g in groups for p in g["params"]]
    if not any(p.requires_grad for p in trainable):
        raise VltoolError("nothing to train: every parameter is frozen (both towers locked, and this model has no "
                          "projections of its own outside them); unlock a tower or its last blocks (--unfreeze-*-last)")
    return optimizer, trainable


def local_parameters(model) -> list:
    """Parameters whose gradient each process holds only through its own rows (summed over processes).
    The others see the whole global batch in every process: the logit scale and bias, the critic
    projections (applied to the gathered batch, so their BatchNorm sees all of it), the loss's own."""
    return [p for n, p in model.named_parameters()
            if n not in ("logit_scale", "logit_bias") and not n.startswith(("image_critic.", "text_critic.")) and p.requires_grad]
