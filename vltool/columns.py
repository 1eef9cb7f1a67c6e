"""Column names of the dataset contract (docs/conventions.md). Every command uses these constants."""

ID = "id"  # string, unique, stable through every transformation
IMAGE = "image"  # datasets.Image
CAPTION = "caption"  # string, the primary text
CAPTIONS = "captions"  # list of strings: several texts for one image
LABEL = "label"  # ClassLabel, single-label
LABELS = "labels"  # list of class indices, multi-label
POSITIVES = "positives"  # list of ids that are positives of this row

# Columns written by particular commands.
CAPTION_ORIGINAL = "caption_original"  # deform: the intact text before deformation
IS_BASE = "is_base"  # deform: row kept intact as part of the base set
CAPTION_SOURCE = "caption_source"  # recaption: struct {caption, captions}: where each text came from
QUALITY_SCORE = "quality_score"  # filter: probability that the caption is reference-like

# Columns of the built-in emoji dataset (`split` also: the rows `vltool benchmark` evaluates and trains on).
SPLIT = "split"
BASE_ID = "base_id"
SUBGROUP = "subgroup"
GROUP = "group"
GENDER = "gender"

PROVENANCE_FILE = "vltool.json"
