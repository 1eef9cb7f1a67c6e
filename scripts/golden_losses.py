"""Golden first-N training losses of every `vltool pretrain` objective.

Each variant trains `vltool-micro` on CPU for STEPS steps (log_every=1, seed 0, augment none where the
objective allows) on a tiny synthetic dataset built here, through the public Python API, and reads the
per-step `loss` of RUN_DIR/metrics.jsonl. tests/test_golden_losses.py compares a fresh run with
tests/golden/losses.json, so a refactor of the trainer can show that the arithmetic did not change.

    python scripts/golden_losses.py            # print the losses as JSON
    python scripts/golden_losses.py --write    # (re)write tests/golden/losses.json

Regenerate the goldens only when a change is meant to alter the arithmetic, and say so in its commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `python scripts/golden_losses.py`: the images are the tests' (tests/fixtures/squares.py)
from tests.fixtures.squares import COLORS, WORDS, png  # noqa: E402
GOLDEN = REPO / "tests" / "golden" / "losses.json"
STEPS = 4
ROWS = 16  # rows of each dataset; the batch of most variants is all of them

# variant -> (dataset kind, PretrainConfig fields on top of BASE)
VARIANTS: dict[str, tuple[str, dict]] = {
    "clip": ("pairs", dict(loss="clip")),
    "sigmoid": ("pairs", dict(loss="sigmoid")),
    "sigmoid-mined": ("pairs_pos", dict(loss="sigmoid", mined_positives=True)),
    "sigmoid-k": ("pairs", dict(loss="sigmoid", captions_per_image=2, caption_sampling="random")),
    "unicl": ("unicl", dict(loss="unicl")),
    # 12 image-label rows in 4 classes (3 rows each) + 4 image-text rows: targets are not the identity
    "unicl-shared-labels": ("unicl_shared", dict(loss="unicl")),
    "jsd": ("pairs", dict(loss="jsd")),
    "memory-bank": ("pairs", dict(loss="clip", memory_bank=32, batch_size=8, optimizer="sgd", lr=0.1, weight_decay=0.0,
                                  ema_momentum=0.999)),
    # the default momentum: from the run's length (0.5^(10/4) for these 4 steps)
    "memory-bank-momentum-rule": ("pairs", dict(loss="clip", memory_bank=32, batch_size=8, optimizer="sgd", lr=0.1,
                                                weight_decay=0.0)),
    "simclr": ("pairs", dict(loss="simclr", augment="simclr")),
    "sigmoid-bias-search": ("pairs", dict(loss="sigmoid", bias_init="search", bias_search_batches=2, batch_size=8)),
}
BASE = dict(arch="vltool-micro", batch_size=ROWS, steps=STEPS, lr=1e-2, log_every=1, checkpoint_every=1000,
            augment="none", seed=0, device="cpu", precision="no")  # float32: auto is bf16 on a CPU with AVX-512 BF16


def _rows(n: int, prefix: str, start: int = 0) -> dict:
    """Coloured squares (colour i % 8, seeded noise) with a caption and a `captions` list."""
    rows = {"id": [], "image": [], "caption": [], "captions": []}
    for i in range(start, start + n):
        w = WORDS[i % len(WORDS)]
        rows["id"].append(f"{prefix}{i}")
        rows["image"].append({"bytes": png(COLORS[i % len(COLORS)], seed=i), "path": None})
        rows["caption"].append(f"a {w} square")
        rows["captions"].append([f"a {w} square", w, f"the colour {w}"])
    return rows


def _features(**extra):
    import datasets

    return datasets.Features({
        "id": datasets.Value("string"),
        "image": datasets.Image(),
        "caption": datasets.Value("string"),
        "captions": datasets.Sequence(datasets.Value("string")),
        **extra,
    })


def positives_of(n: int = ROWS, empty: bool = False) -> list[list[str]]:
    """Row i's mined positives: every other row of its colour (all in the batch, which is the whole
    dataset). (An id of no row used to be listed too, and ignored; it is refused now, and the losses are the
    same without it.) `empty`: no positives."""
    if empty:
        return [[] for _ in range(n)]
    return [[f"p{j}" for j in range(n) if j != i and j % 8 == i % 8] for i in range(n)]


def build_data(kind: str, root: Path, empty_positives: bool = False) -> dict:
    """Save the dataset(s) of `kind` under root; returns the data-related arguments: {"data": [...],
    and PretrainConfig fields (unicl: label_data, text_data)}."""
    import datasets

    root = Path(root)
    if kind in ("pairs", "pairs_pos"):
        rows, feats = _rows(ROWS, "p"), _features()
        if kind == "pairs_pos":
            rows["positives"] = positives_of(ROWS, empty_positives)
            feats = _features(positives=datasets.Sequence(datasets.Value("string")))
        path = root / kind
        datasets.Dataset.from_dict(rows, features=feats).save_to_disk(str(path))
        return {"data": [str(path)]}
    if kind == "unicl":
        # image-label rows l0..l7 (ClassLabel `label`, the colour) and image-text rows t8..t15: distinct ids
        lab = _rows(ROWS // 2, "l")
        lab = {"id": lab["id"], "image": lab["image"], "label": [i % 8 for i in range(ROWS // 2)]}
        lab_feats = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(),
                                       "label": datasets.ClassLabel(names=WORDS)})
        datasets.Dataset.from_dict(lab, features=lab_feats).save_to_disk(str(root / "label"))
        datasets.Dataset.from_dict(_rows(ROWS // 2, "t", start=ROWS // 2), features=_features()).save_to_disk(str(root / "text"))
        return {"data": [], "label_data": [str(root / "label")], "text_data": [str(root / "text")]}
    if kind == "unicl_shared":
        # image-label rows s0..s11, three of each of the classes red, green, blue, yellow (row i: class i % 4,
        # a square of that colour with its own noise), and image-text rows u12..u15: in the batch (all 16 rows)
        # every label row has two other rows of its label, so UniCL's targets are not the identity
        n_lab, n_cls = 3 * ROWS // 4, 4
        lab = {"id": [f"s{i}" for i in range(n_lab)],
               "image": [{"bytes": png(COLORS[i % n_cls], seed=100 + i), "path": None} for i in range(n_lab)],
               "label": [i % n_cls for i in range(n_lab)]}
        lab_feats = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(),
                                       "label": datasets.ClassLabel(names=WORDS)})
        datasets.Dataset.from_dict(lab, features=lab_feats).save_to_disk(str(root / "label"))
        text = _rows(ROWS - n_lab, "u", start=n_lab)
        datasets.Dataset.from_dict(text, features=_features()).save_to_disk(str(root / "text"))
        return {"data": [], "label_data": [str(root / "label")], "text_data": [str(root / "text")]}
    raise ValueError(kind)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_variant(name: str, root: str | Path, empty_positives: bool = False, **overrides) -> dict:
    """Train variant `name` in root; returns {"losses": [per-step loss], "logit_bias": the searched bias or None}.
    `overrides` replace config fields (e.g. mined_positives=False, steps=1)."""
    import torch

    from vltool.pretrain import PretrainConfig, pretrain

    kind, fields = VARIANTS[name]
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    args = build_data(kind, root / "data", empty_positives=empty_positives)
    data = args.pop("data")
    cfg = PretrainConfig(**{**BASE, **fields, **args, **overrides})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same reduction order whatever the machine
    try:
        pretrain(data=data, out=root / "run", config=cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    ms = _metrics(root / "run")
    train = sorted((m for m in ms if m.get("kind") == "train"), key=lambda m: m["step"])
    bias = [m["logit_bias"] for m in ms if m.get("kind") == "bias_search"]
    return {"losses": [m["loss"] for m in train], "logit_bias": bias[0] if bias else None}


def golden_losses(names=None) -> dict:
    """{"losses": {variant: [loss per step]}, "searched_logit_bias": {variant: bias}} of a fresh run."""
    out = {"losses": {}, "searched_logit_bias": {}}
    for name in names or VARIANTS:
        with tempfile.TemporaryDirectory(prefix=f"golden_{name}_") as tmp:
            r = run_variant(name, tmp)
        out["losses"][name] = r["losses"]
        if r["logit_bias"] is not None:
            out["searched_logit_bias"][name] = r["logit_bias"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {GOLDEN.relative_to(REPO)}")
    p.add_argument("variants", nargs="*", help="only these variants (not with --write)")
    a = p.parse_args(argv)
    if a.write and a.variants:
        p.error("--write records every variant")
    res = golden_losses(a.variants or None)
    text = json.dumps(res, indent=2) + "\n"
    print(text, end="")
    if a.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
        print(f"wrote {GOLDEN}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
