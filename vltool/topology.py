"""Which process this is, of how many, on which device: one answer for every command (accelerate's PartialState).

A leaf module (it imports no other vltool module), so that encoding, evaluation, `recaption` and
`pretrain` all read the process topology the same way:

    state = process_state()        # accelerate.PartialState
    state.process_index, state.num_processes, state.local_process_index, state.device
    is_main()                      # state.is_main_process
    warn("...")                    # "warning: ..." on stderr, printed by the main process only

Without a GPU, PartialState is asked for CPU processes (as `Accelerator(cpu=True)`): under
`accelerate launch --multi_gpu --num_processes N` or `torchrun --nproc_per_node N` it then reports
MULTI_CPU with the launcher's rank and world size (gloo). A bare `PartialState()` on a CPU-only machine
would report a single process (DistributedType.NO, index 0 of 1) in every launched process. A plain run
(no launcher) is one process either way.
"""

from __future__ import annotations

import sys


def process_state():
    """accelerate's PartialState: one process unless started by `accelerate launch` / `torchrun`."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def is_main() -> bool:
    """Whether this is the main process (the one that prints and writes)."""
    return process_state().is_main_process


def warn(message: str) -> None:
    """A warning on stderr, printed once: by the main process only."""
    if is_main():
        print(f"warning: {message}", file=sys.stderr)
