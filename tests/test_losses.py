"""The objectives of issue 4 (vltool.losses): unit tests against explicit float64 references, and short
trainer runs (vltool-micro, tiny synthetic data) for the trainer integration, resume and 2 processes = 1."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.fixtures.launch import launch
from tests.fixtures.training import assert_same_weights, make_pairs, metrics, micro, weights
from vltool.errors import UsageError

REPO = Path(__file__).resolve().parent.parent


def unit(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return make_pairs(tmp_path_factory.mktemp("pairs") / "pairs", n=32)


@pytest.fixture(scope="module")
def pairs_pos(tmp_path_factory):
    """The pairs with a `positives` column: row p<i> lists the rows of the same colour (directional: only later ones)."""
    import datasets

    path = make_pairs(tmp_path_factory.mktemp("pp") / "base", n=32)
    ds = datasets.load_from_disk(path)
    pos = [[f"p{j}" for j in range(i + 1, 32) if j % 8 == i % 8] for i in range(32)]
    ds = ds.add_column("positives", pos)
    out = tmp_path_factory.mktemp("pp2") / "pairs_pos"
    ds.save_to_disk(str(out))
    return str(out)


# ---------------------------------------------------------------------------------------------------
# sigmoid (FFF 4.4 / SigLIP)
# ---------------------------------------------------------------------------------------------------


def sigmoid_reference(img, txt, scale, bias, pos) -> float:
    """-(1/N) sum_i sum_j log sigmoid(m_ij (scale <img_i, txt_j> + bias)), by explicit loops in float64."""
    n, m = img.shape[0], txt.shape[0]
    total = 0.0
    for i in range(n):
        for j in range(m):
            z = scale * float(img[i] @ txt[j]) + bias
            sign = 1.0 if (i, j) in pos else -1.0
            total += math.log1p(math.exp(-sign * z))
    return total / n


def test_sigmoid_matches_reference_with_many_positives():
    from vltool.losses import LossInput, SigmoidLoss, positive_mask

    img, txt = unit(5, 7, 0), unit(10, 7, 1)  # 5 images, 2 captions each
    image_rows = torch.tensor([3, 1, 4, 0, 2])
    text_rows = image_rows.repeat_interleave(2)
    mined = {3: [4], 0: [3, 9]}  # directional; row 9 is not in the batch
    mask = positive_mask(image_rows, text_rows, mined)
    pos = {(i, j) for i in range(5) for j in range(10)
           if text_rows[j] == image_rows[i] or int(text_rows[j]) in mined.get(int(image_rows[i]), [])}
    assert {tuple(x) for x in mask.nonzero().tolist()} == pos
    assert not mask[2, 0] and mask[0, 4]  # row 4's image is not positive with row 3's text (direction)
    out = SigmoidLoss()(LossInput(img, txt, torch.tensor(10.0, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64),
                                  extra={"positive_mask": mask}))
    assert float(out["loss"]) == pytest.approx(sigmoid_reference(img, txt, 10.0, -3.0, pos), rel=1e-6)


def test_sigmoid_equals_open_clip_siglip():
    from open_clip.loss import SigLipLoss

    from vltool.losses import LossInput, SigmoidLoss

    img, txt = unit(8, 16, 2).float(), unit(8, 16, 3).float()
    scale, bias = torch.tensor(10.0), torch.tensor(-10.0)
    ours = SigmoidLoss()(LossInput(img, txt, scale, bias))["loss"]
    theirs = SigLipLoss()(img, txt, scale, bias)
    torch.testing.assert_close(ours, theirs)
    ref = sigmoid_reference(img.double(), txt.double(), 10.0, -10.0, {(i, i) for i in range(8)})
    assert float(ours) == pytest.approx(ref, rel=1e-5)
    assert SigmoidLoss.logit_scale_init == 10.0 and SigmoidLoss.logit_bias_init == -10.0


def test_bias_search_finds_grid_minimum():
    from vltool.losses import search_logit_bias

    calls = []

    def f(b):
        calls.append(b)
        return (b + 7.33) ** 2

    found = search_logit_bias(f)
    assert found.bias == pytest.approx(-7.3)
    assert (found.lo, found.hi) == (-20, 0) and min(calls) >= -20 and max(calls) <= 0  # interior: no widening
    assert found.evaluations == len(set(calls)) == len(calls)  # each bias's loss computed once


def test_bias_search_widens_the_bracket_until_the_minimum_is_interior():
    """A model initialised with logit scale 100 has its optimum far below -20 (the old bracket's edge, which
    the search used to return silently): the widened search must agree with a brute-force grid."""
    from vltool.losses import LossInput, SigmoidLoss, search_logit_bias

    img, txt = unit(64, 64, 20), unit(64, 64, 21)  # random features of a fresh model: (N, D) each
    scale = torch.tensor(100.0, dtype=torch.float64)

    def loss_at(b):
        return float(SigmoidLoss()(LossInput(img, txt, scale, torch.tensor(b, dtype=torch.float64)))["loss"])

    found = search_logit_bias(loss_at)
    grid = np.round(np.arange(-100.0, 20.0 + 1e-9, 0.1), 6)  # brute force: every multiple of 0.1 in [-100, 20]
    brute = float(grid[int(np.argmin([loss_at(float(b)) for b in grid]))])
    assert found.bias == pytest.approx(brute, abs=1e-9)
    assert found.bias < -21 and found.lo < found.bias - 1 and found.bias + 1 < found.hi  # interior, past the old edge
    assert loss_at(-20.0) > 1.2 * loss_at(found.bias)  # what stopping at -20 cost
    assert found.evaluations < 120  # the widened grid, not a brute-force search


def test_bias_search_widens_upwards_and_refuses_a_loss_without_minimum():
    from vltool.errors import VltoolError
    from vltool.losses import search_logit_bias

    found = search_logit_bias(lambda b: (b - 33.46) ** 2)
    assert found.bias == pytest.approx(33.5) and found.hi > 34.5
    with pytest.raises(VltoolError, match="no minimum"):  # a loss that falls forever as b grows
        search_logit_bias(lambda b: -b)


def test_sigmoid_trains_with_caption_augmentation_positives_and_bias_search(tmp_path, pairs_pos):
    from vltool.model import load_model
    from vltool.pretrain import pretrain

    cfg = micro(loss="sigmoid", captions_per_image=2, caption_sampling="random", mined_positives=True,
                bias_init="search", bias_search_batches=2, steps=3)
    r = pretrain([pairs_pos], tmp_path / "run", cfg, progress=False)
    s = r["stats"]
    assert -20 <= s["searched_logit_bias"] <= 0 and s["final_logit_bias"] is not None
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "bias_search" and lines[0]["logit_bias"] == s["searched_logit_bias"]
    assert all(math.isfinite(m["loss"]) for m in metrics(tmp_path / "run"))
    m = load_model(tmp_path / "run")
    assert m.config["logit_bias_init"] == s["searched_logit_bias"]
    assert float(m.model.logit_bias.detach()) == pytest.approx(s["final_logit_bias"])
    assert m.logit_scale == pytest.approx(s["final_logit_scale"])


def test_trainer_bias_search_finds_the_brute_force_minimum_inside_the_logged_bracket(tmp_path, pairs):
    """Through the trainer (a fresh vltool-micro at logit scale 100): the searched bias is the brute-force
    minimum of the summed loss over the same encoded search batches, inside the bracket metrics.jsonl logs.
    (Below -20 is covered on random features by test_bias_search_widens_the_bracket_until_the_minimum_is_interior.)"""
    from vltool.losses import LossInput, SigmoidLoss
    from vltool.pretrain.setup import setup
    from vltool.pretrain.objectives import SigmoidObjective
    from vltool.pretrain.rundir import resolve_run

    calls = []
    real = SigmoidObjective.loss_input

    def keep(self, model, feats, side, local=slice(None)):  # the search batches' features, as the search sees them
        x = real(self, model, feats, side, local)
        calls.append(x)
        return x

    SigmoidObjective.loss_input = keep
    try:
        cfg = micro(loss="sigmoid", bias_init="search", bias_search_batches=2, logit_scale_init=100.0, augment="none")
        spec, run_dir, config = resolve_run([pairs], tmp_path / "run", cfg, (), None, (), (), None)
        run = setup(spec, run_dir, config, overwrite=False, resumed=False, progress=False)
    finally:
        SigmoidObjective.loss_input = real
    (logged,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"bias_search"' in line]
    b = logged["logit_bias"]
    assert b == run.searched_bias and logged["bracket"][0] < b - 1 and b + 1 < logged["bracket"][1]
    assert logged["evaluations"] >= 21 and len(calls) == 2
    scale = torch.tensor(100.0)

    def loss_at(v):
        return sum(float(SigmoidLoss()(LossInput(x.image_features.float(), x.text_features.float(), scale, torch.tensor(v), extra=x.extra))["loss"])
                   for x in calls[:2])

    grid = np.round(np.arange(-150.0, 10.0 + 1e-9, 0.1), 6)
    assert b == pytest.approx(float(grid[int(np.argmin([loss_at(float(v)) for v in grid]))]), abs=1e-9)


def test_sigmoid_options_are_checked(pairs):
    from vltool.pretrain import PretrainConfig

    with pytest.raises(UsageError) as e:
        PretrainConfig(loss="clip", bias_init="x", captions_per_image=0, mined_positives=True).validate()
    for msg in ("--bias-init", "--captions-per-image", "--mined-positives"):
        assert msg in str(e.value)
    with pytest.raises(UsageError, match="--bias-init must be a number"):
        PretrainConfig(loss="sigmoid", bias_init="x").validate()


def test_sigmoid_resume_equals_uninterrupted(tmp_path, pairs_pos):
    from vltool.model import load_model
    from vltool.pretrain import pretrain

    cfg = micro(loss="sigmoid", steps=4, captions_per_image=3, caption_sampling="random", mined_positives=True,
                bias_init="search", bias_search_batches=1)
    pretrain([pairs_pos], tmp_path / "full", cfg, progress=False)
    assert pretrain([pairs_pos], tmp_path / "part", cfg, stop_after_steps=2, progress=False)["status"] == "stopped"
    r = pretrain(resume=tmp_path / "part", progress=False)
    assert r["stats"]["resumed_from_step"] == 2
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "part"))
    np.testing.assert_allclose([m["loss"] for m in metrics(tmp_path / "part")], [m["loss"] for m in metrics(tmp_path / "full")], rtol=1e-5)
    assert load_model(tmp_path / "full").fingerprint == load_model(tmp_path / "part").fingerprint


# ---------------------------------------------------------------------------------------------------
# 2 processes = 1
# ---------------------------------------------------------------------------------------------------

DDP_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    torch.set_num_threads(1)
    from vltool.pretrain import PretrainConfig, pretrain

    data, out, batch, opts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    # float32 (precision no): 2 processes equal 1 to float32's rounding; --precision auto is bf16 on a CPU with
    # AVX-512 BF16, whose rounding differs with the batch's split
    base = dict(arch="vltool-micro", batch_size=batch, steps=3, optimizer="sgd", lr=0.05, log_every=1, augment="clip", precision="no")
    cfg = PretrainConfig(**{**base, **opts})
    pretrain([data], out + "/run", cfg, progress=False)
    """
)


