"""`RunState`: what a run holds between steps, grouped by who sets it: the run as resolved (before the
model exists), what set-up builds (model, objective, optimizer, data path), and the progress the steps
make (counters, losses, the log window)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vltool.pretrain.config import PretrainConfig, RunSpec
from vltool.pretrain.data.items import Collate, PairDataset
from vltool.pretrain.data.rows import TrainData
from vltool.pretrain.data.streams import ShardData, ShardStream
from vltool.pretrain.features import FrozenFeatures, model_inputs
from vltool.pretrain.logs import MetricsLog
from vltool.pretrain.objectives import Objective
from vltool.transforms import Pixels

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from vltool.model.architecture import TwoTower
    from vltool.model.tokenizer import Tokenizer
    from vltool.pretrain.optim import GradientSync


@dataclass
class LogWindow:
    """The steps since the last train log line: when it started, the samples and steps in it, and the
    seconds they waited for the data loader."""

    start: float = field(default_factory=time.perf_counter)
    samples: int = 0
    waited: float = 0.0
    steps: int = 0


@dataclass
class RunState:
    """Everything a run holds between steps."""

    # the run as resolved and checked (setup(), before the model exists)
    config: PretrainConfig
    spec: RunSpec
    run_dir: Path
    accelerator: Accelerator
    resumed: bool
    train: TrainData | ShardData
    evald: TrainData | None
    total_steps: int
    per_epoch_micro: int | None  # micro-batches in an epoch (None: shards of unknown size)
    precision_note: str | None = None  # --precision auto: what it chose, and why

    # what set-up builds (setup._build_model): the model, the objective, the optimizer, the data path
    model: TwoTower | None = None
    tokenizer: Tokenizer | None = None
    objective: Objective | None = None
    optimizer: torch.optim.Optimizer | None = None  # (Accelerate's wrapper of it)
    trainable: list[torch.nn.Parameter] = field(default_factory=list)
    local_params: list[torch.nn.Parameter] = field(default_factory=list)  # gradients summed over processes
    sync: GradientSync | None = None  # GradientSync of local_params
    math_attention: bool = False  # bf16 on CPU with short sequences: the math attention kernel (runtime._autocast)
    frozen: dict[str, bool] = field(default_factory=dict)  # side -> wholly frozen
    features: FrozenFeatures = field(default_factory=FrozenFeatures)
    dataset: PairDataset | ShardStream | None = None  # (a ShardStream when streaming)
    collate: Collate | None = None
    pixels: Pixels | None = None  # the training transform: uint8 crops in the workers, normalised on the device
    log: MetricsLog | None = None

    # progress: set by the resume state (setup._resume_state), then by every step
    step: int = 0
    start_step: int = 0
    samples_seen: int = 0
    samples_at_start: int = 0
    bad_ids: set[str] = field(default_factory=set)
    first_loss: float | None = None
    last_loss: float | None = None
    searched_bias: float | None = None
    had_checkpoint: bool = False
    data_positions: dict[int, tuple[int, int]] = field(default_factory=dict)  # shards: this process's stream -> (epoch, samples consumed)
    pending: list[tuple[int, dict[str, torch.Tensor]]] = field(default_factory=list)  # (step, metrics as tensors) not read back yet
    window: LogWindow = field(default_factory=LogWindow)
    data_bound_warned: bool = False
    train_seconds: float = 0.0

    @property
    def streaming(self) -> bool:
        return isinstance(self.train, ShardData)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def inputs(self, batch: dict) -> dict:
        return model_inputs(batch, self.features, self.tokenizer, int(self.model.config["preprocess"]["size"]), self.device)

    def epochs(self) -> float | None:
        """Passes over the data so far (shards: samples seen / the shards' samples; None when unknown)."""
        if self.per_epoch_micro is None:
            return None
        return round(self.step * self.config.accum_steps / self.per_epoch_micro, 4)
