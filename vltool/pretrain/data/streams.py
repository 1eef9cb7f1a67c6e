"""WebDataset shards streamed (docs/pretrain.md, "Streaming shards"): `ShardData` and `load_shard_data` (no row
read before training starts), `ShardStream` (one stream per process x worker, seeded shard order and
shuffle buffer, exact resume), and the trainer's micro-batches from it (`stream_micro_batches`)."""

from __future__ import annotations

import sys
import tarfile
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from vltool import columns as C
from vltool.errors import UsageError, VltoolError, out_of_resources
from vltool.io.digests import arrow_column
from vltool.io.index import shard_index
from vltool.io.loading import read_from_disk
from vltool.pretrain.config import PretrainConfig
from vltool.pretrain.data.checks import check_ids, refuse_repeated_ids
from vltool.pretrain.data.items import Collate
from vltool.pretrain.workers import guarded, worker_init
from vltool.shards import iter_samples, load_shards, sample_id, sample_image, sample_text
from vltool.topology import warn


@dataclass
class ShardData:
    """Training data read as a stream from WebDataset shards: no row is read before training starts."""

    inputs: list  # vltool.shards.ShardSource of each DATA argument
    shards: list  # every shard, in the order of the arguments
    text_column: str
    rows: int | None  # samples with an image and a text, counted by the shards' index (None: not counted, below)
    empty_text_ids: list = field(default_factory=list)  # (samples without text are skipped in their batch, as bad images)
    positives: dict | None = None
    labels: Any = None
    templated: Any = None
    templates: list | None = None
    rows_key: dict | None = None
    text_source: str = ""

    @property
    def rows_in(self) -> int | None:
        return self.rows


def load_shard_data(data: Sequence[str], config: PretrainConfig, where: Sequence[str] = (), split: str | None = None) -> ShardData:
    """The shards of every DATA argument (patterns expanded, each shard checked to exist); what streaming
    cannot do is refused here, before anything is written."""
    problems = []
    if where or split:
        problems.append("--where and --split select rows of a dataset; shards are streamed whole (select before sharding)")
    if config.loss == "unicl" or config.mined_positives or config.balanced:
        problems.append("--loss unicl, --mined-positives and --balanced need the whole table of rows: import the shards first (vltool import)")
    if config.bias_init == "search":
        problems.append("--bias-init search reads the first batches before training: give a number with shards")
    if problems:
        raise UsageError("; ".join(problems))
    lists = bool(config.caption_sampling) or config.captions_per_image > 1
    sources = [load_shards(spec) for spec in data]
    shards = [p for s in sources for p in s.shards]
    indexes = [shard_samples_index(source) for source in sources]  # counted and their ids checked, as a dataset's
    for source, index in zip(sources, indexes):
        source.rows = counted_samples(source, len(index))
    if len(sources) > 1:
        check_ids([(s.spec, arrow_column(index, C.ID)) for s, index in zip(sources, indexes)], config.prefix_ids)
    return ShardData(sources, shards, C.CAPTIONS if lists else config.text_column, sum(s.rows for s in sources))


def shard_samples_index(source):
    """The index of a DATA argument's shards (vltool.io.shard_index: built once, one pass over the shards'
    headers and small members, then read from the cache): one row per sample with an image and a text.
    Shards whose samples repeat an id are refused, as a dataset whose ids repeat is (check_ids)."""
    path = shard_index(source.spec).path
    refuse_repeated_ids(source.spec, path)
    return read_from_disk(path, source.spec)


def counted_samples(source, indexed: int) -> int:
    """The samples an epoch of `source` holds: the index's count. img2dataset's statistics files
    (`successes`), when every shard has one, are only compared with it: a disagreement is a warning."""
    if source.rows is not None and source.rows != indexed:
        warn(f"{source.spec}: img2dataset's statistics files (*_stats.json) count {source.rows:,} samples, but the shards "
             f"hold {indexed:,} with an image and a text; an epoch is the {indexed:,}")
    return indexed