def run_ddp(tmp_path, data, nproc: int, batch: int, opts: dict) -> Path:
    script = tmp_path / "ddp_losses.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / f"p{nproc}"
    out.mkdir()
    launch([script, data, out, batch, json.dumps(opts)], nproc)
    return out


def check_two_equal_one(tmp_path, data, opts):
    one = run_ddp(tmp_path, data, 1, 8, opts)
    two = run_ddp(tmp_path, data, 2, 4, opts)
    m1, m2 = metrics(one / "run"), metrics(two / "run")
    np.testing.assert_allclose([m["loss"] for m in m2], [m["loss"] for m in m1], rtol=1e-5)
    assert_same_weights(weights(one / "run"), weights(two / "run"), atol=1e-5)
    return one, two


@pytest.mark.slow
def test_sigmoid_two_processes_equal_one(tmp_path, pairs_pos):
    one, two = check_two_equal_one(tmp_path, pairs_pos, dict(loss="sigmoid", captions_per_image=2, caption_sampling="random",
                                                            mined_positives=True, bias_init="search", bias_search_batches=2))
    s1 = json.loads((one / "run" / "vltool.json").read_text())["stats"]
    s2 = json.loads((two / "run" / "vltool.json").read_text())["stats"]
    assert s1["searched_logit_bias"] == s2["searched_logit_bias"]


