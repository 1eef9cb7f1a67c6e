"""vltool's modules import one another without a cycle, and only downward through the layers that
docs/where-things-are.md draws (its "Layers" block, read here) and the orders the packages' docstrings state.

The graph is read from the source, not from an import: every `vltool/**/*.py` is parsed with `ast`, and
every `import vltool.x`, `from vltool.x import y`, `from vltool import x` and relative import is an edge,
wherever it is written (module level, inside a function, under `if TYPE_CHECKING:`). A lazy import
inside a function still ties the two modules together, so it counts.

Nodes are dotted module names: `vltool.x` for `vltool/x.py`, `vltool.p` for a package's
`vltool/p/__init__.py`, `vltool.p.x` for `vltool/p/x.py`. An import resolves to the longest dotted name
that is a node: `from vltool.pretrain import config` is an edge to the submodule `vltool.pretrain.config`
when there is one, else to `vltool.pretrain` (the name is then something the package defines);
`from vltool import __version__` is an edge to `vltool`. Importing a submodule is not counted as an edge
to its parent package (Python imports the parent first, but the parent does not depend on the child).

Nothing is left out of the graph: `vltool/cli.py` and `vltool/commands/*` are nodes like the others
(they are the top layer; nothing below imports them).

A cycle anywhere fails `test_no_import_cycle`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "vltool"
ROOT = "vltool"
MAP = PACKAGE_DIR.parent / "docs" / "where-things-are.md"


def module_files() -> dict[str, Path]:
    """Dotted name -> file of every module of the vltool package (a package's __init__ wins over a
    same-named module, as it does when Python imports)."""
    files: dict[str, Path] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        parts = list(rel.parts)
        is_init = parts[-1] == "__init__"
        if is_init:
            parts = parts[:-1]
        if not all(p.isidentifier() for p in parts):
            continue  # not importable (a data directory)
        name = ".".join(parts)
        if name in files and not is_init:
            continue
        files[name] = path
    return files


def _resolve(name: str, nodes: set[str]) -> str | None:
    """The longest prefix of `name` that is a module of vltool."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in nodes:
            return candidate
    return None


def imports_of(module: str, path: Path, nodes: set[str]) -> dict[str, int]:
    """The vltool modules `module` imports -> the line of the first such import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out: dict[str, int] = {}

    def add(target: str | None, line: int) -> None:
        if target is not None and target != module:
            out[target] = min(line, out.get(target, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    add(_resolve(alias.name, nodes), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package, up level - 1 packages
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == ROOT or source.startswith(ROOT + ".")):
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in nodes else _resolve(source, nodes), node.lineno)
    return out


def import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    files = module_files()
    nodes = set(files)
    return {m: imports_of(m, p, nodes) for m, p in files.items()}, files


def find_cycle(graph: dict[str, dict[str, int]], skip=lambda m: False) -> list[str] | None:
    """One cycle of the graph (without the nodes `skip` accepts) as [a, b, ..., a], or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {m: WHITE for m in graph if not skip(m)}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        colour[m] = GREY
        stack.append(m)
        for t in sorted(graph[m]):
            if t not in colour:
                continue
            if colour[t] == GREY:
                return stack[stack.index(t):] + [t]
            if colour[t] == WHITE:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        colour[m] = BLACK
        return None

    for m in sorted(colour):
        if colour[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, int]], files: dict[str, Path]) -> str:
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        where = files[a].relative_to(PACKAGE_DIR.parent)
        steps.append(f"  {a} -> {b}   ({where}:{graph[a][b]})")
    return "import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(steps)


# ------------------------------------------------------------------------------------------------ the graph


