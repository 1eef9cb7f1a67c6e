"""The README's Reproductions tables are the committed results/*.md, copied by scripts/readme_results.py."""

import importlib.util
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


def test_readme_shows_the_committed_results():
    readme = (ROOT / "README.md").read_text()
    assert _module().sync(readme, ROOT / "results") == readme, "run: python scripts/readme_results.py"
