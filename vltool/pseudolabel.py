"""`vltool pseudolabel`: pseudo bag-of-words captions for unaligned images ("A Fistful of Words", 2.3).

For each unaligned image, `crops` augmented views each retrieve their `neighbors` nearest intact
aligned captions; NN_i is the multiset of all retrieved captions (a caption found by 3 views counts 3
times). The words of NN_i (tokenised as `deform` does: lower-cased, stop words and non-alphabetic
tokens removed) are ranked by a strategy and the top `words` become the pseudo caption.

Strategies (section 2.3, Table 7):
- `maxcount`: count(w, NN_i), the number of captions in NN_i containing w;
- `rmtop-maxcount`: maxcount after removing the `top_t` most frequent words of the aligned captions;
- `rmtop-rand`: a random order (seeded per row) after that removal;
- `weighted-count` (default): count(w, NN_i) / count(w, S_a), S_a the aligned captions.

Ties: by score (descending), then count(w, NN_i) (descending), then the word (alphabetical). The
"most frequent words" of the aligned captions are counted as `deform`'s RmTopFreq counts them (the
number of captions containing the word, over every alphabetic token, ties alphabetical).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from vltool.errors import UsageError
from vltool.text import english_stopwords, tokenize

STRATEGIES = ("maxcount", "rmtop-maxcount", "rmtop-rand", "weighted-count")


def content_words(text: str, stopwords: frozenset[str]) -> frozenset[str]:
    """The distinct words of a caption, as deform's RmStopNalpha keeps them."""
    return frozenset(t for t in tokenize(text or "") if t.isalpha() and t not in stopwords)


@dataclass
class AlignedWords:
    """What pseudolabel needs from the aligned captions, fitted on them only."""

    words: list[frozenset[str]]  # per aligned caption, its content words
    doc_freq: Counter  # count(w, S_a): aligned captions containing w (content words)
    top: frozenset[str]  # the top_t most frequent alphabetic words of the aligned captions

    @classmethod
    def fit(cls, captions: Sequence[str], top_t: int, stopwords: frozenset[str] | None = None) -> "AlignedWords":
        stop = stopwords if stopwords is not None else english_stopwords()[0]
        words, df, df_all = [], Counter(), Counter()
        for c in captions:
            toks = set(tokenize(c or ""))
            df_all.update(t for t in toks if t.isalpha())
            w = frozenset(t for t in toks if t.isalpha() and t not in stop)
            words.append(w)
            df.update(w)
        top = [w for w, _ in sorted(df_all.items(), key=lambda kv: (-kv[1], kv[0]))[:top_t]]
        return cls(words, df, frozenset(top))


def rank_words(
    neighbours: Sequence[int], aligned: AlignedWords, strategy: str = "weighted-count", rng: random.Random | None = None
) -> list[tuple[str, float]]:
    """Rank the words of NN_i (aligned caption indices, with repeats) by `strategy`: [(word, score), ...]."""
    if strategy not in STRATEGIES:
        raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    count: Counter = Counter()
    for j in neighbours:
        count.update(aligned.words[j])
    if strategy.startswith("rmtop"):  # weighted-count ranks frequent words lower instead of removing them
        for w in aligned.top:
            count.pop(w, None)
    if strategy == "rmtop-rand":
        rng = rng or random.Random(0)
        words = sorted(count)  # a fixed order before shuffling, so the seed decides
        rng.shuffle(words)
        return [(w, float(len(words) - r)) for r, w in enumerate(words)]
    if strategy == "weighted-count":
        scored = [(w, c / aligned.doc_freq[w], c) for w, c in count.items()]
    else:
        scored = [(w, float(c), c) for w, c in count.items()]
    scored.sort(key=lambda x: (-x[1], -x[2], x[0]))
    return [(w, s) for w, s, _ in scored]
