"""The recipes' inputs (recipes/common.sh, issue 39), checked without running anything: `vltool` and
`accelerate` on PATH are shims that log their arguments (pretrain's shim writes the one file a recipe reads
back, its stats.steps). Seconds, not the smoke runs of tests/test_recipes.py."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIM = """#!/usr/bin/env bash
if [ "$(basename "$0")" = vltool ] && [ "${1:-}" = check-study ]; then   # not logged: the real check, or (fake paths) none
    if [ "${SHIM_REAL_CHECK:-0}" = 1 ]; then exec python -m vltool "$@"; fi
    exit 0
fi
if [ "$(basename "$0")" = vltool ] && [ "${1:-}" = info ]; then   # a question about the data or the machine: answered, not logged
    exec python -m vltool "$@"
fi
if [ "$(basename "$0")" = vltool ] && [ "${1:-}" = evaluate ]; then   # a plan: the commands it runs, each as run alone
    while IFS= read -r line; do
        eval "words=($line)"
        printf '%q ' vltool "${words[@]}" >> "$SHIM_LOG"; echo >> "$SHIM_LOG"
        echo "${OMP_NUM_THREADS:-unset}" >> "$SHIM_LOG.threads"
        echo "${MKL_CBWR:-unset} ${ATEN_CPU_CAPABILITY:-unset} ${DNNL_MAX_CPU_ISA:-unset}" >> "$SHIM_LOG.isa"
    done < "$2"
    echo "$2" >> "$SHIM_LOG.plans"
    exit 0
fi
printf '%q ' "$(basename "$0")" "$@" >> "$SHIM_LOG"; echo >> "$SHIM_LOG"
echo "${OMP_NUM_THREADS:-unset}" >> "$SHIM_LOG.threads"
echo "${MKL_CBWR:-unset} ${ATEN_CPU_CAPABILITY:-unset} ${DNNL_MAX_CPU_ISA:-unset}" >> "$SHIM_LOG.isa"
prev=""; for a in "$@"; do
  if [ "$prev" = "--out" ] && [[ " $* " == *" pretrain "* ]]; then mkdir -p "$a" && echo '{"stats": {"steps": 7}}' > "$a/vltool.json"; fi
  prev=$a
