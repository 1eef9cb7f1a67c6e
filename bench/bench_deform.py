"""Benchmark: `deform --ops default` end to end (load, deform, save) on 1,000,000 English captions.

Prints captions/s for vltool's deform and for a plain per-row `Dataset.map` implementation of the same
operations (same outputs; checked on the first 2,000 rows), measured in the same run, and their ratio.
Target (issue 2): vltool >= 100,000 captions/s on a 2-core machine.

    python bench/bench_deform.py                 # 1,000,000 captions, --num-proc 2
    python bench/bench_deform.py --rows 200000   # quicker
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def english_vocabulary() -> list[str]:
    """Real English words: the CLDR keywords and names of the built-in emoji data, plus stop words."""
    import datasets

    from vltool.io import BUILTIN_DATASETS
    from vltool.text import english_stopwords, tokenize

    ds = datasets.load_from_disk(str(BUILTIN_DATASETS["emoji"]))
    words = sorted({t for caps in ds["captions"] for c in caps for t in tokenize(c) if t.isalpha()})
    return words, sorted(english_stopwords()[0])


def make_captions(n: int, seed: int = 0) -> list[str]:
    """~10-word captions: Zipf-distributed content words interleaved with stop words and punctuation."""
    words, stop = english_vocabulary()
    rng = np.random.default_rng(seed)
    content = np.array(words)
    ranks = np.arange(1, len(content) + 1)
    p = 1.0 / ranks**1.1
    p /= p.sum()
    lengths = rng.integers(7, 14, size=n)  # 7..13 tokens, mean 10
    total = int(lengths.sum())
    is_stop = rng.random(total) < 0.4
    toks = np.where(is_stop, rng.choice(np.array(stop), size=total), rng.choice(content, size=total, p=p))
    caps, i = [], 0
    for L in lengths.tolist():
        t = toks[i : i + L].tolist()
        i += L
        t[0] = t[0].capitalize()
        caps.append(" ".join(t) + ".")
    return caps


def reference_map(src: str, out: str, ops_text: str, base_frac: float, seed: int, num_proc: int) -> int:
    """The plain way: Dataset.map over rows with the reference per-caption function."""
    import datasets

    from vltool.deform import Ops, choose_base, deform_caption, fit_vocabulary, row_seed
    from vltool.text import english_stopwords

    ds = datasets.load_from_disk(src)
    ops = Ops.parse(ops_text)
    is_base = choose_base(len(ds), base_frac, seed)
    base_idx = np.flatnonzero(is_base)
    vocab = fit_vocabulary(ds.select(base_idx)["caption"], ops, english_stopwords()[0])
    ds = ds.add_column("is_base", is_base.tolist())

    def one(row):
        text = row["caption"]
        if not row["is_base"]:
            text = deform_caption(text, ops, vocab, row_seed(seed, row["id"]))[0]
        return {"caption": text, "caption_original": row["caption"]}

    ds = ds.map(one, num_proc=num_proc if num_proc > 1 else None)
    ds = ds.filter(lambda r: bool(r["caption"]) or r["is_base"], num_proc=num_proc if num_proc > 1 else None)
    ds.save_to_disk(out)
    return len(ds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--ops", default="default")
    args = ap.parse_args()

    import datasets

    from vltool.deform import DeformConfig, deform

    datasets.disable_progress_bars()
    work = Path(tempfile.mkdtemp(prefix="bench_deform_"))
    try:
        t = time.perf_counter()
        caps = make_captions(args.rows)
        ds = datasets.Dataset.from_dict({"id": [f"c{i}" for i in range(len(caps))], "caption": caps})
        ds.save_to_disk(str(work / "src"))
        words = sum(len(c.split()) for c in caps) / len(caps)
        print(f"generated {len(caps):,} captions (mean {words:.1f} words) in {time.perf_counter() - t:.1f}s")
        del ds, caps

        config = DeformConfig(ops=args.ops, seed=0, num_proc=args.num_proc)
        t = time.perf_counter()
        prov = deform(str(work / "src"), work / "fast", config)
        fast_s = time.perf_counter() - t

        t = time.perf_counter()
        ref_rows = reference_map(str(work / "src"), str(work / "ref"), args.ops, 0.1, 0, args.num_proc)
        ref_s = time.perf_counter() - t

        a = datasets.load_from_disk(str(work / "fast"))
        b = datasets.load_from_disk(str(work / "ref"))
        assert len(a) == ref_rows == prov["rows_out"], (len(a), ref_rows)
        assert a.select(range(2000))["caption"] == b.select(range(2000))["caption"], "outputs differ"

        result = {
            "rows": args.rows,
            "num_proc": args.num_proc,
            "ops": prov["stats"]["ops"],
            "vltool_s": round(fast_s, 2),
            "vltool_captions_per_s": round(args.rows / fast_s),
            "plain_map_s": round(ref_s, 2),
            "plain_map_captions_per_s": round(args.rows / ref_s),
            "ratio": round(ref_s / fast_s, 2),
            "target_captions_per_s": 100_000,
            "rows_out": prov["rows_out"],
            "avg_len_before_after": [prov["stats"]["avg_caption_len_before"], prov["stats"]["avg_caption_len_after"]],
        }
        print(f"vltool deform:      {result['vltool_captions_per_s']:>10,} captions/s ({fast_s:.1f}s)")
        print(f"plain Dataset.map:  {result['plain_map_captions_per_s']:>10,} captions/s ({ref_s:.1f}s)")
        print(f"ratio: {result['ratio']:.2f}x   target >= 100,000 captions/s: "
              f"{'met' if result['vltool_captions_per_s'] >= 100_000 else 'NOT met'}")
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
