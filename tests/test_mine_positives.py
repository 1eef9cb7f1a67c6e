"""FFF positive mining (equation 1): each term, thresholds, directionality, captions, cap, calibration."""

import numpy as np
import pytest

from tests.fixtures.launch import launch
from vltool.mine_positives import Thresholds, _normalise, calibrate, dense_reference, mine, summarise

D = 16


def e(i):
    v = np.zeros(D, dtype=np.float32)
    v[i] = 1
    return v


def mix(*parts):
    return np.sum([a * v for a, v in parts], axis=0).astype(np.float32)


def sq(x):
    return float(np.sqrt(1 - x * x))


def hand_built():
    """Row 0's image against rows 1..6; free directions: texts on axes 1-7, images on axes 8-15."""
    t0 = mix((0.25, e(0)), (sq(0.25), e(1)))
    w = mix((-sq(0.25), e(0)), (0.25, e(1)))  # unit, orthogonal to t0, negative along img0
    img = [e(0), e(9), e(10), mix((0.93, e(0)), (sq(0.93), e(11))), mix((0.91, e(0)), (sq(0.91), e(12))), e(13), e(14)]
    txt = [
        t0,
        mix((0.28, e(0)), (sq(0.28), e(2))),  # S_it(0,1) = 0.28 > p1
        mix((0.26, e(0)), (sq(0.26), e(3))),  # S_it(0,2) = 0.26: just below p1
        e(4),  # row 3: image 0.93 like image 0 > p2
        e(5),  # row 4: image 0.91 like image 0: just below p2
        mix((0.995, t0), (sq(0.995), e(6))),  # S_tt(0,5) = 0.995 > p3 and S_it(0,5) = 0.249 > p1'
        mix((0.995, t0), (sq(0.995), w)),  # S_tt(0,6) = 0.995 but S_it(0,6) = 0.15 < p1'
    ]
    return np.stack(img), np.stack(txt)


def test_each_term_fires_and_pairs_just_below_do_not():
    img, txt = hand_built()
    m = mine(img, txt)
    pos = m.positives[0].tolist()
    assert sorted(pos) == [1, 3, 5]
    terms = {j: t.tolist() for j, t in zip(pos, m.terms[0])}
    assert terms == {1: [True, False, False], 3: [False, True, False], 5: [False, False, True]}
    s = {j: sc for j, sc in zip(pos, m.scores[0])}
    assert s[1][0] == pytest.approx(0.28, abs=1e-5) and s[3][1] == pytest.approx(0.93, abs=1e-5)
    assert s[5][2] == pytest.approx(0.995, abs=1e-4) and s[5][0] == pytest.approx(0.995 * 0.25, abs=1e-4)
    assert pos == [1, 5, 3]  # ordered by S_it descending


def test_directional_and_never_itself():
    img, txt = hand_built()
    m = mine(img, txt)
    assert all(i not in p.tolist() for i, p in enumerate(m.positives))
    # image 0 -> text 1 is positive; image 1 -> text 0 is not (S_it is not symmetric)
    assert 1 in m.positives[0].tolist() and 0 not in m.positives[1].tolist()
    # image-image is symmetric: image 3 gets row 0
    assert 0 in m.positives[3].tolist()


def test_matches_dense_equation_on_random_clusters():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(12, 32))
    lab = rng.integers(0, 12, size=300)
    img = centers[lab] + 0.6 * rng.normal(size=(300, 32))
    txt = centers[lab] + 0.8 * rng.normal(size=(300, 32))
    th = Thresholds(p_it=0.55, p_ii=0.75, p_tt=0.8, p_it_tt=0.45)
    m = mine(img, txt, thresholds=th, chunk=64)
    dense = dense_reference(img, txt, thresholds=th)
    got = np.zeros_like(dense)
    for i, p in enumerate(m.positives):
        got[i, p] = True
    assert dense.sum() > 300 and (got == dense).all()


