"""PretrainConfig: the options of `vltool pretrain`, and their validation.

Every field is the command-line option of the same name (`text_column` is `--text-column`); its help text
lives once, on the option in vltool/commands/pretrain.py (`vltool pretrain --help`), and
tests/test_options.py keeps the two in step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from vltool import columns as C, objective_specs
from vltool.errors import UsageError
from vltool.topology import DEVICES
from vltool.model.configs import _check_open_clip_cfg, arch_config
from vltool.model.create import ModelSpec
from vltool.transforms import AUGMENTATIONS

RUN_FILE = "run.json"  # what the run was started with; --resume reads it
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
PLOT_FILE = "loss.png"
OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = ("auto", "no", "bf16", "fp16")  # auto: bf16 where the device computes it natively, else no (runtime.native_precision)
SCHEDULES = ("cosine", "constant")
CAPTION_SAMPLING = ("random", "first")
DATA_FORMATS = ("auto", "hf", "wds")


@dataclass
class PretrainConfig:
    """Options of `vltool pretrain` (help: `vltool pretrain --help`)."""

    # The model.
    arch: str = "vltool-tiny"
    image_tower: str | None = None
    image_weights: str | None = None
    text_tower: str | None = None
    text_pooling: str = "mean"
    embed_dim: int | None = None
    image_size: int | None = None
    context_length: int | None = None
    init: str | None = None
    loss: str = "clip"
    logit_scale_init: float | None = None
    logit_scale_learnable: bool | None = None
    lock_image: bool = False
    lock_text: bool = False
    unfreeze_image_last: int = 0
    unfreeze_text_last: int = 0
    cache_frozen: bool = True
    sync_bn: bool = False
    # The objectives' options (docs/objectives.md).
    bias_init: str | None = None
    bias_search_batches: int = 4  # vltool's choice: the paper does not say how many batches
    captions_per_image: int = 1
    mined_positives: bool = False
    label_data: list[str] = field(default_factory=list)
    text_data: list[str] = field(default_factory=list)
    label_column: str = C.LABEL
    templates: str = "openai-imagenet"
    critic_dim: int | None = None
    jsd_negatives: str = "one"
    memory_bank: int = 0
    temperature: float = 0.02
    ema_momentum: float | None = None  # None: from the run's length (objectives.ema_momentum_for)
    export_ema: bool = False
    balanced: bool = False
    # The data.
    text_column: str = C.CAPTION
    caption_sampling: str | None = None
    prefix_ids: bool = False
    allow_test_data: bool = False  # built-in test-only data as training input (io.test_only_inputs)
    augment: str = "clip"
    decode: str = "cpu"  # gpu: JPEGs decoded by nvjpeg in batches on the training device, cropped there (--augment clip)
    workers: int | None = None  # None: chosen from the machine when the run starts (runtime.default_workers), then recorded
    data_format: str = "auto"
    shuffle_buffer: int = 2000  # wds: samples held per stream (about 2000 x 30 KB = 60 MB with CC3M-sized JPEGs)
    # The optimisation.
    batch_size: int = 64
    global_batch_size: int | None = None  # instead of batch_size: divided among the processes started (resolve_global_batch)
    epochs: float | None = None
    steps: int | None = None
    optimizer: str = "adamw"
    lr: float = 5e-4
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    min_lr: float = 0.0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    momentum: float = 0.9
    grad_clip_norm: float | None = None
    accum_steps: int = 1
    grad_checkpointing: bool = False
    compile: bool = False
    precision: str = "auto"  # resolved when the run starts (runtime.native_precision), then recorded
    seed: int = 0
    # Logging and checkpoints.
    log_every: int = 10
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    eval_every: int = 0
    device: str = "auto"
    threads: int | None = None  # torch intra-op threads of each process (None: torch's default, OMP_NUM_THREADS or the cores)
    processes: int | None = None  # the processes the launch is meant to have (None: whatever it has); another number is refused

    def model_spec(self):
        return ModelSpec(
            arch=self.arch,
            image_tower=self.image_tower,
            image_weights=self.image_weights,
            text_tower=self.text_tower,
            text_pooling=self.text_pooling,
            embed_dim=self.embed_dim,
            image_size=self.image_size,
            context_length=self.context_length,
        )

    def validate(self) -> None:
        """Report every problem at once."""
        problems = _model_problems(self) + _objective_problems(self) + _data_problems(self) + _optimisation_problems(self)
        if problems:
            raise UsageError("; ".join(problems))


def _opt(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _model_problems(c: PretrainConfig) -> list[str]:
    problems = []
    if c.init is None:
        problems += c.model_spec().validate()
        if c.image_tower is None or c.text_tower is None:
            try:
                _check_open_clip_cfg(arch_config(c.arch), f"--arch {c.arch}")
            except UsageError as e:
                problems.append(str(e))
    else:
        given = [_opt(n) for n in ("image_tower", "text_tower", "embed_dim", "image_size", "context_length") if getattr(c, n) is not None]
        if given:
            problems.append(f"--init starts from a trained model, so {', '.join(given)} cannot change it")
    if c.logit_scale_init is not None and not 0 < c.logit_scale_init <= 100:
        problems.append(f"--logit-scale-init must be in (0, 100], got {c.logit_scale_init}")
    for name in ("unfreeze_image_last", "unfreeze_text_last", "warmup_steps", "workers"):
        if getattr(c, name) is not None and getattr(c, name) < 0:
            problems.append(f"{_opt(name)} must be >= 0")
    if c.threads is not None and c.threads < 1:
        problems.append(f"--threads must be >= 1, got {c.threads}")
    if c.unfreeze_image_last and not c.lock_image:
        problems.append("--unfreeze-image-last needs --lock-image")
    if c.unfreeze_text_last and not c.lock_text:
        problems.append("--unfreeze-text-last needs --lock-text")
    return problems


def _objective_problems(c: PretrainConfig) -> list[str]:
    """--loss and the objectives' options: each objective checks its own (vltool.objective_specs)."""
    return objective_specs.problems(c)


