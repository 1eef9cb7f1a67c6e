"""The epoch order of a table of rows: global micro-batch k of epoch e is a slice of a permutation that
depends on (seed, e) only, and process r takes its r-th part (`EpochBatches`); UniCL's balanced epochs
(`BalancedEpochBatches`, --balanced). So N processes with --accum-steps A see what one process with batch
A x N x B sees, and a resumed run continues exactly."""

from __future__ import annotations


import numpy as np

from vltool.pretrain.config import PretrainConfig
from vltool.pretrain.data.rows import TrainData


class EpochBatches:
    """Micro-batches of this process from micro-batch `start` to `stop` (exclusive).

    Global micro-batch k of epoch e is rows perm_e[k*G:(k+1)*G] (G = batch * processes); process r takes
    its r-th slice of B rows. perm_e depends on (seed, e) only. An epoch holds whole optimizer steps of
    `accum` micro-batches (the last incomplete step dropped), so step s takes exactly the rows, in order,
    that one process with batch accum * processes * B takes at its step s.
    """

    def __init__(self, n: int, batch: int, world: int, rank: int, seed: int, start: int, stop: int, accum: int = 1):
        self.n, self.batch, self.world, self.rank, self.seed = n, batch, world, rank, seed
        self.per_epoch = n // (batch * world * accum) * accum
        self.start, self.stop = start, stop

    def perm(self, epoch: int) -> np.ndarray:
        """(n,) the epoch's order of the rows: Generator.permutation(n)'s, shuffled in place in 4-byte rows
        where they fit (the same draws, so the same order: 40 MB at 10M rows, not 80)."""
        order = np.arange(self.n, dtype=np.int32 if self.n < 2**31 else np.int64)
        np.random.default_rng([self.seed, 7919, epoch]).shuffle(order)
        return order

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self):
        cached = (None, None)
        for mb in range(self.start, self.stop):
            epoch, k = divmod(mb, self.per_epoch)
            if cached[0] != epoch:
                cached = (epoch, self.perm(epoch))
            g0 = k * self.batch * self.world + self.rank * self.batch
            yield [(epoch, int(r)) for r in cached[1][g0 : g0 + self.batch]]


class BalancedEpochBatches:
    """UniCL B.2: epoch e holds every image-label row and min(#label, #text) image-text rows drawn anew
    (without replacement, seeded by (seed, e)), shuffled together; batching as EpochBatches."""

    def __init__(self, label_rows, text_rows, batch: int, world: int, rank: int, seed: int, start: int, stop: int, accum: int = 1):
        self.label_rows, self.text_rows = np.asarray(label_rows), np.asarray(text_rows)
        self.n = len(self.label_rows) + min(len(self.label_rows), len(self.text_rows))
        self.inner = EpochBatches(self.n, batch, world, rank, seed, start, stop, accum)
        self.inner.perm = self.perm
        self.per_epoch = self.inner.per_epoch

    def perm(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.inner.seed, 7919, epoch])
        drawn = rng.choice(self.text_rows, size=self.n - len(self.label_rows), replace=False)
        return rng.permutation(np.concatenate([self.label_rows, drawn]))

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        return iter(self.inner)


def make_sampler(train: TrainData, config: PretrainConfig, world: int, rank: int, start: int, stop: int):
    if config.balanced and train.templated is not None:
        rows = np.arange(len(train.dataset))
        return BalancedEpochBatches(rows[train.templated], rows[~train.templated], config.batch_size, world, rank, config.seed, start,
                                    stop, config.accum_steps)
    return EpochBatches(len(train.dataset), config.batch_size, world, rank, config.seed, start, stop, config.accum_steps)
