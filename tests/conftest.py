import os

import pytest

# the fixtures of tests/fixtures/ that several test files take: world and captioners (every command's inputs),
# small_disk, rows_formatted
pytest_plugins = ["tests.fixtures.command_inputs", "tests.fixtures.disk", "tests.fixtures.formatting"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own vltool cache and HF datasets cache."""
    cache = tmp_path_factory.mktemp("vltool_cache")
    monkeypatch.setenv("VLTOOL_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache / "hf_datasets"))


def make_text_dataset(path, captions, ids=None, **columns):
    """Save a small id/caption dataset (plus extra columns) to `path` and return the path as str."""
    import datasets

    ids = ids or [f"r{i}" for i in range(len(captions))]
    ds = datasets.Dataset.from_dict({"id": ids, "caption": list(captions), **columns})
    ds.save_to_disk(str(path))
    return str(path)


@pytest.fixture
def text_dataset(tmp_path):
    def _make(captions, name="data", **kw):
        return make_text_dataset(tmp_path / name, captions, **kw)

    return _make


@pytest.fixture
def cli():
    """Run `vltool ARGS...` in-process; returns typer's Result (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from vltool.cli import app

    runner = CliRunner()

    def _run(*args):
        return runner.invoke(app, [str(a) for a in args])

    return _run
