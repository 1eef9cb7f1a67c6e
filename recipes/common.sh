# Sourced by every recipe (not run on its own): the study's inputs (training data, benchmarks, model, launch),
# smoke mode, and evaluation. A recipe sets DATA, OUT, SEEDS, STEPS, DEVICE, SMOKE before sourcing this file.
# With no variable set, every recipe runs the emoji study exactly as before (the committed results/*.json).
# docs/recipes.md, "Your own study", lists every variable.

die() { printf 'error: %s\n' "$*" >&2; exit 2; }   # one line, exit 2: a variable the recipe cannot use

# ---- Every study variable the user set, checked in seconds before anything runs (`vltool check-study`: paths
# exist and hold the data their task needs, benchmarks have their splits, INIT / CAPTIONER resolve, numbers
# parse, LAUNCH's program is installed); a mistake is one line naming the variable, exit 2.
STUDY_VARIABLES=(TRAIN_DATA TRAIN_WHERE ZEROSHOT_BENCH RETRIEVAL_BENCH PROBE_BENCH EVAL_SPLIT PROBE_TRAIN_SPLIT LABEL_DATA CONCEPT_DATA
                 INIT CAPTIONER TRAINABLE THREADS BATCH BATCH_SIZES BOOTSTRAP LAUNCH)
study_args=()
for v in "${STUDY_VARIABLES[@]}"; do if [ -n "${!v:-}" ]; then study_args+=("$v=${!v}"); fi; done
if [ ${#study_args[@]} -gt 0 ]; then vltool check-study "${study_args[@]}" > /dev/null || exit $?; fi

# ---- Model: INIT (a whole model, every spelling `pretrain --init` takes), else ARCH (from scratch), else two
# pretrained unimodal towers, IMAGE_TOWER (+ IMAGE_WEIGHTS) and TEXT_TOWER (a directory or hf:ORG/NAME).
INIT=${INIT:-}
ARCH=${ARCH:-}
if [ -n "$INIT" ] && [ -n "$ARCH" ]; then die "INIT=$INIT and ARCH=$ARCH: give one (INIT starts from a model, ARCH builds one from scratch)"; fi
if [ -n "$INIT" ]; then
    TOWERS=(--init "$INIT")
    MODEL_NAME=${MODEL_NAME:-$INIT}
elif [ -n "$ARCH" ]; then
    TOWERS=(--arch "$ARCH")
    MODEL_NAME=${MODEL_NAME:-$ARCH}
else
    # The two pretrained unimodal towers ship inside PyPI packages (scripts/install.sh installs them):
    # torchvision's ImageNet MobileNetV2 and all-MiniLM-L6-v2.
    default_towers=$([ -z "${IMAGE_TOWER:-}${TEXT_TOWER:-}" ] && echo 1 || echo 0)
    IMAGE_TOWER=${IMAGE_TOWER:-torchvision:mobilenet_v2}
    if [ "$IMAGE_TOWER" = "torchvision:mobilenet_v2" ]; then
        IMAGE_WEIGHTS=${IMAGE_WEIGHTS:-$(command vltool info --shipped mobilenet_v2)}
    fi
    TEXT_TOWER=${TEXT_TOWER:-$(command vltool info --shipped all-MiniLM-L6-v2)}
    case $TEXT_TOWER in hf:*) ;; *) TEXT_TOWER="hf:$TEXT_TOWER" ;; esac
    TOWERS=(--image-tower "$IMAGE_TOWER")
    if [ -n "${IMAGE_WEIGHTS:-}" ]; then TOWERS+=(--image-weights "$IMAGE_WEIGHTS"); fi
    TOWERS+=(--text-tower "$TEXT_TOWER" --text-pooling mean)
    if [ "$default_towers" = 1 ]; then
        MODEL_NAME=${MODEL_NAME:-MobileNetV2 + MiniLM}
    else
        MODEL_NAME=${MODEL_NAME:-${IMAGE_TOWER#*:} + $(basename "${TEXT_TOWER#hf:}")}
    fi
fi
# TRAINABLE: projections (both towers locked, LiT-style: a whole CLIP's projections train too) | image-last-N
# (the image tower's last N blocks and the projections) | all. A recipe may set its own default.
TRAINABLE_GIVEN=${TRAINABLE:+1}   # (SMOKE trains every parameter of its tiny model unless TRAINABLE is given)
TRAINABLE=${TRAINABLE:-projections}
case $TRAINABLE in
    projections) LOCKED=(--lock-image --lock-text) ;;   # features of the locked towers computed once; projections train
    image-last-[1-9]*) LOCKED=(--lock-image --unfreeze-image-last "${TRAINABLE#image-last-}" --lock-text) ;;   # (N checked by check-study)
    all) LOCKED=() ;;
    *) die "TRAINABLE=$TRAINABLE: use projections, image-last-N or all" ;;
