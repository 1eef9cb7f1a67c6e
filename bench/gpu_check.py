"""The prepared GPU check (issue 51): every vltool command that uses a device, run on the GPU and on the CPU
from the same inputs and compared within stated tolerances; the pinned, non-blocking data path; the data path
with many workers; and bench_pretrain's ViT-B-32 from JPEG shards against open_clip_train. One call, under 8
minutes on one H100/H200 with 16 cores; its outputs go to OUT (commit them to results/gpu-check/).

    python bench/gpu_check.py --prepare .gpu_check          # on CPU: shards, models (and, with --wheels, the wheels)
    python bench/gpu_check.py --inputs .gpu_check --out "$OUT/gpu-check"        # on the GPU machine
    python bench/gpu_check.py --dry-run --out /tmp/gpu-check   # on CPU: the same stages, tiny, CPU against CPU

The dry run (CI runs it: tests/test_gpu_check.py) exercises every stage on tiny inputs with the "GPU" side
also on the CPU, so the script cannot rot between the sessions that are lent a GPU. A stage that fails is
recorded with its error and the check goes on; the exit status is 1 when any stage failed.

The CPU side of each comparison runs the same command with CUDA_VISIBLE_DEVICES="" (every command then
encodes or trains on the CPU). Tolerances: training losses of the first steps within 2% (TF32 matmuls on
the GPU), evaluation metrics within 1.5 points (a few near-tied examples may flip between float32 on two
devices), mined positives and pseudo-labels agreeing on at least 97% of rows, debias' numbers within 0.02.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

LOSS_REL = 0.02
METRIC_ABS = 1.5
AGREE = 0.97
DEBIAS_ABS = 0.02
OBJECTIVES = [("clip", []), ("sigmoid", []), ("jsd", []), ("simclr", ["--augment", "simclr"]), ("memory-bank", ["--memory-bank", "64"])]


class Check:
    def __init__(self, out: Path, dry: bool):
        self.out, self.dry = out, dry
        self.results: list[dict] = []
        self.log = open(out / "log.txt", "a")

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def stage(self, name: str, fn, *args) -> None:
        t = time.perf_counter()
        self.say(f"== {name}")
        try:
            detail = fn(*args) or {}
            ok = detail.pop("ok", True)
        except Exception as e:  # a stage's failure is recorded, the check goes on
            ok, detail = False, {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        detail.update(stage=name, ok=ok, seconds=round(time.perf_counter() - t, 2))
        self.results.append(detail)
        self.say(f"   {'ok' if ok else 'FAILED'} in {detail['seconds']} s" + (f": {detail.get('error')}" if not ok else ""))
        self.write()

    def write(self) -> None:
        (self.out / "gpu-check.json").write_text(json.dumps({"dry_run": self.dry, "environment": environment(), "stages": self.results}, indent=1))

    def vltool(self, args: list, cpu: bool, cwd: Path) -> subprocess.CompletedProcess:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        cmd = [sys.executable, "-m", "vltool", *map(str, args)]
        self.log.write(("CPU: " if cpu else "GPU: ") + " ".join(cmd) + "\n")
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"`vltool {' '.join(map(str, args[:2]))} ...` failed ({'CPU' if cpu else 'GPU'}): {r.stderr.strip().splitlines()[-1:]}")
        return r

    def both(self, make_args, work: Path) -> tuple[Path, Path]:
        """Run a command on the GPU side and the CPU side; `make_args(dir)` gives its arguments for an output dir."""
        gpu, cpu = work / "gpu", work / "cpu"
        gpu.mkdir(parents=True, exist_ok=True)
        self.vltool(make_args(gpu), self.dry, REPO)
        if self.dry:  # both sides would be the CPU: the one run stands for both (the comparison still runs)
            shutil.copytree(gpu, cpu, dirs_exist_ok=True)
        else:
            cpu.mkdir(parents=True, exist_ok=True)
            self.vltool(make_args(cpu), True, REPO)
        return gpu, cpu


def environment() -> dict:
    import platform

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def numbers(x, prefix="") -> dict:
    """Every numeric leaf of a JSON value, by dotted path."""
    if isinstance(x, bool):
        return {}
    if isinstance(x, (int, float)):
        return {prefix: float(x)}
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in numbers(val, f"{prefix}.{key}" if prefix else str(key)).items()}
    return {}


def compare_metrics(gpu: Path, cpu: Path, name: str, keys: tuple, tol: float) -> dict:
    """The metrics under `keys` of two results JSONs: the largest absolute difference, within `tol`."""
    a, b = (json.loads((d / name).read_text()) for d in (gpu, cpu))
    worst, where, compared = 0.0, None, 0
    for key in keys:
        na, nb = numbers(a.get(key, {})), numbers(b.get(key, {}))
        for k in na.keys() & nb.keys():
            if k.endswith(("seconds", "per_s", "_s")):
                continue
            compared += 1
            d = abs(na[k] - nb[k])
            if d > worst:
                worst, where = d, f"{key}.{k}"
    if compared == 0:
        raise RuntimeError(f"{name}: no metric under {keys} to compare")
    return {"ok": worst <= tol, "compared": compared, "max_abs_difference": round(worst, 6), "at": where, "tolerance": tol}


# ---- preparation (CPU)


def prepare(inputs: Path, shards_n: int, short_side: int, wheels: bool, per_shard: int = 64) -> None:
    """Inputs of the check: JPEG shards of photographs (bench/photo_shards.py) and, with `wheels`, the wheels
    the device image lacks (its image has torch, torchvision, transformers, accelerate and timm)."""
    from photo_shards import DEFAULT_PHOTO_DIRS, build_photo_shards

    inputs.mkdir(parents=True, exist_ok=True)
    dest = inputs / "shards"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    try:
        built = build_photo_shards(DEFAULT_PHOTO_DIRS, inputs / ".photo-cache", short_side, shards_n, per_shard, 0)
        for k, path in enumerate(built):
            shutil.copyfile(path, dest / f"{k:05d}.tar")
        made = "photographs"
    except SystemExit:  # no photographs on this machine (CI): textured stand-ins, the same layout
        synthetic_shards(dest, short_side, shards_n, per_shard)
        made = "synthetic textures (no photographs found: apt-get install gnome-backgrounds mate-backgrounds ukui-wallpapers)"
    shutil.rmtree(inputs / ".photo-cache", ignore_errors=True)
    (inputs / "shards.json").write_text(json.dumps({"samples": shards_n, "short_side": short_side, "from": made}))
    if wheels:
        need = ["datasets", "open_clip_torch", "open_clip_train", "webdataset", "braceexpand", "faiss-cpu", "typer", "rich"]
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(inputs / "wheels"), *need], check=True)
    print(f"prepared {inputs}: carry it to the device (run's carry) with the working tree")


def synthetic_shards(dest: Path, short_side: int, n: int, per_shard: int) -> None:
    """img2dataset-layout shards of smoothed-noise JPEGs (4:3, `short_side` px), for a machine without photos."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(0)
    for s in range(0, n, per_shard):
        with tarfile.open(dest / f"{s // per_shard:05d}.tar", "w") as tar:
            for i in range(s, min(n, s + per_shard)):
                a = rng.integers(0, 256, (short_side, short_side * 4 // 3, 3), dtype=np.uint8)
                buf = io.BytesIO()
                Image.fromarray(a).filter(ImageFilter.GaussianBlur(3)).save(buf, "JPEG", quality=90)
                cap = f"a textured picture number {i}"
                for ext, data in (("jpg", buf.getvalue()), ("txt", cap.encode()), ("json", json.dumps({"key": f"{i:08d}", "caption": cap}).encode())):
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def install_wheels(inputs: Path) -> dict:
    wheels = inputs / "wheels"
    if not wheels.is_dir():
        return {"installed": "nothing (no wheels folder)"}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--find-links", str(wheels),
                        *[str(w) for w in sorted(wheels.glob("*.whl"))]], capture_output=True, text=True)
    r2 = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", str(REPO)], capture_output=True, text=True)
    return {"ok": r.returncode == 0 and r2.returncode == 0, "pip": (r.stdout + r.stderr)[-1500:] + (r2.stdout + r2.stderr)[-500:]}


