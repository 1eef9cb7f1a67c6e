"""open_clip's models as vltool loads them: `open_clip:ARCH[/TAG or /FILE]` (a pretrained tag resolved through
vltool.hub), `open_clip:hf-hub:ORG/NAME` and `local-dir:PATH`, rebuilt on vltool's towers; and the architectures
vltool does not rebuild, run as open_clip's own model (`OpenClipModel`), with what decides which.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
from torch import nn

from vltool import hub
from vltool.checks import read_json
from vltool.errors import UsageError, VltoolError
from vltool.model.architecture import TwoTower
from vltool.model.configs import CONFIGS_DIR, arch_config, config_from_open_clip, open_clip_native_reasons
from vltool.model.format import FORMAT, FORMAT_VERSION, OPEN_CLIP_CONFIG
from vltool.model.tokenizer import OpenClipTokenizer, Tokenizer, _first_line, _tokenizer_problem, source_tokenizer


def open_clip_cannot_run(model_cfg: dict) -> str | None:
    """Why open_clip's own model of this architecture cannot be built here (a timm image tower the installed
    timm does not have), or None: read from the config alone, before any weights are fetched."""
    name = model_cfg.get("vision_cfg", {}).get("timm_model_name")
    if name:
        import timm

        if not timm.is_model(name):
            return f"its image tower is the timm model {name!r}, which timm {timm.__version__} does not have (upgrade timm)"
    return None


def open_clip_tag_support(arch: str, tag: str) -> tuple[str, str]:
    """How vltool runs open_clip's pretrained tag ARCH/TAG, from the registry alone (nothing fetched):
    ("rebuilt", "") on vltool's own towers; ("open_clip", why) as open_clip's own model; ("refused", why)."""
    import open_clip

    cfg = arch_config(arch)
    why = open_clip_cannot_run(cfg)
    if why:
        return "refused", why
    if not (open_clip.get_pretrained_cfg(arch, tag) or {}).get("hf_hub"):
        return "refused", "open_clip has no Hugging Face Hub copy of its weights"
    native = open_clip_native_reasons(cfg) if not (CONFIGS_DIR / f"{arch}.json").is_file() else []
    return ("open_clip", ", ".join(native)) if native else ("rebuilt", "")


class OpenClipModel(nn.Module):
    """open_clip's own model (open_clip.create_model) for an architecture vltool does not rebuild (SigLIP
    with its Hugging Face tokenizer, timm image towers, CoCa's contrastive towers, Hugging Face text towers):
    the embeddings, logit scale and bias are open_clip's, exactly. `config` is a vltool config describing
    it (its preprocessing is the model's own `visual.preprocess_cfg`, as create_model_and_transforms reads it)."""

    def __init__(self, model: nn.Module, config: dict):
        super().__init__()
        self.oc = model
        self.config = config

    @property
    def visual(self):
        return self.oc.visual

    @property
    def logit_scale(self):
        return self.oc.logit_scale

    @property
    def logit_bias(self):
        return getattr(self.oc, "logit_bias", None)

    def encode_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        return self.oc.encode_image(images, normalize=normalize)

    def encode_text(self, tokens, normalize: bool = True) -> torch.Tensor:
        return self.oc.encode_text(tokens, normalize=normalize)


def _from_open_clip_cfg(model_cfg: dict, preprocess_cfg: dict | None, checkpoint: str | None, what: str) -> tuple[TwoTower, Tokenizer]:
    config = config_from_open_clip(model_cfg, preprocess_cfg, arch=what)
    if model_cfg.get("init_logit_scale") is not None:
        config["logit_scale"]["init"] = float(math.exp(model_cfg["init_logit_scale"]))
    model = TwoTower(config)
    if checkpoint:
        from open_clip.factory import load_checkpoint

        try:
            load_checkpoint(model, checkpoint, strict=True, weights_only=True)
        except Exception as e:
            raise VltoolError(f"cannot load open_clip weights {checkpoint} into {what}: {e}") from None
    return model, source_tokenizer(config)


OPEN_CLIP_SPELLINGS = "open_clip:ARCH/TAG, open_clip:ARCH/FILE, open_clip:hf-hub:ORG/NAME"


def _open_clip_arch(spec: str, pretrained: str | Path | None) -> tuple[TwoTower, Tokenizer, dict]:
    """open_clip:ARCH[/TAG or /FILE] (or --pretrained TAG or FILE): open_clip's architecture with the weights
    its pretrained tag names (from the Hub, through huggingface_hub's cache), a local file, or fresh weights."""
    arch, _, weights = spec[len(hub.OPEN_CLIP_SPEC):].partition("/")
    if weights and pretrained is not None:
        raise UsageError(f"--pretrained {pretrained}: {spec} names its weights already")
    if pretrained is not None and not str(pretrained).strip():  # never fresh weights by accident
        raise UsageError("--pretrained is empty: give an open_clip tag or a weights file (fresh weights: leave it out)")
    weights = weights or (str(pretrained) if pretrained is not None else "")
    if not arch.strip():
        raise UsageError(f"{spec!r} names no architecture; expected {OPEN_CLIP_SPELLINGS}, e.g. open_clip:ViT-B-32/openai")
    cfg = arch_config(arch, spec)
    preprocess_cfg, revision, checkpoint = cfg.get("preprocess_cfg"), {}, None
    tag = hub.open_clip_tag(f"{hub.OPEN_CLIP_SPEC}{arch}/{weights}") if weights else None
    native = open_clip_native_reasons(cfg) and not (CONFIGS_DIR / f"{arch}.json").is_file()
    if native:  # everything but the weights is checked and resolved before any weights are fetched
        why = open_clip_cannot_run(cfg)
        if why:
            raise UsageError(f"{spec}: {why}; nothing was fetched (docs/models.md lists the open_clip tags vltool runs)")
        tokenizer = _open_clip_native_tokenizer(spec, arch, cfg)
    if tag is not None:
        found = hub.resolve_open_clip_tag(spec, arch, weights, cfg)
        preprocess_cfg = {**(preprocess_cfg or {}), **found.preprocess_cfg}
        checkpoint, revision = str(found.path), found.revision
        tag_quick_gelu = bool(open_clip_pretrained_cfg(arch, weights).get("quick_gelu", False))
        if tag_quick_gelu != bool(cfg.get("quick_gelu", False)):  # open_clip's own warning, as create_model gives it
            warnings.warn(f"QuickGELU mismatch between {arch} (quick_gelu={bool(cfg.get('quick_gelu', False))}) and pretrained "
                          f"tag {weights!r} (quick_gelu={tag_quick_gelu}); use {arch}-quickgelu as open_clip advises", UserWarning)
    elif weights:
        path = Path(weights).expanduser()
        if not path.is_file():
            import open_clip

            tags = open_clip.list_pretrained_tags_by_model(arch)
            raise UsageError(f"{spec if '/' in spec else '--pretrained ' + weights}: no such file {weights!r}, nor an open_clip tag of "
                             f"{arch} (its tags: {', '.join(tags) or 'none'})")
        checkpoint, revision = str(path), {"arch": arch, "file": str(path), "sha256": hub.file_sha256(path)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # fresh weights are the same at every load (so is the fingerprint)
        if native:
            tag_cfg = open_clip_pretrained_cfg(arch, weights) if tag is not None else {}
            model = _open_clip_native_model(spec, arch, cfg, checkpoint, tag_cfg, tokenizer)
            return model, tokenizer, revision
        try:
            model, tok = _from_open_clip_cfg(cfg, preprocess_cfg, checkpoint, arch)
        except VltoolError as e:
            if tag is not None:
                raise
            import open_clip

            tags = ", ".join(open_clip.list_pretrained_tags_by_model(arch)) or "none"
            raise UsageError(f"{spec if '/' in spec else '--pretrained ' + weights}: {e}; give a weights file open_clip saved for "
                             f"{arch}, or one of its pretrained tags ({tags})") from None
    return model, tok, revision


def _open_clip_native_tokenizer(spec: str, arch: str, cfg: dict) -> OpenClipTokenizer:
    """open_clip.get_tokenizer(arch), its Hugging Face tokenizer read from the folder vltool.hub resolves
    (huggingface_hub's cache; fetched when online): what open_clip reads, found the way every Hub file is."""
    import open_clip
    from open_clip.tokenizer import DEFAULT_CONTEXT_LENGTH, HFTokenizer

    text_cfg = cfg.get("text_cfg", {})
    context = int(text_cfg.get("context_length", DEFAULT_CONTEXT_LENGTH))
    kwargs = dict(text_cfg.get("tokenizer_kwargs") or {})
    name = text_cfg.get("hf_tokenizer_name") or ""
    tc = {"type": "open_clip_native", "arch": arch, "context_length": context, "kwargs": kwargs,
          "hf_tokenizer": name or None, "tokenizer_mode": text_cfg.get("tokenizer_mode")}
    if not name:
        import open_clip.tokenizer as tk

        return OpenClipTokenizer(tc, Path(tk.default_bpe()), open_clip.get_tokenizer(arch))
    repo = hub.parse_repo_id(name)
    if repo is None:
        raise UsageError(f"{spec}: open_clip names the tokenizer {name!r}, which is not a Hub id ORG/NAME")
    path = hub.hub_snapshot(spec, repo[0], repo[1], allow=["*.json", "*.txt", "*.model"], ignore=hub.HF_IGNORE)
    tc["hf_tokenizer_commit"] = hub.commit_of(path)
    try:
        tok = HFTokenizer(str(path), context_length=context, tokenizer_mode=text_cfg.get("tokenizer_mode"), **kwargs)
    except Exception as e:
        raise UsageError(f"{spec}: cannot load open_clip's tokenizer {name} from {path} ({_tokenizer_problem(path, e)})") from None
    return OpenClipTokenizer(tc, path, tok)


def _open_clip_native_model(spec: str, arch: str, cfg: dict, checkpoint: str | None, tag_cfg: dict, tokenizer) -> "OpenClipModel":
    """open_clip.create_model(arch) with the weights file, and the preprocessing the tag merges in, as
    create_model_and_transforms(arch, pretrained=TAG) builds them."""
    import open_clip

    try:
        oc = open_clip.create_model(arch, pretrained=checkpoint, force_preprocess_cfg=hub.tag_preprocess(tag_cfg) or None)
    except Exception as e:
        raise VltoolError(f"{spec}: open_clip cannot build it with {checkpoint or 'fresh weights'}: {_first_line(e)}") from None
    pp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(oc.visual.preprocess_cfg).items()}
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arch": arch,
        "embed_dim": int(cfg["embed_dim"]),
        "open_clip_native": {"arch": arch, "model_cfg": cfg, "why": open_clip_native_reasons(cfg)},
        "image_tower": {"type": "open_clip_native"},
        "text_tower": {"type": "open_clip_native"},
        "preprocess": pp,
        "tokenizer": tokenizer.config,
    }
    return OpenClipModel(oc, config)