esac
BATCH=${BATCH:-64}   # the GLOBAL batch of every training run (pretrain --global-batch-size under LAUNCH)

# ---- Scale: LAUNCH prefixes every training command (`$LAUNCH -m vltool pretrain ...`), e.g. "accelerate launch
# --multi_gpu --num_processes 8" or "torchrun --nproc_per_node 8"; PROCESSES: how many it starts (read from LAUNCH).
LAUNCH=${LAUNCH:-}
launch_processes() {
    local prev="" a
    for a in $1; do
        case $prev in --num_processes|--num-processes|--nproc_per_node|--nproc-per-node) echo "$a"; return ;; esac
        case $a in --num_processes=*|--num-processes=*|--nproc_per_node=*|--nproc-per-node=*) echo "${a#*=}"; return ;; esac
        prev=$a
    done
    echo 1
}
PROCESSES=${PROCESSES:-$(launch_processes "$LAUNCH")}
case $PROCESSES in ''|*[!0-9]*|0) die "PROCESSES=$PROCESSES: the number of processes LAUNCH starts, a positive integer" ;; esac
# global_batch NAME...: each variable's batch sizes are global batches; refused unless they divide among the processes
global_batch() {
    local name b
    for name in "$@"; do
        for b in ${!name}; do
            if [ $((b % PROCESSES)) != 0 ]; then
                die "$name=$b: a global batch, which must divide among the $PROCESSES processes of LAUNCH (e.g. $name=$(( (b / PROCESSES + 1) * PROCESSES )))"
            fi
        done
    done
}
# vl_pretrain ARGS...: `vltool pretrain ARGS`; under LAUNCH, each --batch-size (a recipe's batches are global) is
# given as --global-batch-size, which pretrain divides among the processes it started (refusing a launch that
# started another number than PROCESSES)
vl_pretrain() {
    local args=() a
    flush_evals   # the last model's evaluations first (under LAUNCH the training below bypasses the vltool function)
    if [ -z "$LAUNCH" ]; then vltool pretrain "$@"; return; fi
    for a in "$@"; do
        if [ "$a" = --batch-size ]; then a=--global-batch-size; fi
        args+=("$a")
    done
    $LAUNCH -m vltool pretrain "${args[@]}" --processes "$PROCESSES"
}
LAUNCH_NOTE=()   # the report's record of the launch (none on one process, as before)
if [ -n "$LAUNCH" ]; then
    LAUNCH_NOTE=(--note "Launch: $LAUNCH ($PROCESSES processes); every batch size above is the global batch, $PROCESSES x the per-process batch (each run's vltool.json records num_processes, per_process_batch, accum_steps, global_batch).")
fi

