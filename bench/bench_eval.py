"""Benchmark: `vltool zeroshot` end to end, its cache, and `retrieve`'s ranking at scale.

1. zeroshot: images/s of `vltool.zeroshot.zeroshot` (a fresh cache: load the model, decode, preprocess,
   encode, class prompts, metrics with 1,000 bootstrap resamples) against a plain PyTorch loop over the
   same data and model (load the model, decode with datasets, preprocess, encode in batches, class
   embeddings, top-1), measured in the same run; both must give the same top-1. Then the time of a second
   `zeroshot` run that hits the embedding cache. Targets (issue 5): ratio >= 1, cached run >= 10x faster.
2. retrieve: time and peak memory of the ranking pass, metrics and 1,000 bootstrap resamples on random
   512-d embeddings, 20,000 images against 100,000 captions (5 per image); the full similarity matrix
   would take 8 GB in float32. The ranking pass runs in torch (what `retrieve` uses, on the CPU here or
   `--device cuda`) and in plain numpy (its reference, `device=None`), alternately, `--rounds` times each;
   both must give the same counts. Prints the ratio numpy / torch.

    python bench/bench_eval.py                        # both parts: emoji (3,655 images), vltool-tiny
    python bench/bench_eval.py --part zeroshot --arch vltool-micro
    python bench/bench_eval.py --part retrieve --images 5000 --texts 25000    # quicker
    python bench/bench_eval.py --part retrieve --dim 32 --rounds 2    # bench_scale's vltool-micro width
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_model(out: Path, arch: str) -> Path:
    import torch

    from vltool.model import ModelSpec, create_model, save_model

    torch.manual_seed(0)
    model, tok = create_model(ModelSpec(arch=arch))
    save_model(model, tok, out / "model")
    return out


def plain_loop(model_dir: Path, data: str, batch_size: int) -> tuple[float, int]:
    """The obvious PyTorch evaluation: returns (top-1, images)."""
    import datasets
    import torch
    import torch.nn.functional as F

    from vltool.io import BUILTIN_DATASETS
    from vltool.model import load_model

    m = load_model(str(model_dir))
    ds = datasets.load_from_disk(str(BUILTIN_DATASETS.get(data, data)))
    names = ds.features["label"].names
    with torch.no_grad():
        cls = F.normalize(m.encode_text(m.tokenize([f"a photo of a {c}." for c in names])), dim=-1)  # (C, D)
        correct = 0
        for a in range(0, len(ds), batch_size):
            batch = ds[a : a + batch_size]
            x = torch.stack([m.preprocess(im.convert("RGB")) for im in batch["image"]])
            img = m.encode_image(x)  # (B, D)
            correct += int(((img @ cls.T).argmax(dim=1) == torch.tensor(batch["label"])).sum())
    return correct / len(ds), len(ds)


def bench_zeroshot(args) -> dict:
    from vltool.zeroshot import ZeroshotConfig, zeroshot

    tmp = Path(tempfile.mkdtemp(prefix="bench_eval_"))
    model_dir = make_model(tmp / "run", args.arch)
    # warm up imports and lazy initialisation of both paths on a few rows (not timed)
    plain_loop(model_dir, args.data, args.batch_size) if args.warmup_full else None
    zeroshot(args.data, ZeroshotConfig(model=str(model_dir), cache_dir=str(tmp / "warm"), progress=False, bootstrap=10), where=["label=heart"])

    t = time.perf_counter()
    top1_plain, n = plain_loop(model_dir, args.data, args.batch_size)
    t_plain = time.perf_counter() - t

    config = ZeroshotConfig(model=str(model_dir), cache_dir=str(tmp / "cache"), progress=False, batch_size=args.batch_size)
    t = time.perf_counter()
    rec = zeroshot(args.data, config)
    t_vltool = time.perf_counter() - t
    t = time.perf_counter()
    rec2 = zeroshot(args.data, config)
    t_cached = time.perf_counter() - t
    top1 = rec["metrics"]["top1"]["value"]
    assert not rec["stats"]["cache"]["images"]["hit"] and rec2["stats"]["cache"]["images"]["hit"]
    assert abs(top1 - top1_plain) <= 1.5 / n, (top1, top1_plain)  # the same classifications (a tie at most)
    out = {
        "data": args.data, "images": n, "arch": args.arch, "batch_size": args.batch_size,
        "plain_loop_s": round(t_plain, 2), "plain_images_per_s": round(n / t_plain, 1),
        "vltool_s": round(t_vltool, 2), "vltool_images_per_s": round(n / t_vltool, 1),
        "ratio_vltool_over_plain": round(t_plain / t_vltool, 2),
        "cached_run_s": round(t_cached, 2), "cache_speedup": round(t_vltool / t_cached, 1),
        "top1": top1, "top1_plain": top1_plain,
    }
    print(f"zeroshot {args.data} ({n:,} images, {args.arch}, batch {args.batch_size})")
    print(f"  plain PyTorch loop   {t_plain:7.2f} s  {n / t_plain:8.1f} images/s   top-1 {100 * top1_plain:.2f}%")
    print(f"  vltool zeroshot      {t_vltool:7.2f} s  {n / t_vltool:8.1f} images/s   top-1 {100 * top1:.2f}% (+ intervals, chance)")
    print(f"  ratio vltool/plain   {t_plain / t_vltool:7.2f}   (target >= 1)")
    print(f"  second run (cached)  {t_cached:7.2f} s  {t_vltool / t_cached:6.1f}x faster   (target >= 10x)")
    return out


def bench_retrieve(args) -> dict:
    from vltool.metrics import bootstrap, retrieval_ranks
    from vltool.retrieve import RetrievalItems, retrieval_chance_levels

    rng = np.random.default_rng(0)
    n_i, n_t, d = args.images, args.texts, args.dim
    per = n_t // n_i
    owner = np.repeat(np.arange(n_i), per)[:n_t]
    # images in 2,000 clusters (near-duplicates compete), captions noisy views of their image
    centres = rng.standard_normal((2000, d), dtype=np.float32)
    images = centres[rng.integers(0, 2000, n_i)] + rng.standard_normal((n_i, d), dtype=np.float32) * np.float32(0.5)
    images /= np.linalg.norm(images, axis=1, keepdims=True)
    texts = images[owner] + rng.standard_normal((len(owner), d), dtype=np.float32) * np.float32(0.2)
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    inputs_mb = (images.nbytes + texts.nbytes) / 2**20
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    times: dict[str, list[float]] = {"numpy": [], "torch": []}
    runs = {}
    for _ in range(args.rounds):
        for name, device in (("numpy", None), ("torch", args.device)):
            t = time.perf_counter()
            runs[name] = retrieval_ranks(images, texts, owner, block_bytes=args.block_mb * 2**20, device=device)
            times[name].append(time.perf_counter() - t)
    same = all(np.array_equal(getattr(a, f), getattr(b, f)) for a, b in zip(runs["numpy"], runs["torch"]) for f in ("greater", "tied"))
    t_np, t_torch = min(times["numpy"]), min(times["torch"])

    tracemalloc.start()  # (torch's own allocations, the blocks, are not traced: a few MiB on a CPU)
    t = time.perf_counter()
    i2t, t2i = retrieval_ranks(images, texts, owner, block_bytes=args.block_mb * 2**20, device=args.device)
    t_rank = time.perf_counter() - t
    ks = [1, 5, 10]
    items = RetrievalItems(ks, {k: i2t.hits(k) for k in ks}, {k: t2i.hits(k) for k in ks}, i2t.rank(), t2i.rank(), owner)
    point = items.metrics()
    bootstrap(n_i, items.metrics, 1000, 0)
    retrieval_chance_levels(ks, n_i, len(owner), np.bincount(owner, minlength=n_i))
    t_total = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    full_gb = n_i * len(owner) * 4 / 2**30
    pairs = n_i * len(owner)
    print(f"retrieve: {n_i:,} images x {len(owner):,} captions, {d}-d, blocks of {args.block_mb} MiB")
    print(f"  ranking pass, numpy {t_np:7.1f} s  {t_np / pairs * 1e9:6.2f} ns a pair   (best of {args.rounds}: {[round(x, 2) for x in times['numpy']]})")
    print(f"  ranking pass, torch {t_torch:7.1f} s  {t_torch / pairs * 1e9:6.2f} ns a pair   on {args.device} (best of {args.rounds}: {[round(x, 2) for x in times['torch']]})")
    print(f"  ratio numpy/torch   {t_np / t_torch:7.2f}   same counts: {same}")
    print(f"  ranking pass (torch, traced) {t_rank:7.1f} s")
    print(f"  + metrics, 1,000 bootstrap resamples: {t_total:7.1f} s total")
    print(f"  peak memory above the inputs ({inputs_mb:.0f} MiB): {peak / 2**20:7.0f} MiB (traced); process peak RSS {rss1:.0f} MiB (was {rss0:.0f} before)")
    print(f"  (the full similarity matrix would be {full_gb:.1f} GiB in float32)")
    print(f"  R@1 image->text {100 * point['image_to_text_R@1']:.2f}%, text->image {100 * point['text_to_image_R@1']:.2f}%")
    return {
        "images": n_i, "texts": int(len(owner)), "dim": d, "rank_numpy_s": round(t_np, 2), "rank_torch_s": round(t_torch, 2),
        "ratio_numpy_torch": round(t_np / t_torch, 2), "same_counts": same, "rank_s": round(t_rank, 1), "total_s": round(t_total, 1),
        "peak_traced_mib": round(peak / 2**20), "peak_rss_mib": round(rss1), "inputs_mib": round(inputs_mb),
        "full_matrix_gib": round(full_gb, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["all", "zeroshot", "retrieve"], default="all")
    p.add_argument("--data", default="emoji")
    p.add_argument("--arch", default="vltool-tiny")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup-full", action="store_true", help="warm up with a full plain loop too")
    p.add_argument("--images", type=int, default=20_000)
    p.add_argument("--texts", type=int, default=100_000)
    p.add_argument("--block-mb", type=int, default=64)
    p.add_argument("--dim", type=int, default=512, help="embedding width of the random retrieval set")
    p.add_argument("--rounds", type=int, default=1, help="ranking passes of each of numpy and torch, alternating")
    p.add_argument("--device", default="cpu", help="torch device of the ranking pass (cpu, cuda)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    res = {}
    if args.part in ("all", "zeroshot"):
        res["zeroshot"] = bench_zeroshot(args)
    if args.part in ("all", "retrieve"):
        res["retrieve"] = bench_retrieve(args)
    if args.json:
        print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
