"""Every third-party module that vltool, its tests, bench/ and scripts/ import is installed.

The modules are collected from the source (every `import X.Y` and `from X.Y import z`, and every
`pytest.importorskip("X.Y")`), and each is imported in a fresh interpreter, so that a missing install step
fails this one test with the module's name and the file that needs it, rather than several tests scattered
over the suite (issue 43: `requests`, which clip_benchmark's dataset builder imports, was missing from a
fresh virtual environment, and `.ci/run`, installing into a machine's Python that had it, could not see it).

Imports inside a `try` whose handler catches ImportError are optional by design (TensorBoard, say) and are
left out, as are the standard library, vltool itself and the tests' own helper modules.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("vltool", "tests", "bench", "scripts")
LOCAL = {"vltool", "tests", "bench", "scripts", "conftest"}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = []
    if handler.type is None:
        return True
    for node in ast.walk(handler.type):
        if isinstance(node, ast.Name):
            names.append(node.id)
    return bool({"ImportError", "ModuleNotFoundError", "Exception"} & set(names))


def _optional_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a `try` body whose handlers catch ImportError."""
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                for sub in ast.walk(stmt):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        optional.add(id(sub))
    return optional


def third_party_imports() -> dict[str, str]:
    """{dotted module name: the first file (relative to the repository) that imports it}."""
    # scripts in tests/, bench/ and scripts/ import their neighbours by bare name (e.g. `tiny_models`); vltool's own
    # modules are always imported as `vltool.X`, so their file names (importer/clip_benchmark.py) are not local names
    local_modules = {p.stem for d in ("tests", "bench", "scripts") for p in (ROOT / d).glob("*.py")}
    found: dict[str, str] = {}
    for d in SOURCES:
        for path in sorted((ROOT / d).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            optional = _optional_nodes(tree)
            names = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import) and id(node) not in optional:
                    names += [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and id(node) not in optional:
                    names.append(node.module)
                elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args and isinstance(node.args[0], ast.Constant):
                    names.append(node.args[0].value)  # a skip would hide a missing oracle: it must be installed
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in LOCAL or top in local_modules or top == "__future__":
                    continue
                found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_the_collector_sees_the_imports_that_matter():
    found = third_party_imports()
    # the dependencies every command uses, and the oracle's builder that needed `requests`
    for name in ("torch", "transformers", "open_clip", "datasets", "accelerate", "faiss", "typer", "clip_benchmark.webdataset_builder"):
        assert name in found, name
    assert not any(n.split(".")[0] in {"os", "json", "vltool", "tests"} for n in found)


def test_every_third_party_module_imports_in_a_fresh_interpreter():
    found = third_party_imports()
    script = (
        "import importlib, json, sys\n"
        "failed = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as e:\n"
        "        failed[name] = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps(failed))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, json.dumps(sorted(found))], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    lines = [f"{name} (imported by {found[name]}): {why}" for name, why in sorted(failed.items())]
    assert not failed, "modules that do not import; install them in scripts/install.sh or pyproject.toml:\n" + "\n".join(lines)
