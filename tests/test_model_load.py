"""vltool.model.load: a --model that cannot be loaded is one line naming the real cause (the missing part, the
spelling to use), not advice about another option."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures.messages import error_line
from tests.fixtures.training import finished_micro_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished micro run."""
    return finished_micro_run(tmp_path_factory.mktemp("messages_run"))


@pytest.mark.parametrize("model", ["local-dir:", "hf:"])
def test_a_model_prefix_without_a_path_does_not_blame_the_current_directory(cli, tmp_path, monkeypatch, model):
    """`--model local-dir:` read as the current directory, which `--out results.json` then "would overwrite"."""
    monkeypatch.chdir(tmp_path)
    r = cli("retrieve", "emoji", "--model", model, "--out", "results.json")
    assert r.exit_code == 2
    line = error_line(r)
    assert "would overwrite the input" not in line and "expected" in line and model in line, line
    assert not (tmp_path / "results.json").exists()


def test_a_model_with_its_config_deleted_is_incomplete_not_unfinished(cli, tmp_path, run_dir):
    """A finished run whose model/config.json was deleted was "an unfinished training run ... --resume"."""
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    (broken / "model" / "config.json").unlink()
    for model in (broken, broken / "model"):
        r = cli("retrieve", "emoji", "--model", model, "--out", tmp_path / "r.json")
        assert r.exit_code == 2
        line = error_line(r)
        assert line.startswith(f"error: {broken / 'model'} is an incomplete model (no config.json)") and "--resume" not in line, line
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copytree(run_dir / "checkpoints", unfinished / "checkpoints")
    shutil.copy(run_dir / "run.json", unfinished)
    r = cli("retrieve", "emoji", "--model", unfinished, "--out", tmp_path / "r.json")
    assert r.exit_code == 2 and "unfinished training run" in error_line(r) and "--resume" in error_line(r)


@pytest.mark.parametrize("spec,expect", [
    ("open_clip:", "'open_clip:' names no architecture; expected open_clip:ARCH/TAG"),
    ("open_clip:NoSuchArch/tag", "open_clip:NoSuchArch/tag: unknown architecture 'NoSuchArch'"),
])
def test_an_open_clip_spelling_without_a_known_architecture_does_not_blame_arch(cli, spec, expect):
    """`--model open_clip:` and `open_clip:NoSuchArch/tag` said "--arch '...': unknown architecture" (no --arch was given)."""
    r = cli("zeroshot", "emoji", "--model", spec, "--bootstrap", "0")
    assert r.exit_code == 2
    line = error_line(r)
    assert line.startswith(f"error: {expect}") and "--arch" not in line, line


def test_a_file_that_is_not_open_clip_weights_says_what_to_give(cli):
    """`open_clip:ViT-B-32/../../../../etc/passwd`: a raw "list index out of range"."""
    r = cli("zeroshot", "emoji", "--model", "open_clip:vltool-micro/../../../../etc/passwd", "--bootstrap", "0")
    assert r.exit_code == 2
    line = error_line(r)
    assert line.startswith("error: open_clip:vltool-micro/../../../../etc/passwd: cannot load open_clip weights ") and \
        "give a weights file open_clip saved for vltool-micro, or one of its pretrained tags" in line, line


def test_a_hub_id_with_a_space_after_hf_says_so(cli):
    """`hf: ORG/NAME` showed a valid id and called it "not a Hub id"."""
    r = cli("zeroshot", "emoji", "--model", "hf: openai/clip-vit-base-patch32", "--bootstrap", "0")
    assert r.exit_code == 2
    assert error_line(r) == "error: 'hf: openai/clip-vit-base-patch32': a space after 'hf:' (or at the end); write hf:openai/clip-vit-base-patch32"


def test_an_unknown_torchvision_tower_is_named_before_its_weights(cli, tmp_path):
    """`--image-tower torchvision:nosuchnet` asked for --image-weights (for a model that does not exist)."""
    r = cli("pretrain", "emoji", "--image-tower", "torchvision:nosuchnet", "--out", tmp_path / "run")
    assert r.exit_code == 2
    line = error_line(r)
    assert line == "error: --image-tower torchvision:nosuchnet: torchvision has no model 'nosuchnet' (e.g. mobilenet_v2, resnet50, efficientnet_b0)", line


def test_a_models_config_file_given_as_the_model_names_its_folder(cli, run_dir):
    """`--model RUN/model/config.json` said "not a vltool model (no config.json ...)"."""
    r = cli("zeroshot", "emoji", "--model", run_dir / "model" / "config.json", "--bootstrap", "0")
    assert r.exit_code == 2
    assert error_line(r) == f"error: model '{run_dir / 'model' / 'config.json'}' is a file, not a model folder; give its folder: {run_dir}"


def test_hub_cache_problems_are_named_not_called_missing(cli, tmp_path, monkeypatch):
    """HF_HOME being a file, and refs/main naming a snapshot that is gone, both said "not in the Hugging Face
    cache; download it", which downloading does not fix."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    home = tmp_path / "hf-home"
    home.write_text("not a folder")
    monkeypatch.setenv("HF_HOME", str(home))
    r = cli("zeroshot", "emoji", "--model", "hf:testorg/tiny-clip", "--bootstrap", "0")
    assert r.exit_code == 2
    line = error_line(r)
    assert f"the Hugging Face cache {home / 'hub'} (HF_HOME={home}) cannot be a folder: {home} is a file; point HF_HOME at a folder" in line, line
    home.unlink()
    folder = home / "hub" / "models--testorg--tiny-clip"
    (folder / "refs").mkdir(parents=True)
    (folder / "snapshots").mkdir()
    (folder / "refs" / "main").write_text("ab" * 20)
    r = cli("zeroshot", "emoji", "--model", "hf:testorg/tiny-clip", "--bootstrap", "0")
    assert r.exit_code == 2
    line = error_line(r)
    assert f"the cache {folder} is damaged: refs/main names commit {'ab' * 20}, whose snapshot folder is missing; remove {folder}" in line, line
    assert "not in the Hugging Face cache" not in line
