"""Training objectives. A loss is an `nn.Module` with its own parameters and state (memory banks, EMA
encoders, learned biases), saved in checkpoints with its `state_dict`.

The contract, so that N processes train as one:
- The trainer gathers the features of every process (`gather_keep_grad`: the local rows keep their
  gradient, the others are constants) and hands the loss the whole global batch in `LossInput`, in the
  order a single process with batch N*B would see it. A loss is written as if it ran in one process.
  With `--accum-steps A` (gradient caching) the global batch is the A micro-batches of every process
  (A*N*B rows, micro-batch-major, then rank), the features are leaf tensors, and the loss's gradient
  with respect to them is sent back through each micro-batch's towers (vltool.pretrain.objectives).
- Every process computes the same global loss. The trainer sums the tower gradients over processes
  (each process holds the gradient through its own rows) and keeps the gradient of parameters that see
  the whole batch (the logit scale, the loss's own parameters) as it is, since each process already
  has all of it. A loss whose parameters act on local features before the gather would break this rule.
- A loss declares its logit-scale default (init multiplier, learnable or fixed). What else it needs from
  the trainer (a logit bias, a critic, per-row labels or a positive mask, EMA keys, two image views) is
  declared by its objective in vltool.pretrain.objectives, which gathers those inputs like the features.

Register a loss with `@register_loss("name")`; the objective that trains it is declared in
vltool.objective_specs (its name, help and options) and vltool.pretrain.objectives (its hooks).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from vltool.errors import UsageError, VltoolError


@dataclass
class LossInput:
    """The global batch a loss sees (every process sees the same)."""

    image_features: torch.Tensor  # (N, D) L2-normalised, global batch; only local rows carry gradient
    text_features: torch.Tensor  # (N, D)
    logit_scale: torch.Tensor  # () the multiplier exp(log scale), with gradient when learnable
    logit_bias: torch.Tensor | None = None  # () when the model has one
    extra: dict = field(default_factory=dict)  # gathered columns the loss asked for, e.g. "label": (N,)
    local_slice: slice = field(default_factory=lambda: slice(None))  # rows of this process (slice(None): every row is a leaf, --accum-steps > 1)


class Loss(nn.Module):
    """Base class of vltool's training objectives."""

    name: ClassVar[str] = ""
    logit_scale_init: ClassVar[float] = 1 / 0.07  # default initial multiplier of a new model
    logit_scale_learnable: ClassVar[bool] = True

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        """Returns {"loss": scalar, ...other scalar metrics to log}; every registered loss defines it."""
        raise TypeError(f"{type(self).__name__} does not define forward()")


LOSSES: dict[str, type[Loss]] = {}


def register_loss(name: str):
    def deco(cls: type[Loss]) -> type[Loss]:
        cls.name = name
        LOSSES[name] = cls
        return cls

    return deco


def build_loss(name: str, **kwargs) -> Loss:
    if name not in LOSSES:
        raise UsageError(f"--loss {name!r}: unknown loss; available: {', '.join(sorted(LOSSES))}")
    return LOSSES[name](**kwargs)


@register_loss("clip")
class ClipLoss(Loss):
    """CLIP's symmetric InfoNCE over the global batch (Radford et al. 2021, Figure 3).

    logits = s * img @ txt.T; the i-th image and i-th text are the positive pair; the loss is the mean
    of the image->text and text->image cross-entropies.
    """

    logit_scale_init = 1 / 0.07
    logit_scale_learnable = True

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        img, txt = batch.image_features, batch.text_features
        logits = batch.logit_scale * img @ txt.T  # (N_img, N_txt)
        if batch.logit_bias is not None:
            logits = logits + batch.logit_bias
        labels = torch.arange(logits.shape[0], device=logits.device)
        loss_i2t = F.cross_entropy(logits.float(), labels)
        loss_t2i = F.cross_entropy(logits.float().T, labels)
        with torch.no_grad():
            acc = (logits.argmax(1) == labels).float().mean()
        return {"loss": (loss_i2t + loss_t2i) / 2, "acc_i2t": acc}


