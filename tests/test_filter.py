"""`vltool filter`: hashed n-gram features, the fastText-style classifier, and the command."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from vltool.errors import UsageError
from vltool.filter import FilterConfig, Scorer, featurize, featurize_one, filter_dataset, make_model
from vltool.filter import filter as run_filter

OBJECTS = "dog cat man woman child car bus table pizza bird horse tree boat plate bench kite".split()
PLACES = "field street kitchen beach room park water snow".split()


def coco_like(rng: random.Random) -> str:
    return (f"a {rng.choice(['small', 'large', 'young', 'white', 'brown'])} {rng.choice(OBJECTS)} "
            f"{rng.choice(['sitting', 'standing', 'lying', 'walking'])} on a {rng.choice(OBJECTS)} in the "
            f"{rng.choice(PLACES)}.")


def web_like(rng: random.Random) -> str:
    return rng.choice([
        f"{rng.choice(OBJECTS).upper()} {rng.randint(1990, 2022)} - stock photo #{rng.choice(OBJECTS)}",
        f"IMG_{rng.randint(1000, 9999)}.JPG {rng.choice(PLACES)} trip {rng.randint(1990, 2022)}",
        f"{rng.choice(PLACES).title()} @ http://img{rng.randint(1, 99)}.example.com/{rng.choice(OBJECTS)}",
    ])


@pytest.fixture
def two_styles(tmp_path):
    """A source set half COCO-like, half web-like (ids say which), and a COCO-like reference set."""
    import datasets

    rng = random.Random(0)
    # like CC or YFCC against COCO: a minority of the source (one row in five) reads like the reference
    src = [coco_like(rng) if i % 5 == 0 else web_like(rng) for i in range(300)]
    datasets.Dataset.from_dict({
        "id": [f"{'c' if i % 5 == 0 else 'w'}{i}" for i in range(300)],
        "caption": src,
        "split": ["train" if i < 240 else "test" for i in range(300)],
    }).save_to_disk(str(tmp_path / "src"))
    ref = [coco_like(rng) for _ in range(200)]
    datasets.Dataset.from_dict({
        "id": [f"r{i}" for i in range(100)],
        "caption": ref[:100],
        "captions": [[ref[100 + i], ref[i]] for i in range(100)],
    }).save_to_disk(str(tmp_path / "ref"))
    return str(tmp_path / "src"), str(tmp_path / "ref")


# ---------------------------------------------------------------------------------------------- features

TEXTS = [
    "A dog on a couch.", "  lead  and trail ", "", None, "#2011 http://x.com/a_b?q=1 don't", "tab\there\x0bvt x\x1cy",
    "STOCK PHOTO - 2011", "a", "one two three four five",
]
UNICODE = ["café naïve", "日本語のテキスト", "😀 face!", "½ cup", "dash—dash – “quoted”", "A dog."]


@pytest.mark.parametrize("texts", [TEXTS, TEXTS + UNICODE], ids=["ascii", "unicode"])
@pytest.mark.parametrize("ngrams", [1, 2, 3])
def test_featurize_matches_the_reference(texts, ngrams):
    ids, offsets = featurize(texts, 1000, ngrams)
    assert len(offsets) == len(texts) + 1
    for i, t in enumerate(texts):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == featurize_one(t, 1000, ngrams), t


def test_features_are_unigrams_then_bigrams():
    one = featurize_one("red dog", 1 << 20, 2)
    assert len(one) == 3  # red, dog, "red dog"
    assert featurize_one("dog red", 1 << 20, 2)[:2] == one[1::-1]  # unigram buckets do not depend on position
    assert featurize_one("Red, DOG", 1 << 20, 1) == featurize_one("red , dog", 1 << 20, 1)  # lower-case, punctuation


def test_fast_scorer_equals_the_model():
    """Scorer (a table look-up) against the PyTorch model it folds, with n-grams never seen in training."""
    import torch

    from vltool.filter import Classifier

    known = sorted({b for t in TEXTS[:5] for b in featurize_one(t, 512, 2)})
    model = make_model(len(known), 8, seed=0)
    with torch.no_grad():
        model.linear.weight.normal_()
        model.linear.bias.fill_(0.3)
    clf = Classifier(model, np.array(known), 512, 2)
    scorer = Scorer.from_classifier(clf)
    texts = TEXTS + UNICODE
    np.testing.assert_allclose(scorer.logits(texts), clf.logits(texts), rtol=1e-5, atol=1e-6)
    assert scorer.logits(["", "zzz qqq"]) == pytest.approx([0.3, 0.3])  # no known n-gram: the bias alone


def test_features_in_slices_and_threads_equal_one_pass(monkeypatch):
    """Features.of cuts the texts into chunks featurized on two threads: the same CSR as one chunk."""
    import vltool.filter as F

    texts = (TEXTS + UNICODE) * 7
    whole = F.Features.of(texts, 1000, 2)
    monkeypatch.setattr(F, "_CHUNK", 5)
    cut = F.Features.of(texts, 1000, 2)
    assert whole.ids.dtype == np.int32 and cut.ids.tolist() == whole.ids.tolist()
    assert cut.offsets.tolist() == whole.offsets.tolist()
    ids, starts = cut.bags(np.array([7, 0, 7]))
    expect = [featurize_one(texts[i], 1000, 2) for i in (7, 0, 7)]
    assert ids.tolist() == sum(expect, []) and starts.tolist() == [0, len(expect[0]), len(expect[0]) + len(expect[1])]
    assert np.flatnonzero(cut.seen(np.array([0, 4]), 1000)).tolist() == sorted(
        set(featurize_one(texts[0], 1000, 2) + featurize_one(texts[4], 1000, 2)))


def test_one_featurizing_pass_trains_and_scores_as_the_plain_path(two_styles, monkeypatch):
    """filter_dataset featurizes every caption once and trains each classifier on rows of those features
    (train_on_rows, Scorer.row_scores). Reference: the plain path, which takes each classifier's training
    texts, featurizes them (train_classifier) and scores the held-out texts (Scorer.scores). The scores
    and the held-out metrics are equal bit for bit, in slices of 7 rows too."""
    import datasets
    import pyarrow as pa

    import vltool.filter as F

    ds = datasets.load_from_disk(two_styles[0])
    ref = list(datasets.load_from_disk(two_styles[1])["caption"])
    config = F.FilterConfig(folds=3, min_steps=30, epochs=2, batch_size=32)

    def assign(n, salt):  # filter_dataset's parts
        part = np.empty(n, dtype=np.int64)
        part[np.random.default_rng([config.seed, salt]).permutation(n)] = np.arange(n) % config.folds
        return part

    src = list(ds["caption"])
    part_s, part_r = assign(len(src), 0), assign(len(ref), 1)
    expect = np.empty(len(src))
    held_ref, held_src = [], []
    for f in range(config.folds):
        pick = lambda texts, part, keep: [t for t, p in zip(texts, part) if keep(p)]  # noqa: E731
        clf, _ = F.train_classifier(pick(ref, part_r, lambda p: p != f), pick(src, part_s, lambda p: p != f), config)
        scorer = F.Scorer.from_classifier(clf)
        expect[part_s == f] = scorer.scores(pick(src, part_s, lambda p: p == f))
        held_src.append(expect[part_s == f])
        held_ref.append(scorer.scores(pick(ref, part_r, lambda p: p == f)))
    heldout = F.heldout_metrics(np.concatenate(held_ref), np.concatenate(held_src), config.seed)
    feats = F.Features.of(ref + src, config.buckets, config.ngrams)
    rows = np.arange(len(ref), len(ref) + len(src))[::-1].copy()
    assert np.array_equal(scorer.row_scores(feats, rows), scorer.scores(src[::-1]))  # float64, bit for bit

    for chunk in (F._CHUNK, 7):
        monkeypatch.setattr(F, "_CHUNK", chunk)
        out, stats = filter_dataset(ds, pa.chunked_array([pa.array(ref)]), config)
        everything = dict(zip(out["id"], out["quality_score"]))
        kept = [i for i, s in zip(ds["id"], expect) if s >= 0.5]
        assert out["id"] == kept and 0 < len(kept) < len(src)
        assert [everything[i] for i in kept] == [float(np.float32(s)) for s, i in zip(expect, ds["id"]) if s >= 0.5]
        assert stats["heldout"] == heldout and stats["score_quantiles"]["0.5"] == round(float(np.quantile(expect, 0.5)), 4)


# ---------------------------------------------------------------------------------------------- filter


def test_filter_keeps_the_reference_like_rows(two_styles, tmp_path):
    src, ref = two_styles
    out = tmp_path / "out"
    prov = run_filter(src, ref, out, FilterConfig())
    import datasets

    ds = datasets.load_from_disk(str(out))
    kept = ds["id"]
    coco_kept = sum(i.startswith("c") for i in kept)
    assert coco_kept >= 0.85 * 60  # the reference-like rows are kept ...
    assert coco_kept == len(kept)  # ... and only they
    assert all(s >= 0.5 for s in ds["quality_score"])
    assert ds.column_names == ["id", "caption", "split", "quality_score"]
    s = prov["stats"]
    # reference-like source rows are indistinguishable from the reference: 80% of held-out rows can be told
    h = s["heldout"]
    assert h["accuracy"] >= 0.8 and h["chance_accuracy"] == pytest.approx(300 / 400) and h["heldout_rows"] == 400
    assert h["source_called_source_like"] >= 0.75 and h["reference_called_reference_like"] >= 0.9
    lo, hi = h["accuracy_ci95"]
    assert lo <= h["accuracy"] <= hi
    assert (s["train_source_rows"], s["train_reference_captions"]) == (240, 80)  # 80% of each set per classifier
    assert len(s["classifier"]["per_classifier"]) == 5
    assert s["rows_in"] == 300 and s["rows_out"] == len(kept) and len(s["examples_kept"]) == 5
    assert all(e["id"].startswith("w") for e in s["examples_dropped"])
    source_like = [g for g, _ in s["top_ngrams"]["source_like"]]
    assert any(g in ("#", "-", "stock", "photo", "http", "img", "jpg", "@", "trip") for g in source_like)
    meta = json.loads((out / "vltool.json").read_text())
    assert meta["command"] == "filter" and len(meta["inputs"]) == 2 and meta["stats"]["heldout"] == s["heldout"]
    assert meta["options"]["resolved_threshold"] == 0.5


def test_keep_frac_and_threshold(two_styles, tmp_path):
    import datasets

    src, ref = two_styles
    p1 = run_filter(src, ref, tmp_path / "a", FilterConfig(keep_frac=0.1))
    a = datasets.load_from_disk(str(tmp_path / "a"))
    assert a.num_rows == 30 and p1["stats"]["score_cutoff"] == pytest.approx(min(a["quality_score"]), abs=1e-6)
    assert all(i.startswith("c") for i in a["id"])
    run_filter(src, ref, tmp_path / "all", FilterConfig(threshold=0.0))
    full = datasets.load_from_disk(str(tmp_path / "all"))
    assert full.num_rows == 300  # scores for every row
    top = sorted(zip(full["quality_score"], range(300)), key=lambda t: -t[0])[:30]
    assert sorted(full.select([i for _, i in top])["id"]) == sorted(a["id"])
    with pytest.raises(UsageError, match="not both"):
        FilterConfig(threshold=0.5, keep_frac=0.5).validate()


def test_deterministic_under_the_seed(two_styles):
    import datasets

    src = datasets.load_from_disk(two_styles[0])
    ref = datasets.load_from_disk(two_styles[1])["caption"]
    a, _ = filter_dataset(src, ref, FilterConfig(threshold=0.0, seed=3, folds=2))
    b, _ = filter_dataset(src, ref, FilterConfig(threshold=0.0, seed=3, folds=2))
    assert a["quality_score"] == b["quality_score"]


def test_training_rows_are_the_selected_rows(two_styles, tmp_path):
    """Only the rows --where selects reach the classifier, and only they are written."""
    import datasets

    src, ref = two_styles
    prov = run_filter(src, ref, tmp_path / "o", FilterConfig(threshold=0.0, folds=2), where=["split=train"],
                      reference_where=["id!=r0"])
    assert prov["stats"]["rows_in"] == 240 and prov["stats"]["train_source_rows"] == 120
    assert prov["stats"]["reference_captions"] == 99 and prov["stats"]["heldout"]["heldout_rows"] == 240 + 99
    assert set(datasets.load_from_disk(str(tmp_path / "o"))["split"]) == {"train"}


def test_output_is_built_on_the_input_table(two_styles, tmp_path):
    """Under --where, the written rows are the selected rows kept, each with its own score (as scoring the
    selection row by row gives), a second filter replaces the first one's scores, and the output pickles as
    the input's files (a 3 MB column in a few kB: it used to flatten the selection and copy every column)."""
    import pickle

    import datasets

    from vltool.io import load_dataset

    src, ref = two_styles
    big = tmp_path / "big"
    d = datasets.load_from_disk(src)
    d.add_column("blob", [bytes([i % 251]) * 10_000 for i in range(len(d))]).save_to_disk(str(big))
    sel = load_dataset(str(big), where=["split=train"]).dataset
    refs = datasets.load_from_disk(ref)["caption"]
    out, stats = filter_dataset(sel, refs, FilterConfig(threshold=0.5, folds=2))
    everything, _ = filter_dataset(sel, refs, FilterConfig(threshold=0.0, folds=2))
    assert len(pickle.dumps(out.data)) < 50_000 and out.data.nbytes > 2_000_000
    scores = dict(zip(everything["id"], everything["quality_score"]))
    assert len(everything) == 240 and set(everything["split"]) == {"train"}
    assert out["id"] == [i for i in everything["id"] if scores[i] >= 0.5] and 0 < len(out) < 240
    assert out["quality_score"] == [scores[i] for i in out["id"]] and out["blob"][0] == sel[sel["id"].index(out["id"][0])]["blob"]
    run_filter(src, ref, tmp_path / "once", FilterConfig(threshold=0.0, folds=2))
    run_filter(str(tmp_path / "once"), ref, tmp_path / "twice", FilterConfig(threshold=0.0, folds=2, seed=7))
    twice = datasets.load_from_disk(str(tmp_path / "twice"))
    assert twice.column_names == ["id", "caption", "split", "quality_score"]
    assert twice["quality_score"] != datasets.load_from_disk(str(tmp_path / "once"))["quality_score"]