# ---- stages


def stage_base_model(check: Check, work: Path, arch: str, steps: int) -> dict:
    """The model the evaluation commands evaluate: `arch` trained on the emoji train rows (on the GPU side)."""
    r = check.vltool(["pretrain", "emoji", "--where", "split=train", "--out", work / "base", "--arch", arch, "--steps", steps,
                      "--batch-size", 32, "--lr", "1e-3", "--no-progress", "--overwrite", "--augment", "none", "--precision", "no"],
                     check.dry, REPO)
    return {"model": str(work / "base"), "stdout": r.stdout[-300:]}


def stage_objectives(check: Check, work: Path, arch: str, steps: int) -> dict:
    """Each objective for a few steps on both sides: the first steps' losses within LOSS_REL."""
    out = {"objectives": {}}
    ok = True
    for name, extra in OBJECTIVES:
        loss = ["--loss", name] if name != "memory-bank" else []
        d = work / name
        gpu, cpu = check.both(lambda o: ["pretrain", "emoji", "--where", "split=train", "--out", o / "run", "--arch", arch, "--steps", steps,
                                         "--batch-size", 16, "--lr", "1e-3", "--no-progress", "--overwrite", "--augment", "none",
                                         "--precision", "no", "--log-every", 1, *loss, *extra], d)
        la, lb = (losses(x / "run") for x in (gpu, cpu))
        rel = max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(la, lb))
        out["objectives"][name] = {"gpu": la, "cpu": lb, "max_rel": round(rel, 6)}
        ok &= rel <= LOSS_REL and len(la) == len(lb) > 0
    out["ok"], out["tolerance"] = ok, LOSS_REL
    return out


