"""Reading inputs, writing outputs: the dataset contract every command shares (docs/conventions.md).

One module per concern; the names below are re-exported here, so `from vltool.io import NAME` keeps working
(vltool's own modules import from the module that defines a name).

- `loading`: a dataset argument to a dataset: `load_dataset`, `--split`, `--where` (`Where`, `apply_where`),
  `LoadedDataset`, `read_from_disk`, `require_columns`.
- `builtin`: the datasets vltool ships (`emoji`, `emoji-openmoji`); `heldout`: the test-only rule
  (`test_only_inputs`).
- `digests`: whole-column reads and digests (`arrow_column`, `column_digest`, `strings_digest`) and the ids two
  inputs share (`shared_ids`, `rows_in_both`).
- `records`: the provenance record a dataset or output carries (`read_provenance`).
- `outputs`: refusing a bad `--out` before any work (`check_output`, `model_inputs`, `require_output_name`).
- `locks`: one writer per output (`output_scope`, `hold_output_lock`, `OutputBusy`), stale temporaries
  (`clean_stale`), a full disk as one line.
- `atomic`: atomic writes (`atomic_output`, `replace_path`, `work_dir`, `atomic_file`, `write_json_atomic`,
  `save_dataset`).
- `images`: image decoding (`decode_image`, `decode_pixels`, `image_bytes`, `image_size_policy`).
- `index`: the shard index of WebDataset shards given directly (`shard_index`, `is_shard_input`,
  `duplicate_rows`) and vltool's cache directory (`default_cache_dir`).

Import order inside the package (each module imports only modules before it; no cycle; none imports this
`__init__`): images, records, builtin, locks, outputs, atomic, index, loading, heldout, digests.
(heldout and digests name `LoadedDataset` from loading in annotations only.)

datasets, pyarrow and PIL are imported inside the functions that use them: `vltool --help` loads this package
(through commands/common.py), and importing them costs about a second.
"""

from vltool.io.images import image_size_policy, image_bytes, decode_image, decode_pixels, require_a_decodable_image
from vltool.io.records import read_provenance
from vltool.io.builtin import ASSETS, BUILTIN_DATASETS, TEST_ONLY_DATASETS
from vltool.io.locks import (is_main_process, STALE_MARKS, OutputBusy, lock_file, output_scope, hold_output_lock,
    LOCK_HELD_ERRNOS, refuse_if_busy, clean_stale,
)
from vltool.io.outputs import model_inputs, check_output, OUTPUT_MARKS, require_output_name, check_writable, not_writable
from vltool.io.atomic import work_dir, final_of_work_dir, atomic_output, replace_path, atomic_file, write_json_atomic, save_dataset
from vltool.io.index import (default_cache_dir, SHARD_INDEX_DIR, SHARD_INDEX_VERSION, SHARD_INDEX_COMMAND, RESERVED_COLUMNS,
    ShardIndex, is_shard_input, shard_index, INDEX_DATA_FILE, INDEX_BATCH, duplicate_rows,
)
from vltool.io.loading import (Where, LoadedDataset, resolve_dataset_path, load_dataset, read_from_disk,
    tar_paths_add_no_bytes, require_columns, apply_where,
)
from vltool.io.heldout import test_only_origin, test_only_inputs
from vltool.io.digests import arrow_column, values_digest, column_digest, strings_digest, shared_ids, rows_in_both, column_values

__all__ = [
    "ASSETS", "BUILTIN_DATASETS", "TEST_ONLY_DATASETS", "Where", "LoadedDataset", "resolve_dataset_path",
    "load_dataset", "read_from_disk", "tar_paths_add_no_bytes", "arrow_column", "values_digest", "column_digest",
    "strings_digest", "shared_ids", "rows_in_both", "column_values", "require_columns", "apply_where", "model_inputs",
    "check_output", "OUTPUT_MARKS", "require_output_name", "check_writable", "not_writable", "is_main_process",
    "STALE_MARKS", "OutputBusy", "lock_file", "output_scope", "hold_output_lock", "LOCK_HELD_ERRNOS", "refuse_if_busy",
    "clean_stale", "work_dir", "final_of_work_dir", "atomic_output", "replace_path", "atomic_file", "write_json_atomic",
    "save_dataset", "read_provenance", "test_only_origin", "test_only_inputs", "default_cache_dir", "image_size_policy",
    "image_bytes", "decode_image", "decode_pixels", "require_a_decodable_image", "SHARD_INDEX_DIR", "SHARD_INDEX_VERSION",
    "SHARD_INDEX_COMMAND", "RESERVED_COLUMNS", "ShardIndex", "is_shard_input", "shard_index", "INDEX_DATA_FILE",
    "INDEX_BATCH", "duplicate_rows",
]