# ---------------------------------------------------------------------------------------------------
# unicl (UniCL, Algorithm 1)
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """The pairs with a ClassLabel `label` (the colour): one dataset for --label-data, one for --text-data."""
    import datasets

    from tests.fixtures.squares import WORDS

    base = datasets.load_from_disk(make_pairs(tmp_path_factory.mktemp("lb") / "base", n=32))
    ds = base.add_column("label", [i % 8 for i in range(32)]).cast_column("label", datasets.ClassLabel(names=WORDS))
    lab = ds.select(range(16)).remove_columns(["caption", "captions"])
    txt = ds.select(range(16, 32))
    out = tmp_path_factory.mktemp("lb2")
    lab.save_to_disk(str(out / "lab"))
    txt.save_to_disk(str(out / "txt"))
    return str(out / "lab"), str(out / "txt")


def unicl_reference(img, txt, scale, labels) -> float:
    n = img.shape[0]
    s = [[scale * float(img[i] @ txt[j]) for j in range(n)] for i in range(n)]
    i2t = t2i = 0.0
    for i in range(n):
        lse = math.log(sum(math.exp(s[i][j]) for j in range(n)))
        pos = [j for j in range(n) if labels[j] == labels[i]]
        i2t += sum(lse - s[i][j] for j in pos) / len(pos)
    for j in range(n):
        lse = math.log(sum(math.exp(s[i][j]) for i in range(n)))
        pos = [i for i in range(n) if labels[i] == labels[j]]
        t2i += sum(lse - s[i][j] for i in pos) / len(pos)
    return (i2t / n + t2i / n) / 2


