"""Benchmark: how start-up time and peak memory grow with the number of rows, for every command that reads
a whole dataset.

A synthetic image-text set is built on the fly (a distinct 32x32 PNG per row, five-to-ten-word captions,
a list of two captions, a 100-class label) at each size, saved with save_to_disk, and for `pretrain-wds`
and `retrieve-wds` the same kind of rows as WebDataset shards of 10,000 samples in img2dataset's layout;
the model is made once (below). Each command runs in its own process (`python -m vltool`: the vltool of
the current directory when it is a checkout, before PYTHONPATH's; to measure another checkout, run from
outside any), with an empty cache directory, and the benchmark prints:
- start-up: for pretrain its whole run (two optimizer steps of batch 64: start-up to the first steps); for
  zeroshot, retrieve and mine-positives the command's own `seconds_to_first_batch` (its provenance: from
  its start to its first encoded batch); deform, pick-caption, filter and the baseline have none. retrieve-wds
  builds the shard index on the way (once per set of shards: the first command on them pays it);
  retrieve-wds-indexed finds it built (by `vltool info SHARDS` before the measured run);
- its wall time and throughput (rows per second);
- its peak resident memory (the kernel's maximum RSS, from /usr/bin/time) and its peak anonymous resident
  memory (RssAnon, sampled every 20 ms: the memory it allocated, without the clean file pages of a
  memory-mapped dataset that the kernel maps into its RSS);
then the ratio of the largest size to the smallest. `datasets-roundtrip` is the baseline of a command that
reads a dataset on disk and writes a new one: `datasets.load_from_disk(DATA).save_to_disk(OUT)` alone
(no vltool), what the library's own objects for the set's record batches cost. Before each command its
input's files (the dataset or the shards, and the model) are read once, so that every size starts with
them in the page cache and the figures measure the command, not the disk; `--cold` instead empties the
page cache before each command (as root), which adds the disk's reads: datasets' load_from_disk reads the
whole Arrow file of a dataset on disk cold (the record batches' headers are spread through it), 2.5 s at
1M rows on this machine's disk. Target (issue 22): start-up and peak memory within 2x from 10k to 1M rows
(10M with --big). retrieve and mine-positives score every pair of rows, so by default they stop at 100k
rows (1M rows are 10^12 pairs: each took 29 minutes on 2 CPU cores, mine-positives with --index blocked;
`--pairwise-max 1000000` runs them there).

The model is `vltool-micro` trained 500 steps on 20,000 synthetic rows first (--model-steps; each image's
quadrants are coloured by its caption's first four words), so that its embeddings spread out as a trained
model's do. mine-positives runs with thresholds set once from that model's similarities on a sample
(mining_thresholds), the same at every size, so that a row's candidates are few and grow with the rows
as near-duplicates do. On a machine with a GPU, mine-positives runs with `--index blocked` (the index a GPU
user mines with) and retrieve ranks on the GPU; the synthetic images are made on every CPU core.

    python bench/bench_scale.py                                  # 10k, 100k, 1M rows; every command
    python bench/bench_scale.py --rows 10000,100000 --commands pretrain,pretrain-wds,deform
    python bench/bench_scale.py --big                            # adds 10M rows (about 32 GB of disk per copy)
    python bench/bench_scale.py --data-dir D --build-only        # build (or keep) the data in D; later runs with
                                                                 # --data-dir D measure without building
    python bench/bench_scale.py --rows 10000,1000000,10000000 --commands pretrain-wds --linked-shards 10
                                                                 # streaming from 1,000 shards on the disk of 10
    python bench/bench_scale.py --rows 10000,1000000,10000000 --commands pretrain --one-pixel --second-run
                                                                 # a dataset on disk at 10M rows, twice

Writes OUT/scale.json and OUT/scale.png (time and memory against rows, one line per command).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ("red blue green small large happy face hand heart cat dog bird tree house car sun moon star flag "
         "person man woman child old young sitting standing running smiling food cake cup water fire").split()
COMMANDS = ("datasets-roundtrip", "pretrain", "pretrain-wds", "deform", "pick-caption", "filter", "zeroshot", "retrieve", "retrieve-wds", "retrieve-wds-indexed", "mine-positives")
ON_SHARDS = ("pretrain-wds", "retrieve-wds", "retrieve-wds-indexed")  # read the WebDataset copy
ENCODING = ("zeroshot", "retrieve", "retrieve-wds", "retrieve-wds-indexed", "mine-positives")  # start-up: seconds_to_first_batch
INDEXED = ("retrieve-wds-indexed",)  # the shard index is built (by `vltool info`) before the measured run
MINE_TAIL = 1e-5  # the share of a sample's pairs above each mining threshold (mining_thresholds)
VLTOOL = (sys.executable, "-m", "vltool")
SHARD_ROWS = 10_000  # samples per shard of the WebDataset copy (img2dataset's default)


def palette():
    import numpy as np

    return np.random.default_rng(12345).integers(0, 256, (len(WORDS), 3))  # a colour per word


PALETTE = None


def png(i: int, words) -> bytes:
    """Row i's image, as PNG: its quadrants coloured by the first four words of its caption (so that a model
    can learn to match the two), plus noise seeded by i. Every row has its own image, as in web data (with
    images reused, mine-positives would find every copy of an image a positive of every other)."""
    import io

    import numpy as np
    from PIL import Image

    global PALETTE
    if PALETTE is None:
        PALETTE = palette()
    img = np.random.default_rng(i).integers(0, 48, (32, 32, 3))
    for k, w in enumerate(list(words)[:4]):
        y, x = 16 * (k // 2), 16 * (k % 2)
        img[y : y + 16, x : x + 16] += PALETTE[w] * 207 // 255
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def pngs(first: int, words, lengths) -> list[bytes]:
    """png(first + i, words[i, :lengths[i]]) for each i, on every CPU core (fork processes): the images are
    most of the 12 minutes the 1M-row set and its shards took to build on the 2-core development machine.
    The same bytes as one process makes."""
    import multiprocessing

    n = len(lengths)
    jobs = [(first + i, words[i, : lengths[i]]) for i in range(n)]
    procs = min(os.cpu_count() or 1, max(1, n // 20_000))
    if procs <= 1:
        return [png(*job) for job in jobs]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        return pool.starmap(png, jobs, chunksize=2_000)


def build_dataset(path: Path, rows: int, chunk: int = 200_000) -> None:
    """`rows` synthetic rows saved with save_to_disk: id, image (PNG bytes), caption, captions, label."""
    import datasets
    import numpy as np

    rng = np.random.default_rng(0)
    features = datasets.Features({
        "id": datasets.Value("string"), "image": datasets.Image(), "caption": datasets.Value("string"),
        "captions": datasets.List(datasets.Value("string")),
        "label": datasets.ClassLabel(names=[f"{WORDS[k % len(WORDS)]} thing {k}" for k in range(100)]),
    })
    parts = []
    for lo in range(0, rows, chunk):
        n = min(chunk, rows - lo)
        lengths = rng.integers(5, 11, n)
        words = rng.integers(0, len(WORDS), (n, 10))
        caps = [" ".join(WORDS[w] for w in words[i, : lengths[i]]) for i in range(n)]
        parts.append(datasets.Dataset.from_dict({
            "id": [f"r{lo + i:09d}" for i in range(n)],
            "image": [{"bytes": b, "path": None} for b in pngs(lo, words, lengths)],
            "caption": caps,
            "captions": [[c, c[::-1]] for c in caps],
            "label": [(lo + i) % 100 for i in range(n)],
        }, features=features))
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    ds.save_to_disk(str(path), num_shards=max(1, rows // 500_000))


def build_one_pixel_dataset(path: Path, rows: int, chunk: int = 1_000_000) -> None:
    """build_dataset's columns (without `captions`), each row's image one and the same 1x1 PNG (--one-pixel),
    written through Arrow arrays (no per-row dicts): 10M rows in a minute and 1.4 GB of disk; saved with
    save_to_disk, so in its record batches of 100 rows."""
    import io

    import datasets
    import numpy as np
    import pyarrow as pa
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 1), (120, 30, 200)).save(buf, format="PNG")
    words = np.array(WORDS, dtype=object)
    rng = np.random.default_rng(0)
    tables = []
    for lo in range(0, rows, chunk):
        n = min(chunk, rows - lo)
        lengths = rng.integers(5, 11, n)
        picks = words[rng.integers(0, len(WORDS), (n, 10))]
        image = pa.StructArray.from_arrays([pa.array([buf.getvalue()] * n, pa.binary()), pa.nulls(n, pa.string())], names=["bytes", "path"])
        tables.append(pa.table({
            "id": pa.array([f"r{lo + i:09d}" for i in range(n)]), "image": image,
            "caption": pa.array([" ".join(p[:k]) for p, k in zip(picks, lengths)]),
            "label": pa.array((np.arange(lo, lo + n) % 100).astype(np.int64)),
        }))
    features = datasets.Features({
        "id": datasets.Value("string"), "image": datasets.Image(), "caption": datasets.Value("string"),
        "label": datasets.ClassLabel(names=[f"{WORDS[k % len(WORDS)]} thing {k}" for k in range(100)]),
    })
    datasets.Dataset(pa.concat_tables(tables)).cast(features).save_to_disk(str(path), num_shards=max(1, rows // 500_000))


def build_shards(path: Path, rows: int, distinct: int | None = None) -> str:
    """The same kind of rows as WebDataset shards in img2dataset's layout (KEY.png, KEY.txt, KEY.json, and
    NNNNN_stats.json beside each shard); returns the brace pattern naming them. With `distinct`, only the
    first `distinct` shards are written and every later one is a hard link to one of them (--linked-shards)."""
    import io
    import json as json_
    import tarfile

    import numpy as np

    rng = np.random.default_rng(0)
    path.mkdir(parents=True)
    shards = max(1, -(-rows // SHARD_ROWS))
    for s in range(shards):
        lo, hi = s * SHARD_ROWS, min(rows, (s + 1) * SHARD_ROWS)
        if distinct is not None and s >= distinct and hi - lo == SHARD_ROWS:
            os.link(path / f"{s % distinct:05d}.tar", path / f"{s:05d}.tar")
            (path / f"{s:05d}_stats.json").write_text(json_.dumps({"count": hi - lo, "successes": hi - lo}))
            continue
        lengths, words = rng.integers(5, 11, hi - lo), rng.integers(0, len(WORDS), (hi - lo, 10))
        images = pngs(lo, words, lengths)
        with tarfile.open(path / f"{s:05d}.tar", "w") as tar:
            for i in range(lo, hi):
                key = f"{i:09d}"
                cap = " ".join(WORDS[w] for w in words[i - lo, : lengths[i - lo]])
                for ext, data in (("png", images[i - lo]), ("txt", cap.encode()),
                                  ("json", json_.dumps({"key": key, "caption": cap, "status": "success"}).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        (path / f"{s:05d}_stats.json").write_text(json_.dumps({"count": hi - lo, "successes": hi - lo}))
    return str(path / f"{{00000..{shards - 1:05d}}}.tar")


def build_model(path: Path, steps: int) -> Path:
    """The bench's `vltool-micro` model: trained `steps` steps (batch 128) on 20,000 rows of the synthetic
    data, so that its embeddings spread out as a trained model's do (a random model maps every image and
    every text to nearly the same direction: every ranking is then near-ties, and retrieval falls back to
    float64 blocks); with steps 0, the random model."""
    if steps <= 0:
        import torch

        from vltool.model import ModelSpec, create_model, save_model

        torch.manual_seed(0)
        model, tok = create_model(ModelSpec(arch="vltool-micro"))
        save_model(model, tok, path / "model")
        return path
    data = path.parent / "model-train-data"
    build_dataset(data, 20_000)
    subprocess.run([*VLTOOL, "pretrain", str(data), "--arch", "vltool-micro", "--steps", str(steps), "--batch-size", "128",
                    "--lr", "2e-3", "--device", "cpu", "--out", str(path), "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["rm", "-rf", str(data)])
    return path


def mining_thresholds(model: Path, data: Path, sample: int = 2000) -> list[str]:
    """mine-positives' thresholds for the bench's model, the same at every size: each is the
    (1 - MINE_TAIL) quantile of its similarity over the pairs of `sample` rows (p1' the (1 - 10 x MINE_TAIL)
    one), so that at N rows a row has about N x MINE_TAIL candidates per term, as with a trained model
    whose positives are few. FFF's thresholds were chosen for FFF's model: a random model puts nearly every
    pair above them (every row capped at 256 positives: a 10k-row run scored about all 10^8 pairs)."""
    import numpy as np

    from vltool.encode import encode_images, encode_texts
    from vltool.io import load_dataset
    from vltool.model import load_model

    m = load_model(model)
    d = load_dataset(str(data))
    d.dataset = d.dataset.select(range(min(sample, len(d.dataset))))
    img = encode_images(m, d, progress=False).embeddings.astype(np.float64)
    txt = encode_texts(m, d, progress=False).embeddings.astype(np.float64)
    off = ~np.eye(len(img), dtype=bool)

    def q(s, tail):
        return f"{float(np.quantile(s[off], 1 - tail)):.6f}"

    s_it = img @ txt.T
    return ["--p-it", q(s_it, MINE_TAIL), "--p-ii", q(img @ img.T, MINE_TAIL), "--p-tt", q(txt @ txt.T, MINE_TAIL),
            "--p-it-tt", q(s_it, 10 * MINE_TAIL)]


MINE_ARGS: list[str] = []  # set by main from the smallest size


def command_line(command: str, data: Path, model: Path, out: Path) -> list[str]:
    common = ["--no-progress"]
    if command in ("pretrain", "pretrain-wds"):
        return [*VLTOOL, "pretrain", str(data), "--arch", "vltool-micro", "--steps", "2", "--batch-size", "64",
                "--device", "cpu", "--out", str(out), *common]
    if command == "datasets-roundtrip":  # the baseline: what `datasets` alone takes to open the set and write it again
        return [sys.executable, "-c", "import sys, datasets; datasets.load_from_disk(sys.argv[1]).save_to_disk(sys.argv[2])",
                str(data), str(out)]
    if command == "deform":
        return [*VLTOOL, "deform", str(data), "--out", str(out)]
    if command == "pick-caption":
        return [*VLTOOL, "pick-caption", str(data), "--out", str(out)]
    if command == "filter":  # the reference: the rows of one of the 100 labels (1%), so it grows with the data
        return [*VLTOOL, "filter", str(data), "--reference", str(data), "--reference-where", "label=0", "--keep-frac", "0.5",
                "--out", str(out), *common]
    if command in ("zeroshot", "retrieve", "retrieve-wds", "retrieve-wds-indexed"):
        return [*VLTOOL, command.split("-")[0], str(data), "--model", str(model), "--bootstrap", "100", "--out", str(out) + ".json", *common]
    if command == "mine-positives":
        return [*VLTOOL, "mine-positives", str(data), "--model", str(model), *MINE_ARGS, "--out", str(out), *common]
    raise SystemExit(f"unknown command {command}")


def _anon_kb(pid: int) -> int:
    """The process's anonymous resident memory (RssAnon, kB): what it allocated, without the file pages a
    memory-mapped dataset puts in its RSS (clean page cache the kernel maps around each page read)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def from_provenance(command: str, out: Path) -> dict:
    """From the command's provenance record: its own seconds from its start to its first encoded batch, and
    for mine-positives the pairs it mined (what its output, and its spill files, grow with)."""
    if command not in ENCODING:
        return {}
    path = out / "vltool.json" if command == "mine-positives" else Path(str(out) + ".json")
    try:
        prov = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    got = {"first_batch_s": prov.get("seconds_to_first_batch"), "pairs": prov.get("stats", {}).get("pairs")}
    return {k: v for k, v in got.items() if v is not None}