@pytest.mark.parametrize("terms", ["it", "ii", "tt", "it,ii", "ii,tt"])
def test_term_ablation_matches_the_dense_equation(terms):
    """FFF Table 5: M with some of its three terms; the dense reference drops the same terms."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(12, 32))
    lab = rng.integers(0, 12, size=300)
    img = centers[lab] + 0.6 * rng.normal(size=(300, 32))
    txt = centers[lab] + 0.8 * rng.normal(size=(300, 32))
    full = Thresholds(p_it=0.55, p_ii=0.75, p_tt=0.8, p_it_tt=0.45)
    th = Thresholds(p_it=0.55, p_ii=0.75, p_tt=0.8, p_it_tt=0.45, terms=terms)
    m = mine(img, txt, thresholds=th, chunk=64)
    dense = dense_reference(img, txt, thresholds=th)
    got = np.zeros_like(dense)
    for i, p in enumerate(m.positives):
        got[i, p] = True
    assert (got == dense).all() and 0 < dense.sum() <= dense_reference(img, txt, thresholds=full).sum()
    fired = np.concatenate([t for t in m.terms if len(t)])
    for k, name in enumerate(["it", "ii", "tt"]):
        assert fired[:, k].any() == (name in terms)


def test_bad_terms_are_a_usage_error():
    from vltool.errors import UsageError

    with pytest.raises(UsageError, match="--terms"):
        Thresholds(terms="it,xx").validate()


def test_several_captions_per_row_aggregate_as_documented():
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(6, 24))
    lab = rng.integers(0, 6, size=60)
    img = centers[lab] + 0.5 * rng.normal(size=(60, 24))
    owner = np.repeat(np.arange(60), rng.integers(1, 4, size=60))
    txt = centers[lab[owner]] + 0.7 * rng.normal(size=(len(owner), 24))
    th = Thresholds(p_it=0.6, p_ii=0.8, p_tt=0.5, p_it_tt=0.4)
    m = mine(img, txt, owner=owner, thresholds=th, chunk=16)
    dense = dense_reference(img, txt, owner=owner, thresholds=th)
    got = np.zeros_like(dense)
    for i, p in enumerate(m.positives):
        got[i, p] = True
    assert dense.sum() > 60 and (got == dense).all()
    # S_tt is the mean over caption pairs: check one pair by hand
    t = txt / np.linalg.norm(txt, axis=1, keepdims=True)
    i = 0
    j = int(m.positives[0][0])
    manual = (t[owner == i] @ t[owner == j].T).mean()
    assert m.scores[0][0][2] == pytest.approx(manual, abs=1e-5)
    assert m.scores[0][0][0] == pytest.approx((t[owner == j] @ (img[i] / np.linalg.norm(img[i]))).max(), abs=1e-5)


def test_cap_keeps_highest_and_is_reported():
    img = np.tile(e(0), (10, 1)) + 0.01 * np.random.default_rng(0).normal(size=(10, D)).astype(np.float32)
    txt = img.copy()
    m = mine(img, txt, max_positives=3)
    assert all(len(p) == 3 for p in m.positives) and m.capped_rows == 10
    full = mine(img, txt, max_positives=100)
    assert full.capped_rows == 0 and all(len(p) == 9 for p in full.positives)
    assert m.positives[0].tolist() == full.positives[0][:3].tolist()
    s = summarise(m, 10)
    assert s["rows_capped"] == 10 and s["histogram"]["2-3"] == 10 and s["pairs"] == 30


def test_summary_shares_by_term():
    img, txt = hand_built()
    s = summarise(mine(img, txt), len(img))
    assert s["rows_with_positives"] >= 2
    assert set(s["share_by_term"]) == {"image-text", "image-image", "text-text and image-text"}
    assert sum(s["histogram"].values()) == len(img)


def test_ivf_is_close_to_exact():
    rng = np.random.default_rng(2)
    centers = rng.normal(size=(20, 32))
    lab = rng.integers(0, 20, size=2000)
    img = centers[lab] + 0.5 * rng.normal(size=(2000, 32))
    txt = centers[lab] + 0.6 * rng.normal(size=(2000, 32))
    th = Thresholds(p_it=0.7, p_ii=0.85, p_tt=0.9, p_it_tt=0.6)
    exact = mine(img, txt, thresholds=th)
    approx = mine(img, txt, thresholds=th, index="ivf", nprobe=8)
    e_pairs = {(i, j) for i, p in enumerate(exact.positives) for j in p.tolist()}
    a_pairs = {(i, j) for i, p in enumerate(approx.positives) for j in p.tolist()}
    assert a_pairs <= e_pairs
    assert len(a_pairs) / len(e_pairs) > 0.9


def test_calibration_on_hand_built_scores():
    c = calibrate(np.array([0.25, 0.27, 0.29, 0.31, 0.33]))
    assert c["mean"] == pytest.approx(0.29)
    assert c["quantiles"]["50%"] == pytest.approx(0.29)
    assert c["suggested"]["p_it"] == pytest.approx(0.27) and c["suggested"]["p_it_tt"] == pytest.approx(0.24)


def test_bad_threshold():
    from vltool.errors import UsageError

    with pytest.raises(UsageError, match="--p-it must be in"):
        mine(np.eye(3), np.eye(3), thresholds=Thresholds(p_it=2))


# --- the command, end to end with a tiny model --------------------------------------------------------

def test_command_writes_positives_and_provenance(tmp_path, monkeypatch):
    """... beside the input's table: a --where selection's rows are not written anew (flatten_indices refused)."""
    import json

    import datasets

    def refuse(self, *a, **k):
        raise AssertionError("flatten_indices copied the selected rows")

    monkeypatch.setattr(datasets.Dataset, "flatten_indices", refuse)

    from tests.fixtures.eval_data import make_colors, make_model
    from vltool.mine_positives import MinePositivesConfig, mine_positives

    data = make_colors(tmp_path / "colors", per_class=4)
    model = make_model(tmp_path / "run")
    cfg = MinePositivesConfig(model=str(model), p_it=-1.0, p_ii=0.999, p_tt=0.999, p_it_tt=0.999, max_positives=3,
                              group_column="label")
    import vltool.mine_positives as mp

    seen, real_mine = [], mp.mine

    def spy(*a, **k):  # the pairs go to a spill directory beside the output, memory-mapped back
        got = real_mine(*a, **k)
        seen.append((k["spill"], type(got.rows)))
        return got

    monkeypatch.setattr(mp, "mine", spy)
    prov = mine_positives(data, tmp_path / "mined", cfg, where=["split=train"])
    assert len(seen) == 1 and seen[0][0].name.startswith(".mined.work-") and seen[0][1] is np.memmap
    assert not seen[0][0].exists() and sorted(p.name for p in tmp_path.iterdir()) == ["colors", "mined", "run"]
    ds = datasets.load_from_disk(str(tmp_path / "mined"))
    rows = ds.to_list()
    assert len(rows) == prov["rows_out"] == 12
    # p_it = -1: every other row is a positive of every image, capped at 3, never itself
    assert all(len(r["positives"]) == 3 and r["id"] not in r["positives"] for r in rows)
    assert all(len(s) == 3 for r in rows for s in r["positive_scores"])
    ids = {r["id"] for r in rows}
    assert all(set(r["positives"]) <= ids for r in rows)
    saved = json.loads((tmp_path / "mined" / "vltool.json").read_text())
    assert saved["command"] == "mine-positives" and saved["stats"]["rows_capped"] == 12
    assert saved["options"]["p_it"] == -1.0 and saved["model"]["fingerprint"]
    assert 0 <= saved["stats"]["groups"]["precision"] <= 1
    # the second run hits the embedding cache
    prov2 = mine_positives(data, tmp_path / "mined2", cfg, where=["split=train"])
    assert prov2["stats"]["encoding"]["images"]["hit"] and prov2["stats"]["encoding"]["texts"]["hit"]


def test_command_errors(tmp_path, cli):
    from tests.fixtures.eval_data import make_colors, make_model

    data = make_colors(tmp_path / "colors", per_class=2)
    model = make_model(tmp_path / "run")
    r = cli("mine-positives", data, "--model", model)
    assert r.exit_code == 2 and "--out is required" in r.stderr
    r = cli("mine-positives", data, "--model", model, "--out", tmp_path / "o", "--p-it", "3")
    assert r.exit_code == 2 and "--p-it must be in [-1, 1]" in r.stderr
    r = cli("mine-positives", data, "--model", model, "--out", tmp_path / "o", "--text-column", "title")
    assert r.exit_code == 2 and "no column 'title'" in r.stderr
    r = cli("mine-positives", data, "--model", model, "--calibrate", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    import json

    s = json.loads(r.stdout)
    assert len(s["grid"]) == 9 and "suggested" in s["calibration"]
    assert not (tmp_path / "o").exists()


def test_duplicate_ids_are_refused(tmp_path, cli):
    """`positives` names rows by id: with ids repeated every row's positives read ['same', ...]. Refused
    before any encoding, as pretrain refuses them."""
    import datasets

    from tests.fixtures.eval_data import make_colors, make_model

    ds = datasets.load_from_disk(make_colors(tmp_path / "colors", per_class=2))
    ds.remove_columns("id").add_column("id", ["same"] * len(ds)).save_to_disk(str(tmp_path / "dup"))
    r = cli("mine-positives", tmp_path / "dup", "--model", make_model(tmp_path / "run"), "--out", tmp_path / "o")
    assert r.exit_code == 2 and "has duplicate ids (e.g. 'same'); ids must be unique" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_command_under_two_processes_writes_once(tmp_path):
    """`accelerate launch -m vltool mine-positives --index blocked` with 2 processes: exit 0, one report,
    the output written once (by the main process) and equal to one process's, with --overwrite too."""
    import datasets

    from tests.fixtures.eval_data import make_colors, make_model

    data = make_colors(tmp_path / "colors", per_class=4)
    model = make_model(tmp_path / "run")
    args = ["-m", "vltool", "mine-positives", data, "--where", "split=train", "--model", model, "--index", "blocked",
            "--p-it", "0.5", "--no-progress"]
    launch([*args, "--out", tmp_path / "one"], 1, in_process=False)
    for extra in ([], ["--overwrite"]):
        r = launch([*args, "--out", tmp_path / "two", *extra], 2)
        assert r.stdout.count("mine-positives -> ") == 1, r.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".two", "two"))) == ["two"]
    one, two = (datasets.load_from_disk(str(tmp_path / d)) for d in ("one", "two"))
    assert one.to_dict() == two.to_dict() and sum(map(len, one["positives"])) > 0