def test_unicl_matches_reference():
    from vltool.losses import LossInput, UniCLLoss

    img, txt = unit(9, 6, 4), unit(9, 6, 5)
    labels = [0, 2, 0, 1, 2, 0, 7, 8, 9]
    out = UniCLLoss()(LossInput(img, txt, torch.tensor(3.0, dtype=torch.float64), extra={"label": torch.tensor(labels)}))
    assert float(out["loss"]) == pytest.approx(unicl_reference(img, txt, 3.0, labels), rel=1e-6)
    assert UniCLLoss.logit_scale_init == pytest.approx(math.e)  # exp(tau), tau = 1


def test_unicl_with_unique_labels_equals_clip():
    from vltool.losses import ClipLoss, LossInput, UniCLLoss, clip_loss_reference

    img, txt = unit(8, 5, 6).float(), unit(8, 5, 7).float()
    scale = torch.tensor(5.0)
    labels = torch.tensor([10, 3, 4, 5, 6, 7, 8, 9])
    u = UniCLLoss()(LossInput(img, txt, scale, extra={"label": labels}))["loss"]
    c = ClipLoss()(LossInput(img, txt, scale))["loss"]
    assert torch.equal(u, c) or float((u - c).abs()) < 1e-6
    assert float(u) == pytest.approx(clip_loss_reference(img.double(), txt.double(), 5.0), rel=1e-5)


def test_unicl_data_roles_templates_and_balance(labelled):
    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import PairDataset, load_unicl_data, make_sampler

    lab, txt = labelled
    cfg = PretrainConfig(arch="vltool-micro", loss="unicl", label_data=[lab], text_data=[txt], balanced=True, batch_size=4)
    cfg.validate()
    d = load_unicl_data(cfg)
    assert len(d.dataset) == 32 and d.templated.sum() == 16
    assert list(d.labels[:8]) == list(range(8)) and len(set(d.labels[16:])) == 16 and d.labels[16:].min() >= 8
    assert len(d.templates) == 80
    ds = PairDataset(d.dataset, d.text_column, None, None, 0, load_images=False, templated=d.templated, templates=d.templates)
    texts = {ds[(e, 0)]["text"] for e in range(20)}
    assert len(texts) > 1 and all("red" in t for t in texts)  # row 0: class "red" in random templates
    assert ds[(0, 16)]["text"] == "a red square"  # an image-text row keeps its caption
    s = make_sampler(d, cfg, 1, 0, 0, 8)
    assert s.n == 32 and s.per_epoch == 8
    # an unbalanced text side: 16 label rows, 16 text rows -> all of both; with fewer label rows, fewer text rows
    cfg2 = PretrainConfig(arch="vltool-micro", loss="unicl", label_data=[lab], text_data=[txt], balanced=True,
                          batch_size=4, )
    d.templated[:12] = False  # pretend 4 label rows, 28 text rows
    s = make_sampler(d, cfg2, 1, 0, 0, 2)
    e0, e1 = s.perm(0), s.perm(1)
    assert len(e0) == 8 and set(range(12, 16)) <= set(e0) and set(e0) != set(e1)


def test_unicl_trains_and_resumes(tmp_path, labelled):
    from vltool.pretrain import pretrain

    lab, txt = labelled
    cfg = micro(loss="unicl", label_data=[lab], text_data=[txt], balanced=True, steps=4)
    r = pretrain([], tmp_path / "full", cfg, progress=False)
    assert r["stats"]["steps"] == 4 and metrics(tmp_path / "full")[0]["logit_scale"] == pytest.approx(math.e, rel=1e-2)
    assert pretrain([], tmp_path / "part", cfg, stop_after_steps=2, progress=False)["status"] == "stopped"
    pretrain(resume=tmp_path / "part", progress=False)
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "part"))
    np.testing.assert_allclose([m["loss"] for m in metrics(tmp_path / "part")], [m["loss"] for m in metrics(tmp_path / "full")], rtol=1e-5)


