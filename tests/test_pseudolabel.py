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


# --- the command, end to end with a tiny model --------------------------------------------------------

def _colors(tmp_path, bad_rows=()):
    from tests.fixtures.eval_data import make_colors, make_model

    data = make_colors(tmp_path / "colors", per_class=3, bad_rows=bad_rows)
    return data, make_model(tmp_path / "run")


def test_command_writes_pseudo_captions_from_aligned_words(tmp_path):
    import json

    import datasets

    from vltool.pseudolabel import PseudolabelConfig, pseudolabel

    data, model = _colors(tmp_path)
    cfg = PseudolabelConfig(model=str(model), crops=3, neighbors=4, words=3, top_t=2)
    prov = pseudolabel(data, data, tmp_path / "p", cfg, where=["split=test"], aligned_where=["split=train"])
    ds = datasets.load_from_disk(str(tmp_path / "p"))
    aligned = datasets.load_from_disk(data).select_columns(["caption", "split"]).filter(lambda r: r["split"] == "train")
    aligned_words = {w for c in aligned["caption"] for w in c.split()}
    assert "captions" not in ds.column_names  # an unaligned image's own texts are withheld
    rows = ds.to_list()
    assert len(rows) == prov["rows_out"] == 6  # the 6 test rows
    for r in rows:
        words = r["caption"].split()
        assert 1 <= len(words) <= 3 and set(words) <= aligned_words and r["is_pseudo"]
        scores = [p["score"] for p in r["pseudo_words"]]
        assert [p["word"] for p in r["pseudo_words"]] == words and scores == sorted(scores, reverse=True)
    saved = json.loads((tmp_path / "p" / "vltool.json").read_text())
    assert saved["command"] == "pseudolabel" and len(saved["inputs"]) == 2
    # seeded crops: the same output again (served from the embedding cache)
    pseudolabel(data, data, tmp_path / "p2", cfg, where=["split=test"], aligned_where=["split=train"])
    assert datasets.load_from_disk(str(tmp_path / "p2"))["caption"] == ds["caption"]


def test_bad_images_dropped_and_counted(tmp_path):
    from vltool.pseudolabel import PseudolabelConfig, pseudolabel

    data, model = _colors(tmp_path, bad_rows=(2,))  # r002 is a test row
    cfg = PseudolabelConfig(model=str(model), crops=2, neighbors=2, words=2)
    prov = pseudolabel(data, data, tmp_path / "p", cfg, where=["split=test"], aligned_where=["split=train"])
    assert prov["stats"]["bad_images"] == 1 and prov["rows_out"] == prov["rows_in"] - 1


def test_errors(tmp_path, cli):
    data, model = _colors(tmp_path)
    r = cli("pseudolabel", data, "--aligned", data, "--model", model, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "ids are in both" in r.stderr
    r = cli("pseudolabel", data, "--aligned", data, "--model", model, "--out", tmp_path / "o",
            "--where", "split=test", "--aligned-where", "split=train", "--strategy", "best")
    assert r.exit_code == 2 and "--strategy must be one of" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_repeated_id_in_either_set_is_refused(tmp_path, cli):
    """Issue 44: aligned data with a repeated id was accepted (ids name the rows: the check that no image is
    in both sets, and the output, read them). The shared check, vltool.checks.require_unique_ids."""
    import datasets

    data, model = _colors(tmp_path)
    ds = datasets.load_from_disk(data)
    ids = list(ds["id"])
    ids[1] = ids[0]  # r000 twice (both train rows)
    ds.remove_columns(["id"]).add_column("id", ids).save_to_disk(str(tmp_path / "dup"))
    dup = str(tmp_path / "dup")
    for unaligned, aligned in ((data, dup), (dup, data)):
        where = ["--where", "split=test", "--aligned-where", "split=train"] if aligned == dup else ["--where", "split=train", "--aligned-where", "split=test"]
        r = cli("pseudolabel", unaligned, "--aligned", aligned, *where, "--model", model, "--out", tmp_path / "o", "--no-progress")
        assert r.exit_code == 2 and f"{dup!r} has duplicate ids (e.g. 'r000')" in r.stderr, r.stderr
        assert not (tmp_path / "o").exists()


def test_agreement_with_withheld_captions_and_permutation_baseline():
    from vltool.pseudolabel import agreement_with_withheld

    pseudo = ["red car", "blue sky", "green tree", "dog"]
    truth = [frozenset({"red", "bus"}), frozenset({"sky"}), frozenset({"tree", "big"}), frozenset({"cat"})]
    c = agreement_with_withheld(pseudo, truth, seed=0, permutations=50)
    assert c["share_with_a_true_word"] == 0.75 and c["rows"] == 4
    assert 0 <= c["permutation_baseline"] < 0.75


@pytest.mark.slow
def test_emoji_halves_end_to_end_beats_permutation_baseline(tmp_path, cli):
    """Aligned half trains the model; the unaligned half (captions withheld) gets pseudo captions that
    share a word with the withheld caption far more often than shuffled images do; the union trains."""
    import json

    from tests.fixtures.training import MINILM, MOBILENET

    if not (MINILM.is_dir() and MOBILENET.is_file()):
        pytest.skip("needs the packaged MobileNetV2 and MiniLM (scripts/install.sh)")
    h = tmp_path / "halves"
    assert cli("split", "emoji", "--where", "split=train", "--by", "base_id", "--parts", "aligned=0.5,unaligned=0.5",
               "--separate", "--out", h).exit_code == 0
    towers = ["--image-tower", "torchvision:mobilenet_v2", "--image-weights", MOBILENET, "--text-tower", f"hf:{MINILM}",
              "--lock-image", "--lock-text", "--augment", "none", "--batch-size", "64", "--lr", "1e-3", "--no-progress"]
    r = cli("pretrain", h / "aligned", "--out", tmp_path / "aligned", *towers, "--epochs", "5")
    assert r.exit_code == 0, r.stderr
    r = cli("pseudolabel", h / "unaligned", "--aligned", h / "aligned", "--model", tmp_path / "aligned",
            "--out", tmp_path / "pseudo", "--json")
    assert r.exit_code == 0, r.stderr
    c = json.loads(r.stdout)["withheld_caption_check"]
    assert c["share_with_a_true_word"] > 3 * c["permutation_baseline_95th"]
    r = cli("pretrain", h / "aligned", tmp_path / "pseudo", "--out", tmp_path / "union", *towers, "--steps", "3")
    assert r.exit_code == 0, r.stderr
