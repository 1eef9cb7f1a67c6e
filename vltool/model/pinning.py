"""What names a model's exact weights: the weight fingerprint (config and every tensor), and a Hub id pinned to
the commit it resolved to (so a resumed run reads what it started from).
"""

from __future__ import annotations

import hashlib
import json

import torch
from torch import nn

from vltool import hub
from vltool.hub import HF_SPEC


def fingerprint(model: nn.Module, config: dict) -> str:
    """SHA-256 of the config and of every tensor of the state dict (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:32]


def pinned_spec(spec: str, revision: dict | None) -> str:
    """A Hub id pinned to the commit it resolved to: hf:ORG/NAME, or its @BRANCH / @TAG, becomes
    hf:ORG/NAME@COMMIT (likewise open_clip:hf-hub:), so a resumed run reads the weights, tokenizer and
    processor it started from even after the branch or tag has moved."""
    s = str(spec)
    commit = (revision or {}).get("commit")
    if not commit or "tag" in (revision or {}):  # (an open_clip tag: its file's sha256 names the weights)
        return s
    if (s.startswith(HF_SPEC) and hub.is_hub_id(s)) or s.startswith(hub.OPEN_CLIP_SPEC + hub.HF_HUB_PREFIX):
        return f"{s.partition('@')[0]}@{commit}"
    return s