def clip_loss_reference(img: torch.Tensor, txt: torch.Tensor, scale: float) -> float:
    """The same loss by explicit sums over pairs (for tests)."""
    n = img.shape[0]
    sims = [[scale * float(img[i] @ txt[j]) for j in range(n)] for i in range(n)]
    i2t = sum(-sims[i][i] + math.log(sum(math.exp(s) for s in sims[i])) for i in range(n)) / n
    t2i = sum(-sims[j][j] + math.log(sum(math.exp(sims[i][j]) for i in range(n))) for j in range(n)) / n
    return (i2t + t2i) / 2


def _dist_world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


_SIZE_GROUPS: dict = {}


def exchange_sizes(local: list[int]) -> list[list[int]]:
    """Every process's list of host-side sizes `local` (the same length everywhere), in rank order.

    A CPU collective: through the default group when it is gloo, else through a gloo group made once for
    the default group (NCCL), so exchanging sizes never waits on the GPU (no host-device sync)."""
    world = _dist_world()
    if world == 1:
        return [list(local)]
    default = dist.distributed_c10d._get_default_group()
    group = None
    if "gloo" not in str(dist.get_backend()):
        group = _SIZE_GROUPS.get(id(default))
        if group is None:
            group = _SIZE_GROUPS[id(default)] = dist.new_group(backend="gloo")
    t = torch.tensor(list(local), dtype=torch.long)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t, group=group)
    return [p.tolist() for p in parts]


def gather_keep_grad(x: torch.Tensor, sizes: list[int] | None = None) -> tuple[torch.Tensor, slice]:
    """All processes' `x` concatenated in rank order, and the rows of this process.

    The local rows keep their gradient; the others are constants. Local batch sizes may differ (rows
    skipped for bad images): sizes are exchanged first (or given: `sizes[r]` rows of process r, as
    `exchange_sizes` returns them) and the tensors padded to the largest. With one process `x` is
    returned unchanged.
    """
    if _dist_world() == 1:
        return x, slice(0, x.shape[0])
    world, rank = dist.get_world_size(), dist.get_rank()
    if sizes is None:
        sizes = [s[0] for s in exchange_sizes([x.shape[0]])]
    pad = max(sizes)
    xp = x.detach()
    if x.shape[0] < pad:
        xp = torch.cat([xp, xp.new_zeros((pad - x.shape[0], *x.shape[1:]))])
    parts = [torch.empty_like(xp) for _ in range(world)]
    dist.all_gather(parts, xp.contiguous())
    parts = [p[:s] for p, s in zip(parts, sizes)]
    parts[rank] = x  # the local part, with its gradient
    start = sum(sizes[:rank])
    return torch.cat(parts), slice(start, start + sizes[rank])


def gather_many(xs: list[torch.Tensor]) -> list[tuple[torch.Tensor, slice]]:
    """`gather_keep_grad` of each tensor of `xs`, with one exchange of sizes for all of them."""
    if _dist_world() == 1:
        return [(x, slice(0, x.shape[0])) for x in xs]
    sizes = exchange_sizes([x.shape[0] for x in xs])  # [rank][i]
    return [gather_keep_grad(x, [s[i] for s in sizes]) for i, x in enumerate(xs)]


def positive_mask(
    image_rows: torch.Tensor, text_rows: torch.Tensor, positives: "dict[int, list[int]] | None" = None
) -> torch.Tensor:
    """(N, M) bool: image i and text j are positives.

    `image_rows[i]` is the dataset row of image i, `text_rows[j]` the row whose caption text j is (with
    `--captions-per-image k` a row contributes k texts). Image i and text j are positive when they come
    from the same row, or (mined positives, directional) when `text_rows[j]` is in `positives[image_rows[i]]`.
    """
    mask = image_rows[:, None] == text_rows[None, :]
    if positives:
        where: dict[int, list[int]] = {}
        for j, r in enumerate(text_rows.tolist()):
            where.setdefault(r, []).append(j)
        ii, jj = [], []
        for i, r in enumerate(image_rows.tolist()):
            for p in positives.get(r, ()):
                for j in where.get(p, ()):
                    ii.append(i)
                    jj.append(j)
        if ii:
            mask[torch.tensor(ii, device=mask.device), torch.tensor(jj, device=mask.device)] = True
    return mask


