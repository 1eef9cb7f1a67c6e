"""The training rows and the order a step sees them in, one module per concern; each imports only the ones
before it: checks, positives, rows, unicl, samplers, items, streams.

    checks.py     ids unique, rows without text, the verdict kept in the cache
    positives.py  --mined-positives: each row's positive rows
    rows.py       TrainData and load_train_data (the inputs concatenated, checked, rows without text dropped)
    unicl.py      load_unicl_data: UniCL's image-label and image-text rows, each with its label
    samplers.py   the epoch order: EpochBatches, BalancedEpochBatches, make_sampler
    items.py      PairDataset (item (epoch, row) -> image and text, seeded per row) and Collate
    streams.py    WebDataset shards streamed: ShardData, ShardStream, stream_micro_batches

The names the single module `data.py` had are re-exported here (its tunable constants are not: set them in
their modules).
"""

from vltool.pretrain.data.checks import check_ids, check_rows, refuse_repeated_ids
from vltool.pretrain.data.positives import refuse_unknown_positives
from vltool.pretrain.data.rows import TrainData, load_train_data, rows_key, texts_of
from vltool.pretrain.data.unicl import UNICL_TEXT, load_unicl_data
from vltool.pretrain.data.samplers import BalancedEpochBatches, EpochBatches, make_sampler
from vltool.pretrain.data.items import Collate, PairDataset, row_seed
from vltool.pretrain.data.streams import ShardData, ShardStream, counted_samples, load_shard_data, loader_options, shard_batches, shard_samples_index, stream_micro_batches, substreams

__all__ = ["BalancedEpochBatches", "Collate", "EpochBatches", "PairDataset", "ShardData", "ShardStream", "TrainData", "UNICL_TEXT", "check_ids", "check_rows", "counted_samples", "load_shard_data", "load_train_data", "load_unicl_data", "loader_options", "make_sampler", "refuse_repeated_ids", "refuse_unknown_positives", "row_seed", "rows_key", "shard_batches", "shard_samples_index", "stream_micro_batches", "substreams", "texts_of"]
