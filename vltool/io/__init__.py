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

The names are loaded on first use (`__getattr__`): importing one module of the package (commands/common.py
imports `locks`, so `vltool --help` does) runs this file but none of the other modules. datasets, pyarrow and
PIL are imported inside the functions that use them.
"""

_WHERE = {  # name -> the module of vltool.io that defines it
    **dict.fromkeys(('image_size_policy', 'image_bytes', 'decode_image', 'decode_pixels', 'require_a_decodable_image'), 'images'),
    **dict.fromkeys(('read_provenance',), 'records'),
    **dict.fromkeys(('ASSETS', 'BUILTIN_DATASETS', 'TEST_ONLY_DATASETS'), 'builtin'),
    **dict.fromkeys(('is_main_process', 'STALE_MARKS', 'OutputBusy', 'lock_file', 'output_scope', 'hold_output_lock', 'LOCK_HELD_ERRNOS', 'refuse_if_busy', 'clean_stale'), 'locks'),
    **dict.fromkeys(('model_inputs', 'check_output', 'OUTPUT_MARKS', 'require_output_name', 'check_writable', 'not_writable'), 'outputs'),
    **dict.fromkeys(('work_dir', 'final_of_work_dir', 'atomic_output', 'replace_path', 'atomic_file', 'write_json_atomic', 'save_dataset'), 'atomic'),
    **dict.fromkeys(('default_cache_dir', 'SHARD_INDEX_DIR', 'SHARD_INDEX_VERSION', 'SHARD_INDEX_COMMAND', 'RESERVED_COLUMNS', 'ShardIndex', 'is_shard_input', 'shard_index', 'INDEX_DATA_FILE', 'INDEX_BATCH', 'duplicate_rows'), 'index'),
    **dict.fromkeys(('Where', 'LoadedDataset', 'resolve_dataset_path', 'load_dataset', 'read_from_disk', 'tar_paths_add_no_bytes', 'require_columns', 'apply_where'), 'loading'),
    **dict.fromkeys(('test_only_origin', 'test_only_inputs'), 'heldout'),
    **dict.fromkeys(('arrow_column', 'values_digest', 'column_digest', 'strings_digest', 'shared_ids', 'rows_in_both', 'column_values'), 'digests'),
}


def __getattr__(name: str):
    """`from vltool.io import NAME` imports NAME's own module, and only it (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module 'vltool.io' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"vltool.io.{_WHERE[name]}"), name)


__all__ = list(_WHERE)
