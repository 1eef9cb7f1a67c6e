"""Benchmark: one forward + backward of each `vltool pretrain` objective on random features.

For global batch sizes 64 .. 4096 (random L2-normalised features, D = 256, requires_grad), prints the
wall time (median of --repeats) and the peak memory above the baseline of a fresh process (Linux VmHWM,
so one subprocess per cell). JSD's cost grows linearly with the batch (N positives + N negatives); the
others build an N x N (sigmoid with --captions-per-image k: N x kN; memory bank: N x K) similarity matrix.

    python bench/bench_losses.py                            # 64 .. 4096, every loss
    python bench/bench_losses.py --sizes 64 256 --losses jsd clip
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

LOSSES = ["clip", "sigmoid", "sigmoid-k4", "unicl", "jsd", "bank-8192", "simclr"]
SIZES = [64, 128, 256, 512, 1024, 2048, 4096]


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def worker(loss_name: str, n: int, dim: int, repeats: int) -> dict:
    import time

    import torch
    from torch.nn import functional as F

    from vltool.losses import LossInput, MemoryBankLoss, SigmoidLoss, build_loss, positive_mask

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    k = 4 if loss_name == "sigmoid-k4" else 1
    img = F.normalize(torch.randn(n, dim, generator=g), dim=-1).requires_grad_()
    txt = F.normalize(torch.randn(n * k, dim, generator=g), dim=-1).requires_grad_()
    scale = torch.tensor(10.0, requires_grad=True)
    bias = None
    extra = {}
    if loss_name.startswith("sigmoid"):
        loss = SigmoidLoss()
        bias = torch.tensor(-10.0, requires_grad=True)
        if k > 1:
            rows = torch.arange(n)
            extra["positive_mask"] = positive_mask(rows, rows.repeat_interleave(k))
    elif loss_name == "unicl":
        loss = build_loss("unicl")
        extra["label"] = torch.randint(0, max(2, n // 4), (n,), generator=g)  # ~4 rows per label
    elif loss_name.startswith("bank"):
        size = int(loss_name.split("-")[1])
        loss = MemoryBankLoss(size, dim)
        loss.enqueue(F.normalize(torch.randn(size, dim, generator=g), dim=-1), F.normalize(torch.randn(size, dim, generator=g), dim=-1),
                     torch.arange(size) + n)
        extra = {"image_keys": img.detach().clone(), "text_keys": txt.detach().clone(), "ids": torch.arange(n)}
    elif loss_name == "simclr":
        loss = build_loss("simclr")
        loss.build_head(dim)
    else:
        loss = build_loss(loss_name)
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = loss(LossInput(img, txt, scale, bias, extra=extra))["loss"]
        out.backward()
        times.append(time.perf_counter() - t0)
        img.grad = txt.grad = scale.grad = None
    peak = _status_kib("VmHWM")
    times.sort()
    return {"loss": loss_name, "n": n, "ms": 1000 * times[len(times) // 2], "peak_mib": max(0, peak - base) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    ap.add_argument("--losses", nargs="+", default=LOSSES, choices=LOSSES)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", nargs=2, metavar=("LOSS", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], int(a.worker[1]), a.dim, a.repeats)))
        return
    res = {}
    for name in a.losses:
        for n in a.sizes:
            r = subprocess.run([sys.executable, __file__, "--worker", name, str(n), "--dim", str(a.dim), "--repeats", str(a.repeats)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                res[name, n] = None
                print(f"{name} N={n}: failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            res[name, n] = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{name:>11} N={n:>5}: {res[name, n]['ms']:9.2f} ms  {res[name, n]['peak_mib']:8.1f} MiB", file=sys.stderr)
    print(f"\none forward+backward on random features (D={a.dim}, 1 thread; peak memory above the process baseline)")
    head = f"{'N':>6} " + " ".join(f"{n:>20}" for n in a.losses)
    print(head)
    print(f"{'':>6} " + " ".join(f"{'ms / MiB':>20}" for _ in a.losses))
    for n in a.sizes:
        cells = []
        for name in a.losses:
            r = res.get((name, n))
            cells.append(f"{'failed':>20}" if r is None else f"{r['ms']:>10.2f} / {r['peak_mib']:>7.1f}")
        print(f"{n:>6} " + " ".join(cells))
    print("\nsigmoid-k4: 4 captions per image (N x 4N logits); bank-8192: --memory-bank 8192 (N x 8192 per side); "
          "jsd: 2N dot products (linear in N).")


if __name__ == "__main__":
    main()