def test_the_graph_sees_lazy_relative_and_package_imports(tmp_path):
    nodes = {"vltool", "vltool.a", "vltool.b", "vltool.p", "vltool.p.x", "vltool.p.y"}
    src = tmp_path / "x.py"
    src.write_text(
        "from vltool import __version__\n"
        "def f():\n"
        "    from vltool.a import thing\n"
        "    import vltool.b\n"
        "from vltool.p import y, helper\n"
        "from . import y as again\n"
        "from .. import a\n"
    )
    assert imports_of("vltool.p.x", src, nodes) == {"vltool": 1, "vltool.a": 3, "vltool.b": 4, "vltool.p.y": 5, "vltool.p": 5}
    cycle = find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}})
    assert cycle == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}}) is None


def test_every_vltool_import_names_a_module_of_vltool():
    files = module_files()
    assert {"vltool", "vltool.cli", "vltool.evaluation", "vltool.subspace", "vltool.topology"} <= set(files)
    graph, _ = import_graph()
    assert any(graph[m] for m in graph)  # the parser found imports at all


# ------------------------------------------------------------------------------------------------ the layering


def test_no_import_cycle():
    """No cycle at all (the pretrain package's rebuild, once tolerated here, is done)."""
    graph, files = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, describe(cycle, graph, files)


def test_leaf_modules_import_no_other_vltool_module_but_leaves():
    """The modules that break the old cycles stay leaves: open_clip_parts and errors import no vltool module,
    topology and subspace only vltool.errors, transforms only open_clip_parts."""
    graph, _ = import_graph()
    assert graph["vltool.errors"] == {}
    assert set(graph["vltool.topology"]) <= {"vltool.errors"}
    assert graph["vltool.open_clip_parts"] == {}
    assert set(graph["vltool.transforms"]) <= {"vltool.open_clip_parts"}
    assert set(graph["vltool.subspace"]) <= {"vltool.errors"}
    assert "vltool.evaluation" not in graph["vltool.encode"]
    assert "vltool.debias" not in graph["vltool.evaluation"]


def package_doc(package: str) -> str:
    return ast.get_docstring(ast.parse((PACKAGE_DIR / package / "__init__.py").read_text(encoding="utf-8"))) or ""


# vltool/io/: one module per concern, in the order its __init__'s docstring states (each imports only those before it)
IO_ORDER = re.search(r"^Import order inside the package[^:]*: ([\w, ]+)\.$", package_doc("io"), re.M).group(1).split(", ")


def test_io_modules_import_only_the_io_modules_before_them():
    graph, files = import_graph()
    io_modules = {m for m in files if m.startswith("vltool.io.")}
    assert io_modules == {f"vltool.io.{m}" for m in IO_ORDER}, "a new vltool/io/ module needs its place in IO_ORDER"
    for i, short in enumerate(IO_ORDER):
        inside = {t for t in graph[f"vltool.io.{short}"] if t == "vltool.io" or t.startswith("vltool.io.")}
        assert inside <= {f"vltool.io.{m}" for m in IO_ORDER[:i]}, f"vltool.io.{short} imports {sorted(inside)}"
        assert ast.get_docstring(ast.parse(files[f"vltool.io.{short}"].read_text(encoding="utf-8"))), f"vltool.io.{short}: no docstring saying its concern"


# The vltool.model package, bottom to top, as its __init__'s docstring lists it ("    name.py   concern"): a module
# imports only modules before it, never the package's __init__ (which re-exports them all).
MODEL_LAYERS = re.findall(r"^    (\w+)\.py  ", package_doc("model"), re.M)


def test_the_model_package_imports_only_downward():
    graph, files = import_graph()
    modules = sorted(m for m in files if m.startswith("vltool.model."))
    assert modules == sorted(f"vltool.model.{n}" for n in MODEL_LAYERS)  # a new module gets its place in the list
    for i, name in enumerate(MODEL_LAYERS):
        module = f"vltool.model.{name}"
        below = {f"vltool.model.{n}" for n in MODEL_LAYERS[:i]}
        inside = {t for t in graph[module] if t == "vltool.model" or t.startswith("vltool.model.")}
        assert inside <= below, f"{module} imports {sorted(inside - below)}, which are not below it in MODEL_LAYERS"
        assert ast.get_docstring(ast.parse(files[module].read_text(encoding="utf-8"))), f"{module} opens with no docstring of its concern"


