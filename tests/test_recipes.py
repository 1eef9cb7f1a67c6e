"""Every recipe runs end to end in smoke mode (SMOKE=1: 8% of the emoji data, a tiny model, a few steps),
so that none rots. The numbers are not checked here: they measure nothing at this size."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.recipes  # about 26 minutes of test time, under 20 on two workers: `python -m pytest -m recipes -n 2` (.ci/run)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {
    # recipe: the results it writes, and variants each must contain
    "quickstart": {"quickstart": ["lit-bow"]},
    "fistful-of-words": {"fistful-of-words": ["intact", "only-bow", "mostly-bow", "mostly-bow-no-rmtopfreq"],
                         "fistful-of-words-semi-aligned": ["aligned-only", "aligned-only-2x", "pl-rmtop-rand", "pl-rmtop-maxcount",
                                                           "pl-maxcount", "pl-weighted-count"]},
    "caption-worth": {"caption-worth": ["simclr", "clip", "clips"],
                      "caption-worth-filter": ["clip-keywords-random", "clip-keywords-filtered"]},
    "unicl": {"unicl": ["unicl-text", "clip", "unicl-label", "unicl-both"], "unicl-labels": ["unicl-label", "unicl-both"]},
    "clip-lite": {"clip-lite": ["clip-25pct", "jsd-25pct", "clip-100pct", "jsd-100pct"], "clip-lite-batch": ["jsd-batch4", "jsd-100pct"],
                  "clip-lite-negatives": ["jsd-all-100pct", "jsd-100pct", "clip-100pct"]},
    "fff": {"fff": ["clip", "sigmoid", "sigmoid-mined", "sigmoid-k", "sigmoid-1ofk", "sigmoid-mined-k", "sigmoid-mined-1ofk"],
            "fff-terms": ["mined-it", "mined-ii", "mined-tt"]},
    "debias": {"debias": ["images", "images-and-queries"], "debias-alignment": ["images"]},
}


# The recipes whose smoke runs also score the second art style (emoji-openmoji): the twin path is the same
# `each_style` loop in every recipe (recipes/common.sh) except unicl's held-out subgroups and debias's zero-shot;
# the other recipes run with STYLE2= (one style), which halves their evaluations and these tests' time.
SMOKE_TWINS = {"quickstart", "unicl", "debias"}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_runs_in_smoke_mode(recipe, tmp_path):
    out = tmp_path / "out"
    # THREADS=1, the recipes' default (.ci/run runs two of these tests at once, one per core); the records must
    # say 1 although torch alone would take both cores (OMP_NUM_THREADS unset here: the recipe exports it)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update({"SMOKE": "1", "OUT": str(out), "PYTHONWARNINGS": "ignore", "THREADS": "1"})
    if recipe not in SMOKE_TWINS:
        env["STYLE2"] = ""
    proc = subprocess.run(["bash", str(ROOT / "recipes" / f"{recipe}.sh")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "results").exists()  # smoke results stay under OUT
    for name, variants in RECIPES[recipe].items():
        report = json.loads((out / "results" / f"{name}.json").read_text())
        assert report["seeds"] == [0] and report["recipe"] == f"recipes/{recipe}.sh"
        by_name = {v["name"]: v for v in report["variants"]}
        for v in variants:
            assert by_name[v]["runs"]["0"], f"{name}: {v} has no numbers"
        assert report["commands"] and all(c["command_line"].startswith("vltool ") for c in report["commands"])
        # recipes/common.sh pins the torch threads of every command (THREADS), and the report's machine block is
        # the runs' (issue 42)
        assert report["machine"]["torch_threads"] == 1 and report["machine"]["source"].startswith("the runs' records")
        assert (out / "results" / f"{name}.md").read_text().startswith("# ")
        # every evaluation is also scored in the second art style (emoji-openmoji), its twin beside it
        evals = [m for m in report["metrics"] if m["file"].split("/")[-1].startswith(("zeroshot", "retrieve", "probe"))]
        if evals and recipe not in SMOKE_TWINS:
            assert not report.get("styles") and not [m for m in evals if m.get("twin_of")]
        elif evals:
            assert [s["name"] for s in report["styles"]] == ["Noto", "OpenMoji"]
            twins = [m for m in evals if m.get("twin_of")]
            assert twins and {m["twin_of"] for m in twins} == {m["name"] for m in evals if not m.get("twin_of")}
            runs = [by_name[v]["runs"]["0"] for v in variants]
            assert all(m["name"] in r for m in twins for r in runs if m["twin_of"] in r)
    CHECKS.get(recipe, lambda out: None)(out)


def _commands(out: Path, name: str) -> list[str]:
    return [c["command_line"] for c in json.loads((out / "results" / f"{name}.json").read_text())["commands"]]


def _run_stats(run: Path) -> dict:
    return json.loads((run / "vltool.json").read_text())["stats"]


def _check_fistful(out: Path) -> None:
    # the memory bank's EMA momentum comes from each run's length (docs/objectives.md), logged in metrics.jsonl
    for run in (out / "intact/seed0/run", out / "aligned-only-2x/seed0/run"):
        (ema,) = [m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "ema"]
        steps = _run_stats(run)["steps"]
        assert ema["given"] is False and ema["ema_momentum"] == min(0.999, 0.5 ** (1 / (0.1 * steps)))
    # the pseudo-words are retrieved from the intact aligned half (all its rows), not the deformed one
    pl = [c for c in _commands(out, "fistful-of-words-semi-aligned") if c.startswith("vltool pseudolabel")]
    assert len(pl) == 4 and all("/shared/seed0/halves/aligned " in c for c in pl)
    halves = json.loads((out / "shared/seed0/halves/aligned/vltool.json").read_text())
    stats = json.loads((out / "pl-maxcount/seed0/data/vltool.json").read_text())["stats"]
    assert stats["aligned_rows"] == halves["rows_out"]


def _check_unicl(out: Path) -> None:
    # UniCL on the image-text rows alone is the baseline, and every variant trains as many steps as CLIP
    report = json.loads((out / "results" / "unicl.json").read_text())
    assert report["baseline"] == "unicl-text"
    steps = {v: _run_stats(out / v / "seed0" / "run")["steps"] for v in ("clip", "unicl-text", "unicl-label", "unicl-both")}
    assert len(set(steps.values())) == 1, steps


def _check_caption_worth(out: Path) -> None:
    # the Santurkar probe's metric is class-balanced accuracy (appendix A.3)
    report = json.loads((out / "results" / "caption-worth.json").read_text())
    assert any("probe:mean_per_class_recall" in json.dumps(m) for m in report["metrics"])


def _check_fff(out: Path) -> None:
    # "both" mines over every caption of a row; its control trains on the same positives, one caption per step
    mined = json.loads((out / "sigmoid-mined-k/seed0/data/vltool.json").read_text())
    assert mined["stats"]["text_column"] == "captions" and mined["stats"]["several_captions"] is True
    cmds = [c for c in _commands(out, "fff") if c.startswith("vltool pretrain")]
    (control,) = [c for c in cmds if "/sigmoid-mined-1ofk/" in c]
    assert "sigmoid-mined-k/seed0/data" in control and "--caption-sampling random" in control and "--captions-per-image" not in control


CHECKS = {"fistful-of-words": _check_fistful, "unicl": _check_unicl, "caption-worth": _check_caption_worth, "fff": _check_fff}


# ---- every recipe on a study of one's own (issue 39): stand-ins built here for img2dataset shards (image +
# caption only), separate benchmarks in CLIP_benchmark's layout (classification with train and test splits;
# retrieval), a CLIP from a hand-built Hugging Face cache (INIT=hf:you/tiny-clip), and for quickstart 2 CPU
# processes (LAUNCH; every other recipe's command lines under LAUNCH are checked in tests/test_recipe_inputs.py,
# in seconds: two real processes per training run cost minutes here).

@pytest.fixture(scope="module")
def own_study(tmp_path_factory):
    import datasets

    from tests.fixtures.clip_benchmark import make_cb_classification, make_cb_retrieval
    from tests.fixtures.hf_models import make_hf_clip, put_in_hub_cache
    from tests.fixtures.launch import launch_command

    root = tmp_path_factory.mktemp("own_study")
    shards = _emoji_shards(root / "shards", rows=96, per_shard=48)
    hf_home = root / "hf_home"
    put_in_hub_cache(hf_home, "you/tiny-clip", make_hf_clip(root / "tiny-clip-src"), "a" * 40)
    cls, ret = make_cb_classification(root / "wds_colors"), make_cb_retrieval(root / "wds_captions")
    imported = root / "shards-ds"  # fff and caption-worth need a table of rows (and caption them)
    r = subprocess.run(["vltool", "import", shards, "--out", str(imported), "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from bench.tiny_models import make_blip

    captioner = make_blip(root / "blip")
    folder = root / "folder"  # UniCL's image-label rows: an ImageFolder, its class names from the folder names
    ds = datasets.load_from_disk(str(imported)).cast_column("image", datasets.Image(decode=False))
    for i, row in enumerate(ds.select(range(24))):
        class_dir = folder / ("smiling_face" if i % 2 else "red_heart")
        class_dir.mkdir(parents=True, exist_ok=True)
        (class_dir / f"{i}.png").write_bytes(row["image"]["bytes"])
    r = subprocess.run(["vltool", "import", str(folder), "--out", str(root / "labels"), "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(datasets.load_from_disk(str(imported))) == 96
    launch = " ".join(launch_command([], 2))
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "INIT": "hf:you/tiny-clip",
           "ZEROSHOT_BENCH": str(cls), "RETRIEVAL_BENCH": str(ret), "PROBE_BENCH": str(cls), "DATA_NAME": "my-shards",
           "OMP_NUM_THREADS": "1"}
    return {"env": env, "launch": launch, "shards": shards, "imported": str(imported), "captioner": str(captioner), "labels": str(root / "labels")}


def _emoji_shards(root: Path, rows: int, per_shard: int) -> str:
    """img2dataset's layout (key.jpg, key.txt, key.json per sample; no label, split or base_id) holding the first
    training rows of the built-in emoji data, whose names give the bag-of-words recipes words to work on."""
    import io as _io
    import tarfile

    import datasets

    from vltool.io import load_dataset

    ds = load_dataset("emoji", where=["split=train"]).dataset.cast_column("image", datasets.Image(decode=False))
    root.mkdir(parents=True)
    for s in range(rows // per_shard):
        with tarfile.open(root / f"{s:05d}.tar", "w") as tar:
            for j in range(per_shard):
                row = ds[s * per_shard + j]
                key = f"{s:05d}{j:04d}"
                files = {"png": row["image"]["bytes"], "txt": row["caption"].encode(),
                         "json": json.dumps({"key": key, "caption": row["caption"], "status": "success"}).encode()}
                for ext, data in files.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, _io.BytesIO(data))
    return str(root / f"{{00000..{rows // per_shard - 1:05d}}}.tar")


# clip-lite's study of one's own (shards split by id into quarters, the benchmark's own probe splits) is the
# same path as fistful-of-words' halves and caption-worth's probe, and its eleven runs made it the longest of
# these tests: its command lines are checked in tests/test_recipe_inputs.py instead.
OWN = {  # recipe: its own inputs beyond the shared ones, and the reports it writes
    "quickstart": ({"TRAIN_DATA": "shards", "LAUNCH": "launch"}, ["quickstart"]),
    "fistful-of-words": ({"TRAIN_DATA": "shards"}, ["fistful-of-words", "fistful-of-words-semi-aligned"]),
    "fff": ({"TRAIN_DATA": "imported", "CAPTIONER": "captioner"}, ["fff", "fff-terms", "fff-batch"]),
    "caption-worth": ({"TRAIN_DATA": "imported", "CAPTIONER": "captioner"}, ["caption-worth", "caption-worth-filter"]),
    "debias": ({"TRAIN_DATA": "shards", "CONCEPT_DATA": "emoji"}, ["debias", "debias-zeroshot"]),
    "unicl": ({"TRAIN_DATA": "imported", "LABEL_DATA": "labels"}, ["unicl", "unicl-labels"]),
}


@pytest.mark.parametrize("recipe", sorted(OWN))
def test_recipe_runs_on_your_own_study(recipe, own_study, tmp_path):
    own, reports = OWN[recipe]
    out = tmp_path / "out"
    env = {**os.environ, **own_study["env"], "SMOKE": "1", "OUT": str(out), "PYTHONWARNINGS": "ignore",
           **{k: own_study.get(v, v) for k, v in own.items()}}
    proc = subprocess.run(["bash", str(ROOT / "recipes" / f"{recipe}.sh")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in reports:
        report = json.loads((out / "results" / f"{name}.json").read_text())
        md = (out / "results" / f"{name}.md").read_text()
        assert "my-shards" in md.splitlines()[0]  # the title names the data
        assert "hf:you/tiny-clip" in md  # the caption names the model
        assert ("2 processes" in md) == ("LAUNCH" in own)  # and the launch
        assert report["variants"] and any(v["runs"].get("0") for v in report["variants"])
    runs = list(out.glob("*/seed0/run/vltool.json"))
    assert runs
    for run in runs:
        stats = json.loads(run.read_text())["stats"]
        processes = 2 if "LAUNCH" in own else 1
        assert stats["num_processes"] == processes and stats["per_process_batch"] * processes == stats["global_batch"]


def test_unicl_without_label_data_refuses_a_study_of_ones_own(own_study, tmp_path):
    env = {**os.environ, **own_study["env"], "SMOKE": "1", "OUT": str(tmp_path / "out"), "TRAIN_DATA": own_study["shards"]}
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "unicl.sh")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "LABEL_DATA" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