done
exit 0
"""


RECIPES = ["caption-worth", "clip-lite", "debias", "fff", "fistful-of-words", "quickstart", "unicl"]


def run_recipe(tmp_path: Path, recipe: str, **env) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True, exist_ok=True)
    for name in ("vltool", "accelerate"):
        (bin_ / name).write_text(SHIM)
        (bin_ / name).chmod(0o755)
    log = tmp_path / f"{recipe}.log"
    log.write_text("")
    Path(f"{log}.threads").write_text("")  # each command's OMP_NUM_THREADS, a line each
    Path(f"{log}.isa").write_text("")  # each command's MKL_CBWR, ATEN_CPU_CAPABILITY, DNNL_MAX_CPU_ISA
    pins = ("OMP_NUM_THREADS", "MKL_CBWR", "ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA")
    inherited = {k: v for k, v in os.environ.items() if k not in pins}  # what the recipe sets, not pytest's
    full = {**inherited, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "SHIM_LOG": str(log), "OUT": str(tmp_path / "out"), **env}
    proc = subprocess.run(["bash", str(ROOT / "recipes" / f"{recipe}.sh")], cwd=tmp_path, env=full, capture_output=True, text=True)
    return proc, [shlex.split(line) for line in log.read_text().splitlines()]


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_batch_variables_are_global_batches_divided_among_launched_processes(tmp_path):
    """BATCH was per process: under `accelerate launch --num_processes 2` every run trained at twice the batch the
    recipe names. Now LAUNCH prefixes every training command and BATCH is the global batch (issue 39), which
    pretrain divides among the processes it started (--global-batch-size, issue 55)."""
    launch = "accelerate launch --multi_gpu --num_processes 2"
    proc, cmds = run_recipe(tmp_path, "quickstart", LAUNCH=launch, BATCH="64")
    assert proc.returncode == 0, proc.stderr
    (train,) = [c for c in cmds if "pretrain" in c]
    assert train[:7] == ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "-m", "vltool"]
    assert option(train, "--global-batch-size") == "64" and "--batch-size" not in train
    assert option(train, "--processes") == "2"  # (pretrain refuses a launch of another number)
    report = next(c for c in cmds if c[:2] == ["vltool", "report"])
    assert any("2 processes" in a and "global batch" in a for a in report)  # the report records the launch
    assert not [c for c in cmds if c[0] == "vltool" and c[1] == "pretrain"]  # nothing trains outside LAUNCH


@pytest.mark.parametrize("recipe,env,variable", [
    ("quickstart", {"BATCH": "63"}, "BATCH=63"),
    ("fff", {"BIG_BATCH": "1001"}, "BIG_BATCH=1001"),
    ("clip-lite", {"BATCH_SIZES": "16 33"}, "BATCH_SIZES=33"),
])
def test_a_global_batch_that_does_not_divide_is_refused(tmp_path, recipe, env, variable):
    proc, cmds = run_recipe(tmp_path, recipe, LAUNCH="torchrun --nproc_per_node 2", **env)
    assert proc.returncode == 2 and variable in proc.stderr and "2 processes" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not [c for c in cmds if "pretrain" in c]


def test_default_command_lines_are_unchanged(tmp_path):
    """`bash recipes/quickstart.sh` with no variable runs the command lines that made the committed results (on a
    CPU, with `--precision no` spelled out since issue 54: the float32 they were made in, on any CPU)."""
    import torch

    proc, cmds = run_recipe(tmp_path, "quickstart")
    assert proc.returncode == 0, proc.stderr
    out = str(tmp_path / "out")
    (train,) = [c for c in cmds if "pretrain" in c]
    assert train[0] == "vltool" and train[1:3] == ["pretrain", f"{out}/lit-bow/seed0/data"]
    assert train[train.index("--seed") + 2:train.index("--seed") + 4] == ["--image-tower", "torchvision:mobilenet_v2"]
    assert train[train.index("--text-pooling"):] == ["--text-pooling", "mean", "--lock-image", "--lock-text", "--augment", "none",
                                                       "--batch-size", "64", "--lr", "1e-3", "--epochs", "10",
                                                       *([] if torch.cuda.is_available() else ["--precision", "no"]), "--no-progress", "--overwrite"]
    assert cmds[0] == ["vltool", "deform", "emoji", "--where", "split=train", "--ops", "shuffle,rmstop,basevocab,rmtopfreq20,keep4",
                       "--seed", "0", "--out", f"{out}/lit-bow/seed0/data", "--overwrite"]
    assert cmds[2] == ["vltool", "zeroshot", "emoji", "--where", "split=test", "--model", f"{out}/lit-bow/seed0/run", "--bootstrap",
                       "1000", "--group-column", "base_id", "--out", f"{out}/lit-bow/seed0/zeroshot.json", "--overwrite"]
    report = cmds[-1]
    assert option(report, "--title") == "Quick start: MobileNetV2 + MiniLM aligned on bags of words of the emoji names"
    assert report[report.index("--style"):report.index("--style") + 4] == ["--style", "Noto=", "--style", "OpenMoji=-style2"]


def test_inputs_a_recipe_cannot_use_are_refused_in_one_line(tmp_path):
    cases = [
        ("unicl", {"TRAIN_DATA": str(tmp_path), "ZEROSHOT_BENCH": "/bench/cls"}, "LABEL_DATA"),
        ("debias", {"TRAIN_DATA": str(tmp_path), "ZEROSHOT_BENCH": "/bench/cls"}, "CONCEPT_DATA"),
        ("quickstart", {"TRAIN_DATA": str(tmp_path)}, "TRAIN_DATA="),  # (no benchmark named: not scored on the built-in data)
        ("quickstart", {"TRAINABLE": "some"}, "TRAINABLE=some"),
        ("quickstart", {"INIT": "hf:you/tiny-clip", "ARCH": "vltool-micro"}, "INIT=hf:you/tiny-clip and ARCH=vltool-micro"),
        ("fff", {"TRAIN_DATA": str(tmp_path / "shards/{0..3}.tar"), "ZEROSHOT_BENCH": "/bench/cls"}, "TRAIN_DATA="),
        ("caption-worth", {"CAPTIONS_COLUMN": "texts"}, "CAPTIONS_COLUMN=texts"),
        ("clip-lite", {"TRAIN_DATA": str(tmp_path), "ZEROSHOT_BENCH": "/bench/cls"}, "PROBE_BENCH"),
    ]
    for recipe, env, variable in cases:
        proc, cmds = run_recipe(tmp_path, recipe, **env)
        assert proc.returncode == 2 and variable in proc.stderr, (recipe, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and not [c for c in cmds if "pretrain" in c], recipe


def test_every_bad_study_variable_is_refused_before_anything_runs(tmp_path):
    """Each of these passed the recipes' checks and failed only later, some after training (issue 52): now
    `vltool check-study` refuses it first, in one line naming the variable, before any command runs."""
    from tests.fixtures.clip_benchmark import make_cb_classification, make_cb_retrieval

    cls, ret = make_cb_classification(tmp_path / "cb_cls"), make_cb_retrieval(tmp_path / "cb_ret")
    (tmp_path / "cb_test_only").mkdir()
    import shutil

    shutil.copytree(cls / "test", tmp_path / "cb_test_only" / "test")
    shutil.copy(cls / "classnames.txt", tmp_path / "cb_test_only")
    cases = [
        ("quickstart", {"ZEROSHOT_BENCH": "/nonexistent"}, "ZEROSHOT_BENCH=/nonexistent"),
        ("quickstart", {"ZEROSHOT_BENCH": str(ret)}, "is a retrieval set"),
        ("clip-lite", {"PROBE_BENCH": str(tmp_path / "cb_test_only")}, "PROBE_TRAIN_SPLIT"),
        ("quickstart", {"ZEROSHOT_BENCH": str(cls), "EVAL_SPLIT": "nosuch"}, "EVAL_SPLIT"),
        ("quickstart", {"TRAIN_DATA": "emoji-openmoji"}, "TRAIN_DATA=emoji-openmoji: test-only"),
        ("caption-worth", {"CAPTIONER": "/nonexistent"}, "CAPTIONER=/nonexistent"),
        ("quickstart", {"TRAINABLE": "image-last-2x"}, "TRAINABLE=image-last-2x"),
        ("quickstart", {"LAUNCH": "nosuchlauncher --num_processes 2"}, "LAUNCH=nosuchlauncher"),
        ("quickstart", {"THREADS": "abc"}, "THREADS=abc"),
        ("unicl", {"LABEL_DATA": "/nonexistent"}, "LABEL_DATA=/nonexistent: dataset '/nonexistent' does not exist"),
        ("debias", {"CONCEPT_DATA": "/nonexistent"}, "CONCEPT_DATA=/nonexistent: dataset '/nonexistent' does not exist"),
        ("quickstart", {"TRAIN_DATA": str(tmp_path / "no-shards" / "{000..003}.tar")}, "TRAIN_DATA="),
    ]
    for recipe, env, says in cases:
        proc, cmds = run_recipe(tmp_path / "r", recipe, SHIM_REAL_CHECK="1", **env)
        assert proc.returncode == 2 and says in proc.stderr, (recipe, env, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and cmds == [], (recipe, env, cmds)


def test_model_and_data_variables_reach_every_training_command(tmp_path):
    """INIT replaces the towers (TRAINABLE=projections keeps both locked: a whole CLIP's projections train, see
    tests/test_hf.py), TRAIN_DATA the training rows, and the report's title names both."""
    from tests.fixtures.clip_benchmark import make_cb_classification, make_cb_retrieval

    cls, ret = str(make_cb_classification(tmp_path / "cb_cls")), str(make_cb_retrieval(tmp_path / "cb_ret"))  # (vltool info reads them)
    proc, cmds = run_recipe(tmp_path, "fistful-of-words", INIT="hf:you/tiny-clip", TRAIN_DATA="/data/my-shards",
                            TRAIN_WHERE="lang=en", SEEDS="0", ZEROSHOT_BENCH=cls, RETRIEVAL_BENCH=ret)
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in cmds if "pretrain" in c]
    assert trains and all(option(c, "--init") == "hf:you/tiny-clip" and "--image-tower" not in c for c in trains)
    assert all(c[c.index("--init") + 2:c.index("--init") + 4] == ["--lock-image", "--lock-text"] for c in trains)
    intact = next(c for c in trains if "/intact/" in option(c, "--out"))
    assert intact[2:5] == ["/data/my-shards", "--where", "lang=en"]
    halves = next(c for c in cmds if c[1] == "split")
    assert halves[2:5] == ["/data/my-shards", "--where", "lang=en"] and option(halves, "--by") == "id"
    evals = [c for c in cmds if c[1] in ("zeroshot", "retrieve")]
    assert {c[2] for c in evals if c[1] == "zeroshot"} == {cls} and {c[2] for c in evals if c[1] == "retrieve"} == {ret}
    assert all("--group-column" not in c for c in evals)  # GROUP_COLUMN empty: images are the bootstrap unit
    reports = [c for c in cmds if c[1] == "report"]
    assert reports and all("my-shards" in option(c, "--title") for c in reports)
    assert all(any(a.startswith("Study: ") and "model hf:you/tiny-clip" in a for a in c) for c in reports)


