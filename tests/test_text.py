"""vltool.text: the tokeniser and the shipped stop-word list (the same on every machine, recorded by digest)."""

import hashlib
import subprocess
import sys

from vltool.text import STOPWORDS_FILE, english_stopwords, tokenize

# The SHA-256 of vltool/assets/stopwords_english.txt (NLTK's 179-word English list; vltool/assets/STOPWORDS_SOURCE.md).
# An edit to the list changes deform's and pseudolabel's outputs: it must change this pin (and the CHANGELOG) too.
STOPWORDS_SHA256 = "019f104ba2ed07436d05f9cdd3383034ad66014edc27fc651f837e1a038b6451"


def test_tokenize_splits_words_apostrophes_and_punctuation():
    assert tokenize("The cat's mat, o'clock!") == ["the", "cat's", "mat", ",", "o'clock", "!"]


def test_shipped_stopword_list_is_pinned_by_digest():
    stop = english_stopwords()
    assert stop.sha256 == STOPWORDS_SHA256 == hashlib.sha256(STOPWORDS_FILE.read_bytes()).hexdigest()
    assert len(stop.words) == 179 and {"the", "a", "don't", "wouldn't"} <= stop.words


def test_nltk_corpus_is_never_read(tmp_path):
    """A machine with NLTK's corpus (here: a stand-in `nltk` whose list is different) gets the shipped list."""
    fake = tmp_path / "nltk" / "corpus"
    fake.mkdir(parents=True)
    (tmp_path / "nltk" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("class stopwords:\n    @staticmethod\n    def words(lang):\n        return ['cat']\n")
    code = "from vltool.text import english_stopwords; s = english_stopwords(); print(len(s.words), 'cat' in s.words, s.sha256)"
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(tmp_path), "PATH": ""}, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["179", "False", STOPWORDS_SHA256]
