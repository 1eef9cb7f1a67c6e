"""WebDataset JPEG shards of real photos, for benchmarks of the training data path.

`build_photo_shards` takes every photo (JPEG, PNG, WebP) under the given folders, cuts distinct random
crops from them (a random box of random aspect between 3/4 and 4/3, seeded), resizes each so its short
side is `short_side` (Lanczos) and saves it as a baseline JPEG (quality 90, 4:2:0, as a web crawl's
photos mostly are) into tar shards in img2dataset's layout: for key `00000123`, `00000123.jpg`,
`00000123.txt` (a made-up caption of 6-16 words, seeded) and `00000123.json` ({"key", "caption"});
shards `00000.tar`, `00001.tar`, ... The crops are written in a seeded random order (consecutive samples
come from different photos). The shards are kept in a folder under `out_dir` named by a digest of the
arguments (and of the photos' paths, sizes and modification times), so a rerun finds them built.

Debian's gnome-backgrounds, mate-backgrounds and ukui-wallpapers put about 40 large photos (1280x1024
to 5640x3172) under /usr/share/backgrounds.

    python bench/photo_shards.py OUT_DIR --short-side 256 --samples 1000     # prints the shard folder
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import random
import shutil
import tarfile
import time
from pathlib import Path
from typing import Sequence

DEFAULT_PHOTO_DIRS = ("/usr/share/backgrounds", "/usr/share/wallpapers")
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
PACKAGES = "gnome-backgrounds mate-backgrounds ukui-wallpapers"
VERSION = 1  # part of the cache key: a change to how shards are made makes new ones
QUALITY = 90

WORDS = """a an the of on in with and at to two three some is are sitting standing next near holding
man woman boy girl person people dog cat bird horse car bus train plane boat bike table chair bed
kitchen room street field beach water sky tree grass snow food pizza cake plate cup phone flower
red blue green white black yellow small large young old smiling colorful abstract wallpaper desert
city night sunset mountain lake river garden wood leaf light dark stripes waves silk dune storm
photo image stock view front top little group couple sunny day morning close up background""".split()


def default_cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "vltool-bench" / "photo-shards"


def find_photos(dirs: Sequence[str | Path]) -> list[Path]:
    """Every JPEG/PNG/WebP file under `dirs` (symbolic links resolved, each file once), sorted."""
    found = set()
    for d in dirs:
        d = Path(d).expanduser()
        if d.is_file() and d.suffix.lower() in PHOTO_SUFFIXES:
            found.add(d.resolve())
            continue
        if not d.is_dir():
            continue
        for root, _, files in os.walk(d, followlinks=True):
            for name in files:
                p = Path(root) / name
                if p.suffix.lower() in PHOTO_SUFFIXES and p.is_file():
                    found.add(p.resolve())
    return sorted(found)


def no_photo_message(dirs: Sequence[str | Path]) -> str:
    return (f"no JPEG/PNG photo under {', '.join(map(str, dirs))}: install Debian's {PACKAGES} "
            f"(apt-get install {PACKAGES}) or give a folder of photos with --photos DIR")


def _caption(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))


def _open_rgb(path: Path):
    """The photo as an RGB PIL image (transparency composited on white), or None when PIL cannot read it."""
    from PIL import Image

    try:
        im = Image.open(path)
        im.load()
    except Exception:
        return None
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255)), rgba).convert("RGB")
    return im.convert("RGB")


def _pixels(path: Path) -> int:
    """Width x height from the header (a file PIL cannot open counts as the largest)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.width * im.height
    except Exception:
        return 1 << 62


def _box(rng: random.Random, w: int, h: int, short_side: int) -> tuple[float, float, float, float]:
    """A random crop box of a (w, h) photo: aspect log-uniform in [3/4, 4/3], short side uniform between
    max(short_side, 15% of the photo's short side) and the largest that fits, position uniform."""
    aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))  # width / height
    largest = min(w / aspect, h) if aspect >= 1 else min(w, h * aspect)  # the short side of the largest box
    smallest = min(largest, max(short_side, 0.15 * min(w, h)))
    s = rng.uniform(smallest, largest)
    bw, bh = (s * aspect, s) if aspect >= 1 else (s, s / aspect)
    bw, bh = min(bw, w), min(bh, h)
    x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
    return (x0, y0, x0 + bw, y0 + bh)


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
    tar.addfile(info, io.BytesIO(data))


