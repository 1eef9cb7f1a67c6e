"""The training objectives are declared once (vltool/objective_specs.py, vltool/pretrain/objectives.py):
every place that lists them (the losses, the classes, --loss help, the options, docs/objectives.md) is
generated from the declarations or checked against them here, and adding one works from them alone."""

from __future__ import annotations

import ast
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from tests.fixtures.training import make_pairs, micro
from vltool import objective_specs
from vltool.errors import UsageError
from vltool.losses import LOSSES, ClipLoss, JSDLoss, LossInput
from vltool.objective_specs import SPECS, ObjectiveSpec
from vltool.pretrain import objectives
from vltool.pretrain.config import PretrainConfig
from vltool.pretrain.objectives import OBJECTIVES, Objective, build_objective, objective

ROOT = Path(__file__).resolve().parents[1]


def options_docs():
    from scripts import options_docs

    return options_docs


def registry_problems() -> list[str]:
    """Where the losses, the objectives' declarations and their classes disagree, naming the place to edit."""
    out = []
    trained = {s.loss for s in SPECS.values()}
    out += [f"loss {n!r} has no objective: declare it in vltool/objective_specs.py" for n in LOSSES if n not in trained]
    out += [f"objective {s.name!r} trains --loss {s.loss!r}, which no @register_loss in vltool/losses.py defines"
            for s in SPECS.values() if s.loss not in LOSSES]
    out += [f"objective {n!r} has no class: attach one with @objective({n!r}) in vltool/pretrain/objectives.py"
            for n in SPECS if n not in OBJECTIVES]
    out += [f"{cls.__name__} is attached to {n!r} but carries the spec of {cls.spec.name!r}"
            for n, cls in OBJECTIVES.items() if cls.spec is not SPECS.get(n)]
    out += [f"{c.__name__} is not attached to a declared objective: @objective(NAME) over it" for c in subclasses(Objective)
            if c.__module__.startswith("vltool.") and c not in OBJECTIVES.values()]
    return out


def subclasses(cls) -> list[type]:
    return [cls] + [d for c in cls.__subclasses__() for d in subclasses(c)]


def loss_option():
    from vltool.cli import app
    import typer.main

    return next(p for p in typer.main.get_command(app).commands["pretrain"].params if "--loss" in p.opts)


# ---- the declarations agree


def test_losses_declarations_and_classes_agree():
    assert registry_problems() == []
    assert set(OBJECTIVES) == set(SPECS) and {s.loss for s in SPECS.values()} == set(LOSSES)
    assert JSDLoss.NEGATIVES == objective_specs.JSD_NEGATIVES  # --jsd-negatives' values, checked torch-free


def test_each_missing_place_is_named(monkeypatch):
    class DCL(ClipLoss):
        pass

    monkeypatch.setitem(LOSSES, "dcl", DCL)  # a loss alone
    assert registry_problems() == ["loss 'dcl' has no objective: declare it in vltool/objective_specs.py"]
    monkeypatch.setitem(SPECS, "dcl", ObjectiveSpec("dcl", "decoupled", "DCL", "vltool pretrain emoji --loss dcl"))
    assert registry_problems() == ["objective 'dcl' has no class: attach one with @objective('dcl') in vltool/pretrain/objectives.py"]

    class DCLObjective(Objective):  # written in vltool/pretrain/objectives.py, but not attached
        pass

    DCLObjective.__module__ = objectives.__name__
    assert "DCLObjective is not attached to a declared objective: @objective(NAME) over it" in registry_problems()
    monkeypatch.setitem(OBJECTIVES, "dcl", None)
    objective("dcl")(DCLObjective)
    assert registry_problems() == []
    with pytest.raises(KeyError, match="declare it in vltool/objective_specs.py"):
        objective("no-such")(DCLObjective)


# ---- help and docs are generated from them