@pytest.mark.parametrize("captions", [1, 3], ids=["one-caption", "three-captions"])
def test_bounded_blocks_give_the_same_pairs_as_one_block(captions):
    """A weak model puts most pairs near the thresholds: the blocks shrink to the pair budget (memory
    bounded by it, not by the rows), and the positives, their order, scores and terms do not change."""
    rng = np.random.default_rng(1)
    n = 120
    img = rng.normal(size=(n, 8)) + 2.0  # everything alike: most pairs are candidates
    txt = np.repeat(img, captions, axis=0) + 0.3 * rng.normal(size=(n * captions, 8))
    owner = np.repeat(np.arange(n), captions) if captions > 1 else None
    th = Thresholds(p_it=0.9, p_ii=0.95, p_tt=0.95, p_it_tt=0.85)
    one = mine(img, txt, owner, th, chunk=n, pair_budget=10**9, max_positives=40)
    small = mine(img, txt, owner, th, chunk=n, pair_budget=150, max_positives=40)
    assert sum(len(p) for p in one.positives) > n * 20  # a dense case
    assert one.capped_rows == small.capped_rows > 0
    assert small.stats["blocks"] > 5 * one.stats["blocks"]  # the budget did cut the blocks
    for a, b, sa, sb, ta, tb in zip(one.positives, small.positives, one.scores, small.scores, one.terms, small.terms):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(sa, sb)
        np.testing.assert_array_equal(ta, tb)
    dense = dense_reference(img, txt, owner, th)
    full = mine(img, txt, owner, th, pair_budget=150, max_positives=n)
    got = np.zeros_like(dense)
    for i, p in enumerate(full.positives):
        got[i, p] = True
    assert (got == dense).all()


