"""`vltool deform`: each operation on hand-made captions, base rows, rmtopfreq, keep-last, num_proc, errors; the
operations' registry (vltool.deform.OPS) against the parser, the record, help, docs and the two implementations."""

import itertools
import json
import random
import re
from collections import Counter
from pathlib import Path

import datasets
import pytest

from vltool import deform as D
from vltool.deform import (OPS, CutOp, DeformConfig, FilterOp, Ops, Parts, Vocabulary, deform, deform_batch, deform_caption, fit_vocabulary,
                           ops_markdown, row_seed)
from vltool.text import english_stopwords, tokenize

STOP = frozenset({"the", "a", "on", "of", "and", "is"})


def vocab(ops, base=(), stop=STOP):
    return fit_vocabulary(base, ops, stop) if base else Vocabulary(stopwords=stop)


def run(text, ops, base=(), seed=0):
    ops = Ops.parse(ops)
    return deform_caption(text, ops, vocab(ops, base), seed)[0]


# --- tokenisation and single operations -------------------------------------------------------------

def test_tokenize_splits_words_and_punctuation_lowercased():
    assert tokenize("The table. Two CATS!") == ["the", "table", ".", "two", "cats", "!"]
    assert tokenize("don't  stop-now, 3.5kg") == ["don't", "stop", "-", "now", ",", "3", ".", "5kg"]


def test_rmstop_drops_stopwords_and_non_alphabetic_tokens():
    assert run("The cat sat on the mat, 3 times.", "rmstop") == "cat sat mat times"
    assert run("A 2nd dog is 5kg", "rmstop") == "dog"


def test_shipped_stopwords_are_nltk_english_list():
    words, source, _ = english_stopwords()
    for w in ("the", "a", "on", "of", "and", "is", "don't", "wouldn't", "itself"):
        assert w in words
    assert "cat" not in words
    assert source == "vltool's copy of NLTK's English list (179 words)"


def test_keep_keeps_first_n_tokens_and_is_always_last():
    assert run("The cat sat on the mat", "keep2") == "the cat"
    # keep listed first is still applied after rmstop
    assert run("The cat sat on the mat", "keep2,rmstop") == "cat sat"
    assert Ops.parse("keep2,rmstop") == Ops.parse("rmstop,keep2")


def test_shuffle_is_a_seeded_permutation():
    text = "one two three four five six seven eight nine ten"
    a = run(text, "shuffle", seed=row_seed(0, "x"))
    b = run(text, "shuffle", seed=row_seed(0, "x"))
    c = run(text, "shuffle", seed=row_seed(1, "x"))
    assert a == b
    assert sorted(a.split()) == sorted(text.split())
    assert a != text and a != c


def test_basevocab_keeps_only_base_words():
    base = ["a dog runs on grass", "the cat sleeps"]
    assert run("A dog and a cat play on the beach", "basevocab", base) == "a dog a cat on the"


def test_rmtopfreq_counts_base_captions_with_stopwords_and_breaks_ties_alphabetically():
    base = ["the dog runs", "the dog sleeps", "a cat sleeps", "the bird"]
    ops = Ops.parse("rmtopfreq2")
    v = fit_vocabulary(base, ops, STOP)
    # captions containing: the 3, dog 2, sleeps 2, runs/a/cat/bird 1; dog < sleeps alphabetically
    assert v.top_words == ["the", "dog"]
    assert v.top_counts == [3, 2]
    assert fit_vocabulary(base, Ops.parse("rmtopfreq3"), STOP).top_words == ["the", "dog", "sleeps"]
    assert run("The dog sleeps near the cat", "rmtopfreq2", base) == "sleeps near cat"


def test_default_cascade_matches_the_paper_ops():
    assert str(Ops.parse("default")) == "shuffle,rmstop,basevocab,rmtopfreq1000,keep4"
    assert str(Ops.parse("keep4 , rmtopfreq10,shuffle")) == "shuffle,rmtopfreq10,keep4"


@pytest.mark.parametrize(
    "bad, msg",
    [("foo", "unknown operation 'foo'"), ("keep0", "keepN needs N >= 1"), ("keep2,keep3", "keep is given twice"),
     ("rmtopfreq", "unknown operation"), ("", "--ops is empty")],
)
def test_bad_ops_are_usage_errors(bad, msg):
    with pytest.raises(D.UsageError, match=msg):
        Ops.parse(bad)