DEVICE_OPTS=()
if [ "${DEVICE:-auto}" != "auto" ]; then DEVICE_OPTS=(--device "$DEVICE"); fi
# PRECISION unset: float32 (no) where the runs train on a CPU, as the committed results were made (pretrain's
# --precision auto is bf16 on a CPU with AVX-512 BF16 or AMX, which would change their bits); auto on a GPU.
ON_CPU=0
if [ "${DEVICE:-auto}" = cpu ] || [ "$(command vltool info --auto-device 2> /dev/null)" != cuda ]; then ON_CPU=1; fi
if [ -z "${PRECISION:-}" ] && [ "$ON_CPU" = 1 ]; then PRECISION=no; fi
# On a CPU, torch's, MKL's and oneDNN's kernels are pinned to AVX2's (the committed results were made on AVX2
# machines): an AVX-512 machine then computes the same float32 bits, where a chaotic run (CLIP-Lite's JSD at
# seed 1) otherwise ends elsewhere. Each may be set to another value, or to "" for the machine's own kernels.
if [ "$ON_CPU" = 1 ]; then
    export MKL_CBWR=${MKL_CBWR-AVX2} ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY-avx2} DNNL_MAX_CPU_ISA=${DNNL_MAX_CPU_ISA-AVX2}
fi
if [ -n "${PRECISION:-}" ]; then DEVICE_OPTS+=(--precision "$PRECISION"); fi
if [ -n "${WORKERS:-}" ]; then DEVICE_OPTS+=(--workers "$WORKERS"); fi

# One torch thread per command, as the committed results were made: a JSD run's bits depend on the thread
# count (docs/pretrain.md); every command records it in its vltool.json / results JSON ("runtime").
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS

BOOTSTRAP=${BOOTSTRAP:-1000}
# The bootstrap's unit: a base emoji with all its skin tones and forms (they are near-duplicates), and the
# group recorded with each test example's outcome for the report's paired intervals. GROUP_COLUMN= : images.
if [ -z "${TRAIN_DATA:-}${ZEROSHOT_BENCH:-}${RETRIEVAL_BENCH:-}${PROBE_BENCH:-}" ]; then   # DATA's own test rows
    GROUP_COLUMN=${GROUP_COLUMN-base_id}
else
    GROUP_COLUMN=${GROUP_COLUMN-}
fi
EVAL_GROUPS=(); if [ -n "$GROUP_COLUMN" ]; then EVAL_GROUPS=(--group-column "$GROUP_COLUMN"); fi
RESULTS=${RESULTS:-results}
# REPORT_SEED: the bootstrap seed of every report (vltool report --seed; its default 0 when unset). Another
# seed redraws the same runs' intervals: scripts/compare_verdicts.py says whether a verdict depends on the draw.
REPORT_OPTS=(); if [ -n "${REPORT_SEED:-}" ]; then REPORT_OPTS=(--seed "$REPORT_SEED"); fi

# ---- Training data: TRAIN_DATA (a dataset on disk or shards; TRAIN_WHERE: --where clauses, space-separated),
# else DATA's training split.
TRAIN_DATA=${TRAIN_DATA:-}
TRAIN_WHERE=${TRAIN_WHERE:-}
EVAL_SPLIT=${EVAL_SPLIT:-test}
PROBE_TRAIN_SPLIT=${PROBE_TRAIN_SPLIT:-train}
if [ -n "$TRAIN_DATA" ] && [ -z "${ZEROSHOT_BENCH:-}${RETRIEVAL_BENCH:-}${PROBE_BENCH:-}" ]; then
    die "TRAIN_DATA=$TRAIN_DATA: name the benchmarks your study is scored on (ZEROSHOT_BENCH, RETRIEVAL_BENCH, PROBE_BENCH); the built-in emoji test set is not one of them"
fi
if [ -n "$TRAIN_DATA" ]; then
    case $TRAIN_DATA in *.tar|*\{*\}*) TRAIN_SHARDS=1 ;; *) if compgen -G "$TRAIN_DATA/*.tar" > /dev/null; then TRAIN_SHARDS=1; else TRAIN_SHARDS=0; fi ;; esac
else
    TRAIN_SHARDS=0
