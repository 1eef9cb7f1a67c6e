"""The results tables on the pages (docs/reproductions.md, and README.md if it holds one) are the committed
results/*.md, copied by scripts/readme_results.py; the README's hand-written summary quotes them exactly."""

import importlib.util
import json
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
    # a report written from runs that record their runtime words its machine line "Machine, from the runs' records"
    (tmp_path / "demo.md").write_text("# New title\n\n| a |\n|---|\n| 3 |\n\nMachine, from the runs' records: x.\nMade by y.\n")
    assert _module().sync(readme, tmp_path) == (
        "intro\n\n**New title** (`results/demo.md`, chart `results/demo.png`)\n\n"
        "| a |\n|---|\n| 3 |\n\nMachine, from the runs' records: x.\n\nWhat we see: commentary.\n")


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
    """Every relative Markdown link in README.md, CHANGELOG.md and docs/*.md names a file that exists and,
    with #anchor, one of its headings; every docs/NAME.md the pages mention exists (sections moved off the
    README, details the CHANGELOG's entries link)."""
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]:
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
    # issue 54: how to run the tests lives in docs/testing.md, which the README links.
    assert "docs/testing.md" in readme
    testing = (ROOT / "docs" / "testing.md").read_text()
    assert "python -m pytest" in testing and 'python -m pytest -m "slow or recipes"' in testing


# ---------------------------------------------------------------------------------------------------
# issue 42: the README's sentences about where the differences hold, computed from results/*.json
# ---------------------------------------------------------------------------------------------------

def _comparisons(path: Path) -> tuple[list[dict], int]:
    """The report's paired differences that have a verdict across styles, each comparison once (a --pair
    contrast that repeats a variant's own comparison with the baseline is the same comparison), and how
    many repeats were left out."""
    r = json.loads(path.read_text())
    labels = {v["name"]: v["label"] for v in r["variants"]}
    metric_labels = {m["name"]: m["label"] for m in r["metrics"]}
    entries = [(v["name"], r["baseline"], v["summary"]) for v in r["variants"] if v["name"] != r["baseline"]]
    entries += [(c["name"], c["reference"], c["summary"]) for c in r.get("contrasts") or []]
    seen, out, repeats = set(), [], 0
    for name, ref, summary in entries:
        for metric, s in summary.items():
            if "styles" not in s:
                continue
            if (name, ref, metric) in seen:
                repeats += 1
                continue
            seen.add((name, ref, metric))
            out.append({"file": path.stem, "label": labels[name], "reference": labels[ref], "metric": metric_labels[metric],
                        "name": metric, "verdict": s["styles"]["verdict"], "summary": summary})
    return out, repeats


def _all_comparisons() -> tuple[list[dict], int]:
    comps, repeats = [], 0
    for path in sorted((ROOT / "results").glob("*.json")):
        if "variants" in json.loads(path.read_text()):
            c, n = _comparisons(path)
            comps += c
            repeats += n
    return comps, repeats


def _where_it_holds_paragraph() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Reproductions\n", 1)[1].split("\n## ", 1)[0]
    par = next(p for p in section.split("\n\n") if p.startswith("Where the differences hold"))
    return " ".join(par.split())


