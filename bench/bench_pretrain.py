"""Training speed of `vltool pretrain` against open_clip's own trainer (`python -m open_clip_train.main`),
and the memory that gradient checkpointing saves (`--memory`).

Both trainers train the same architecture (`vltool-small` by default: a 6-layer, 256-wide ViT at 64 px
with a 6-layer, 256-wide text transformer, written once as an open_clip `local-dir:` config so open_clip's
trainer builds exactly the same model), with the same batch size, precision (`--precision`, default auto:
bf16 autocast where the device computes bf16 natively, else float32, as `vltool pretrain --precision auto`
chooses; bf16 emulated on a CPU without AVX-512 BF16/AMX is ~50x slower and is never measured by default),
data (the emoji train rows: PNG files and a CSV for open_clip, the saved dataset for vltool; or, with
`--data DIR`, JPEG shards in img2dataset's layout, which both trainers stream: bench/photo_shards.py builds
them from photographs), augmentation (random resized crop 0.9-1), AdamW and data-loader workers, on the same
device: a CUDA GPU when torch sees one (both trainers pick it), else the CPU. `--profile` adds one more vltool
run under torch.profiler and prints its top device kernels; every vltool run reports the share of its wall time
its steps waited for batches (metrics.jsonl's data_wait_share). Runs alternate (vltool, open_clip, vltool, ...). Each run's
throughput is the median over its steps after the first `--skip` of per-step samples/s (open_clip's
`--log-every-n-steps 1` lines, vltool's metrics.jsonl with `--log-every 1`); the script prints the median
over runs of each, their ratio, and the model FLOP utilisation (MFU) of each: model FLOP/s achieved as a
share of this device's measured bf16 matrix-multiply peak (FLOPs per sample from torch's FlopCounterMode
on one forward and backward pass). `--vltool-args "--compile"` adds options to vltool's runs only (say so
when quoting the ratio).

`--memory` instead measures one training step of vltool's model with and without `--grad-checkpointing`
at two batch sizes: the activation memory kept for the backward pass (distinct tensors saved by autograd,
parameters excluded; on CUDA also the peak allocated memory), the fixed memory (fp32 weights, gradients,
AdamW's two moments, the bf16 weight copies), and the largest batch whose fixed + activation memory fits
`--memory-budget-gb` (activations grow linearly with the batch: fitted on the two sizes).

Needs (benchmark only): pip install webdataset braceexpand  (open_clip_train imports them).

    python bench/bench_pretrain.py                 # defaults: vltool-small, batch 64, 30 steps, 3 runs each
    python bench/bench_pretrain.py --arch vltool-tiny --batch-size 32 --steps 20 --runs 2
    python bench/bench_pretrain.py --memory --memory-budget-gb 4
    python bench/bench_pretrain.py --arch ViT-B-32 --data /path/to/shards --batch-size 256 --workers 14 --steps 200 --profile
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads)"


def matmul_peak_bf16(device, seconds: float = 3.0, dtype=None) -> float:
    """Best measured FLOP/s of an (n x n) @ (n x n) matrix multiply in `dtype` (bf16 unless given) on `device`
    (n = 8192 on a GPU, 1024 on a CPU)."""
    import torch

    dtype = dtype or torch.bfloat16
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        sync()
        dt = time.perf_counter() - t
        best = max(best, 4 * 2 * n**3 / dt)
    return best


def flops_per_sample(arch: str, batch: int, device, bf16: bool = True) -> float:
    """Model FLOPs of one training sample (forward + backward, loss included), under bf16 autocast or not."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from vltool.losses import ClipLoss, LossInput
    from vltool.model import ModelSpec, create_model, to_device

    model, tok = create_model(ModelSpec(arch=arch))
    model.to(device)
    size = model.config["preprocess"]["size"]
    x = torch.randn(batch, 3, size, size, device=device)
    t = to_device(tok(["a grinning face with big eyes"] * batch), device)
    with FlopCounterMode(display=False) as fc, torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        img, txt = model(x, t)
        loss = ClipLoss()(LossInput(img, txt, model.logit_scale.exp()))["loss"]
        loss.backward()
    return fc.get_total_flops() / batch