def page_cache(paths: list[Path], cold: bool = False) -> None:
    """Every file under `paths` read once into the page cache (a command then starts warm at every size), or
    with `cold` the whole page cache emptied (needs root: /proc/sys/vm/drop_caches)."""
    os.sync()
    if cold:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        except OSError as e:
            raise SystemExit(f"--cold: cannot empty the page cache ({e}); run as root") from None
        return
    seen = set()  # inodes (--linked-shards' hard links are read once)
    for p in paths:
        for f in sorted(Path(p).rglob("*")):
            if not f.is_file():
                continue
            st = f.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                with open(f, "rb", buffering=0) as fh:
                    while fh.read(1 << 23):
                        pass


def measure(cmd: list[str], cache: Path) -> dict:
    """Wall seconds, peak RSS (GB, the kernel's maximum resident set, from /usr/bin/time) and peak anonymous
    RSS (sampled every 20 ms) of one command in a fresh process, with its own empty cache."""
    env = {**os.environ, "VLTOOL_CACHE": str(cache), "HF_DATASETS_CACHE": str(cache / "hf"), "PYTHONWARNINGS": "ignore"}
    err = cache.parent / f"{cache.name}.stderr"
    t0 = time.perf_counter()
    with open(err, "w") as f:
        proc = subprocess.Popen(["/usr/bin/time", "-f", "VLTOOL_TIME %e %M", *cmd], env=env, stdout=subprocess.DEVNULL, stderr=f)
    anon = 0
    while proc.poll() is None:
        try:  # the command is /usr/bin/time's child
            child = int(open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()[0])
            anon = max(anon, _anon_kb(child))
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    said = err.read_text().strip().splitlines()
    line = [ln for ln in said if ln.startswith("VLTOOL_TIME ")]
    if proc.returncode != 0 or not line:
        said = [ln for ln in said if not ln.startswith("VLTOOL_TIME ")]
        return {"ok": False, "error": said[-1] if said else f"exit {proc.returncode}", "seconds": round(wall, 2)}
    _, secs, kb = line[-1].split()
    return {"ok": True, "seconds": float(secs), "peak_rss_gb": round(int(kb) / 1024**2, 3), "peak_anon_gb": round(anon / 1024**2, 3)}


