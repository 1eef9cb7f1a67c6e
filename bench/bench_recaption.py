"""Benchmark `vltool recaption`: images per second of batched generation against a per-image loop, with
the same model, the same settings (nucleus sampling, a fixed number of new tokens so both do the same
work) and the same code path (vltool.recaption.Generator, i.e. processor + model.generate).

    python bench/bench_recaption.py                        # a small random BLIP built from a config
    python bench/bench_recaption.py --model ./blip-base    # a real local captioner
    python bench/bench_recaption.py --device cuda --images 256 --batch-size 64

The issue's target: batch 32 at least 5x faster than the per-image loop.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a local captioner directory [default: a random BLIP built here]")
    ap.add_argument("--hidden", type=int, default=128, help="width of the random BLIP (with no --model)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the random BLIP (with no --model)")
    ap.add_argument("--image-size", type=int, default=96, help="image size of the random BLIP (with no --model)")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=20, help="every caption gets exactly this many tokens")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads [default: torch's choice]")
    args = ap.parse_args()

    import numpy as np
    import torch
    from PIL import Image

    from vltool.recaption import RecaptionConfig, inspect_model, load_generator, resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    model = args.model
    if model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from bench.tiny_models import make_blip

        model = make_blip(Path(tmp.name) / "blip", image_size=args.image_size, hidden=args.hidden, layers=args.layers)
    config = RecaptionConfig(model=model, num_captions=1, min_new_tokens=args.new_tokens,
                             max_new_tokens=args.new_tokens, device=args.device)
    device = resolve_device(args.device)
    gen = load_generator(inspect_model(model, paraphrase=False), config, device)
    params = sum(p.numel() for p in gen.model.parameters())
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)) for _ in range(args.images)]
    ids = [f"img{i}" for i in range(args.images)]
    print(f"model: {Path(model).name} ({type(gen.model).__name__}, {params / 1e6:.1f}M parameters) on {device}, "
          f"{torch.get_num_threads()} CPU threads; {args.images} images, {args.new_tokens} new tokens each")

    gen(images[:2], ids[:2])  # warm up

    def timed(fn) -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    loop_out: list = []
    t_loop = timed(lambda: [loop_out.extend(gen([im], [i])) for im, i in zip(images, ids)])
    batch_out: list = []
    bs = args.batch_size
    t_batch = timed(lambda: [batch_out.extend(gen(images[j:j + bs], ids[j:j + bs])) for j in range(0, len(images), bs)])
    loop_rate, batch_rate = args.images / t_loop, args.images / t_batch
    same = sum(a == b for a, b in zip(loop_out, batch_out))
    print(f"per-image loop:  {loop_rate:8.1f} images/s ({t_loop:.2f}s)")
    print(f"batch of {bs:<4d}:  {batch_rate:8.1f} images/s ({t_batch:.2f}s)")
    print(f"speed-up: {batch_rate / loop_rate:.1f}x (target >= 5x at batch 32); "
          f"{same}/{args.images} images got the same caption both ways (per-caption seeds)")


if __name__ == "__main__":
    main()