def test_unicl_takes_label_data_beside_train_data(tmp_path):
    """UniCL on a study of one's own: TRAIN_DATA's image-text rows, LABEL_DATA's image-label rows (issue 39)."""
    import datasets

    labels = tmp_path / "labels"
    datasets.Dataset.from_dict({"id": ["a"], "label": [0]}, features=datasets.Features(
        {"id": datasets.Value("string"), "label": datasets.ClassLabel(names=["red heart"])})).save_to_disk(str(labels))
    from tests.fixtures.clip_benchmark import make_cb_classification

    bench = make_cb_classification(tmp_path / "wds_cls")  # CLIP_benchmark's layout: a folder per split
    proc, cmds = run_recipe(tmp_path, "unicl", TRAIN_DATA="/data/pairs", LABEL_DATA=str(labels), PROBE_BENCH=str(bench),
                            ZEROSHOT_BENCH=str(bench), SEEDS="0")
    assert proc.returncode == 0, proc.stderr
    trains = {option(c, "--out").split("/")[-3]: c for c in cmds if "pretrain" in c}
    assert set(trains) == {"clip", "unicl-text", "unicl-label", "unicl-both"}
    assert option(trains["unicl-both"], "--label-data") == str(labels) and option(trains["unicl-both"], "--text-data") == "/data/pairs"
    assert all("--where" not in c for c in trains.values())
    assert [c[2:5] for c in cmds if c[1] == "zeroshot"] == [[str(bench), "--split", "test"]] * 4
    probes = [c for c in cmds if c[1] == "probe"]
    assert probes and all(c[2:5] == [str(bench), "--split", "train"] and option(c, "--eval-split") == "test" for c in probes)
    proc, _ = run_recipe(tmp_path, "unicl", TRAIN_DATA="/data/pairs", LABEL_DATA=str(labels), PROBE_BENCH="/bench/cls",
                         TRAIN_WHERE="lang=en")
    assert proc.returncode == 2 and "TRAIN_WHERE=lang=en" in proc.stderr


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_training_command_runs_under_launch_with_its_batch_divided_and_every_evaluation_in_both_styles(tmp_path, recipe):
    """Under LAUNCH every recipe runs the command lines it runs on one process, each training command prefixed by
    LAUNCH and its --batch-size given as --global-batch-size (pretrain divides it among the 2 processes), and
    nothing else changes. The smoke runs
    of tests/test_recipes.py launch 2 real processes for one recipe; this covers the rest in seconds."""
    launch = "accelerate launch --multi_gpu --num_processes 2"
    proc, alone = run_recipe(tmp_path / "alone", recipe, SEEDS="0")
    assert proc.returncode == 0, proc.stderr
    proc, launched = run_recipe(tmp_path / "launched", recipe, SEEDS="0", LAUNCH=launch)
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in alone if "pretrain" in c]
    assert trains and len(launched) == len(alone)
    # ... and, on the emoji study, every evaluation is also scored in the second art style: X.json has its twin
    # X-style2.json (the smoke runs of tests/test_recipes.py score both styles in three recipes only)
    outs = [option(c, "--out") for c in alone if c[1] in ("zeroshot", "retrieve", "probe")]
    first = [o for o in outs if "-style2" not in o]
    assert first and sorted(o.replace(".json", "-style2.json") for o in first) == sorted(o for o in outs if "-style2" in o)
    prefix = launch.split() + ["-m"]
    for one, two in zip(alone, launched):
        one = [a.replace("/alone/", "/launched/") for a in one]
        if "pretrain" not in one:
            assert two[:2] == one[:2] and ("report" in one or two == one), (one, two)
            continue
        assert two[:len(prefix)] == prefix and two[len(prefix):len(prefix) + 2] == ["vltool", "pretrain"]
        two = two[len(prefix):]
        batch = one.index("--batch-size")
        assert two[batch] == "--global-batch-size" and "--batch-size" not in two
        assert two[-2:] == ["--processes", "2"]  # (pretrain refuses a launch that started another number)
        two = two[:-2]
        assert two[:batch] + two[batch + 1:] == one[:batch] + one[batch + 1:]


