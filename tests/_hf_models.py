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


def make_hf_clip(out: Path, seed: int = 0) -> Path:
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
    text = dict(LAYERS, vocab_size=len(vocab), max_position_embeddings=16, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)
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