# ------------------------------------------------------------------------------------------------ the map's layers


def map_layers(text: str) -> list[list[str]]:
    """The module names of each layer of the map's "Layers" block, top to bottom: the left column of the
    block (as wide as its first line's), layers split by a line holding only `|`."""
    block = re.search(r"^## Layers\n\n```\n(.*?)\n```", text, re.S | re.M)
    assert block, f"{MAP.name}: no ```-fenced block under '## Layers'"
    lines = block.group(1).splitlines()
    width = re.search(r"\S\s{2,}", lines[0]).end()
    layers: list[list[str]] = [[]]
    for line in lines:
        if line.strip() == "|":
            layers.append([])
        else:
            layers[-1] += [t.strip() for t in line[:width].split(",") if t.strip()]
    return layers


COMMAND = "vltool/<command>.py"  # the map's name for every top-level module it places nowhere else


def layer_of(layers: list[list[str]], files: dict[str, Path]) -> dict[str, int]:
    """Module -> its layer's index (0 = top). A name is `vltool/x.py` or, after the first, `x.py`; `vltool/p/`
    or `vltool/p/*.py` is a package with its modules. Every name must be a module of vltool."""
    where: dict[str, int] = {}
    wildcard = None
    for i, names in enumerate(layers):
        for name in names:
            if name == COMMAND:
                wildcard = i
                continue
            path = name if name.startswith("vltool/") else f"vltool/{name}"
            dotted = re.sub(r"(/\*\.py|/|\.py)$", "", path).replace("/", ".").removesuffix(".__init__")
            covered = [m for m in files if m == dotted or (not name.endswith(".py") or name.endswith("*.py")) and m.startswith(dotted + ".")]
            assert covered, f"{MAP.name} places {name!r}, which is no module of vltool"
            for m in covered:
                where[m] = i
    for m in files:
        if m not in where and wildcard is not None and m.count(".") == 1:
            where[m] = wildcard
    return where


def test_the_maps_layers_are_read_as_drawn():
    layers = map_layers(MAP.read_text(encoding="utf-8"))
    assert len(layers) >= 3 and "vltool/commands/*.py" in layers[0] and any(COMMAND in names for names in layers), layers
    files = {m: Path() for m in ("vltool", "vltool.cli", "vltool.commands", "vltool.commands.zeroshot", "vltool.zeroshot", "vltool.io", "vltool.io.images")}
    where = layer_of([["vltool/cli.py", "vltool/commands/*.py"], [COMMAND], ["vltool/io/"], ["vltool/__init__.py"]], files)
    assert where == {"vltool.cli": 0, "vltool.commands": 0, "vltool.commands.zeroshot": 0, "vltool.zeroshot": 1, "vltool.io": 2,
                     "vltool.io.images": 2, "vltool": 3}


def test_every_module_imports_only_its_own_layer_or_below():
    """docs/where-things-are.md, "Layers": a module imports only from its own layer or below. Every module has a
    layer there (a top-level one the map names nowhere is the work of a command, `vltool/<command>.py`)."""
    graph, files = import_graph()
    layers = map_layers(MAP.read_text(encoding="utf-8"))
    where = layer_of(layers, files)
    assert not set(files) - set(where), f"{MAP.name} gives no layer to {sorted(set(files) - set(where))}"
    up = [f"{a} ({files[a].relative_to(PACKAGE_DIR.parent)}:{line}, layer {where[a]}) imports {b} (layer {where[b]})"
          for a in sorted(graph) for b, line in sorted(graph[a].items()) if where[b] < where[a]]
    assert not up, f"imports up the layers of {MAP.name} (move the module in the map, or the import):\n  " + "\n  ".join(up)
