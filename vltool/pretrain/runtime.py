"""Where the run computes: the Accelerator (processes, device, --precision), the device's tuning (TF32 on
GPUs; denormals and malloc on CPU, set by the loop), the forward passes' autocast and attention kernel, and
--workers when not given."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from typing import TYPE_CHECKING

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch.nn.attention import SDPBackend, sdpa_kernel

from vltool.errors import UsageError
from vltool.pretrain.config import PretrainConfig
from vltool.topology import shutdown_at_exit

if TYPE_CHECKING:
    from vltool.pretrain.state import RunState


def native_precision(device_type: str) -> str:
    """--precision auto: bf16 where the device computes it natively (a CUDA GPU that supports bf16; a CPU with
    AVX-512 BF16 or AMX), else no (float32). On a CPU without them bf16 is emulated, about 50x slower."""
    if device_type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    if device_type == "cpu":
        native = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)() or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        return "bf16" if native else "no"
    return "no"


def _native_reason(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} {'computes' if torch.cuda.is_bf16_supported() else 'does not compute'} bf16 natively"
    return f"CPU capability {torch.backends.cpu.get_cpu_capability()}: bf16 {'native' if native_precision('cpu') == 'bf16' else 'emulated'}"


def run_dtype(config: PretrainConfig) -> str:
    """The run's numeric precision, for its records: float32 weights, with --precision's autocast."""
    return "float32" if config.precision == "no" else f"float32 weights, {config.precision} autocast"


def _accelerator(config: PretrainConfig) -> Accelerator:
    if AcceleratorState._shared_state:  # an earlier run in this process (notebook, tests): new precision allowed
        AcceleratorState._reset_state()
    try:
        if config.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: no GPU is visible to torch")
        if config.precision == "auto":
            config.precision = native_precision("cpu" if config.device == "cpu" or not torch.cuda.is_available() else "cuda")
        acc = Accelerator(cpu=config.device == "cpu" or not torch.cuda.is_available(), mixed_precision=config.precision)
    except (ValueError, RuntimeError) as e:
        raise UsageError(f"--precision {config.precision}: {e}") from None
    if acc.num_processes > 1:
        shutdown_at_exit()  # the process group destroyed before interpreter teardown (a gloo group left to it can abort)
    return acc


def _tune_device(acc: Accelerator) -> None:
    """The GPU path: TF32 for float32 matmuls and convolutions (set before the run's record is written)."""
    if acc.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def default_workers(device_type: str, world: int) -> int:
    """--workers when not given: 0 when training on CPU (the model's threads use the cores; decoding in
    the main process costs little next to a CPU step); on GPUs the CPU cores each process of this machine
    may use, less one for the process itself (a GPU at 40% MFU on ViT-B-32 wants ~7,000 images a second:
    every core it can have)."""
    if device_type == "cpu":
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # (set by accelerate launch and torchrun)
    return max(0, cores // max(local, 1) - 1)


def _keep_freed_memory(keep: bool) -> bool:
    """CPU training (Linux, glibc): keep freed memory in the process while training. glibc's malloc hands
    large blocks back to the system when they are freed, and the next step faults them in again, zeroed
    by the kernel (about 7% of a vltool-small step on 2 cores); torch's CPU tuning guide's advice is the
    same (jemalloc/tcmalloc). `keep=False` sets glibc's default values again (128 KiB); the mmap threshold
    then stays fixed at that value, where glibc's own would have adapted (any mallopt of it turns the
    adaptation off for the process). True when it applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    trim, top_pad, mmap = -1, -2, -3  # M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD
    values = {mmap: 32 << 20, trim: 1 << 30, top_pad: 256 << 20} if keep else {mmap: 128 << 10, trim: 128 << 10, top_pad: 128 << 10}
    return all(mallopt(k, v) == 1 for k, v in values.items())


def _autocast(run: RunState):
    """The forward passes' precision context: Accelerate's autocast; with bf16 on CPU and sequences of at
    most 160 tokens also torch's math attention kernel, which is 2-3x faster there than its CPU flash
    attention (about 15% of a vltool-small step; longer sequences keep flash attention)."""
    ctx = run.accelerator.autocast()
    if not run.math_attention:
        return ctx
    stack = contextlib.ExitStack()
    stack.enter_context(ctx)
    stack.enter_context(_attention_kernel(run))
    return stack


def _attention_kernel(run: RunState):
    """torch's math attention kernel where _autocast chooses it, else nothing. The training step holds it
    over the backward pass too: checkpointed blocks are recomputed there, and torch restores autocast for
    them but not the kernel choice (a block recomputed with another kernel fails its checkpoint check)."""
    if not run.math_attention:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


def to_device(run: RunState, batch: dict) -> dict:
    """A batch's images on the training device as the model takes them: uint8 crops copied (non-blocking from
    pinned memory) and normalised there (vltool.transforms.Pixels.normalise); everything else as it came."""
    if "jpeg" in batch:  # --decode gpu: decoded and cropped on the device
        batch["images"] = run.pixels.device_images(batch, run.device)
    for key in ("images", "images2"):
        if key in batch and run.pixels is not None:
            batch[key] = run.pixels.normalise(batch[key].to(run.device, non_blocking=True))
    return batch
