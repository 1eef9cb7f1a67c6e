"""UniCL's labels reach its targets (issue 33, section 5): rows that share a label are all positives.

UniCL (Unified Contrastive Learning in Image-Text-Label Space, section 3.2, equations (2) and (3)):

    L_i2t = - sum_{i in B} 1/|P(i)| sum_{k in P(i)} log( exp(tau u_i.v_k) / sum_{j in B} exp(tau u_i.v_j) ),
    L_t2i = - sum_{j in B} 1/|P(j)| sum_{k in P(j)} log( exp(tau u_k.v_j) / sum_{i in B} exp(tau u_i.v_j) ),
    P(i) = {k in B : y_k = y_i},

averaged over the batch and halved as in its Algorithm 1: loss = (L_i2t + L_t2i) / (2 |B|). With every
label distinct P(i) = {i} and the loss is CLIP's, so a case where no two rows share a label cannot tell
dropped labels from kept ones: every case here has rows that share one.
"""

from __future__ import annotations

import importlib.util
import math
import types
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("golden_losses", REPO / "scripts" / "golden_losses.py")
gl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gl)

# The hand-made case: 3 rows in 2-d, rows 0 and 1 share label 0 (two images of one class), row 2 has a
# label of its own (an image-text row). Each of the two same-class images is nearest to the *other* row's
# text, so the targets matter. Multiplier tau = ln 2, so exp(tau * cos) is 2, 1 or 1/2 for cos 1, 0, -1.
#   u (images): e1, e2, -e1        v (texts): e2, e1, -e1
#   tau u.v^T / ln 2 = [[0, 1, -1], [1, 0, 0], [0, -1, 1]]; exps [[1, 2, 1/2], [2, 1, 1], [1, 1/2, 2]]
#   row sums 3.5, 4, 3.5; column sums 4, 3.5, 3.5 (the matrix of exps is symmetric)
# Shared labels, P(0) = P(1) = {0, 1}, P(2) = {2}:
#   i2t rows: ln 3.5 - (ln 1 + ln 2)/2, ln 4 - (ln 2 + ln 1)/2, ln 3.5 - ln 2
#           = ln 3.5 - ln2/2, ln 4 - ln2/2, ln 1.75; sum = ln(3.5 * 2 * 1.75) = ln 12.25
#   t2i: the same by symmetry; loss = (ln 12.25 + ln 12.25) / (2 * 3) = (2/3) ln 3.5
# Labels dropped (identity targets, CLIP): rows -ln(1/3.5), -ln(1/4), -ln(2/3.5); sum ln 24.5; loss ln(24.5)/3
HAND_U = [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]
HAND_V = [[0.0, 1.0], [1.0, 0.0], [-1.0, 0.0]]
HAND_LABELS = [0, 0, 1]
HAND_SCALE = math.log(2)
HAND_SHARED = 2 / 3 * math.log(3.5)  # 0.835160...
HAND_DROPPED = math.log(24.5) / 3  # 1.066271...: what the same case gives with every label distinct


def unicl_equation(u, v, tau, y) -> float:
    """Equations (2) and (3) term by term in float64, normalised as Algorithm 1: (L_i2t + L_t2i) / (2|B|)."""
    n = len(y)
    s = [[tau * sum(float(a) * float(b) for a, b in zip(u[i], v[j])) for j in range(n)] for i in range(n)]
    l_i2t = 0.0
    for i in range(n):
        p = [k for k in range(n) if y[k] == y[i]]
        log_z = math.log(sum(math.exp(s[i][j]) for j in range(n)))
        l_i2t -= sum(s[i][k] - log_z for k in p) / len(p)
    l_t2i = 0.0
    for j in range(n):
        p = [k for k in range(n) if y[k] == y[j]]
        log_z = math.log(sum(math.exp(s[i][j]) for i in range(n)))
        l_t2i -= sum(s[k][j] - log_z for k in p) / len(p)
    return (l_i2t + l_t2i) / (2 * n)