def prepare(work: Path, arch: str, rows: int) -> tuple[str, Path, Path]:
    """The emoji train rows as a vltool dataset, PNG files + CSV for open_clip, and the local-dir config."""
    from vltool.io import load_dataset
    from vltool.model import arch_config

    src = load_dataset("emoji", where=["split=train"]).dataset
    n = min(rows, len(src))
    ds = src.select(range(n))
    data_dir = work / "emoji_train"
    ds.save_to_disk(str(data_dir))
    img_dir = work / "png"
    img_dir.mkdir()
    csv_path = work / "train.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["filepath", "title"])
        for i, row in enumerate(ds.select_columns(["image", "caption"])):
            p = img_dir / f"{i}.png"
            row["image"].save(p)
            w.writerow([str(p), row["caption"]])
    oc_dir = work / "oc_model"
    oc_dir.mkdir()
    cfg = arch_config(arch)
    size = cfg["vision_cfg"]["image_size"]
    (oc_dir / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": {**cfg, "custom_text": True}, "preprocess_cfg": {"size": size}})
    )
    return str(data_dir), csv_path, oc_dir


def median_after(values: list[float], skip: int) -> float:
    v = values[skip:] if len(values) > skip else values
    return statistics.median(v)


def vltool_command(data: str, out: Path, args) -> list[str]:
    return [
        "pretrain", data, "--out", str(out), "--overwrite", "--arch", args.arch,
        "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--precision", args.precision, "--augment", "clip",
        "--lr", "5e-4", "--weight-decay", "0.1", "--workers", str(args.workers), "--log-every", "1",
        "--checkpoint-every", str(10**9), "--no-progress", "--seed", "0", *args.vltool_args.split(),
    ]


def run_vltool(data: str, out: Path, args, waits: list | None = None) -> float:
    cmd = [sys.executable, "-m", "vltool", *vltool_command(data, out, args)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if r.returncode != 0:
        raise SystemExit(f"vltool failed:\n{r.stderr[-3000:]}")
    train = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "train"]
    if waits is not None:
        waits.append(median_after([m.get("data_wait_share", 0.0) for m in train], args.skip))
    return median_after([m["samples_per_s"] for m in train], args.skip)