def test_flat_search_is_faiss_index_flat_without_its_copy():
    """--index flat runs faiss's brute-force inner-product range search on the embeddings themselves: the
    lims, ids and scores of faiss.IndexFlatIP's range_search, exactly, and no copy of the targets."""
    import faiss

    from vltool.mine_positives import _Flat

    rng = np.random.default_rng(3)
    x = _normalise(rng.normal(size=(300, 16)).astype(np.float32))
    x[50:60] = x[0]  # exact duplicates: scores of 1
    flat = _Flat(x)
    assert np.shares_memory(flat.x, x)
    index = faiss.IndexFlatIP(16)
    index.add(x)
    for radius in (0.3, 0.9, 0.999):
        got, want = flat.range_search(x[:70], radius), index.range_search(x[:70], radius)
        assert want[0][-1] > 0
        for a, b in zip(got, want):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("captions", [1, 3], ids=["one-caption", "three-captions"])
@pytest.mark.parametrize("low_precision", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tiles", ["cpu", "gpu"])
def test_blocked_search_gives_the_pairs_of_the_faiss_search(captions, low_precision, tiles, monkeypatch):
    """--index blocked (torch matmul over tiles of the targets; bf16 candidates with the margin, then the
    exact float32 recheck) mines exactly the pairs, order, scores and terms of the faiss flat search, with
    tiles smaller than the queries and targets and blocks cut by the pair budget; bf16 is forced on CPU
    here. tiles="cpu": a CPU's cache-sized tiles, each looked into only in the rows whose maximum passes;
    "gpu": a GPU's tiles (all the queries x TILE_ELEMENTS), run here on the CPU."""
    import vltool.mine_positives as MP

    monkeypatch.setattr(MP, "TILE_ELEMENTS", 64 * 37)  # several tiles per search
    monkeypatch.setattr(MP, "CPU_TILE", (16, 37))
    real = MP._Blocked

    def make_blocked(x):
        b = real(x, device="cpu", low_precision=low_precision)
        b.cache_tiles = tiles == "cpu"
        return b

    monkeypatch.setattr(MP, "_Blocked", make_blocked)
    rng = np.random.default_rng(2)
    n = 150
    img = rng.normal(size=(n, 8)) + 2.0
    txt = np.repeat(img, captions, axis=0) + 0.3 * rng.normal(size=(n * captions, 8))
    owner = np.repeat(np.arange(n), captions) if captions > 1 else None
    th = Thresholds(p_it=0.9, p_ii=0.95, p_tt=0.95, p_it_tt=0.85)
    flat = mine(img, txt, owner, th, max_positives=40, pair_budget=400)
    blocked = mine(img, txt, owner, th, max_positives=40, pair_budget=400, index="blocked")
    assert sum(len(p) for p in flat.positives) > 10 * n and flat.capped_rows > 0  # a case with many pairs, some rows capped
    assert blocked.capped_rows == flat.capped_rows
    for a, b, sa, sb, ta, tb in zip(flat.positives, blocked.positives, flat.scores, blocked.scores, flat.terms, blocked.terms):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(sa, sb)
        np.testing.assert_array_equal(ta, tb)
    # the candidates hold every exact pair, also at a radius where many pairs are within rounding of it
    # (the median score): the margin covers bf16's error (without it, pairs are missed here)
    x = make_blocked(_normalise(txt))
    assert str(x.dtype) == ("torch.bfloat16" if low_precision else "torch.float32")
    exact = _normalise(img) @ _normalise(txt).T  # (N, N_txt) float64
    radius = float(np.median(exact))
    lims, _, ids = x.range_search(_normalise(img), radius)
    got = set(zip(np.repeat(np.arange(n), np.diff(lims)).tolist(), ids.tolist()))
    assert set(zip(*[a.tolist() for a in np.nonzero(exact > radius)])) <= got


BLOCKED_SCRIPT = """
import sys, numpy as np
from vltool.mine_positives import Thresholds, mine
from vltool.topology import process_state

rng = np.random.default_rng(2)
img = rng.normal(size=(150, 8)) + 2.0
txt = np.repeat(img, 3, axis=0) + 0.3 * rng.normal(size=(450, 8))
owner = np.repeat(np.arange(150), 3)
th = Thresholds(p_it=0.9, p_ii=0.95, p_tt=0.95, p_it_tt=0.85)
m = mine(img, txt, owner, th, max_positives=40, pair_budget=400, index=sys.argv[2])
if process_state().is_main_process:
    np.savez(sys.argv[1], counts=[len(p) for p in m.positives], pos=np.concatenate(m.positives),
             scores=np.concatenate(m.scores), terms=np.concatenate(m.terms), capped=m.capped_rows)
"""


@pytest.mark.slow
def test_blocked_search_over_two_processes_equals_one(tmp_path):
    """2 processes (accelerate launch, CPU) each mine half the queries with --index blocked; the gathered
    result is the single-process faiss flat search's."""
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED_SCRIPT)
    launch([script, tmp_path / "one.npz", "flat"], 1, in_process=False)
    launch([script, tmp_path / "two.npz", "blocked"], 2)
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert one["pos"].size > 1000 and int(one["capped"]) > 0
    for k in ("counts", "pos", "scores", "terms", "capped"):
        np.testing.assert_array_equal(one[k], two[k], err_msg=k)