def substreams(batch: int, workers: int) -> list[int]:
    """Rows each data stream of a process gives to its micro-batch: `batch` split over max(1, workers)
    streams, the first ones taking one more when it does not divide."""
    w = max(1, workers)
    return [batch // w + (1 if i < batch % w else 0) for i in range(w)]


class ShardStream(torch.utils.data.IterableDataset):
    """The sample stream of each data-loader worker, read from the shards: an IterableDataset yielding
    {"stream", "items", "position"} with `items` the next b items of the worker's stream.

    With `collate`, the b items are collated in the worker ("batch" in place of "items"): the trainer gives each
    worker b = the whole micro-batch, so a micro-batch is built where it is read (stream_micro_batches).

    There are S = processes x max(1, workers) streams; stream s = worker * processes + rank (stream_of). Epoch e of stream s
    reads the shards perm_e[s::S] (perm_e a permutation of all shards seeded by (seed, e)) through a
    shuffle buffer of `buffer` samples seeded by (seed, e, s); a stream goes on into the next epoch when
    its shards are read (streams end their epochs independently). An item's augmentation is seeded by
    (seed, epoch, shard, sample index in the shard). `starts[worker]` = (epoch, samples consumed in it)
    resumes a stream: the samples before are read again without being decoded.
    """

    def __init__(self, shards: Sequence, make_item, text_column: str, world: int, rank: int, sizes: Sequence[int], seed: int,
                 buffer: int, starts: dict | None = None, collate=None, rotate: int = 0):
        super().__init__()
        self.collate = collate  # set: each sub-batch is collated where it is read (the worker), not by the trainer
        self.rotate = rotate  # DataLoader worker w reads the stream of worker (w + rotate) mod W (a resume's turn)
        self.shards = [str(p) for p in shards]
        self.make_item, self.text_column = make_item, text_column
        self.world, self.rank, self.sizes, self.seed, self.buffer = world, rank, list(sizes), seed, buffer
        self.starts = dict(starts or {})
        self.damaged: set[int] = set()  # shards found unreadable part-way (warned about once per data stream)
        self.streams = world * len(self.sizes)
        if len(self.shards) < self.streams:
            raise UsageError(
                f"{len(self.shards)} shard(s) for {world} process(es) x {len(self.sizes)} data stream(s) each: every stream "
                "reads whole shards, so give at least as many shards as processes x max(1, --workers)")

    def stream_of(self, worker: int) -> int:
        """The data stream a worker of this process reads: worker-major, s = worker x processes + rank, so that
        the processes' micro-batches of one turn together are the streams one process with processes x W
        workers reads in that many turns."""
        return worker * self.world + self.rank

    def shard_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, 7919, epoch]).permutation(len(self.shards))

    def raw_samples(self, stream: int, epoch: int):
        """(shard index, index in the shard, key, files) of the stream's epoch, in shard order (unshuffled).
        A damaged shard is read up to the damage, with a warning; the stream reads on from its next shard
        (the same samples every time, so a resumed run still sees exactly the uninterrupted run's)."""
        for shard in self.shard_order(epoch)[stream :: self.streams]:
            j = 0
            try:
                for j, (key, files) in enumerate(iter_samples(self.shards[shard]), start=1):
                    yield int(shard), j - 1, key, files
            except (tarfile.TarError, OSError, EOFError) as e:
                if out_of_resources(e):  # the machine's limit (open files), not the shard's damage
                    raise
                if shard not in self.damaged:
                    self.damaged.add(shard)
                    print(f"warning: {self.shards[shard]}: unreadable after {j} sample(s) ({type(e).__name__}: {e}); "
                          "the rest of this shard is skipped", file=sys.stderr, flush=True)

    def samples(self, stream: int, epoch: int, skip: int = 0):
        """(epoch, samples of the epoch consumed so far, raw sample) for ever, from `skip` samples into `epoch`."""
        while True:
            rng = np.random.default_rng([self.seed, 7919, epoch, stream])
            buf: list = []
            n = 0
            for raw in self.raw_samples(stream, epoch):
                if len(buf) < self.buffer:
                    buf.append(raw)
                    continue
                j = int(rng.integers(self.buffer))
                out, buf[j] = buf[j], raw
                n += 1
                if n > skip:
                    yield epoch, n, out
            while buf:  # the epoch's end: the buffer drained in a random order
                j = int(rng.integers(len(buf)))
                buf[j], buf[-1] = buf[-1], buf[j]
                out = buf.pop()
                n += 1
                if n > skip:
                    yield epoch, n, out
            if n == 0:
                raise VltoolError(f"data stream {stream} read no sample from its shards in epoch {epoch}")
            epoch, skip = epoch + 1, 0

    def item(self, epoch: int, raw) -> dict:
        shard, j, key, files = raw
        image = sample_image(files)
        return self.make_item(epoch, shard << 32 | j, sample_id(key, files), sample_text(files, self.text_column),
                              {"bytes": image, "path": None} if image is not None else None)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = ((info.id if info is not None else 0) + self.rotate) % len(self.sizes)
        stream = self.stream_of(worker)
        epoch, skip = self.starts.get(worker, (0, 0))
        it = self.samples(stream, epoch, skip)
        b = self.sizes[worker]
        while True:
            items, position = [], None
            for _ in range(b):
                epoch, n, raw = next(it)
                items.append(self.item(epoch, raw))
                position = (epoch, n)
            if self.collate is None:
                yield {"stream": worker, "items": items, "position": position}
            else:  # one image tensor and one token tensor cross to the trainer, not a tensor per sample
                yield {"stream": worker, "batch": self.collate(items), "position": position}


