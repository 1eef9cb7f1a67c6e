"""Evaluation on held-out rows during training (--eval-data): validation loss and R@1 both ways."""

from __future__ import annotations

import torch

from vltool import columns as C
from vltool.checks import require_decoded
from vltool.io.images import decode_image
from vltool.losses import LossInput
from vltool.model.load import to_device
from vltool.pretrain.data.rows import TrainData, texts_of


def evaluate(model, tokenizer, eval_data: TrainData, transform, loss_fn, batch: int, accelerator, seed: int) -> dict:
    """Validation loss (in chunks of the global batch) and image<->text R@1 over the whole set (first
    caption, eval transform). Every process computes the same."""
    ds = eval_data.dataset
    model.eval()
    imgs, txts = [], []
    sampling = "first" if eval_data.text_column == C.CAPTIONS else None
    with torch.no_grad(), accelerator.autocast():
        for lo in range(0, len(ds), batch):
            rows = ds[lo : lo + batch]
            good = [(decode_image(im, rgb=False), texts_of(t, sampling)[0]) for im, t in zip(rows[C.IMAGE], rows[eval_data.text_column])]
            good = [(im, t) for im, t in good if im is not None]
            if not good:
                continue
            x = torch.stack([transform(im) for im, _ in good]).to(accelerator.device)
            i, t = model(x, to_device(tokenizer([t for _, t in good]), accelerator.device))
            imgs.append(i.float())
            txts.append(t.float())
    if not imgs:
        require_decoded([True] * len(ds), "--eval-data")
    img, txt = torch.cat(imgs), torch.cat(txts)  # (N, D)
    scale = model.logit_scale.exp().detach().float()
    bias = model.logit_bias.detach().float() if model.logit_bias is not None else None
    losses = []
    with torch.no_grad():
        for lo in range(0, img.shape[0], batch):
            out = loss_fn(LossInput(img[lo : lo + batch], txt[lo : lo + batch], scale, bias))
            losses.append((float(out["loss"]), min(batch, img.shape[0] - lo)))
        sims = img @ txt.T  # (N, N)
        target = torch.arange(img.shape[0])
        res = {
            "val_loss": sum(v * n for v, n in losses) / sum(n for _, n in losses),
            "val_i2t_r1": float((sims.argmax(1).cpu() == target).float().mean()),
            "val_t2i_r1": float((sims.argmax(0).cpu() == target).float().mean()),
            "val_rows": int(img.shape[0]),
        }
    return res
