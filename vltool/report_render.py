"""The rendering of a `vltool report`: STEM.md (the tables, the notes, the machine in words) and STEM.png
(one panel per metric), both made from the report record that vltool.report builds.

Only presentation lives here: the numbers, their intervals and verdicts are already in the record, so
this module reads it and formats it; nothing here reads a run or computes a statistic. matplotlib is
imported only inside render_chart (optional, and slow to import).
"""

from __future__ import annotations

from pathlib import Path


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


def _signed(x: float, scale: float, plain: bool) -> str:
    return ("+" if x >= 0 else "−") + _fmt(abs(x), scale, plain=plain)


def _units_in_words(units: list[str]) -> str:
    """The runs' bootstrap units, briefly: 'whole base_id groups of test images' or 'the test images'."""
    cols = sorted({u.split(" group (")[0] for u in units if " group (" in u})
    within = [("within its class" in u) or ("and its class" in u) for u in units]
    strata = ", within their class" if all(within) else ", not stratified by class" if not any(within) else ", within their class for some metrics"
    if cols and all(" group (" in u for u in units):
        return "whole " + "/".join(cols) + " groups of test images" + strata
    if cols:
        return "the test images (whole " + "/".join(cols) + " groups for some metrics)" + strata
    return "the test images" + strata


def render_markdown(report: dict) -> str:
    """STEM.md: what a cell holds, the results table, the differences from the baseline, the notes, and how
    the numbers were made (machine, wall time, recipe)."""
    lines = _md_intro(report) + _md_results_table(report)
    if report["baseline"] is not None and len(report["variants"]) > 1:
        lines += _md_baseline_table(report)
        if report.get("styles"):
            lines += _md_styles_table(report, [(v["label"], v["summary"]) for v in report["variants"] if v["name"] != report["baseline"]])
    if report.get("contrasts"):
        lines += _md_contrasts_table(report)
        if report.get("styles"):
            lines += _md_styles_table(report, [(f"{c['label']} − {c['reference_label']}", c["summary"]) for c in report["contrasts"]])
    return "\n".join(lines + _md_footer(report)) + "\n"


def _md_intro(report: dict) -> list[str]:
    """The title, and what a cell holds: the seeds, their mean and sd, one run's interval."""
    lines = []
    if report["title"]:
        lines += [f"# {report['title']}", ""]
    n = len(report["seeds"])
    lines.append(f"Seeds {', '.join(map(str, report['seeds']))}: each cell is the mean ± standard deviation over "
                 f"{n} seed{'s' if n != 1 else ''}; below it, ±h is the mean half-width of one run's 95% bootstrap interval "
                 f"over {_units_in_words(report.get('bootstrap_units') or [])}. Percent unless the metric is a rank or a count.")
    if report.get("metrics_without_results"):
        lines.append(f"No run has results for {', '.join(report['metrics_without_results'])}: left out of the tables.")
    if report.get("incomplete_seeds"):
        gaps = report.get("incomplete_runs") or []
        lines.append(f"Seed{'s' if len(report['incomplete_seeds']) > 1 else ''} {', '.join(map(str, report['incomplete_seeds']))} "
                     "left out: not every variant has every result for it (the recipe was stopped part-way, or an evaluation is missing)"
                     + (f": {'; '.join(gaps[:4])}{f'; and {len(gaps) - 4} more' if len(gaps) > 4 else ''}." if gaps else "."))
    return lines + [""]


def _md_results_table(report: dict) -> list[str]:
    """A row per variant (mean ± sd, ±h below), the paper's finding when given, and the chance row."""
    metrics = report["metrics"]
    has_paper = any(v["paper"] for v in report["variants"])
    head = ["Variant"] + [m["label"] for m in metrics] + (["Paper"] if has_paper else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * len(metrics) + (["---"] if has_paper else [])) + "|"]
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
    return lines


