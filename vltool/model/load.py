"""Any model spelling -> a model: `build_from_spec` dispatches to the sources (a vltool RUN_DIR, open_clip,
Hugging Face), `load_model` gives a `LoadedModel` ready to encode, `check_init` checks `pretrain --init`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from vltool import hub
from vltool.errors import UsageError
from vltool.hub import HF_SPEC
from vltool.model.architecture import TwoTower
from vltool.model.configs import CONFIGS_DIR, arch_config
from vltool.model.hf_source import _hf_dual_class_of, hf_dual_dir, hf_processors, load_hf_dual
from vltool.model.model_dir import read_model_dir, resolve_model_dir
from vltool.model.open_clip_source import OPEN_CLIP_SPELLINGS, _local_dir, _open_clip_arch, _open_clip_hub, open_clip_native_reasons
from vltool.model.pinning import fingerprint
from vltool.model.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    """A model ready to encode: see the docstring of the vltool.model package."""

    model: TwoTower
    preprocess: Callable  # PIL.Image -> (3,H,W) float tensor, deterministic
    tokenizer: Tokenizer = field(repr=False)
    config: dict = field(repr=False)
    fingerprint: str = ""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    source: str = ""  # what was loaded
    revision: dict = field(default_factory=dict)  # which exact weights (a Hub commit, an open_clip tag's file and sha256)

    def tokenize(self, texts: Sequence[str]):
        return self.tokenizer(texts)

    @torch.no_grad()
    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(images.to(self.device), normalize=True).float()  # (B, D)

    @torch.no_grad()
    def encode_text(self, tokens) -> torch.Tensor:
        return self.model.encode_text(to_device(tokens, self.device), normalize=True).float()  # (B, D)

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())

    @torch.no_grad()
    def logits(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """(N, D) and (T, D) normalised embeddings -> (N, T) logits: the model's own scale times the cosine
        similarity, plus its bias when it has one (SigLIP), in transformers' order of operations."""
        logits = text_emb.to(self.device) @ image_emb.to(self.device).T * self.model.logit_scale.detach().exp()  # (T, N)
        if self.model.logit_bias is not None:
            logits = logits + self.model.logit_bias.detach()
        return logits.T.float()  # (N, T)

    def train_transform(self, augment: str):
        from vltool.transforms import train_transform

        return train_transform(self.config["preprocess"], augment)


def to_device(tokens, device):
    """Tokens (a tensor, or a dict of tensors) on `device`; to a GPU asynchronously (from pinned memory)."""
    nb = torch.device(device).type == "cuda"
    if isinstance(tokens, dict):
        return {k: v.to(device, non_blocking=nb) for k, v in tokens.items()}
    return tokens.to(device, non_blocking=nb)


def _finish(model: TwoTower, tokenizer: Tokenizer, device, source: str, revision: dict | None = None) -> LoadedModel:
    from vltool.transforms import eval_transform

    device = torch.device(device)
    model.to(device).eval()
    return LoadedModel(
        model=model,
        preprocess=eval_transform(model.config["preprocess"]),
        tokenizer=tokenizer,
        config=model.config,
        fingerprint=fingerprint(model, model.config),
        device=device,
        source=source,
        revision=revision or {},
    )


def build_from_spec(spec: str | Path, pretrained: str | Path | None = None) -> tuple[TwoTower, Tokenizer, dict, str]:
    """Any model spelling -> (model on CPU, tokenizer, revision, source): what `load_model` loads and what
    `pretrain --init` starts from. `revision` names the exact weights for provenance ({} for a local model,
    whose weight fingerprint names them)."""
    s = str(spec)
    if s.startswith(hub.OPEN_CLIP_SPEC + hub.HF_HUB_PREFIX):
        if pretrained is not None:
            raise UsageError(f"--pretrained applies to open_clip:ARCH only ({s} holds its own weights)")
        return (*_open_clip_hub(s), s)
    if s.startswith(hub.OPEN_CLIP_SPEC):
        return (*_open_clip_arch(s, pretrained), s)
    if pretrained is not None:
        raise UsageError(f"--pretrained applies to open_clip:ARCH models only ({s} holds its own weights)")
    if s.startswith(hub.LOCAL_DIR_SPEC):
        return (*_local_dir(s), s)
    if s.startswith(HF_SPEC):
        return (*load_hf_dual(s), s)
    model_dir = resolve_model_dir(s)
    model, tok = read_model_dir(model_dir)
    return model, tok, {}, str(model_dir)