def test_reference_list_column_is_flattened(two_styles, tmp_path):
    src, ref = two_styles
    prov = run_filter(src, ref, tmp_path / "o", FilterConfig(reference_column="captions", folds=2))
    assert prov["stats"]["reference_captions"] == 200
    assert prov["stats"]["heldout"]["balanced_accuracy"] >= 0.85


def test_errors(two_styles, tmp_path):
    import datasets

    src, ref = two_styles
    with pytest.raises(UsageError, match="no column 'text'"):
        run_filter(src, ref, tmp_path / "o", FilterConfig(text_column="text"))
    with pytest.raises(UsageError, match="holds lists of texts, not one string per row"):
        run_filter(ref, src, tmp_path / "o", FilterConfig(text_column="captions", reference_column="caption"))
    with pytest.raises(UsageError, match="at least 2"):
        run_filter(src, ref, tmp_path / "o", FilterConfig(), reference_where=["id=r0"])
    with pytest.raises(UsageError, match="inputs are never modified"):
        run_filter(src, ref, ref + "/inside", FilterConfig())
    problems = FilterConfig(threshold=2, folds=0, ngrams=9, epochs=0)
    with pytest.raises(UsageError) as e:
        problems.validate()
    assert all(opt in str(e.value) for opt in ("--threshold", "--folds", "--ngrams", "--epochs"))
    datasets.Dataset.from_dict({"id": ["x"], "caption": ["a"]}).save_to_disk(str(tmp_path / "one"))
    with pytest.raises(UsageError, match="at least 2"):
        run_filter(str(tmp_path / "one"), ref, tmp_path / "o", FilterConfig())


