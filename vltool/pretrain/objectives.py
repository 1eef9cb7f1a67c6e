"""Training objectives as the trainer sees them: each declares what it needs and owns its state.

An `Objective` wraps a loss of vltool.losses (the arithmetic, tested against references) with everything
the trainer must know about it, so that the loop has no per-objective branches:

| objective | needs from the model | needs per batch | owns |
|---|---|---|---|
| clip | | | |
| sigmoid | a learnable logit bias (init -10, or searched) | a positive mask: k captions per image, mined positives | |
| unicl | | each row's label | |
| jsd | CLIP-Lite's critic projections | | |
| clip --memory-bank K | a fixed logit scale 1/temperature | EMA keys of the batch | the EMA towers and the key queue |
| simclr | the image tower only (text frozen) | two augmented views per image | the projection head |

The papers: sigmoid with many positives is from "FFF: Fixing Flawed Foundations in contrastive
pre-training" (sections 4.1-4.4); unicl from "Unified Contrastive Learning in Image-Text-Label Space";
jsd from "CLIP-Lite: Information Efficient Visual Representation Learning with Language Supervision";
the memory bank from "A Fistful of Words" (section 2.1); simclr is the image-only baseline of "Is a
Caption Worth a Thousand Images?".

The interface (the trainer calls these, in this order):
- `logit_scale_init`, `logit_scale_learnable`: a new model's logit scale.
- `adapt(model, config, resume)`: add what the objective needs to the model before freezing (a logit bias,
  the critic, the SimCLR head); `attach(model, device)` after the model is on its device (the EMA copy).
- `uses_text`, `two_views`: what the data must provide (simclr: no text, two views of each image).
- `init_bias(...)`: sigmoid with --bias-init search only (FFF 4.4).
- `__call__(model, batch, inputs) -> (metrics, n)`: the loss over the global batch of this micro-batch
  (metrics["loss"] carries the gradient), and how many samples it saw.
- `after_backward()`, `after_step(model)`: the memory bank's enqueue and EMA update.
- `loss`: the nn.Module whose state_dict the checkpoints keep; `export(model, config)`: the model to save.
"""

from __future__ import annotations

import torch

from vltool.losses import LOSSES, LossInput, MemoryBankLoss, SigmoidLoss, build_loss, gather_keep_grad, positive_mask, search_logit_bias
from vltool.pretrain.data import TrainData


class Objective:
    """In-batch contrastive training of image-text pairs (clip, and the base of the others)."""

    uses_text = True  # the batch has texts (simclr: no)
    two_views = False  # the batch has two augmented views of each image (simclr)
    logit_bias_init: float | None = None  # a learnable logit bias on the model, starting here

    def __init__(self, loss, train: TrainData):
        self.loss = loss  # nn.Module: its state is in every checkpoint
        self.train = train  # the per-row side information (positives, labels)

    @property
    def logit_scale_init(self) -> float:
        return self.loss.logit_scale_init

    @property
    def logit_scale_learnable(self) -> bool:
        return self.loss.logit_scale_learnable

    def adapt(self, model, config, resume: bool) -> None:
        """Add what this objective needs to a model (before freezing)."""

    def attach(self, model, device) -> None:
        self.loss.to(device)

    def extra(self, batch: dict, device) -> dict:
        """Per-row inputs of the loss over the global batch (gathered like the features)."""
        return {}

    def features(self, model, batch: dict, inputs: dict) -> LossInput:
        """The global batch's normalised features (local rows with gradient), and the loss's other inputs."""
        img, txt = model(**inputs, head=False)  # (B, D), (B*k, D)
        img_g, local = gather_keep_grad(img)  # (N, D)
        txt_g, _ = gather_keep_grad(txt)  # (N*k, D)
        img_g, txt_g = model.apply_critic(img_g, txt_g)
        return LossInput(img_g, txt_g, model.logit_scale.exp(), model.logit_bias, extra=self.extra(batch, img.device), local_slice=local)

    def __call__(self, model, batch: dict, inputs: dict) -> tuple[dict, int]:
        x = self.features(model, batch, inputs)
        return self.loss(x), x.image_features.shape[0]

    def after_backward(self) -> None:
        pass

    def after_step(self, model) -> None:
        pass

    def export(self, model, config):
        return model