def stage_compile(check: Check, work: Path, arch: str, steps: int) -> dict:
    """--compile on the GPU side against eager: the same first losses within LOSS_REL."""
    if check.dry:  # torch.compile on a CPU takes minutes: the dry run leaves it to the GPU
        return {"skipped": "dry run"}
    runs = {}
    for mode, extra in (("eager", []), ("compiled", ["--compile"])):
        check.vltool(["pretrain", "emoji", "--where", "split=train", "--out", work / mode, "--arch", arch, "--steps", steps, "--batch-size", 16,
                      "--lr", "1e-3", "--no-progress", "--overwrite", "--augment", "none", "--precision", "no", "--log-every", 1, *extra],
                     check.dry, REPO)
        runs[mode] = losses(work / mode)
    rel = max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(runs["compiled"], runs["eager"]))
    return {"ok": rel <= LOSS_REL, "losses": runs, "max_rel": round(rel, 6)}


def losses(run: Path) -> list[float]:
    return [m["loss"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if m.get("kind") == "train"]


def stage_eval(check: Check, work: Path, model: Path, command: str, extra: list, keys: tuple) -> dict:
    gpu, cpu = check.both(lambda o: [command, "emoji", "--where", "split=test", "--model", model, *extra, "--out", o / "out.json", "--overwrite"], work)
    return compare_metrics(gpu, cpu, "out.json", keys, METRIC_ABS)


def stage_probe(check: Check, work: Path, model: Path) -> dict:
    gpu, cpu = check.both(lambda o: ["probe", "emoji", "--where", "split=train", "--eval-data", "emoji", "--eval-where", "split=test",
                                     "--model", model, "--out", o / "out.json", "--overwrite"], work)
    return compare_metrics(gpu, cpu, "out.json", ("metrics",), METRIC_ABS)


def stage_mine(check: Check, work: Path, model: Path) -> dict:
    """mine-positives --index blocked on both sides: the positives agree on AGREE of the rows."""
    gpu, cpu = check.both(lambda o: ["mine-positives", "emoji", "--where", "split=train", "--model", model, "--index", "blocked",
                                     "--out", o / "mined", "--overwrite"], work)
    from vltool.io import load_dataset

    a, b = (load_dataset(str(d / "mined")).dataset for d in (gpu, cpu))
    col = [c for c in a.column_names if "positive" in c][0]
    same = sum(x == y for x, y in zip(a[col], b[col])) / max(len(a), 1)
    return {"ok": same >= AGREE and len(a) == len(b), "column": col, "agreement": round(same, 4), "rows": len(a)}


def stage_pseudolabel(check: Check, work: Path, model: Path) -> dict:
    """pseudolabel (the train rows halved by base_id: one half aligned, the other labelled) on both sides:
    the pseudo captions agree on AGREE of the rows."""
    halves = work / "halves"
    check.vltool(["split", "emoji", "--where", "split=train", "--by", "base_id", "--parts", "a=0.5,b=0.5", "--separate", "--seed", 0,
                  "--out", halves, "--overwrite"], True, REPO)
    gpu, cpu = check.both(lambda o: ["pseudolabel", halves / "b", "--aligned", halves / "a", "--model", model, "--out", o / "labelled",
                                     "--overwrite"], work)
    from vltool.io import load_dataset

    a, b = (load_dataset(str(d / "labelled")).dataset for d in (gpu, cpu))
    same = sum(x == y for x, y in zip(a["caption"], b["caption"])) / max(len(a), 1)
    return {"ok": same >= AGREE and len(a) == len(b), "agreement": round(same, 4), "rows": len(a)}


def stage_debias(check: Check, work: Path, model: Path) -> dict:
    gpu, cpu = check.both(lambda o: ["debias", "--model", model, "--out", o / "gender", "--overwrite"], work)
    a, b = (numbers(json.loads((d / "gender" / "vltool.json").read_text()).get("stats", {})) for d in (gpu, cpu))
    keys = [k for k in a.keys() & b.keys() if not k.endswith(("seconds", "_s"))]
    worst = max((abs(a[k] - b[k]) for k in keys), default=0.0)
    return {"ok": worst <= DEBIAS_ABS and bool(keys), "compared": len(keys), "max_abs_difference": round(worst, 6)}


def stage_pinned(check: Check, shards: Path) -> dict:
    """The trainer's shard batches on this machine's device: images uint8 and pinned (CUDA), copied
    non-blocking, normalised on the device equal to normalising on the CPU."""
    import torch

    from vltool.model.create import ModelSpec, create_model
    from vltool.pretrain.data import Collate, PairDataset, ShardStream, stream_micro_batches
    from vltool.transforms import train_pixels

    cuda = torch.cuda.is_available() and not check.dry
    _, tok = create_model(ModelSpec(arch="vltool-micro"))
    pp = {"size": 224, "mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic"}
    pixels = train_pixels(pp, "clip")
    pairs = PairDataset(None, "caption", None, pixels, 0)
    paths = sorted(str(p) for p in Path(shards).glob("*.tar"))
    stream = ShardStream(paths, pairs.item, "caption", 1, 0, [64, 64], 0, 100, collate=Collate(tok))
    batch = next(stream_micro_batches(stream, 2, pin=cuda))
    x = batch["images"]
    out = {"dtype": str(x.dtype), "shape": list(x.shape), "pinned": bool(x.is_pinned()) if cuda else None}
    device = torch.device("cuda" if cuda else "cpu")
    y = pixels.normalise(x.to(device, non_blocking=True))
    ref = pixels.normalise(x.clone())
    out["normalised_equal_cpu"] = bool(torch.equal(y.cpu(), ref))
    out["ok"] = x.dtype == torch.uint8 and (out["pinned"] is not False) and out["normalised_equal_cpu"]
    return out


def stage_workers(check: Check, work: Path, shards: str, arch: str, steps: int, workers: int, batch: int) -> dict:
    """pretrain on the JPEG shards with many workers: samples/s and the share of time waiting for data."""
    check.vltool(["pretrain", shards, "--out", work / "run", "--arch", arch, "--steps", steps, "--batch-size", batch, "--workers", workers,
                  "--augment", "clip", "--log-every", 5, "--no-progress", "--overwrite", "--checkpoint-every", 10**9], check.dry, REPO)
    train = [m for m in map(json.loads, (work / "run" / "metrics.jsonl").read_text().splitlines()) if m.get("kind") == "train"]
    tail = train[1:] or train
    return {"workers": workers, "batch": batch, "samples_per_s": [m["samples_per_s"] for m in tail],
            "data_wait_share": [m.get("data_wait_share") for m in tail]}


def stage_decode_gpu(check: Check, work: Path, shards: str, arch: str, steps: int, workers: int, batch: int) -> dict:
    """--decode gpu (nvjpeg) against --decode cpu from the same shards: the first losses within LOSS_REL (nvjpeg's
    IDCT differs from libjpeg-turbo's by a level here and there); on a CPU (the dry run) it must be refused."""
    args = ["pretrain", shards, "--arch", arch, "--steps", steps, "--batch-size", batch, "--workers", workers, "--augment", "clip",
            "--log-every", 1, "--no-progress", "--overwrite", "--checkpoint-every", 10**9, "--precision", "no"]
    if check.dry:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        r = subprocess.run([sys.executable, "-m", "vltool", *map(str, args), "--out", str(work / "gpu"), "--decode", "gpu"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=300)
        return {"ok": r.returncode == 2 and "--decode gpu" in r.stderr, "refused_on_cpu": r.stderr.strip().splitlines()[-1:]}
    runs = {}
    for decode in ("cpu", "gpu"):
        check.vltool([*args, "--out", work / decode, "--decode", decode], False, REPO)
        runs[decode] = losses(work / decode)
    rel = max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(runs["gpu"], runs["cpu"]))
    train = [m for m in map(json.loads, (work / "gpu" / "metrics.jsonl").read_text().splitlines()) if m.get("kind") == "train"]
    return {"ok": rel <= LOSS_REL, "losses": runs, "max_rel": round(rel, 6), "samples_per_s": [m["samples_per_s"] for m in train[-3:]]}


def stage_bench_pretrain(check: Check, shards: Path, arch: str, batch: int, workers: int, steps: int, extra: str = "") -> dict:
    precision = "no" if check.dry else "bf16"
    cmd = [sys.executable, str(REPO / "bench" / "bench_pretrain.py"), "--arch", arch, "--data", str(shards), "--batch-size", str(batch),
           "--workers", str(workers), "--steps", str(steps), "--runs", "1", "--warmup-runs", "0", "--skip", str(min(5, steps // 2)),
           "--precision", precision, *(["--vltool-args", extra] if extra else [])]
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if check.dry else {})}
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    check.say(r.stdout[-2500:])
    return {"ok": r.returncode == 0, "printed": r.stdout[-4000:], "stderr": r.stderr[-1500:] if r.returncode else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="where gpu-check.json and log.txt go")
    ap.add_argument("--inputs", type=Path, help="what --prepare made (shards, wheels)")
    ap.add_argument("--prepare", type=Path, help="make the inputs here (on CPU) and stop")
    ap.add_argument("--wheels", action="store_true", help="--prepare: also download the wheels the device image lacks")
    ap.add_argument("--dry-run", action="store_true", help="every stage, tiny, with the GPU side on the CPU too")
    args = ap.parse_args()
    if args.prepare:
        prepare(args.prepare, 64 if args.dry_run else 1024, 256, args.wheels, 16 if args.dry_run else 64)
        return
    if args.out is None:
        raise SystemExit("give --out")
    out = args.out
    if out.exists() and any(out.iterdir()):  # only an earlier check's own output is replaced
        if not (out / "gpu-check.json").is_file():
            raise SystemExit(f"--out {out} exists and is not an earlier gpu check's output; choose another folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    check = Check(out, args.dry_run)
    dry = args.dry_run
    inputs = args.inputs or (out / "inputs")
    if args.inputs is None:
        prepare(inputs, 64 if dry else 1024, 256, False, 16 if dry else 64)
    elif not dry:
        check.stage("install the carried wheels", install_wheels, inputs)
    shards = inputs / "shards"
    steps = 3
    micro = "vltool-micro"
    check.stage("base model", stage_base_model, check, work / "base", micro, 20)
    model = work / "base" / "base"
    check.stage("pretrain: every objective, GPU against CPU", stage_objectives, check, work / "objectives", micro, steps)
    check.stage("pretrain --compile against eager", stage_compile, check, work / "compile", micro, steps)
    check.stage("zeroshot", stage_eval, check, work / "zeroshot", model, "zeroshot", [], ("metrics",))
    check.stage("retrieve", stage_eval, check, work / "retrieve", model, "retrieve", [], ("metrics",))
    check.stage("probe", stage_probe, check, work / "probe", model)
    check.stage("mine-positives --index blocked", stage_mine, check, work / "mine", model)
    check.stage("pseudolabel", stage_pseudolabel, check, work / "pseudolabel", model)
    check.stage("debias", stage_debias, check, work / "debias", model)
    check.stage("pinned, non-blocking shard batches", stage_pinned, check, shards)
    check.stage("data path, many workers", stage_workers, check, work / "workers", str(shards), micro if dry else "ViT-B-32",
                4 if dry else 60, 2 if dry else 14, 16 if dry else 256)
    check.stage("pretrain --decode gpu against --decode cpu", stage_decode_gpu, check, work / "decode", str(shards), micro,
                steps, 2, 16)
    check.stage("bench_pretrain ViT-B-32 from JPEG shards against open_clip_train", stage_bench_pretrain, check, shards,
                micro if dry else "ViT-B-32", 16 if dry else 256, 2 if dry else 14, 4 if dry else 100)
    if not dry:
        check.stage("bench_pretrain ViT-B-32, --decode gpu", stage_bench_pretrain, check, shards, "ViT-B-32", 256, 14, 100, "--decode gpu")
    shutil.rmtree(work, ignore_errors=True)
    failed = [r["stage"] for r in check.results if not r["ok"]]
    check.say(f"gpu check: {len(check.results) - len(failed)} stage(s) ok, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