def test_unicl_frozen_text_table_equals_no_cache(tmp_path, labelled):
    """Locked text tower: every template around every class name is encoded once; same training."""
    from vltool.pretrain import pretrain

    lab, txt = labelled
    cfg = dict(loss="unicl", label_data=[lab], text_data=[txt], balanced=True, steps=3, lock_text=True, augment="none")
    a = pretrain([], tmp_path / "cached", micro(**cfg), progress=False)
    b = pretrain([], tmp_path / "plain", micro(**cfg, cache_frozen=False), progress=False)
    assert a["stats"]["cached_features"]["text"] == "per distinct text" and b["stats"]["cached_features"]["text"] is False
    assert a["stats"]["final_loss"] == pytest.approx(b["stats"]["final_loss"], rel=1e-5)


def test_unicl_options_are_checked(labelled):
    from vltool.pretrain import PretrainConfig

    with pytest.raises(UsageError, match="options of --loss unicl"):
        PretrainConfig(loss="clip", label_data=["x"]).validate()
    with pytest.raises(UsageError, match="--balanced needs --label-data"):
        PretrainConfig(loss="unicl", balanced=True).validate()
    with pytest.raises(UsageError, match="templates"):
        PretrainConfig(loss="unicl", label_data=["x"], templates="no-such-templates").validate()


@pytest.mark.slow
def test_unicl_two_processes_equal_one(tmp_path, labelled):
    lab, txt = labelled
    check_two_equal_one(tmp_path, txt, dict(loss="unicl", label_data=[lab], balanced=True, prefix_ids=True))


# ---------------------------------------------------------------------------------------------------
# jsd (CLIP-Lite)
# ---------------------------------------------------------------------------------------------------


def jsd_reference(img, txt, scale) -> float:
    n = img.shape[0]
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    pos = sum(sp(-scale * float(img[i] @ txt[i])) for i in range(n)) / n
    neg = sum(sp(scale * float(img[i] @ txt[(i + 1) % n])) for i in range(n)) / n
    return pos + neg


def test_jsd_matches_reference():
    from vltool.losses import JSDLoss, LossInput

    img, txt = unit(7, 5, 8), unit(7, 5, 9)
    out = JSDLoss()(LossInput(img, txt, torch.tensor(1 / 0.07, dtype=torch.float64)))
    assert float(out["loss"]) == pytest.approx(jsd_reference(img, txt, 1 / 0.07), rel=1e-6)
    assert JSDLoss.logit_scale_init == pytest.approx(1 / 0.07)


def jsd_all_reference(img, txt, scale) -> float:
    n = img.shape[0]
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    pos = sum(sp(-scale * float(img[i] @ txt[i])) for i in range(n)) / n
    neg = sum(sp(scale * float(img[i] @ txt[j])) for i in range(n) for j in range(n) if j != i) / (n * (n - 1))
    return pos + neg


def test_jsd_all_negatives_matches_reference_and_differs_from_one():
    from vltool.losses import JSDLoss, LossInput

    img, txt = unit(7, 5, 8), unit(7, 5, 9)
    s = torch.tensor(1 / 0.07, dtype=torch.float64)
    all_ = float(JSDLoss("all")(LossInput(img, txt, s))["loss"])
    assert all_ == pytest.approx(jsd_all_reference(img, txt, 1 / 0.07), rel=1e-6)
    assert abs(all_ - jsd_reference(img, txt, 1 / 0.07)) > 1e-3
    # with N = 2 the only other text is the next row's: the two estimates coincide
    assert float(JSDLoss("all")(LossInput(img[:2], txt[:2], s))["loss"]) == pytest.approx(jsd_reference(img[:2], txt[:2], 1 / 0.07), rel=1e-6)
    with pytest.raises(ValueError, match="negatives"):
        JSDLoss("some")


