"""`vltool pretrain`: two-tower contrastive training through Accelerate (docs/where-things-are.md).

    config.py      PretrainConfig (every field a command-line option) and its validation; RunSpec
    data.py        the training rows, the epoch order, PairDataset and Collate
    features.py    frozen towers' features computed once (through vltool.cache), a batch's model inputs
    objectives.py  each objective's needs and state: clip, sigmoid, unicl, jsd, memory bank, simclr
    optim.py       freezing, parameter groups, the optimizer, gradient sums, the learning-rate schedule
    loop.py        pretrain() = setup() -> train() (one step() per optimizer step) -> finish()
    checkpoint.py  checkpoints written atomically, exact resume
    evaluate.py    validation loss and R@1 on --eval-data during training
    logs.py        metrics.jsonl, TensorBoard, the progress bar, loss.png
"""

from vltool.pretrain.checkpoint import list_checkpoints
from vltool.pretrain.config import CHECKPOINTS, METRICS_FILE, PLOT_FILE, RUN_FILE, PretrainConfig, RunSpec
from vltool.pretrain.loop import pretrain

__all__ = ["CHECKPOINTS", "METRICS_FILE", "PLOT_FILE", "RUN_FILE", "PretrainConfig", "RunSpec", "list_checkpoints", "pretrain"]
