"""The results tables on the pages (docs/reproductions.md, and README.md if it holds one) are the committed
results/*.md, copied by scripts/readme_results.py; the README's hand-written summary quotes them exactly."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("readme_results", ROOT / "scripts" / "readme_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sync_replaces_only_the_table_block(tmp_path):
    (tmp_path / "demo.md").write_text("# New title\n\nSeeds 0, 1, 2: ...\n\n| a |\n|---|\n| 2 |\n\n"
                                      "Machine: new.\nMade by `recipes/demo.sh`.\n")
    readme = ("intro\n\n**Old title** (`results/demo.md`, chart `results/demo.png`)\n\nSeeds 0: ...\n\n"
              "| a |\n|---|\n| 1 |\n\nMachine: old.\n\nWhat we see: commentary.\n")
    assert _module().sync(readme, tmp_path) == (
        "intro\n\n**New title** (`results/demo.md`, chart `results/demo.png`)\n\nSeeds 0, 1, 2: ...\n\n"
        "| a |\n|---|\n| 2 |\n\nMachine: new.\n\nWhat we see: commentary.\n")


def test_every_page_shows_the_committed_results():
    module = _module()
    pages = module.pages()
    assert ROOT / "docs" / "reproductions.md" in pages
    for page in pages:
        text = page.read_text()
        assert module.sync(text, ROOT / "results") == text, f"{page.name}: run python scripts/readme_results.py"


def test_every_recipe_table_is_on_a_page():
    # quickstart.md is the README's quick start, quoted there in its own words rather than as a table block.
    module = _module()
    shown = [name for page in module.pages() for name in module.table_names(page.read_text())]
    committed = {p.stem for p in (ROOT / "results").glob("*.md")} - {"quickstart"}
    assert sorted(shown) == sorted(committed)


def _summary_rows():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Reproductions\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "`results/" in line]


def test_readme_summary_quotes_its_results_exactly():
    """Each number in a row of the README's summary is in the results/*.md the row names, and each
    "Δ [interval]; sd" is one cell of that file's paired table with the verdict the row gives it."""
    rows = _summary_rows()
    assert len(rows) >= 6
    number = re.compile(r"[+−-]?\d+(?:,\d{3})*(?:\.\d+)?")
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        name = re.search(r"`results/([\w.-]+)\.md`", cells[0])[1]
        md = (ROOT / "results" / f"{name}.md").read_text()
        quoted = re.sub(r"`results/[\w.-]+\.md`", "", re.sub(r"\]\([^)]*\)", "]", row))
        assert [n for n in number.findall(quoted) if n not in md] == [], row
        # Noto's (the training style) and OpenMoji's difference, each with its verdict, then where it holds
        for delta, verdict_cell in ((cells[3], cells[4]), (cells[5], cells[6])):
            paired = re.fullmatch(r"([+−]\d+(?:\.\d+)? \[[^\]]+\]); sd ([\d.]+)", delta)
            if paired:
                verdict = "**differs**" if verdict_cell.startswith("**differs**") else "*within noise*"
                assert verdict_cell.startswith(verdict)
                assert f"{paired[1]} {verdict}<br>sd {paired[2]}" in md, row
        if re.fullmatch(r"(both styles|neither style|opposite signs|Noto only|OpenMoji only)", cells[7]):
            assert f"| {cells[7]} (Noto" in md, row


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_pages_resolve():
    """Every relative Markdown link in README.md and docs/*.md names a file that exists and, with #anchor,
    one of its headings; every docs/NAME.md the pages mention exists (sections moved off the README)."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name}: {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{page.name}: {target}"
        for mentioned in re.findall(r"\bdocs/[\w.-]+\.md", text):
            assert (ROOT / mentioned).exists(), f"{page.name}: {mentioned}"


def test_readme_is_a_front_page():
    # issue 34: the README keeps what gets a newcomer started; the long sections live in docs/.
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 350
    assert "python -m pytest" in readme and 'python -m pytest -m "slow or recipes"' in readme
