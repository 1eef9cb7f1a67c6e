"""Gradient checkpointing of a tower's blocks (activations recomputed in the backward pass), with BatchNorm
running statistics left as the plain forward leaves them.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.utils.checkpoint
from torch import nn

from vltool.errors import UsageError


def _bn_buffers(module: nn.Module) -> list[torch.Tensor]:
    return [b for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for b in m.buffers()]


class batchnorm_stats_kept:
    """Context: BatchNorm running statistics (and batch counts) of `module` are as before on exit, whatever
    forward passes ran inside (a recomputation for gradient checkpointing, gradient caching's first pass)."""

    def __init__(self, module: nn.Module):
        self.buffers = _bn_buffers(module)

    def __enter__(self):
        self.saved = [b.clone() for b in self.buffers]
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for b, s in zip(self.buffers, self.saved):
                b.copy_(s)
        return False


def _checkpointed(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """module(x) whose activations are recomputed in the backward pass (the RNG state is replayed, and the
    recomputation leaves BatchNorm running statistics alone, so the result is the plain forward's)."""
    calls = []

    def run(inp):
        calls.append(1)
        if len(calls) == 1:
            return module(inp)
        with batchnorm_stats_kept(module):
            return module(inp)

    return torch.utils.checkpoint.checkpoint(run, x, use_reentrant=False)


class CheckpointedSequential(nn.Sequential):
    """nn.Sequential whose children each keep only their input for the backward pass while gradients are
    being recorded. Set as the __class__ of an existing Sequential, so state-dict keys do not change."""

    def forward(self, x):
        if not torch.is_grad_enabled():
            return super().forward(x)
        for m in self:
            x = _checkpointed(m, x)
        return x


def set_sequential_checkpointing(seqs: Sequence[nn.Module], enable: bool) -> None:
    for s in seqs:
        if type(s) not in (nn.Sequential, CheckpointedSequential):
            raise UsageError(f"--grad-checkpointing: {type(s).__name__} is not a sequence of blocks vltool can checkpoint")
        s.__class__ = CheckpointedSequential if enable else nn.Sequential
