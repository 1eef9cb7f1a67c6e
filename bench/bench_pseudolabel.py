"""Benchmark: `vltool pseudolabel` (issue 8).

1. Images per second of pseudo-labelling on CPU with a small model (`vltool-tiny`, random weights: speed
   does not depend on them), 5 crops per image, on emoji training images against the other emoji's captions.
2. The caption search alone: 20,000 query views against 200,000 caption embeddings (512-d), 10 neighbours
   each, exact faiss inner-product search: time and peak memory (max RSS of a fresh process).

    python bench/bench_pseudolabel.py
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def search_only(queries: int, captions: int, dim: int = 512, k: int = 10) -> dict:
    import faiss
    import numpy as np

    rng = np.random.default_rng(0)
    t = rng.normal(size=(captions, dim)).astype(np.float32)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    q = rng.normal(size=(queries, dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    start = time.perf_counter()
    index = faiss.IndexFlatIP(dim)
    index.add(t)
    _, nn = index.search(q, k)
    secs = time.perf_counter() - start
    return {"queries": queries, "captions": captions, "dim": dim, "k": k, "seconds": round(secs, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def end_to_end(images: int, crops: int) -> dict:
    import torch

    from vltool.model import ModelSpec, create_model, save_model
    from vltool.pseudolabel import PseudolabelConfig, pseudolabel
    from vltool.split import SplitConfig, split

    work = Path(tempfile.mkdtemp(prefix="bench_pl_"))
    torch.manual_seed(0)
    model, tok = create_model(ModelSpec(arch="vltool-tiny"))
    save_model(model, tok, work / "run" / "model")
    split("emoji", work / "halves", SplitConfig(parts="aligned=0.5,unaligned=0.5", by="base_id", separate=True), where=["split=train"])
    cfg = PseudolabelConfig(model=str(work / "run"), crops=crops, cache_dir=str(work / "cache"))
    start = time.perf_counter()
    prov = pseudolabel(str(work / "halves" / "unaligned"), str(work / "halves" / "aligned"), work / "out", cfg)
    secs = time.perf_counter() - start
    n = prov["rows_in"]
    return {"images": n, "crops": crops, "seconds": round(secs, 2), "images_per_s": round(n / secs, 1),
            "views_per_s": round(n * crops / secs, 1), "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crops", type=int, default=5)
    ap.add_argument("--part", choices=["all", "e2e", "search"], default="all")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one == "search":
        print(json.dumps(search_only(20_000, 200_000)))
        return
    if args.part in ("all", "e2e"):
        r = end_to_end(0, args.crops)
        print(f"pseudolabel, vltool-tiny on CPU: {r['images']:,} images x {r['crops']} crops in {r['seconds']:.1f}s "
              f"= {r['images_per_s']:.1f} images/s ({r['views_per_s']:.1f} views/s)")
        print(json.dumps(r))
    if args.part in ("all", "search"):
        out = subprocess.run([sys.executable, __file__, "--one", "search"], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"caption search alone: {r['queries']:,} views x {r['captions']:,} captions ({r['dim']}-d, k={r['k']}): "
              f"{r['seconds']:.2f}s, peak RSS {r['peak_rss_mb']:.0f} MB")
        print(json.dumps(r))


if __name__ == "__main__":
    main()
