"""Where a model's files are: a local folder, or the Hugging Face Hub through huggingface_hub's cache.

Every spelling of a model that names weights somewhere else than a vltool RUN_DIR is resolved here, once,
to local files and the exact version they are:

    hf:DIR                         a folder written by save_pretrained (a local folder wins over a Hub id)
    hf:ORG/NAME[@REVISION]         a transformers repository on the Hub (branch, tag or commit)
    open_clip:ARCH/TAG             open_clip's pretrained tag (open_clip.list_pretrained()), e.g. ViT-B-32/laion2b_s34b_b79k
    open_clip:ARCH/FILE            the weights of open_clip architecture ARCH in a local file
    open_clip:hf-hub:ORG/NAME[@REVISION]   an open_clip repository on the Hub (open_clip_config.json + weights)

Hub files are fetched with huggingface_hub (`snapshot_download` / `hf_hub_download`) into its cache:
`HF_HUB_CACHE`, else `HF_HOME/hub`, read when a model is resolved. With `HF_HUB_OFFLINE=1` only the cache
is read; a model that is not there is one line naming the id and the cache. `Resolved.revision` is what
goes into every output's provenance: the repository and the commit hash of the snapshot, or the open_clip
tag, its file and the file's sha256.

A leaf module (vltool.errors only). open_clip is imported where a tag is resolved: importing it costs
seconds (torch, its model registry), which a Hub id or a local folder never needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                    RevisionNotFoundError)
from huggingface_hub.utils import validate_repo_id

from vltool.errors import UsageError

HF_SPEC = "hf:"
OPEN_CLIP_SPEC = "open_clip:"
LOCAL_DIR_SPEC = "local-dir:"
HF_HUB_PREFIX = "hf-hub:"  # open_clip's own prefix for its Hub repositories
OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")  # open_clip's preference order

# a repository id: ORG/NAME, as the Hub spells them, with an optional @REVISION
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# what a transformers CLIP / SigLIP / captioner needs from a repository: configs, tokenizer and processor
# files and safetensors weights (not the TF / Flax / ONNX copies, nor open_clip's copy of the weights)
HF_ALLOW = ["*.json", "*.txt", "*.model", "*.safetensors", "*.tiktoken", "*.py"]
HF_IGNORE = ["open_clip_*", "onnx/*", "openvino/*", "coreml/*"]


@dataclass(frozen=True)
class Resolved:
    """A model's files on this machine and which version of them they are."""

    path: Path  # a folder (hf:, local-dir:, open_clip:hf-hub:) or a weights file (open_clip:ARCH/TAG or FILE)
    revision: dict = field(default_factory=dict)  # provenance: {"repo", "commit"} or {"arch", "tag", "file", "sha256"}
    model_cfg: dict | None = None  # open_clip: the architecture's config
    preprocess_cfg: dict | None = None  # open_clip: the preprocessing the weights were trained with


def hub_cache() -> Path:
    """huggingface_hub's cache folder as the environment names it now (HF_HUB_CACHE, else HF_HOME/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.path.expanduser(os.environ["HF_HUB_CACHE"])))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.path.expanduser(os.environ["HF_HOME"]))) / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set, as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if value is None:
        return bool(constants.HF_HUB_OFFLINE)
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def parse_repo_id(text: str) -> tuple[str, str | None] | None:
    """"ORG/NAME" or "ORG/NAME@REVISION" -> (repo id, revision or None); None when it is not one."""
    m = _REPO_ID.match(text)
    if m is None or text.startswith((".", "~")) or ".." in m.group("repo"):
        return None
    return m.group("repo"), m.group("rev")


def library_repo_id(name: str) -> str | None:
    """A Hub repository id as a library's config names it (open_clip's `hf_tokenizer_name`, `hf_model_name`):
    ORG/NAME, or NAME alone, the Hub's older ids without an organisation (`bert-base-uncased`, `roberta-base`),
    which huggingface_hub fetches and caches as they are spelt (`models--bert-base-uncased`); None when
    huggingface_hub would refuse it as an id."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name if name.count("/") <= 1 and not name.startswith((".", "~")) else None


def commit_of(snapshot: Path) -> str | None:
    """The commit hash of a file or folder inside huggingface_hub's cache (snapshots/COMMIT/...)."""
    parts = Path(snapshot).parts
    for i, part in enumerate(parts[:-1]):
        if part == "snapshots" and _COMMIT.match(parts[i + 1]):
            return parts[i + 1]
    return None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(2**22), b""):
            h.update(chunk)
    return h.hexdigest()