def test_loss_help_is_generated_from_the_declarations(cli, monkeypatch):
    assert loss_option().help == objective_specs.loss_help()
    monkeypatch.setenv("COLUMNS", "250")
    shown = " ".join(re.sub("[│╭╮╰╯─]", " ", cli("pretrain", "--help").stdout).split())
    for s in SPECS.values():
        entry = f"{s.loss} with --{s.switch[0].replace('_', '-')} {s.switch[1]}: {s.help}" if s.switch else f"{s.name} ({s.help})"
        assert entry in shown, f"--loss help lacks {s.name}"


def test_docs_objectives_table_is_generated_and_lists_every_objective():
    doc = (ROOT / "docs" / "objectives.md").read_text()
    docs = options_docs()
    found = docs.OBJECTIVES_MARK.search(doc)
    assert found, "docs/objectives.md has no <!-- objectives --> table"
    assert docs.render(doc) == doc, "docs/objectives.md is out of date: python scripts/options_docs.py --write docs/objectives.md"
    rows = [line.split("|")[1].strip() for line in found.group("body").splitlines()[2:]]
    assert rows == list(SPECS)


def test_no_hand_kept_list_of_the_objectives():
    """objectives.py's docstring points to the declarations rather than listing the objectives again."""
    assert "| objective" not in objectives.__doc__ and "vltool.objective_specs" in objectives.__doc__
    doc = options_docs().OBJECTIVES_MARK.sub("", (ROOT / "docs" / "objectives.md").read_text())
    assert not re.search(r"^\| *objective *\|", doc, re.M), "docs/objectives.md: a hand-kept table of the objectives"


def test_each_loss_option_is_owned_by_the_objective_its_help_names():
    from vltool.cli import app
    import typer.main

    params = {p.name: p for p in typer.main.get_command(app).commands["pretrain"].params}
    owner = {}
    for s in SPECS.values():
        for name in s.options:
            assert name not in owner, f"--{name} is owned by {owner.get(name)} and {s.name}"
            owner[name] = s.name
    assert set(owner) <= {f.name for f in fields(PretrainConfig)}
    loss_panel = {n for n, p in params.items() if getattr(p, "rich_help_panel", None) == "Loss"}
    assert loss_panel == set(owner), "each 'Loss' option of commands/pretrain.py is an option of one objective's spec"
    for name, spec_name in owner.items():
        s = SPECS[spec_name]
        first = params[name].help.split(":")[0].split()[0]
        assert first in {s.name, s.loss, *([f"--{s.switch[0].replace('_', '-')}"] if s.switch else [])}, (name, first)
    for s in SPECS.values():
        assert set(s.data_options) <= set(s.options) and (not s.switch or s.switch[0] in s.options)


# ---- the config, the builder and the loop use them, with no branch of their own


