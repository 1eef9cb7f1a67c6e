"""`vltool report`: gather the results of a recipe's runs into one table, over seeds, paired by seed.

A recipe writes each run under RUNS_DIR/<variant>/seed<N>/ (the trained model and the evaluation
JSONs of `zeroshot`, `retrieve`, `probe`, or any vltool.json). The report reads one number per
(variant, seed, metric), and writes three files next to each other:

  STEM.json  every number, per seed and summarised, the commands that made them, the machine
  STEM.md    the table: mean +- standard deviation over seeds, the mean 95% bootstrap interval of a
             single run, the chance level, and the difference from a baseline variant with its paired
             bootstrap interval over the same test examples (vltool.outcomes.paired_difference)
  STEM.png   one panel per metric: a bar per variant, a dot per seed, the chance level dashed

The paired interval needs each run's per-example outcomes (the X.examples.npz its results JSON names);
a metric without them (a run older than the file, or a plain number) gets "-" and a note.

A metric is named RELPATH:KEY. RELPATH is a JSON file relative to the run directory (".json" may be
left off); KEY is first looked up in the file's "metrics" (an evaluation entry: value, 95% interval,
chance), then as a dotted path into the whole file (any number, e.g. stats.groups.precision).

This module reads the runs and builds the report record (and writes the three files); how STEM.md and
STEM.png present that record is vltool.report_render.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vltool import __version__
from vltool.errors import UsageError, VltoolError
from vltool.io.atomic import finish_replace, pending_replace, replace_as_one, staged_path, swap_journal
from vltool.io.outputs import check_output, require_output_name
from vltool.topology import warn
from vltool.outcomes import MAX_RESAMPLES, Outcomes, paired_difference
# The rendering of STEM.md and STEM.png; _fmt and _signed are re-exported for `from vltool.report import ...`.
from vltool.report_render import _fmt as _fmt, _signed as _signed, render_chart, render_markdown

SEED_DIR = re.compile(r"^seed(\d+)$")


@dataclass
class Metric:
    label: str
    relpath: str
    key: str
    percent: bool | None = None  # None: evaluation fractions are shown in percent, ranks and plain values as they are
    style: str | None = None  # with --style: the art style (or any second test set) this metric was measured in
    twin_of: str | None = None  # a second style's metric: the name of the same metric in the first style

    @property
    def name(self) -> str:
        return f"{self.relpath}:{self.key}"


@dataclass
class ReportConfig:
    metrics: list[Metric]
    variants: list[tuple[str, str]] = field(default_factory=list)  # (directory, label), in table order; empty: all found
    baseline: str | None = None
    title: str | None = None
    recipe: str | None = None
    paper: dict[str, str] = field(default_factory=dict)  # variant -> the paper's finding for the same comparison
    notes: list[str] = field(default_factory=list)
    styles: list[tuple[str, str]] = field(default_factory=list)  # (name, file suffix); "" names the metrics as given
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (variant, reference): paired contrasts besides --baseline
    bootstrap: int = 1000  # resamples of the paired bootstrap
    bootstrap_max: int = MAX_RESAMPLES  # a borderline verdict draws more, up to this many
    allow_mixed_threads: bool = False  # pair runs whose records name different torch thread counts
    seed: int = 0  # its seed


def parse_metric(spec: str) -> Metric:
    """'LABEL=RELPATH:KEY' or 'RELPATH:KEY' (the label is then the spec itself)."""
    label, sep, rest = spec.partition("=")
    if not sep:
        label, rest = "", spec
    if ":" not in rest:
        raise UsageError(f"--metric {spec!r}: expected [LABEL=]RELPATH:KEY, e.g. 'ZS top-1=zeroshot:top1'")
    relpath, key = rest.split(":", 1)
    if not relpath or not key:
        raise UsageError(f"--metric {spec!r}: expected [LABEL=]RELPATH:KEY")
    return Metric(label=label.strip() or rest, relpath=relpath, key=key)


def parse_pairs(specs: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for s in specs:
        name, sep, value = s.partition("=")
        if not name:
            raise UsageError(f"{what} {s!r}: expected NAME=TEXT")
        out.append((name, value if sep else name))
    return out


def parse_variant_pairs(specs: list[str]) -> list[tuple[str, str]]:
    """--pair VARIANT=REFERENCE, repeatable."""
    out = []
    for spec in specs:
        a, sep, b = spec.partition("=")
        if not sep or not a or not b:
            raise UsageError(f"--pair {spec!r}: expected VARIANT=REFERENCE, e.g. sigmoid-k=sigmoid-1ofk")
        out.append((a, b))
    return out


def parse_styles(specs: list[str]) -> list[tuple[str, str]]:
    """--style NAME=SUFFIX, repeatable: exactly one with an empty SUFFIX (the metrics as given), and at least one other."""
    styles = []
    for spec in specs:
        name, sep, suffix = spec.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--style {spec!r}: expected NAME=SUFFIX, e.g. 'Noto=' and 'OpenMoji=-style2'")
        if any(n == name.strip() for n, _ in styles) or any(x == suffix for _, x in styles):
            raise UsageError(f"--style {spec!r}: each style needs its own name and file suffix")
        styles.append((name.strip(), suffix))
    if styles and (sum(x == "" for _, x in styles) != 1 or len(styles) < 2):
        raise UsageError("--style: give the style of the metrics as given (NAME=, an empty suffix) and at least one "
                         "other (NAME=SUFFIX, its files named like the first style's with SUFFIX before .json)")
    return styles


def with_suffix(relpath: str, suffix: str) -> str:
    """'zeroshot' -> 'zeroshot-style2', 'a/probe.json' -> 'a/probe-style2.json'."""
    return relpath[:-5] + suffix + ".json" if relpath.endswith(".json") else relpath + suffix


def add_style_twins(metrics: list[Metric], styles: list[tuple[str, str]], found: dict[str, dict[int, Path]]) -> list[Metric]:
    """With --style, each metric is followed by its twin in every other style: the same KEY in the run's file
    with that style's suffix, labelled "LABEL, STYLE", where any run has that file (plain numbers of a
    run's own vltool.json have none)."""
    if not styles:
        return metrics
    first = next(n for n, x in styles if x == "")
    runs = [d for seeds in found.values() for d in seeds.values()]
    out = []
    for m in metrics:
        out.append(Metric(m.label, m.relpath, m.key, m.percent, style=first))
        for name, suffix in styles:
            rel = with_suffix(m.relpath, suffix)
            if suffix and any((d / rel).exists() or (d / (rel + ".json")).exists() for d in runs):
                out.append(Metric(f"{m.label}, {name}", rel, m.key, m.percent, style=name, twin_of=m.name))
    for name, suffix in styles:  # a style none of whose files exist: a wrong suffix, or runs evaluated in one style
        if suffix and not any(t.style == name for t in out):
            raise UsageError(f"--style {name}={suffix}: no run has a file named with {suffix!r} "
                             f"(e.g. {with_suffix(metrics[0].relpath, suffix)}.json); check the suffix, or leave the style out")
    return out