# --- fast path equals the reference ---------------------------------------------------------------

def _random_captions(n, rng):
    words = "a the dog cat man woman red blue runs sits on of in near big small tree car 3 , . ! 2nd".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 14))) for _ in range(n)]


def _values(op):
    """Parameters to try an operation with: None for a plain word, else its minimum, 3 and its example."""
    return [None] if op.param is None else sorted({op.minimum, 3, op.example})


ONE_OP = [op.spell(v) for op in OPS for v in _values(op)]  # every registered operation alone
ALL_OPS = ",".join(op.spell(3 if op.param else None) for op in OPS)


def _same_as_reference(texts, ops, base, seed=7):
    """deform_batch (the fast forms) gives deform_caption's (the reference forms') texts and removed words."""
    v = fit_vocabulary(base, ops, STOP)
    ids = [f"id{i}" for i in range(len(texts))]
    fast, removed = deform_batch(texts, ids, seed, ops, v)
    ref = [deform_caption(t, ops, v, row_seed(seed, i)) for t, i in zip(texts, ids)]
    assert fast == [r[0] for r in ref], str(ops)
    assert removed == Counter(w for r in ref for w in r[1]), str(ops)
    return fast


@pytest.mark.parametrize("ops", ["default", "shuffle,rmstop,keep4", "rmstop,basevocab", "rmtopfreq3,keep2", *ONE_OP, ALL_OPS])
def test_deform_batch_equals_reference(ops):
    texts = _random_captions(300, random.Random(0))
    _same_as_reference(texts, Ops.parse(ops), texts[:30])


HAND_MADE = [
    "The dog runs on the grass.", "A cat, a dog and 3 birds!", "the the the", "", "   ", "dog", "Don't stop-now 5kg",
    "zebra quokka near the old red tree by the sea", "Dog DOG dog cat cat", "2nd place: a small blue car",
]
HAND_BASE = ["the dog runs", "a cat sleeps on the grass", "the red car", "a small dog and the old tree"]


@pytest.mark.parametrize("combo", [(op,) for op in OPS] + list(itertools.combinations(OPS, 2)) + [OPS], ids=lambda c: "+".join(o.name for o in c))
def test_fast_and_reference_forms_agree_on_hand_made_captions(combo):
    """Every registered operation, alone, in pairs and all together, at each of its parameters' values: the fast
    forms give the reference forms' output on captions with stop words, punctuation, digits, words in and out of
    the base vocabulary, repeated words, empty texts. (A new operation in OPS is covered without a new test.)"""
    for values in itertools.product(*(_values(op) for op in combo)):
        ops = Ops.parse(",".join(op.spell(v) for op, v in zip(combo, values)))
        out = _same_as_reference(HAND_MADE, ops, HAND_BASE)
        assert out != [" ".join(tokenize(t)) for t in HAND_MADE], f"{ops} changes none of the hand-made captions"


def test_every_op_round_trips_alone_and_in_combinations():
    """What deform records (`stats.ops`, str(Ops)) parses back to the same operations: each registered
    operation alone at several parameters, every combination in any order, the default cascade."""
    for op in OPS:
        for v in _values(op):
            ops = Ops.parse(op.spell(v))
            assert str(ops) == op.spell(v) and Ops.parse(str(ops)) == ops and op.name in ops and ops.param(op.name) == v
    for r in range(1, len(OPS) + 1):
        for combo in itertools.combinations(OPS, r):
            words = [op.spell(op.example) for op in combo]
            ops = Ops.parse(",".join(words))
            assert str(ops) == ",".join(words)  # recorded in OPS's order
            assert Ops.parse(str(ops)) == ops == Ops.parse(",".join(reversed(words)))
            assert [n for n, _ in ops.chosen] == [op.name for op in combo]
    default = Ops.parse("default")
    assert Ops.parse(str(default)) == default and str(default) == D.DEFAULT_OPS


def test_each_word_names_one_op():
    for op in OPS:
        for v in _values(op):
            assert [o.name for o in OPS if o.match(op.spell(v))] == [op.name]