def _hub_error(spec: str, repo: str, revision: str | None, e: Exception) -> UsageError:
    """One line for every way a Hub look-up fails: not cached offline, no such repository / revision / file,
    no network."""
    at = f"{repo}@{revision}" if revision else repo
    cache = hub_cache()
    if isinstance(e, LocalEntryNotFoundError):
        broken = _cache_problem(cache, repo, revision)
        if broken:
            return UsageError(f"{spec}: {at} cannot be loaded: {broken}")
        why = ("it is not in the Hugging Face cache " f"{cache} and HF_HUB_OFFLINE is set" if hub_offline()
               else f"it is not in the Hugging Face cache {cache} and the Hub could not be reached")
        return UsageError(f"{spec}: {at} cannot be loaded: {why}; download it on a machine online (same HF_HOME), "
                          "or copy that machine's cache here")
    if isinstance(e, GatedRepoError):
        return UsageError(f"{spec}: {repo} is gated on the Hub: accept its terms and log in (hf auth login)")
    if isinstance(e, RepositoryNotFoundError):
        return UsageError(f"{spec}: no repository {repo} on the Hugging Face Hub (or it is private: log in with hf auth login)")
    if isinstance(e, RevisionNotFoundError):
        return UsageError(f"{spec}: {repo} has no revision {revision!r}")
    if isinstance(e, EntryNotFoundError):
        return UsageError(f"{spec}: {at} has no such file ({str(e).splitlines()[0]})")
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return UsageError(f"{spec}: cannot fetch {at} from the Hugging Face Hub (cache {cache}): {first}")


def _cache_problem(cache: Path, repo: str, revision: str | None) -> str | None:
    """Why huggingface_hub's cache cannot hold `repo` (what is wrong and how to fix it), or None: the cache
    folder is a file (HF_HOME or HF_HUB_CACHE naming one), or refs/REVISION names a commit whose snapshot
    folder is gone (a cache cleaned by hand)."""
    p = cache
    while not p.exists() and p != p.parent:
        p = p.parent
    if p.exists() and not p.is_dir():
        env = "HF_HUB_CACHE" if os.environ.get("HF_HUB_CACHE") else "HF_HOME" if os.environ.get("HF_HOME") else None
        named = f" ({env}={os.environ[env]})" if env else ""
        return f"the Hugging Face cache {cache}{named} cannot be a folder: {p} is a file; point {env or 'HF_HOME'} at a folder"
    folder = cache / ("models--" + repo.replace("/", "--"))
    ref = folder / "refs" / (revision or "main")
    if ref.is_file():
        commit = ref.read_text().strip()
        if commit and not (folder / "snapshots" / commit).is_dir():
            return (f"the cache {folder} is damaged: refs/{revision or 'main'} names commit {commit}, whose snapshot folder "
                    f"is missing; remove {folder} and download it again (online), or copy it from a complete cache")
    return None


def hub_snapshot(spec: str, repo: str, revision: str | None, allow=None, ignore=None) -> Path:
    """The folder of `repo` at `revision` in huggingface_hub's cache, fetched unless offline."""
    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=hub_cache(), local_files_only=hub_offline(),
                                      allow_patterns=allow, ignore_patterns=ignore))
    except Exception as e:
        raise _hub_error(spec, repo, revision, e) from None


def hub_file(spec: str, repo: str, filename: str, revision: str | None) -> Path:
    """One file of `repo` at `revision` from huggingface_hub's cache, fetched unless offline."""
    try:
        return Path(hf_hub_download(repo, filename, revision=revision, cache_dir=hub_cache(), local_files_only=hub_offline()))
    except Exception as e:
        raise _hub_error(spec, repo, revision, e) from None


# ----------------------------------------------------------------------------------------------------
# hf:
# ----------------------------------------------------------------------------------------------------


def is_hub_id(spec: str) -> bool:
    """hf:ORG/NAME[@REV] (or open_clip:hf-hub:...) that is not a local folder: its files come from the Hub."""
    s = str(spec)
    if s.startswith(HF_SPEC):
        rest = s[len(HF_SPEC):]
        return not Path(rest).expanduser().exists() and parse_repo_id(rest) is not None
    return s.startswith(OPEN_CLIP_SPEC + HF_HUB_PREFIX) or (s.startswith(OPEN_CLIP_SPEC) and "/" in s and open_clip_tag(s) is not None)


def resolve_hf(spec: str, allow=None) -> Resolved:
    """hf:DIR or hf:ORG/NAME[@REVISION] -> the model's folder and its revision ({} for a local folder)."""
    rest = str(spec)[len(HF_SPEC):]
    if not rest:
        raise UsageError(f"{spec!r}: expected hf:DIR (a local folder) or hf:ORG/NAME[@REVISION] (a Hugging Face Hub id)")
    if rest != rest.strip():  # `hf: ORG/NAME`: the space is part of neither a folder's name nor a Hub id
        raise UsageError(f"{spec!r}: a space after 'hf:' (or at the end); write hf:{rest.strip()}")
    local = Path(rest).expanduser()
    if local.exists():
        return Resolved(local)
    parsed = parse_repo_id(rest)
    if parsed is None:
        raise UsageError(f"{spec}: no such directory {local} (and not a Hub id ORG/NAME[@REVISION])")
    repo, revision = parsed
    path = hub_snapshot(spec, repo, revision, allow=allow or HF_ALLOW, ignore=HF_IGNORE)
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.safetensors.index.json")) and not hub_offline():
        path = hub_snapshot(spec, repo, revision, allow=["*.bin", "*.bin.index.json"], ignore=HF_IGNORE)  # an older repository
    return Resolved(path, {"repo": repo, "revision": revision or "main", "commit": commit_of(path)})


