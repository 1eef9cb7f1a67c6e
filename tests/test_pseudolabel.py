"""pseudolabel's word ranking on hand-made neighbour multisets, ties included."""

import random

import pytest

from vltool.pseudolabel import AlignedWords, rank_words

STOP = frozenset({"a", "the", "on", "of", "with"})
ALIGNED = [
    "a red car on the road",  # 0
    "a red bus",  # 1
    "the car",  # 2
    "a blue car with a dog",  # 3
    "dog on the grass",  # 4
    "a car",  # 5
]
# aligned counts (captions containing): car 4, red 2, dog 2, road 1, bus 1, blue 1, grass 1


@pytest.fixture
def aligned():
    return AlignedWords.fit(ALIGNED, top_t=2, stopwords=STOP)


def test_fit_counts_and_top_words(aligned):
    assert aligned.doc_freq["car"] == 4 and aligned.doc_freq["red"] == 2 and "a" not in aligned.doc_freq
    # top-2 over all alphabetic words, stop words included: a (5 captions), car (4)
    assert aligned.top == frozenset({"a", "car"})


def test_maxcount_counts_captions_with_repeats(aligned):
    nn = [0, 0, 3, 4, 1]  # caption 0 retrieved by two views counts twice
    # car: 0,0,3 -> 3; red: 0,0,1 -> 3; road: 2; dog: 3,4 -> 2; blue 1; grass 1; bus 1
    assert rank_words(nn, aligned, "maxcount") == [
        ("car", 3.0), ("red", 3.0), ("dog", 2.0), ("road", 2.0), ("blue", 1.0), ("bus", 1.0), ("grass", 1.0)]


def test_rmtop_maxcount_removes_top_words(aligned):
    nn = [0, 0, 3, 4, 1]
    assert [w for w, _ in rank_words(nn, aligned, "rmtop-maxcount")] == ["red", "dog", "road", "blue", "bus", "grass"]


def test_weighted_count_ranks_by_ratio_with_ties(aligned):
    nn = [0, 0, 3, 4, 1]
    got = rank_words(nn, aligned, "weighted-count")
    # road 2/1 = 2; red 3/2 = 1.5; blue 1, bus 1, grass 1 (tie: count equal -> alphabetical); dog 2/2 = 1 (count 2 wins the tie); car 3/4
    assert got == [("road", 2.0), ("red", 1.5), ("dog", 1.0), ("blue", 1.0), ("bus", 1.0), ("grass", 1.0), ("car", 0.75)]


def test_rmtop_rand_is_seeded_and_removes_top(aligned):
    nn = [0, 0, 3, 4, 1]
    a = rank_words(nn, aligned, "rmtop-rand", random.Random(1))
    b = rank_words(nn, aligned, "rmtop-rand", random.Random(1))
    assert a == b
    assert sorted(w for w, _ in a) == ["blue", "bus", "dog", "grass", "red", "road"]
    orders = {tuple(w for w, _ in rank_words(nn, aligned, "rmtop-rand", random.Random(s))) for s in range(10)}
    assert len(orders) > 1


def test_unknown_strategy(aligned):
    from vltool.errors import UsageError

    with pytest.raises(UsageError, match="--strategy must be one of"):
        rank_words([0], aligned, "best")
