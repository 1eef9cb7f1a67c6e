"""Options (docs/conventions.md, "Options"): one CLI option per config field, one meaning per option name
across commands, the old spellings still working for a release, help text printed as written, and the
options tables in docs/ generated from the commands."""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Every command and its config dataclass ("module:Class"). A new command is added here (test_every_command_is_listed).
CONFIGS = {
    "deform": "vltool.deform:DeformConfig",
    "import": "vltool.importer:ImportConfig",
    "export": "vltool.export:ExportConfig",
    "info": "vltool.info:InfoConfig",
    "pretrain": "vltool.pretrain:PretrainConfig",
    "recaption": "vltool.recaption:RecaptionConfig",
    "filter": "vltool.filter:FilterConfig",
    "zeroshot": "vltool.zeroshot:ZeroshotConfig",
    "retrieve": "vltool.retrieve:RetrieveConfig",
    "probe": "vltool.probe:ProbeConfig",
    "mine-positives": "vltool.mine_positives:MinePositivesConfig",
    "pseudolabel": "vltool.pseudolabel:PseudolabelConfig",
    "debias": "vltool.debias:DebiasConfig",
    "split": "vltool.split:SplitConfig",
    "report": "vltool.report:ReportConfig",
    "pick-caption": "vltool.pick_caption:PickConfig",
    "benchmark": "vltool.benchmark:BenchmarkConfig",
    "evaluate": "vltool.commands.evaluate:EvaluateConfig",
    "check-study": "vltool.study:CheckStudyConfig",
}

# A field is the option of the same name (text_column <-> --text-column), except these, each for a reason.
FIELD_OPTIONS = {
    # A flag that turns progress bars off, the default being on.
    ("zeroshot", "progress"): "--no-progress",
    ("retrieve", "progress"): "--no-progress",
    ("probe", "progress"): "--no-progress",
    ("benchmark", "progress"): "--no-progress",
    ("evaluate", "progress"): "--no-progress",
    # Three values (learn, fixed, the loss's default): --learn-logit-scale/--fixed-logit-scale.
    ("pretrain", "logit_scale_learnable"): "--learn-logit-scale",
    # `--from captions` reads as it works; `from` cannot be a field name.
    ("pick-caption", "source_column"): "--from",
    # Repeatable options, one value each time, gathered in a list field.
    ("import", "extra_columns"): "--extra-column",
    ("report", "metrics"): "--metric",
    ("report", "variants"): "--variant",
    ("report", "notes"): "--note",
    ("report", "styles"): "--style",
    ("report", "pairs"): "--pair",
}

# Spellings replaced by the canonical ones: never a visible option (they live on as hidden aliases).
RETIRED = {
    "--column": "--text-column (split: --part-column)",
    "--eval": "--eval-data",
}

# Options declared once in vltool/commands/common.py: one help text, hence one meaning, everywhere.
SHARED = ("--num-proc", "--where", "--split", "--seed", "--overwrite", "--json", "--cache-dir", "--no-progress", "--device", "--threads",
          "--decode-threads")
# Shared names a command declares with a wider meaning of its own, each for a reason.
OWN_HELP = {("recaption", "--device"): "a captioner also runs on cuda:N or mps (the others follow accelerate's process device)"}

# Names whose type differs between commands, each for a reason; any other name has one type everywhere.
TYPE_DIFFERENCES = {
    "--epochs": "pretrain counts fractional epochs; filter and probe whole passes",
    "--eval-data": "pretrain evaluates on several held-out sets (repeatable); probe and debias on one",
    "--model": "recaption's is a captioner directory (a Path); the others a vltool model spec (RUN_DIR, open_clip:ARCH, ...)",
    "--templates": "debias reads a file of sentence templates; pretrain and zeroshot also take a template set's name",
}

