"""The training data path from WebDataset JPEG shards: vltool's loader against open_clip's webdataset
pipeline and a plain torchvision pipeline, on crops of real photos.

Inputs (bench/photo_shards.py, built once and cached): distinct random crops of the photos under --photos
(Debian's gnome-backgrounds, mate-backgrounds and ukui-wallpapers by default), resized to a short side of
256 and of 384 px, JPEG quality 90, in img2dataset's layout (key.jpg, key.txt, key.json), 100 per shard.

The three pipelines make the same 224-px training crops (RandomResizedCrop scale (0.9, 1), ratio (3/4, 4/3),
bicubic, CLIP's mean and std) and CLIP tokens (open_clip's BPE, 77 tokens) of the captions:

- vltool: the trainer's streaming loader (vltool.pretrain.data: ShardStream with its shuffle buffer of 2,000,
  PairDataset.item with train_pixels(..., "clip"), Collate in the workers, stream_micro_batches). It yields
  uint8 crops, normalised on the training device by Pixels.normalise: that step is timed apart here (on
  this CPU, in the main process) and reported separately, not in vltool's figures.
- open_clip: open_clip_train.data.get_wds_dataset (open_clip's own training loader: shard shuffle,
  split by worker, tarfile_to_samples, shuffle 5,000/1,000, decode("pilrgb"), rename, map_dict with
  image_transform_v2(is_train=True) and the tokenizer, to_tuple, batched, WebLoader); when it cannot run
  with the installed webdataset, the same stages built with webdataset here (the output says which ran).
- torchvision: a plain IterableDataset over the tar files (tarfile), PIL decode, RandomResizedCrop,
  ToTensor, Normalize, the tokenizer per sample, a DataLoader with the default collate.

Figures (each pipeline measured once per round, the pipelines' order rotating from round to round; min and
median over the rounds):
1. images per CPU-second ("per core"): the whole pipeline in this process (num_workers=0,
   torch.set_num_threads(1)), CPU time of the process (time.process_time) over --images images after one
   warm-up batch; at each --sizes short side. Ratio vltool / open_clip (target >= 2.5x).
2. main-process CPU per image (ms): 2 data-loader workers; the main process's own CPU time
   (time.process_time counts only its threads, not the workers') per image taken from the loader, at
   the first size. Target: vltool's <= open_clip's (about 0.2 ms). Each vltool worker builds whole
   micro-batches in turn, so the main process only receives them (on a GPU the DataLoader's pin thread
   then copies each into pinned memory, for every pipeline alike: uint8 for vltool, float32 for the others).
3. open file descriptors of the main process (len(os.listdir('/proc/self/fd'))) and of its workers while
   vltool's loader runs with 2 workers at batch 64 and at batch 512: they should not grow with the batch.

    python bench/bench_datapath.py                           # 256 and 384 px, 768 images, 3 rounds (~4 min on 2 cores)
    python bench/bench_datapath.py --quick                   # a tiny run of every part (CI; < 1 min)
    python bench/bench_datapath.py --photos ~/Pictures --sizes 384 --images 1024 --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import statistics
import sys
import tarfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from photo_shards import DEFAULT_PHOTO_DIRS, build_photo_shards, default_cache_root  # noqa: E402

PIPELINES = ("vltool", "open_clip", "torchvision")
BASELINE = "open_clip"
SIZE = 224
SEED = 0
PER_CORE_TARGET = 2.5  # vltool / open_clip images per CPU-second
MAIN_CPU_TARGET_MS = 0.2  # open_clip's main-process CPU per image, about


def clip_preprocess() -> dict:
    """A CLIP model's preprocess entry (vltool's config of ViT-B-32: 224 px, CLIP's mean and std, bicubic)
    and its tokenizer, without building the model."""
    from vltool.model.create import ModelSpec, new_model_config
    from vltool.model.tokenizer import source_tokenizer

    config = new_model_config(ModelSpec(arch="ViT-B-32"), 1 / 0.07, True)
    return config["preprocess"], source_tokenizer(config)


class Run:
    """A pipeline's batches: `it` yields them, `count(batch)` is its images, `normalise` (vltool) the step
    the trainer runs on the device, `close()` stops its workers."""

    def __init__(self, it, count, close, normalise=None, join_cpu=None):
        self.it, self.count, self.normalise, self._close = it, count, normalise, close
        self.join_cpu = join_cpu  # vltool: CPU seconds spent so far joining the workers' sub-batches

    def close(self) -> None:
        self._close()
        gc.collect()


def _shutdown(loader) -> None:
    inner = getattr(loader, "_iterator", None)
    if inner is not None and hasattr(inner, "_shutdown_workers"):
        inner._shutdown_workers()
    if hasattr(loader, "_iterator"):
        loader._iterator = None


# ---- the pipelines


class VltoolPipe:
    def __init__(self):
        from vltool.transforms import train_pixels

        self.pp, self.tokenizer = clip_preprocess()
        assert self.pp["size"] == SIZE, self.pp
        self.pixels = train_pixels(self.pp, "clip")

    def run(self, shards, batch: int, workers: int) -> Run:
        from vltool.pretrain.data import Collate, PairDataset, ShardStream, stream_micro_batches

        text_column = "caption"  # vltool.shards.sample_text: an img2dataset shard's txt member
        pairs = PairDataset(None, text_column, None, self.pixels, SEED)
        stream = ShardStream(shards, pairs.item, text_column, 1, 0, [batch] * max(1, workers), SEED, 2000,
                             collate=Collate(self.tokenizer))
        gen = stream_micro_batches(stream, workers, pin=False)
        return Run(gen, lambda b: b["n"], gen.close, normalise=lambda b: self.pixels.normalise(b["images"]))


def open_clip_parts():
    import open_clip
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = PreprocessCfg(size=SIZE, mode="RGB", mean=OPENAI_DATASET_MEAN, std=OPENAI_DATASET_STD, interpolation="bicubic",
                        resize_mode="shortest")
    return image_transform_v2(cfg, is_train=True), open_clip.get_tokenizer("ViT-B-32")


def _has_caption_and_image(sample) -> bool:  # open_clip_train.data.filter_no_caption_or_no_image
    return "txt" in sample and any(k in sample for k in ("png", "jpg", "jpeg", "webp"))


class OpenClipPipe:
    """open_clip_train.data.get_wds_dataset, or (`replica`) its stages rebuilt with webdataset."""

    def __init__(self, replica: bool = False):
        self.preprocess, self.tokenizer = open_clip_parts()
        self.replica = replica

    @property
    def label(self) -> str:
        return "webdataset stages as open_clip_train's get_wds_dataset" if self.replica else "open_clip_train.data.get_wds_dataset"

    def run(self, shards, batch: int, workers: int) -> Run:
        urls = "::".join(str(p) for p in shards)
        if self.replica:
            loader = self._replica(urls, batch, workers)
        else:
            from open_clip_train.data import get_wds_dataset

            args = argparse.Namespace(train_data=urls, val_data=None, train_num_samples=10**9, dataset_resampled=False,
                                      train_data_upsampling_factors=None, seed=SEED, workers=workers, world_size=1, batch_size=batch)
            loader = get_wds_dataset(args, self.preprocess, is_train=True, epoch=0, tokenizer=self.tokenizer).dataloader
        it = iter(loader)
        return Run(it, lambda b: len(b[0]), lambda: _shutdown(loader))

    def _replica(self, urls: str, batch: int, workers: int):
        import webdataset as wds

        tok = self.tokenizer
        pipeline = wds.DataPipeline(
            wds.SimpleShardList(urls.split("::")),
            wds.shuffle(bufsize=2000, initial=500),  # open_clip's detshuffle2 of the shards (_SHARD_SHUFFLE_SIZE/_INITIAL)
            wds.split_by_node,
            wds.split_by_worker,
            wds.tarfile_to_samples(handler=wds.warn_and_continue),
            wds.shuffle(bufsize=5000, initial=1000),  # _SAMPLE_SHUFFLE_SIZE, _SAMPLE_SHUFFLE_INITIAL
            wds.select(_has_caption_and_image),
            wds.decode("pilrgb", handler=wds.warn_and_continue),
            wds.rename(image="jpg;png;jpeg;webp", text="txt"),
            wds.map_dict(image=self.preprocess, text=lambda text: tok(text)[0]),
            wds.to_tuple("image", "text"),
            wds.batched(batch, partial=False),
        ).with_epoch(10**9)
        return wds.WebLoader(pipeline, batch_size=None, shuffle=False, num_workers=workers, persistent_workers=workers > 0)


class TarPairs:
    """(image tensor, tokens) of each sample of the shards, read with tarfile; a worker reads every
    num_workers-th shard; epochs repeat for ever. (An IterableDataset: made one in torchvision_run.)"""

    def __init__(self, shards, transform, tokenizer):
        self.shards, self.transform, self.tokenizer = [str(p) for p in shards], transform, tokenizer

    def samples(self, path: str):
        key, files = None, {}
        with tarfile.open(path) as tar:
            for m in tar:
                if not m.isfile():
                    continue
                k, _, ext = m.name.partition(".")
                if k != key and files:
                    yield files
                    files = {}
                key = k
                files[ext] = tar.extractfile(m).read()
        if files:
            yield files

    def __iter__(self):
        import torch
        from PIL import Image

        info = torch.utils.data.get_worker_info()
        mine = self.shards[info.id :: info.num_workers] if info is not None else self.shards
        while True:
            for path in mine:
                for files in self.samples(path):
                    if "jpg" not in files or "txt" not in files:
                        continue
                    im = Image.open(io.BytesIO(files["jpg"])).convert("RGB")
                    yield self.transform(im), self.tokenizer([files["txt"].decode("utf-8")])[0]


class TorchvisionPipe:
    def __init__(self):
        from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
        from torchvision import transforms as T

        self.transform = T.Compose([
            T.RandomResizedCrop(SIZE, scale=(0.9, 1.0), interpolation=T.InterpolationMode.BICUBIC),
            T.ToTensor(),
            T.Normalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD),
        ])
        self.tokenizer = open_clip_parts()[1]

    def run(self, shards, batch: int, workers: int) -> Run:
        import torch

        class Pairs(TarPairs, torch.utils.data.IterableDataset):
            pass

        loader = torch.utils.data.DataLoader(Pairs(shards, self.transform, self.tokenizer), batch_size=batch, num_workers=workers,
                                             persistent_workers=workers > 0)
        it = iter(loader)
        return Run(it, lambda b: len(b[0]), lambda: _shutdown(loader))


# ---- measurements


def take(run: Run, images: int) -> dict:
    """CPU seconds of this process (and wall seconds) to take `images` images after one warm-up batch; the
    normalisation step (vltool) timed apart."""
    next(run.it)  # warm-up: imports, workers started, shuffle buffers filled
    n, norm = 0, 0.0
    j0 = run.join_cpu() if run.join_cpu else 0.0
    t0, w0 = time.process_time(), time.perf_counter()
    while n < images:
        b = next(run.it)
        n += run.count(b)
        if run.normalise is not None:
            t = time.process_time()
            run.normalise(b)
            norm += time.process_time() - t
        del b
    cpu, wall = time.process_time() - t0 - norm, time.perf_counter() - w0 - norm
    return {"images": n, "cpu_s": cpu, "wall_s": wall, "normalise_cpu_s": norm if run.normalise is not None else None,
            "join_cpu_s": run.join_cpu() - j0 if run.join_cpu else None}


def measure(pipe, shards, batch: int, workers: int, images: int) -> dict:
    run = pipe.run(shards, batch, workers)
    try:
        return take(run, images)
    finally:
        run.close()


def open_fds(pid: int | str = "self") -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def children() -> list[int]:
    out = []
    for task in Path("/proc/self/task").iterdir():
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def fd_figure(pipe, shards, batch: int, batches: int) -> dict:
    """Open fds of the main process (and of its workers, summed) before the loader, and the most seen
    while `batches` batches are taken (each held until the next arrives) after a warm-up one."""
    before = open_fds()
    run = pipe.run(shards, batch, 2)
    try:
        b = next(run.it)
        main, workers = [], []
        for _ in range(batches):
            del b
            b = next(run.it)
            main.append(open_fds())
            workers.append(sum(open_fds(p) for p in children()))
        del b
    finally:
        run.close()
    return {"batch": batch, "before": before, "main_max": max(main), "main": main, "workers_max": max(workers)}


def probe_open_clip(shards, batch: int) -> tuple[OpenClipPipe, str | None]:
    """open_clip_train's get_wds_dataset if it runs here (one batch, no workers), else the replica and why."""
    try:
        import open_clip_train.data  # noqa: F401

        pipe = OpenClipPipe()
        run = pipe.run(shards, batch, 0)
        try:
            next(run.it)
        finally:
            run.close()
        return pipe, None
    except Exception as e:
        why = "".join(traceback.format_exception_only(type(e), e)).strip()
        return OpenClipPipe(replica=True), why