def test_every_op_is_in_help_docs_and_errors(cli):
    """`vltool deform --help`, docs/deform.md's table and the unknown-operation error list every registered
    operation, from OPS."""
    r = cli("deform", "--help")
    assert r.exit_code == 0
    helped = " ".join(r.stdout.split())
    with pytest.raises(D.UsageError) as e:
        Ops.parse("nope")
    for op in OPS:
        line = f"{op.usage()} {op.paper}: {op.help}"
        assert " ".join(line.split()) in helped, f"vltool deform --help does not list {op.name!r}: {line!r}"
        assert op.usage() in str(e.value), f"the unknown-operation error does not list {op.name!r}"
    doc = (Path(__file__).resolve().parents[1] / "docs" / "deform.md").read_text()
    m = re.search(r"<!-- deform-ops:[^>]*-->\n(.*?)<!-- /deform-ops -->", doc, re.S)
    assert m, "docs/deform.md has lost its <!-- deform-ops --> markers"
    assert m.group(1) == ops_markdown(), (
        "docs/deform.md's operations table is not vltool.deform.OPS's: put the output of\n"
        "  python -c 'from vltool.deform import ops_markdown; print(ops_markdown(), end=\"\")'\nbetween its markers")
    for op in OPS:
        assert f"| `{op.usage()}` | {op.paper} | {op.help} |" in m.group(1)


def test_an_op_without_help_or_example_is_refused_naming_the_registry():
    ref, fast = (lambda t, v: True), (lambda v: Parts())
    with pytest.raises(ValueError, match=r"'rmnum' \(vltool/deform.py OPS\) needs a name, a paper name and a help line"):
        FilterOp("rmnum", "RmNum", "", reference=ref, fast=fast)
    with pytest.raises(ValueError, match=r"'keepx' \(vltool/deform.py OPS\): a parameter needs an example"):
        CutOp("keepx", "KeepX", "keeps x", param="N", reference=lambda toks, n: toks, fast=lambda n, v: n)
    with pytest.raises(TypeError, match="reference"):
        FilterOp("rmnum", "RmNum", "drops numbers", fast=fast)


def test_a_new_op_declared_once_is_parsed_recorded_helped_and_run(monkeypatch):
    """The issue's contributor change: one declaration in OPS, and `--ops rmnum,keep3` is parsed, recorded as
    "rmnum,keep3", listed by help and errors, and runs the same in both implementations."""
    rmnum = FilterOp("rmnum", "RmNum", "drops tokens with a digit",
                     reference=lambda t, v: not any(c.isdigit() for c in t),
                     fast=lambda v: Parts(test=lambda t: not any(c.isdigit() for c in t)))
    ops_list = (*OPS[:-1], rmnum, OPS[-1])
    monkeypatch.setattr(D, "OPS", ops_list)
    monkeypatch.setattr(D, "OP", {op.name: op for op in ops_list})
    ops = Ops.parse("keep3,rmnum")
    assert str(ops) == "rmnum,keep3" and Ops.parse(str(ops)) == ops
    assert "rmnum " in D.ops_help() and "`rmnum`" in D.ops_markdown()
    with pytest.raises(D.UsageError, match=r"rmtopfreq1000\), rmnum, keepN"):
        Ops.parse("nope")
    assert _same_as_reference(["a 2nd car 3 4x dog", "9"], ops, ["a car"]) == ["a car dog", ""]
    assert _same_as_reference(HAND_MADE, Ops.parse("rmnum,rmstop,shuffle"), HAND_BASE)


# --- whole datasets -----------------------------------------------------------------------------------

CAPS = [
    "A man riding a red bike down the street.",
    "The dog sleeps on the red couch.",
    "Two cats play with a ball of wool!",
    "A woman reads a book in the park.",
    "The the the.",
] * 40


def test_base_rows_intact_and_others_deformed(text_dataset, tmp_path):
    src = text_dataset(CAPS)
    prov = deform(src, tmp_path / "out", DeformConfig(ops="shuffle,rmstop,keep4", base_frac=0.1, seed=3))
    ds = datasets.load_from_disk(str(tmp_path / "out"))
    rows = ds.to_list()
    base = [r for r in rows if r["is_base"]]
    assert len(base) == 20 == prov["stats"]["base_rows"]
    assert all(r["caption"] == r["caption_original"] for r in base)
    for r in rows:
        if not r["is_base"]:
            words = r["caption"].split()
            assert 1 <= len(words) <= 4
            assert set(words) <= set(tokenize(r["caption_original"]))
    # "The the the." is all stop words and punctuation: every non-base copy is dropped and counted
    n_the = sum(1 for c in CAPS if c == "The the the.")
    n_the_base = sum(1 for r in base if r["caption_original"] == "The the the.")
    assert prov["stats"]["rows_dropped_empty"] == n_the - n_the_base
    assert prov["stats"]["rows_out"] == len(rows) == len(CAPS) - (n_the - n_the_base)