fi
# need_table VARIABLE WHAT: refuse shards where the method needs the whole table of rows
need_table() {
    if [ "$TRAIN_SHARDS" = 1 ]; then die "TRAIN_DATA=$TRAIN_DATA: $2 needs a dataset on disk, not shards; import them first (vltool import $TRAIN_DATA --out DIR) and set TRAIN_DATA=DIR"; fi
}
# need_column VARIABLE DATASET COLUMN WHY HOW: refuse a dataset without the column the method reads
need_column() {
    if [ "$TRAIN_SHARDS" = 1 ] && [ "$2" = "$TRAIN_DATA" ]; then die "$1=$2: $4 needs a '$3' column, which shards do not have"; fi
    command vltool info "$2" --require "column=$3" 2> /dev/null || die "$1=$2: $4 needs a '$3' column (not found); $5"
}

# A second art style of the same test examples, none of it in training: every evaluation below scores it too,
# into the same file name with "-style2" before ".json" (zeroshot-style2.json, ...), and the reports set the two
# styles side by side (--style). Built-in emoji data: emoji-openmoji (OpenMoji's drawings). STYLE2= : none.
# SHIFT_BENCH generalises it: test sets under a distribution shift, each scored into *-style<k+1>.json.
if [ "${DATA:-}" = "emoji" ] && [ -z "${ZEROSHOT_BENCH:-}${RETRIEVAL_BENCH:-}${PROBE_BENCH:-}" ]; then STYLE2=${STYLE2-emoji-openmoji}; else STYLE2=${STYLE2-}; fi
SHIFT_BENCH=${SHIFT_BENCH-$STYLE2}
STYLE2=${SHIFT_BENCH%% *}
DATA_NAME=${DATA_NAME:-$(basename "${TRAIN_DATA:-${DATA:-data}}")}
if [ -z "${ZEROSHOT_BENCH:-}${RETRIEVAL_BENCH:-}${PROBE_BENCH:-}" ]; then
    STYLE1_NAME=${STYLE1_NAME:-$([ "${DATA:-}" = "emoji" ] && echo Noto || echo "$DATA")}
else
    first_bench=${ZEROSHOT_BENCH:-${RETRIEVAL_BENCH:-$PROBE_BENCH}}
    STYLE1_NAME=${STYLE1_NAME:-$(basename "${first_bench%% *}")}
fi
STYLE2_NAME=${STYLE2_NAME:-$([ "$STYLE2" = "emoji-openmoji" ] && echo OpenMoji || echo "$STYLE2")}
STYLES=(); if [ -n "$STYLE2" ]; then STYLES=(--style "$STYLE1_NAME=" --style "$STYLE2_NAME=-style2"); fi
SHIFTS=()   # "BENCH SUFFIX" of each shift test set
k=2
for b in $SHIFT_BENCH; do
    SHIFTS+=("$b -style$k")
    if [ "$k" -gt 2 ]; then STYLES+=(--style "$(basename "$b")=-style$k"); fi
    k=$((k + 1))
done

if [ "${SMOKE:-0}" = "1" ]; then
    # End to end on about 8% of the data (whole base_id groups, both splits) with a handful of steps:
    # checks that the recipe runs, not what it measures. Results go under $OUT, never to results/.
    # A tiny model built from its config stands in for the pretrained towers, so the check takes seconds
    # (INIT, when given, is kept: the smoke check is then of that model). TRAIN_DATA is used whole.
    SEEDS=${SMOKE_SEEDS:-0}
    if [ -z "$INIT" ]; then TOWERS=(--arch vltool-micro); fi
    if [ -z "$TRAINABLE_GIVEN" ]; then LOCKED=(); TRAINABLE=all; fi   # a given TRAINABLE is honoured (and the note says what trained)
    BATCH=8
    BOOTSTRAP=20
    RESULTS="$OUT/results"
    if [ -z "$TRAIN_DATA" ]; then
        # its own part column, so that the recipes' own splits of these rows can add `part`
        vltool split "$DATA" --by base_id --parts smoke=0.08,rest=0.92 --separate --seed 0 --part-column smoke_part \
            --out "$OUT/smoke-data" --overwrite > /dev/null
        DATA="$OUT/smoke-data/smoke"
    fi
fi
global_batch BATCH