WORDS = {0: "none", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


def test_readme_tally_counts_each_comparison_once():
    comps, repeats = _all_comparisons()
    kinds = ("neither style", "Noto only", "both styles", "OpenMoji only", "opposite signs")
    n = {v: sum(c["verdict"] == v for c in comps) for v in kinds}
    borderline = [c for c in comps if "borderline" in c["verdict"]]  # unsettled in a style: "<settled>; <style> borderline"
    assert sum(n.values()) + len(borderline) == len(comps), {c["verdict"] for c in comps} - set(kinds)  # a new kind needs words
    opposite = "none with opposite signs" if not n["opposite signs"] else f"{n['opposite signs']} with opposite signs"
    text = _where_it_holds_paragraph()
    assert (f"over the {len(comps)} distinct paired differences in results/*.json that have an OpenMoji twin (each summary's "
            f"`styles.verdict`; the {repeats} `--pair` contrasts that repeat a variant's own comparison with the baseline are "
            f"counted once): {n['neither style']} in neither style, {n['Noto only']} in Noto's only, {n['both styles']} in both, "
            f"{n['OpenMoji only']} in OpenMoji's only, {WORDS[len(borderline)]} borderline in a style, {opposite}.") in text
    for c in borderline:  # each borderline comparison is named with its reference, and its verdict in both styles
        assert f"{c['label']} against {c['reference']}, {c['metric']} ({c['verdict']}" in text, c
    assert f"Of the {WORDS[n['both styles']]} that hold in both styles" in text
    assert f"The {WORDS[n['OpenMoji only']]} in OpenMoji's only" in text


def test_readme_names_every_difference_that_holds_in_both_styles_or_in_openmoji_only():
    """Each comparison that holds in both styles, or in OpenMoji's only, is named in the paragraph by its
    variant's label and its metric's, and no other variant is said to hold there."""
    comps, _ = _all_comparisons()
    text = _where_it_holds_paragraph()
    both = [c for c in comps if c["verdict"] == "both styles"]
    only = [c for c in comps if c["verdict"] == "OpenMoji only"]
    for c in both + only:
        assert c["label"] in text and c["metric"] in text, c
    for c in both:  # the variant and its metrics in one phrase: "LABEL (METRIC, METRIC)" or "A − B on METRIC"
        metrics = [x["metric"] for x in both if (x["label"], x["reference"]) == (c["label"], c["reference"])]
        named = f"{c['label']} ({', '.join(metrics)})" in text or f"{c['label']} ({'; '.join(metrics)})" in text \
            or f"{c['label']} − {c['reference']} on {c['metric']}" in text
        assert named, c
    assert {c["file"] for c in both} == {"clip-lite", "unicl"}
    # the README's claim about the JSD rows at equal data is the contrast's verdict
    eq = next(c for c in comps if c["label"] == "JSD, 25%" and c["reference"] == "InfoNCE, 25%" and c["metric"] == "ZS top-1")
    assert eq["verdict"] == "neither style" and "JSD, 25% − InfoNCE, 25% is within noise on zero-shot in both styles" in text
    assert {c["verdict"] for c in comps if c["label"] == "JSD, 25%" and c["reference"] == "InfoNCE, 25%" and "R@1" in c["metric"]} == {"Noto only"}


def _cell(s: dict) -> str:
    """A paired difference as the README's summary quotes it: "Δ [low, high]; sd" in points."""
    from vltool.report import _fmt, _signed

    p = s["paired"]
    return f"{_signed(p['delta'], 100.0, False)} [{_signed(p['ci_low'], 100.0, False)}, {_signed(p['ci_high'], 100.0, False)}]; " \
           f"sd {_fmt(s['delta_vs_baseline']['sd'], 100.0)}"


def test_readme_summary_rows_hold_where_their_json_says_and_the_sentence_counts_them():
    """Each paired row's "Holds in" is the styles verdict of the JSON comparison whose two cells it quotes;
    the last sentence of the paragraph counts the rows by it."""
    comps, _ = _all_comparisons()
    verdicts = []
    for row in _summary_rows():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if not re.fullmatch(r"[+−]\d+(?:\.\d+)? \[[^\]]+\]; sd [\d.]+", cells[3]):
            continue
        name = re.search(r"`results/([\w.-]+)\.md`", cells[0])[1]
        found = set()
        for c in comps:
            if c["file"] != name:
                continue
            twin = next((k for k, s in c["summary"].items() if k != c["name"] and k.replace("-style2", "") == c["name"]), None)
            s, t = c["summary"][c["name"]], c["summary"].get(twin, {})
            if s.get("paired") and t.get("paired") and (_cell(s), _cell(t)) == (cells[3], cells[5]):
                found.add(c["verdict"])
        assert len(found) == 1, row
        assert cells[7] == found.pop(), row
        verdicts.append(cells[7])
    text = _where_it_holds_paragraph()
    n = {v: verdicts.count(v) for v in ("neither style", "Noto only", "OpenMoji only", "both styles")}
    assert sum(n.values()) == len(verdicts)
    assert (f"Of the {len(verdicts)} paired rows of the table above, {n['neither style']} are within noise in both styles, "
            f"{n['Noto only']} differ in Noto's only, {n['OpenMoji only']} in OpenMoji's only") in text
    assert f"and {n['both styles']} in both" in text


def test_reproductions_page_claims_where_the_differences_hold():
    """The docs/reproductions.md sentences that count where a recipe's differences hold."""
    page = " ".join((ROOT / "docs" / "reproductions.md").read_text().split())

    def verdicts(*names):
        return [c["verdict"] for n in names for c in _comparisons(ROOT / "results" / f"{n}.json")[0]]

    cw = verdicts("caption-worth", "caption-worth-filter")
    assert cw.count("OpenMoji only") == 1 and set(cw) == {"neither style", "OpenMoji only"}
    assert "No difference holds in both styles, none in Noto's alone, and none has opposite signs" in page
    fff = [c for n in ("fff", "fff-terms", "fff-batch") for c in _comparisons(ROOT / "results" / f"{n}.json")[0]]
    assert not any(c["summary"][c["name"]]["styles"]["by_style"]["OpenMoji"] in ("up", "down") for c in fff)
    assert "none of them excludes 0 in any of the three reports" in page
    assert "opposite signs" not in verdicts("clip-lite", "clip-lite-batch", "clip-lite-negatives")
    assert "No difference in the three reports has opposite signs" in page
    unicl_both = {(c["label"], c["metric"]) for n in ("unicl", "unicl-labels") for c in _comparisons(ROOT / "results" / f"{n}.json")[0]
                  if c["verdict"] == "both styles"}
    assert unicl_both == {("UniCL, image-label rows (seen subgroups)", "ZS top-1, seen subgroups"), ("UniCL, both (balanced)", "ZS top-1, seen subgroups")}
    assert "The only effects that hold in both styles: the seen subgroups." in page
    (retrieval,) = [c for c in _comparisons(ROOT / "results" / "unicl.json")[0]
                    if (c["label"], c["metric"]) == ("UniCL, image-label rows (seen subgroups)", "I→T R@1")]
    assert retrieval["verdict"] == "Noto only" and "in OpenMoji's −1.0 [−2.2, +0.0] is within noise, p 0.029" in page
    eq = next(c for c in _comparisons(ROOT / "results" / "clip-lite.json")[0]
              if (c["label"], c["reference"], c["metric"]) == ("JSD, 25%", "InfoNCE, 25%", "ZS top-1"))
    quoted = _cell(eq["summary"][eq["name"]]).split(";")[0]
    assert eq["verdict"] == "neither style" and quoted == "−2.6 [−6.1, +0.1]"
    assert f"at equal data (JSD, 25% − InfoNCE, 25%) zero-shot is {quoted}, within noise in both styles" in page
    assert "JSD, 25% − InfoNCE, 25% is within noise on zero-shot in both styles" in _where_it_holds_paragraph()


def test_a_page_states_the_reports_captions_once_and_keeps_what_varies_under_each_table():
    """The captions every report repeats (DIFFERENCE, ACROSS) are on the page once, in "How to read the
    tables"; under each table the short form keeps the baseline, seeds, resamples and styles, so the
    report's own caption is rebuilt from it exactly."""
    module = _module()
    page = (ROOT / "docs" / "reproductions.md").read_text()
    stated = {module.DIFFERENCE: dict(base="B", seeds="S", union="", resamples="R"), module.ACROSS: dict(styles="STYLES")}
    for template, fields in stated.items():
        assert page.count(template.format(**fields)) == 1, template[:40]
    assert "\n## How to read the tables\n" in page
    shortened = 0
    for md in sorted((ROOT / "results").glob("*.md")):
        for line in md.read_text().splitlines():
            if not line.startswith(("Difference from **", "Across styles (")):
                continue
            short = module.shorten(line)
            assert short != line, f"{md.name}: a caption the page does not state: {line[:60]}"
            (template, short_form), = [(t, s) for t, s in ((module.DIFFERENCE, module.DIFFERENCE_SHORT),
                                                            (module.ACROSS, module.ACROSS_SHORT)) if line.startswith(t[:10])]
            assert template.format(**module._pattern(short_form).match(short).groupdict()) == line, md.name
            shortened += 1
    assert shortened >= 28
    for line in page.splitlines():  # no table on the page repeats a caption in full
        assert not any(pattern.match(line) for pattern, _ in module.SHORTEN), line[:60]
