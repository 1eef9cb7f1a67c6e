"""open_clip's models as vltool loads them: `open_clip:ARCH[/TAG or /FILE]` (a pretrained tag resolved through
vltool.hub), `open_clip:hf-hub:ORG/NAME` and `local-dir:PATH`, rebuilt on vltool's towers; and the architectures
vltool does not rebuild (by any of these spellings), run as open_clip's own model (`OpenClipModel`), with what
decides which. Hugging Face ids open_clip names (a tokenizer, a text tower) are read as huggingface_hub reads
them, with or without an organisation (`bert-base-uncased`).
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
    text_cfg = cfg.get("text_cfg", {})
    for what in ("hf_tokenizer_name", "hf_model_name"):  # (read from the Hub as huggingface_hub spells its ids)
        if text_cfg.get(what) and hub.library_repo_id(text_cfg[what]) is None:
            return "refused", f"open_clip names its {what} {text_cfg[what]!r}, which is not a Hugging Face Hub id"
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
        _check_native_runs(spec, cfg)
        tokenizer = _open_clip_native_tokenizer(spec, arch, cfg)
        _hf_text_tower_config(spec, cfg)
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
            model = _open_clip_native_model(spec, arch, cfg, tokenizer, arch, pretrained=checkpoint,
                                            force_preprocess_cfg=hub.tag_preprocess(tag_cfg) or None)
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


def _open_clip_native_tokenizer(spec: str, arch: str | None, cfg: dict, local_dir: Path | None = None) -> OpenClipTokenizer:
    """open_clip.get_tokenizer(arch) (or of hf-hub:ORG/NAME, local-dir:PATH: `arch` None), its Hugging Face
    tokenizer read from the folder vltool.hub resolves (huggingface_hub's cache; fetched when online; the id
    with or without an organisation, as open_clip names it), or from `local_dir` as open_clip reads a
    local-dir: what open_clip reads, found the way every Hub file is."""
    import open_clip
    from open_clip.tokenizer import DEFAULT_CONTEXT_LENGTH, HFTokenizer, SimpleTokenizer

    text_cfg = cfg.get("text_cfg", {})
    context = int(text_cfg.get("context_length", DEFAULT_CONTEXT_LENGTH))
    kwargs = dict(text_cfg.get("tokenizer_kwargs") or {})
    name = text_cfg.get("hf_tokenizer_name") or ""
    tc = {"type": "open_clip_native", "arch": arch or spec, "context_length": context, "kwargs": kwargs,
          "hf_tokenizer": name or None, "tokenizer_mode": text_cfg.get("tokenizer_mode")}
    if not name:
        import open_clip.tokenizer as tk

        # get_tokenizer of a config with no Hugging Face tokenizer: open_clip's BPE (an arch's own rules first)
        tok = open_clip.get_tokenizer(arch) if arch else SimpleTokenizer(context_length=context, **kwargs)
        return OpenClipTokenizer(tc, Path(tk.default_bpe()), tok)
    if local_dir is not None:  # open_clip reads a local-dir's tokenizer from the folder itself
        path = Path(local_dir)
    else:
        repo = hub.library_repo_id(name)
        if repo is None:
            raise UsageError(f"{spec}: open_clip names the tokenizer {name!r}, which is not a Hugging Face Hub id")
        path = hub.hub_snapshot(spec, repo, None, allow=["*.json", "*.txt", "*.model"], ignore=hub.HF_IGNORE)
        tc["hf_tokenizer_commit"] = hub.commit_of(path)
    try:
        tok = HFTokenizer(str(path), context_length=context, tokenizer_mode=text_cfg.get("tokenizer_mode"), **kwargs)
    except Exception as e:
        raise UsageError(f"{spec}: cannot load open_clip's tokenizer {name} from {path} ({_tokenizer_problem(path, e)})") from None
    return OpenClipTokenizer(tc, path, tok)


def _hf_text_tower_config(spec: str, cfg: dict) -> None:
    """A Hugging Face text tower (`hf_model_name`, e.g. roberta-base): open_clip builds it from the repository's
    config.json (transformers' AutoConfig, through the same cache), so that file is resolved here, before any
    weights are fetched; a repository missing from the cache offline is one line."""
    name = cfg.get("text_cfg", {}).get("hf_model_name") or ""
    if not name or Path(name).expanduser().is_dir():
        return
    repo = hub.library_repo_id(name)
    if repo is None:
        raise UsageError(f"{spec}: open_clip names the text tower {name!r}, which is not a Hugging Face Hub id")
    hub.hub_file(spec, repo, "config.json", None)


def _open_clip_native_model(spec: str, what: str, cfg: dict, tokenizer, model_name: str, **create_kwargs) -> "OpenClipModel":
    """open_clip.create_model(model_name, **create_kwargs): ARCH with the tag's weights file and the
    preprocessing the tag merges in, as create_model_and_transforms(ARCH, pretrained=TAG) builds them, or
    local-dir:DIR as open_clip reads a local-dir (its config, weights and preprocessing)."""
    import open_clip

    try:
        oc = open_clip.create_model(model_name, **create_kwargs)
    except Exception as e:
        weights = create_kwargs.get("pretrained") or ("its weights" if model_name.startswith(hub.LOCAL_DIR_SPEC) else "fresh weights")
        raise VltoolError(f"{spec}: open_clip cannot build it with {weights}: {_first_line(e)}") from None
    pp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(oc.visual.preprocess_cfg).items()}
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arch": what,
        "embed_dim": int(cfg["embed_dim"]),
        "open_clip_native": {"arch": what, "model_cfg": cfg, "why": open_clip_native_reasons(cfg)},
        "image_tower": {"type": "open_clip_native"},
        "text_tower": {"type": "open_clip_native"},
        "preprocess": pp,
        "tokenizer": tokenizer.config,
    }
    return OpenClipModel(oc, config)


def _check_native_runs(spec: str, cfg: dict) -> None:
    """Refused before any weights are fetched: a timm image tower the installed timm lacks."""
    why = open_clip_cannot_run(cfg)
    if why:
        raise UsageError(f"{spec}: {why}; nothing was fetched (docs/models.md lists the open_clip tags vltool runs)")


def open_clip_pretrained_cfg(arch: str, tag: str) -> dict:
    import open_clip

    return open_clip.get_pretrained_cfg(arch, tag) or {}


def _local_dir(spec: str) -> tuple[TwoTower, Tokenizer, dict]:
    """local-dir:PATH: open_clip's local-dir layout (open_clip_config.json and its weights file); an architecture
    vltool does not rebuild runs as open_clip's own model, create_model('local-dir:PATH')."""
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
    if open_clip_native_reasons(oc["model_cfg"]):
        _check_native_runs(spec, oc["model_cfg"])
        tokenizer = _open_clip_native_tokenizer(spec, None, oc["model_cfg"], local_dir=path)
        _hf_text_tower_config(spec, oc["model_cfg"])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = _open_clip_native_model(spec, spec, oc["model_cfg"], tokenizer, f"{hub.LOCAL_DIR_SPEC}{path.resolve()}")
        return model, tokenizer, {}
    model, tok = _from_open_clip_cfg(oc["model_cfg"], oc.get("preprocess_cfg"), ckpt, spec)
    return model, tok, {}


def _open_clip_hub(spec: str) -> tuple[TwoTower, Tokenizer, dict]:
    """open_clip:hf-hub:ORG/NAME[@REVISION]: an open_clip repository on the Hub, as open_clip reads it. Its
    config is read first: an architecture vltool does not rebuild runs as open_clip's own model
    (create_model('hf-hub:ORG/NAME') on the same two files), its tokenizer resolved and anything refused
    before the weights are fetched."""
    config = hub.open_clip_hub_config(spec)
    if not open_clip_native_reasons(config.model_cfg):
        found = hub.resolve_open_clip_hub(spec, config)
        model, tok = _from_open_clip_cfg(found.model_cfg, found.preprocess_cfg, str(found.path), spec)
        return model, tok, found.revision
    _check_native_runs(spec, config.model_cfg)
    tokenizer = _open_clip_native_tokenizer(spec, None, config.model_cfg)
    _hf_text_tower_config(spec, config.model_cfg)
    found = hub.resolve_open_clip_hub(spec, config)
    import tempfile

    # open_clip's own reading of an hf-hub repository (its open_clip_config.json, its weights file) is its
    # local-dir reading of a folder holding just those two files: the ones resolved here, nothing fetched again
    with tempfile.TemporaryDirectory(prefix="vltool-open_clip-") as tmp:
        (Path(tmp) / OPEN_CLIP_CONFIG).symlink_to(config.path)
        (Path(tmp) / found.path.name).symlink_to(found.path)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = _open_clip_native_model(spec, spec, config.model_cfg, tokenizer, f"{hub.LOCAL_DIR_SPEC}{tmp}")
    return model, tokenizer, found.revision