def _read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise VltoolError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def lookup(record: dict, key: str) -> dict | None:
    """One metric of a result file: {"value", "ci_low", "ci_high", "chance", "kind"} or None when absent."""
    metrics = record.get("metrics")
    if isinstance(metrics, dict) and key in metrics and isinstance(metrics[key], dict) and "value" in metrics[key]:
        e = metrics[key]
        return {"value": e.get("value"), "ci_low": e.get("ci_low"), "ci_high": e.get("ci_high"),
                "chance": e.get("chance"), "kind": "eval"}
    trail = _walk(record, key.split("."))
    if trail is None:
        return None
    node: Any = trail[-1][0]
    if isinstance(node, dict) and "value" in node:  # an evaluation entry reached by its path
        return {"value": node.get("value"), "ci_low": node.get("ci_low"), "ci_high": node.get("ci_high"),
                "chance": node.get("chance"), "kind": "eval"}
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return {"value": float(node), "ci_low": None, "ci_high": None, "chance": None, "kind": "value"}


def _walk(node: Any, parts: list[str]) -> list[tuple[Any, list[str]]] | None:
    """The nodes a dotted path passes through, each with the parts that reached it ([(record, [])] first);
    a dict key may itself hold dots (a dataset path among `vltool benchmark`'s results): the shortest key
    that leads to the end is taken."""
    if not parts:
        return [(node, [])]
    for n in range(1, len(parts) + 1):
        head = ".".join(parts[:n])
        if isinstance(node, dict) and head in node:
            child = node[head]
        elif n == 1 and isinstance(node, list) and head.isdigit() and int(head) < len(node):
            child = node[int(head)]
        else:
            continue
        rest = _walk(child, parts[n:])
        if rest is not None:
            return [(node, [])] + [(x, [head, *p]) for x, p in rest]
    return None


def evaluation_of(record: dict, key: str) -> tuple[dict, str, str]:
    """The evaluation record that holds metric KEY, the metric's name in its "metrics", and the path to that
    record: (record, KEY, "") for the file's own metric; for a path through a nested evaluation record
    (`vltool benchmark`'s results.<dataset>.<task>.metrics.<name>) that record, <name> and its path, so that
    its per-example outcomes (the record's "examples") pair it as a single command's would be."""
    metrics = record.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get(key), dict):
        return record, key, ""
    trail = _walk(record, key.split("."))
    if trail is not None and len(trail) >= 3 and trail[-2][1][-1:] == ["metrics"]:
        holder, path = trail[-3]
        if isinstance(holder, dict):
            return holder, trail[-1][1][-1], ".".join(path)
    return record, key, ""


def find_runs(runs_dir: Path) -> dict[str, dict[int, Path]]:
    """variant (its path relative to RUNS_DIR) -> seed -> run directory."""
    found: dict[str, dict[int, Path]] = {}
    for dirpath, dirnames, _ in os.walk(runs_dir):
        d = Path(dirpath)
        m = SEED_DIR.match(d.name)
        if m and d.parent != d:
            variant = d.parent.relative_to(runs_dir).as_posix()
            found.setdefault(variant, {})[int(m.group(1))] = d
            dirnames[:] = []  # a run's own subdirectories (model, checkpoints) hold no further runs
    return found