def test_jsd_negatives_option_reaches_the_loss(tmp_path, pairs, cli):
    from vltool.pretrain import pretrain

    one = pretrain([pairs], tmp_path / "one", micro(loss="jsd", steps=2), progress=False)
    all_ = pretrain([pairs], tmp_path / "all", micro(loss="jsd", steps=2, jsd_negatives="all"), progress=False)
    assert one["stats"]["final_loss"] != pytest.approx(all_["stats"]["final_loss"], rel=1e-6)
    r = cli("pretrain", str(pairs), "--arch", "vltool-micro", "--steps", "1", "--jsd-negatives", "all", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "--jsd-negatives is an option of --loss jsd" in r.output


def test_critic_projection_starts_near_identity():
    from vltool.model import CriticProjection

    c = CriticProjection(6, 6)
    w = c.shortcut.weight.detach()
    assert torch.equal(torch.diagonal(w), torch.ones(6)) and (w - torch.eye(6)).abs().max() <= 0.01
    assert c.block[0].bias is None and isinstance(c.block[1], torch.nn.BatchNorm1d) and isinstance(c.norm, torch.nn.LayerNorm)
    assert c(torch.randn(4, 6)).shape == (4, 6)


def test_jsd_trains_saves_critic_and_resumes(tmp_path, pairs):
    from vltool.model import load_model
    from vltool.pretrain import pretrain

    cfg = micro(loss="jsd", steps=4, critic_dim=24)
    r = pretrain([pairs], tmp_path / "full", cfg, progress=False)
    assert r["stats"]["open_clip_export"] is None  # open_clip has no critic
    m = load_model(tmp_path / "full")
    assert m.config["critic"] == {"dim": 24} and any(k.startswith("image_critic.") for k in weights(tmp_path / "full"))
    x = torch.randn(3, 3, 32, 32)
    tok = m.tokenize(["a red square", "blue", "x"])
    with torch.no_grad():
        raw_i = m.model.image_proj(m.model.visual(x))
        raw_t = m.model.text_proj(m.model.text(tok))
        want_i = F.normalize(m.model.image_critic(raw_i), dim=-1)
        want_t = F.normalize(m.model.text_critic(raw_t), dim=-1)
    assert m.encode_image(x).shape == (3, 24)
    torch.testing.assert_close(m.encode_image(x), want_i)
    torch.testing.assert_close(m.encode_text(tok), want_t)
    assert pretrain([pairs], tmp_path / "part", cfg, stop_after_steps=2, progress=False)["status"] == "stopped"
    pretrain(resume=tmp_path / "part", progress=False)
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "part"))  # incl. the critic's BatchNorm statistics


@pytest.mark.slow
def test_jsd_two_processes_equal_one(tmp_path, pairs):
    check_two_equal_one(tmp_path, pairs, dict(loss="jsd", caption_sampling="random"))


# ---------------------------------------------------------------------------------------------------
# clip --memory-bank (EMA towers and a queue of keys)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(3, 2, 2), (5, 12, 7)], ids=["wraps", "batch-larger-than-queue"])
def test_memory_bank_enqueue_equals_one_key_at_a_time(sizes):
    """Enqueueing a batch equals enqueueing its keys one by one (a FIFO queue), also when the batch holds
    more keys than the queue has slots (then each slot is written once, with the newest key for it)."""
    from vltool.losses import MemoryBankLoss

    k, first, second = sizes
    torch.manual_seed(0)
    batched, single = MemoryBankLoss(k, 4), MemoryBankLoss(k, 4)
    for n, start in ((first, 0), (second, 100)):
        img, txt, ids = torch.randn(n, 4), torch.randn(n, 4), torch.arange(start, start + n)
        batched.enqueue(img, txt, ids)
        for i in range(n):
            single.enqueue(img[i : i + 1], txt[i : i + 1], ids[i : i + 1])
    for name in ("image_queue", "text_queue", "queue_ids", "queue_ptr"):
        torch.testing.assert_close(getattr(batched, name), getattr(single, name), rtol=0, atol=0, msg=name)


def test_queue_slots_are_distinct():
    """Every slot is written at most once per enqueue (on CPU a repeated slot happens to keep the last
    write, as the test above sees; on CUDA its winner is undefined)."""
    from vltool.losses import queue_slots

    for ptr, n, size in [(0, 3, 5), (4, 3, 5), (2, 12, 5), (0, 5, 5), (3, 11, 4)]:
        skip, slots = queue_slots(torch.tensor(ptr), n, size)
        assert skip == max(0, n - size) and len(slots) == n - skip == len(set(slots.tolist()))
        assert slots[-1].item() == (ptr + n - 1) % size  # the newest key goes where the pointer was heading


def test_memory_bank_loss_matches_reference_and_masks_own_keys():
    from vltool.losses import LossInput, MemoryBankLoss

    n, k, d, s = 4, 6, 5, 50.0
    img, txt, ik, tk = unit(n, d, 10), unit(n, d, 11), unit(n, d, 12), unit(n, d, 13)
    bank = MemoryBankLoss(k, d).double()
    bank.enqueue(unit(5, d, 14), unit(5, d, 15), torch.tensor([7, 1, 8, 9, 2]))  # slot 5 keeps its random initial key
    assert int(bank.queue_ptr) == 5
    ids = torch.tensor([1, 2, 3, 4])
    out = bank(LossInput(img, txt, torch.tensor(s, dtype=torch.float64), extra={"image_keys": ik, "text_keys": tk, "ids": ids}))

    def ref_side(q, pos, queue):
        total = 0.0
        for i in range(n):
            terms = [s * float(q[i] @ pos[i])]
            terms += [s * float(q[i] @ queue[j]) for j in range(k) if bank.queue_ids[j] != ids[i]]
            total += -terms[0] + math.log(sum(math.exp(t) for t in terms))
        return total

    ref = (ref_side(img, tk, bank.text_queue) + ref_side(txt, ik, bank.image_queue)) / (2 * n)
    assert float(out["loss"]) == pytest.approx(ref, rel=1e-6)
    bank.enqueue(ik, tk, ids)  # wraps around
    assert int(bank.queue_ptr) == 3 and bank.queue_ids.tolist() == [2, 3, 4, 9, 2, 1]