def _data_problems(c: PretrainConfig) -> list[str]:
    problems = []
    if c.caption_sampling is not None and c.caption_sampling not in CAPTION_SAMPLING:
        problems.append(f"--caption-sampling {c.caption_sampling!r}: use random or first")
    if c.augment not in AUGMENTATIONS:
        problems.append(f"--augment {c.augment!r}: use {', '.join(AUGMENTATIONS)}")
    if c.decode not in ("cpu", "gpu"):
        problems.append(f"--decode {c.decode!r}: use cpu or gpu")
    elif c.decode == "gpu" and c.augment != "clip":
        problems.append(f"--decode gpu crops on the GPU for --augment clip only (--augment {c.augment} crops with PIL in the workers)")
    if c.data_format not in DATA_FORMATS:
        problems.append(f"--data-format {c.data_format!r}: use {' | '.join(DATA_FORMATS)}")
    if c.shuffle_buffer < 1:
        problems.append(f"--shuffle-buffer must be >= 1, got {c.shuffle_buffer}")
    return problems


def _optimisation_problems(c: PretrainConfig) -> list[str]:
    problems = []
    for name in ("batch_size", "accum_steps", "log_every", "checkpoint_every", "keep_checkpoints"):
        if getattr(c, name) < 1:
            problems.append(f"{_opt(name)} must be >= 1, got {getattr(c, name)}")
    if c.global_batch_size is not None and c.global_batch_size < 1:
        problems.append(f"--global-batch-size must be >= 1, got {c.global_batch_size}")
    if c.epochs is not None and c.epochs <= 0:
        problems.append(f"--epochs must be > 0, got {c.epochs}")
    if c.steps is not None and c.steps < 1:
        problems.append(f"--steps must be >= 1, got {c.steps}")
    if c.optimizer not in OPTIMIZERS:
        problems.append(f"--optimizer {c.optimizer!r}: use adamw or sgd")
    if not (c.lr > 0 and math.isfinite(c.lr)):
        problems.append(f"--lr must be > 0, got {c.lr}")
    if c.min_lr < 0 or c.min_lr > c.lr:
        problems.append(f"--min-lr must be in [0, --lr], got {c.min_lr}")
    if c.lr_schedule not in SCHEDULES:
        problems.append(f"--lr-schedule {c.lr_schedule!r}: use cosine or constant")
    if c.weight_decay < 0:
        problems.append(f"--weight-decay must be >= 0, got {c.weight_decay}")
    if not (0 <= c.beta1 < 1 and 0 <= c.beta2 < 1):
        problems.append("--beta1 and --beta2 must be in [0, 1)")
    if c.eps <= 0:
        problems.append("--eps must be > 0")
    if not 0 <= c.momentum < 1:
        problems.append("--momentum must be in [0, 1)")
    if c.grad_clip_norm is not None and c.grad_clip_norm <= 0:
        problems.append(f"--grad-clip-norm must be > 0, got {c.grad_clip_norm}")
    if c.precision not in PRECISIONS:
        problems.append(f"--precision {c.precision!r}: use auto, no, bf16 or fp16")
    if c.eval_every < 0:
        problems.append("--eval-every must be >= 0")
    if c.device not in DEVICES:
        problems.append(f"--device {c.device!r}: use {' | '.join(DEVICES)} (under `accelerate launch` each process takes its local rank's GPU)")
    return problems


def recorded(c: PretrainConfig) -> dict:
    """The options a run records (run.json, vltool.json): every field but global_batch_size, a spelling of
    batch_size that resolve_global_batch turns into it before the run starts."""
    return {k: v for k, v in asdict(c).items() if k != "global_batch_size"}


def resolve_global_batch(c: PretrainConfig, world: int) -> None:
    """--global-batch-size G (the global batch: batch-size x processes x accum-steps): --batch-size
    G / (world x accum-steps), `world` the processes the launch started; refused unless it divides."""
    if c.global_batch_size is None:
        return
    parts = world * c.accum_steps
    if c.global_batch_size % parts:
        among = f"the {world} process{'es' if world != 1 else ''} the launch started" + (f" x {c.accum_steps} accumulation steps" if c.accum_steps > 1 else "")
        raise UsageError(f"--global-batch-size {c.global_batch_size}: does not divide among {among} "
                         f"(e.g. --global-batch-size {(c.global_batch_size // parts + 1) * parts})")
    c.batch_size, c.global_batch_size = c.global_batch_size // parts, None


@dataclass
class RunSpec:
    """What a run was started with (RUN_DIR/run.json); --resume reads it back."""

    data: list[str]
    where: list[str]
    split: str | None
    eval_data: list[str]
    eval_where: list[str]
    config: dict
    num_processes: int
    command_line: str = ""
    init_revision: dict = field(default_factory=dict)  # --init's exact weights (Hub commit, open_clip tag's file sha256)
    runtime: dict = field(default_factory=dict)  # what determines the bits: threads, device, dtype, versions (provenance.runtime)
    eval_split: str | None = None  # --eval-split: the split of a DatasetDict given as --eval-data
