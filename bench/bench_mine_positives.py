"""Benchmark: FFF positive mining on precomputed 512-d embeddings (issue 7).

- 5,000 rows: the result equals a dense brute-force computation of M (equation 1).
- 20,000 rows: exact mining end to end; target 60 s or less on 2 cores.
- 100,000 rows: exact and IVF times, IVF's recall against exact (target >= 0.95).
- At every size, `--index blocked` (torch matmul tiles, on the CPU here) timed against the exact faiss
  search, alternately, `--rounds` times each (best of each), with the ratio flat / blocked; both must
  mine the same pairs.
Each size runs in a fresh process so its peak memory (max RSS) is its own.

    python bench/bench_mine_positives.py              # all three sizes
    python bench/bench_mine_positives.py --sizes 5000,20000
    python bench/bench_mine_positives.py --sizes 20000 --dim 32 --rounds 2    # bench_scale's model width
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np


def embeddings(n: int, d: int = 512, seed: int = 0):
    """Clustered image/text embeddings with near-duplicate images and repeated generic captions."""
    rng = np.random.default_rng(seed)
    k = max(10, n // 50)
    centers = rng.normal(size=(k, d)).astype(np.float32)
    lab = rng.integers(0, k, size=n)
    img = centers[lab] + 1.1 * rng.normal(size=(n, d)).astype(np.float32)
    dup = rng.random(n) < 0.05  # 5% near-duplicates of the previous image
    img[1:][dup[1:]] = img[:-1][dup[1:]] + 0.1 * rng.normal(size=(int(dup[1:].sum()), d)).astype(np.float32)
    txt = centers[lab] + 1.3 * rng.normal(size=(n, d)).astype(np.float32)
    generic = rng.normal(size=(5, d)).astype(np.float32)
    g = rng.random(n) < 0.02  # 2% generic captions ("a picture"), identical across rows
    txt[g] = generic[rng.integers(0, 5, size=int(g.sum()))] + 0.5 * centers[lab[g]]
    return img, txt


def thresholds():
    from vltool.mine_positives import Thresholds

    # thresholds for this synthetic model: true pairs have S_it about 0.4
    return Thresholds(p_it=0.5, p_ii=0.9, p_tt=0.97, p_it_tt=0.42)


def run_size(n: int, rounds: int = 1, dim: int = 512) -> dict:
    from vltool.mine_positives import dense_reference, mine, summarise

    img, txt = embeddings(n, dim)
    th = thresholds()
    out: dict = {"rows": n, "dim": dim}
    times: dict[str, list] = {"flat": [], "blocked": []}
    for _ in range(rounds):
        for index in ("flat", "blocked"):
            t = time.perf_counter()
            got = mine(img, txt, thresholds=th, index=index)
            times[index].append(round(time.perf_counter() - t, 2))
            if index == "flat":
                exact = got
            else:
                blocked = got
    out["exact_s"], out["blocked_s"] = min(times["flat"]), min(times["blocked"])
    out["flat_times"], out["blocked_times"] = times["flat"], times["blocked"]
    out["blocked_same_pairs"] = bool(np.array_equal(exact.offsets, blocked.offsets) and np.array_equal(exact.rows, blocked.rows))
    s = summarise(exact, n)
    out.update(pairs=s["pairs"], rows_with_positives=s["rows_with_positives"], rows_capped=s["rows_capped"])
    if n <= 5000:
        dense = dense_reference(img, txt, thresholds=th)
        got = np.zeros_like(dense)
        for i, p in enumerate(exact.positives):
            got[i, p] = True
        # the cap (256) may cut rows; compare only uncapped rows
        rows = [i for i, p in enumerate(exact.positives) if len(p) < 256]
        out["equals_dense"] = bool((got[rows] == dense[rows]).all())
    if n >= 100_000:
        t = time.perf_counter()
        approx = mine(img, txt, thresholds=th, index="ivf")
        out["ivf_s"] = round(time.perf_counter() - t, 2)
        e = sum(len(p) for p in exact.positives)
        hit = sum(len(np.intersect1d(a, b)) for a, b in zip(exact.positives, approx.positives))  # over every row
        out["ivf_recall"] = round(hit / max(e, 1), 4)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5000,20000,100000")
    ap.add_argument("--dim", type=int, default=512, help="embedding width")
    ap.add_argument("--rounds", type=int, default=1, help="flat and blocked searches each, alternating")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_size(args.one, args.rounds, args.dim)))
        return
    for n in [int(x) for x in args.sizes.split(",")]:
        r = subprocess.run([sys.executable, __file__, "--one", str(n), "--dim", str(args.dim), "--rounds", str(args.rounds)],
                           capture_output=True, text=True, check=True)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        line = f"{n:>7,} rows: exact {res['exact_s']:>7.2f}s  pairs {res['pairs']:>9,}  peak {res['peak_rss_mb']:>7.0f} MB"
        if "equals_dense" in res:
            line += f"  equals dense M: {res['equals_dense']}"
        if n == 20000:
            line += f"  (target <= 60 s: {'met' if res['exact_s'] <= 60 else 'NOT met'})"
        line += (f"\n{'':>13}blocked {res['blocked_s']:>7.2f}s  flat/blocked {res['exact_s'] / res['blocked_s']:.2f}x"
                 f"  same pairs: {res['blocked_same_pairs']}  (flat {res['flat_times']}, blocked {res['blocked_times']})")
        if "ivf_s" in res:
            line += f"  ivf {res['ivf_s']:.2f}s recall {res['ivf_recall']:.4f} (target >= 0.95)  exact/ivf time ratio {res['exact_s'] / res['ivf_s']:.2f}x"
        print(line, flush=True)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