# The old spellings, one CLI call each, with an input that fails fast once the old value was used.
ALIASES = [
    ("deform", "--column", "--text-column", ["{data}", "--out", "{tmp}/o", "--column", "title"], 2, "no column 'title'"),
    ("filter", "--column", "--text-column", ["{data}", "--reference", "{data}", "--out", "{tmp}/o", "--column", "title"], 2, "no column 'title'"),
    ("recaption", "--column", "--text-column", ["{data}", "--out", "{tmp}/o", "--paraphrase", "--lm", "{tmp}/lm", "--column", "title"], 2,
     "no column 'title'"),
    ("split", "--column", "--part-column", ["{data}", "--out", "{tmp}/o", "--column", "half", "--json"], 0, '"column": "half"'),
    ("probe", "--eval", "--eval-data", ["{data}", "--model", "m", "--eval", "missing_eval"], 2, "dataset 'missing_eval' does not exist"),
    ("debias", "--eval", "--eval-data", ["--model", "m", "--subspace", "{tmp}", "--eval", "missing_eval"], 2, "dataset 'missing_eval' does not exist"),
    ("zeroshot", "--num-proc", "--decode-threads", ["{data}", "--model", "m", "--num-proc", "0"], 2, "--decode-threads must be >= 1, got 0"),
    ("zeroshot", "--workers", "--decode-threads", ["{data}", "--model", "m", "--workers", "0"], 2, "--decode-threads must be >= 1, got 0"),
    ("retrieve", "--num-proc", "--decode-threads", ["{data}", "--model", "m", "--num-proc", "0"], 2, "--decode-threads must be >= 1, got 0"),
    ("retrieve", "--workers", "--decode-threads", ["{data}", "--model", "m", "--workers", "0"], 2, "--decode-threads must be >= 1, got 0"),
    ("probe", "--num-proc", "--decode-threads", ["{data}", "--eval-data", "{data}", "--model", "m", "--num-proc", "0"], 2, "--decode-threads must be >= 1, got 0"),
    ("probe", "--workers", "--decode-threads", ["{data}", "--eval-data", "{data}", "--model", "m", "--workers", "0"], 2, "--decode-threads must be >= 1, got 0"),
    ("mine-positives", "--num-proc", "--decode-threads", ["{data}", "--model", "m", "--num-proc", "0", "--dry-run"], 2, "--decode-threads must be >= 1, got 0"),
    ("mine-positives", "--workers", "--decode-threads", ["{data}", "--model", "m", "--workers", "0", "--dry-run"], 2, "--decode-threads must be >= 1, got 0"),
    ("recaption", "--dtype", "--precision", ["{data}", "--out", "{tmp}/o", "--paraphrase", "--lm", "{tmp}/lm", "--dtype", "float64"], 2,
     "--precision must be one of auto, no, bf16, fp16, got 'float64'"),
    ("pretrain", "--cpu", "--device cpu", ["{data}", "--out", "{tmp}/o", "--cpu", "--steps", "0"], 2, "--steps must be >= 1, got 0"),
]


def _commands() -> dict:
    import typer.main

    from vltool.cli import app

    return typer.main.get_command(app).commands


def _options(command, hidden: bool = False) -> list:
    return [p for p in command.params if p.param_type_name == "option" and bool(getattr(p, "hidden", False)) == hidden
            and "--help" not in p.opts]


def _names(param) -> list[str]:
    return [*param.opts, *param.secondary_opts]


def _kind(param) -> tuple:
    """What an option takes: its type (Optional stripped), whether it is a flag, whether it repeats."""
    descriptor = getattr(param, "type_descriptor", None)  # typer >= 0.2x
    if descriptor is not None:
        t = descriptor.annotation
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if typing.get_origin(t) in (typing.Union, types.UnionType) and len(args) == 1:
            t = args[0]
        t = repr(t)
    else:  # click's ParamType
        t = type(param.type).__name__
    return t, bool(param.is_flag), bool(param.multiple)


def _config(spec: str):
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)