def test_threads_reach_every_command(tmp_path):
    """THREADS (default 1, as the committed runs were made) is every command's OMP_NUM_THREADS (issue 42)."""
    for threads, expected in ((None, "1"), ("3", "3")):
        proc, cmds = run_recipe(tmp_path, "fistful-of-words", SEEDS="0", **({"THREADS": threads} if threads else {}))
        assert proc.returncode == 0, proc.stderr
        seen = (tmp_path / "fistful-of-words.log.threads").read_text().split()
        assert len(seen) == len(cmds) > 10 and set(seen) == {expected}


@pytest.mark.parametrize("recipe", RECIPES)
def test_report_seed_redraws_every_report_and_changes_nothing_else(tmp_path, recipe):
    """REPORT_SEED=1 adds `--seed 1` to every `vltool report` of a recipe and to nothing else (issue 42's check
    that no verdict depends on the bootstrap's draw: scripts/compare_verdicts.py on the two reports)."""
    _, plain = run_recipe(tmp_path / "plain", recipe, SEEDS="0")
    proc, seeded = run_recipe(tmp_path / "seeded", recipe, SEEDS="0", REPORT_SEED="1")
    assert proc.returncode == 0, proc.stderr
    plain = [[a.replace(str(tmp_path / "plain"), "T") for a in c] for c in plain]
    seeded = [[a.replace(str(tmp_path / "seeded"), "T") for a in c] for c in seeded]
    reports = [i for i, c in enumerate(plain) if c[1] == "report"]
    assert reports and len(seeded) == len(plain)
    for i, (a, b) in enumerate(zip(plain, seeded)):
        if i in reports:
            at = b.index("--seed")
            assert b[at + 1] == "1" and b[:at] + b[at + 2:] == a
        else:
            assert b == a
    assert all("--seed" not in c for c in (plain[i] for i in reports))  # the default: report's own seed 0


