"""Word-level text handling shared by `deform` and `pseudolabel`.

Tokenisation (docs/deform.md): lower-case, then split into word tokens and punctuation tokens with one
regular expression: a word is a run of Unicode word characters, optionally joined by apostrophes
("don't", "o'clock"); every other non-space character is a token of its own ("table." -> "table", ".").
NLTK's `word_tokenize` would need the `punkt` download, which these machines cannot make.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

TOKEN_RE = re.compile(r"\w+(?:['\u2019]\w+)*|[^\w\s]")
STOPWORDS_FILE = Path(__file__).resolve().parent / "assets" / "stopwords_english.txt"


def tokenize(text: str) -> list[str]:
    """Lower-case `text` and split it into word and punctuation tokens."""
    return TOKEN_RE.findall(text.lower())


class StopWords(NamedTuple):
    """The English stop-word list: its words, how outputs name it, and the SHA-256 of the shipped file."""

    words: frozenset[str]
    source: str
    sha256: str


@lru_cache(maxsize=1)
def english_stopwords() -> StopWords:
    """NLTK's English stop words, from the copy shipped in vltool/assets/stopwords_english.txt (its source and
    licence: vltool/assets/STOPWORDS_SOURCE.md). NLTK's corpus is never read: the list, and so every output
    that uses it, is the same on every machine; outputs record it by `sha256`."""
    data = STOPWORDS_FILE.read_bytes()
    words = data.decode("utf-8").split()
    return StopWords(frozenset(words), f"vltool's copy of NLTK's English list ({len(words)} words)", hashlib.sha256(data).hexdigest())