def test_every_command_is_listed():
    assert set(_commands()) == set(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_config_field_is_one_visible_option(name):
    command = _commands()[name]
    visible = [o for p in _options(command) for o in _names(p)]
    problems = []
    for f in dataclasses.fields(_config(CONFIGS[name])):
        option = FIELD_OPTIONS.get((name, f.name), "--" + f.name.replace("_", "-"))
        n = visible.count(option)
        if n != 1:
            problems.append(f"{f.name} -> {option}: {n} visible options")
    assert not problems, f"{name}: " + "; ".join(problems)
    unused = [k for k in FIELD_OPTIONS if k[0] == name and k[1] not in {f.name for f in dataclasses.fields(_config(CONFIGS[name]))}]
    assert not unused, f"stale FIELD_OPTIONS entries: {unused}"


# The commands that compute with torch: each takes --device and --threads (docs/conventions.md, "Options").
# filter is left out: its classifier trains on the CPU on one thread by design (tiny sparse steps).
COMPUTES = ("pretrain", "recaption", "zeroshot", "retrieve", "probe", "benchmark", "mine-positives", "pseudolabel", "debias")


def test_every_command_that_computes_takes_device_and_threads():
    commands = _commands()
    missing = [(n, o) for n in COMPUTES for o in ("--device", "--threads")
               if o not in [x for p in _options(commands[n]) for x in _names(p)]]
    assert not missing
    decoding = [n for n, c in commands.items() if "--decode-threads" in [x for p in _options(c) for x in _names(p)]]
    assert sorted(decoding) == ["benchmark", "mine-positives", "probe", "retrieve", "zeroshot"]
    assert [n for n, c in commands.items() if "--workers" in [x for p in _options(c) for x in _names(p)]] == ["pretrain"]


def test_no_retired_spelling_is_visible():
    found = [(name, o) for name, c in _commands().items() for p in _options(c) for o in _names(p) if o in RETIRED]
    assert not found, "; ".join(f"{n} shows {o} (now {RETIRED[o]})" for n, o in found)


def test_an_option_name_means_one_thing_across_commands():
    from vltool.commands import common

    shared_help = {}
    for value in vars(common).values():
        for meta in getattr(value, "__metadata__", ()):
            if getattr(meta, "hidden", False):
                continue
            decls = getattr(meta, "param_decls", None) or ((getattr(meta, "default", None),) if isinstance(getattr(meta, "default", None), str) else ())
            for d in decls:
                if d in SHARED:
                    shared_help[d] = meta.help
    assert set(shared_help) == set(SHARED)

    by_name: dict[str, list] = {}
    for name, c in _commands().items():
        for p in _options(c):
            for o in _names(p):
                by_name.setdefault(o, []).append((name, p))
    problems = []
    for o, uses in sorted(by_name.items()):
        if len(uses) < 2:
            continue
        kinds = {_kind(p) for _, p in uses}
        if len(kinds) > 1 and o not in TYPE_DIFFERENCES:
            problems.append(f"{o}: " + ", ".join(f"{n} {_kind(p)}" for n, p in uses))
        if o in SHARED:
            other = [n for n, p in uses if p.help != shared_help[o] and (n, o) not in OWN_HELP]
            if other:
                problems.append(f"{o} has its own help in {', '.join(other)}: declare it with vltool.commands.common's")
    assert not problems, "\n".join(problems)
    stale = [o for o in TYPE_DIFFERENCES if o not in by_name or len({_kind(p) for _, p in by_name[o]}) < 2]
    assert not stale, f"TYPE_DIFFERENCES no longer needed: {stale}"


@pytest.fixture
def alias_data(tmp_path):
    import datasets

    path = tmp_path / "data"
    datasets.Dataset.from_dict({
        "id": ["a", "b", "c", "d"], "caption": ["a red cat", "a blue dog", "a green tree", "a big house"],
        "image": ["a.png", "b.png", "c.png", "d.png"],  # only the column's presence is checked before the error
    }).save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("command, old, new, args, code, expect", ALIASES, ids=[f"{a[0]} {a[1]}" for a in ALIASES])
def test_old_spelling_still_works_with_a_warning(cli, alias_data, tmp_path, command, old, new, args, code, expect):
    hidden = [o for p in _options(_commands()[command], hidden=True) for o in _names(p)]
    assert old in hidden
    r = cli(command, *[a.format(data=alias_data, tmp=tmp_path) for a in args])
    assert r.exit_code == code, r.output
    assert f"warning: {old} is renamed {new}; the old name goes in the next release" in r.stderr.splitlines()
    assert expect in (r.stdout if code == 0 else r.stderr)


def test_old_and_new_spelling_together_is_a_usage_error(cli, alias_data, tmp_path):
    r = cli("deform", alias_data, "--out", tmp_path / "o", "--column", "caption", "--text-column", "caption")
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: --column is the old name of --text-column: give only --text-column"
    assert not (tmp_path / "o").exists()


def _flat(text: str) -> str:
    """Rendered help without its box drawing, every run of whitespace one space (rich wraps lines)."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_help_prints_every_help_text_as_written(cli, name, monkeypatch):
    """Rich markup ate `[...]`: "Class names, one per line in label order ." and "JSON {class name: }"."""
    import inspect

    monkeypatch.setenv("COLUMNS", "250")
    command = _commands()[name]
    r = cli(name, "--help")
    assert r.exit_code == 0
    shown = _flat(r.stdout)
    for p in _options(command) + [p for p in command.params if p.param_type_name == "argument"]:
        if p.help:
            assert _flat(p.help) in shown, f"{name} {p.name}: {p.help!r}"
    for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
        assert _flat(paragraph) in shown, f"{name}: {paragraph!r}"
    hidden = [o for p in _options(command, hidden=True) for o in _names(p)]
    assert not [o for o in hidden if re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", r.stdout.split("Options")[-1])]


def test_zeroshot_help_keeps_brackets_and_braces(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    shown = _flat(cli("zeroshot", "--help").stdout)
    assert "Class names, one per line in label order [default: the ClassLabel names]." in shown
    assert "JSON {class name: [prompts]}; classes it lacks use --templates." in shown
    assert "[default: auto]" in shown  # typer's own default display
    assert "Label column [default: label, else labels (multi-label)]." in shown


def test_options_tables_in_docs_are_generated():
    from scripts import options_docs

    docs = sorted((ROOT / "docs").glob("*.md"))
    assert options_docs.main(["--check", *map(str, docs)]) == 0
    assert "<!-- options: recaption -->" in (ROOT / "docs" / "recaption-filter.md").read_text()
    # No hand-kept options table outside the markers (docs/pretrain.md: its owner's, see options_docs.py).
    for doc in docs:
        if doc.name == "pretrain.md":
            continue
        text = options_docs.MARK.sub("", doc.read_text())
        assert not re.search(r"^\| *option *\|", text, re.M), f"{doc.name}: a hand-kept options table"


def test_options_docs_prints_one_table(capsys):
    from scripts import options_docs

    assert options_docs.main(["split"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| option | default | meaning |\n|---|---|---|\n")
    assert "| `--part-column` | `part` | The column written: each row's part name. |" in out
    assert "--column" not in out.replace("--part-column", "")


def seed_commands() -> list[str]:
    import typer.main

    from vltool.cli import app

    group = typer.main.get_command(app)
    return sorted(name for name, c in group.commands.items() if any("--seed" in getattr(p, "opts", ()) for p in c.params))


@pytest.mark.parametrize("value", ["-1", str(2**32)])
def test_a_seed_out_of_range_is_refused_by_every_command(cli, tmp_path, value):
    """A negative --seed was "internal error (ValueError: expected non-negative integer)" in zeroshot, retrieve,
    probe, deform, pretrain, split, pseudolabel, filter and report (issue 44): one check, SeedOpt's, for all."""
    commands = seed_commands()
    assert {"zeroshot", "retrieve", "probe", "deform", "pretrain", "split", "pseudolabel", "filter", "report"} <= set(commands)
    for name in commands:
        r = cli(name, f"--seed={value}", "emoji", "--out", tmp_path / name)
        assert r.exit_code == 2, (name, r.stderr)
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("error: Invalid value for '--seed': ") and value in line and "--seed 0" in line, (name, line)
        assert "internal error" not in r.stderr and not (tmp_path / name).exists()


EMPTY_CASES = [
    ("mine-positives", ["emoji", "--out", "{tmp}/o", "--group-column", ""], "--group-column"),
    ("pretrain", ["emoji", "--out", "{tmp}/o", "--init", ""], "--init"),
    ("split", ["emoji", "--out", "{tmp}/o", "--by", ""], "--by"),
    ("import", ["{tmp}/a.csv", "--out", "{tmp}/o", "--image-root", ""], "--image-root"),
    ("debias", ["--model", "{tmp}/m", "--subspace", "", "--eval-data", "emoji"], "--subspace"),
    ("zeroshot", ["emoji", "--where=", "--out", "{tmp}/o.json"], "--where"),
    ("report", ["{tmp}", "--out", "{tmp}/o", "--metric", "zeroshot:top1", "--baseline", "  "], "--baseline"),
]


@pytest.mark.parametrize("command,args,option", EMPTY_CASES, ids=[c[0] + c[2] for c in EMPTY_CASES])
def test_an_empty_value_is_refused_not_read_as_not_given(cli, tmp_path, command, args, option):
    """`--group-column ''` resampled single images, `--init ''` trained from scratch, `split --by ''` split rows,
    `--image-root ''` read the current directory (issue 44): an option given "" is refused, in every command
    (vltool.cli.empty_option), naming the option; the few where "" means something are listed there."""
    r = cli(command, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.exit_code == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {option} is empty ('')") and f"leave {option} out" in line, line
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.json").exists()


def test_every_option_that_may_be_empty_is_an_option():
    import typer.main

    from vltool.cli import EMPTY_MEANS_SOMETHING, app

    opts = {o for c in typer.main.get_command(app).commands.values() for p in c.params for o in getattr(p, "opts", ())}
    assert EMPTY_MEANS_SOMETHING <= opts
