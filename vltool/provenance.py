"""`vltool.json`: how an output was made. Following the chain of these files tells the whole history."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import shlex
import sys
import time
import weakref
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

from vltool import __version__


def command_line(argv: Sequence[str] | None = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if argv and (Path(argv[0]).name in ("vltool", "__main__.py", "-m") or argv[0].endswith("vltool")):
        argv = ["vltool", *argv[1:]]
    return shlex.join(argv)


def jsonable(obj: Any) -> Any:
    """Options as plain JSON values: dataclasses to dicts, paths and enums to strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Enum):
        return obj.value
    return obj


LIBRARIES = ("numpy", "torch", "torchvision", "transformers", "open_clip", "accelerate", "datasets", "pyarrow", "sklearn",
             "safetensors", "tokenizers", "PIL")


def runtime(device: Any = None, dtype: str | None = None) -> dict:
    """What determines an output's bits besides its options and inputs (the record's "runtime"): the
    machine, the versions of the libraries this process has loaded, and, when torch is loaded, its intra-
    and inter-op thread counts, deterministic-algorithm flags, TF32 settings and default dtype; `device`
    and `dtype`: where and in what precision the command computed. torch is never imported here: a
    command that did not load it did not compute with it."""
    info: dict[str, Any] = {"platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count(),
                            "python": sys.version.split()[0]}
    libs = {}
    for name in LIBRARIES:
        mod = sys.modules.get(name)
        # (read from the module's own names: open_clip loaded as vltool.open_clip_parts runs its __init__ on a
        # missing name, so its version comes from its distribution's metadata)
        version = vars(mod).get("__version__") if mod is not None else None
        if mod is not None and version is None and name == "open_clip":
            version = importlib.metadata.version("open_clip_torch")
        if isinstance(version, str):
            libs[name] = version
    info["libraries"] = libs
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        info["torch_threads"] = torch.get_num_threads()
        info["torch_interop_threads"] = torch.get_num_interop_threads()
        info["deterministic_algorithms"] = bool(torch.are_deterministic_algorithms_enabled())
        info["cudnn_deterministic"] = bool(torch.backends.cudnn.deterministic)
        info["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
        info["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
        info["tf32_cudnn"] = bool(torch.backends.cudnn.allow_tf32)
        info["default_dtype"] = str(torch.get_default_dtype()).removeprefix("torch.")
        info["cuda_build"] = torch.version.cuda
        info["cuda_available"] = bool(torch.cuda.is_available())
        # the instruction set torch's CPU kernels use (AVX2, AVX512, ...), and what pins MKL's and oneDNN's:
        # a float32 CPU run's bits can differ between machines with different ones
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        pins = {k: os.environ[k] for k in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA") if os.environ.get(k)}
        if pins:
            info["cpu_math_env"] = pins
    if device is not None:
        info["device"] = str(device)
    if dtype is not None:
        info["dtype"] = dtype
    return info


class Timer:
    """A command's clock, from its start. The encoding loop marks every live Timer when its first batch is
    done (`mark_first_batch`; a step that made its own record before, such as a shard index built on the
    way, is marked too late to matter), and `make` records the seconds to that mark as
    `seconds_to_first_batch`, the start-up a user waits before any encoding."""

    _live: "weakref.WeakSet[Timer]" = weakref.WeakSet()

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.started_at = datetime.now(timezone.utc)
        self.first_batch: float | None = None
        Timer._live.add(self)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def mark_first_batch() -> None:
    """Record on the running commands' Timers that their first encoding batch is done (the first call only)."""
    now = time.perf_counter()
    for t in list(Timer._live):
        if t.first_batch is None:
            t.first_batch = now


def make(
    command: str,
    options: Any,
    inputs: Sequence[Any] = (),
    *,
    rows_in: int | None = None,
    rows_out: int | None = None,
    stats: dict | None = None,
    timer: Timer | None = None,
    argv: Sequence[str] | None = None,
    device: Any = None,
    dtype: str | None = None,
) -> dict:
    """The provenance record every output carries (docs/conventions.md, "Provenance"); "runtime" is
    `runtime(device, dtype)`."""
    prov = {
        "vltool_version": __version__,
        "command": command,
        "command_line": command_line(argv),
        "options": jsonable(options),
        "inputs": [i.provenance() if hasattr(i, "provenance") else jsonable(i) for i in inputs],
        "rows_in": rows_in,
        "rows_out": rows_out,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
    }
    if timer is not None:
        prov["wall_time_s"] = round(timer.seconds, 3)
        if timer.first_batch is not None:  # something was encoded (not all read from the embedding cache)
            prov["seconds_to_first_batch"] = round(timer.first_batch - timer.start, 3)
    prov["stats"] = jsonable(stats or {})
    prov["runtime"] = runtime(device, dtype)
    return prov
