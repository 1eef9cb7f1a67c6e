#!/usr/bin/env bash
# vltool quick start, on the built-in emoji data (a few minutes on 2 CPU cores):
#   1. deform the training captions into bags of words (A Fistful of Words, 2.2);
#   2. align a pretrained MobileNetV2 and all-MiniLM-L6-v2 on those bags of words, training only the
#      projections (both towers locked; their features are computed once);
#   3. evaluate zero-shot subgroup classification and image-text retrieval on the test split (whose base
#      emoji never occur in training), with 95% bootstrap intervals and the chance level beside every metric,
#      in Noto's art style (the training style) and, for the built-in data, in OpenMoji's (emoji-openmoji:
#      the same test emoji drawn by another hand);
#   4. gather the numbers in OUT/results/quickstart.{json,md,png} (outside the tracked tree: git stays clean);
#      PUBLISH=1 also copies them into results/ (the committed numbers the README shows).
# Usage: bash recipes/quickstart.sh            (parameters below can be set in the environment)
set -euo pipefail

DATA=${DATA:-emoji}            # a dataset saved with save_to_disk, or the built-in emoji data
# (the same test emoji in a second art style, none of it in training: STYLE2 / SHIFT_BENCH in common.sh)
OUT=${OUT:-runs/quickstart}    # every run: OUT/<variant>/seed<N>/
SEEDS=${SEEDS:-0}
EPOCHS=${EPOCHS:-10}
STEPS=${STEPS:-}               # if set: optimizer steps instead of EPOCHS
DEVICE=${DEVICE:-auto}         # auto | cpu
SMOKE=${SMOKE:-0}
RESULTS=${RESULTS:-$OUT/results}   # the report; PUBLISH=1 copies it into results/
PUBLISH=${PUBLISH:-0}

source "$(dirname "$0")/common.sh"
if [ "$SMOKE" = "1" ]; then STEPS=3; fi
LENGTH=(--epochs "$EPOCHS"); if [ -n "$STEPS" ]; then LENGTH=(--steps "$STEPS"); fi

for SEED in $SEEDS; do
    dir="$OUT/lit-bow/seed$SEED"
    vltool deform "${TRAIN[@]}" --ops shuffle,rmstop,basevocab,rmtopfreq20,keep4 --seed "$SEED" \
        --out "$dir/data" --overwrite
    vl_pretrain "$dir/data" --out "$dir/run" --seed "$SEED" "${TOWERS[@]}" "${LOCKED[@]}" --augment none \
        --batch-size "$BATCH" --lr 1e-3 "${LENGTH[@]}" "${DEVICE_OPTS[@]}" --no-progress --overwrite
    if [ -n "${ZEROSHOT_BENCH:-}${RETRIEVAL_BENCH:-}" ]; then   # the study's own benchmarks (common.sh)
        evaluate "$dir/run" "$dir"
        continue
    fi
    vltool zeroshot "$DATA" --where split=test --model "$dir/run" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" --out "$dir/zeroshot.json" --overwrite
    vltool retrieve "$DATA" --where split=test --model "$dir/run" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" --out "$dir/retrieve.json" --overwrite
    if [ -n "$STYLE2" ]; then
        vltool zeroshot "$STYLE2" --where split=test --model "$dir/run" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" --out "$dir/zeroshot-style2.json" --overwrite
        vltool retrieve "$STYLE2" --where split=test --model "$dir/run" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" --out "$dir/retrieve-style2.json" --overwrite
    fi
done

# with STYLE2, each metric beside the same metric in the second style (--style: files named *-style2.json)
vltool report "$OUT" --overwrite --out "$RESULTS/quickstart" --recipe recipes/quickstart.sh "${STYLES[@]}" "${REPORT_OPTS[@]}" --variant lit-bow="LiT on bags of words" \
    --title "Quick start: $MODEL_NAME aligned on bags of words of the $([ "$DATA_NAME" = emoji ] && echo "emoji names" || echo "$DATA_NAME captions")" \
    --metric "ZS top-1=zeroshot:top1" --metric "ZS top-5=zeroshot:top5" \
    --metric "I→T R@1=retrieve:image_to_text_R@1" --metric "T→I R@1=retrieve:text_to_image_R@1" \
    --metric "Training rows=run/vltool.json:stats.rows_used" "${LAUNCH_NOTE[@]}"

if [ "$PUBLISH" = "1" ] && [ "$SMOKE" != "1" ] && [ "$RESULTS" != "results" ]; then
    mkdir -p results
    for ext in json md png; do
        if [ -f "$RESULTS/quickstart.$ext" ]; then cp "$RESULTS/quickstart.$ext" "results/quickstart.$ext.tmp" && mv "results/quickstart.$ext.tmp" "results/quickstart.$ext"; fi
    done
    echo "copied $RESULTS/quickstart.{json,md,png} into results/" >&2
fi
