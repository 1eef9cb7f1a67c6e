"""Every command's option defaults are its config's defaults: `vltool X` with no option given hands its
library function the config that `XConfig(...)` builds in Python from the same required arguments.

Read from behaviour, not from names: each command runs with only its required arguments, its library function
replaced by one that keeps the config it is given and stops; any field where that config differs from the
dataclass's own default is a default written twice that disagrees (docs/conventions.md, "Options")."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

# command -> (its required arguments, the function it hands its config to, the config fields those arguments set).
# "{tmp}" is a fresh directory; the paths need not exist: the function is replaced before anything reads them.
CASES = {
    "deform": (["{tmp}/data", "--out", "{tmp}/out"], "vltool.deform:deform", ()),
    "import": (["{tmp}/data.csv", "--out", "{tmp}/out"], "vltool.importer:import_data", ()),
    "export": (["{tmp}/data", "--out", "{tmp}/out"], "vltool.export:export", ()),
    "info": (["{tmp}/data"], "vltool.info:info", ()),
    "pretrain": ([], "vltool.pretrain:pretrain", ()),
    "recaption": (["{tmp}/data", "--out", "{tmp}/out", "--model", "{tmp}/captioner"], "vltool.recaption:recaption", ("model",)),
    "filter": (["{tmp}/data", "--out", "{tmp}/out", "--reference", "{tmp}/ref"], "vltool.filter:filter", ()),
    "zeroshot": (["{tmp}/data", "--model", "M"], "vltool.zeroshot:zeroshot", ("model",)),
    "retrieve": (["{tmp}/data", "--model", "M"], "vltool.retrieve:retrieve", ("model",)),
    "probe": (["{tmp}/data", "--eval-data", "{tmp}/eval", "--model", "M"], "vltool.probe:probe", ("model",)),
    "mine-positives": (["{tmp}/data", "--model", "M"], "vltool.mine_positives:mine_positives", ("model",)),
    "pseudolabel": (["{tmp}/data", "--aligned", "{tmp}/aligned", "--model", "M", "--out", "{tmp}/out"], "vltool.pseudolabel:pseudolabel", ("model",)),
    "debias": (["--model", "M", "--out", "{tmp}/out"], "vltool.debias:compute_subspace", ("model",)),
    "split": (["{tmp}/data", "--out", "{tmp}/out"], "vltool.split:split", ()),
    "report": (["{tmp}/runs", "--out", "{tmp}/report", "--metric", "zs.json:top1"], "vltool.report:build_report", ("metrics",)),
    "pick-caption": (["{tmp}/data", "--out", "{tmp}/out"], "vltool.pick_caption:pick_caption", ()),
    "benchmark": (["--model", "M"], "vltool.benchmark:benchmark", ("model",)),
    "evaluate": (["{tmp}/plan.txt"], "vltool.commands.evaluate:read_plan", ()),
}

# Commands with no config dataclass, each for a reason.
NO_CONFIG = {
    "check-study": "its input is NAME=VALUE arguments, checked by vltool.study.check_study; it has no option with a value",
}


class _Stop(Exception):
    """Raised by the replaced library function once it holds the config."""


def _config_given(name: str, tmp: Path, monkeypatch) -> object:
    """The config dataclass that `vltool NAME` (only its required arguments) hands its library function."""
    from typer.testing import CliRunner

    from vltool.cli import app

    args, target, _ = CASES[name]
    module_name, function = target.split(":")
    module = importlib.import_module(module_name)
    given = []

    def keep_and_stop(*a, **kw):
        given.extend(v for v in [*a, *kw.values()] if dataclasses.is_dataclass(v) and not isinstance(v, type))
        raise _Stop

    monkeypatch.setattr(module, function, keep_and_stop)
    command_module = importlib.import_module(f"vltool.commands.{_table()[name][0]}")
    if hasattr(command_module, function):  # a name the command module imported at its top
        monkeypatch.setattr(command_module, function, keep_and_stop)
    monkeypatch.setenv("VLTOOL_DEBUG", "1")  # handle_errors lets _Stop through
    result = CliRunner().invoke(app, [name, *(a.format(tmp=tmp) for a in args)])
    assert isinstance(result.exception, _Stop) and len(given) == 1, (
        f"vltool {name} did not hand {target} one config (exit {result.exit_code}: {result.output.strip()[-300:]!r}, "
        f"{result.exception!r}); CASES[{name!r}] needs its required arguments or its function")
    return given[0]


def _table() -> dict:
    from vltool.commands import TABLE

    return TABLE


def _option_of(name: str, field: str) -> str:
    """The option of `name` spelled as `field` (text_column: --text-column, progress: --no-progress, notes:
    --note), or the field, for the message."""
    import typer.main

    from vltool.cli import app

    command = typer.main.get_command(app).commands[name]
    spelled = field.replace("_", "-")
    spellings = {"--" + spelled, "--no-" + spelled, "--" + spelled.removesuffix("s")}
    for p in command.params:
        if p.name == field or spellings & set(getattr(p, "opts", ())):
            return p.opts[0]
    return f"the option feeding {field}"


def test_every_command_is_covered_or_listed():
    assert set(CASES) | set(NO_CONFIG) == set(_table()), "a command of vltool.commands.TABLE is in neither CASES nor NO_CONFIG"
    assert not set(CASES) & set(NO_CONFIG)


@pytest.mark.parametrize("name", sorted(CASES))
def test_option_defaults_are_the_config_defaults(name, tmp_path, monkeypatch):
    given = _config_given(name, tmp_path, monkeypatch)
    cls = type(given)
    built = cls(**{field: getattr(given, field) for field in CASES[name][2]})  # the required arguments' values, the rest defaults
    problems = [f"{_option_of(name, f.name)} gives {getattr(given, f.name)!r}, {cls.__name__}.{f.name} defaults to {getattr(built, f.name)!r}"
                for f in dataclasses.fields(cls) if getattr(given, f.name) != getattr(built, f.name)]
    assert not problems, f"vltool {name}: " + "; ".join(problems)


def test_export_to_hf_takes_the_dataset_options_at_their_defaults(tmp_path, monkeypatch):
    """`export --to hf` refuses the dataset-only options when given, and tells "given" by a value other than
    the default: a default changed in one place would refuse every `--to hf`."""
    from typer.testing import CliRunner

    import vltool.export
    from vltool.cli import app

    def stop(*a, **kw):
        raise _Stop

    monkeypatch.setattr(vltool.export, "export_hf_model", stop)
    monkeypatch.setenv("VLTOOL_DEBUG", "1")
    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--to", "hf", "--out", str(tmp_path / "hf")])
    assert isinstance(result.exception, _Stop), (result.exit_code, result.output)