def open_clip_pretrained_cfg(arch: str, tag: str) -> dict:
    import open_clip

    return open_clip.get_pretrained_cfg(arch, tag) or {}


def _local_dir(spec: str) -> tuple[TwoTower, Tokenizer, dict]:
    """local-dir:PATH: open_clip's local-dir layout (open_clip_config.json and its weights file)."""
    path = Path(spec.partition(":")[2]).expanduser()
    cfg_file = path / OPEN_CLIP_CONFIG
    if not cfg_file.is_file():
        raise UsageError(f"{spec}: no {OPEN_CLIP_CONFIG} in {path}")
    oc = read_json(cfg_file, spec + ":")
    if not isinstance(oc.get("model_cfg"), dict):
        raise VltoolError(f"{spec}: {cfg_file} has no model_cfg object")
    from open_clip.factory import _find_checkpoint_in_dir

    ckpt = _find_checkpoint_in_dir(path)
    if ckpt is None:
        raise UsageError(f"{spec}: no weights file (*.safetensors, *.bin, *.pth) in {path}")
    model, tok = _from_open_clip_cfg(oc["model_cfg"], oc.get("preprocess_cfg"), ckpt, spec)
    return model, tok, {}


def _open_clip_hub(spec: str) -> tuple[TwoTower, Tokenizer, dict]:
    """open_clip:hf-hub:ORG/NAME[@REVISION]: an open_clip repository on the Hub, as open_clip reads it."""
    found = hub.resolve_open_clip_hub(spec)
    model, tok = _from_open_clip_cfg(found.model_cfg, found.preprocess_cfg, str(found.path), spec)
    return model, tok, found.revision
