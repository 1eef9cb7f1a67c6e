"""Tokenizers: texts -> what a text tower takes (open_clip's BPE, a Hugging Face tokenizer, open_clip's own
tokenizer of a model vltool does not rebuild), the digest of their files (part of every text cache key), and
why a tokenizer did not load.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Sequence

from vltool.errors import UsageError, VltoolError


# The files a Hugging Face tokenizer reads (its vocabulary, merges, sentencepiece model and settings), by the
# names transformers saves them under: their bytes are part of every cache key of a text encoding.
TOKENIZER_FILE_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                        "vocab.json", "merges.txt", "vocab.txt", "spiece.model", "sentencepiece.bpe.model",
                        "tokenizer.model", "bpe.codes", "vocab.model")


def tokenizer_files_digest(source: Path | str) -> str:
    """SHA-256 of a tokenizer's files: the file itself (open_clip's BPE vocabulary), or the tokenizer files
    of a directory (TOKENIZER_FILE_NAMES), each by name and bytes. A tokenizer-only change (a Hub commit
    that fixes the vocabulary, an edited tokenizer.json) changes it; the weights' fingerprint does not see it."""
    source = Path(source)
    files = [source] if source.is_file() else sorted(p for p in source.glob("*") if p.name in TOKENIZER_FILE_NAMES and p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:32]


def tokenizer_source(config: dict, model_dir: Path | str) -> Path:
    """Where a vltool model directory's tokenizer files are (its config's tokenizer entry names them)."""
    return Path(model_dir) / (config["file"] if config["type"] == "open_clip" else config["dir"])


def open_clip_bpe_tokenizer(bpe_path: Path, context_length: int, kwargs: dict):
    """open_clip's SimpleTokenizer(bpe_path, context_length, **kwargs). Importing open_clip.tokenizer already
    builds one on open_clip's own vocabulary (its module-level `_tokenizer`, the one `open_clip.tokenize` uses;
    0.3 s of CPU: its tables are built from 48,894 merges), so for that vocabulary byte for byte and no other
    options the tables are that tokenizer's, shared, with this context length: the same object
    SimpleTokenizer would build, without building its tables twice (tests/test_tokenizer.py)."""
    from vltool.open_clip_parts import part

    module = part("tokenizer")
    if not kwargs and _same_bytes(bpe_path, module.default_bpe()):
        tok = copy.copy(module._tokenizer)
        tok.cache = dict(tok.cache)  # (its own memo of BPE merges: the same values, not open_clip's dict)
        tok.context_length = context_length
        return tok
    return module.SimpleTokenizer(bpe_path=str(bpe_path), context_length=context_length, **kwargs)


def _same_bytes(a: Path | str, b: Path | str) -> bool:
    a, b = Path(a), Path(b)
    return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


class Tokenizer:
    """Texts -> what the text tower takes: a LongTensor (open_clip) or a dict of tensors (Hugging Face).

    `config` is the tokenizer entry of the model config (paths relative to the model directory);
    `source` is where the files are read from now (the model directory's, or where they were installed).
    """

    def __init__(self, config: dict, source: Path):
        self.config = config
        self.source = Path(source)  # the BPE file (open_clip) or the tokenizer directory (hf)
        kind = config["type"]
        if kind == "open_clip":
            self._tok = open_clip_bpe_tokenizer(self.source, config["context_length"], config.get("kwargs", {}))
        elif kind == "hf":
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(str(self.source))
        else:
            raise VltoolError(f"unknown tokenizer type {kind!r} in the model config")

    @classmethod
    def from_model_dir(cls, config: dict, model_dir: Path) -> "Tokenizer":
        return cls(config, tokenizer_source(config, model_dir))

    def __call__(self, texts: Sequence[str]):
        texts = list(texts)
        if self.config["type"] == "open_clip":
            return self._tok(texts)  # (B, context_length) LongTensor
        # "padding": "max_length" for CLIP / SigLIP (SigLIP was trained on texts padded to its length);
        # "inputs": what the text model takes (SigLIP's tokenizer gives no attention mask)
        enc = self._tok(texts, padding=self.config.get("padding", True), truncation=True, max_length=self.config["max_length"], return_tensors="pt")
        return {k: enc[k] for k in self.config.get("inputs", ("input_ids", "attention_mask"))}

    def save(self, model_dir: Path) -> None:
        """Copy the tokenizer files into `model_dir` at the place the config names."""
        if self.config["type"] == "open_clip":
            dst = Path(model_dir) / self.config["file"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.source, dst)
        else:
            self._tok.save_pretrained(str(Path(model_dir) / self.config["dir"]))

    def save_pretrained(self, out_dir: Path | str) -> None:
        """A Hugging Face tokenizer's files in transformers' layout (export_hf)."""
        if self.config["type"] != "hf":
            raise VltoolError("only a Hugging Face tokenizer has transformers' layout")
        self._tok.save_pretrained(str(out_dir))

    def describe(self) -> dict:
        """What identifies the tokenization (for cache keys): its settings and the digest of its files."""
        return {**self.config, "files_sha256": self.files_digest()}

    def files_digest(self) -> str:
        if getattr(self, "_files_digest", None) is None:
            self._files_digest = tokenizer_files_digest(self.source)
        return self._files_digest


class OpenClipTokenizer(Tokenizer):
    """open_clip's own tokenizer of an architecture vltool does not rebuild, as open_clip.get_tokenizer makes
    it: its HFTokenizer on the Hugging Face tokenizer the config names (read from huggingface_hub's cache,
    resolved by vltool.hub: a Hub id is looked up once), or its SimpleTokenizer. Gives (B, context) token ids."""

    def __init__(self, config: dict, source: Path, tok):
        self.config, self.source, self._tok = config, Path(source), tok

    def __call__(self, texts: Sequence[str]):
        return self._tok(list(texts))

    def save(self, model_dir: Path) -> None:
        raise UsageError(f"{self.config.get('arch')}: open_clip's own model is evaluated, not saved by vltool")

    def save_pretrained(self, out_dir: Path | str) -> None:
        self.save(Path(out_dir))


def source_tokenizer(config: dict, hf_dir: str | Path | None = None) -> Tokenizer:
    """The tokenizer of a model being created, read from where its files are installed."""
    tc = config["tokenizer"]
    if tc["type"] == "open_clip":
        from vltool.open_clip_parts import part

        return Tokenizer(tc, Path(part("tokenizer").default_bpe()))  # the BPE vocabulary ships in open_clip's wheel
    return Tokenizer(tc, Path(hf_dir))


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


# tokenizer classes that read a sentencepiece model (SigLIP's, T5's): they need sentencepiece and protobuf
_SENTENCEPIECE_TOKENIZERS = ("Siglip", "T5", "Llama", "Gemma", "XLMRoberta", "Albert", "Camembert", "Marian", "Pegasus")


def _tokenizer_problem(path: Path, e: Exception) -> str:
    """Why a tokenizer did not load, with the packages it lacks when that is the reason."""
    try:
        tok_class = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class") or ""
    except (OSError, ValueError):
        tok_class = ""
    missing = [m for m in ("sentencepiece", "google.protobuf") if importlib.util.find_spec(m.split(".")[0]) is None]
    if (path / "spiece.model").is_file() or tok_class.startswith(_SENTENCEPIECE_TOKENIZERS):
        if missing:
            names = " ".join("protobuf" if m == "google.protobuf" else m for m in missing)
            return f"{tok_class or 'its sentencepiece tokenizer'} needs {names}: pip install {names}"
    return _first_line(e)