@pytest.mark.parametrize("captions", [1, 3], ids=["one-caption", "three-captions"])
def test_dry_run_grid_in_one_search_equals_one_search_per_point(captions):
    """--dry-run's 9 thresholds from one search at the loosest of them (each point's terms recomputed from
    the exact scores, then capped) equal 9 separate searches: pairs, order, scores, terms, capped rows."""
    from vltool.mine_positives import mine_grid, threshold_grid

    rng = np.random.default_rng(3)
    n = 150
    img = rng.normal(size=(n, 8)) + 2.0
    txt = np.repeat(img, captions, axis=0) + 0.3 * rng.normal(size=(n * captions, 8))
    owner = np.repeat(np.arange(n), captions) if captions > 1 else None
    grid = threshold_grid(Thresholds(p_it=0.9, p_ii=0.95, p_tt=0.95, p_it_tt=0.85))
    together = mine_grid(img, txt, owner, grid, max_positives=30, pair_budget=500)
    counts = set()
    for th, got in zip(grid, together):
        want = mine(img, txt, owner, th, max_positives=30, pair_budget=500)
        assert got.capped_rows == want.capped_rows
        counts.add(sum(len(p) for p in want.positives))
        for a, b, sa, sb, ta, tb in zip(want.positives, got.positives, want.scores, got.scores, want.terms, got.terms):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(sa, sb)
            np.testing.assert_array_equal(ta, tb)
    assert len(counts) > 3 and any(m.capped_rows for m in together)  # the points differ, and the cap is exercised


