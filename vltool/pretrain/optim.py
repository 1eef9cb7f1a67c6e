"""Freezing, train mode, parameter groups, the optimizer, gradient sums over processes (overlapping the
backward pass: GradientSync), the schedule."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from vltool.errors import UsageError, VltoolError
from vltool.model.hf_towers import HFDualTower
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
    if config.lock_image and config.lock_text and not (config.unfreeze_image_last or config.unfreeze_text_last):
        # Both towers locked: the projections train, as they do for two towers (whose projections live outside
        # them, LiT-style). A whole CLIP's projections live inside its towers; locked with them, only the
        # logit scale would train (issue 39).
        inner = tower_projections(model)
        for p in inner:
            p.requires_grad_(True)
        model.projections_apart = bool(inner)  # the locked trunks' features stop before them (and can be cached)
        only = [n for n, p in model.named_parameters() if p.requires_grad]
        if only and all(n in ("logit_scale", "logit_bias") for n in only):
            raise UsageError("--lock-image --lock-text: this model has no projections outside its towers' blocks, so only "
                             "the logit scale would train; unfreeze the last blocks of a tower (--unfreeze-image-last N) "
                             "or leave a tower unlocked")
    apart = {id(p) for p in tower_projections(model)} if getattr(model, "projections_apart", False) else set()
    return {  # wholly frozen trunks (a whole CLIP's projection trained apart from its locked tower does not count)
        "image": not any(p.requires_grad for p in model.visual.parameters() if id(p) not in apart),
        "text": not any(p.requires_grad for p in model.text.parameters() if id(p) not in apart),
    }


def tower_projections(model) -> list:
    """The projections that live inside a whole CLIP's towers (open_clip's proj / text_projection, a Hugging
    Face CLIPModel's visual_projection / text_projection); none for two towers, whose projections are outside."""
    out = list(model.open_clip_projection_params())
    for tower in (model.visual, model.text):
        if isinstance(tower, HFDualTower):
            out.extend(tower.proj.parameters())
    return out


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


class GradientSync:
    """Sums the gradients of `params` over processes while the backward pass runs (DDP's overlap, with
    DDP's bucketing, but a sum instead of a mean: the loss is already that of the global batch).

    Each parameter's gradient is copied into its bucket (about `bucket_mb` MB of parameters, in reverse
    registration order, which is roughly the order the backward pass produces them) by a post-accumulate
    hook; a bucket whose gradients are all there is all-reduced asynchronously, and buckets are launched in
    index order, so every process issues the same collectives in the same order. `arm()` before the last
    backward pass of a step (with gradient caching, the earlier passes only accumulate), `finish()` after
    it: what was not launched yet (a parameter without a gradient in this pass: zeros if it has none at
    all) is reduced, every reduction is waited for and copied back. With one process it does nothing."""

    def __init__(self, params, bucket_mb: float = 25.0):
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.params = [p for p in params if p.requires_grad]
        self.buckets: list[list] = []
        self.armed, self.handles, self.hooks = False, [], []
        if self.world == 1 or not self.params:
            return
        cap, size = bucket_mb * 2**20, 0.0
        for p in reversed(self.params):
            nbytes = p.numel() * p.element_size()
            if not self.buckets or size + nbytes > cap:
                self.buckets.append([])
                size = 0.0
            self.buckets[-1].append(p)
            size += nbytes
        self.bucket_of = {id(p): b for b, ps in enumerate(self.buckets) for p in ps}
        self.hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]

    def arm(self) -> None:
        """The next backward pass is the step's last: reduce gradients as they become ready."""
        if not self.buckets:
            return
        self.armed, self.handles, self.next = True, [], 0
        self.waiting = [len(b) for b in self.buckets]

    def _ready(self, p) -> None:
        if not self.armed:
            return
        self.waiting[self.bucket_of[id(p)]] -= 1
        while self.next < len(self.buckets) and self.waiting[self.next] == 0:
            self._launch(self.next)

    def _launch(self, b: int) -> None:
        ps = self.buckets[b]
        flat = torch._utils._flatten_dense_tensors([p.grad if p.grad is not None else torch.zeros_like(p) for p in ps])
        self.handles.append((b, flat, dist.all_reduce(flat, async_op=True)))
        self.next = b + 1

    def finish(self) -> None:
        """Reduce what is left, wait for every reduction, and write the sums back into the gradients."""
        if not self.buckets:
            return
        if not self.armed:
            self.arm()
        while self.next < len(self.buckets):
            self._launch(self.next)
        for b, flat, handle in self.handles:
            handle.wait()
            ps = self.buckets[b]
            for p, g in zip(ps, torch._utils._unflatten_dense_tensors(flat, ps)):
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
        self.armed, self.handles = False, []

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []


def lr_at(step: int, total: int, config: PretrainConfig) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warmup, then cosine to min_lr or constant."""
    if config.warmup_steps and step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return config.lr
    span = max(1, total - config.warmup_steps)
    t = min(1.0, (step - config.warmup_steps) / span)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * t))


def optimizer_impl(device) -> str:
    """AdamW's implementation: torch's fused kernel (one pass over each tensor) on CUDA and CPU, where it is
    ~6x faster than the multi-tensor one (the same update up to float rounding); foreach elsewhere."""
    return "fused" if torch.device(device).type in ("cuda", "cpu") else "foreach"


def build_optimizer(model, loss, config: PretrainConfig, device=None):
    """AdamW or SGD over the trainable parameters of the model and the loss; (optimizer, trainable params)."""
    named = list(model.named_parameters()) + [(f"loss.{n}", p) for n, p in loss.named_parameters()]
    groups = param_groups(named, config.weight_decay)
    # torch picks the per-tensor loop on CPU; AdamW's fused kernel does the whole update in one pass over
    # each tensor (on CPU ~6x faster than the multi-tensor update, which SGD keeps).
    impl = optimizer_impl(device if device is not None else next(model.parameters()).device)
    if config.optimizer == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, **{impl: True})
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