# Training options that may differ between the seeds of one variant: the seed itself, and how a run was carried
# out rather than what it trained (its data's paths are compared with the seed's number taken out).
PER_SEED_OPTIONS = {"seed", "workers", "threads", "device", "log_every", "checkpoint_every", "keep_checkpoints", "eval_every",
                    "shuffle_buffer", "processes"}


def check_trained_alike(variant: str, seeds: dict[int, Path]) -> None:
    """The seeds of a variant were trained alike (their `pretrain` records, RUN_DIR/**/vltool.json with
    command pretrain, agree on every option but PER_SEED_OPTIONS, paths compared without their seed<N>):
    a rerun into a finished OUT with another INIT, stopped after its first seed, would otherwise be
    averaged with the old seeds without a word."""
    seen: tuple[int, dict] | None = None
    for seed, d in sorted(seeds.items()):
        for f in _provenance_files(d):
            try:
                rec = _read_json(f) if f.name == "vltool.json" else None
            except (OSError, VltoolError):
                rec = None  # (a damaged record is named where the report reads it)
            if not isinstance(rec, dict) or rec.get("command") != "pretrain" or not isinstance(rec.get("options"), dict):
                continue
            opts = {k: _without_seed(v) for k, v in rec["options"].items() if k not in PER_SEED_OPTIONS}
            if seen is None:
                seen = (seed, opts)
                continue
            first, theirs = seen
            differ = sorted(k for k in opts.keys() | theirs.keys() if opts.get(k) != theirs.get(k))
            if differ:
                k = differ[0]
                raise VltoolError(f"{variant}: seed{first} and seed{seed} were trained differently ({k}: {theirs.get(k)!r} against "
                                  f"{opts.get(k)!r}{f', and {len(differ) - 1} more' if len(differ) > 1 else ''}); a report averages "
                                  "seeds of one setting: rerun the recipe so that every seed is trained alike")
            break  # (one training record per seed: its run)


def _without_seed(v):
    if isinstance(v, str):
        return re.sub(r"seed\d+", "seed*", v)
    if isinstance(v, list):
        return [_without_seed(x) for x in v]
    if isinstance(v, dict):
        return {k: _without_seed(x) for k, x in v.items()}
    return v


def _provenance_files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [n for n in dirnames if n not in ("checkpoints", "tensorboard", "model")]
        for n in filenames:
            if n.endswith(".json") and n not in ("state.json", "dataset_info.json", "run.json", "config.json"):
                out.append(Path(dirpath) / n)
    return sorted(out)


def _command_records(root: Path) -> list[tuple[Path, dict]]:
    """Every vltool command's record (a provenance file with its command line) under `root`."""
    out = []
    for p in _provenance_files(root):
        try:
            r = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(r, dict) and "command_line" in r:
            out.append((p, r))
    return out


def collect_commands(runs_dir: Path) -> tuple[list[dict], dict[str, float]]:
    """Every vltool command whose output lies under RUNS_DIR, in the order they ran, and wall time per seed."""
    cmds = []
    for p, r in _command_records(runs_dir):
        seed = next((int(m.group(1)) for part in p.relative_to(runs_dir).parts if (m := SEED_DIR.match(part))), None)
        cmds.append({"created": r.get("created"), "seed": seed, "output": p.relative_to(runs_dir).as_posix(),
                     "command_line": r["command_line"], "wall_time_s": r.get("wall_time_s")})
    cmds.sort(key=lambda c: (c["created"] or "", c["output"]))
    wall: dict[str, float] = {}
    for c in cmds:
        k = "shared" if c["seed"] is None else f"seed{c['seed']}"
        wall[k] = round(wall.get(k, 0.0) + float(c["wall_time_s"] or 0.0), 1)
    return cmds, wall


def _mean_sd(xs: list[float]) -> tuple[float, float | None]:
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


RUNTIME_KEYS = ("platform", "processor", "cpu_count", "python", "torch_threads", "torch_interop_threads", "deterministic_algorithms",
                "cudnn_deterministic", "cudnn_benchmark", "tf32_matmul", "default_dtype", "device", "dtype", "cuda_build",
                "cuda_available", "cpu_capability", "cpu_math_env")


def machine(runs_dir: Path) -> dict:
    """The machine block: what the runs' own records say they ran on (provenance "runtime": threads,
    device, dtype, deterministic flags, library versions), each value with the commands that recorded
    it when they differ; not the report process's. Runs recorded before vltool kept it: "source" says so,
    and only the report process's platform is given, marked as such."""
    records = [(p.relative_to(runs_dir).as_posix(), r["runtime"]) for p, r in _command_records(runs_dir) if isinstance(r.get("runtime"), dict)]
    n_all = len(_command_records(runs_dir))
    if not records:
        return {"source": f"not recorded by the runs ({n_all} commands, made before vltool recorded its runtime); "
                          "the report process's platform",
                "report_process": {"platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count(),
                                   "python": platform.python_version()}}
    info: dict[str, Any] = {"source": f"the runs' records ({len(records)} of {n_all} commands record their runtime)"}
    for key in RUNTIME_KEYS:
        values = {}
        for name, rt in records:
            if key in rt:
                values.setdefault(json.dumps(rt[key]), []).append(name)
        if len(values) == 1:
            info[key] = json.loads(next(iter(values)))
        elif values:
            info[key] = {"differs": [{"value": json.loads(v), "commands": len(names), "e.g.": names[0]} for v, names in sorted(values.items())]}
    libs: dict[str, set] = {}
    for _, rt in records:
        for lib, version in (rt.get("libraries") or {}).items():
            libs.setdefault(lib, set()).add(version)
    info["libraries"] = {lib: sorted(v)[0] if len(v) == 1 else sorted(v) for lib, v in sorted(libs.items())}
    if "torch" in info["libraries"]:
        info["torch"] = info["libraries"]["torch"]
    info["cuda"] = info.get("cuda_available", info.get("cuda"))
    return info


