#!/usr/bin/env bash
# Concept debiasing, "CLIP-Lite" section 4.8 and Table 6, on emoji:
# a model trained on the training split; `vltool debias` builds a gender subspace from language alone (the
# shipped word pairs in sentence templates); on the test split's `gender` column, the alignment of "man" and
# "woman" queries with the most aligned images of each group, before and after removing the subspace from
# the image embeddings, the relative reduction of the own-vs-other gap, and zero-shot accuracy before and
# after (the cost of the edit: our addition, as Table 6 reports only the alignments, no accuracy). A second
# row edits the query embeddings too (--debias-text); the paper edits the image representations only.
# Towers: pretrained MobileNetV2 and MiniLM, locked, projections trained on their cached features.
# Usage: bash recipes/debias.sh      SEEDS="0 1 2" (default) | SMOKE=1 for a quick end-to-end check
set -euo pipefail

DATA=${DATA:-emoji}                   # caption, label, split and gender columns
OUT=${OUT:-runs/debias}               # every run: OUT/<variant>/seed<N>/
SEEDS=${SEEDS:-"0 1 2"}
EPOCHS=${EPOCHS:-10}
STEPS=${STEPS:-}                      # if set: steps of every run instead of EPOCHS
DEVICE=${DEVICE:-auto}                # auto | cpu
COMPONENTS=${COMPONENTS:-1}           # principal components of the concept subspace
SMOKE=${SMOKE:-0}

source "$(dirname "$0")/common.sh"
if [ "$SMOKE" = "1" ]; then STEPS=3; fi
# The concept: CONCEPT_DATA's test images (EVAL_SPLIT), grouped by CONCEPT_COLUMN, whose two CONCEPT_VALUES
# are also the query groups of the shipped gender word pairs (the subspace is built from them).
CONCEPT_COLUMN=${CONCEPT_COLUMN:-gender}
CONCEPT_VALUES=${CONCEPT_VALUES:-"man woman"}
if [ -n "$TRAIN_DATA" ] && [ -z "${CONCEPT_DATA:-}" ]; then
    die "CONCEPT_DATA: with TRAIN_DATA, give the images to measure the concept on (a dataset with a $CONCEPT_COLUMN column holding ${CONCEPT_VALUES// //})"
fi
OWN_CONCEPT_DATA=${CONCEPT_DATA:+1}
if [ -n "$OWN_CONCEPT_DATA" ]; then
    need_column CONCEPT_DATA "$CONCEPT_DATA" "$CONCEPT_COLUMN" "debias's measurement" "set CONCEPT_COLUMN to the column holding ${CONCEPT_VALUES// //}"
fi
CONCEPT_DATA=${CONCEPT_DATA:-$DATA}
if [ "$CONCEPT_VALUES" != "man woman" ]; then
    die "CONCEPT_VALUES=$CONCEPT_VALUES: the subspace comes from vltool's shipped gender word pairs, whose query groups are man and woman"
fi
if [ "$CONCEPT_DATA" = "$DATA" ] && [ -z "$TRAIN_DATA" ]; then CONCEPT_ROWS=(--where split=test); else rows_of CONCEPT_ROWS "$CONCEPT_DATA" "$EVAL_SPLIT"; fi
ZS_LABEL=(--zeroshot-label label)
if [ -n "$OWN_CONCEPT_DATA" ] && ! has_column "$CONCEPT_DATA" label; then ZS_LABEL=(--zeroshot-label ""); fi
LENGTH=(--epochs "$EPOCHS"); if [ -n "$STEPS" ]; then LENGTH=(--steps "$STEPS"); fi

# zeroshot_style DATA SUFFIX MODEL DIR [edit options...]: zero-shot on one style's concept rows, into DIR/zeroshot$SUFFIX.json
zeroshot_style() {
    local data=$1 suffix=$2 model=$3 dir=$4
    shift 4
    vl_eval zeroshot "$data" "${CONCEPT_ROWS[@]}" --model "$model" "$@" --bootstrap "$BOOTSTRAP" \
        "${EVAL_GROUPS[@]}" --out "$dir/zeroshot$suffix.json" --overwrite --no-progress > /dev/null
}

