"""`vltool report`: gather the results of a recipe's runs into one table, over seeds, paired by seed.

A recipe writes each run under RUNS_DIR/<variant>/seed<N>/ (the trained model and the evaluation
JSONs of `zeroshot`, `retrieve`, `probe`, or any vltool.json). The report reads one number per
(variant, seed, metric), and writes three files next to each other:

  STEM.json  every number, per seed and summarised, the commands that made them, the machine
  STEM.md    the table: mean +- standard deviation over seeds, the mean 95% bootstrap interval of a
             single run, the chance level, and the paired difference against a baseline variant
  STEM.png   one panel per metric: a bar per variant, a dot per seed, the chance level dashed

A metric is named RELPATH:KEY. RELPATH is a JSON file relative to the run directory (".json" may be
left off); KEY is first looked up in the file's "metrics" (an evaluation entry: value, 95% interval,
chance), then as a dotted path into the whole file (any number, e.g. stats.groups.precision).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vltool import __version__
from vltool.errors import UsageError, VltoolError

SEED_DIR = re.compile(r"^seed(\d+)$")


@dataclass
class Metric:
    label: str
    relpath: str
    key: str
    percent: bool | None = None  # None: evaluation fractions are shown in percent, ranks and plain values as they are

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
    node: Any = record
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    if isinstance(node, dict) and "value" in node:  # an evaluation entry reached by its path
        return {"value": node.get("value"), "ci_low": node.get("ci_low"), "ci_high": node.get("ci_high"),
                "chance": node.get("chance"), "kind": "eval"}
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return {"value": float(node), "ci_low": None, "ci_high": None, "chance": None, "kind": "value"}


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


def _provenance_files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [n for n in dirnames if n not in ("checkpoints", "tensorboard", "model")]
        for n in filenames:
            if n.endswith(".json") and n not in ("state.json", "dataset_info.json", "run.json", "config.json"):
                out.append(Path(dirpath) / n)
    return sorted(out)


def collect_commands(runs_dir: Path) -> tuple[list[dict], dict[str, float]]:
    """Every vltool command whose output lies under RUNS_DIR, in the order they ran, and wall time per seed."""
    cmds = []
    for p in _provenance_files(runs_dir):
        try:
            r = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(r, dict) or "command_line" not in r:
            continue
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


def machine() -> dict:
    info = {"platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count(),
            "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def build_report(runs_dir: str | Path, config: ReportConfig) -> dict:
    runs_dir = Path(runs_dir)
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

    variants = []
    for name, label in order:
        runs: dict[str, dict] = {}
        for seed, d in sorted(found[name].items()):
            row = {}
            for m in config.metrics:
                p = d / m.relpath
                if not p.exists() and p.suffix != ".json":
                    p = p.with_name(p.name + ".json")
                if not p.exists():
                    continue
                e = lookup(_read_json(p), m.key)
                if e is not None and e["value"] is not None:
                    row[m.name] = e
            runs[str(seed)] = row
        variants.append({"name": name, "label": label, "paper": config.paper.get(name), "runs": runs})

    # Paired comparisons need the same seeds everywhere: keep the seeds every variant has numbers for
    # (a recipe stopped part-way leaves a seed with some variants only; it is listed, not averaged).
    complete = set.intersection(*[{k for k, r in v["runs"].items() if r} for v in variants])
    incomplete = sorted({int(k) for v in variants for k in v["runs"]} - {int(k) for k in complete})
    for v in variants:
        v["runs"] = {k: r for k, r in v["runs"].items() if k in complete}
    if not complete:
        raise VltoolError(f"{runs_dir}: no seed has results for every variant ({', '.join(n for n, _ in order)})")

    base = next((v for v in variants if v["name"] == config.baseline), None)
    for v in variants:
        summary = {}
        for m in config.metrics:
            per_seed = {s: r[m.name] for s, r in v["runs"].items() if m.name in r}
            if not per_seed:
                continue
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
            summary[m.name] = s
        v["summary"] = summary

    commands, wall = collect_commands(runs_dir)
    seeds = sorted({int(s) for v in variants for s in v["runs"]})
    return {
        "title": config.title,
        "recipe": config.recipe,
        "vltool_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs_dir": str(runs_dir),
        "machine": machine(),
        "seeds": seeds,
        "incomplete_seeds": incomplete,
        "baseline": config.baseline,
        "metrics": [{"name": m.name, "label": m.label, "file": m.relpath, "key": m.key} for m in config.metrics],
        "variants": variants,
        "notes": config.notes,
        "wall_time_s": {**wall, "total": round(sum(wall.values()), 1)},
        "commands": commands,
    }


def _scale(kind: str, key: str) -> float:
    return 100.0 if kind == "eval" and "rank" not in key else 1.0


def _fmt(x: float | None, scale: float, digits: int = 1, plain: bool = False) -> str:
    if x is None:
        return "-"
    x = x * scale
    if plain:  # counts, lengths, similarities: integers whole, others to 3 significant digits
        if float(x).is_integer() or abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.3g}"
    return f"{x:.{digits}f}"


def render_markdown(report: dict) -> str:
    metrics = report["metrics"]
    lines = []
    if report["title"]:
        lines += [f"# {report['title']}", ""]
    n = len(report["seeds"])
    lines.append(f"Seeds {', '.join(map(str, report['seeds']))}: each cell is the mean ± standard deviation over "
                 f"{n} seed{'s' if n != 1 else ''}; below it, ±h is the mean half-width of one run's 95% bootstrap interval "
                 "over the test images. Percent unless the metric is a rank or a count.")
    if report.get("incomplete_seeds"):
        lines.append(f"Seed{'s' if len(report['incomplete_seeds']) > 1 else ''} {', '.join(map(str, report['incomplete_seeds']))} "
                     "left out: not every variant has results for it (the recipe was stopped part-way).")
    lines.append("")
    has_paper = any(v["paper"] for v in report["variants"])
    head = ["Variant"] + [m["label"] for m in metrics] + (["Paper"] if has_paper else [])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * len(metrics) + (["---"] if has_paper else [])) + "|")
    chance_row = {}
    for v in report["variants"]:
        cells = [v["label"]]
        for m in metrics:
            s = v["summary"].get(m["name"])
            if s is None:
                cells.append("-")
                continue
            sc = _scale(s["kind"], m["key"])
            plain = s["kind"] == "value"
            cell = _fmt(s["mean"], sc, plain=plain) + (f" ± {_fmt(s['sd'], sc, plain=plain)}" if s["sd"] is not None else "")
            if s["ci_halfwidth_mean"] is not None:
                cell += f"<br>±{_fmt(s['ci_halfwidth_mean'], sc)}"
            cells.append(cell)
            if s["chance"] is not None:
                chance_row.setdefault(m["name"], _fmt(s["chance"], sc, 2))
        if has_paper:
            cells.append(v["paper"] or "")
        lines.append("| " + " | ".join(cells) + " |")
    if chance_row:
        lines.append("| *chance* | " + " | ".join(chance_row.get(m["name"], "") for m in metrics) + (" | |" if has_paper else " |"))
    base = report["baseline"]
    if base is not None and len(report["variants"]) > 1:
        blabel = next(v["label"] for v in report["variants"] if v["name"] == base)
        lines += ["", f"Paired by seed, difference from **{blabel}** (mean ± sd of the per-seed differences; "
                      "k/n: seeds where the variant is higher):", ""]
        lines.append("| Variant | " + " | ".join(m["label"] for m in metrics) + " |")
        lines.append("|---|" + "---:|" * len(metrics))
        for v in report["variants"]:
            if v["name"] == base:
                continue
            cells = [v["label"]]
            for m in metrics:
                s = v["summary"].get(m["name"], {})
                d = s.get("delta_vs_baseline")
                if d is None:
                    cells.append("-")
                    continue
                sc = _scale(s["kind"], m["key"])
                sign = "+" if d["mean"] >= 0 else ""
                pl = s["kind"] == "value"
                cells.append(f"{sign}{_fmt(d['mean'], sc, plain=pl)}" + (f" ± {_fmt(d['sd'], sc, plain=pl)}" if d["sd"] is not None else "")
                             + f" ({d['positive_seeds']}/{d['seeds']})")
            lines.append("| " + " | ".join(cells) + " |")
    if report["notes"]:
        lines.append("")
        lines += [f"{note}" if note.startswith(("- ", "* ")) else f"- {note}" for note in report["notes"]]
    mach = report["machine"]
    wall = report["wall_time_s"]
    per_seed = [f"{k} {v / 60:.1f} min" for k, v in wall.items() if k.startswith("seed")]
    lines += ["", f"Machine: {mach.get('cpu_count')} CPU cores ({mach.get('processor')}), torch {mach.get('torch', '?')}, "
                  f"{'a GPU' if mach.get('cuda') else 'no GPU'}. Wall time (sum of the commands' own times): "
                  + ", ".join(per_seed + ([f"shared {wall['shared'] / 60:.1f} min"] if wall.get("shared", 0) >= 3 else []))
                  + f"; {len(report['commands'])} commands, listed in the JSON."]
    if report["recipe"]:
        lines.append(f"Made by `{report['recipe']}` with vltool {report['vltool_version']} on {report['created'][:10]}.")
    return "\n".join(lines) + "\n"


def render_chart(report: dict, path: Path) -> str | None:
    """One panel per metric: a bar per variant (mean over seeds, sd as its error bar) and a dot per seed
    with that run's 95% interval; the chance level dashed. None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    metrics = report["metrics"]
    variants = report["variants"]
    ncol = len(metrics)
    fig, axes = plt.subplots(1, ncol, figsize=(max(3.2, 0.55 * len(variants) + 1.6) * ncol, 3.6), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        xs, means, sds, labels = [], [], [], []
        chance = None
        for i, v in enumerate(variants):
            s = v["summary"].get(m["name"])
            if s is None:
                continue
            sc = _scale(s["kind"], m["key"])
            xs.append(i)
            means.append(s["mean"] * sc)
            sds.append((s["sd"] or 0.0) * sc)
            labels.append(v["label"])
            runs = [v["runs"][k][m["name"]] for k in s["values"]]
            ys = [e["value"] * sc for e in runs]
            if all(e["ci_low"] is not None for e in runs):  # each seed's 95% interval
                err = [[max(0.0, e["value"] - e["ci_low"]) * sc for e in runs], [max(0.0, e["ci_high"] - e["value"]) * sc for e in runs]]
                xs_seed = [i + 0.12 * (j - (len(runs) - 1) / 2) for j in range(len(runs))]
                ax.errorbar(xs_seed, ys, yerr=err, fmt="o", color="black", ms=3, elinewidth=0.8, capsize=2, zorder=3)
            else:
                ax.scatter([i] * len(ys), ys, color="black", s=10, zorder=3)
            if s["chance"] is not None:
                chance = s["chance"] * sc
        ax.bar(xs, means, yerr=sds, color="#4c72b0", alpha=0.75, capsize=3)
        if chance is not None:
            ax.axhline(chance, color="gray", linestyle="--", linewidth=1, label="chance")
            ax.legend(fontsize=7, loc="best")
        ax.set_xticks(range(len(variants)))
        ax.set_xticklabels([v["label"] for v in variants], rotation=35, ha="right", fontsize=7)
        ax.set_title(m["label"], fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    if report["title"]:
        fig.suptitle(report["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_report(report: dict, out_stem: str | Path, *, chart: bool = True, overwrite: bool = True) -> dict[str, str]:
    """Write STEM.json, STEM.md and (with matplotlib) STEM.png atomically; returns the files written."""
    from vltool.io import atomic_file, write_json_atomic

    stem = Path(out_stem)
    if stem.suffix in (".json", ".md", ".png"):
        stem = stem.with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    files = {}
    md_path = stem.with_name(stem.name + ".md")
    with atomic_file(md_path) as tmp:
        tmp.write_text(render_markdown(report))
    files["markdown"] = str(md_path)
    if chart:
        png = stem.with_name(stem.name + ".png")
        with atomic_file(png) as tmp:
            made = render_chart(report, tmp)
        if made is not None:
            files["chart"] = str(png)
    report = {**report, "files": files}
    json_path = stem.with_name(stem.name + ".json")
    write_json_atomic(json_path, report, overwrite=True)
    files["json"] = str(json_path)
    return files