def run_threads(run_dir: Path) -> set[int]:
    """The torch thread counts the commands under one run directory recorded (empty: none recorded)."""
    return {int(r["runtime"]["torch_threads"]) for _, r in _command_records(run_dir)
            if isinstance(r.get("runtime"), dict) and isinstance(r["runtime"].get("torch_threads"), int)}


def _run_dir_of(path: Path) -> Path | None:
    """The <variant>/seed<N> directory a results file lies in."""
    for d in path.parents:
        if SEED_DIR.match(d.name):
            return d
    return None


def build_report(runs_dir: str | Path, config: ReportConfig) -> dict:
    """The report of the runs under `runs_dir`: every number per seed, summarised per variant, and the
    differences from the baseline (paired where the runs kept their per-example outcomes).

    Stages: find_variants -> add_style_twins -> read_runs -> keep_complete_seeds -> summarise -> paired_comparisons
    -> style_verdicts -> contrast (each --pair) -> report_record.
    """
    runs_dir = Path(runs_dir)
    found, order = find_variants(runs_dir, config)
    config = replace(config, metrics=add_style_twins(config.metrics, config.styles, found))
    for name, _ in order:
        check_trained_alike(name, found[name])
    variants, sources = read_runs(found, order, config)
    present = {m for v in variants for r in v["runs"].values() for m in r}
    left_out = [m.label for m in config.metrics if m.name not in present]  # (a task the study has no data for: no column of "-")
    if present:
        config = replace(config, metrics=[m for m in config.metrics if m.name in present])
    incomplete, gaps = keep_complete_seeds(variants, runs_dir, order, config)
    base = next((v for v in variants if v["name"] == config.baseline), None)
    for v in variants:
        v["summary"] = {m.name: s for m in config.metrics if (s := summarise(v, base, m)) is not None}
    paired_notes = paired_comparisons(variants, base, config, sources) if base is not None else []
    if base is not None and config.styles:
        style_verdicts(variants, base, config)
    contrasts = [contrast(variants, a, b, config, sources, paired_notes) for a, b in config.pairs]
    units = sorted({u for _, r, *_ in sources.values() if (u := _bootstrap_unit(r))})
    record = report_record(runs_dir, config, variants, incomplete, paired_notes, units, contrasts, gaps)
    record["metrics_without_results"] = left_out
    return record


def contrast(variants: list[dict], name: str, ref: str, config: ReportConfig, sources: dict, notes: list[str]) -> dict:
    """--pair VARIANT=REFERENCE: VARIANT's difference from REFERENCE, summarised and paired exactly as a
    difference from the baseline is (and with --style, where it holds)."""
    v, b = (next(x for x in variants if x["name"] == n) for n in (name, ref))
    c = {"name": name, "label": v["label"], "reference": ref, "reference_label": b["label"], "runs": v["runs"]}
    c["summary"] = {m.name: s for m in config.metrics if (s := summarise(v, b, m)) is not None}
    notes += [n for n in paired_comparisons([b, c], b, config, sources) if n not in notes]
    if config.styles:
        style_verdicts([b, c], b, config)
    return c


def find_variants(runs_dir: Path, config: ReportConfig) -> tuple[dict[str, dict[int, Path]], list[tuple[str, str]]]:
    """The run directories <variant>/seed<N> under `runs_dir`, and the variants reported (directory, label)
    in table order: --variant's, else every one found; each must have runs, the baseline among them."""
    if not runs_dir.is_dir():
        raise UsageError(f"{runs_dir}: no such directory")
    if not config.metrics:
        raise UsageError("give at least one --metric")
    found = find_runs(runs_dir)
    if not found:
        raise VltoolError(f"{runs_dir}: no run directories named <variant>/seed<N>")
    order = config.variants or [(v, v) for v in sorted(found)]
    missing = [v for v, _ in order if v not in found]
    if missing:
        raise VltoolError(f"{runs_dir}: no runs of variant(s) {', '.join(missing)} (found: {', '.join(sorted(found))})")
    if config.baseline is not None and config.baseline not in dict(order):
        raise UsageError(f"--baseline {config.baseline!r} is not one of the variants ({', '.join(v for v, _ in order)})")
    for a, b in config.pairs:
        if a not in dict(order) or b not in dict(order) or a == b:
            raise UsageError(f"--pair {a}={b}: expected two different variants of the report ({', '.join(v for v, _ in order)})")
    return found, order