def test_clip_lite_on_shards_trains_on_nested_quarters_and_probes_on_the_benchmarks_own_splits(tmp_path):
    """A study of one's own in clip-lite.sh (its real run is left out of tests/test_recipes.py for time): the shards
    are split by id into quarters, the k-th fraction trains on the first k, and the probe fits on the benchmark's
    train split and scores its test split."""
    from tests.fixtures.clip_benchmark import make_cb_classification

    bench = make_cb_classification(tmp_path / "wds_cls")  # CLIP_benchmark's layout: a folder per split
    shards = "/data/shards/{00000..00001}.tar"
    proc, cmds = run_recipe(tmp_path, "clip-lite", TRAIN_DATA=shards, PROBE_BENCH=str(bench), ZEROSHOT_BENCH=str(bench),
                            RETRIEVAL_BENCH=str(bench), SEEDS="0")
    assert proc.returncode == 0, proc.stderr
    (split,) = [c for c in cmds if c[1] == "split"]
    assert split[2] == shards and option(split, "--by") == "id" and option(split, "--parts") == "q1=0.25,q2=0.25,q3=0.25,q4=0.25"
    quarters = option(split, "--out")
    trains = {option(c, "--out").split("/")[-3]: c for c in cmds if c[1] == "pretrain"}
    for k in (1, 2, 3, 4):
        for loss in ("clip", "jsd"):
            c = trains[f"{loss}-{25 * k}pct"]
            assert c[2:2 + k] == [f"{quarters}/q{i}" for i in range(1, k + 1)] and option(c, "--loss") == loss
    probes = [c for c in cmds if c[1] == "probe"]
    assert len(probes) == len(trains) and all(c[2:5] == [str(bench), "--split", "train"] and option(c, "--eval-split") == "test" for c in probes)