@pytest.mark.parametrize("pair_slice,row_slice,spill", [(1 << 20, 1 << 20, False), (4, 3, True), (1, 1, False)])
def test_positive_columns_equal_the_per_row_lists(monkeypatch, tmp_path, pair_slice, row_slice, spill):
    """The output columns built as Arrow arrays equal the per-row Python lists they replace (reference
    beside it), with rows that were not mined, rows without positives, and mined rows out of order; built
    in one slice or in slices of a few pairs and rows, in memory or into a spill file."""
    import pyarrow as pa

    import vltool.mine_positives as mp
    from vltool.mine_positives import Mined, positive_columns

    monkeypatch.setattr(mp, "PAIR_SLICE", pair_slice)
    monkeypatch.setattr(mp, "ROW_SLICE", row_slice)

    rng = np.random.default_rng(4)
    n = 12
    rows = np.array([7, 0, 3, 4, 9, 11])  # dataset row of each mined row (not sorted)
    pos = [rng.choice(len(rows), size=k, replace=False) for k in (3, 0, 1, 5, 2, 0)]
    sc = [rng.random((len(p), 3)).astype(np.float32) for p in pos]
    mined = Mined.from_lists(pos, sc, [np.ones((len(p), 3), bool) for p in pos])
    ids = [f"id{i}" for i in range(n)]
    table = positive_columns(mined, rows, n, pa.chunked_array([ids[:5], ids[5:]]), spill=tmp_path if spill else None)
    assert (tmp_path / "positives.arrow").exists() == spill
    positives, scores = table.column("positives").combine_chunks(), table.column("positive_scores").combine_chunks()
    assert table.column("positives").num_chunks == 1 if pair_slice > 100 else table.column("positives").num_chunks >= n // row_slice
    want_p, want_s = [[] for _ in range(n)], [[] for _ in range(n)]  # the reference: what the command built before
    row_ids = [ids[int(r)] for r in rows]
    for k, r in enumerate(rows.tolist()):
        want_p[r] = [row_ids[j] for j in mined.positives[k].tolist()]
        want_s[r] = np.round(mined.scores[k], 5).tolist()
    assert positives.type == pa.list_(pa.string()) and scores.type == pa.list_(pa.list_(pa.float32(), 3))
    assert positives.to_pylist() == want_p
    assert scores.to_pylist() == [[[float(np.float32(x)) for x in t] for t in r] for r in want_s]