def read_runs(found: dict[str, dict[int, Path]], order: list[tuple[str, str]], config: ReportConfig) -> tuple[list[dict], dict]:
    """Each variant {"name", "label", "paper", "runs": {seed: {metric: entry}}}, and where each number
    came from: (variant, seed, metric) -> (its JSON file, the record)."""
    variants = []
    sources: dict[tuple[str, str, str], tuple[Path, dict, str, str]] = {}
    for name, label in order:
        runs: dict[str, dict] = {}
        lacking: dict[str, list[str]] = {}  # seed -> what each metric it lacks lacks (for the message of an empty report)
        for seed, d in sorted(found[name].items()):
            row = {}
            for m in config.metrics:
                p = d / m.relpath
                if not p.exists() and p.suffix != ".json":
                    p = p.with_name(p.name + ".json")
                if not p.exists():
                    if m.twin_of is not None and m.twin_of in row:  # the run has the metric in one style only
                        raise VltoolError(f"run {name}/seed{seed} has {m.twin_of} but not its {m.style} twin "
                                          f"{d / m.relpath}(.json); evaluate that run in every --style, or leave the style out")
                    lacking.setdefault(str(seed), []).append(f"{name}/seed{seed}/{m.relpath}(.json) is missing")
                    continue
                record = _read_json(p)
                e = lookup(record, m.key)
                if e is None or e["value"] is None:
                    lacking.setdefault(str(seed), []).append(f"{p} has no {m.key.split(':', 1)[-1]!r}")
                else:
                    _check_numbers(e, p, m.key, f"{name}/seed{seed}")
                    row[m.name] = e
                    sources[(name, str(seed), m.name)] = (p, *evaluation_of(record, m.key))
            runs[str(seed)] = row
        variants.append({"name": name, "label": label, "paper": config.paper.get(name), "runs": runs, "lacking": lacking})
    return variants, sources


def _check_numbers(e: dict, path: Path, key: str, run: str) -> None:
    """A metric's value, interval and chance are finite numbers: a NaN or inf in a results file is refused,
    never averaged into a table."""
    for part in ("value", "ci_low", "ci_high", "chance"):
        x = e.get(part)
        if x is None and part != "value":
            continue
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise VltoolError(f"{path}: {key} has {part} {x!r}, not a finite number (run {run}); the evaluation that wrote "
                              "it failed or the file was edited: re-run it")


def keep_complete_seeds(variants: list[dict], runs_dir: Path, order: list[tuple[str, str]],
                        config: ReportConfig | None = None) -> tuple[list[int], list[str]]:
    """Paired comparisons and "mean over N seeds" need the same seeds in every cell: keep the seeds at which
    every variant has every metric it has at any seed (a recipe stopped part-way, or one evaluation of a
    seed missing, leaves a seed with some results only: it is listed, not averaged). Returns the seeds left
    out and, for each, what it lacks ("variant/seedN: metric, ...")."""
    label = {m.name: m.label for m in config.metrics} if config is not None else {}
    wanted = {v["name"]: {m for r in v["runs"].values() for m in r} for v in variants}  # what each variant has at some seed
    with_results = {v["name"]: {k for k, r in v["runs"].items() if r and wanted[v["name"]] <= r.keys()} for v in variants}
    complete = set.intersection(*with_results.values())
    incomplete = sorted({int(k) for v in variants for k in v["runs"]} - {int(k) for k in complete})
    lacking = {v["name"]: v.pop("lacking", {}) for v in variants}
    gaps = [f"{v['name']}/seed{k}: " + (", ".join(label.get(m, m) for m in sorted(wanted[v["name"]] - r.keys())) if r else "no results")
            for k in map(str, incomplete) for v in variants
            if (r := v["runs"].get(k)) is None or not r or not wanted[v["name"]] <= r.keys()]
    if not complete:
        empty = [n for n, seeds in with_results.items() if not wanted[n]]  # (a variant without any asked metric is named by what it lacks)
        why = ([w for n in empty for ws in lacking[n].values() for w in ws] if empty else gaps or
               [f"{n} has complete results at seed(s) {', '.join(sorted(seeds, key=int)) or 'none'}" for n, seeds in with_results.items()])
        shown = "; ".join(why[:3]) + (f"; and {len(why) - 3} more" if len(why) > 3 else "")
        raise VltoolError(f"{runs_dir}: no seed has results for every variant ({', '.join(n for n, _ in order)}): {shown}")
    for v in variants:
        v["runs"] = {k: r for k, r in v["runs"].items() if k in complete}
    return incomplete, gaps