def test_training_on_a_cpu_is_float32_unless_precision_is_set(tmp_path):
    """pretrain's --precision auto is bf16 on a CPU with AVX-512 BF16: a recipe left to it would not make the
    committed (float32) results on such a machine. Unset, PRECISION is `no` on a CPU; a set one is passed on."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU (PRECISION is then pretrain's auto)")
    proc, cmds = run_recipe(tmp_path / "a", "quickstart")
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in cmds if "pretrain" in c]
    assert trains and all(option(c, "--precision") == "no" for c in trains)
    proc, cmds = run_recipe(tmp_path / "b", "quickstart", PRECISION="bf16")
    assert proc.returncode == 0, proc.stderr
    assert all(option(c, "--precision") == "bf16" for c in cmds if "pretrain" in c)


def test_on_a_cpu_every_command_runs_on_avx2s_kernels_unless_told(tmp_path):
    """JSD at seed 1 ended elsewhere on an AVX-512 machine than on the AVX2 ones that made the committed results
    (issue 52): on a CPU the recipes pin torch's, MKL's and oneDNN's kernels to AVX2's; a value set, even "",
    is the user's."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU (the pins are for CPU runs)")
    proc, cmds = run_recipe(tmp_path / "a", "quickstart")
    assert proc.returncode == 0, proc.stderr
    isa = Path(f"{tmp_path / 'a' / 'quickstart'}.log.isa").read_text().splitlines()
    assert len(isa) == len(cmds) > 0 and set(isa) == {"AVX2 avx2 AVX2"}
    proc, cmds = run_recipe(tmp_path / "b", "quickstart", MKL_CBWR="", ATEN_CPU_CAPABILITY="avx512")
    assert proc.returncode == 0, proc.stderr
    assert set(Path(f"{tmp_path / 'b' / 'quickstart'}.log.isa").read_text().splitlines()) == {"unset avx512 AVX2"}


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "quickstart"])  # (quickstart prints its evaluations' tables)
def test_each_trained_model_is_evaluated_in_one_process(tmp_path, recipe):
    """Issue 54: a model's zero-shot, retrieval and probe commands run as one `vltool evaluate` plan (one start-up),
    after its training and before the next; the shim logs each plan's lines as the commands they are."""
    proc, cmds = run_recipe(tmp_path, recipe, SEEDS="0")
    assert proc.returncode == 0, proc.stderr
    plans = Path(f"{tmp_path / recipe}.log.plans").read_text().splitlines()
    trains = [i for i, c in enumerate(cmds) if "pretrain" in c]
    assert len(plans) == len(trains) > 0
    evals = [i for i, c in enumerate(cmds) if c[0] == "vltool" and c[1] in ("zeroshot", "retrieve", "probe")]
    assert evals and all(any(t < i for t in trains) for i in evals)  # each evaluates a model trained before it