def test_mined_rows_own_their_arrays(monkeypatch):
    """What each block keeps is copies, not views of the block's arrays: a view keeps the whole block (up to
    pair_budget pairs) alive, so memory grew with the blocks (GBs at 10k rows). The result is flat arrays
    (no array per row: three Python objects a row were ~0.5 GB at 1M rows), equal to per-row lists."""
    import vltool.mine_positives as mp

    kept = []
    add = mp._Collector.add

    def spy(self, *a):
        add(self, *a)
        kept.append(self.parts[-1])

    monkeypatch.setattr(mp._Collector, "add", spy)
    rng = np.random.default_rng(1)
    img = rng.normal(size=(200, 8)) + 2.0
    txt = img + 0.3 * rng.normal(size=(200, 8))
    m = mine(img, txt, None, Thresholds(p_it=0.9, p_ii=0.95, p_tt=0.95, p_it_tt=0.85), pair_budget=100, max_positives=10)
    assert len(m.rows) > 100 and len(kept) > 3 and m.capped_rows > 0
    assert all(a.base is None for part in kept for a in part)
    assert m.offsets.shape == (201,) and all(a.base is None for a in (m.offsets, m.rows, m.pair_scores, m.pair_terms))
    again = mp.Mined.from_lists(m.positives, m.scores, m.terms)
    assert all(np.array_equal(getattr(m, f), getattr(again, f)) for f in ("offsets", "rows", "pair_scores", "pair_terms"))


@pytest.mark.parametrize("pair_slice", [1 << 20, 3])
def test_summary_shares_equal_the_pair_by_pair_count(monkeypatch, pair_slice):
    """The shares of pairs by term, counted a slice of pairs at a time, equal the count over all pairs."""
    import vltool.mine_positives as mp

    monkeypatch.setattr(mp, "PAIR_SLICE", pair_slice)
    rng = np.random.default_rng(5)
    pos = [rng.choice(20, size=int(rng.integers(0, 5)), replace=False) for _ in range(20)]
    terms = [rng.random((len(p), 3)) < 0.5 for p in pos]
    terms = [t | ~t.any(1, keepdims=True) * np.array([True, False, False]) for t in terms]  # every pair has a term
    mined = mp.Mined.from_lists(pos, [np.zeros((len(p), 3), np.float32) for p in pos], terms)
    every = np.concatenate(terms)  # (P, 3)
    got = mp.summarise(mined, 20)
    names = ["image-text", "image-image", "text-text and image-text"]
    assert got["pairs"] == len(every) > 10
    for t, k in enumerate(names):
        assert got["share_by_term"][k] == round(float(every[:, t].mean()), 4)
        assert got["share_only_term"][k] == round(float((every[:, t] & (every.sum(1) == 1)).mean()), 4)
    assert 0 < got["share_only_term"]["image-image"] < got["share_by_term"]["image-image"] < 1


@pytest.mark.parametrize("pair_slice", [1 << 20, 4])
def test_group_agreement_equals_the_per_row_count(monkeypatch, pair_slice):
    import vltool.mine_positives as mp
    from vltool.mine_positives import Mined, group_agreement

    monkeypatch.setattr(mp, "PAIR_SLICE", pair_slice)

    rng = np.random.default_rng(3)
    n = 30
    groups = [f"g{k}" for k in rng.integers(0, 6, size=n)]
    pos = [rng.choice(n, size=int(rng.integers(0, 6)), replace=False) for _ in range(n)]
    mined = Mined.from_lists(pos, [np.zeros((len(p), 3), np.float32) for p in pos], [np.ones((len(p), 3), bool) for p in pos])
    got = group_agreement(mined, groups)
    same = sum(groups[int(j)] == groups[i] for i, p in enumerate(pos) for j in p)  # the reference: pair by pair
    assert got["mined_pairs"] == sum(len(p) for p in pos) and got["same_group_mined"] == same > 0