def test_no_objective_is_named_outside_its_declaration():
    """No `config.loss == ...` and no objective's name as a string outside vltool/objective_specs.py and
    vltool/pretrain/objectives.py (the trainer calls the objective's hooks)."""
    names = set(SPECS) - {"clip", "simclr"}  # (clip and simclr are also --augment values)
    files = sorted((ROOT / "vltool" / "pretrain").rglob("*.py")) + [ROOT / "vltool" / "commands" / "pretrain.py"]
    found = []
    for path in files:
        if path.name == "objectives.py":
            continue
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            compares = isinstance(node, ast.Compare) and any(isinstance(x, ast.Attribute) and x.attr == "loss" for x in [node.left, *node.comparators])
            if compares or (isinstance(node, ast.Constant) and node.value in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    # The one left: the refusal of unicl with streamed shards (data/streams.py), to become a hook of UniCLObjective.
    left = 'if config.loss == "unicl" or config.mined_positives or config.balanced:'
    assert [f for f in found if not f.endswith(left)] == []
    assert len(found) <= 2  # (its comparison and its string)


def test_the_config_checks_are_the_objectives(monkeypatch):
    with pytest.raises(UsageError, match="--loss 'dcl': unknown; available: clip, jsd, sigmoid, simclr, unicl"):
        PretrainConfig(loss="dcl").validate()
    seen = []
    for n, s in list(SPECS.items()):
        monkeypatch.setitem(SPECS, n, replace(s, check=lambda c, chosen, n=n: seen.append((n, chosen)) or [f"{n} says no"]))
    with pytest.raises(UsageError) as e:
        PretrainConfig(loss="clip", memory_bank=4, bias_init="x").validate()
    assert seen == [(n, n == "memory-bank") for n in SPECS]  # every objective checks its options; one is chosen
    assert str(e.value) == "; ".join(f"{n} says no" for n in SPECS)  # and nothing else checks them


@pytest.mark.parametrize("config, name", [(dict(), "clip"), (dict(memory_bank=8), "memory-bank"), (dict(loss="sigmoid"), "sigmoid"),
                                          (dict(loss="jsd", jsd_negatives="all"), "jsd")])
def test_the_chosen_objective_is_built(config, name):
    from vltool.pretrain.data import TrainData

    c = PretrainConfig(**config)
    assert objective_specs.chosen(c) is SPECS[name]
    obj = build_objective(c, TrainData(None, "caption", [], 0, []), total_steps=10)
    assert type(obj) is OBJECTIVES[name]
    if name == "jsd":
        assert obj.loss.negatives == "all"  # JSDObjective.loss_options
    assert set(obj.stats()) == set(objective_specs.stat_keys()) == {"ema_momentum"}
    assert (obj.stats()["ema_momentum"] is None) == (name != "memory-bank")
    assert (obj.start_record() is None) == (name != "memory-bank")


# ---- a contributor's new objective


class DCLLoss(ClipLoss):
    """Decoupled contrastive loss (Yeh et al. 2022): InfoNCE without the positive in the denominator."""

    def forward(self, batch: LossInput) -> dict[str, torch.Tensor]:
        logits = batch.logit_scale * batch.image_features @ batch.text_features.T  # (N, N)
        pos = logits.diagonal()  # (N,)
        eye = torch.eye(logits.shape[0], dtype=torch.bool, device=logits.device)
        neg = logits.masked_fill(eye, float("-inf"))
        loss = (-pos + neg.logsumexp(1)).mean() / 2 + (-pos + neg.logsumexp(0)).mean() / 2
        return {"loss": loss, "acc_i2t": (logits.argmax(1) == torch.arange(len(pos), device=logits.device)).float().mean()}


@pytest.fixture
def dcl(monkeypatch):
    """A new objective, declared as a contributor would (a loss, a spec, a class), removed afterwards."""
    monkeypatch.setattr(DCLLoss, "name", "dcl")
    monkeypatch.setitem(LOSSES, "dcl", DCLLoss)
    monkeypatch.setitem(SPECS, "dcl", ObjectiveSpec("dcl", "decoupled InfoNCE", "DCL (Yeh et al. 2022)",
                                                    "vltool pretrain emoji --where split=train --out runs/dcl --loss dcl"))
    monkeypatch.setitem(OBJECTIVES, "dcl", None)

    @objective("dcl")
    class DCLObjective(Objective):
        pass

    return DCLObjective


def test_a_new_objective_works_from_its_declarations(dcl, tmp_path, cli, monkeypatch):
    from vltool.pretrain import pretrain

    assert registry_problems() == []
    monkeypatch.setenv("COLUMNS", "250")
    assert "| dcl (decoupled InfoNCE);" in " ".join(cli("pretrain", "--help").stdout.split())
    assert "| dcl | `--loss dcl` | decoupled InfoNCE |" in options_docs().objectives_table()
    with pytest.raises(UsageError, match="--bias-init is an option of --loss sigmoid"):
        PretrainConfig(loss="dcl", bias_init="search").validate()
    pairs = make_pairs(tmp_path / "pairs", n=16)
    r = pretrain([pairs], tmp_path / "run", micro(loss="dcl", steps=2), progress=False)
    assert r["status"] == "finished" and r["stats"]["ema_momentum"] is None and r["stats"]["final_loss"] > 0