@register_loss("sigmoid")
class SigmoidLoss(Loss):
    """Sigmoid loss with many positives (FFF: Fixing Flawed Foundations in contrastive pre-training, sections 4.1-4.4; SigLIP).

    logits_ij = exp(t') * <img_i, txt_j> + b over every image-text pair of the global batch (N images,
    M texts); loss = -(1/N) sum_i sum_j log sigmoid(m_ij * logits_ij), m_ij = +1 for a positive pair and
    -1 otherwise. Positives come from `extra["positive_mask"]` (N, M) bool when given, else the diagonal
    (M == N, one text per image). t' (the model's logit scale) starts at log 10, b (the model's logit
    bias) at -10 unless `--bias-init` says otherwise. With the diagonal it is open_clip's `SigLipLoss`.
    """

    logit_scale_init = 10.0
    logit_scale_learnable = True
    logit_bias_init = -10.0  # a new model gets a learnable logit bias starting here (SigLIP's)

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        img, txt = batch.image_features.float(), batch.text_features.float()
        logits = batch.logit_scale.float() * img @ txt.T  # (N, M)
        if batch.logit_bias is not None:
            logits = logits + batch.logit_bias.float()
        mask = batch.extra.get("positive_mask")
        if mask is None:
            mask = torch.eye(img.shape[0], txt.shape[0], dtype=torch.bool, device=logits.device)
        signs = mask.to(logits.dtype) * 2 - 1
        loss = -F.logsigmoid(signs * logits).sum() / img.shape[0]
        with torch.no_grad():
            best = logits.argmax(1)
            acc = mask[torch.arange(img.shape[0], device=mask.device), best].float().mean()
        return {"loss": loss, "acc_i2t": acc}


@dataclass
class BiasSearch:
    """The result of `search_logit_bias`: the bias, the integer bracket the grid finally covered (the
    bias's grid minimum is inside it, not on its edge), and how many losses were computed."""

    bias: float
    lo: float
    hi: float
    evaluations: int


def search_logit_bias(losses_at, lo: float = -20.0, hi: float = 0.0, step: float = 0.1, limit: float = 1e4) -> BiasSearch:
    """FFF 4.4: the bias minimising the initial loss, by a grid of step 1 refined to `step`.

    `losses_at(b)` returns the loss (summed over the search batches) with bias b. The grid starts on the
    integers of [lo, hi] and widens adaptively: while its minimum is on an edge, the bracket grows past that
    edge by its own width (so a logit scale of 100, whose optimum can lie well below -20, is not cut off
    at -20). The sigmoid loss is convex in b (a sum of softplus of affine functions of b), so once
    the integer minimum g is interior the true minimum lies in [g - 1, g + 1], which the `step` grid then
    searches. A bracket that outgrows +-`limit` means the loss has no finite minimum (the batches hold only
    positives or only negatives): VltoolError.
    """
    vals: dict[float, float] = {}

    def at(b: float) -> float:
        if b not in vals:
            vals[b] = losses_at(b)
        return vals[b]

    lo, hi = float(math.floor(lo)), float(math.ceil(hi))
    while True:
        grid = [lo + i for i in range(int(hi - lo) + 1)]
        best = min(grid, key=at)
        width = max(hi - lo, 1.0)
        if best == lo and best > -limit:
            lo -= width
        elif best == hi and best < limit:
            hi += width
        elif best in (lo, hi):
            raise VltoolError(f"the logit bias search found no minimum within +-{limit:g} (best {best:g}): do the "
                             "search batches hold both positive and negative pairs?")
        else:
            break
    n = int(round(1 / step))
    fine = [round(best + k * step, 6) for k in range(-n, n + 1)]
    return BiasSearch(min(fine, key=at), lo, hi, len(vals))