def test_rmtopfreq_removes_exactly_the_top_base_words(text_dataset, tmp_path):
    rng = random.Random(1)
    texts = _random_captions(500, rng)
    src = text_dataset(texts)
    deform(src, tmp_path / "out", DeformConfig(ops="rmtopfreq5", base_frac=0.2, seed=0))
    rows = datasets.load_from_disk(str(tmp_path / "out")).to_list()
    base_caps = [r["caption_original"] for r in rows if r["is_base"]]
    # independent count: captions containing each alphabetic word, ties alphabetical
    df = {}
    for c in base_caps:
        for w in set(tokenize(c)):
            if w.isalpha():
                df[w] = df.get(w, 0) + 1
    top = {w for w, _ in sorted(df.items(), key=lambda kv: (-kv[1], kv[0]))[:5]}
    assert "the" in top or "a" in top  # stop words are counted
    for r in rows:
        if not r["is_base"]:
            expected = [t for t in tokenize(r["caption_original"]) if t not in top]
            assert r["caption"] == " ".join(expected)


def test_same_output_for_num_proc_1_and_2(text_dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(D, "MIN_ROWS_PER_PROC", 10)
    texts = _random_captions(400, random.Random(2))
    src = text_dataset(texts)
    deform(src, tmp_path / "a", DeformConfig(ops="shuffle,rmstop,basevocab,rmtopfreq3,keep4", seed=5, num_proc=1))
    deform(src, tmp_path / "b", DeformConfig(ops="shuffle,rmstop,basevocab,rmtopfreq3,keep4", seed=5, num_proc=2))
    a = datasets.load_from_disk(str(tmp_path / "a")).to_list()
    b = datasets.load_from_disk(str(tmp_path / "b")).to_list()
    assert a == b and len(a) > 100


def test_one_pool_per_pass_whatever_the_chunks(text_dataset, tmp_path, monkeypatch):
    """deform --num-proc 2 over many TEXT_CHUNKs starts two pools (the vocabulary's pass and the deforming
    pass), not one per chunk, and gives the one-process output."""
    import multiprocessing as mp

    monkeypatch.setattr(D, "MIN_ROWS_PER_PROC", 10)
    monkeypatch.setattr(D, "TEXT_CHUNK", 60)
    ctx = mp.get_context("fork")
    started = []
    real_pool = ctx.Pool
    monkeypatch.setattr(ctx, "Pool", lambda *a, **k: started.append(a) or real_pool(*a, **k))
    src = text_dataset(_random_captions(1000, random.Random(4)))
    cfg = dict(ops="shuffle,rmstop,basevocab,rmtopfreq3,keep4", seed=5, base_frac=0.5)
    deform(src, tmp_path / "a", DeformConfig(**cfg, num_proc=1))
    assert started == []
    deform(src, tmp_path / "b", DeformConfig(**cfg, num_proc=2))
    assert started == [(2,), (2,)]  # 1000 rows are 17 chunks
    a = datasets.load_from_disk(str(tmp_path / "a")).to_list()
    assert a == datasets.load_from_disk(str(tmp_path / "b")).to_list() and len(a) > 500


def test_chunks_of_texts_give_the_same_output(text_dataset, tmp_path, monkeypatch):
    """deform holds TEXT_CHUNK rows' texts as Python strings at a time; any chunk size gives the same
    output and statistics, with a selection (--where) and rows that become empty."""
    texts = _random_captions(400, random.Random(3)) + ["the of and"] * 20 + ["   "] * 5
    src = text_dataset(texts, part=[i % 3 for i in range(len(texts))])
    cfg = DeformConfig(ops="shuffle,rmstop,basevocab,rmtopfreq3,keep4", seed=5)
    whole = deform(src, tmp_path / "whole", cfg, where=["part=0", "part=1"])
    monkeypatch.setattr(D, "TEXT_CHUNK", 7)
    chunked = deform(src, tmp_path / "chunked", cfg, where=["part=0", "part=1"])
    a = datasets.load_from_disk(str(tmp_path / "whole")).to_list()
    b = datasets.load_from_disk(str(tmp_path / "chunked")).to_list()
    assert a == b and whole["stats"] == chunked["stats"] and 100 < len(a) < 300
    assert whole["stats"]["rows_dropped_empty"] > 0


def test_a_second_deform_keeps_the_first_intact_text_and_the_column_order(text_dataset, tmp_path):
    """The output's columns: the input's, the deformed text in the text column's place, then
    `caption_original` and `is_base`; a second deform deforms the deformed text again, keeps the first
    one's `caption_original` (the intact text) and replaces `is_base`."""
    src = text_dataset(CAPS[:5], part=[0, 1, 0, 1, 0])
    deform(src, tmp_path / "once", DeformConfig(ops="shuffle", base_frac=0, seed=3))
    deform(str(tmp_path / "once"), tmp_path / "twice", DeformConfig(ops="rmstop", base_frac=0))
    once = datasets.load_from_disk(str(tmp_path / "once"))
    twice = datasets.load_from_disk(str(tmp_path / "twice"))
    original = datasets.load_from_disk(src)
    assert once.column_names == [*original.column_names, "caption_original", "is_base"] == twice.column_names
    assert once["caption_original"] == original["caption"] and len(once) == 5
    first = {r["id"]: r for r in once}
    assert 0 < len(twice) < 5 and twice.features == once.features and twice["is_base"] == [False] * len(twice)
    for r in twice:  # the intact text of the first deform; the first deform's text, deformed again
        assert r["caption_original"] == first[r["id"]]["caption_original"]
        ops, vocab = Ops.parse("rmstop"), Vocabulary(stopwords=english_stopwords().words)
        assert r["caption"] == deform_caption(first[r["id"]]["caption"], ops, vocab, row_seed(0, r["id"]))[0]


def test_base_frac_zero_deforms_every_row(text_dataset, tmp_path):
    src = text_dataset(CAPS[:5])
    prov = deform(src, tmp_path / "o", DeformConfig(ops="rmstop", base_frac=0))
    rows = datasets.load_from_disk(str(tmp_path / "o")).to_list()
    assert [r["caption"] for r in rows] == [
        "man riding red bike street", "dog sleeps red couch", "two cats play ball wool", "woman reads book park"]
    assert prov["stats"]["rows_dropped_empty"] == 1 and prov["stats"]["base_rows"] == 0
    assert prov["stats"]["avg_caption_len_before"] == pytest.approx((9 + 7 + 8 + 8 + 3) / 5)
    assert prov["stats"]["avg_caption_len_after"] == pytest.approx((5 + 4 + 5 + 4) / 4)
    assert prov["stats"]["dataset_size_change_pct"] == -20.0


def test_other_columns_pass_through_and_provenance(text_dataset, tmp_path):
    src = text_dataset(CAPS[:5], extra=[1, 2, 3, 4, 5], split=["train", "test", "train", "train", "test"])
    prov = deform(src, tmp_path / "o", DeformConfig(ops="rmstop", base_frac=0), where=["split=train"])
    ds = datasets.load_from_disk(str(tmp_path / "o"))
    assert ds.column_names == ["id", "caption", "extra", "split", "caption_original", "is_base"]
    assert ds["extra"] == [1, 3, 4]
    saved = json.loads((tmp_path / "o" / "vltool.json").read_text())
    assert saved["command"] == "deform" and saved["vltool_version"]
    assert saved["inputs"][0]["where"] == ["split=train"]
    assert saved["inputs"][0]["rows_on_disk"] == 5 and saved["inputs"][0]["rows"] == 3
    assert saved["rows_in"] == 3 and saved["rows_out"] == 3
    assert saved["options"]["ops"] == "rmstop" and "wall_time_s" in saved
    assert saved["stats"]["stopwords"] == prov["stats"]["stopwords"]
    assert saved["stats"]["stopwords_sha256"] == english_stopwords().sha256  # the list it used, by digest


def test_failed_write_leaves_no_output_and_input_untouched(text_dataset, tmp_path, monkeypatch):
    src = text_dataset(CAPS[:5])
    before = {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir()}

    def boom(self, *a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", boom)
    with pytest.raises(RuntimeError):
        deform(src, tmp_path / "o", DeformConfig(ops="rmstop"))
    assert not (tmp_path / "o").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".o.")] == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir()} == before