for SEED in $SEEDS; do
    dir="$OUT/images/seed$SEED"
    say "seed $SEED: train, build the subspace, measure"
    vl_pretrain "${TRAIN[@]}" --out "$dir/run" --seed "$SEED" "${TOWERS[@]}" "${LOCKED[@]}" \
        --augment none --batch-size "$BATCH" --lr 1e-3 "${LENGTH[@]}" "${DEVICE_OPTS[@]}" --no-progress --overwrite > /dev/null
    vltool debias --model "$dir/run" --components "$COMPONENTS" --out "$dir/gender" --overwrite > /dev/null
    vltool debias --model "$dir/run" --subspace "$dir/gender" --eval-data "$CONCEPT_DATA" "${CONCEPT_ROWS[@]}" --group-column "$CONCEPT_COLUMN" \
        "${ZS_LABEL[@]}" --out "$dir/debias.json" --overwrite > /dev/null
    mkdir -p "$OUT/images-and-queries/seed$SEED"
    vltool debias --model "$dir/run" --subspace "$dir/gender" --eval-data "$CONCEPT_DATA" "${CONCEPT_ROWS[@]}" --group-column "$CONCEPT_COLUMN" \
        "${ZS_LABEL[@]}" --debias-text --out "$OUT/images-and-queries/seed$SEED/debias.json" --overwrite > /dev/null
    if [ -n "$STYLE2" ]; then   # the same subspace, measured on the test images in the second style
        vltool debias --model "$dir/run" --subspace "$dir/gender" --eval-data "$STYLE2" --where split=test --group-column gender \
            --zeroshot-label label --out "$dir/debias-style2.json" --overwrite > /dev/null
        vltool debias --model "$dir/run" --subspace "$dir/gender" --eval-data "$STYLE2" --where split=test --group-column gender \
            --zeroshot-label label --debias-text --out "$OUT/images-and-queries/seed$SEED/debias-style2.json" --overwrite > /dev/null
    fi
    # zero-shot before and after the edit on the same test images, with per-example outcomes, so that the
    # report gives the paired interval of the change (clustered by base_id, as every recipe's evaluation)
    for v in before images images-and-queries; do
        edit=()
        if [ "$v" != before ]; then edit=(--debias "$dir/gender"); fi
        if [ "$v" = images-and-queries ]; then edit+=(--debias-text); fi
        [ "${ZS_LABEL[1]}" = "" ] && continue   # no label column: no zero-shot
        each_style "$CONCEPT_DATA" zeroshot_style "$dir/run" "$OUT/$v/seed$SEED" "${edit[@]}"   # in each style
    done
done

CELLS=()
for q in man woman; do for g in man woman; do
    CELLS+=(--metric "'$q' → $g images, before=debias:stats.cells.$q.$g.before"
            --metric "after=debias:stats.cells.$q.$g.after")
done; done
vltool report "$OUT" --overwrite --out "$RESULTS/debias" --recipe recipes/debias.sh "${STYLES[@]}" "${REPORT_OPTS[@]}" \
    --title "CLIP-Lite, section 4.8 / Table 6 on $DATA_NAME: removing gender from the embedding space" "${LAUNCH_NOTE[@]}" \
    --variant images="Image embeddings edited" --variant images-and-queries="Images and queries edited" \
    --metric "Own−other gap, before=debias:stats.gap_before" --metric "after=debias:stats.gap_after" \
    --metric "Relative reduction=debias:stats.gap_reduction" \
    --metric "ZS top-1, before=debias:stats.zeroshot.before" --metric "after=debias:stats.zeroshot.after" \
    --paper images="the two groups' alignments converge (Table 6); no accuracy reported"
vltool report "$OUT" --overwrite --out "$RESULTS/debias-alignment" --recipe recipes/debias.sh "${STYLES[@]}" "${REPORT_OPTS[@]}" --no-chart \
    --title "CLIP-Lite, Table 6 on $DATA_NAME: mean alignment of gendered queries with the top images of each group" "${LAUNCH_NOTE[@]}" \
    --variant images="Image embeddings edited" --variant images-and-queries="Images and queries edited" "${CELLS[@]}" \
    --paper images="Table 6, male queries: men 0.085 → 0.069, women 0.057 → 0.067; female queries: men 0.042 → 0.068, women 0.089 → 0.062"
vltool report "$OUT" --overwrite --out "$RESULTS/debias-zeroshot" --recipe recipes/debias.sh "${STYLES[@]}" "${REPORT_OPTS[@]}" --baseline before \
    --title "Concept debiasing on $DATA_NAME: zero-shot accuracy before and after removing gender" "${LAUNCH_NOTE[@]}" \
    --variant before="No edit" --variant images="Image embeddings edited" --variant images-and-queries="Images and queries edited" \
    --metric "ZS top-1=zeroshot:top1" --metric "ZS top-5=zeroshot:top5" \
    --note "The paper reports no accuracy for its debiasing (CLIP-Lite, section 4.8 and Table 6); these rows measure what the edit costs on the same test images."