@register_loss("unicl")
class UniCLLoss(Loss):
    """UniCL's bidirectional soft-target contrastive loss (Unified Contrastive Learning in Image-Text-Label Space, section 3.2, Algorithm 1).

    `extra["label"]` (N,) long: the label of each row of the global batch (image-label rows their class,
    image-text rows a label of their own). Targets t_ij = [y_i == y_j]; logits = s * img @ txt.T;
    i2t = mean_i -(sum_j t_ij log softmax_j(logits_i.)) / sum_j t_ij, t2i the same over columns; the loss
    is (i2t + t2i) / 2. The multiplier s is exp(tau), tau learnable and initialised at 1 (Algorithm 1;
    equation 2 writes tau itself as the multiplier): a new model's logit scale starts at e. Without
    labels (every label unique) it is exactly CLIP's loss.
    """

    logit_scale_init = math.e  # exp(tau), tau = 1 (Algorithm 1)
    logit_scale_learnable = True

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        img, txt = batch.image_features.float(), batch.text_features.float()
        logits = batch.logit_scale.float() * img @ txt.T  # (N, N)
        if batch.logit_bias is not None:
            logits = logits + batch.logit_bias.float()
        y = batch.extra.get("label")
        if y is None:
            y = torch.arange(img.shape[0], device=logits.device)
        target = (y[:, None] == y[None, :]).to(logits.dtype)  # (N, N), symmetric
        i2t = (-(target * F.log_softmax(logits, dim=1)).sum(1) / target.sum(1)).mean()
        t2i = (-(target * F.log_softmax(logits, dim=0)).sum(0) / target.sum(0)).mean()
        with torch.no_grad():
            best = logits.argmax(1)
            acc = target[torch.arange(img.shape[0], device=logits.device), best].mean()
        return {"loss": (i2t + t2i) / 2, "acc_i2t": acc}


@register_loss("jsd")
class JSDLoss(Loss):
    """CLIP-Lite's Jensen-Shannon lower bound of the mutual information (CLIP-Lite, section 3.1, Figure 3).

    negatives="one" (the paper's): one negative per positive, image i paired with the text of row
    (i + 1) mod N of the global batch. The critic T(img, txt) = exp(t) * <c_I(img), c_T(txt)> (c_I, c_T:
    the model's critic projections, L2-normalised; exp(t) the model's logit scale, t learnable,
    initialised at log(1/0.07)); loss = mean_i softplus(-T(img_i, txt_i)) + mean_i softplus(T(img_i,
    txt_{i+1})). Cost linear in N.
    negatives="all" (an ablation, not CLIP-Lite's): the negative term is the mean over all N(N-1) pairs
    i != j of the batch (Deep InfoMax's estimate of the same expectation over the product of marginals):
    the same objective in expectation, with as many negatives per step as InfoNCE. Cost quadratic in N.
    """

    logit_scale_init = 1 / 0.07
    logit_scale_learnable = True
    NEGATIVES = ("one", "all")  # --jsd-negatives (vltool.objective_specs.JSD_NEGATIVES: tests/test_objectives.py)

    def __init__(self, negatives: str = "one"):
        super().__init__()
        if negatives not in self.NEGATIVES:
            raise ValueError(f"negatives must be one of {self.NEGATIVES}, got {negatives!r}")
        self.negatives = negatives

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        img, txt = batch.image_features.float(), batch.text_features.float()
        s = batch.logit_scale.float()
        pos = s * (img * txt).sum(-1)  # (N,)
        if self.negatives == "one":
            neg = s * (img * txt.roll(-1, dims=0)).sum(-1)  # (N,): text of the next row
            neg_term = F.softplus(neg).mean()
            with torch.no_grad():
                acc = (pos > neg).float().mean()
        else:
            n = img.shape[0]
            logits = s * img @ txt.T  # (N, N)
            off = ~torch.eye(n, dtype=torch.bool, device=logits.device)
            neg_term = F.softplus(logits[off]).mean()  # the N(N-1) pairs i != j
            with torch.no_grad():
                acc = (logits.argmax(1) == torch.arange(n, device=logits.device)).float().mean()
        loss = F.softplus(-pos).mean() + neg_term
        return {"loss": loss, "acc_i2t": acc}