def summarise(v: dict, base: dict | None, m: Metric) -> dict | None:
    """One variant's metric over its seeds: mean, sd, the mean interval half-width, chance, and the
    difference from the baseline seed by seed (None when no seed has the metric)."""
    per_seed = {s: r[m.name] for s, r in v["runs"].items() if m.name in r}
    if not per_seed:
        return None
    vals = [e["value"] for e in per_seed.values()]
    mean, sd = _mean_sd(vals)
    halfs = [(e["ci_high"] - e["ci_low"]) / 2 for e in per_seed.values() if e["ci_low"] is not None and e["ci_high"] is not None]
    chances = [e["chance"] for e in per_seed.values() if e["chance"] is not None]
    s = {"mean": mean, "sd": sd, "seeds": len(vals), "values": {k: e["value"] for k, e in per_seed.items()},
         "ci_halfwidth_mean": sum(halfs) / len(halfs) if halfs else None,
         "chance": sum(chances) / len(chances) if chances else None,
         "kind": next(iter(per_seed.values()))["kind"]}
    if base is not None and v is not base:
        pairs = [(e["value"], base["runs"][k][m.name]["value"]) for k, e in per_seed.items()
                 if k in base["runs"] and m.name in base["runs"][k]]
        if pairs:
            diffs = [a - b for a, b in pairs]
            dm, dsd = _mean_sd(diffs)
            s["delta_vs_baseline"] = {"mean": dm, "sd": dsd, "seeds": len(diffs),
                                      "positive_seeds": sum(d > 0 for d in diffs), "per_seed": diffs}
    return s


def report_record(runs_dir: Path, config: ReportConfig, variants: list[dict], incomplete: list[int], paired_notes: list[str],
                  units: list[str], contrasts: list[dict], gaps: list[str] = ()) -> dict:
    """STEM.json: the variants' numbers and summaries, how the paired intervals were made, the machine, and
    every command that made the runs with its wall time."""
    commands, wall = collect_commands(runs_dir)
    seeds = sorted({int(s) for v in variants for s in v["runs"]})
    has_base = any(v["name"] == config.baseline for v in variants) or bool(contrasts)
    return {
        "title": config.title,
        "recipe": config.recipe,
        "vltool_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs_dir": str(runs_dir),
        "machine": machine(runs_dir),
        "seeds": seeds,
        "incomplete_seeds": incomplete,
        "incomplete_runs": list(gaps),
        "baseline": config.baseline,
        "metrics": [{"name": m.name, "label": m.label, "file": m.relpath, "key": m.key,
                     **({"style": m.style, "twin_of": m.twin_of} if config.styles else {})} for m in config.metrics],
        "styles": [{"name": n, "suffix": x} for n, x in config.styles] or None,
        "variants": variants,
        "contrasts": contrasts,
        "bootstrap_units": units,
        "paired": {
            "method": "paired bootstrap of the difference from the baseline over the same test examples: "
                      "delta = mean over seeds of metric(variant, seed) - metric(baseline, seed); each resample draws "
                      "whole groups of examples (the runs' --group-column; within classes only when the groups nest in them "
                      "and every class holds at least 5 groups), the same draw for every seed and both variants (seeds that "
                      "test different examples: one draw over the union of their test sets, groups drawn within the set of "
                      "seeds that test them), and with 3 seeds or more draws the seeds too, with replacement (a hierarchical "
                      "bootstrap: the interval covers the test set and the seeds); 95% percentile interval; "
                      "'differs' when it excludes 0; 'borderline' when the bootstrap p-value (the share of replicates at or "
                      "beyond 0) is within 2 Monte Carlo standard errors of 0.025 even after drawing more replicates (x4 at a "
                      "time, up to max_resamples; each metric's own count is its 'resamples')",
            "resamples": config.bootstrap, "max_resamples": max(config.bootstrap, config.bootstrap_max),
            "mixed_threads_allowed": config.allow_mixed_threads,
            "seed": config.seed, "level": 0.95,
        } if has_base else None,
        "paired_notes": paired_notes,
        "notes": config.notes,
        "wall_time_s": {**wall, "total": round(sum(wall.values()), 1)},
        "commands": commands,
    }


def _bootstrap_unit(record: dict) -> str | None:
    """protocol.bootstrap.unit of an evaluation's results record (None for other files)."""
    proto = record.get("protocol")
    b = proto.get("bootstrap") if isinstance(proto, dict) else None
    u = b.get("unit") if isinstance(b, dict) else None
    return u if isinstance(u, str) else None


def _examples_file(json_path: Path, record: dict) -> Path | None:
    ex = record.get("examples")
    if not isinstance(ex, dict) or not isinstance(ex.get("file"), str):
        return None
    p = json_path.parent / ex["file"]
    return p if p.exists() else None