TRAIN=("$DATA" --where split=train)   # the training rows, as pretrain/deform/split/... take them
if [ -n "$TRAIN_DATA" ]; then
    TRAIN=("$TRAIN_DATA")
    for w in $TRAIN_WHERE; do TRAIN+=(--where "$w"); done
fi
# the report's caption names the study's own data and model (the emoji study's titles already do)
if [ -n "$TRAIN_DATA$INIT$ARCH${ZEROSHOT_BENCH:-}${RETRIEVAL_BENCH:-}${PROBE_BENCH:-}" ] || [ "${default_towers:-1}" = 0 ]; then
    if [ -n "$TRAIN_DATA" ]; then   # only the benchmarks named: a task without one is left out (never the built-in data)
        scored=()
        for t in "ZEROSHOT_BENCH:zero-shot" "RETRIEVAL_BENCH:retrieval" "PROBE_BENCH:probe"; do
            v=${t%%:*}; if [ -n "${!v:-}" ]; then scored+=("${!v} (${t#*:})"); fi
        done
        where="evaluated on ${scored[*]}, split $EVAL_SPLIT; a task without a benchmark named is left out"
    else
        where="evaluated on ${ZEROSHOT_BENCH:-$DATA} (zero-shot), ${RETRIEVAL_BENCH:-$DATA} (retrieval), split $EVAL_SPLIT"
        if [ -n "${PROBE_BENCH:-}" ]; then where+=", ${PROBE_BENCH} (probe)"; fi
    fi
    LAUNCH_NOTE+=(--note "Study: trained on ${TRAIN[*]}; model $MODEL_NAME (${TOWERS[*]}; TRAINABLE=$TRAINABLE); $where.")
fi

# each_style FIRST FUNCTION ARGS...: the two-style loop. `FUNCTION DATA SUFFIX ARGS...` on FIRST (the training
# style's test set; SUFFIX empty) and then, with STYLE2 (the first SHIFT_BENCH), on STYLE2 with SUFFIX -style2, the
# suffix of its result files (zeroshot-style2.json, ...) that the reports' --style reads.
each_style() {
    local first=$1 fn=$2 data suffix
    shift 2
    for data in "$first" ${STYLE2:+"$STYLE2"}; do
        suffix=""; if [ "$data" != "$first" ]; then suffix=-style2; fi
        "$fn" "$data" "$suffix" "$@"
    done
}

# rows_of ARRAY BENCH SPLIT: ARRAY=(the arguments that select SPLIT of a benchmark): --split SPLIT, --where
# split=SPLIT or none (`vltool info --select`); a benchmark without it stops the recipe with info's message
rows_of() {
    local -n rows_of_out=$1
    local answer
    answer=$(command vltool info "$2" --select "$3") || exit $?
    rows_of_out=(); if [ -n "$answer" ]; then mapfile -t rows_of_out <<< "$answer"; fi
}
# has_column BENCH COLUMN: does it hold COLUMN (label, caption, captions)? caption: either caption or captions.
# (Every `vltool info` question is asked with `command`: it does not run the evaluations queued, see vl_eval.)
has_column() {
    command vltool info "$1" --require "column=$2" 2> /dev/null \
        || { [ "$2" = caption ] && command vltool info "$1" --require column=captions 2> /dev/null; }
}

