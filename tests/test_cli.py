"""The `vltool` command itself: help, version, entry points, light imports."""

import subprocess
import sys

import vltool


def test_version(cli):
    r = cli("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"vltool {vltool.__version__}"


def test_help_lists_existing_commands_with_summaries(cli):
    r = cli("--help")
    assert r.exit_code == 0
    assert "deform" in r.stdout and "Captions to bags of words" in r.stdout


def test_every_command_help_has_an_example(cli):
    from vltool.cli import app

    import typer.main

    group = typer.main.get_command(app)
    for name in group.commands:
        r = cli(name, "--help")
        assert r.exit_code == 0, name
        assert "Example" in r.stdout and f"vltool {name}" in r.stdout, name


def test_cli_module_imports_nothing_heavy():
    code = "import sys, vltool.cli; print(sorted(m for m in ('torch','datasets','transformers','open_clip') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_python_dash_m_and_usage_error_exit_code(tmp_path):
    r = subprocess.run([sys.executable, "-m", "vltool", "deform", "missing_dir", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: dataset 'missing_dir' does not exist (give a directory written by save_to_disk, or 'emoji')"
    r = subprocess.run([sys.executable, "-m", "vltool", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("vltool ")


def test_debug_env_shows_traceback(tmp_path, monkeypatch):
    import pytest

    from vltool.errors import UsageError

    monkeypatch.setenv("VLTOOL_DEBUG", "1")
    from vltool.deform import DeformConfig, deform

    with pytest.raises(UsageError):
        deform("missing_dir", tmp_path / "o", DeformConfig())