class SigmoidObjective(Objective):
    """Sigmoid loss with many positives: a learnable logit bias, and a positive mask over the global batch
    when an image has several positive texts (k captions per image, mined positives)."""

    logit_bias_init = SigmoidLoss.logit_bias_init

    def adapt(self, model, config, resume: bool) -> None:
        given = config.bias_init not in (None, "search")
        if model.logit_bias is None:  # a learnable bias on the model, saved in the model format
            b0 = float(config.bias_init) if given else self.logit_bias_init
            model.logit_bias = torch.nn.Parameter(torch.tensor(b0))
            model.config["logit_bias_init"] = b0
        elif given and not resume:
            with torch.no_grad():
                model.logit_bias.fill_(float(config.bias_init))

    def extra(self, batch: dict, device) -> dict:
        rows_g, _ = gather_keep_grad(batch["rows"].to(device))  # (N,)
        text_rows_g, _ = gather_keep_grad(batch.get("text_rows", batch["rows"]).to(device))  # (N*k,)
        if self.train.positives or not torch.equal(rows_g, text_rows_g):
            return {"positive_mask": positive_mask(rows_g, text_rows_g, self.train.positives)}  # (N, N*k)
        return {}

    @torch.no_grad()
    def init_bias(self, model, batches, inputs_of, autocast) -> float:
        """FFF 4.4: the logit bias minimising the summed initial loss of `batches` (encoded once by the
        fresh model in eval mode, under `autocast()`); written to the model."""
        was_training = model.training
        model.eval()
        with autocast():
            encoded = [self.features(model, b, inputs_of(b)) for b in batches]
        model.train(was_training)
        scale = model.logit_scale.detach().exp().float()

        def loss_at(b: float) -> float:
            bias = torch.tensor(b, device=scale.device)
            return sum(float(self.loss(LossInput(x.image_features.float(), x.text_features.float(), scale, bias, extra=x.extra))["loss"])
                       for x in encoded)

        best = search_logit_bias(loss_at)
        model.logit_bias.fill_(best)
        model.config["logit_bias_init"] = best
        return best


class UniCLObjective(Objective):
    """UniCL: each row's label goes with the batch (image-label rows share their class's label)."""

    def extra(self, batch: dict, device) -> dict:
        if self.train.labels is None:
            return {}
        return {"label": gather_keep_grad(torch.as_tensor(self.train.labels)[batch["rows"]].to(device))[0]}  # (N,)


class JSDObjective(Objective):
    """CLIP-Lite: the critic projections are added to a new model (and saved with it)."""

    def adapt(self, model, config, resume: bool) -> None:
        if model.image_critic is None:
            model.add_critic({"dim": config.critic_dim or int(model.config["embed_dim"])})


class MemoryBankObjective(Objective):
    """InfoNCE against a queue of keys from EMA towers (A Fistful of Words, 2.1). Owns the EMA copy of the
    model and the queue (both in the loss's state dict); the logit scale is 1/temperature, fixed."""

    def __init__(self, config, train: TrainData):
        super().__init__(None, train)
        self.config = config

    logit_scale_learnable = False

    @property
    def logit_scale_init(self) -> float:
        return 1 / self.config.temperature

    def attach(self, model, device) -> None:
        c = self.config
        dim = model.config["critic"]["dim"] if model.config.get("critic") else int(model.config["embed_dim"])
        self.loss = MemoryBankLoss(c.memory_bank, dim, c.temperature, c.ema_momentum)
        self.loss.init_ema(model)
        self.loss.to(device)

    def features(self, model, batch: dict, inputs: dict) -> LossInput:
        x = super().features(model, batch, inputs)
        ik, tk = self.loss.encode_keys(**inputs)  # (B, D) each, no gradient
        x.extra.update(image_keys=gather_keep_grad(ik)[0], text_keys=gather_keep_grad(tk)[0],
                       ids=gather_keep_grad(batch["rows"].to(ik.device))[0])
        self._keys = x.extra
        return x

    def after_backward(self) -> None:  # the global batch's keys join the queue after its loss
        self.loss.enqueue(self._keys["image_keys"], self._keys["text_keys"], self._keys["ids"])

    def after_step(self, model) -> None:
        self.loss.update_ema(model)

    def export(self, model, config):
        return self.loss.ema if config.export_ema else model


class SimCLRObjective(Objective):
    """SimCLR: two augmented views of each image through the image tower; the text tower is frozen and
    unused, and the loss owns the projection head."""

    uses_text = False
    two_views = True

    def adapt(self, model, config, resume: bool) -> None:
        for p in model.text.parameters():
            p.requires_grad_(False)
        self.loss.build_head(int(model.config["embed_dim"]))

    def __call__(self, model, batch: dict, inputs: dict) -> tuple[dict, int]:
        size = int(model.config["preprocess"]["size"])
        device = model.logit_scale.device
        x = torch.cat([batch["images"], batch["images2"]]).to(device) if "images" in batch else torch.zeros(0, 3, size, size, device=device)
        f = model.image_proj(model.visual(x))  # (2B, D): both views
        nb = f.shape[0] // 2
        v1, local = gather_keep_grad(f[:nb])  # (N, D)
        v2, _ = gather_keep_grad(f[nb:])  # (N, D)
        return self.loss(LossInput(v1, v2, model.logit_scale.exp(), None, local_slice=local)), v1.shape[0]


OBJECTIVES = {"clip": Objective, "sigmoid": SigmoidObjective, "unicl": UniCLObjective, "jsd": JSDObjective, "simclr": SimCLRObjective}


def build_objective(config, train: TrainData) -> Objective:
    """The objective of `--loss` (and `--memory-bank K` with clip)."""
    if config.memory_bank:
        return MemoryBankObjective(config, train)
    cls = OBJECTIVES.get(config.loss, Objective)
    assert config.loss in LOSSES, config.loss  # validated before
    return cls(build_loss(config.loss), train)