def stats(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "rounds": values}


def fmt(d: dict, f: str = "{:.0f}") -> str:
    return f"{f.format(d['min'])} / {f.format(d['median'])}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", action="append", metavar="DIR", help=f"a folder of photos (repeatable) [default: {' '.join(DEFAULT_PHOTO_DIRS)}]")
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 384], help="short sides of the shards' JPEGs")
    ap.add_argument("--images", type=int, default=768, help="images per measurement (after a warm-up batch)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=1000, help="crops in each size's shards")
    ap.add_argument("--cache", default=str(default_cache_root()), help="where the built shards are kept")
    ap.add_argument("--quick", action="store_true", help="a tiny run of every part (CI): few images, one round")
    ap.add_argument("--json", metavar="PATH", help="write the figures here")
    ap.add_argument("--open-clip", choices=("auto", "replica"), default="auto",
                    help="auto: open_clip_train's get_wds_dataset when it runs here, else its stages rebuilt with webdataset; replica: the rebuilt stages")
    args = ap.parse_args()
    fd_batches = (64, 512)
    per_shard, max_photos = 100, None
    if args.quick:
        args.images, args.rounds, args.batch, args.samples = 32, 1, 16, 64
        per_shard, max_photos, fd_batches = 16, 4, (16, 128)
    t_start = time.perf_counter()

    import torch

    torch.set_num_threads(1)
    photo_dirs = args.photos or list(DEFAULT_PHOTO_DIRS)
    shards = {s: build_photo_shards(photo_dirs, args.cache, s, args.samples, per_shard, SEED, max_photos=max_photos) for s in args.sizes}
    first = args.sizes[0]

    pipes = {"vltool": VltoolPipe(), "torchvision": TorchvisionPipe()}
    if args.open_clip == "replica":
        pipes["open_clip"], failure = OpenClipPipe(replica=True), None
    else:
        pipes["open_clip"], failure = probe_open_clip(shards[first], args.batch)
    print(f"open_clip pipeline: {pipes['open_clip'].label}")
    if failure:
        print(f"  (open_clip_train's get_wds_dataset failed here: {failure})")
    info = json.loads((shards[first][0].parent / "done.json").read_text())
    print(f"shards: {args.samples} crops of {len(info['photos'])} photos each, {per_shard} per shard, short side {' and '.join(map(str, args.sizes))} px, "
          f"under {args.cache}")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, batch {args.batch}, {args.images} images per measurement, "
          f"{args.rounds} round(s), pipelines alternating", flush=True)
    for name in PIPELINES:  # unmeasured: first calls of everything (lazy imports, file cache)
        measure(pipes[name], shards[first], args.batch, 0, args.batch)

    per_core = {s: {n: [] for n in PIPELINES} for s in args.sizes}
    norm_ms = {s: [] for s in args.sizes}
    main_ms = {n: [] for n in PIPELINES}
    main_norm_ms, main_join_ms = [], []
    for r in range(args.rounds):
        order = PIPELINES[r % 3:] + PIPELINES[: r % 3]
        for s in args.sizes:
            for name in order:
                m = measure(pipes[name], shards[s], args.batch, 0, args.images)
                per_core[s][name].append(m["images"] / m["cpu_s"])
                if m["normalise_cpu_s"] is not None:
                    norm_ms[s].append(1000 * m["normalise_cpu_s"] / m["images"])
        for name in order:
            m = measure(pipes[name], shards[first], args.batch, 2, args.images)
            main_ms[name].append(1000 * m["cpu_s"] / m["images"])
            if m["normalise_cpu_s"] is not None:
                main_norm_ms.append(1000 * m["normalise_cpu_s"] / m["images"])
            if m["join_cpu_s"] is not None:
                main_join_ms.append(1000 * m["join_cpu_s"] / m["images"])
        print(f"  round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n} {per_core[first][n][-1]:.0f} img/s/core, {main_ms[n][-1]:.3f} ms main" for n in PIPELINES) + f" ({first} px)", flush=True)
    fds = [fd_figure(pipes["vltool"], shards[first], b, 3) for b in fd_batches]

    pc = {s: {n: stats(v) for n, v in per_core[s].items()} for s in args.sizes}
    mm = {n: stats(v) for n, v in main_ms.items()}
    print()
    print(f"images per CPU-second, one process, 1 thread (min / median over {args.rounds} round(s)); higher is better")
    print("| pipeline | " + " | ".join(f"{s} px" for s in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    labels = {"vltool": "vltool (uint8 crops; normalised on the device)", "open_clip": f"open_clip ({pipes['open_clip'].label})",
              "torchvision": "torchvision (PIL, default collate)"}
    for name in PIPELINES:
        print(f"| {labels[name]} | " + " | ".join(fmt(pc[s][name]) for s in args.sizes) + " |")
    with_norm = {s: stats([1 / (1 / a + b / 1000) for a, b in zip(per_core[s]["vltool"], norm_ms[s])]) for s in args.sizes}
    print("| vltool + normalise on this CPU | " + " | ".join(fmt(with_norm[s]) for s in args.sizes) + " |")
    print("| normalise on this CPU (ms/image; on a GPU it runs on the device) | " + " | ".join(fmt(stats(norm_ms[s]), "{:.3f}") for s in args.sizes) + " |")
    ratios = {s: pc[s]["vltool"]["median"] / pc[s][BASELINE]["median"] for s in args.sizes}
    print(f"| ratio vltool / {BASELINE} (medians; target >= {PER_CORE_TARGET}x) | "
          + " | ".join(f"{ratios[s]:.2f}x {'PASS' if ratios[s] >= PER_CORE_TARGET else 'MISS'}" for s in args.sizes) + " |")
    ratios_n = {s: with_norm[s]["median"] / pc[s][BASELINE]["median"] for s in args.sizes}
    print(f"| ratio (vltool + normalise on this CPU) / {BASELINE} (medians) | " + " | ".join(f"{ratios_n[s]:.2f}x" for s in args.sizes) + " |")
    ratios_tv = {s: pc[s]["vltool"]["median"] / pc[s]["torchvision"]["median"] for s in args.sizes}
    print("| ratio vltool / torchvision (medians) | " + " | ".join(f"{ratios_tv[s]:.2f}x" for s in args.sizes) + " |")

    print()
    print(f"main-process CPU per image, 2 data-loader workers, {first} px (ms; min / median over {args.rounds} round(s)); lower is better")
    print("| pipeline | ms per image |")
    print("|---|---|")
    mj = stats(main_join_ms) if main_join_ms else None
    for name in PIPELINES:
        print(f"| {labels[name]} | {fmt(mm[name], '{:.3f}')} |")
        if name == "vltool" and mj:
            print(f"| of which vltool's join_batches (the copy of the sub-batches into one batch; pinned memory on a GPU) | {fmt(mj, '{:.3f}')} |")
    mn = stats(main_norm_ms)
    print(f"| vltool's normalise on this CPU (not in the rows above) | {fmt(mn, '{:.3f}')} |")
    main_ok = mm["vltool"]["median"] <= mm[BASELINE]["median"]
    print(f"| vltool vs {BASELINE} (medians; target: vltool <= {BASELINE}, about {MAIN_CPU_TARGET_MS} ms) | "
          f"{mm['vltool']['median']:.3f} vs {mm[BASELINE]['median']:.3f} ms, ratio {mm['vltool']['median'] / mm[BASELINE]['median']:.2f} "
          f"{'PASS' if main_ok else 'MISS'} |")

    print()
    print("open file descriptors, vltool's loader with 2 workers (each batch held until the next)")
    print("| batch | main process before | main process, most while iterating | its workers, most (sum) |")
    print("|---|---|---|---|")
    for f in fds:
        print(f"| {f['batch']} | {f['before']} | {f['main_max']} | {f['workers_max']} |")
    grows = fds[-1]["main_max"] - fds[0]["main_max"]
    # a descriptor per sample would add (512 - 64) x the batches in flight; a few either way is when the
    # loader's queue happens to be sampled (batches in flight, each with its own handles)
    slack = 16
    print(f"main-process fds at batch {fds[-1]['batch']} minus at batch {fds[0]['batch']}: {grows:+d} "
          f"({'PASS: does not grow with the batch' if grows <= slack else 'MISS: grows with the batch'}; "
          f"a handle per sample would add {fds[-1]['batch'] - fds[0]['batch']} or more; {slack} allowed for the batches in flight)")
    elapsed = time.perf_counter() - t_start
    print(f"\n(total {elapsed:.0f} s)")
    if args.json:
        out = {
            "config": {"sizes": args.sizes, "images": args.images, "rounds": args.rounds, "batch": args.batch, "samples": args.samples,
                       "photos": info["photos"], "open_clip": pipes["open_clip"].label, "open_clip_train_failure": failure,
                       "torch": torch.__version__, "cpus": os.cpu_count(), "quick": args.quick},
            "images_per_cpu_s": {str(s): pc[s] for s in args.sizes},
            "vltool_with_normalise_images_per_cpu_s": {str(s): with_norm[s] for s in args.sizes},
            "normalise_ms_per_image": {str(s): stats(norm_ms[s]) for s in args.sizes},
            "ratio_vltool_open_clip": {str(s): ratios[s] for s in args.sizes},
            "ratio_vltool_with_normalise_open_clip": {str(s): ratios_n[s] for s in args.sizes},
            "ratio_target": PER_CORE_TARGET,
            "main_process_ms_per_image": mm, "main_process_normalise_ms_per_image": mn, "main_process_join_ms_per_image": mj,
            "main_process_pass": main_ok,
            "fds": fds,
            "elapsed_s": elapsed,
        }
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
