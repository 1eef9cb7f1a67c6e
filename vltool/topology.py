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


def launch_token() -> str:
    """A short name every process of this launch computes alike (no communication needed) and no other live
    launch shares: from the launcher's rendezvous (MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID) under
    `accelerate launch` / torchrun, else from this process's id."""
    import hashlib
    import os

    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        key = "|".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"))
    else:
        key = f"pid:{os.getpid()}"
    return hashlib.sha1(key.encode()).hexdigest()[:8]