def queue_slots(ptr: torch.Tensor, n: int, size: int) -> tuple[int, torch.Tensor]:
    """(skip, slots) for enqueueing n keys at `ptr` in a FIFO queue of `size`: the first `skip` keys would
    be overwritten by later keys of the same batch, so only keys[skip:] are written, to distinct slots
    (a scatter to repeated slots has no defined winner on CUDA)."""
    skip = max(0, n - size)
    return skip, (ptr + skip + torch.arange(n - skip, device=ptr.device)) % size


class MemoryBankLoss(Loss):
    """`--loss clip --memory-bank K`: cross-modal InfoNCE against a queue of EMA keys (A Fistful of Words,
    section 2.1, equations 1-3; MoCo's queue).

    The EMA copy (f', g') of the model encodes keys of the batch (`encode_keys`); the trainer gathers them
    into `extra["image_keys"]`, `extra["text_keys"]` (N, D) and the rows' ids `extra["ids"]` (N,). Image i
    is contrasted with its own EMA text key (positive) and the K queued text keys (negatives), text i with
    its EMA image key and the queued image keys; queued keys with the query's id are masked out. The queue
    starts with random unit keys (MoCo's initialisation; an empty queue would give a zero loss). logits = s * cosine, s the model's logit scale (1/tau, fixed; tau = 0.02); the loss is
    (1/2N) sum_i (L_i^image + L_i^text) (eq. 3). Without keys (evaluation) it is CLIP's in-batch loss.
    After the loss the trainer calls `enqueue` with the global batch's keys, and `update_ema` after each
    optimizer step. The EMA model and the queue are buffers/frozen parameters of this module, so they are
    in the loss's state dict (the checkpoint).
    """

    name = "clip"
    logit_scale_learnable = False

    def __init__(self, size: int, dim: int, temperature: float = 0.02, momentum: float = 0.999):
        super().__init__()
        self.size, self.momentum = int(size), float(momentum)
        self.logit_scale_init = 1 / temperature
        # MoCo's start: random unit keys (their own generator, so the trainer's RNG streams are untouched)
        g = torch.Generator().manual_seed(0)
        self.register_buffer("image_queue", F.normalize(torch.randn(size, dim, generator=g), dim=-1))
        self.register_buffer("text_queue", F.normalize(torch.randn(size, dim, generator=g), dim=-1))
        self.register_buffer("queue_ids", torch.full((size,), -1, dtype=torch.long))  # -1: an initial random key
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))
        self.ema = None

    def init_ema(self, model: nn.Module) -> None:
        self.ema = copy.deepcopy(model)
        for p in self.ema.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def encode_keys(self, **model_inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """EMA keys (normalised) of the local batch; the EMA model runs in eval mode (vltool's choice)."""
        self.ema.eval()
        return self.ema(**model_inputs)

    @torch.no_grad()
    def update_ema(self, model: nn.Module) -> None:
        # A frozen parameter never changes, so its EMA stays the copy init_ema made: only trainable ones
        # are averaged (with locked towers that is the projections, not 25M tower weights every step).
        m = self.momentum
        pairs = [(pe, p) for pe, p in zip(self.ema.parameters(), model.parameters()) if p.requires_grad]
        if pairs:
            ema_params = [pe for pe, _ in pairs]
            torch._foreach_mul_(ema_params, m)
            torch._foreach_add_(ema_params, [p.detach() for _, p in pairs], alpha=1 - m)
        for be, b in zip(self.ema.buffers(), model.buffers()):
            be.copy_(b)

    @torch.no_grad()
    def enqueue(self, image_keys: torch.Tensor, text_keys: torch.Tensor, ids: torch.Tensor) -> None:
        """The batch's keys join the queue (FIFO), as if enqueued one at a time: a batch larger than the
        queue leaves its newest `size` keys (one write per slot, so no slot holds another row's id)."""
        n = image_keys.shape[0]
        skip, idx = queue_slots(self.queue_ptr, n, self.size)
        self.image_queue[idx] = image_keys[skip:].to(self.image_queue.dtype)
        self.text_queue[idx] = text_keys[skip:].to(self.text_queue.dtype)
        self.queue_ids[idx] = ids[skip:]
        self.queue_ptr.copy_((self.queue_ptr + n) % self.size)  # on the device: no host sync

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        img, txt = batch.image_features, batch.text_features
        if img.dtype != torch.float64:
            img, txt = img.float(), txt.float()
        s = batch.logit_scale.to(img.dtype)
        if "image_keys" not in batch.extra:
            return ClipLoss()(LossInput(img, txt, s))
        ik, tk, ids = batch.extra["image_keys"].to(img.dtype), batch.extra["text_keys"].to(img.dtype), batch.extra["ids"]
        masked = self.queue_ids[None, :] == ids[:, None]  # (N, K): the query's own (stale) keys
        iq, tq = self.image_queue.to(img.dtype), self.text_queue.to(img.dtype)

        def side(q, pos_key, queue):
            sim = s * q @ queue.T  # (N, K); bf16 under autocast: masked with its own dtype's lowest value (float32's overflows bf16)
            logits = torch.cat([s * (q * pos_key).sum(-1, keepdim=True), sim.masked_fill(masked, torch.finfo(sim.dtype).min)], 1)
            return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device), reduction="sum"), logits

        l_img, logits = side(img, tk, tq)
        l_txt, _ = side(txt, ik, iq)
        with torch.no_grad():
            acc = (logits.argmax(1) == 0).float().mean()
        return {"loss": (l_img + l_txt) / (2 * img.shape[0]), "acc_i2t": acc}


