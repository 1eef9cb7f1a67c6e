"""Benchmark `vltool import` on generated WebDataset shards: rows per second and peak memory by size.

    python bench/bench_import.py                        # 10k, 100k and 300k rows
    python bench/bench_import.py --sizes 10000,100000 --num-proc 2

Each size gets its own shards (16x16 JPEGs, a caption and img2dataset-style .json per sample, 10,000
samples per shard) and its own `python -m vltool import` process. A sampler reads /proc every 50 ms
and keeps the peak over the import's process tree of:
- RSS: resident memory, including pages of memory-mapped Arrow files the process has touched (the
  kernel can drop these at any time, they are page cache);
- anon: anonymous memory (heap), what the import really holds. This should stay flat as rows grow.
Generation time is not counted. Nothing here is a test; it prints a table.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def make_shards(d: Path, n: int, shard_size: int, seed: int = 0) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pool = []  # 512 distinct noise images, reused: encoding is not what is measured
    for _ in range(512):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
        pool.append(buf.getvalue())
    d.mkdir(parents=True, exist_ok=True)
    words = ["red", "small", "dog", "cat", "on", "a", "table", "photo", "of", "the", "blue", "car"]

    def add(tar, name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    for s in range(-(-n // shard_size)):
        with tarfile.open(d / f"{s:05d}.tar", "w") as tar:
            for i in range(s * shard_size, min(n, (s + 1) * shard_size)):
                key = f"{s:05d}{i % shard_size:04d}"
                add(tar, f"{key}.jpg", pool[i % len(pool)])
                caption = " ".join(words[(i * 7 + k) % len(words)] for k in range(3 + i % 6))
                add(tar, f"{key}.txt", caption.encode())
                add(tar, f"{key}.json", json.dumps({"key": key, "url": f"http://example.invalid/{i}.jpg", "width": 16}).encode())


def _tree_pids(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def _memory_kb(pid: int) -> tuple[int, int]:
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
    except OSError:
        pass
    return rss, anon


def run_import(shards: Path, out: Path, num_proc: int) -> dict:
    cmd = [sys.executable, "-m", "vltool", "import", str(shards), "--out", str(out), "--num-proc", str(num_proc), "--json"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = {"rss": 0, "anon": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss = anon = 0
            for p in _tree_pids(proc.pid):
                r, a = _memory_kb(p)
                rss, anon = rss + r, anon + a
            peak["rss"], peak["anon"] = max(peak["rss"], rss), max(peak["anon"], anon)
            done.wait(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    stdout, _ = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"import failed (exit {proc.returncode})")
    stats = json.loads(stdout)
    return {"rows": stats["rows_out"], "seconds": seconds, "peak_rss_mb": peak["rss"] / 1024, "peak_anon_mb": peak["anon"] / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,300000", help="Comma-separated row counts.")
    ap.add_argument("--num-proc", type=int, default=1)
    ap.add_argument("--shard-size", type=int, default=10_000)
    ap.add_argument("--workdir", type=Path, default=None, help="Where shards and outputs go [default: a temporary directory].")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="vltool-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"vltool import: WebDataset shards of 16x16 JPEGs, {args.shard_size:,} per shard, --num-proc {args.num_proc}")
    print(f"{'rows':>9} {'shards':>7} {'seconds':>8} {'rows/s':>8} {'peak RSS MB':>12} {'peak anon MB':>13}", flush=True)
    try:
        for n in sizes:
            shards = work / f"shards_{n}"
            make_shards(shards, n, args.shard_size)
            r = run_import(shards, work / f"out_{n}", args.num_proc)
            assert r["rows"] == n, r
            print(
                f"{n:>9,} {-(-n // args.shard_size):>7} {r['seconds']:>8.1f} {n / r['seconds']:>8,.0f} "
                f"{r['peak_rss_mb']:>12.0f} {r['peak_anon_mb']:>13.0f}",
                flush=True,
            )
            shutil.rmtree(shards, ignore_errors=True)
            shutil.rmtree(work / f"out_{n}", ignore_errors=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
