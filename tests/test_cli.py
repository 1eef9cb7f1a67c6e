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


def test_command_table_names_every_command_module_and_its_own_name():
    """A command module missing from vltool.commands.TABLE would never run: each is there, under the name
    its register() gives, with the one-line help `vltool --help` prints."""
    from pathlib import Path

    import typer

    from vltool.commands import TABLE

    shared = {"__init__", "common", "evaluation"}
    modules = {p.stem for p in Path(vltool.__file__).parent.joinpath("commands").glob("*.py")} - shared
    assert sorted(m for m, _ in TABLE.values()) == sorted(modules)
    for name, (module, line) in TABLE.items():
        sub = typer.Typer()
        __import__(f"vltool.commands.{module}", fromlist=["register"]).register(sub)
        (info,) = sub.registered_commands
        assert (info.name, info.short_help) == (name, line)


def test_help_and_unknown_command_import_no_command_module():
    code = ("import sys\nfrom vltool.cli import main\nfor argv in (['--help'], ['zerosht']):\n    sys.argv = ['vltool', *argv]\n"
            "    try:\n        main()\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('vltool.') and m != 'vltool.cli'), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stderr.strip().splitlines()[-1] == "['vltool.commands']", r.stderr
    assert "Did you mean 'zeroshot'?" in r.stderr


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