def accepted(command: str, rows: int, big: bool, pairwise_max: int = 100_000) -> bool:
    """retrieve and mine-positives compare every pair of rows (10^12 pairs at 1M rows), so they stop at
    `pairwise_max` rows; --big runs everything."""
    return big or command not in ("retrieve", "retrieve-wds", "retrieve-wds-indexed", "mine-positives") or rows <= pairwise_max


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    axes[1].set_prop_cycle(color=plt.cm.tab20.colors)  # more series than the default ten colours
    for command in dict.fromkeys(r["command"] for r in results):
        pts = [r for r in results if r["command"] == command and r["ok"]]
        if pts:
            line = axes[1].plot([p["rows"] for p in pts], [p["peak_rss_gb"] for p in pts], "o-", label=command)[0]
            starts = [(p["rows"], startup(p)) for p in pts if startup(p) is not None]
            if starts:  # deform, pick-caption and filter have no start-up
                axes[0].plot(*zip(*starts), "o-", color=line.get_color(), label=command)
            if all("peak_anon_gb" in p for p in pts):
                axes[1].plot([p["rows"] for p in pts], [p["peak_anon_gb"] for p in pts], "x--", color=line.get_color(), alpha=0.6)
    for ax, ylabel in zip(axes, ("start-up (s): to 2 steps / the first batch",
                                 "peak RSS (GB); dashed: anonymous")):
        ax.set_xscale("log")
        ax.set_xlabel("rows")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))  # beside the plots, clear of the lines
    axes[0].set_ylim(bottom=0)
    fig.suptitle("vltool at scale: start-up and peak memory against rows (bench/bench_scale.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="10000,100000,1000000")
    ap.add_argument("--big", action="store_true", help="add 10M rows, and run the encoding commands at every size")
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--mine-index", choices=["flat", "blocked"], default=None,
                    help="mine-positives' --index [default: blocked on a GPU machine, flat on a CPU]; a non-default one "
                         "labels its rows")
    ap.add_argument("--pairwise-max", type=int, default=100_000,
                    help="the largest size at which retrieve and mine-positives (which score every pair of rows) run")
    ap.add_argument("--model-steps", type=int, default=500, help="train the bench's model this many steps first (0: a random model)")
    ap.add_argument("--out", default="bench-scale")
    ap.add_argument("--work", default=None, help="where the synthetic data go [default: a temporary directory]")
    ap.add_argument("--data-dir", default=None,
                    help="keep the synthetic data and the model here and reuse them (built when missing, never deleted)")
    ap.add_argument("--build-only", action="store_true", help="with --data-dir: build the data and the model, measure nothing")
    ap.add_argument("--one-pixel", action="store_true",
                    help="datasets on disk whose rows all carry one 1x1 PNG, built through Arrow (10M rows in a minute, "
                         "1.4 GB): for pretrain's start-up, which decodes no image before its first step; the rows are "
                         "labelled 'COMMAND (1x1 images)'")
    ap.add_argument("--cold", action="store_true",
                    help="empty the page cache (as root) before each command, instead of reading its input's files first")
    ap.add_argument("--second-run", action="store_true",
                    help="run pretrain a second time with the cache the first run left (the verdict on its rows, "
                         "as a resume or a later run on the same data finds it), labelled '(second run)'")
    ap.add_argument("--linked-shards", type=int, default=None, metavar="K",
                    help="write only K distinct shards at each size; the others are hard links to them (the same samples "
                         "again, under the same keys): 10M samples in 1,000 shards on the disk of 10. For pretrain-wds, "
                         "whose start-up and memory depend on the shards and samples listed, not on their content")
    ap.add_argument("--merge", nargs="+", default=None, metavar="SCALE_JSON",
                    help="measure nothing: the table, ratios and PNG of earlier runs' scale.json files together")
    args = ap.parse_args()
    sizes = [int(s) for s in args.rows.split(",")] + ([10_000_000] if args.big else [])
    commands = args.commands.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        results = merged([json.loads(Path(f).read_text())["results"] for f in args.merge])
        commands = sorted(dict.fromkeys(r["command"] for r in results), key=command_order)
        report(results, commands, sorted({r["rows"] for r in results}), out)
        return
    results = []
    keep = Path(args.data_dir) if args.data_dir else None
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        store = keep or work
        t0 = time.perf_counter()
        model = store / "m"
        if not (model / "model").is_dir():
            build_model(model, args.model_steps)
        print(f"model ready in {time.perf_counter() - t0:.1f} s", flush=True)
        for rows in sizes:
            data, shard_dir = store / f"data-{rows}", store / f"shards-{rows}"
            t0 = time.perf_counter()
            if any(c not in ON_SHARDS for c in commands) and not (data / "state.json").is_file():
                (build_one_pixel_dataset if args.one_pixel else build_dataset)(data, rows)
            shards = None
            if any(c in ON_SHARDS for c in commands):
                n_shards = max(1, -(-rows // SHARD_ROWS))
                if not (shard_dir / f"{n_shards - 1:05d}_stats.json").is_file():
                    subprocess.run(["rm", "-rf", str(shard_dir)])
                    build_shards(shard_dir, rows, distinct=args.linked_shards)
                shards = str(shard_dir / f"{{00000..{n_shards - 1:05d}}}.tar")
            os.sync()  # the data on disk before any measurement (write-back would slow the first command)
            print(f"built {rows:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)
            if args.build_only:
                continue
            if "mine-positives" in commands and not MINE_ARGS:
                MINE_ARGS.extend(mining_thresholds(model, data))
                if mine_index(args) == "blocked":  # on a GPU, the index its user mines with: torch matmuls, not faiss-cpu
                    MINE_ARGS.extend(["--index", "blocked"])
                print("mine-positives options:", " ".join(MINE_ARGS), flush=True)
            for command in commands:
                if not accepted(command, rows, args.big, args.pairwise_max):
                    continue
                source = shards if command in ON_SHARDS else data
                out_path = work / f"out-{command}-{rows}"
                if command in INDEXED:  # the index a first command on these shards builds, built beforehand
                    cache = work / f"cache-{command}-{rows}"
                    subprocess.run([*VLTOOL, "info", str(source)], env={**os.environ, "VLTOOL_CACHE": str(cache)},
                                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for again in range(1 + (args.second_run and command == "pretrain")):  # a second run finds the cache the first left
                    run_out = out_path.with_name(out_path.name + "-again") if again else out_path
                    page_cache([shard_dir if command in ON_SHARDS else data, model], cold=args.cold)
                    res = measure(command_line(command, source, model, run_out), work / f"cache-{command}-{rows}")
                    res.update(command=command + label(command, args, again), rows=rows)
                    if res["ok"]:
                        res["rows_per_s"] = round(rows / res["seconds"], 1)
                        res.update(from_provenance(command, run_out))
                    results.append(res)
                    print(json.dumps(res), flush=True)
            if keep is None:
                subprocess.run(["rm", "-rf", str(data), str(shard_dir)])
            subprocess.run(["rm", "-rf"] + [str(p) for p in work.glob(f"out-*-{rows}*")] + [str(p) for p in work.glob(f"cache-*-{rows}")])
    if not args.build_only:
        report(results, list(dict.fromkeys(r["command"] for r in results)), sizes, out)


def gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def mine_index(args) -> str:
    """mine-positives' --index: --mine-index, else blocked on a GPU machine and flat (faiss) on a CPU."""
    return args.mine_index or ("blocked" if gpu() else "flat")


def merged(runs: list[list[dict]]) -> list[dict]:
    """Several runs' results as one list: a later run's measurement of a command at a size replaces an
    earlier one's; sorted by size, then in COMMANDS' order."""
    latest = {(r["command"], r["rows"]): r for results in runs for r in results}
    return sorted(latest.values(), key=lambda r: (r["rows"], *command_order(r["command"])))


def command_order(command: str) -> tuple:
    """A (possibly labelled) command's place: COMMANDS' order, then its name."""
    return (COMMANDS.index(base(command)) if base(command) in COMMANDS else len(COMMANDS), command)


def base(command: str) -> str:
    """The command of a result's (possibly labelled) name: 'pretrain (1x1 images)' -> 'pretrain'."""
    return command.split(" (")[0]


def label(command: str, args, again: bool = False) -> str:
    """What sets a run's rows apart from the plain synthetic data, in its command name."""
    marks = []
    if args.linked_shards and command in ON_SHARDS:
        marks.append(f"{args.linked_shards} distinct shards")
    if args.one_pixel and command not in ON_SHARDS:
        marks.append("1x1 images")
    if again:
        marks.append("second run")
    if command == "mine-positives" and mine_index(args) == "blocked":
        marks.append("--index blocked, GPU" if gpu() else "--index blocked")
    return f" ({', '.join(marks)})" if marks else ""


def startup(r: dict) -> float | None:
    """Start-up: pretrain's whole run (two steps), an encoding command's seconds to its first batch; deform,
    pick-caption and filter have none."""
    if base(r["command"]) in ("pretrain", "pretrain-wds"):
        return r["seconds"]
    return r.get("first_batch_s")


def report(results: list[dict], commands: list[str], sizes: list[int], out: Path) -> None:
    """The table, the growth ratios, OUT/scale.json and OUT/scale.png."""
    print("\n| command | rows | start-up (s) | seconds | rows/s | peak RSS (GB) | peak anonymous RSS (GB) |\n|---|---|---|---|---|---|---|")
    for r in results:
        if r["ok"]:
            start = startup(r)
            print(f"| {r['command']} | {r['rows']:,} | {'' if start is None else f'{start:.1f}'} | {r['seconds']:.1f} | {r['rows_per_s']:,.0f} | "
                  f"{r['peak_rss_gb']:.2f} | {r['peak_anon_gb']:.2f} |")
        else:
            print(f"| {r['command']} | {r['rows']:,} | | failed: {r['error']} | | | |")
    print("\ngrowth from the smallest to the largest size measured (target: start-up and peak memory within 2x):")
    for command in commands:
        pts = [r for r in results if r["command"] == command and r["ok"]]
        if len(pts) >= 2:
            a, b = pts[0], pts[-1]
            sa, sb = startup(a), startup(b)
            grow = f"start-up x{sb / sa:.2f}, " if sa and sb is not None else ""
            print(f"  {command}: {a['rows']:,} -> {b['rows']:,} rows: {grow}time x{b['seconds'] / a['seconds']:.2f}, "
                  f"peak RSS x{b['peak_rss_gb'] / a['peak_rss_gb']:.2f}, peak anonymous RSS x{b['peak_anon_gb'] / a['peak_anon_gb']:.2f}")
    (out / "scale.json").write_text(json.dumps({"results": results, "sizes": sizes}, indent=2))
    plot(results, out / "scale.png")
    print(f"wrote {out / 'scale.json'}, {out / 'scale.png'}")


if __name__ == "__main__":
    main()
