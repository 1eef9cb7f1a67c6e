"""Tiny random Hugging Face CLIPModel / SiglipModel saved with save_pretrained, with their processors: the
tokenizer's vocabulary is written here (letters for CLIP's BPE, a few words for SigLIP's), nothing is downloaded."""

from __future__ import annotations

import json
import string
from pathlib import Path

LAYERS = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
IMAGE = 32  # image side
PATCH = 8
WORDS = ["a", "photo", "of", "the", "square", "thing", "red", "green", "blue", "yellow", "purple", "grey", "cat", "dog", "."]


def make_hf_clip(out: Path, seed: int = 0, context: int = 16) -> Path:
    """CLIPModel (2 layers, width 16, 32x32 images, 12-d embeddings), CLIPTokenizer over letters, CLIPImageProcessor."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(string.ascii_lowercase)}
    vocab.update({c + "</w>": len(vocab) + i for i, c in enumerate(string.ascii_lowercase + ".")})
    bos, eos = len(vocab), len(vocab) + 1
    vocab.update({"<|startoftext|>": bos, "<|endoftext|>": eos})
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(out / "vocab.json"), str(out / "merges.txt"))
    text = dict(LAYERS, vocab_size=len(vocab), max_position_embeddings=context, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)
    config = CLIPConfig(text_config=text, vision_config=dict(LAYERS, image_size=IMAGE, patch_size=PATCH), projection_dim=12)
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(out)
    tok.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE}).save_pretrained(out)
    return out


def make_hf_siglip(out: Path, seed: int = 0) -> Path:
    """SiglipModel (2 layers, width 16, 32x32 images), a word-level tokenizer that gives input_ids only (as
    SigLIP's does), SiglipImageProcessor."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, SiglipConfig, SiglipImageProcessor, SiglipModel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from vltool.debias import DEFAULT_PAIRS

    pairs = sorted({w for line in DEFAULT_PAIRS.read_text().splitlines() for w in line.split()})  # debias's words
    vocab = {w: i for i, w in enumerate(dict.fromkeys(["<pad>", "</s>", "<unk>", *WORDS, *pairs]))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                  model_input_names=["input_ids"])
    text = dict(LAYERS, vocab_size=len(vocab), max_position_embeddings=12, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    config = SiglipConfig(text_config=text, vision_config=dict(LAYERS, image_size=IMAGE, patch_size=PATCH))
    torch.manual_seed(seed)
    model = SiglipModel(config)
    with torch.no_grad():  # SigLIP's initial values (log 10, -10), not torch.randn's
        model.logit_scale.fill_(2.302585)
        model.logit_bias.fill_(-10.0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    SiglipImageProcessor(size={"height": IMAGE, "width": IMAGE}).save_pretrained(out)
    return out


# ----------------------------------------------------------------------------------------------------
# As transformers 5 saves them (CLIPProcessor / SiglipProcessor.save_pretrained: processor_config.json),
# with real tokenizers: CLIP's BPE over the letters, SigLIP's SiglipTokenizer on a sentencepiece model
# trained here from the emoji class names.
# ----------------------------------------------------------------------------------------------------


def emoji_words() -> list[str]:
    """The words of the built-in emoji class names and of a one-line template."""
    from vltool.io import load_dataset

    names = load_dataset("emoji").dataset.features["label"].names
    return sorted({w for n in names for w in n.split()} | {"a", "photo", "of", "the", "."})


def train_sentencepiece(prefix: Path, words: list[str]) -> Path:
    """A unigram sentencepiece model (SigLIP's kind: </s> = 1, <pad> = 0, <unk> = 2) trained on `words`
    in a fraction of a second, deterministic (one thread)."""
    import sentencepiece as spm

    prefix = Path(prefix)
    corpus = prefix.with_suffix(".txt")
    corpus.write_text("\n".join(" ".join(words[i:] + words[:i]) for i in range(len(words))) + "\n")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(prefix), vocab_size=120, model_type="unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
                                   hard_vocab_limit=False, num_threads=1, minloglevel=2)
    return prefix.with_suffix(".model")


def make_hf_clip_v5(out: Path, seed: int = 0) -> Path:
    """The tiny CLIPModel of make_hf_clip, its CLIPTokenizer and image processor saved as one CLIPProcessor."""
    from transformers import CLIPImageProcessor, CLIPProcessor, CLIPTokenizer

    out = Path(out)
    make_hf_clip(out, seed, context=32)  # every emoji class name in letters fits
    tok = CLIPTokenizer.from_pretrained(str(out))
    image = CLIPImageProcessor(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE})
    for f in out.iterdir():  # only what save_pretrained of the model and the processor write
        if f.name not in ("config.json", "model.safetensors"):
            f.unlink()
    CLIPProcessor(image_processor=image, tokenizer=tok).save_pretrained(str(out))
    return out


def make_hf_siglip_sp(out: Path, seed: int = 0) -> Path:
    """A tiny SiglipModel with a real SiglipTokenizer (sentencepiece), saved with SiglipProcessor."""
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor, SiglipTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}-spm"
    work.mkdir(exist_ok=True)
    tok = SiglipTokenizer(vocab_file=str(train_sentencepiece(work / "spiece", emoji_words())))
    text = dict(LAYERS, vocab_size=tok.vocab_size, max_position_embeddings=12, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, bos_token_id=None)
    config = SiglipConfig(text_config=text, vision_config=dict(LAYERS, image_size=IMAGE, patch_size=PATCH))
    torch.manual_seed(seed)
    model = SiglipModel(config)
    with torch.no_grad():
        model.logit_scale.fill_(2.302585)
        model.logit_bias.fill_(-10.0)
    model.save_pretrained(out)
    SiglipProcessor(image_processor=SiglipImageProcessor(size={"height": IMAGE, "width": IMAGE}), tokenizer=tok).save_pretrained(str(out))
    return out


def put_in_hub_cache(hf_home: Path, repo: str, src: Path, commit: str, ref: str = "main") -> Path:
    """Lay `src`'s files out as huggingface_hub's cache holds a downloaded repository:
    HF_HOME/hub/models--ORG--NAME/snapshots/COMMIT/... and refs/REF (the commit)."""
    import shutil

    root = Path(hf_home) / "hub" / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    shutil.copytree(src, snap, dirs_exist_ok=True)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snap