def test_an_own_study_is_scored_on_the_benchmarks_it_names_and_smoke_honours_trainable(tmp_path):
    """Issue 52: TRAIN_DATA with ZEROSHOT_BENCH but no RETRIEVAL_BENCH ran `retrieve emoji` into the same report;
    a retrieval benchmark with several captions per image was scored on one; SMOKE=1 trained every parameter
    whatever TRAINABLE said while the note said TRAINABLE=projections."""
    from tests.fixtures.clip_benchmark import make_cb_classification
    from tests.fixtures.eval_data import make_colors

    caps = make_colors(tmp_path / "caps")  # (a captions column: every caption of an image is scored)
    cls = str(make_cb_classification(tmp_path / "cls"))
    proc, cmds = run_recipe(tmp_path / "a", "fistful-of-words", SEEDS="0", TRAIN_DATA="/data/my-ds", ZEROSHOT_BENCH=cls)
    assert proc.returncode == 0, proc.stderr
    assert [c for c in cmds if c[1] == "zeroshot"] and not [c for c in cmds if c[1] == "retrieve"]
    notes = [a for c in cmds if c[1] == "report" for a in c if a.startswith("Study:")]
    assert notes and all(f"evaluated on {cls} (zero-shot), split test; a task without a benchmark named is left out" in n
                         and "emoji" not in n for n in notes), notes
    proc, cmds = run_recipe(tmp_path / "b", "fistful-of-words", SEEDS="0", TRAIN_DATA="/data/my-ds", RETRIEVAL_BENCH=caps)
    assert proc.returncode == 0, proc.stderr
    rets = [c for c in cmds if c[1] == "retrieve"]
    assert rets and all(option(c, "--text-column") == "captions" for c in rets) and not [c for c in cmds if c[1] == "zeroshot"]
    for given, locks, says in ((None, [], "TRAINABLE=all"), ("projections", ["--lock-image", "--lock-text"], "TRAINABLE=projections")):
        proc, cmds = run_recipe(tmp_path / f"smoke-{given}", "quickstart", SMOKE="1", ARCH="vltool-micro",
                                **({"TRAINABLE": given} if given else {}))
        assert proc.returncode == 0, proc.stderr
        (train,) = [c for c in cmds if c[1] == "pretrain"]
        assert [a for a in train if a in ("--lock-image", "--lock-text")] == locks, train
        report = next(c for c in cmds if c[1] == "report")
        assert any(says in a for a in report), report


def test_common_sh_runs_no_python_of_its_own():
    """recipes/common.sh asks vltool (`vltool info --shipped/--auto-device/--require/--select/--get`) what it
    needs to know, rather than running inline Python that re-implements what vltool reads (issue 55)."""
    import re

    code = [line.split("#")[0] for line in (ROOT / "recipes" / "common.sh").read_text().splitlines()]
    assert not [line for line in code if re.search(r"\bpython3?\b|<<\s*'?PY", line)]
