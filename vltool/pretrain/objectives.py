"""Training objectives as the trainer sees them: each declares what it needs and owns its state.

An `Objective` wraps a loss of vltool.losses (the arithmetic, tested against references) with everything
the trainer must know about it, so that the loop has no per-objective branches. Each objective is declared
once: its spec in vltool.objective_specs (name, help, paper, the options it owns and their checks) and its
class here, attached to the spec with `@objective(NAME)`; docs/objectives.md's table of the objectives is
generated from the specs.

The interface (the trainer calls these, in this order):
- `load_train(data, config, where, split)` (a classmethod: before the objective is built): the training
  rows (unicl: its label and text inputs).
- `build(config, train, total_steps)` (a classmethod): the objective, with its loss (`loss_options`: the
  loss's arguments from config fields).
- `logit_scale_init`, `logit_scale_learnable`: a new model's logit scale.
- `adapt(model, config, resume)`: add what the objective needs to the model before freezing (a logit bias,
  the critic, the SimCLR head); `attach(model, device)` after the model is on its device (the EMA copy).
- `uses_text`, `two_views`: what the data must provide (simclr: no text, two views of each image).
- `init_batches`, `init_bias(...)`: the global batches of epoch 0 the objective reads before training to
  choose its logit bias (0: none; sigmoid with --bias-init search, FFF 4.4).
- `start_record()`, `warning`: its line of metrics.jsonl at the start of a new run (the memory bank's EMA
  momentum) and a warning to print; `stats()`: its entries of the run's statistics.
- A step is split in two, so that gradient caching (`--accum-steps`) works for every objective:
  `local(model, batch, inputs)`: this process's features of one micro-batch that carry the gradient (the
  towers' forward pass); `side(model, batch, inputs)`: the per-row inputs without gradient (rows, labels,
  EMA keys); `loss_input(model, features, side)`: the loss's input from the global batch's gathered
  features and side inputs (the critic, the positive mask, the logit scale and bias).
- `__call__(model, batch, inputs) -> (metrics, n)`: the loss over the global batch of this micro-batch
  (metrics["loss"] carries the gradient), and how many samples it saw; `cached_backward(...)` (below):
  the same over `--accum-steps` micro-batches, with the gradients accumulated.
- `after_backward()`, `after_step(model)`: the memory bank's enqueue and EMA update.
- `loss`: the nn.Module whose state_dict the checkpoints keep; `export(model, config)`: the model to save.

Gradient caching (GradCache, Gao et al. 2021; open_clip's --accum-freq): with A micro-batches per step,
(a) every micro-batch is encoded without gradient (`local` and `side`; the RNG state before each forward
is kept, and BatchNorm running statistics are left as they were), (b) the features of all micro-batches
of all processes are gathered into one global batch (micro-batch-major, then rank: exactly the rows, in
order, that one process with batch A x processes x B takes), made leaf tensors, and the loss of that batch
is back-propagated to them and to the parameters that act on the whole batch (logit scale and bias, the
critic, the loss's own), (c) each micro-batch is encoded again with gradient under its saved RNG state and
its rows of the cached feature gradient are back-propagated through the towers. So A micro-batches of B
give the loss and the gradients of one batch of A x B, for every objective whose loss is over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vltool import objective_specs
from vltool.losses import BiasSearch, LossInput, MemoryBankLoss, SigmoidLoss, build_loss, gather_many, positive_mask, search_logit_bias
from vltool.model.checkpointing import batchnorm_stats_kept
from vltool.objective_specs import ObjectiveSpec
from vltool.pretrain.data.rows import TrainData, load_train_data
from vltool.pretrain.data.unicl import load_unicl_data

OBJECTIVES: dict[str, type[Objective]] = {}  # spec name -> its class


def objective(name: str):
    """Attach the decorated class to the objective `name` declared in vltool.objective_specs."""

    def deco(cls):
        if name not in objective_specs.SPECS:
            raise KeyError(f"objective {name!r} has no spec: declare it in vltool/objective_specs.py")
        cls.spec = objective_specs.SPECS[name]
        OBJECTIVES[name] = cls
        return cls

    return deco


def objective_class(config) -> type[Objective]:
    """The class of the objective `config` trains (validated before)."""
    return OBJECTIVES[objective_specs.chosen(config).name]


def build_objective(config, train: TrainData, total_steps: int) -> Objective:
    """The objective of `--loss` (and `--memory-bank K` with clip) for a run of `total_steps` steps."""
    return objective_class(config).build(config, train, total_steps)


@objective("clip")
class Objective:
    """In-batch contrastive training of image-text pairs (clip, and the base of the others)."""

    spec: ObjectiveSpec  # set by @objective
    uses_text = True  # the batch has texts (simclr: no)
    two_views = False  # the batch has two augmented views of each image (simclr)
    logit_bias_init: float | None = None  # a learnable logit bias on the model, starting here
    loss_options: dict[str, str] = {}  # the loss's keyword arguments -> the config fields they come from
    init_batches = 0  # global batches of epoch 0 init_bias reads before training (0: no search)
    warning: str | None = None  # printed when the run starts

    def __init__(self, loss, train: TrainData):
        self.loss = loss  # nn.Module: its state is in every checkpoint
        self.train = train  # the per-row side information (positives, labels)

    @classmethod
    def load_train(cls, data, config, where, split) -> TrainData:
        """The training rows of the DATA arguments `data` (a dataset on disk; shards are the loop's)."""
        return load_train_data(data, config, where, split)

    @classmethod
    def build(cls, config, train: TrainData, total_steps: int) -> Objective:
        kwargs = {arg: getattr(config, name) for arg, name in cls.loss_options.items()}
        return cls(build_loss(cls.spec.loss, **kwargs), train)

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

    # ---- one micro-batch of this process

    def local(self, model, batch: dict, inputs: dict) -> list[torch.Tensor]:
        """The micro-batch's features that carry the gradient: the projections before the critic and the
        normalisation, [(B, D) images, (B*k, D) texts]."""
        return list(model(**inputs, head=False))

    def side(self, model, batch: dict, inputs: dict) -> dict[str, torch.Tensor]:
        """Per-row inputs of the loss without gradient, gathered like the features (the same keys in every
        process and micro-batch)."""
        return {}

    # ---- the global batch

    def extra(self, side: dict) -> dict:
        """The loss's `extra` from the gathered side inputs."""
        return side

    def loss_input(self, model, feats: list[torch.Tensor], side: dict, local: slice = slice(None)) -> LossInput:
        """The loss's input from the global batch's features (gathered `local` outputs) and side inputs."""
        img_g, txt_g = model.apply_critic(feats[0], feats[1])
        return LossInput(img_g, txt_g, model.logit_scale.exp(), model.logit_bias, extra=self.extra(side), local_slice=local)

    def global_batch(self, model, encoded: list[tuple[list, dict]]) -> tuple[list, dict, list[list[slice]]]:
        """Gather the (features, side inputs) of micro-batches over processes: the global batch's features
        and side inputs (micro-batch-major, then rank), and the rows of each micro-batch of this process
        in each feature tensor. One exchange of sizes for all of them."""
        nf = len(encoded[0][0])
        keys = list(encoded[0][1])
        flat = [t for feats, side in encoded for t in (*feats, *(side[k] for k in keys))]
        got = gather_many(flat)
        per = nf + len(keys)
        feats, sides, rows = [], {}, [[] for _ in encoded]
        for i in range(per):
            parts = [got[a * per + i] for a in range(len(encoded))]
            offset = 0
            for a, (g, sl) in enumerate(parts):
                if i < nf:
                    rows[a].append(slice(offset + sl.start, offset + sl.stop))
                offset += g.shape[0]
            whole = parts[0][0] if len(parts) == 1 else torch.cat([g for g, _ in parts])
            if i < nf:
                feats.append(whole)
            else:
                sides[keys[i - nf]] = whole
        return feats, sides, rows

    def features(self, model, batch: dict, inputs: dict) -> LossInput:
        """The global batch of one micro-batch per process (local rows with gradient), as the loss's input."""
        feats, side, rows = self.global_batch(model, [(self.local(model, batch, inputs), self.side(model, batch, inputs))])
        return self.loss_input(model, feats, side, rows[0][0])

    def __call__(self, model, batch: dict, inputs: dict) -> tuple[dict, int]:
        x = self.features(model, batch, inputs)
        return self.loss(x), x.image_features.shape[0]

    def after_backward(self) -> None:
        pass

    def after_step(self, model) -> None:
        pass

    def start_record(self) -> tuple[str, dict] | None:
        """(kind, fields) of this objective's line in a new run's metrics.jsonl at step 0, or None."""
        return None

    def stats(self) -> dict:
        """Its entries of the run's statistics: every objective gives every objective's keys (None where
        they are not its own), so the statistics have one shape whatever --loss."""
        return dict.fromkeys(objective_specs.stat_keys())

    def export(self, model, config):
        return model


@dataclass
class _Cached:
    batch: dict
    rng: tuple  # (CPU RNG state, CUDA RNG state or None) before the micro-batch's forward pass
    feats: list  # its features, without gradient
    side: dict


def _rng_state(device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple, device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def cached_backward(objective: Objective, model, batches, inputs_of, autocast, backward, before_last=None) -> tuple[dict, int]:
    """Gradient caching over the micro-batches `batches` (module docstring): the loss of their global
    batch, its gradient accumulated into every parameter; returns (metrics, global batch size).

    `inputs_of(batch)`: the model inputs; `autocast()`: the precision context; `backward(loss)`: the
    trainer's backward (Accelerate's, which scales an fp16 loss: the cached feature gradients are then
    scaled too, like every other gradient); `before_last()`: called before the last backward pass (the
    gradient synchronisation over processes overlaps it)."""
    device = model.logit_scale.device
    cached = []
    with torch.no_grad(), batchnorm_stats_kept(model):  # (a): the running statistics move in (c), once per micro-batch
        for batch in batches:
            rng = _rng_state(device)
            inputs = inputs_of(batch)
            with autocast():
                feats = objective.local(model, batch, inputs)
                side = objective.side(model, batch, inputs)
            cached.append(_Cached(batch, rng, [f.detach() for f in feats], side))
    after_a = _rng_state(device)
    # (b) the loss of the global batch, with its features as leaves
    feats, side, rows = objective.global_batch(model, [(c.feats, c.side) for c in cached])
    leaves = [f.detach().requires_grad_(True) for f in feats]
    with autocast():
        x = objective.loss_input(model, leaves, side)
        out = objective.loss(x)
    backward(out["loss"])
    grads = [leaf.grad for leaf in leaves]
    # (c) each micro-batch again, with gradient, under the RNG state of its first pass
    for a, c in enumerate(cached):
        _set_rng_state(c.rng, device)
        with autocast():
            local = objective.local(model, c.batch, inputs_of(c.batch))
        pairs = [(f, g[rows[a][i]]) for i, (f, g) in enumerate(zip(local, grads)) if f.requires_grad and g is not None]
        if a == len(cached) - 1 and before_last is not None:
            before_last()
        if pairs:
            torch.autograd.backward([f for f, _ in pairs], [g.to(f.dtype) for f, g in pairs])
    _set_rng_state(after_a, device)
    return out, x.image_features.shape[0]


@objective("sigmoid")
class SigmoidObjective(Objective):
    """Sigmoid loss with many positives: a learnable logit bias, and a positive mask over the global batch
    when an image has several positive texts (k captions per image, mined positives)."""

    logit_bias_init = SigmoidLoss.logit_bias_init
    several_texts = False  # --captions-per-image > 1

    def adapt(self, model, config, resume: bool) -> None:
        self.several_texts = config.captions_per_image > 1
        self.init_batches = config.bias_search_batches if config.bias_init == "search" else 0
        given = config.bias_init not in (None, "search")
        if model.logit_bias is None:  # a learnable bias on the model, saved in the model format
            b0 = float(config.bias_init) if given else self.logit_bias_init
            model.logit_bias = torch.nn.Parameter(torch.tensor(b0))
            model.config["logit_bias_init"] = b0
        elif given and not resume:
            with torch.no_grad():
                model.logit_bias.fill_(float(config.bias_init))

    def side(self, model, batch: dict, inputs: dict) -> dict:
        device = model.logit_scale.device
        return {"rows": batch["rows"].to(device, non_blocking=True),  # (B,)
                "text_rows": batch.get("text_rows", batch["rows"]).to(device, non_blocking=True)}  # (B*k,)

    def extra(self, side: dict) -> dict:
        if self.train.positives or self.several_texts:
            return {"positive_mask": positive_mask(side["rows"], side["text_rows"], self.train.positives)}  # (N, N*k)
        return {}

    @torch.no_grad()
    def init_bias(self, model, batches, inputs_of, autocast) -> BiasSearch:
        """FFF 4.4: the logit bias minimising the summed initial loss of `batches` (each a list of the
        micro-batches of one global batch, encoded once by the fresh model in eval mode, under
        `autocast()`), over a bracket widened until the minimum is inside it; written to the model."""
        was_training = model.training
        model.eval()
        with autocast():
            encoded = []
            for group in batches:
                parts = []
                for b in group:
                    inputs = inputs_of(b)
                    parts.append((self.local(model, b, inputs), self.side(model, b, inputs)))
                feats, side, _ = self.global_batch(model, parts)
                encoded.append(self.loss_input(model, feats, side))
        model.train(was_training)
        scale = model.logit_scale.detach().exp().float()

        def loss_at(b: float) -> float:
            bias = torch.tensor(b, device=scale.device)
            return sum(float(self.loss(LossInput(x.image_features.float(), x.text_features.float(), scale, bias, extra=x.extra))["loss"])
                       for x in encoded)

        found = search_logit_bias(loss_at)
        model.logit_bias.fill_(found.bias)
        model.config["logit_bias_init"] = found.bias
        return found


@objective("unicl")
class UniCLObjective(Objective):
    """UniCL: each row's label goes with the batch (image-label rows share their class's label)."""

    @classmethod
    def load_train(cls, data, config, where, split) -> TrainData:
        """--label-data and --text-data (DATA arguments count as --text-data)."""
        if data:
            config.text_data = list(config.text_data) + [d for d in data if d not in config.text_data]
        return load_unicl_data(config, where, split)

    def side(self, model, batch: dict, inputs: dict) -> dict:
        if self.train.labels is None:
            return {}
        return {"label": torch.as_tensor(self.train.labels)[batch["rows"]].to(model.logit_scale.device, non_blocking=True)}  # (B,)


@objective("jsd")
class JSDObjective(Objective):
    """CLIP-Lite: the critic projections are added to a new model (and saved with it)."""

    loss_options = {"negatives": "jsd_negatives"}

    def adapt(self, model, config, resume: bool) -> None:
        if model.image_critic is None:
            model.add_critic({"dim": config.critic_dim or int(model.config["embed_dim"])})


MOCO_MOMENTUM = 0.999  # MoCo's EMA momentum, for runs of ~10^5 steps (A Fistful of Words gives none)
EMA_HALF_LIFE = 0.1  # at most this fraction of the run: the initial weights keep <= 2^-10 of the EMA at the end
EMA_WARN_SHARE = 0.5  # warn when more than this share of the EMA is still its initial weights at the end


def ema_momentum_for(total_steps: int) -> float:
    """The EMA momentum of a run of `total_steps` optimizer steps when --ema-momentum is not given.

    With a constant momentum m, the EMA after T updates is m^T x (its initial weights) + (1 - m) x sum_k
    m^(T-k) x (the online weights after step k): MoCo's 0.999 over a 460-step recipe leaves 0.999^460 = 63%
    of the key towers at their random initial projections. So m = min(0.999, 0.5^(1 / h)) with the
    half-life h = EMA_HALF_LIFE x T steps: MoCo's value where the run is long enough for it (T >= 6,929),
    else the momentum whose half-life is a tenth of the run, so that at the end the initial weights weigh
    0.5^10 < 0.1% and the EMA averages over about the last 14% of the run (its time constant 1/(1 - m))."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    return min(MOCO_MOMENTUM, 0.5 ** (1 / (EMA_HALF_LIFE * total_steps)))


def ema_initial_share(momentum: float, total_steps: int) -> float:
    """The weight of the EMA's initial values in the EMA after `total_steps` updates: m^T."""
    return momentum ** total_steps


@objective("memory-bank")
class MemoryBankObjective(Objective):
    """InfoNCE against a queue of keys from EMA towers (A Fistful of Words, 2.1). Owns the EMA copy of the
    model and the queue (both in the loss's state dict); the logit scale is 1/temperature, fixed. The EMA
    momentum is --ema-momentum, or `ema_momentum_for(total_steps)` when not given.

    With --accum-steps A the EMA keys of all A micro-batches are computed in the first pass, the loss is
    over the whole accumulated batch against the queue as it was at the start of the step, and the
    accumulated batch's keys join the queue once, after the step's backward (as one batch of A x B would)."""

    def __init__(self, config, train: TrainData, total_steps: int):
        super().__init__(None, train)
        self.config = config
        self.momentum = config.ema_momentum if config.ema_momentum is not None else ema_momentum_for(total_steps)
        self.initial_share = ema_initial_share(self.momentum, total_steps)  # of the EMA at the end of the run
        self.warning = None
        if config.ema_momentum is not None and self.initial_share > EMA_WARN_SHARE:
            self.warning = (f"--ema-momentum {config.ema_momentum:g} over {total_steps} steps leaves the EMA key towers "
                            f"{self.initial_share:.0%} at their initial weights by the end of the run (m^T); leave "
                            f"--ema-momentum out for the run-length rule (here m = {ema_momentum_for(total_steps):.5f})")

    @classmethod
    def build(cls, config, train: TrainData, total_steps: int) -> Objective:
        return cls(config, train, total_steps)  # (its loss is made by attach, once the model is known)

    logit_scale_learnable = False

    @property
    def logit_scale_init(self) -> float:
        return 1 / self.config.temperature

    def start_record(self) -> tuple[str, dict]:
        """The EMA momentum used: given, or from the run's length."""
        return "ema", {"ema_momentum": self.momentum, "given": self.config.ema_momentum is not None,
                       "initial_share_at_end": self.initial_share}

    def stats(self) -> dict:
        return {**super().stats(), "ema_momentum": self.momentum}  # given or from the run's length

    def attach(self, model, device) -> None:
        c = self.config
        dim = model.config["critic"]["dim"] if model.config.get("critic") else int(model.config["embed_dim"])
        self.loss = MemoryBankLoss(c.memory_bank, dim, c.temperature, self.momentum)
        self.loss.init_ema(model)
        self.loss.to(device)

    def side(self, model, batch: dict, inputs: dict) -> dict:
        ik, tk = self.loss.encode_keys(**inputs)  # (B, D) each, no gradient
        return {"image_keys": ik, "text_keys": tk, "ids": batch["rows"].to(ik.device, non_blocking=True)}

    def loss_input(self, model, feats, side, local=slice(None)) -> LossInput:
        self._keys = side
        return super().loss_input(model, feats, side, local)

    def after_backward(self) -> None:  # the global batch's keys join the queue after its loss
        self.loss.enqueue(self._keys["image_keys"], self._keys["text_keys"], self._keys["ids"])

    def after_step(self, model) -> None:
        self.loss.update_ema(model)

    def export(self, model, config):
        return self.loss.ema if config.export_ema else model


@objective("simclr")
class SimCLRObjective(Objective):
    """SimCLR: two augmented views of each image through the image tower; the text tower is frozen and
    unused, and the loss owns the projection head."""

    uses_text = False
    two_views = True

    def adapt(self, model, config, resume: bool) -> None:
        for p in model.text.parameters():
            p.requires_grad_(False)
        self.loss.build_head(int(model.config["embed_dim"]))

    def local(self, model, batch: dict, inputs: dict) -> list[torch.Tensor]:
        size = int(model.config["preprocess"]["size"])
        device = model.logit_scale.device
        x = torch.cat([batch["images"], batch["images2"]]).to(device, non_blocking=True) if "images" in batch else torch.zeros(0, 3, size, size, device=device)
        f = model.project_image(model.image_trunk(x))  # (2B, D): both views
        nb = f.shape[0] // 2
        return [f[:nb], f[nb:]]  # (B, D) each

    def loss_input(self, model, feats, side, local=slice(None)) -> LossInput:
        return LossInput(feats[0], feats[1], model.logit_scale.exp(), None, local_slice=local)
