"""Word-level text handling shared by `deform` and `pseudolabel`.

Tokenisation (docs/deform.md): lower-case, then split into word tokens and punctuation tokens with one
regular expression: a word is a run of Unicode word characters, optionally joined by apostrophes
("don't", "o'clock"); every other non-space character is a token of its own ("table." -> "table", ".").
NLTK's `word_tokenize` would need the `punkt` download, which these machines cannot make.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

TOKEN_RE = re.compile(r"\w+(?:['\u2019]\w+)*|[^\w\s]")
STOPWORDS_FILE = Path(__file__).resolve().parent / "assets" / "stopwords_english.txt"


def tokenize(text: str) -> list[str]:
    """Lower-case `text` and split it into word and punctuation tokens."""
    return TOKEN_RE.findall(text.lower())


def is_word(token: str) -> bool:
    """Purely alphabetic (RmStopNalpha keeps only these)."""
    return token.isalpha()


@lru_cache(maxsize=1)
def english_stopwords() -> tuple[frozenset[str], str]:
    """NLTK's English stop words, and where they came from.

    NLTK's corpus is used when it is installed (`nltk.download('stopwords')`); otherwise the copy of
    NLTK's classic 179-word English list shipped in vltool/assets/stopwords_english.txt.
    """
    try:
        from nltk.corpus import stopwords  # optional dependency: absent, the shipped copy is used

        words = stopwords.words("english")
        return frozenset(w.lower() for w in words), f"nltk corpus ({len(words)} words)"
    except (LookupError, ImportError, OSError):
        words = STOPWORDS_FILE.read_text().split()
        return frozenset(words), f"vltool's copy of NLTK's English list ({len(words)} words)"