def cli(*args):
    from typer.testing import CliRunner

    from vltool.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_prints_accuracy_counts_and_examples(two_styles, tmp_path):
    src, ref = two_styles
    r = cli("filter", src, "--reference", ref, "--out", tmp_path / "o")
    assert r.exit_code == 0, r.stderr
    assert "held-out accuracy" in r.stdout and "rows kept" in r.stdout
    assert "kept:" in r.stdout and "dropped:" in r.stdout and "stock photo" in r.stdout.lower()
    r = cli("filter", src, "--reference", ref, "--out", tmp_path / "j", "--keep-frac", "0.5", "--json")
    assert r.exit_code == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["rows_out"] == 150 and stats["out"] == str(tmp_path / "j")
    r = cli("filter", src, "--reference", ref, "--out", tmp_path / "one", "--folds", "1", "--json")
    assert r.exit_code == 0, r.stderr
    one = json.loads(r.stdout)
    assert one["heldout"]["heldout_rows"] == 80 and len(one["classifier"]["per_classifier"]) == 1
    r = cli("filter", src, "--reference", ref, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "--overwrite" in r.stderr
    r = cli("filter", src, "--reference", ref, "--out", tmp_path / "x", "--threshold", "0.5", "--keep-frac", "0.5")
    assert r.exit_code == 2 and "not both" in r.stderr


def test_cli_on_the_emoji_data(tmp_path):
    """The built-in data: train rows scored against a reference made of the emoji keyword lists."""
    import datasets

    emoji = datasets.load_from_disk("vltool/assets/emoji").select_columns(["captions", "split"])
    words = [c for row in emoji.filter(lambda s: s == "test", input_columns="split")["captions"] for c in row[1:]]
    datasets.Dataset.from_dict({"caption": words}).save_to_disk(str(tmp_path / "ref"))
    r = cli("filter", "emoji", "--where", "split=train", "--reference", tmp_path / "ref", "--out", tmp_path / "o",
            "--json")
    assert r.exit_code == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["rows_in"] == 2986 and 0 < stats["rows_out"] < 2986


def bootstrap_ci_reference(correct: np.ndarray, seed: int, n_boot: int) -> tuple[float, float]:
    """The percentile bootstrap by resampling indices (n_boot x n of them)."""
    idx = np.random.default_rng(seed).integers(0, len(correct), size=(n_boot, len(correct)))
    means = correct[idx].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


@pytest.mark.parametrize("n,k", [(40, 3), (200, 150), (500, 250)])
def test_bootstrap_ci_equals_resampling_indices(n, k):
    """Binomial(n, k/n) replicates are the resampled means' distribution: with many replicates both give the
    same interval (to the bootstrap's own noise); all-correct and empty vectors give the degenerate answers."""
    from vltool.filter import bootstrap_ci

    correct = np.zeros(n)
    correct[np.random.default_rng(1).permutation(n)[:k]] = 1
    lo, hi = bootstrap_ci(correct, seed=0, n_boot=40_000)
    ref_lo, ref_hi = bootstrap_ci_reference(correct, seed=0, n_boot=40_000)
    assert lo == pytest.approx(ref_lo, abs=1.01 / n) and hi == pytest.approx(ref_hi, abs=1.01 / n)
    assert lo < k / n < hi
    assert bootstrap_ci(np.ones(n), seed=0) == (1.0, 1.0)
    assert all(np.isnan(bootstrap_ci(np.zeros(0), seed=0)))


def test_rows_without_text_are_left_out_with_a_warning(two_styles, tmp_path, capsys):
    """Issue 44: rows whose caption is None were scored as text and some were kept; docs/conventions.md
    ("No text is no text"): None, "" and whitespace are left out, with one warning. The other rows get the
    scores they get without those rows."""
    import datasets

    src, ref = two_styles
    ds = datasets.load_from_disk(src)
    none_rows = set(range(0, 300, 7)) | {5}
    caps = [None if i in none_rows else (" " if i == 5 else c) for i, c in enumerate(ds["caption"])]
    holed = ds.remove_columns(["caption"]).add_column("caption", caps, feature=datasets.Value("string"))
    holed.save_to_disk(str(tmp_path / "holed"))
    clean = ds.select([i for i in range(300) if i not in none_rows])
    clean.save_to_disk(str(tmp_path / "clean"))
    capsys.readouterr()
    prov = run_filter(str(tmp_path / "holed"), ref, tmp_path / "a", FilterConfig(threshold=0.0, folds=2))
    assert f"{len(none_rows)} of 300 rows have no text in 'caption'" in capsys.readouterr().err
    a = datasets.load_from_disk(str(tmp_path / "a"))
    assert not set(a["id"]) & {ds["id"][i] for i in none_rows} and None not in a["caption"]
    assert a.num_rows == 300 - len(none_rows)  # (threshold 0: every row with text kept)
    s = prov["stats"]
    assert (s["rows_in"], s["rows_out"], s["rows_without_text"], s["rows_dropped"]) == (300, a.num_rows, len(none_rows), len(none_rows))
    run_filter(str(tmp_path / "clean"), ref, tmp_path / "b", FilterConfig(threshold=0.0, folds=2))
    b = datasets.load_from_disk(str(tmp_path / "b"))
    assert a["id"] == b["id"] and a["quality_score"] == b["quality_score"]
