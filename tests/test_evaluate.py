"""`vltool evaluate` (issue 54): a plan of evaluation commands run in one process writes exactly what the
commands write alone, and refuses a bad plan before any line runs."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.eval_data import make_colors, make_model

LINES = [
    "zeroshot {data} --where split=test --bootstrap 20 --out zs.json --no-progress",
    "retrieve {data} --where split=test --bootstrap 20 --out ret.json --no-progress",
    "probe {data} --where split=train --eval-data {data} --eval-where split=test --bootstrap 20 --out probe.json --no-progress",
]
TIMINGS = ("created", "wall_time_s", "seconds_to_first_batch")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    return make_model(root / "run"), make_colors(root / "colors")


def _untimed(record):
    """A record without what differs between any two runs: its clock readings, and the cache's seconds."""
    record = {k: v for k, v in record.items() if k not in TIMINGS}
    for part in (record.get("stats") or {}).get("cache", {}).values():
        if isinstance(part, dict):
            part.pop("seconds", None)
    return record


def test_a_plan_writes_what_the_commands_write_alone(cli, study, tmp_path, monkeypatch):
    model, data = study
    for name in ("alone", "plan"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("VLTOOL_CACHE", str(tmp_path / "cache-alone"))
    monkeypatch.chdir(tmp_path / "alone")
    for line in LINES:
        r = cli(*line.format(data=data).split(), "--model", model)
        assert r.exit_code == 0, r.output
    monkeypatch.setenv("VLTOOL_CACHE", str(tmp_path / "cache-plan"))
    monkeypatch.chdir(tmp_path / "plan")
    (tmp_path / "plan.txt").write_text("# one model's evaluations\n\n" + "\n".join(line.format(data=data) for line in LINES) + "\n")
    r = cli("evaluate", tmp_path / "plan.txt", "--model", model)
    assert r.exit_code == 0, r.output
    alone, plan = sorted(p.name for p in (tmp_path / "alone").iterdir()), sorted(p.name for p in (tmp_path / "plan").iterdir())
    assert alone == plan == ["probe.examples.npz", "probe.json", "ret.examples.npz", "ret.json", "zs.examples.npz", "zs.json"]
    for name in plan:
        a, b = (tmp_path / "alone" / name).read_bytes(), (tmp_path / "plan" / name).read_bytes()
        if name.endswith(".json"):
            ra, rb = json.loads(a), json.loads(b)
            line = next(line.format(data=data) for line in LINES if f"--out {name} " in line)
            assert rb["command_line"] == f"vltool {line} --model {model}"  # the command that writes it alone
            assert {**_untimed(ra), "command_line": None} == {**_untimed(rb), "command_line": None}, name
        else:
            assert a == b, name  # the per-example outcomes, byte for byte


def test_a_bad_plan_is_refused_before_any_line_runs(cli, study, tmp_path, monkeypatch):
    model, data = study
    monkeypatch.chdir(tmp_path)
    cases = {
        "not-an-evaluation": (["deform emoji --out x"], "PLAN line 1: 'deform' is not an evaluation command (zeroshot, retrieve, probe)"),
        "bad-option": ([LINES[0], "retrieve {data} --bootstrap -3 --out r.json"], "PLAN line 2 (retrieve): "),
        "one-out-twice": ([LINES[0], LINES[0].replace("zeroshot", "retrieve")], "PLAN line 2: --out zs.json is also written by line 1"),
        "empty": (["# nothing"], "no command in it"),
    }
    for name, (lines, message) in cases.items():
        plan = tmp_path / f"{name}.txt"
        plan.write_text("\n".join(line.format(data=data) for line in lines))
        r = cli("evaluate", plan, "--model", model)
        assert r.exit_code == 2, (name, r.output)
        assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, (name, r.stderr)
        assert not (tmp_path / "zs.json").exists(), name


def test_the_first_failing_line_stops_the_plan_with_its_own_error(cli, study, tmp_path, monkeypatch):
    model, data = study
    monkeypatch.chdir(tmp_path)
    lines = [LINES[0].format(data=data), LINES[1].format(data=tmp_path / "missing"), LINES[2].format(data=data)]
    (tmp_path / "plan.txt").write_text("\n".join(lines))
    r = cli("evaluate", tmp_path / "plan.txt", "--model", model)
    assert r.exit_code == 2, r.output
    assert "does not exist" in r.stderr and "evaluate: PLAN line 2 (retrieve) failed; 1 later line(s) not run" in r.stderr
    assert (tmp_path / "zs.json").exists() and not (tmp_path / "ret.json").exists() and not (tmp_path / "probe.json").exists()
