"""The repository is self-contained: no document, recipe or module points outside it, and the papers are
cited through docs/papers.md.

A user who clones the repository has none of the paths the project was developed beside (a sibling
`../shared` folder, `/work/...`, someone's home directory), so a doc that sends the reader there, or code
that reads from there, is broken for everyone else. `~/.cache/...` is the user's own home and stays
allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A path outside the repository: the sibling folder the papers were kept in, the development machine's
# work tree, or an absolute home directory (Linux, root, macOS, Windows). Not preceded by a word
# character, so a URL such as https://example.org/work/ is not taken for one.
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w.-])/work/|(?<![\w.-])/home/\w|(?<![\w.-])/root/|"
                     r"(?<![\w.-])/Users/\w|[A-Za-z]:\\Users\\")

PAPERS = ("A Fistful of Words", "UniCL", "Is a Caption Worth a Thousand Images", "CLIP-Lite", "FFF")


def checked_files(root: Path = ROOT) -> list[Path]:
    """README.md, docs/*.md, recipes/*.sh, and every Python file of vltool/, bench/ and scripts/."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "recipes").glob("*.sh"))]
    for folder in ("vltool", "bench", "scripts"):
        files += sorted((root / folder).rglob("*.py"))
    return [f for f in files if f.is_file()]


def outside_paths(files: list[Path], root: Path = ROOT) -> list[str]:
    """`FILE:LINE: text` for every line that names a path outside the repository."""
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_document_recipe_or_module_points_outside_the_repository():
    found = outside_paths(checked_files())
    assert not found, "paths outside the repository (cite docs/papers.md, or a path below the repository):\n" + \
        "\n".join(found)


def test_the_check_names_the_file_and_the_line(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "recipes").mkdir()
    (tmp_path / "vltool" / "sub").mkdir(parents=True)
    (tmp_path / "README.md").write_text("See docs/papers.md.\nThe papers: `../shared/papers/README.md`.\n")
    (tmp_path / "docs" / "a.md").write_text("Cache: `~/.cache/vltool`; https://example.org/work/x\n")
    (tmp_path / "recipes" / "r.sh").write_text("#!/bin/bash\nDATA=/work/main/emoji\n")
    (tmp_path / "vltool" / "sub" / "m.py").write_text('X = 1\n\nP = "/home/alice/data"\nQ = "/root/x"\n')
    assert outside_paths(checked_files(tmp_path), tmp_path) == [
        "README.md:2: The papers: `../shared/papers/README.md`.",
        "recipes/r.sh:2: DATA=/work/main/emoji",
        'vltool/sub/m.py:3: P = "/home/alice/data"',
        'vltool/sub/m.py:4: Q = "/root/x"',
    ]


def test_papers_page_gives_every_paper_a_reference():
    page = (ROOT / "docs" / "papers.md").read_text()
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert len(headings) == len(PAPERS)
    for paper in PAPERS:
        assert any(paper in heading for heading in headings), paper
    # Each paper's entry names what vltool takes from it and the sections the docs cite.
    entries = page.split("\n## ")[1:]
    for entry in entries:
        assert "**What vltool takes:**" in entry and "**Cited:**" in entry, entry.splitlines()[0]
    assert len(re.findall(r"arXiv:\d{4}\.\d{5}", page)) >= 3


# A citation: a paper named on a line that also names one of its sections, tables, appendices, ...
CITATION = re.compile(r"\b(?:sections?|tables?|appendix|appendices|algorithm|equations?|eq\.|figure)\s+(?:[A-Z]\.)?\d",
                      re.IGNORECASE)


def citing_pages(pages: list[Path]) -> list[Path]:
    """The pages with a line that names one of the five papers and a section, table, appendix, ... of it."""
    return [page for page in pages
            if any(CITATION.search(line) and any(paper in line for paper in PAPERS)
                   for line in page.read_text().splitlines())]


def test_every_page_that_cites_a_paper_links_the_papers_page():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = citing_pages(pages)
    assert ROOT / "docs" / "evaluation.md" in cited and ROOT / "README.md" in cited
    missing = [str(page.relative_to(ROOT)) for page in cited
               if page.name != "papers.md" and "papers.md" not in page.read_text()]
    assert not missing, f"these pages cite a paper but do not link docs/papers.md: {missing}"