def test_mined_rows_are_the_encoded_array_when_every_row_is_mined():
    """The embeddings normalised in place are the encoded array itself when every row is mined (no copy of
    the largest arrays the command holds), and a copy of the kept rows otherwise, or when the array is
    read-only or not float32."""
    from vltool.mine_positives import _mined_rows

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    every, some = np.ones(4, bool), np.array([True, False, True, True])
    assert _mined_rows(x, every) is x
    part = _mined_rows(x, some)
    assert not np.shares_memory(part, x) and np.array_equal(part, x[[0, 2, 3]])
    ro = x.copy()
    ro.flags.writeable = False
    assert _mined_rows(ro, every) is not ro and _mined_rows(ro, every).flags.writeable
    assert _mined_rows(x.astype(np.float64), every).dtype == np.float32


def test_spilled_pairs_equal_the_pairs_in_memory(tmp_path):
    """With a spill directory the mined pairs go to files block by block and come back memory-mapped: the
    same arrays as in memory (rows int32 below 2^31 rows), over many blocks, with capped rows; and the
    collectors of two processes merged (what a multi-process run gathers) give the whole run's pairs."""
    import vltool.mine_positives as mp

    rng = np.random.default_rng(1)
    img = rng.normal(size=(300, 8)) + 2.0
    txt = img + 0.3 * rng.normal(size=(300, 8))
    th = Thresholds(p_it=0.9, p_ii=0.95, p_tt=0.95, p_it_tt=0.85)
    fields = ("offsets", "rows", "pair_scores", "pair_terms")
    held = mine(img, txt, None, th, pair_budget=100, max_positives=10)
    spilled = mine(img, txt, None, th, pair_budget=100, max_positives=10, spill=tmp_path)
    assert held.stats["blocks"] > 3 and held.capped_rows > 0 and len(held.rows) > 500
    assert isinstance(spilled.rows, np.memmap) and held.rows.dtype == spilled.rows.dtype == np.int32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pair_scores.bin", "pair_terms.bin", "rows.bin"]
    assert all(np.array_equal(getattr(held, f), getattr(spilled, f)) for f in fields)
    assert spilled.capped_rows == held.capped_rows

    # two "processes", each collecting half of the blocks into its own spill directory, merged in rank order
    n = len(img)
    imgn, txtn = mp._normalise(img), mp._normalise(txt)
    states = []
    for rank, rows in enumerate((np.arange(0, 170), np.arange(170, n))):
        (tmp_path / str(rank)).mkdir()
        c = mp._Collector(th, 10, rescore=False, n_rows=n, spill=tmp_path / str(rank))
        mp._search(imgn, txtn, None, th, [c], index="flat", nprobe=1, chunk=40, query_rows=rows, pair_budget=100,
                   normalised=True)
        states.append(c.state())
    (tmp_path / "m").mkdir()
    merged = mp._Collector(th, 10, rescore=False, n_rows=n, spill=tmp_path / "m")
    merged.merge(states)
    got = merged.result({})
    assert isinstance(got.rows, np.memmap) and got.capped_rows == held.capped_rows
    assert all(np.array_equal(getattr(held, f), getattr(got, f)) for f in fields)


def test_mined_key_reads_every_slice(monkeypatch):
    """The output's fingerprint key covers every pair: read a slice at a time it is the same digest, and a
    change in the last pair's score changes it."""
    import vltool.mine_positives as mp

    pos = [np.array([1, 2]), np.array([0]), np.array([0, 1])]
    sc = [np.full((len(p), 3), 0.5, np.float32) for p in pos]
    mined = mp.Mined.from_lists(pos, sc, [np.ones((len(p), 3), bool) for p in pos])
    rows = np.arange(3)
    whole = mp._mined_key(rows, mined)
    monkeypatch.setattr(mp, "PAIR_SLICE", 2)
    assert mp._mined_key(rows, mined) == whole
    mined.pair_scores[-1, 2] = 0.25
    assert mp._mined_key(rows, mined) != whole
