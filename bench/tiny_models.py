"""Tiny, randomly initialised captioners and language models, built from configs, for tests and benchmarks.

No weights are downloaded: every model here is made from a small config and saved with `save_pretrained`,
together with a tokenizer built locally (a WordPiece vocabulary for BLIP, a byte-level BPE trained on a
few sentences for BLIP-2's OPT and GPT-2), so that `vltool recaption` loads them through the ordinary
`from_pretrained(local_dir)` path. Their captions are random words: they test the plumbing, not quality.

    python bench/tiny_models.py /tmp/vltool-tiny      # writes blip/, blip2/, gpt2/, bert/ under it
"""

from __future__ import annotations

import sys
from pathlib import Path

WORDS = """a an the of on in with and at to two three some is are sitting standing next near holding
man woman boy girl person people dog cat bird horse car bus train plane boat bike table chair bed
kitchen room street field beach water sky tree grass snow food pizza cake plate cup phone
red blue green white black yellow small large young old smiling face hand heart flag sign picture
photo image stock view front top large little group couple sunny day night""".split()

SENTENCES = [
    "A little boy standing next to a dog in a field.",
    "A dog parked filled with people and a bunch of different dogs.",
    "Some people are on the sandy beach flying kites.",
    "a sunny day at the beach with colorful kites in the sky",
    "A living room filled with furniture and a table.",
    "A living room with a nice couch and a coffee table.",
    "A couple of people on a surfboard in the ocean.",
    "A dog is lying on the surfboard as it surfs on a wave.",
    "grinning face with big eyes; red heart; thumbs up; flag of France",
    "stock photo of a young woman holding a cup of coffee #2011 http://example.com",
]


def bert_tokenizer():
    """A lower-casing WordPiece tokenizer with BLIP's special tokens ([DEC] is BLIP's decoder start)."""
    from transformers import BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(WORDS), ".", ",", "[DEC]"]
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True)
    tok.add_special_tokens({"bos_token": "[DEC]"})
    return tok


def bpe_tokenizer(vocab_size: int = 320):
    """A byte-level BPE (GPT-2 style: every byte, newline included, has a token) trained on SENTENCES."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(SENTENCES * 4 + [" ".join(WORDS)], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<pad>"
    )


def make_blip(out: Path, image_size: int = 32, hidden: int = 32, layers: int = 1, seed: int = 0) -> Path:
    """BlipForConditionalGeneration + BlipProcessor, random weights."""
    import torch
    from transformers import BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    out = Path(out)
    tok = bert_tokenizer()
    text = dict(
        vocab_size=len(tok), hidden_size=hidden, encoder_hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=2, max_position_embeddings=64,
        bos_token_id=tok.convert_tokens_to_ids("[DEC]"), pad_token_id=tok.pad_token_id,
        sep_token_id=tok.sep_token_id, eos_token_id=tok.sep_token_id, tie_word_embeddings=False,
    )
    vision = dict(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=2,
        image_size=image_size, patch_size=8, projection_dim=hidden,
    )
    torch.manual_seed(seed)
    model = BlipForConditionalGeneration(BlipConfig(text_config=text, vision_config=vision, projection_dim=hidden))
    _spread_logits(model)
    model.save_pretrained(out)
    proc = BlipProcessor(BlipImageProcessor(size={"height": image_size, "width": image_size}), tok)
    proc.save_pretrained(out)
    return out


def make_blip2(out: Path, image_size: int = 32, hidden: int = 32, num_query_tokens: int = 4, seed: int = 0) -> Path:
    """Blip2ForConditionalGeneration (OPT language model) + Blip2Processor, random weights."""
    import torch
    from transformers import Blip2Config, Blip2ForConditionalGeneration, Blip2Processor, BlipImageProcessor

    out = Path(out)
    tok = bpe_tokenizer()
    proc = Blip2Processor(
        BlipImageProcessor(size={"height": image_size, "width": image_size}), tok, num_query_tokens=num_query_tokens
    )
    tok = proc.tokenizer  # now holds the <image> token
    image_token = tok.convert_tokens_to_ids("<image>")
    text = dict(
        model_type="opt", vocab_size=len(tok), hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=128, word_embed_proj_dim=hidden,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    config = Blip2Config(
        vision_config=dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                           num_attention_heads=2, image_size=image_size, patch_size=8),
        qformer_config=dict(vocab_size=64, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=2 * hidden, encoder_hidden_size=hidden, max_position_embeddings=64),
        text_config=text, num_query_tokens=num_query_tokens, image_token_index=image_token,
    )
    torch.manual_seed(seed)
    model = Blip2ForConditionalGeneration(config)
    _spread_logits(model)
    _readable(model, tok)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out


def make_gpt2(out: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """GPT2LMHeadModel with a byte-level BPE tokenizer, random weights."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out = Path(out)
    tok = bpe_tokenizer()
    config = GPT2Config(
        vocab_size=len(tok), n_positions=1024, n_embd=hidden, n_layer=layers, n_head=2,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    _spread_logits(model)
    _readable(model, tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_bert(out: Path, hidden: int = 32) -> Path:
    """A BERT encoder: a model that is not a captioner (for error tests)."""
    from transformers import BertConfig, BertModel

    out = Path(out)
    tok = bert_tokenizer()
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=2 * hidden)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _readable(model, tok) -> None:
    """Zero the output rows of byte-level pieces that are not whole lower-case words, so that a random
    model writes (random) words rather than stray bytes."""
    import re

    import torch

    emb = _output_embeddings(model)
    texts = tok.batch_decode([[i] for i in range(emb.weight.shape[0])])
    norms = [m for name, m in model.named_modules() if name.endswith(("transformer.ln_f", "decoder.final_layer_norm"))]
    with torch.no_grad():
        # hidden unit 0 after the final layer norm is the constant 10; bad tokens weigh it -10
        norms[-1].weight[0] = 0.0
        norms[-1].bias[0] = 10.0
        emb.weight[:, 0] = 0.0
        for i, t in enumerate(texts):
            if not re.fullmatch(r" [a-z]{2,}|[.,]", t):
                emb.weight[i, 0] = -10.0


def _output_embeddings(model):
    emb = model.get_output_embeddings()
    for part in ("text_decoder", "language_model"):  # BLIP, BLIP-2 keep the LM head in a sub-model
        if emb is None and hasattr(model, part):
            emb = getattr(model, part).get_output_embeddings()
    return emb


def _spread_logits(model) -> None:
    """Random init with std 0.02 gives near-uniform next-token distributions; scale the (untied) output
    embeddings so that sampling and beam search have something to choose between (outputs still meaningless)."""
    import torch

    with torch.no_grad():
        _output_embeddings(model).weight.mul_(25.0)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    root = Path(argv[0])
    for name, fn in (("blip", make_blip), ("blip2", make_blip2), ("gpt2", make_gpt2), ("bert", make_bert)):
        print(fn(root / name))


if __name__ == "__main__":
    main(sys.argv[1:])