def _md_baseline_table(report: dict) -> list[str]:
    """The difference of every other variant from the baseline, with its paired interval and verdict."""
    metrics, base = report["metrics"], report["baseline"]
    blabel = next(v["label"] for v in report["variants"] if v["name"] == base)
    seeds = ", ".join(map(str, report["seeds"]))
    paired = [s["paired"] for v in report["variants"] for s in v["summary"].values() if s.get("paired")]
    unit = _units_in_words(sorted({p["unit"] for p in paired})) if paired else "the test images"
    with_seeds = bool(paired) and all(p.get("seeds_resampled") for p in paired)
    over = ("and the seeds with replacement, so the interval covers the test set and the training noise" if with_seeds
            else "the same draw for every seed; fewer than 3 seeds are not resampled, so the interval covers the test set only")
    lines = ["", f"Difference from **{blabel}** on the same test examples, Δ = the mean over seeds {seeds} of "
                 f"(variant − {blabel}), with its 95% paired bootstrap interval (each resample draws {unit}, both variants "
                 f"alike, {over}): **differs** when the interval excludes 0, else *within noise*. "
                 "Below it, the sd of the per-seed differences."
             + (" Where each seed tests its own examples (" + ", ".join(sorted({m["label"] for v in report["variants"]
                for m in metrics if "union" in ((v["summary"].get(m["name"]) or {}).get("paired") or {}).get("unit", "")}))
                + "), one draw over the union of the seeds' test sets serves every seed, the groups drawn within the set "
                "of seeds that test them." if any("union" in p["unit"] for p in paired) else "")
             + _mc_sentence(report, paired), ""]
    lines.append("| Variant | " + " | ".join(m["label"] for m in metrics) + " |")
    lines.append("|---|" + "---:|" * len(metrics))
    for v in report["variants"]:
        if v["name"] != base:
            lines.append("| " + " | ".join([v["label"]] + [_delta_cell(v["summary"].get(m["name"], {}), m, _resamples(report)) for m in metrics]) + " |")
    if any(s.get("paired") is None and s.get("delta_vs_baseline") for v in report["variants"] for s in v["summary"].values()):
        lines += ["", "[-]: no paired interval. " + " ".join(report.get("paired_notes") or [])]
    return lines


def _md_contrasts_table(report: dict) -> list[str]:
    """Each --pair: a variant's paired difference from its own reference, as in the baseline table."""
    metrics = report["metrics"]
    lines = ["", "Paired contrasts (--pair): each variant against its own reference on the same test examples, Δ and its "
                 "95% paired bootstrap interval made as in the table above.", ""]
    lines.append("| Contrast | " + " | ".join(m["label"] for m in metrics) + " |")
    lines.append("|---|" + "---:|" * len(metrics))
    for c in report["contrasts"]:
        lines.append("| " + " | ".join([f"{c['label']} − {c['reference_label']}"]
                                       + [_delta_cell(c["summary"].get(m["name"], {}), m, _resamples(report)) for m in metrics]) + " |")
    return lines


def _md_styles_table(report: dict, rows: list[tuple[str, dict]]) -> list[str]:
    """Where each difference holds (rows: label, summary): in every style, in one only, in none, or with opposite signs."""
    metrics = [m for m in report["metrics"] if any(x.get("twin_of") == m["name"] for x in report["metrics"])]
    if not metrics or not any("styles" in (summary.get(m["name"]) or {}) for _, summary in rows for m in metrics):
        return []
    names = [s["name"] for s in report["styles"]]
    arrow = {"up": "↑", "down": "↓", "within noise": "–", "borderline": "≈", None: "?"}
    mc = any("verdict" in (((summary.get(m["name"]) or {}).get("paired")) or {}) for _, summary in rows for m in report["metrics"])
    lines = ["", f"Across styles ({', '.join(names)}: the same test examples drawn in each): where each difference "
                 "above differs from 0, by its paired interval in each style. ↑ / ↓: differs, up or down; –: within noise"
                 + ("; ≈: borderline. " if mc else ". ")
                 + "*NAME only*: a difference that holds in that style alone.", ""]
    lines.append("| Variant | " + " | ".join(m["label"] for m in metrics) + " |")
    lines.append("|---|" + "---|" * len(metrics))
    one_only = []
    for label, summary in rows:
        cells = [label]
        for m in metrics:
            st = (summary.get(m["name"]) or {}).get("styles")
            if st is None:
                cells.append("-")
                continue
            verdict = st["verdict"] or "no interval in some style"
            cells.append(f"{verdict} ({' '.join(n + ' ' + arrow[st['by_style'][n]] for n in names if n in st['by_style'])})")
            if st["verdict"] and st["verdict"].endswith(" only"):
                one_only.append(f"{label}, {m['label']} ({st['verdict']})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Holds in one style only: " + ("; ".join(one_only) + "." if one_only else "none.")]
    return lines


def _resamples(report: dict) -> int | None:
    return (report.get("paired") or {}).get("resamples")


def _mc_sentence(report: dict, paired: list[dict]) -> str:
    """How many replicates the intervals were read from and what their Monte Carlo error is (reports made
    before it was recorded: nothing)."""
    if not paired or not all("p_value" in p for p in paired):
        return ""
    n, top = _resamples(report), (report.get("paired") or {}).get("max_resamples")
    more = sorted({p["resamples"] for p in paired if p["resamples"] != n})
    return (f" Each interval is read from {n:,} resamples" + (f" ({', '.join(f'{x:,}' for x in more)} where a verdict was "
            f"near the edge; at most {top:,})" if more else f" (a verdict near the edge draws more, up to {top:,})")
            + "; below the sd, MC ± is the larger Monte Carlo standard error of the two bounds and p the bootstrap p-value "
            "(the share of resamples at or beyond 0) with its own: **borderline** when p is within 2 of them of 0.025 "
            "even at the most resamples.")