def test_memory_bank_loss_under_bf16_autocast_masks_without_overflow():
    """--precision bf16 (auto on a GPU, and on a CPU with AVX-512 BF16): the queue logits come out of the matmul in
    bf16, and masking them with float32's lowest value overflowed ("value cannot be converted to type
    c10::BFloat16 without overflow"); masked with bf16's own lowest, the loss is float32's to bf16's precision."""
    from vltool.losses import LossInput, MemoryBankLoss

    n, k, d, s = 4, 6, 8, 20.0
    bank = MemoryBankLoss(k, d)
    bank.enqueue(unit(6, d, 14).float(), unit(6, d, 15).float(), torch.tensor([1, 7, 2, 8, 9, 3]))  # every query's own key queued
    batch = LossInput(unit(n, d, 10).float(), unit(n, d, 11).float(), torch.tensor(s),
                      extra={"image_keys": unit(n, d, 12).float(), "text_keys": unit(n, d, 13).float(), "ids": torch.tensor([1, 2, 3, 4])})
    exact = float(bank(batch)["loss"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = float(bank(batch)["loss"])
    assert math.isfinite(low) and low == pytest.approx(exact, rel=2e-2)


def test_memory_bank_trains_resumes_and_exports_ema(tmp_path, pairs):
    from safetensors.torch import load_file

    from vltool.model import load_model
    from vltool.pretrain import list_checkpoints, pretrain

    cfg = micro(memory_bank=16, ema_momentum=0.9, steps=4, export_ema=True)
    r = pretrain([pairs], tmp_path / "full", cfg, progress=False)
    assert r["stats"]["final_logit_scale"] == pytest.approx(50.0, rel=1e-5)  # 1/0.02, fixed
    ck = load_file(str(list_checkpoints(tmp_path / "full")[-1] / "loss.safetensors"))
    assert {"image_queue", "text_queue", "queue_ids", "queue_ptr"} <= set(ck) and any(k.startswith("ema.") for k in ck)
    assert int(ck["queue_ptr"]) == (4 * 8) % 16 and (ck["queue_ids"] >= 0).all()
    exported = weights(tmp_path / "full")
    ema = {k[4:]: v for k, v in ck.items() if k.startswith("ema.")}
    assert_same_weights(exported, ema)  # --export-ema: the model is the EMA one
    assert pretrain([pairs], tmp_path / "part", cfg, stop_after_steps=2, progress=False)["status"] == "stopped"
    pretrain(resume=tmp_path / "part", progress=False)
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "part"))
    np.testing.assert_allclose([m["loss"] for m in metrics(tmp_path / "part")], [m["loss"] for m in metrics(tmp_path / "full")], rtol=1e-5)
    assert load_model(tmp_path / "full").logit_scale == pytest.approx(50.0, rel=1e-5)


def test_memory_bank_options_are_checked():
    from vltool.pretrain import PretrainConfig

    with pytest.raises(UsageError) as e:
        PretrainConfig(loss="sigmoid", memory_bank=8, temperature=0, ema_momentum=1.0).validate()
    for msg in ("--memory-bank", "--temperature", "--ema-momentum"):
        assert msg in str(e.value)
    with pytest.raises(UsageError, match="--export-ema needs"):
        PretrainConfig(export_ema=True).validate()


def test_ema_momentum_rule_follows_the_run_length():
    from vltool.pretrain.objectives import MOCO_MOMENTUM, ema_initial_share, ema_momentum_for

    assert ema_momentum_for(460) == 0.5 ** (1 / 46)  # half-life 46 steps, a tenth of the run
    assert ema_momentum_for(460) == pytest.approx(0.985045, abs=1e-6)
    assert ema_momentum_for(250) == pytest.approx(0.972655, abs=1e-6)
    assert ema_momentum_for(4) == 0.5 ** 2.5
    for t in (1, 4, 250, 460, 6000):  # the initial weights keep 2^-10 of the EMA at the end of the run
        assert ema_initial_share(ema_momentum_for(t), t) == pytest.approx(2 ** -10, rel=1e-9)
    assert ema_momentum_for(8000) == ema_momentum_for(10 ** 5) == MOCO_MOMENTUM == 0.999  # long runs: MoCo's
    assert ema_initial_share(0.999, 460) == pytest.approx(0.6311, abs=1e-4)  # the handicap of MoCo's value here
    with pytest.raises(ValueError):
        ema_momentum_for(0)


