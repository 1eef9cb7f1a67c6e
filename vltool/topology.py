"""Which process this is, of how many, on which device: one answer for every command (accelerate's PartialState).

A leaf module (it imports no other vltool module but the leaf vltool.errors), so that encoding, evaluation, `recaption` and
`pretrain` all read the process topology the same way:

    state = process_state()        # accelerate.PartialState
    state.process_index, state.num_processes, state.local_process_index, state.device
    is_main()                      # state.is_main_process
    is_local_main()                # state.is_local_main_process (the first process of its node)
    warn("...")                    # "warning: ..." on stderr, printed by the main process only

Without a GPU, PartialState is asked for CPU processes (as `Accelerator(cpu=True)`): under
`accelerate launch --multi_gpu --num_processes N` or `torchrun --nproc_per_node N` it then reports
MULTI_CPU with the launcher's rank and world size (gloo). A bare `PartialState()` on a CPU-only machine
would report a single process (DistributedType.NO, index 0 of 1) in every launched process. A plain run
(no launcher) is one process either way.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import sys

from vltool.errors import UsageError


_TEARDOWN_REGISTERED = False
DEVICES = ("auto", "cpu", "cuda")  # --device of every command that computes with torch (recaption also takes cuda:N and mps)
_CPU_ONLY = False  # --device cpu of the running command (compute_scope): this process computes on its CPU


def process_state():
    """accelerate's PartialState: one process unless started by `accelerate launch` / `torchrun`.

    When it finds several processes, it also registers `shutdown` to run at interpreter exit."""
    # torch and accelerate are imported here, not at the top: `vltool --help` loads this module, and a plain run never needs them
    import torch
    from accelerate import PartialState

    state = PartialState(cpu=_CPU_ONLY or not torch.cuda.is_available())
    if state.num_processes > 1:
        shutdown_at_exit()
    return state


def shutdown_at_exit() -> None:
    """Register `shutdown` to run at interpreter exit (once). For code that builds its own Accelerator."""
    global _TEARDOWN_REGISTERED
    if not _TEARDOWN_REGISTERED:
        atexit.register(shutdown)
        _TEARDOWN_REGISTERED = True


def shutdown() -> None:
    """Destroy the default process group, if one is up. Run at exit (registered by `process_state`):
    a process that leaves a gloo group for interpreter teardown to destroy can abort ("terminate called
    without an active exception", exit -6), and the launcher then kills the processes still writing."""
    import torch.distributed as dist  # (lazy: see process_state)

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def compute_scope(device: str = "auto", threads: int | None = None):
    """--device and --threads of a command that computes with torch (docs/conventions.md, "Options"), for
    the command's duration: `device` auto | cpu | cuda (checked by the option), `threads` torch's intra-op
    threads (None: torch's own count). The thread count is restored afterwards: it is the process's, not
    only this command's. accelerate's PartialState is made once per process: a later command of the same
    process asking for another device is refused (ValueError)."""
    global _CPU_ONLY
    import torch  # (lazy: see process_state)
    from accelerate.state import PartialState

    cpu = device == "cpu"
    if PartialState._shared_state and (cpu or not torch.cuda.is_available()) != (PartialState().device.type == "cpu"):
        raise ValueError(f"--device {device}: this process already computes on {PartialState().device.type}; run the command in a process of its own")
    before, was_cpu = torch.get_num_threads(), _CPU_ONLY
    _CPU_ONLY = cpu
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        _CPU_ONLY = was_cpu
        torch.set_num_threads(before)


def computes(fn):
    """Run a command's plain function (one taking `config`) under its --device and --threads
    (`config.device`, `config.threads`; vltool.topology.compute_scope)."""
    import functools
    import inspect

    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        config = signature.bind(*args, **kwargs).arguments["config"]
        try:
            scope = compute_scope(config.device, config.threads)
            scope.__enter__()
        except ValueError as e:
            raise UsageError(str(e)) from None
        try:
            return fn(*args, **kwargs)
        finally:
            scope.__exit__(None, None, None)

    return run


def on_cuda(device: str = "auto") -> bool:
    """Whether a command given --device `device` computes on a CUDA GPU (for defaults that differ there)."""
    if device == "cpu":
        return False
    import torch  # (lazy: see process_state)

    return torch.cuda.is_available()


def launched_processes() -> int:
    """How many processes the launcher started (WORLD_SIZE, which `accelerate launch` and torchrun set), 1
    without a launcher. Reads the environment only: no torch import."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def is_main() -> bool:
    """Whether this is the main process (the one that prints and writes). A plain run is, without importing
    torch: commands that never touch a model (deform, split, filter, ...) stay light."""
    if launched_processes() == 1:
        return True
    return process_state().is_main_process


def is_local_main() -> bool:
    """Whether this is the first process of its node (the one that builds what a node's processes share,
    such as an index in the local cache). A plain run is, without importing torch."""
    if launched_processes() == 1:
        return True
    return process_state().is_local_main_process


def warn(message: str) -> None:
    """A warning on stderr, printed once: by the main process only."""
    if is_main():
        print(f"warning: {message}", file=sys.stderr)


def launch_token() -> str:
    """A short name every process of this launch computes alike (no communication needed) and no other live
    launch shares: from the launcher's rendezvous (MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID) under
    `accelerate launch` / torchrun, else from this process's id."""
    if launched_processes() > 1:
        key = "|".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"))
    else:
        key = f"pid:{os.getpid()}"
    return hashlib.sha1(key.encode()).hexdigest()[:8]
