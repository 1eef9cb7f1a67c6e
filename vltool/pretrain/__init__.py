"""`vltool pretrain`: two-tower contrastive training through Accelerate (docs/where-things-are.md).

    config.py      PretrainConfig (every field a command-line option) and its validation; RunSpec
    data/          the training rows and their checks, UniCL's rows, the epoch order, PairDataset and Collate,
                   streamed shards (one module each: data/__init__.py)
    features.py    frozen towers' features computed once (through vltool.cache), a batch's model inputs
    objectives.py  each objective's needs and state: clip, sigmoid, unicl, jsd, memory bank, simclr
    optim.py       freezing, parameter groups, the optimizer, gradient sums, the learning-rate schedule
    checkpoint.py  checkpoints written atomically, exact resume
    evaluate.py    validation loss and R@1 on --eval-data during training
    logs.py        metrics.jsonl, TensorBoard, the progress bar, loss.png
    state.py       RunState: what a run holds between steps (the run, what set-up builds, the progress)
    runtime.py     the Accelerator and --precision, the device's tuning, autocast, --workers when not given
    rundir.py      the run directory: resolve_run, start, checkpoints, finish (the model, vltool.json)
    loop.py        pretrain() = resolve_run() -> setup() -> train() (one step() per optimizer step) -> finish()
"""

from vltool.pretrain.checkpoint import list_checkpoints
from vltool.pretrain.config import CHECKPOINTS, METRICS_FILE, PLOT_FILE, RUN_FILE, PretrainConfig, RunSpec
from vltool.pretrain.loop import pretrain

__all__ = ["CHECKPOINTS", "METRICS_FILE", "PLOT_FILE", "RUN_FILE", "PretrainConfig", "RunSpec", "list_checkpoints", "pretrain"]