def paired_comparisons(variants: list[dict], base: dict, config: ReportConfig, sources: dict) -> list[str]:
    """Each variant's paired difference from the baseline, with its bootstrap interval, into
    summary[metric]["paired"] (None, with "paired_note", where it cannot be computed); returns the notes."""
    cache: dict[Path, Outcomes] = {}
    threads_seen: dict[Path, set[int]] = {}
    notes: list[str] = []

    def outcomes(key) -> Outcomes | None:
        json_path, record = sources[key][:2]
        p = _examples_file(json_path, record)
        if p is None:
            return None
        if p not in cache:
            try:
                cache[p] = Outcomes.read(p)
            except VltoolError as e:
                raise VltoolError(f"run {key[0]}/seed{key[1]}: {e}; re-run that run's evaluation to write it again") from None
        return cache[p]

    def note(text: str) -> None:
        if text not in notes:
            notes.append(text)

    for v in variants:
        if v is base:
            continue
        todo: dict[tuple, list[str]] = {}  # (file, seeds) -> metric names computed together
        for m in config.metrics:
            s = v["summary"].get(m.name)
            if s is None:
                continue
            s["paired"] = None
            seeds = sorted((k for k in s["values"] if m.name in base["runs"].get(k, {})), key=int)
            if not seeds:
                continue
            if s["kind"] != "eval":
                s["paired_note"] = "a plain number: no per-example outcomes"
                note(f"{m.label}: a plain number, not an outcome per test example.")
                continue
            missing = [k for k in seeds for who in (v, base) if outcomes((who["name"], k, m.name)) is None]
            if missing:
                s["paired_note"] = "no per-example outcomes (.examples.npz) for seed(s) " + ", ".join(sorted(set(missing), key=int))
                note(f"{m.label}: no paired interval, some runs have no per-example outcomes (evaluated before they were "
                     "written, or the file was moved); re-run their evaluation to get it.")
                continue
            names = outcomes((v["name"], seeds[0], m.name)).statistic()(None)
            _, _, leaf, where = sources[(v["name"], seeds[0], m.name)]
            if leaf not in names:
                s["paired_note"] = f"{m.key} is not recomputed from the per-example outcomes"
                continue
            todo.setdefault((m.relpath, where, tuple(seeds)), []).append(m.name)
        for (relpath, _where, seeds), mnames in todo.items():
            keys = {n: sources[(v["name"], seeds[0], n)][2] for n in mnames}
            pairs = []
            for k in seeds:
                if not config.allow_mixed_threads:
                    _check_threads(sources[(v["name"], k, mnames[0])][0], sources[(base["name"], k, mnames[0])][0], threads_seen)
                pair = (outcomes((v["name"], k, mnames[0])), outcomes((base["name"], k, mnames[0])))
                for who, o in zip((v, base), pair):  # an outcomes file must reproduce its own JSON
                    got = o.statistic()(None)
                    for n, key in keys.items():
                        want = who["runs"][k][n]["value"]
                        if not (abs(got[key] - want) <= 1e-9 * max(1.0, abs(want))):
                            raise VltoolError(f"{o.path}: its outcomes give {key} = {got[key]!r}, its results JSON {want!r}; "
                                              "the two files come from different runs (re-run the evaluation)")
                pairs.append(pair)
            res = paired_difference(pairs, sorted(set(keys.values())), config.bootstrap, config.seed, max_boot=config.bootstrap_max)
            for n, key in keys.items():
                r = res["metrics"][key]
                v["summary"][n]["paired"] = {**r, "seeds": [int(k) for k in seeds], "unit": res["unit"], "resampling": res["resampling"],
                                             "interval": res["interval"], "seeds_resampled": res["seeds_resampled"]}
    return notes


def _check_threads(a: Path, b: Path, seen: dict[Path, set[int]]) -> None:
    """Refuse to pair two runs whose records name different torch thread counts (a JSD model's weights
    differ in the last bits across them; docs/pretrain.md), unless --allow-mixed-threads."""
    da, db = _run_dir_of(a), _run_dir_of(b)
    if da is None or db is None:
        return
    for d in (da, db):
        if d not in seen:
            seen[d] = run_threads(d)
    ta, tb = seen[da], seen[db]
    if ta and tb and ta != tb:
        raise VltoolError(f"{da} ran with {', '.join(map(str, sorted(ta)))} torch thread(s), {db} with "
                          f"{', '.join(map(str, sorted(tb)))}: the same seed gives the same bits only at the same thread count "
                          "(docs/pretrain.md); rerun them alike (pretrain --threads, or OMP_NUM_THREADS), or pass --allow-mixed-threads")


def style_verdict(by_style: dict[str, dict | None]) -> str | None:
    """Where a paired difference holds, over the styles {name: summary["paired"]}: 'both styles' / 'every style'
    (the same sign everywhere), 'NAME only' / 'A, B only', 'opposite signs', 'neither style' / 'no style'; None
    when a style has no interval."""
    if any(p is None or p.get("ci_low") is None for p in by_style.values()):
        return None
    differs = {n: p for n, p in by_style.items() if p["differs"]}
    borderline = [n for n, p in by_style.items() if p.get("verdict") == "borderline"]
    if borderline:  # not settled in some style: what holds elsewhere, and where it is borderline
        settled = [n for n in by_style if n not in borderline]
        if len({by_style[n]["delta"] > 0 for n in differs}) > 1:
            rest = "opposite signs"
        else:
            rest = (", ".join(differs) + " only" if differs else "") if settled else ""
            if not differs and settled:
                rest = ", ".join(settled) + " within noise"
        return (f"{rest}; " if rest else "") + ", ".join(borderline) + " borderline"
    if not differs:
        return "neither style" if len(by_style) == 2 else "no style"
    if len({p["delta"] > 0 for p in differs.values()}) > 1:
        return "opposite signs"
    if len(differs) == len(by_style):
        return "both styles" if len(by_style) == 2 else "every style"
    return ", ".join(differs) + " only"


