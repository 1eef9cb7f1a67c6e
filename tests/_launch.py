"""Run a script (or `-m vltool ...`) the way users scale out: `accelerate launch --multi_gpu` with N CPU
processes (gloo), or in this test process when N is 1.

    launch([script, *args], nproc=2)       # accelerate launch; asserts exit 0, returns the CompletedProcess
    launch(["-m", "vltool", "zeroshot", ...], nproc=2)
    launch([script, *args], nproc=1)       # the same script in this process (no interpreter start-up)

One process is run in-process with `runpy`, restoring what a script may change globally (sys.argv,
torch's thread count, optimizer pre-hooks), so the tests that follow see the process as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def launch_command(args: list[str], nproc: int) -> list[str]:
    """The `accelerate launch` command line for `nproc` CPU processes on this machine."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(nproc),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
            *map(str, args)]


def launch(args: list, nproc: int = 2, *, timeout: int = 300, cwd: Path = REPO, env: dict | None = None,
           in_process: bool = True) -> subprocess.CompletedProcess | None:
    """Run `args` (a script and its arguments, or "-m", module, ...) in `nproc` processes. Asserts exit 0
    with the end of stderr as the message. nproc 1 runs a script in this process (returns None) unless
    `in_process` is False, when it is a plain `python SCRIPT ...` subprocess."""
    args = [str(a) for a in args]
    if nproc == 1 and in_process and args[0] != "-m":
        run_here(args)
        return None
    env = {**os.environ, **ENV, **(env or {})}
    cmd = launch_command(args, nproc) if nproc > 1 else [sys.executable, *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def run_here(args: list[str]) -> None:
    """`python SCRIPT ARGS...` in this process, restoring sys.argv, torch's threads and optimizer hooks."""
    import runpy

    import torch
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    argv, threads, hooks = sys.argv, torch.get_num_threads(), dict(_global_optimizer_pre_hooks)
    sys.argv = list(args)
    try:
        runpy.run_path(args[0], run_name="__main__")
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)
        _global_optimizer_pre_hooks.clear()
        _global_optimizer_pre_hooks.update(hooks)