# ----------------------------------------------------------------------------------------------------
# open_clip:
# ----------------------------------------------------------------------------------------------------


def open_clip_tag(spec: str) -> tuple[str, str] | None:
    """open_clip:ARCH/TAG -> (ARCH, TAG) when open_clip knows TAG for ARCH; else None."""
    import open_clip  # (lazy: see the module docstring)

    arch, _, tag = str(spec)[len(OPEN_CLIP_SPEC):].partition("/")
    if not tag:
        return None
    return (arch, tag) if open_clip.get_pretrained_cfg(arch, tag) else None


def tag_preprocess(pretrained_cfg: dict) -> dict:
    """What open_clip's create_model merges into the preprocessing from a pretrained tag."""
    keys = ("mean", "std", "interpolation", "resize_mode", "fill_color")
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in pretrained_cfg.items() if k in keys}


def resolve_open_clip_tag(spec: str, arch: str, tag: str, model_cfg: dict) -> Resolved:
    """open_clip:ARCH/TAG -> the weights file from the Hub repository open_clip names for the tag."""
    import open_clip  # (lazy: see the module docstring)

    pcfg = open_clip.get_pretrained_cfg(arch, tag)
    hub = pcfg.get("hf_hub") or ""
    if not hub:
        raise UsageError(f"{spec}: open_clip has no Hugging Face Hub copy of {arch}/{tag} (only {pcfg.get('url') or 'a URL'}); "
                         "download the file and pass open_clip:ARCH/FILE")
    if hub.endswith("/"):  # a repository: open_clip's default file names
        repo, names = hub[:-1], list(OPEN_CLIP_WEIGHTS)
    else:  # ORG/NAME/FILE; a pickle's safetensors copy first, as open_clip looks for it
        repo, filename = hub.rsplit("/", 1)
        names = [filename[:-4] + ".safetensors", filename] if filename.endswith((".bin", ".pth")) else [filename]
    path = _first_hub_file(spec, repo, names, None)
    return Resolved(path, {"arch": arch, "tag": tag, "repo": repo, "commit": commit_of(path), "file": path.name,
                           "sha256": file_sha256(path)}, model_cfg=model_cfg, preprocess_cfg=tag_preprocess(pcfg))


def _first_hub_file(spec: str, repo: str, names: list[str], revision: str | None) -> Path:
    """The first of `names` that `repo` has (open_clip's order: safetensors before a pickle)."""
    last = None
    for name in names:
        try:
            return hub_file(spec, repo, name, revision)
        except UsageError as e:
            last = e
            cause = e.__cause__ or e.__context__
            if cause is not None and not isinstance(cause, (EntryNotFoundError, LocalEntryNotFoundError)):
                raise
    raise last


def open_clip_hub_config(spec: str) -> Resolved:
    """open_clip:hf-hub:ORG/NAME[@REVISION] -> its open_clip_config.json alone (`path`, `model_cfg`,
    `preprocess_cfg`): what decides how the model is built, read before its weights are fetched."""
    rest = str(spec)[len(OPEN_CLIP_SPEC + HF_HUB_PREFIX):]
    parsed = parse_repo_id(rest)
    if parsed is None:
        raise UsageError(f"{spec!r}: expected open_clip:hf-hub:ORG/NAME[@REVISION]")
    repo, revision = parsed
    cfg_path = hub_file(spec, repo, OPEN_CLIP_CONFIG, revision)
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{spec}: cannot read {cfg_path}: {e}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_cfg"), dict):
        raise UsageError(f"{spec}: {OPEN_CLIP_CONFIG} of {repo} has no model_cfg")
    return Resolved(cfg_path, {"repo": repo, "revision": revision or "main", "commit": commit_of(cfg_path)},
                    model_cfg=cfg["model_cfg"], preprocess_cfg=cfg.get("preprocess_cfg"))


def resolve_open_clip_hub(spec: str, config: Resolved | None = None) -> Resolved:
    """open_clip:hf-hub:ORG/NAME[@REVISION] -> the repository's weights (`path`) and open_clip_config.json
    (`config`: open_clip_hub_config's answer, read here unless given)."""
    config = config or open_clip_hub_config(spec)
    repo, revision = config.revision["repo"], parse_repo_id(str(spec)[len(OPEN_CLIP_SPEC + HF_HUB_PREFIX):])[1]
    weights = _first_hub_file(spec, repo, list(OPEN_CLIP_WEIGHTS), revision)
    return Resolved(weights, {"repo": repo, "revision": revision or "main", "commit": commit_of(weights), "file": weights.name,
                              "sha256": file_sha256(weights)}, model_cfg=config.model_cfg, preprocess_cfg=config.preprocess_cfg)