def style_verdicts(variants: list[dict], base: dict, config: ReportConfig) -> None:
    """Each variant's verdict across styles, per metric of the first style with twins: summary[metric]["styles"]
    = {"verdict", "by_style": {style: "up" | "down" | "within noise"}}."""
    twins: dict[str, list[Metric]] = {}
    for m in config.metrics:
        if m.twin_of is not None:
            twins.setdefault(m.twin_of, []).append(m)
    first = {m.name: m for m in config.metrics if m.name in twins}
    for v in variants:
        if v is base:
            continue
        for name, others in twins.items():
            s = v["summary"].get(name)
            if s is None or "delta_vs_baseline" not in s:
                continue
            by = {first[name].style: s.get("paired")} | {t.style: (v["summary"].get(t.name) or {}).get("paired") for t in others}
            s["styles"] = {"verdict": style_verdict(by),
                           "by_style": {n: None if p is None or p.get("ci_low") is None else
                                        ("up" if p["delta"] > 0 else "down") if p["differs"] else
                                        "borderline" if p.get("verdict") == "borderline" else "within noise"
                                        for n, p in by.items()}}


def report_stem(out_stem: str | Path) -> Path:
    stem = Path(out_stem).expanduser()
    return stem.with_suffix("") if stem.suffix in (".json", ".md", ".png") else stem


REPORT_FILES = (".json", ".md", ".png")


def check_report_out(runs_dir: str | Path, out_stem: str | Path, overwrite: bool = False) -> Path:
    """Refuse a --out whose files would replace a run the report reads (RUNS_DIR/<variant>/seed<N>), or
    that cannot be written; in the CLI, lock it, and finish a replacement of the set that a killed report
    committed. STEM.json, .md and .png are replaced only when vltool wrote them (STEM.json is a report that
    names them), --overwrite or not, never a file of the user's that happens to have the name; a set of
    vltool's is refused without --overwrite, as every command's output is."""
    stem = report_stem(require_output_name(out_stem))
    runs = [d for seeds in find_runs(Path(runs_dir)).values() for d in seeds.values()] if Path(runs_dir).is_dir() else []
    names = [stem.name + ext for ext in REPORT_FILES]
    journal = swap_journal(stem)
    locked = check_output(stem, True, inputs=runs, related=names, kind="file", keep=pending_replace(journal))
    finished = finish_replace(journal)
    if finished:
        warn(f"finished replacing {', '.join(finished)}: a killed report had written the new set but not put all of it in place")
    for name in names:
        check_output(stem.with_name(name), True, inputs=runs, lock=False, kind="file")
    existing = [stem.with_name(n) for n in names if os.path.lexists(stem.with_name(n))]
    if existing:
        written = _report_files(stem.with_name(stem.name + ".json"))
        for p in existing:
            if p.name not in written:
                raise UsageError(f"--out {stem}: {p} was not written by vltool report (no report {stem.name}.json names it); "
                                 "vltool replaces only what it wrote (even with --overwrite): choose another --out")
        if not overwrite:
            raise UsageError(f"{existing[0]} exists; pass --overwrite to replace it")
    return locked


def _report_files(json_path: Path) -> set[str]:
    """The names of the files a report STEM.json says it wrote (itself included); empty when it is not a report."""
    try:
        record = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(record, dict) or not {"vltool_version", "variants", "metrics", "files"} <= record.keys():
        return set()
    files = record["files"] if isinstance(record["files"], dict) else {}
    return {json_path.name} | {Path(f).name for f in files.values() if isinstance(f, str)}


def write_report(report: dict, out_stem: str | Path, *, chart: bool = True, overwrite: bool = True) -> dict[str, str]:
    """Write STEM.json, STEM.md and (with matplotlib) STEM.png, replacing the earlier set as one
    (`io.atomic.replace_as_one`: a kill leaves the old set or the new one, never a mix); returns the files
    written. The JSON names them relative to itself (`files`: the names beside it)."""
    stem = report_stem(out_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:8]
    final = {kind: stem.with_name(stem.name + ext) for kind, ext in (("markdown", ".md"), ("chart", ".png"), ("json", ".json"))}
    staged: dict[Path, Path | None] = {}
    try:
        md = staged_path(final["markdown"], token)
        md.write_text(render_markdown(report))
        staged[final["markdown"]] = md
        png = staged_path(final["chart"], token)
        if chart and render_chart(report, png) is not None:
            staged[final["chart"]] = png
        elif final["chart"].name in _report_files(final["json"]):
            staged[final["chart"]] = None  # (the earlier report's chart, which this report does not have, goes with it)
        files = {kind: p.name for kind, p in final.items() if staged.get(p) is not None}
        js = staged_path(final["json"], token)
        js.write_text(json.dumps({**report, "files": files}, indent=2, default=str, ensure_ascii=False) + "\n")
        staged[final["json"]] = js
        for tmp in staged.values():
            if tmp is not None:
                _fsync(tmp)
        replace_as_one(staged, swap_journal(stem))
    finally:
        if not pending_replace(swap_journal(stem)):  # (once committed, the temporaries are the new set: kept for its finish)
            for tmp in [*staged.values(), staged_path(final["chart"], token)]:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
    return {kind: str(p) for kind, p in final.items() if kind in files or kind == "json"}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