# evaluate MODEL DIR [extra --where clauses...]: zero-shot classification and image-text retrieval on the test
# split (whose base_id groups never occur in training), into DIR/zeroshot.json, DIR/retrieve.json; with STYLE2
# (SHIFT_BENCH), the same on its test rows, into DIR/zeroshot-style2.json, DIR/retrieve-style2.json. With
# ZEROSHOT_BENCH / RETRIEVAL_BENCH: each benchmark of the list on its EVAL_SPLIT (the first into zeroshot.json,
# the others into zeroshot-<name>.json, set beside it in the report), with its own class names and templates.
EVAL_QUIET=${EVAL_QUIET:-1}
evaluate() {
    local model=$1 dir=$2
    shift 2
    if [ -z "${ZEROSHOT_BENCH:-}${RETRIEVAL_BENCH:-}" ]; then
        each_style "$DATA" evaluate_style "$model" "$dir" "$@"
        return
    fi
    # with TRAIN_DATA, only the benchmarks named (a task without one is left out); else DATA's test split stands in
    if [ -n "${ZEROSHOT_BENCH:-}" ] || [ -z "$TRAIN_DATA" ]; then bench_eval zeroshot "${ZEROSHOT_BENCH:-$DATA}" "$model" "$dir"; fi
    if [ -n "${RETRIEVAL_BENCH:-}" ] || [ -z "$TRAIN_DATA" ]; then bench_eval retrieve "${RETRIEVAL_BENCH:-$DATA}" "$model" "$dir"; fi
}
# evaluate_style DATA SUFFIX MODEL DIR [extra --where clauses...]: evaluate's two commands on one style's test rows
evaluate_style() {
    local data=$1 suffix=$2 model=$3 dir=$4
    shift 4
    vl_eval zeroshot "$data" --where split=test "$@" --model "$model" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" \
        --out "$dir/zeroshot$suffix.json" --overwrite --no-progress > /dev/null
    vl_eval retrieve "$data" --where split=test "$@" --model "$model" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" \
        --out "$dir/retrieve$suffix.json" --overwrite --no-progress > /dev/null
}
# bench_eval TASK "BENCH..." MODEL DIR: TASK on each benchmark's EVAL_SPLIT, then on each SHIFT_BENCH that has its columns
bench_eval() {
    local task=$1 benches=$2 model=$3 dir=$4 b suffix first=1 rows col shift
    col=label; [ "$task" = retrieve ] && col=caption
    for b in $benches; do
        suffix=""; [ "$first" = 1 ] || suffix="-$(basename "$b")"; first=0
        rows_of rows "$b" "$EVAL_SPLIT"
        texts=()   # retrieval on a benchmark: every caption of an image, as CLIP_benchmark scores it
        if [ "$task" = retrieve ] && [ "$b" != emoji ] && [ "$b" != emoji-openmoji ] && has_column "$b" captions; then texts=(--text-column captions); fi
        vl_eval "$task" "$b" "${rows[@]}" "${texts[@]}" --model "$model" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" \
            --out "$dir/$task$suffix.json" --overwrite --no-progress > /dev/null
    done
    for shift in "${SHIFTS[@]}"; do
        b=${shift% *}; suffix=${shift##* }
        if has_column "$b" "$col"; then
            rows_of rows "$b" "$EVAL_SPLIT"
            vl_eval "$task" "$b" "${rows[@]}" --model "$model" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" \
                --out "$dir/$task$suffix.json" --overwrite --no-progress > /dev/null
        fi
    done
}
BENCH_STYLES=()   # the second and further benchmarks of each list, set beside the first
for list in "${ZEROSHOT_BENCH:-}" "${RETRIEVAL_BENCH:-}" "${PROBE_BENCH:-}"; do
    first=1
    for b in $list; do
        if [ "$first" = 0 ]; then BENCH_STYLES+=(--style "$(basename "$b")=-$(basename "$b")"); fi
        first=0
    done
done
if [ ${#BENCH_STYLES[@]} -gt 0 ]; then
    if [ ${#STYLES[@]} -eq 0 ]; then STYLES=(--style "$STYLE1_NAME="); fi
    STYLES+=("${BENCH_STYLES[@]}")
fi

# probe_style DATA SUFFIX MODEL DIR PROTOCOL [probe options...]: probe's command for one style: fitted on DATA's
# training split (the training style), scored on that style's test rows
probe_style() {
    local data=$1 suffix=$2 model=$3 dir=$4 protocol=$5
    shift 5
    vl_eval probe "$DATA" --where split=train --eval-data "$data" --eval-where split=test --model "$model" \
        --protocol "$protocol" "$@" --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" --out "$dir/probe$suffix.json" \
        --overwrite --no-progress > /dev/null
}
# probe MODEL DIR PROTOCOL [probe options...]: a linear probe fitted on the training split's frozen image
# features, scored on the test split, into DIR/probe.json; with STYLE2, the same probe (fitted on the training
# style) scored on STYLE2's test rows, into DIR/probe-style2.json. With PROBE_BENCH: each benchmark's own
# PROBE_TRAIN_SPLIT fits it, its EVAL_SPLIT scores it (as CLIP_benchmark and the papers do).
probe() {
    local model=$1 dir=$2 protocol=$3 data suffix
    shift 3
    if [ -z "${PROBE_BENCH:-}" ]; then
        if [ -n "$TRAIN_DATA" ]; then die "PROBE_BENCH: this recipe's linear probe needs a labelled benchmark with a $PROBE_TRAIN_SPLIT split when TRAIN_DATA is given (e.g. PROBE_BENCH=a CLIP_benchmark folder)"; fi
        each_style "$DATA" probe_style "$model" "$dir" "$protocol" "$@"
        return
    fi
    local b first=1 fit ev shift
    for b in $PROBE_BENCH; do
        suffix=""; [ "$first" = 1 ] || suffix="-$(basename "$b")"; first=0
        rows_of fit "$b" "$PROBE_TRAIN_SPLIT"
        rows_of ev "$b" "$EVAL_SPLIT"; ev=("${ev[@]/#--/--eval-}")   # --split -> --eval-split, --where -> --eval-where
        [ ${#fit[@]} -gt 0 ] || die "PROBE_BENCH=$b: no $PROBE_TRAIN_SPLIT split to fit the probe on (PROBE_TRAIN_SPLIT)"
        vl_eval probe "$b" "${fit[@]}" --eval-data "$b" "${ev[@]}" --model "$model" --protocol "$protocol" "$@" \
            --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" --out "$dir/probe$suffix.json" --overwrite --no-progress > /dev/null
    done
    for shift in "${SHIFTS[@]}"; do   # the probe of the first benchmark, scored on each shift with labels
        data=${shift% *}; suffix=${shift##* }
        if has_column "$data" label; then
            b=${PROBE_BENCH%% *}
            rows_of fit "$b" "$PROBE_TRAIN_SPLIT"
            rows_of ev "$data" "$EVAL_SPLIT"; ev=("${ev[@]/#--/--eval-}")
            vl_eval probe "$b" "${fit[@]}" --eval-data "$data" "${ev[@]}" --model "$model" --protocol "$protocol" "$@" \
                --bootstrap "$BOOTSTRAP" "${EVAL_GROUPS[@]}" --out "$dir/probe$suffix.json" --overwrite --no-progress > /dev/null
        fi
    done
}

# ---- Evaluations: one process per model (issue 54). vl_eval queues an evaluation command (zeroshot, retrieve,
# probe; the arguments as after `vltool`); the queue runs as one `vltool evaluate PLAN` process, which imports
# the libraries and loads the model once and writes exactly the files the commands write alone, before the next
# training or any other vltool command (the `vltool` function below), so each model's evaluations are one
# start-up. A failing evaluation stops the recipe with its own error, as before.
EVAL_PLAN=$(mktemp "${TMPDIR:-/tmp}/vltool-plan.XXXXXX")
trap 'rm -f "$EVAL_PLAN"' EXIT
vl_eval() { printf '%q ' "$@" >> "$EVAL_PLAN"; printf '\n' >> "$EVAL_PLAN"; }
flush_evals() {
    if [ -s "$EVAL_PLAN" ]; then
        command vltool evaluate "$EVAL_PLAN" > /dev/null || exit $?
        : > "$EVAL_PLAN"
    fi
}
vltool() { flush_evals; command vltool "$@"; }

# steps_of RUN: the optimizer steps a finished `vltool pretrain` run took (its vltool.json's stats.steps)
steps_of() { command vltool info "$1" --get stats.steps; }

say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# REPORT_ONLY=1: no runs, only the tables, from whatever runs OUT already holds (e.g. after stopping a
# recipe part-way: the report covers the seeds whose runs exist).
if [ "${REPORT_ONLY:-0}" = "1" ]; then SEEDS=""; fi
