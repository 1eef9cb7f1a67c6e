"""Concept subspace and hard-debias editing on hand-made embeddings with a planted direction."""

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.messages import error_line
from tests.fixtures.training import finished_micro_run
from vltool.debias import (
    DEFAULT_PAIRS,
    DEFAULT_TEMPLATES,
    alignment_table,
    concept_subspace,
    contextualise,
    own_other_gap,
    project_out,
    read_pairs,
    read_templates,
)
from vltool.errors import UsageError


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished micro run."""
    return finished_micro_run(tmp_path_factory.mktemp("messages_run"))


def planted(n=40, d=16, seed=0):
    rng = np.random.default_rng(seed)
    g = np.zeros(d)
    g[3] = 1.0  # the planted concept direction
    base = rng.normal(size=(n, d))
    a = base + 1.5 * g + 0.05 * rng.normal(size=(n, d))
    b = base - 1.5 * g + 0.05 * rng.normal(size=(n, d))
    return a, b, g


def test_pca_recovers_planted_direction_up_to_sign():
    a, b, g = planted()
    sub = concept_subspace(a, b, k=1)
    assert abs(float(sub.components[0] @ g)) > 0.99
    assert sub.explained_variance_ratio[0] > 0.9
    sub2 = concept_subspace(a, b, k=2)
    assert np.allclose(sub2.components @ sub2.components.T, np.eye(2), atol=1e-5)


def test_edited_embeddings_are_orthogonal_and_unit():
    a, b, _ = planted()
    sub = concept_subspace(a, b, k=2)
    h = np.random.default_rng(1).normal(size=(30, 16))
    e = project_out(h, sub.components)
    assert np.allclose(e @ sub.components.T, 0, atol=1e-5)
    assert np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    # by hand for one vector
    v = sub.components
    manual = h[0] - (h[0] @ v.T) @ v
    assert np.allclose(e[0], manual / np.linalg.norm(manual), atol=1e-5)


def test_alignment_table_cells_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    imgs = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])
    cells = alignment_table(q, ["man", "woman"], imgs, ["man", "man", "woman", "woman"], top=1)
    assert cells == {"man": {"man": 1.0, "woman": pytest.approx(0.6)}, "woman": {"man": pytest.approx(0.6), "woman": 1.0}}
    cells2 = alignment_table(q, ["man", "woman"], imgs, ["man", "man", "woman", "woman"], top=2)
    assert cells2["man"]["man"] == pytest.approx(0.9) and cells2["man"]["woman"] == pytest.approx(0.3)
    assert own_other_gap(cells) == pytest.approx(0.4)


def test_gap_shrinks_after_removing_planted_direction():
    rng = np.random.default_rng(3)
    d = 16
    g = np.zeros(d)
    g[0] = 1
    content = rng.normal(size=(200, d))
    content[:, 0] = 0
    groups = ["man"] * 100 + ["woman"] * 100
    imgs = content + np.where(np.array(groups) == "man", 1.0, -1.0)[:, None] * 2 * g
    imgs /= np.linalg.norm(imgs, axis=1, keepdims=True)
    queries = np.stack([g + 0.3 * rng.normal(size=d) for _ in range(5)] + [-g + 0.3 * rng.normal(size=d) for _ in range(5)])
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    qg = ["man"] * 5 + ["woman"] * 5
    before = own_other_gap(alignment_table(queries, qg, imgs, groups))
    after = own_other_gap(alignment_table(queries, qg, project_out(imgs, g[None]), groups))
    assert before > 0.3 and abs(after) < 0.05


def test_default_pairs_and_templates():
    pairs = read_pairs(DEFAULT_PAIRS)
    assert len(pairs) == 20 and pairs[0] == ("man", "woman") and ("boyfriend", "girlfriend") in pairs
    templates = read_templates(DEFAULT_TEMPLATES)
    assert "I am a {}." in templates and "that {} is smiling." in templates
    a, b = contextualise(pairs[:2], ["I am a {}."])
    assert a == ["I am a man.", "I am a men."] and b == ["I am a woman.", "I am a women."]


def test_bad_pair_files(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("man\twoman\nking\n")
    with pytest.raises(UsageError, match="line 2: expected two words"):
        read_pairs(p)
    p.write_text("man,\n")
    with pytest.raises(UsageError, match="line 1"):
        read_pairs(p)
    p.write_text("\n# nothing\n")
    with pytest.raises(UsageError, match="holds no pairs"):
        read_pairs(p)
    t = tmp_path / "t.txt"
    t.write_text("no placeholder\n")
    with pytest.raises(UsageError, match="exactly one"):
        read_templates(t)


# --- the command, end to end with a tiny model --------------------------------------------------------

def _setup(tmp_path):
    import datasets

    from tests.fixtures.eval_data import make_colors, make_model

    data = make_colors(tmp_path / "colors", per_class=4)
    ds = datasets.load_from_disk(data)
    ds = ds.add_column("gender", ["man" if i % 2 else "woman" for i in range(len(ds))])
    ds.save_to_disk(str(tmp_path / "colors_g"))
    return str(tmp_path / "colors_g"), make_model(tmp_path / "run"), make_model(tmp_path / "run_other", seed=1)


def test_subspace_zeroshot_with_debias_equals_hand_edit_and_report(tmp_path):
    import json

    from vltool.cache import EmbeddingCache
    from vltool.debias import DebiasConfig, compute_subspace, load_subspace, measure
    from vltool.encode import encode_images, encode_prompts
    from vltool.io import load_dataset
    from vltool.model import load_model
    from vltool.templates import class_prompts, load_templates
    from vltool.zeroshot import ZeroshotConfig, class_embeddings, zeroshot

    data, model, _ = _setup(tmp_path)
    compute_subspace(DebiasConfig(model=str(model), components=2), tmp_path / "sub")
    v = load_subspace(tmp_path / "sub")
    assert v.shape == (2, 32) and np.allclose(v @ v.T, np.eye(2), atol=1e-5)
    saved = json.loads((tmp_path / "sub" / "vltool.json").read_text())
    assert saved["stats"]["sentence_pairs"] == 20 * 8 and len(saved["stats"]["explained_variance_ratio"]) == 2

    rec = zeroshot(data, ZeroshotConfig(model=str(model), debias=str(tmp_path / "sub"), bootstrap=0, progress=False))
    m = load_model(str(model))
    src = load_dataset(data)
    img = encode_images(m, src, cache=EmbeddingCache(), progress=False).embeddings
    names = src.dataset.features["label"].names
    prompts = class_prompts(names, load_templates("photo")[1])
    cls = class_embeddings(encode_prompts(m, [p for ps in prompts for p in ps], progress=False).embeddings, [len(p) for p in prompts])
    x = project_out(img, v)
    top1 = float(np.mean((x @ cls.T).argmax(1) == np.array(src.dataset["label"])))
    assert rec["metrics"]["top1"]["value"] == pytest.approx(top1)
    assert rec["protocol"]["debias"]["components"] == 2

    report = measure(DebiasConfig(model=str(model), subspace=str(tmp_path / "sub"), eval_data=data, top=3, zeroshot_label="label"),
                     tmp_path / "report.json")
    s = report["stats"]
    assert set(s["cells"]) == {"man", "woman"} and set(s["cells"]["man"]) == {"man", "woman"}
    c = s["cells"]["man"]["woman"]
    assert c["delta"] == pytest.approx(c["after"] - c["before"], abs=1e-4)
    assert s["zeroshot"]["after"]["value"] == pytest.approx(top1)
    assert json.loads((tmp_path / "report.json").read_text())["stats"]["gap_before"] == s["gap_before"]


def test_other_models_subspace_is_refused(tmp_path, cli):
    data, model, other = _setup(tmp_path)
    assert cli("debias", "--model", model, "--out", tmp_path / "sub").exit_code == 0
    r = cli("zeroshot", data, "--model", other, "--debias", tmp_path / "sub")
    assert r.exit_code == 2 and "computed with another model" in r.stderr
    # `debias --subspace` names its own option (it said --debias), and says how to make the right one (issue 44)
    r = cli("debias", "--model", other, "--subspace", tmp_path / "sub", "--eval-data", data)
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: --subspace {tmp_path / 'sub'} was computed with another model") and "--debias" not in line \
        and "`vltool debias --model MODEL --out DIR`" in line, line
    r = cli("retrieve", data, "--model", model, "--debias", tmp_path / "sub", "--bootstrap", "0")
    assert r.exit_code == 0, r.stderr


def test_pairs_that_vanish_or_coincide_once_tokenised(tmp_path, cli):
    _, model, _ = _setup(tmp_path)
    p = tmp_path / "pairs.txt"
    p.write_text("man\tman\n")
    r = cli("debias", "--model", model, "--pairs", p, "--out", tmp_path / "s")
    assert r.exit_code == 2 and "same once tokenised" in r.stderr
    p.write_text("man\t\t\n")
    r = cli("debias", "--model", model, "--pairs", p, "--out", tmp_path / "s")
    assert r.exit_code == 2 and "line 1" in r.stderr
    p.write_text("man, &nbsp;\n")  # an HTML space: open_clip's tokenizer unescapes and strips it
    r = cli("debias", "--model", model, "--pairs", p, "--out", tmp_path / "s")
    assert r.exit_code == 2 and "'&nbsp;' reduces to nothing once tokenised" in r.stderr
    assert not (tmp_path / "s").exists()


def test_the_gap_is_reported_by_its_size_and_top_by_the_images_there_are(tmp_path, cli, monkeypatch):
    """A gap of -0.0001 that becomes 0.0003 grew: it was printed "reduced by 350.0%" (1 - after/before); and
    --top 100000 over 12 images a group printed "top 100000 images"."""
    import vltool.debias

    data, model, _ = _setup(tmp_path)
    assert cli("debias", "--model", model, "--out", tmp_path / "sub").exit_code == 0
    gaps = iter([-0.0001, 0.0003])
    monkeypatch.setattr(vltool.debias, "own_other_gap", lambda cells: next(gaps))
    r = cli("debias", "--model", model, "--subspace", tmp_path / "sub", "--eval-data", data, "--top", "100000",
            "--zeroshot-label", "")
    assert r.exit_code == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "gap: -0.0001 -> +0.0003; its size 0.0001 -> 0.0003 (+0.0002, larger)" in out and "reduced by" not in out
    assert "the top 12 images of each group" in out and "100000" not in out
    s = vltool.debias.gap_change(-0.0001, 0.0003)
    assert s["abs_gap_change"] == 0.0002 and s["gap_reduction"] == -2.0  # its size tripled
    assert vltool.debias.gap_change(0.06, 0.0001)["gap_reduction"] == pytest.approx(0.9983, abs=1e-4)


def test_a_subspace_option_given_empty_is_named(cli, tmp_path, run_dir):
    """`debias --subspace ''` named --debias."""
    r = cli("debias", "--model", run_dir, "--subspace", "", "--eval-data", "emoji")
    assert r.exit_code == 2
    line = error_line(r)
    assert line.startswith("error: --subspace is empty") and "--debias" not in line, line