def _delta_cell(s: dict, m: dict, resamples: int | None = None) -> str:
    """Δ [paired interval] and the verdict ([-] without an interval), the sd of the per-seed differences below."""
    d = s.get("delta_vs_baseline")
    if d is None:
        return "-"
    sc = _scale(s["kind"], m["key"])
    pl = s["kind"] == "value"
    pr = s.get("paired")
    if pr is not None and pr["ci_low"] is not None:
        verdict = "**borderline**" if pr.get("verdict") == "borderline" else "**differs**" if pr["differs"] else "*within noise*"
        cell = f"{_signed(pr['delta'], sc, pl)} [{_signed(pr['ci_low'], sc, pl)}, {_signed(pr['ci_high'], sc, pl)}] {verdict}"
    else:
        cell = f"{_signed(d['mean'], sc, pl)} [-]"
    if d["sd"] is not None:
        cell += f"<br>sd {_fmt(d['sd'], sc, plain=pl)}"
    if pr is not None and pr["ci_low"] is not None and pr.get("p_value") is not None:  # the Monte Carlo error of the bounds and p
        mc = max(pr["ci_low_mc_se"] or 0.0, pr["ci_high_mc_se"] or 0.0)
        cell += (f"<br>MC ±{_fmt(mc, sc, 2, plain=pl)}, p {pr['p_value']:.3f} ± {pr['p_value_mc_se']:.3f}"
                 + (f" ({pr['resamples']:,} resamples)" if pr["resamples"] != resamples else ""))
    return cell


def _md_footer(report: dict) -> list[str]:
    """The notes, the machine and wall time, and the recipe that made the report."""
    lines = []
    if report["notes"]:
        lines.append("")
        lines += [f"{note}" if note.startswith(("- ", "* ")) else f"- {note}" for note in report["notes"]]
    wall = report["wall_time_s"]
    per_seed = [f"{k} {v / 60:.1f} min" for k, v in wall.items() if k.startswith("seed")]
    lines += ["", f"{_machine_in_words(report['machine'])} Wall time (sum of the commands' own times): "
                  + ", ".join(per_seed + ([f"shared {wall['shared'] / 60:.1f} min"] if wall.get("shared", 0) >= 3 else []))
                  + f"; {len(report['commands'])} commands, listed in the JSON."]
    if report["recipe"]:
        lines.append(f"Made by `{report['recipe']}` with vltool {report['vltool_version']} on {report['created'][:10]}.")
    return lines


def _machine_in_words(mach: dict) -> str:
    """The machine block in a sentence: the runs' recorded runtime (or that they recorded none)."""
    if "report_process" in mach:
        return "Machine: not recorded by the runs (made before vltool recorded its runtime)."
    if "source" not in mach:  # a report made before the machine block described the runs
        return (f"Machine: {mach.get('cpu_count')} CPU cores ({mach.get('processor')}), torch {mach.get('torch', '?')}, "
                f"{'a GPU' if mach.get('cuda') else 'no GPU'}.")

    def val(key):
        v = mach.get(key)
        return "mixed (see the JSON)" if isinstance(v, dict) else None if v is None else str(v)

    def part(template: str, *keys: str) -> str | None:  # (a fact no run recorded is left out, never shown as None)
        vals = [val(k) for k in keys]
        return template.format(*vals) if vals[0] is not None else None

    parts = [part("{} CPU cores", "cpu_count") if val("processor") is None else part("{} CPU cores ({})", "cpu_count", "processor"),
             part("torch {}", "torch"),
             part("{} torch thread(s)", "torch_threads") if val("torch_interop_threads") is None
             else part("{} torch thread(s) ({} inter-op)", "torch_threads", "torch_interop_threads"),
             part("device {}", "device"), part("{}", "dtype"),
             None if mach.get("deterministic_algorithms") is None else f"deterministic algorithms {_on_off(mach.get('deterministic_algorithms'))}"]
    shown = [p for p in parts if p]
    return f"Machine, from the runs' records: {', '.join(shown) if shown else 'none of its facts recorded'}."


def _on_off(v) -> str:
    return "on" if v is True else "off" if v is False else "mixed (see the JSON)" if isinstance(v, dict) else str(v)


def render_chart(report: dict, path: Path) -> str | None:
    """One panel per metric: a bar per variant (mean over seeds, sd as its error bar) and a dot per seed
    with that run's 95% interval; the chance level dashed. None when matplotlib is missing."""
    try:  # matplotlib is optional (and slow to import): loaded only to draw the chart
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