def shard_key(photos: Sequence[Path], short_side: int, n_samples: int, per_shard: int, seed: int) -> str:
    stats = [(str(p), p.stat().st_size, int(p.stat().st_mtime)) for p in photos]
    key = {"version": VERSION, "quality": QUALITY, "photos": stats, "short_side": short_side, "n": n_samples,
           "per_shard": per_shard, "seed": seed}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def build_photo_shards(photos_dirs, out_dir, short_side: int = 256, n_samples: int = 1000, per_shard: int = 100,
                       seed: int = 0, verbose: bool = True, max_photos: int | None = None) -> list[Path]:
    """The shards (paths, in order) of `n_samples` distinct random crops of the photos under `photos_dirs`
    (a folder or a list of folders), built once into out_dir/<digest of the arguments>/. `max_photos`: only
    that many of the photos, those with the fewest pixels (a quick build). Raises SystemExit with the
    packages to install when no photo is found."""
    from PIL import Image

    dirs = [photos_dirs] if isinstance(photos_dirs, (str, Path)) else list(photos_dirs)
    photos = find_photos(dirs)
    if not photos:
        raise SystemExit(no_photo_message(dirs))
    if max_photos is not None and len(photos) > max_photos:
        photos = sorted(sorted(photos, key=_pixels)[:max_photos])
    folder = Path(out_dir).expanduser() / f"s{short_side}-n{n_samples}-{shard_key(photos, short_side, n_samples, per_shard, seed)}"
    n_shards = math.ceil(n_samples / per_shard)
    shards = [folder / f"{k:05d}.tar" for k in range(n_shards)]
    if (folder / "done.json").is_file() and all(p.is_file() for p in shards):
        return shards
    t0 = time.perf_counter()
    rng = random.Random(f"photo-shards:{seed}:{short_side}")
    owner = [rng.randrange(len(photos)) for _ in range(n_samples)]  # the photo each sample is cut from
    encoded: list[bytes | None] = [None] * n_samples
    carried: list[int] = []  # samples of an unreadable photo: cut from the next readable one
    first_readable = None
    for k, path in enumerate(photos + [None]):  # photo by photo (one large decoded photo in memory at a time)
        mine = [i for i, o in enumerate(owner) if o == k] + carried
        if path is None:  # the end: what is still carried is cut from the first readable photo
            path = first_readable
        im = _open_rgb(path) if mine and path is not None else None
        if im is None:
            carried = mine
            continue
        first_readable = first_readable or path
        carried = []
        for i in mine:
            box = _box(random.Random(f"crop:{seed}:{short_side}:{i}"), im.width, im.height, short_side)
            bw, bh = box[2] - box[0], box[3] - box[1]
            scale = short_side / min(bw, bh)
            size = (max(1, round(bw * scale)), max(1, round(bh * scale)))
            crop = im.resize(size, Image.LANCZOS, box=box, reducing_gap=3.0)
            buf = io.BytesIO()
            crop.save(buf, "JPEG", quality=QUALITY)
            encoded[i] = buf.getvalue()
        del im
    if carried:
        raise SystemExit(no_photo_message(dirs) + f" (none of the {len(photos)} file(s) found could be read)")
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    now = time.time()
    for s in range(n_shards):
        with tarfile.open(tmp / f"{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * per_shard, min(n_samples, (s + 1) * per_shard)):
                key = f"{i:08d}"
                cap = _caption(random.Random(f"caption:{seed}:{i}"))
                _add(tar, f"{key}.jpg", encoded[i], now)
                _add(tar, f"{key}.txt", cap.encode(), now)
                _add(tar, f"{key}.json", json.dumps({"key": key, "caption": cap}).encode(), now)
    nbytes = sum(len(e) for e in encoded)
    (tmp / "done.json").write_text(json.dumps({"photos": [str(p) for p in photos], "short_side": short_side, "samples": n_samples,
                                               "per_shard": per_shard, "seed": seed, "jpeg_bytes": nbytes}, indent=1))
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    if verbose:
        print(f"built {n_shards} shards of {n_samples} crops ({short_side} px short side, {nbytes / n_samples / 1024:.0f} KiB per JPEG) "
              f"from {len(photos)} photos in {time.perf_counter() - t0:.0f} s: {folder}", flush=True)
    return shards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", nargs="?", default=str(default_cache_root()))
    ap.add_argument("--photos", action="append", help=f"a folder of photos (repeatable) [default: {' '.join(DEFAULT_PHOTO_DIRS)}]")
    ap.add_argument("--short-side", type=int, default=256)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--per-shard", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    shards = build_photo_shards(args.photos or DEFAULT_PHOTO_DIRS, args.out_dir, args.short_side, args.samples, args.per_shard, args.seed)
    print(shards[0].parent)


if __name__ == "__main__":
    main()
