"""Start-up: each short command's wall and CPU time on a tiny input, against its baseline, alternating.

    python bench/bench_startup.py [--rounds 3] [--work DIR]

Baselines (the targets of issue 54): `vltool zeroshot` on a vltool-tiny run over 64 rows against
`python -c "import torch"` (issue 54's target <= 1.3x, which no command reading a saved dataset can meet: the
libraries it must import, torch + torchvision + datasets, take about 2.4x `import torch` on their own, torchvision's
import alone pulling in torch._dynamo) and against that floor, `python -c "import torch, torchvision, datasets"`
(no target: the figure is what vltool itself adds, its model load, tokenizer and the encoding included);
`vltool deform --ops shuffle` on 1,000 rows against
`python -c "import datasets"` (target <= +0.5 s); `vltool --help` and `--version` against
`python -c "import typer, rich"` (target <= +0.2 s). Each round runs a command and then its baseline, so
both see the same machine load; the figures are medians over the rounds. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s of the child) of one run of argv; a failing run stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, argv))} failed:\n{r.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def prepare(work: Path) -> None:
    """A 64-row and a 1,000-row slice of the built-in emoji data, and a vltool-tiny run (2 steps)."""
    if (work / "run" / "model").exists():
        return
    code = (
        "import sys; from vltool.io.builtin import ASSETS; import datasets\n"
        "ds = datasets.load_from_disk(str(ASSETS / 'emoji'))\n"
        "ds.select(range(64)).save_to_disk(sys.argv[1] + '/rows64')\n"
        "ds.select(range(1000)).save_to_disk(sys.argv[1] + '/rows1000')\n"
    )
    subprocess.run([PY, "-c", code, str(work)], check=True, capture_output=True)
    subprocess.run([PY, "-m", "vltool", "pretrain", "emoji", "--where", "split=train", "--arch", "vltool-tiny", "--steps", "2",
                    "--batch-size", "8", "--out", str(work / "run"), "--no-progress"], check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None, help="Where the inputs are made (default: a temporary folder)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="vltool-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare(work)
    vl = [PY, "-m", "vltool"]
    # (name, command, baseline name, baseline, how the target compares: "x" ratio or "+" seconds, target)
    cases = [
        ("zeroshot, vltool-tiny, 64 rows", vl + ["zeroshot", "rows64", "--model", "run", "--bootstrap", "0", "--cache-dir", "cache-{k}"],
         "import torch", [PY, "-c", "import torch"], "x", 1.3),
        ("zeroshot, vltool-tiny, 64 rows", vl + ["zeroshot", "rows64", "--model", "run", "--bootstrap", "0", "--cache-dir", "cache-f{k}"],
         "torch+torchvision+ds", [PY, "-c", "import torch, torchvision, datasets"], "+", None),
        ("deform --ops shuffle, 1,000 rows", vl + ["deform", "rows1000", "--ops", "shuffle", "--out", "deformed-{k}"],
         "import datasets", [PY, "-c", "import datasets"], "+", 0.5),
        ("--help", vl + ["--help"], "import typer, rich", [PY, "-c", "import typer, rich"], "+", 0.2),
        ("--version", vl + ["--version"], "import typer, rich", [PY, "-c", "import typer, rich"], "+", 0.2),
    ]
    rows = [([], [], [], []) for _ in cases]
    for k in range(args.rounds):
        for row, (name, argv, _, base, _, _) in zip(rows, cases):
            w, c = timed([a.format(k=k) for a in argv], work)  # (an empty embedding cache and a new --out each round)
            bw, bc = timed(base, work)
            for lst, v in zip(row, (w, c, bw, bc)):
                lst.append(v)
    print(f"start-up on {os.cpu_count()} cores, {args.rounds} alternating rounds, medians (s); inputs in {work}")
    print(f"{'command':34} {'wall':>6} {'cpu':>6} | {'baseline':20} {'wall':>6} {'cpu':>6} | {'figure':>8} {'target':>8}")
    for row, (name, _, bname, _, kind, target) in zip(rows, cases):
        w, c, bw, bc = (statistics.median(v) for v in row)
        figure = f"{w / bw:.2f}x" if kind == "x" else f"+{w - bw:.2f}s"
        if target is None:
            verdict = f"{'-':>8} (the floor: what vltool adds)"
        else:
            met = (w / bw <= target) if kind == "x" else (w - bw <= target)
            verdict = f"{('<=' if kind == 'x' else '<=+') + str(target):>8} {'met' if met else 'NOT met'}"
        print(f"{name:34} {w:6.2f} {c:6.2f} | {bname:20} {bw:6.2f} {bc:6.2f} | {figure:>8} {verdict}")


if __name__ == "__main__":
    main()
