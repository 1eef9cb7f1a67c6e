"""Copy the committed recipe tables (results/*.md) into the pages that show them.

The pages are README.md and docs/*.md; today the tables are on docs/reproductions.md, and the README holds a
hand-written summary of them (tests/test_readme_results.py checks its numbers). Every table on a page starts
with a line

    **<title>** (`results/<name>.md`, chart `results/<name>.png`)

and runs to its "Machine: ..." (or "Machine, from the runs' records: ...") line. This script replaces each such block with the body of
`results/<name>.md` (everything between its "# title" line and its "Machine: ..." line, inclusive), so that
the page shows exactly what `vltool report` wrote, but for two captions the report repeats under every table
(DIFFERENCE, ACROSS): the page states each once, in its "How to read the tables" section, and under each
table keeps only what varies (the baseline, the seeds, the resamples, the styles). The commentary around the
tables is left alone.

    python scripts/readme_results.py           # rewrite the pages in place
    python scripts/readme_results.py --check   # exit 1 if a page and results/ disagree
"""

from __future__ import annotations

import re
import string
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MACHINE = ("Machine: ", "Machine, ")  # a report's last table line: the machine, as older or newer reports word it
HEADER = re.compile(r"^\*\*(?P<title>.+)\*\* \(`results/(?P<name>[\w.-]+)\.md`(?P<rest>.*)\)$")


# The captions `vltool report` writes (vltool/report_render.py) above its paired and across-styles tables, with
# what varies from report to report in braces, and the short form a page keeps under each table.
HOW_TO_READ = "[How to read the tables](#how-to-read-the-tables)"
DIFFERENCE = ("Difference from **{base}** on the same test examples, Δ = the mean over seeds {seeds} of (variant − {base}), "
              "with its 95% paired bootstrap interval (each resample draws whole base_id groups of test images, not stratified "
              "by class, both variants alike, and the seeds with replacement, so the interval covers the test set and the "
              "training noise): **differs** when the interval excludes 0, else *within noise*. Below it, the sd of the "
              "per-seed differences.{union} Each interval is read from {resamples}; below the sd, MC ± is the larger Monte "
              "Carlo standard error of the two bounds and p the bootstrap p-value (the share of resamples at or beyond 0) "
              "with its own: **borderline** when p is within 2 of them of 0.025 even at the most resamples.")
DIFFERENCE_SHORT = "Difference from **{base}** on the same test examples, seeds {seeds}, read as in " + HOW_TO_READ + \
                   ".{union} Each interval is read from {resamples}."
ACROSS = ("Across styles ({styles}: the same test examples drawn in each): where each difference above differs from 0, by "
          "its paired interval in each style. ↑ / ↓: differs, up or down; –: within noise; ≈: borderline. *NAME only*: a "
          "difference that holds in that style alone.")
ACROSS_SHORT = "Across styles ({styles}), read as in " + HOW_TO_READ + "."


def _pattern(template: str) -> re.Pattern:
    """A template's text, its {fields} as groups (a field's second use must repeat its first)."""
    out, seen = "", set()
    for literal, field, _, _ in string.Formatter().parse(template):
        out += re.escape(literal)
        if field:
            out += f"(?P={field})" if field in seen else f"(?P<{field}>.*?)"
            seen.add(field)
    return re.compile(out + "$")


SHORTEN = [(_pattern(DIFFERENCE), DIFFERENCE_SHORT), (_pattern(ACROSS), ACROSS_SHORT)]


def shorten(line: str) -> str:
    """A report's line as a page shows it: a caption the page states once, cut to what varies; any other line as is."""
    for pattern, short in SHORTEN:
        match = pattern.match(line)
        if match:
            return short.format(**match.groupdict())
    return line


def table_block(md: str) -> tuple[str, list[str]]:
    """(title, the lines from after the "# title" line to the "Machine:" line inclusive) of a results .md."""
    lines = md.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError("a results .md starts with '# <title>'")
    end = next((i for i, line in enumerate(lines) if line.startswith(MACHINE)), None)
    if end is None:
        raise ValueError("a results .md has a 'Machine: ...' line")
    return lines[0][2:], lines[1:end + 1]


def table_names(page: str) -> list[str]:
    """The results/<name>.md tables a page holds, in order."""
    return [m["name"] for m in map(HEADER.match, page.splitlines()) if m]


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md page that holds at least one results table."""
    candidates = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [p for p in candidates if p.exists() and table_names(p.read_text())]


def sync(readme: str, results: Path, page: str = "README") -> str:
    """The page's text with every results table replaced by the current results/<name>.md."""
    lines = readme.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = HEADER.match(lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        name = match["name"]
        title, body = table_block((results / f"{name}.md").read_text())
        out.append(f"**{title}** (`results/{name}.md`{match['rest']})")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(MACHINE)), None)
        if end is None:
            raise ValueError(f"{page}: the table of results/{name}.md has no 'Machine: ...' line")
        out.extend(map(shorten, body))
        i = end + 1
    return "\n".join(out) + ("\n" if readme.endswith("\n") else "")


def main(argv: list[str]) -> int:
    stale = []
    for path in pages():
        rel = path.relative_to(ROOT)
        text = path.read_text()
        new = sync(text, ROOT / "results", str(rel))
        if new == text:
            continue
        stale.append(rel)
        if "--check" not in argv:
            path.write_text(new)
            print(f"{rel}: tables updated from results/")
    if "--check" in argv and stale:
        print(f"{', '.join(map(str, stale))}: tables differ from results/*.md: run python scripts/readme_results.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