def shard_batches(loader, collate: Collate, streams: int, positions: dict):
    """Micro-batches of a process from a ShardStream loader without `collate` (items): the next sub-batch of
    each of its `streams` streams (the loader takes its workers in turn), collated here in stream order.
    The trainer uses stream_micro_batches instead (whole micro-batches built in the workers). `positions`
    (stream -> (epoch, samples consumed)) is updated as each micro-batch is taken."""
    it = iter(loader)
    while True:
        subs = [next(it) for _ in range(streams)]
        assert [s["stream"] for s in subs] == list(range(streams)), "data-loader workers out of turn"
        batch = collate([x for s in subs for x in s["items"]])
        positions.update({s["stream"]: tuple(s["position"]) for s in subs})
        yield batch


def loader_options(workers: int, pin: bool) -> dict:
    """The DataLoader options of the trainer (both kinds of data): `workers` processes, 4 batches each ahead,
    each ending at once when it cannot send a batch (vltool.pretrain.workers: read them with `guarded`)."""
    return dict(num_workers=workers, pin_memory=pin, persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None,
                worker_init_fn=worker_init if workers > 0 else None)


def stream_micro_batches(stream: ShardStream, workers: int, pin: bool = False, positions: dict | None = None):
    """The trainer's micro-batches of a ShardStream built with `collate` and sizes [B] x W: micro-batch j of
    this process is the next B samples of worker (rotate + j) mod W, built and collated in that worker and
    received whole (one image tensor and one token tensor; pinned by the DataLoader with `pin`). `positions`
    receives each worker's stream position as its micro-batches are taken. The trainer does no per-sample
    work and no copy of its own. A worker that fails ends it with one VltoolError (vltool.pretrain.workers)."""
    loader = torch.utils.data.DataLoader(stream, batch_size=None, **loader_options(workers, pin))
    w = len(stream.sizes)
    positions = {} if positions is None else positions
    j = 0
    for sub in guarded(loader):
        expected = (stream.rotate + j) % w
        assert sub["stream"] == expected, f"data-loader worker {sub['stream']} out of turn (expected {expected})"
        positions[sub["stream"]] = tuple(sub["position"])
        j += 1
        yield sub["batch"]
