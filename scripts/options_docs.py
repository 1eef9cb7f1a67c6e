"""Markdown tables of a command's options, generated from the command itself (its Typer options' help).

    python scripts/options_docs.py deform                  # print the table of `vltool deform`
    python scripts/options_docs.py --write docs/X.md       # regenerate the marked tables in docs/X.md
    python scripts/options_docs.py --check docs/*.md       # exit 1 if a marked table is out of date

A document marks a generated table with two HTML comments; everything between them is replaced:

    <!-- options: recaption -->
    <!-- /options -->

`<!-- options: pretrain --panel Loss -->` keeps only the options of one help panel (rich_help_panel);
"Options" is the panel of the options that name none. A table lists the visible options in their order
of declaration: hidden ones (old spellings kept for a release) and --help are left out.

`<!-- objectives -->` ... `<!-- /objectives -->` marks the table of `vltool pretrain`'s training objectives,
generated from their declarations (vltool.objective_specs).
tests/test_options.py checks every marked table in docs/ (python scripts/options_docs.py --check docs/*.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MARK = re.compile(r"(<!-- options: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /options -->)", re.S)
OBJECTIVES_MARK = re.compile(r"(<!-- objectives -->\n)(?P<body>.*?)(<!-- /objectives -->)", re.S)
DEFAULT_PANEL = "Options"


def command(name: str):
    """The click command of `vltool NAME`, as typer builds it (help strings as written)."""
    import typer.main

    from vltool.cli import app

    commands = typer.main.get_command(app).commands
    if name not in commands:
        raise SystemExit(f"no command {name!r}; the commands are: {', '.join(commands)}")
    return commands[name]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(param) -> str:
    if param.required:
        return "required"
    if param.show_default is False:
        return ""
    if isinstance(param.show_default, str):
        return _cell(param.show_default)
    value = param.default
    if value is None or value == [] or value == ():
        return ""
    if param.is_flag and param.secondary_opts:  # --chart/--no-chart
        return f"`{param.opts[0] if value else param.secondary_opts[0]}`"
    if param.is_flag:
        return "" if value is False else "on"
    return f"`{_cell(value)}`"


def rows(name: str, panel: str | None = None) -> list[tuple[str, str, str]]:
    """(names, default, help) of each visible option of `vltool NAME` (of one panel, when given)."""
    out = []
    for p in command(name).params:
        if p.param_type_name != "option" or getattr(p, "hidden", False) or "--help" in p.opts:
            continue
        if panel is not None and (getattr(p, "rich_help_panel", None) or DEFAULT_PANEL) != panel:
            continue
        names = ", ".join(f"`{o}`" for o in sorted(p.opts, key=len, reverse=True))
        if p.secondary_opts:
            names += " / " + ", ".join(f"`{o}`" for o in p.secondary_opts)
        out.append((names, _default(p), _cell(p.help or "")))
    return out


def table(name: str, panel: str | None = None) -> str:
    """The Markdown table of `vltool NAME`'s options (one panel's, when given), ending in a newline."""
    lines = ["| option | default | meaning |", "|---|---|---|"]
    lines += [f"| {n} | {d} | {h} |" for n, d, h in rows(name, panel)]
    return "\n".join(lines) + "\n"


def objectives_table() -> str:
    """The Markdown table of the training objectives (vltool.objective_specs), ending in a newline."""
    from vltool.objective_specs import SPECS, _opt

    lines = ["| objective | selected by | what | paper | its options | command (emoji data) |", "|---|---|---|---|---|---|"]
    for s in SPECS.values():
        options = ", ".join(f"`{_opt(o)}`" for o in s.options)
        lines.append(f"| {s.name} | `{s.selector}` | {_cell(s.help)} | {_cell(s.paper)} | {options} | `{_cell(s.example)}` |")
    return "\n".join(lines) + "\n"


def _table_for(spec: str) -> str:
    parts = spec.split()
    if len(parts) == 1:
        return table(parts[0])
    if len(parts) >= 3 and parts[1] == "--panel":
        return table(parts[0], " ".join(parts[2:]))
    raise SystemExit(f"bad marker <!-- options: {spec} -->: expected CMD or CMD --panel NAME")


def render(text: str) -> str:
    """`text` with every marked table regenerated."""
    text = MARK.sub(lambda m: m.group(1) + _table_for(m.group("spec")) + m.group(4), text)
    return OBJECTIVES_MARK.sub(lambda m: m.group(1) + objectives_table() + m.group(3), text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs="?", help="print the options table of this command")
    ap.add_argument("--panel", help="only the options of this help panel")
    ap.add_argument("--write", nargs="+", metavar="FILE", help="regenerate the marked tables in FILE(s)")
    ap.add_argument("--check", nargs="+", metavar="FILE", help="exit 1 if a marked table in FILE(s) is out of date")
    args = ap.parse_args(argv)
    if args.command:
        sys.stdout.write(table(args.command, args.panel))
        return 0
    stale = []
    for f in args.write or args.check or []:
        path = Path(f)
        old = path.read_text()
        new = render(old)
        if new != old:
            if args.write:
                path.write_text(new)
                print(f"wrote {path}")
            else:
                stale.append(str(path))
    if stale:
        print(f"out of date (run python scripts/options_docs.py --write {' '.join(stale)}): {', '.join(stale)}", file=sys.stderr)
        return 1
    if not (args.write or args.check):
        ap.error("give a command, --write FILE or --check FILE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