# --- the command line -------------------------------------------------------------------------------

def test_cli_prints_statistics_and_json(text_dataset, tmp_path, cli):
    src = text_dataset(CAPS)
    r = cli("deform", src, "--out", tmp_path / "o", "--ops", "shuffle,rmstop,keep4")
    assert r.exit_code == 0, r.output
    assert "rows dropped (empty)" in r.stdout and "avg caption length" in r.stdout
    r = cli("deform", src, "--out", tmp_path / "o2", "--ops", "rmstop", "--json")
    assert r.exit_code == 0
    stats = json.loads(r.stdout)
    assert stats["rows_in"] == 200 and stats["ops"] == "rmstop"


@pytest.mark.parametrize(
    "args, code, msg",
    [
        (["nope", "--out", "{o}"], 2, "dataset 'nope' does not exist"),
        (["{src}", "--out", "{exists}"], 2, "exists; pass --overwrite"),
        (["{src}", "--out", "{o}", "--ops", "foo"], 2, "unknown operation 'foo'"),
        (["{src}", "--out", "{o}", "--text-column", "title"], 2, "has no column 'title' (it has: id, caption)"),
        (["{src}", "--out", "{o}", "--ops", "basevocab", "--base-frac", "0"], 2, "--base-frac 0 leaves none"),
        (["{src}", "--out", "{o}", "--base-frac", "1.5"], 2, "--base-frac must be in [0, 1)"),
        (["{src}", "--out", "{src}", "--overwrite"], 2, "inputs are never modified"),
        (["{src}", "--out", "{o}", "--where", "nocol=1"], 2, "has no column 'nocol'"),
        (["{src}", "--out", "{o}", "--split", "train"], 2, "not a DatasetDict"),
    ],
)
def test_cli_errors_are_one_line_with_exit_code(text_dataset, tmp_path, cli, args, code, msg):
    src = text_dataset(CAPS[:5])
    (tmp_path / "exists").mkdir()
    fmt = {"src": src, "o": str(tmp_path / "o"), "exists": str(tmp_path / "exists")}
    r = cli("deform", *[a.format(**fmt) for a in args])
    assert r.exit_code == code
    assert msg in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_overwrite_replaces_output(text_dataset, tmp_path, cli):
    src = text_dataset(CAPS[:5])
    assert cli("deform", src, "--out", tmp_path / "o", "--ops", "keep1").exit_code == 0
    assert cli("deform", src, "--out", tmp_path / "o", "--ops", "keep2", "--overwrite").exit_code == 0
    assert datasets.load_from_disk(str(tmp_path / "o"))[0]["caption"].count(" ") in (0, 1)
    assert json.loads((tmp_path / "o" / "vltool.json").read_text())["options"]["ops"] == "keep2"


