"""`vltool import`: image-text data from the formats of open_clip's ecosystem into the dataset contract.

One module per source format, behind the table of formats and the dispatch in `core`:

- `core`: finding the sources and their format, the table of formats, planning, the workers, the output
- `common`: what the formats share (ImportConfig, skip reasons, the plan, one row, images, chunk files)
- `csv_tsv`, `jsonl`, `parquet`, `webdataset`, `imagefolder`, `coco`, `clip_benchmark`: one format each

The names the former `vltool/importer.py` module defined are re-exported here (`from vltool.importer import
import_data` keeps working); a test that patches one patches it in its module.
"""

from vltool.importer.core import (
    collect_skips, detect_format, expand_sources, generate_rows, import_data, plan_import,
    refuse_options_for_format, resolve_sources, write_import,
)
from vltool.importer.common import (
    BAD_ROW, CAPTION_COLUMN_CANDIDATES, CHUNK_ROWS, FORMATS, ID_COLUMN_CANDIDATES, IMAGE_COLUMN_CANDIDATES,
    LABEL_BEYOND_CLASSES, MISSING_FILE, MISSING_LABEL, REPORT_FILE, TABLE_FORMATS, TOO_LARGE, UNDECODABLE,
    ImportConfig, prepare_image,
)
from vltool.importer.clip_benchmark import (
    CB_CACHE, CB_CLASSNAMES, CB_IMAGE_EXTS, CB_NSHARDS, CB_TEMPLATES, CB_TYPE, CB_TYPES, _layout_digest,
    clip_benchmark_input, clip_benchmark_splits, import_clip_benchmark, is_clip_benchmark,
    read_clip_benchmark_layout, read_clip_benchmark_splits, write_clip_benchmark,
)
from vltool.importer.imagefolder import imagefolder_class_names
from vltool.shards import (
    BAD_SHARD, DUPLICATE_ID, EMPTY_CAPTION, IMAGE_EXTS, NO_IMAGE, TAR_SUFFIXES, clean_captions, expand_braces,
    iter_samples, iter_tar, split_member, text_value,
)

__all__ = [
    "BAD_ROW",
    "BAD_SHARD",
    "CAPTION_COLUMN_CANDIDATES",
    "CB_CACHE",
    "CB_CLASSNAMES",
    "CB_IMAGE_EXTS",
    "CB_NSHARDS",
    "CB_TEMPLATES",
    "CB_TYPE",
    "CB_TYPES",
    "CHUNK_ROWS",
    "DUPLICATE_ID",
    "EMPTY_CAPTION",
    "FORMATS",
    "ID_COLUMN_CANDIDATES",
    "IMAGE_COLUMN_CANDIDATES",
    "IMAGE_EXTS",
    "ImportConfig",
    "LABEL_BEYOND_CLASSES",
    "MISSING_FILE",
    "MISSING_LABEL",
    "NO_IMAGE",
    "REPORT_FILE",
    "TABLE_FORMATS",
    "TAR_SUFFIXES",
    "TOO_LARGE",
    "UNDECODABLE",
    "_layout_digest",
    "clean_captions",
    "clip_benchmark_input",
    "clip_benchmark_splits",
    "collect_skips",
    "detect_format",
    "expand_braces",
    "expand_sources",
    "generate_rows",
    "imagefolder_class_names",
    "import_clip_benchmark",
    "import_data",
    "is_clip_benchmark",
    "iter_samples",
    "iter_tar",
    "plan_import",
    "prepare_image",
    "read_clip_benchmark_layout",
    "read_clip_benchmark_splits",
    "refuse_options_for_format",
    "resolve_sources",
    "split_member",
    "text_value",
    "write_clip_benchmark",
    "write_import",
]