def _unicl(u, v, scale, labels) -> float:
    from vltool.losses import LossInput, UniCLLoss

    t = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731  (the loss computes in float32)
    extra = {} if labels is None else {"label": torch.as_tensor(labels)}
    return float(UniCLLoss()(LossInput(t(u), t(v), t(scale), extra=extra))["loss"])


def test_hand_case_reference_is_the_closed_form():
    assert unicl_equation(HAND_U, HAND_V, HAND_SCALE, HAND_LABELS) == pytest.approx(HAND_SHARED, rel=1e-12)
    assert unicl_equation(HAND_U, HAND_V, HAND_SCALE, [0, 1, 2]) == pytest.approx(HAND_DROPPED, rel=1e-12)
    assert HAND_DROPPED - HAND_SHARED > 0.2


def test_unicl_loss_shared_labels_hand_case():
    """UniCLLoss on the hand-made case: (2/3) ln 3.5 with the labels; without them it would be ln(24.5)/3."""
    assert _unicl(HAND_U, HAND_V, HAND_SCALE, HAND_LABELS) == pytest.approx(HAND_SHARED, rel=1e-6)
    # only equality of labels matters, not their values
    assert _unicl(HAND_U, HAND_V, HAND_SCALE, [7, 7, 3]) == pytest.approx(HAND_SHARED, rel=1e-6)
    # distinct labels or none: CLIP's loss
    assert _unicl(HAND_U, HAND_V, HAND_SCALE, [0, 1, 2]) == pytest.approx(HAND_DROPPED, rel=1e-6)
    assert _unicl(HAND_U, HAND_V, HAND_SCALE, None) == pytest.approx(HAND_DROPPED, rel=1e-6)


def test_unicl_loss_matches_the_equation_with_shared_labels():
    """A random batch of 10 with classes of 4, 3 and 1 rows and two image-text rows (unique labels)."""
    g = torch.Generator().manual_seed(33)
    u = F.normalize(torch.randn(10, 5, generator=g, dtype=torch.float64), dim=-1)
    v = F.normalize(torch.randn(10, 5, generator=g, dtype=torch.float64), dim=-1)
    y = [2, 0, 2, 1, 0, 2, 9, 0, 2, 8]
    want = unicl_equation(u.tolist(), v.tolist(), 4.0, y)
    assert _unicl(u, v, 4.0, y) == pytest.approx(want, rel=1e-6)
    assert abs(_unicl(u, v, 4.0, list(range(10))) - want) > 1e-3 * want  # the labels change the loss


def test_unicl_objective_sends_the_shared_labels_to_the_loss(tmp_path):
    """The pretrain path: load_unicl_data gives rows of one class one label, UniCLObjective.side takes the
    batch rows' labels, and the loss built from them gives the hand-made case's value."""
    from vltool.losses import LossInput
    from vltool.pretrain import PretrainConfig
    from vltool.pretrain.data import load_unicl_data
    from vltool.pretrain.objectives import UniCLObjective, build_objective

    args = gl.build_data("unicl_shared", tmp_path)  # 12 label rows, class i % 4; 4 image-text rows
    cfg = PretrainConfig(**{**gl.BASE, **gl.VARIANTS["unicl-shared-labels"][1], **{k: v for k, v in args.items() if k != "data"}})
    cfg.validate()
    train = load_unicl_data(cfg)
    labels = [int(x) for x in train.labels]
    assert len(labels) == 16 and labels[:12] == [i % 4 for i in range(12)]
    assert len(set(labels[12:])) == 4 and not set(labels[12:]) & set(labels[:12])
    objective = build_objective(cfg, train, total_steps=1)
    assert isinstance(objective, UniCLObjective)
    model = types.SimpleNamespace(logit_scale=torch.zeros(()))
    rows = torch.tensor([1, 5, 13])  # two rows of class 1 (green) and one image-text row
    side = objective.side(model, {"rows": rows}, {})
    assert side["label"].tolist() == [1, 1, labels[13]]
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    out = objective.loss(LossInput(t(HAND_U), t(HAND_V), t(HAND_SCALE), extra=objective.extra(side)))
    assert float(out["loss"]) == pytest.approx(HAND_SHARED, rel=1e-6)