INIT_SPELLINGS = f"a vltool RUN_DIR (or RUN_DIR/model), hf:DIR, hf:ORG/NAME[@REVISION], {OPEN_CLIP_SPELLINGS} or local-dir:PATH"


def check_init(spec: str) -> dict:
    """`pretrain --init SPEC`, checked (and fetched, for a Hub id) before RUN_DIR is made: its revision.
    The weights themselves are read when the model is built (build_from_spec)."""
    s = str(spec)
    if s.startswith(HF_SPEC):
        path, revision = hf_dual_dir(s)  # (resolved once: a Hub id is looked up once)
        _hf_dual_class_of(s, path)
        hf_processors(s, path)
        return revision
    if s.startswith(hub.OPEN_CLIP_SPEC + hub.HF_HUB_PREFIX):
        config = hub.open_clip_hub_config(s)
        _refuse_native_init(s, s, open_clip_native_reasons(config.model_cfg))  # (before its weights are fetched)
        return hub.resolve_open_clip_hub(s, config).revision
    if s.startswith(hub.OPEN_CLIP_SPEC):
        arch, _, weights = s[len(hub.OPEN_CLIP_SPEC):].partition("/")
        if not weights:
            raise UsageError(f"--init {s}: name the weights to start from, open_clip:{arch}/TAG (open_clip's pretrained tag) or "
                             f"open_clip:{arch}/FILE; for fresh weights give --arch {arch} instead of --init")
        why = open_clip_native_reasons(arch_config(arch, f"--init {s}")) if not (CONFIGS_DIR / f"{arch}.json").is_file() else []
        _refuse_native_init(s, arch, why)  # (refused before any weights are fetched)
        return _open_clip_arch(s, None)[2]  # the tag or file resolved, and the weights checked to fit the architecture
    if s.startswith(hub.LOCAL_DIR_SPEC):
        from vltool.checks import read_json

        cfg_file = Path(s.partition(":")[2]).expanduser() / hub.OPEN_CLIP_CONFIG
        model_cfg = read_json(cfg_file, s + ":").get("model_cfg") if cfg_file.is_file() else None
        _refuse_native_init(s, s, open_clip_native_reasons(model_cfg) if isinstance(model_cfg, dict) else [])
        _local_dir(s)
        return {}
    resolve_model_dir(s)
    return {}


def _refuse_native_init(spec: str, what: str, why: list[str]) -> None:
    """`pretrain --init` of a model that runs as open_clip's own model: refused in one line."""
    if why:
        raise UsageError(f"--init {spec}: vltool evaluates {what} as open_clip's own model ({', '.join(why)}) but does not "
                         "fine-tune it; evaluate it with --model, or start from an architecture vltool rebuilds "
                         "(docs/models.md lists them)")


def load_model(spec: str | Path, pretrained: str | Path | None = None, device: str | torch.device = "cpu") -> LoadedModel:
    """Load a model for encoding.

    spec: a vltool RUN_DIR or RUN_DIR/model; open_clip:ARCH (weights from `pretrained`, a tag or a local
    file, or fresh weights when it is None), open_clip:ARCH/TAG, open_clip:ARCH/FILE,
    open_clip:hf-hub:ORG/NAME; local-dir:PATH (open_clip's local-dir layout); or hf:DIR / hf:ORG/NAME[@REV]
    (a Hugging Face CLIPModel / SiglipModel with its processor). Hub files come through vltool.hub.
    """
    model, tok, revision, source = build_from_spec(spec, pretrained)
    return _finish(model, tok, device, source, revision)