@register_loss("simclr")
class SimCLRLoss(Loss):
    """SimCLR's NT-Xent, the image-only baseline (Is a Caption Worth a Thousand Images?, section 2.1, appendix A.3).

    `image_features` and `text_features` are the image tower's outputs (before normalisation) for the two
    augmented views of the N images of the global batch. This loss owns the MLP projection head
    (Linear -> ReLU -> Linear, width the embedding size; applied to the gathered global batch, so its
    parameters see all of it). z = normalise(head(views)) (2N, D); logits = s * z z^T without the diagonal
    (s the model's logit scale, 1/tau, tau = 0.1 fixed by default); each view's positive is the other view
    of its image; the loss is the mean cross-entropy over the 2N views.
    """

    logit_scale_init = 10.0  # 1 / tau, tau = 0.1 (vltool's choice: SimCLR's reference implementation's value)
    logit_scale_learnable = False

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.head = None
        if dim is not None:
            self.build_head(dim)

    def build_head(self, dim: int) -> None:
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        v1, v2 = batch.image_features.float(), batch.text_features.float()
        n = v1.shape[0]
        z = torch.cat([v1, v2])
        if self.head is not None:
            z = self.head(z)
        z = F.normalize(z, dim=-1)
        logits = batch.logit_scale.float() * z @ z.T  # (2N, 2N)
        logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
        target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
        loss = F.cross_entropy(logits, target)
        with torch.no_grad():
            acc = (logits.argmax(1) == target).float().mean()
        return {"loss": loss, "acc_i2t": acc}
