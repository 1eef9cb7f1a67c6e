"""vltool.model.tokenizer: open_clip's BPE tokenizer, shared with the one open_clip builds at import when the
vocabulary is open_clip's own, gives what a freshly built SimpleTokenizer gives."""

import gzip
import shutil

import pytest
import torch

from vltool.model.tokenizer import Tokenizer
from vltool.open_clip_parts import part

TEXTS = ["a photo of a cat.", "", "Ünïcödé — emoji 🐱 and 12,345 numbers", "the " * 100, "don't stop; it's A_B_C"]


@pytest.mark.parametrize("context_length", [8, 32, 77])
def test_shared_tables_tokenize_as_a_fresh_simple_tokenizer(tmp_path, context_length):
    module = part("tokenizer")
    bpe = tmp_path / "bpe.txt.gz"
    shutil.copyfile(module.default_bpe(), bpe)  # (a model directory's copy of open_clip's vocabulary)
    tok = Tokenizer({"type": "open_clip", "file": "bpe.txt.gz", "context_length": context_length}, bpe)
    assert tok._tok.encoder is module._tokenizer.encoder  # the shared path was taken
    assert tok._tok.cache is not module._tokenizer.cache
    fresh = module.SimpleTokenizer(bpe_path=str(bpe), context_length=context_length)
    got = tok(TEXTS)
    assert got.shape == (len(TEXTS), context_length)
    assert torch.equal(got, fresh(TEXTS))
    assert module._tokenizer.context_length == 77  # open_clip's own is left as it was


def test_another_vocabulary_or_options_build_their_own_tables(tmp_path):
    module = part("tokenizer")
    lines = gzip.open(module.default_bpe()).read().decode().split("\n")
    other = tmp_path / "other.txt.gz"
    with gzip.open(other, "wt") as f:  # the same merges, two swapped: a different vocabulary
        f.write("\n".join(lines[:1] + [lines[2], lines[1]] + lines[3:]))
    tok = Tokenizer({"type": "open_clip", "file": "other.txt.gz", "context_length": 16}, other)
    assert tok._tok.encoder is not module._tokenizer.encoder
    assert torch.equal(tok(TEXTS), module.SimpleTokenizer(bpe_path=str(other), context_length=16)(TEXTS))
    same = tmp_path / "same.txt.gz"
    shutil.copyfile(module.default_bpe(), same)
    kw = {"clean": "whitespace"}
    tok = Tokenizer({"type": "open_clip", "file": "same.txt.gz", "context_length": 16, "kwargs": kw}, same)
    assert tok._tok.encoder is not module._tokenizer.encoder
    assert torch.equal(tok(TEXTS), module.SimpleTokenizer(bpe_path=str(same), context_length=16, **kw)(TEXTS))
