"""The datasets vltool ships (`emoji`, `emoji-openmoji`): where they are, and which are test-only.

The rule that refuses test-only data as training input is vltool.io.heldout.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # vltool/assets
# `emoji-openmoji`: emoji's test-split emoji in OpenMoji's art style (test only; vltool/assets/EMOJI_LICENSES.md).
BUILTIN_DATASETS = {"emoji": ASSETS / "emoji", "emoji-openmoji": ASSETS / "emoji-openmoji"}
TEST_ONLY_DATASETS = ("emoji-openmoji",)  # built-in data for evaluation only: refused as training input (test_only_inputs)