def _setup_run(tmp_path, data, cfg):
    from vltool.pretrain.setup import setup
    from vltool.pretrain.rundir import resolve_run

    spec, run_dir, config = resolve_run([data], tmp_path, cfg, (), None, (), (), None)
    return setup(spec, run_dir, config, overwrite=False, resumed=False, progress=False)


def test_memory_bank_momentum_from_the_run_length_is_used_and_logged(tmp_path, pairs, capsys):
    from vltool.pretrain import pretrain
    from vltool.pretrain.objectives import ema_momentum_for

    run = _setup_run(tmp_path / "setup", pairs, micro(memory_bank=16, steps=6))
    assert run.objective.loss.momentum == ema_momentum_for(6) == 0.5 ** (10 / 6)
    r = pretrain([pairs], tmp_path / "run", micro(memory_bank=16, steps=3), progress=False)
    assert r["stats"]["ema_momentum"] == ema_momentum_for(3)
    (logged,) = metrics(tmp_path / "run", kind="ema")
    assert logged["ema_momentum"] == ema_momentum_for(3) and logged["given"] is False
    assert logged["initial_share_at_end"] == pytest.approx(2 ** -10)
    assert "warning" not in capsys.readouterr().err


def test_memory_bank_warns_when_the_ema_stays_at_its_initial_weights(tmp_path, pairs, capsys):
    from vltool.pretrain import PretrainConfig

    run = _setup_run(tmp_path / "a", pairs, micro(memory_bank=16, steps=6, ema_momentum=0.999))
    err = capsys.readouterr().err
    assert run.objective.loss.momentum == 0.999  # a given momentum is used as given
    assert "warning: --ema-momentum 0.999 over 6 steps leaves the EMA key towers 99% at their initial weights" in err
    _setup_run(tmp_path / "b", pairs, micro(memory_bank=16, steps=6, ema_momentum=0.8))  # 0.8^6 = 26%: no warning
    assert "warning" not in capsys.readouterr().err
    with pytest.raises(UsageError, match="--ema-momentum needs --memory-bank"):
        PretrainConfig(ema_momentum=0.99).validate()


@pytest.mark.slow
def test_memory_bank_two_processes_equal_one(tmp_path, pairs):
    check_two_equal_one(tmp_path, pairs, dict(memory_bank=16, ema_momentum=0.9))


# ---------------------------------------------------------------------------------------------------
# simclr (image-only NT-Xent)
# ---------------------------------------------------------------------------------------------------


def test_simclr_matches_reference():
    from vltool.losses import LossInput, SimCLRLoss

    v1, v2 = unit(5, 4, 16), unit(5, 4, 17)
    loss = SimCLRLoss()  # no head: the NT-Xent itself
    out = loss(LossInput(v1, v2, torch.tensor(10.0, dtype=torch.float64)))
    z = torch.cat([v1, v2])
    n2 = z.shape[0]
    ref = 0.0
    for a in range(n2):
        b = (a + 5) % n2
        sims = [10.0 * float(z[a] @ z[c]) for c in range(n2) if c != a]
        ref += -10.0 * float(z[a] @ z[b]) + math.log(sum(math.exp(x) for x in sims))
    assert float(out["loss"]) == pytest.approx(ref / n2, rel=1e-6)
    with_head = SimCLRLoss(4)
    assert sum(p.numel() for p in with_head.parameters()) == 2 * (4 * 4 + 4)


def test_simclr_trains_image_tower_only_and_resumes(tmp_path, pairs):
    from vltool.pretrain import list_checkpoints, pretrain

    cfg = micro(loss="simclr", augment="simclr", steps=4)
    r = pretrain([pairs], tmp_path / "full", cfg, progress=False)
    assert r["stats"]["frozen"]["text"] and not r["stats"]["frozen"]["image"]
    assert all(math.isfinite(m["loss"]) for m in metrics(tmp_path / "full"))
    from safetensors.torch import load_file

    assert any(k.startswith("head.") for k in load_file(str(list_checkpoints(tmp_path / "full")[-1] / "loss.safetensors")))
    assert pretrain([pairs], tmp_path / "part", cfg, stop_after_steps=2, progress=False)["status"] == "stopped"
    pretrain(resume=tmp_path / "part", progress=False)
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "part"))
    with pytest.raises(UsageError, match="--augment simclr"):
        micro(loss="simclr", augment="clip").validate()


@pytest.mark.slow
def test_simclr_two_processes_equal_one(tmp_path, pairs):
    check_two_equal_one(tmp_path, pairs, dict(loss="simclr", augment="simclr"))