def test_a_base_row_without_text_is_dropped_and_not_counted(text_dataset, tmp_path):
    """6 rows, base_frac 0.5 (seed 0: rows 3, 4, 5 are the base rows), row 5 only whitespace: it has no
    text and is dropped; base_rows counts the output's 2 base rows (it said 3)."""
    from vltool.deform import choose_base

    assert choose_base(6, 0.5, 0).tolist() == [False, False, False, True, True, True]
    src = text_dataset([*CAPS[:5], "   "])
    prov = deform(src, tmp_path / "o", DeformConfig(ops="rmstop", base_frac=0.5, seed=0))
    rows = datasets.load_from_disk(str(tmp_path / "o")).to_list()
    assert [r["is_base"] for r in rows] == [False, False, False, True, True]
    assert [r["caption"] for r in rows[3:]] == CAPS[3:5]  # base rows intact
    assert prov["stats"]["base_rows"] == 2 and prov["stats"]["deformed_rows"] == 3 and prov["stats"]["rows_dropped_empty"] == 1


def test_deform_never_imports_torch(text_dataset, tmp_path):
    """Commands that never touch a model stay light in a plain run: no torch (about 0.5 GB of memory and a
    second or two of start-up), even where they ask whether this is the main process."""
    import subprocess
    import sys

    data = text_dataset(["a red cat sits on the mat", "the blue dog runs", "the cat and the dog"])
    code = ("import sys; from vltool.cli import main; sys.argv = ['vltool', 'deform', sys.argv[1], '--ops', 'shuffle', "
            "'--out', sys.argv[2]]\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, str(data), str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False" and (tmp_path / "out" / "vltool.json").exists()
