"""What each short command imports, in a fresh interpreter: only what its input needs (docs/conventions.md,
"Start-up"). A new top-level import of a heavy library fails here by name; bench/bench_startup.py times it."""

import json
import subprocess
import sys

import pytest

# libraries whose import costs a second or more, or that a command on a vltool model never needs
HEAVY = ("torch", "torchvision", "datasets", "numpy", "transformers", "timm", "open_clip.factory", "nltk", "sklearn", "scipy",
         "faiss", "matplotlib", "accelerate")

RUN = """
import json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ['vltool', *json.loads(sys.argv[1])]
from vltool.cli import main
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({"code": code, "imported": [m for m in heavy if m in sys.modules]}), file=sys.stderr)
"""


def imported(argv: list, cwd) -> list[str]:
    r = subprocess.run([sys.executable, "-c", RUN, json.dumps([str(a) for a in argv]), json.dumps(HEAVY)], cwd=cwd,
                       capture_output=True, text=True)
    last = json.loads(r.stderr.strip().splitlines()[-1])
    assert last["code"] in (0, None), r.stderr[-2000:]
    return last["imported"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from vltool.pretrain import PretrainConfig, pretrain

    out = tmp_path_factory.mktemp("startup") / "run"
    pretrain(["emoji"], out, PretrainConfig(arch="vltool-micro", steps=1, batch_size=8, augment="none", seed=0), where=["split=train"], progress=False)
    return out


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["zeroshot", "--help"], ["pretrain", "--help"]])
def test_help_and_version_import_nothing_heavy(argv, tmp_path):
    assert imported(argv, tmp_path) == []


def test_deform_without_a_model_imports_only_datasets(tmp_path):
    assert imported(["deform", "emoji", "--ops", "shuffle,rmstop", "--out", tmp_path / "d", "--no-progress"], tmp_path) == ["datasets", "numpy"]


def test_info_imports_only_datasets(tmp_path):
    assert imported(["info", "emoji"], tmp_path) == ["datasets", "numpy"]


@pytest.mark.parametrize("command", ["zeroshot", "retrieve"])
def test_evaluating_a_vltool_model_imports_no_other_model_family(command, run_dir, tmp_path):
    """A vltool model's towers are open_clip's ViT and text transformer: neither open_clip's other families
    (its __init__: transformers, timm), nor scikit-learn, scipy, faiss, nltk or matplotlib."""
    argv = [command, "emoji", "--where", "split=test", "--model", run_dir, "--bootstrap", "0", "--out", tmp_path / "r.json", "--no-progress"]
    assert imported(argv, tmp_path) == ["torch", "torchvision", "datasets", "numpy", "accelerate"]