def profile_vltool(data: str, out: Path, args, rows: int = 15) -> None:
    """One more vltool run in this process under torch.profiler: its top kernels by self device time (CPU
    time on a CPU), printed."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vltool.cli import app

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        try:
            app(vltool_command(data, out, args), standalone_mode=False)
        except SystemExit:
            pass
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(f"top {rows} kernels of one vltool run by {key}:")
    print(prof.key_averages().table(sort_by=key, row_limit=rows))


def shard_pattern(folder: Path) -> tuple[str, int]:
    """A folder of img2dataset shards -> (brace pattern of its .tar files, their samples: *_stats.json's successes
    when every shard has one, else counted)."""
    import tarfile

    tars = sorted(folder.glob("*.tar"))
    if not tars:
        raise SystemExit(f"--data {folder}: no .tar shards in it (build some with bench/photo_shards.py)")
    stems = [t.stem for t in tars]
    width = len(stems[0])
    if not all(s.isdigit() and len(s) == width for s in stems) or [int(s) for s in stems] != list(range(int(stems[0]), int(stems[0]) + len(stems))):
        raise SystemExit(f"--data {folder}: shards must be numbered consecutively (00000.tar, 00001.tar, ...)")
    stats = [folder / f"{s}_stats.json" for s in stems]
    if all(p.is_file() for p in stats):
        n = sum(json.loads(p.read_text()).get("successes", 0) for p in stats)
    else:
        n = 0
        for t in tars:
            with tarfile.open(t) as tar:
                n += sum(1 for m in tar.getmembers() if m.name.endswith((".jpg", ".jpeg", ".png", ".webp")))
    return str(folder / f"{{{stems[0]}..{stems[-1]}}}.tar"), n


def run_open_clip(csv_path, oc_dir: Path, logs: Path, args) -> float:
    data = ["--dataset-type", "csv", "--train-data", str(csv_path), "--csv-img-key", "filepath", "--csv-caption-key", "title",
            "--csv-separator", ","]
    if args.data:  # the same shards, streamed by open_clip's webdataset pipeline
        pattern, n = shard_pattern(Path(args.data))
        data = ["--dataset-type", "webdataset", "--train-data", pattern, "--train-num-samples", str(min(n, args.batch_size * args.steps))]
    cmd = [
        sys.executable, "-m", "open_clip_train.main", "--model", f"local-dir:{oc_dir}", *data,
        "--batch-size", str(args.batch_size), "--precision", "amp_bf16" if args.precision == "bf16" else "fp32", "--epochs", "1",
        "--workers", str(args.workers), "--lr", "5e-4", "--wd", "0.1", "--warmup", "0", "--log-every-n-steps", "1",
        "--save-frequency", "0", "--logs", str(logs), "--name", f"run{time.time_ns()}", "--seed", "0",
        "--report-to", "",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    text = r.stdout + r.stderr
    sps = [float(x) for x in re.findall(r"Batch \(t\): [0-9.]+, ([0-9.]+)/s", text)]
    if r.returncode != 0 or not sps:
        raise SystemExit(f"open_clip_train failed:\n{text[-3000:]}")
    return median_after(sps, args.skip)


def memory_step(model, tok, batch: int, device) -> tuple[int, int]:
    """(activation bytes kept for the backward pass, peak allocated bytes on CUDA or 0) of one bf16 step."""
    import torch

    from vltool.losses import ClipLoss, LossInput
    from vltool.model import to_device

    size = model.config["preprocess"]["size"]
    x = torch.randn(batch, 3, size, size, device=device)
    t = to_device(tok(["a grinning face with big eyes"] * batch), device)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set = set()
    kept = [0]

    def pack(tensor):
        st = tensor.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            kept[0] += st.nbytes()
        return tensor

    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), torch.autocast(device.type, dtype=torch.bfloat16):
        img, txt = model(x, t)
        loss = ClipLoss()(LossInput(img, txt, model.logit_scale.exp()))["loss"]
    loss.backward()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return kept[0], peak


def memory(args, device) -> None:
    """Activation memory with and without --grad-checkpointing, and the largest batch in a budget."""
    import torch

    from vltool.model import ModelSpec, create_model

    torch.manual_seed(0)
    model, tok = create_model(ModelSpec(arch=args.arch))
    model.to(device).train()
    n = sum(p.numel() for p in model.parameters())
    fixed = n * (4 + 4 + 8 + 2)  # fp32 weights, gradients, AdamW moments, bf16 copies under autocast
    budget = args.memory_budget_gb * 2**30
    sizes = (args.batch_size, 2 * args.batch_size)
    print(f"arch {args.arch}, {n / 1e6:.1f}M parameters, bf16 autocast, device {device_name(device)}; "
          f"fixed memory {fixed / 2**20:.0f} MiB; budget {args.memory_budget_gb} GiB")
    print("| grad checkpointing | batch | activations kept (MiB) | per sample (MiB) | CUDA peak (MiB) | largest batch in budget |")
    print("|---|---|---|---|---|---|")
    for ckpt in (False, True):
        model.set_grad_checkpointing(ckpt)
        got = [memory_step(model, tok, b, device) for b in sizes]
        per = (got[1][0] - got[0][0]) / (sizes[1] - sizes[0])
        base = got[0][0] - per * sizes[0]
        largest = int((budget - fixed - base) // per) if per > 0 else None
        for b, (kept, peak) in zip(sizes, got):
            print(f"| {'yes' if ckpt else 'no'} | {b} | {kept / 2**20:.1f} | {per / 2**20:.2f} | "
                  f"{peak / 2**20:.0f} | {largest} |" if device.type == "cuda" else
                  f"| {'yes' if ckpt else 'no'} | {b} | {kept / 2**20:.1f} | {per / 2**20:.2f} | - | {largest} |")
    print("(the recomputation holds one block's activations at a time on top of these during the backward pass)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="vltool-small")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3, help="runs of each trainer, alternating")
    ap.add_argument("--skip", type=int, default=3, help="first steps of a run left out (warm-up)")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--warmup-runs", type=int, default=1, help="unmeasured runs of each trainer first (file cache, imports)")
    ap.add_argument("--vltool-args", default="", help="extra options of vltool's runs only, e.g. '--compile'")
    ap.add_argument("--memory", action="store_true", help="measure activation memory with and without --grad-checkpointing instead")
    ap.add_argument("--memory-budget-gb", type=float, default=4.0, help="--memory: the budget the largest batch must fit")
    ap.add_argument("--precision", default="auto", choices=["auto", "no", "bf16"],
                    help="both trainers' precision; auto: bf16 where the device computes it natively, else no (float32)")
    ap.add_argument("--data", help="a folder of JPEG shards in img2dataset's layout (bench/photo_shards.py) to stream, for both trainers")
    ap.add_argument("--profile", action="store_true", help="one more vltool run under torch.profiler: its top kernels")
    args = ap.parse_args()
    import torch

    from vltool.pretrain.runtime import native_precision

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.precision == "auto":
        args.precision = native_precision(device.type)
    if args.memory:
        memory(args, device)
        return
    try:
        import braceexpand  # noqa: F401
        import webdataset  # noqa: F401
    except ImportError:
        raise SystemExit("open_clip_train needs webdataset and braceexpand: pip install webdataset braceexpand")

    work = Path(tempfile.mkdtemp(prefix="bench_pretrain_"))
    try:
        data, csv_path, oc_dir = prepare(work, args.arch, args.batch_size * args.steps)
        if args.data:
            data = shard_pattern(Path(args.data))[0]
        print(f"arch {args.arch}, batch {args.batch_size}, {args.steps} steps, precision {args.precision}, {args.workers} workers, "
              f"data {args.data or 'emoji train rows (PNG)'}, "
              f"device {device_name(device)}, {args.runs} alternating runs each after {args.warmup_runs} warm-up"
              + (f"; vltool with {args.vltool_args}" if args.vltool_args else ""), flush=True)
        for _ in range(args.warmup_runs):  # the first run of a trainer pays for cold caches: not measured
            run_vltool(data, work / "vl_run", args)
            run_open_clip(csv_path, oc_dir, work / "oc_logs", args)
        vl, oc, waits = [], [], []
        for k in range(args.runs):
            vl.append(run_vltool(data, work / "vl_run", args, waits))
            print(f"  run {k + 1}: vltool    {vl[-1]:8.1f} samples/s  (waiting for data {100 * waits[-1]:4.1f}% of the time)", flush=True)
            oc.append(run_open_clip(csv_path, oc_dir, work / "oc_logs", args))
            print(f"  run {k + 1}: open_clip {oc[-1]:8.1f} samples/s", flush=True)
        bf16 = args.precision == "bf16"
        fps = flops_per_sample(args.arch, args.batch_size, device, bf16)
        peak = matmul_peak_bf16(device, dtype=torch.bfloat16 if bf16 else torch.float32)
        mv, mo = statistics.median(vl), statistics.median(oc)
        print(f"vltool pretrain     median {mv:8.1f} samples/s  {mv * fps / 1e9:9.1f} GFLOP/s  MFU {100 * mv * fps / peak:5.1f}%")
        print(f"open_clip_train     median {mo:8.1f} samples/s  {mo * fps / 1e9:9.1f} GFLOP/s  MFU {100 * mo * fps / peak:5.1f}%")
        print(f"ratio vltool / open_clip: {mv / mo:.3f}")
        print(f"model: {fps / 1e9:.3f} GFLOP per training sample; measured {'bf16' if bf16 else 'float32'} matmul peak {peak / 1e9:.1f} GFLOP/s")
        print(f"vltool's steps waited for data {100 * statistics.median(waits):.1f}% of their wall time (median over runs)")
        if args.profile:
            profile_vltool(data, work / "vl_profile", args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
