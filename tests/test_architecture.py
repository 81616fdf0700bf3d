"""The package's layers, read from every module's ``import`` statements (``ast``, no import run).

docs/architecture.md draws the same rule in words: each folder imports only itself and the
layers below it, and the import graph between modules has no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cachedb"

#: Layer of each top-level module or folder of ``cachedb/``; a module may import its own layer's
#: peers and anything lower. ``__init__``/``__main__`` are the package's front door (layer 99).
LAYERS: dict[str, int] = {
    "_errors": 0,
    "_version": 0,
    "store": 1,
    "formats": 2,
    "keys": 1,
    "fingerprint": 1,
    "settings": 1,
    "repositories": 3,
    "db": 4,
    "layout": 5,
    "fleet": 5,
    "live": 6,
    "tools": 7,
    "cli": 8,
    "_bootstrap": 8,
    "__init__": 99,
    "__main__": 99,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ``cachedb`` module ``path`` imports (relative imports resolved), at any depth."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if not target.startswith("cachedb"):
                continue
            if node.module is None or target == "cachedb":
                found.update(f"{target}.{alias.name}" for alias in node.names)
            else:
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("cachedb"))
    return found


def _layer_of(module: str) -> tuple[str, int]:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    if top not in LAYERS:
        raise AssertionError(f"{module}: cachedb/{top} has no layer in tests/test_architecture.py")
    return top, LAYERS[top]


MODULES = sorted(PACKAGE.rglob("*.py"))
GRAPH = {_module_name(p): _imports(p) for p in MODULES}


def test_top_level_holds_few_modules_and_every_folder_has_a_layer() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert set(folders) <= set(LAYERS), folders


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_import_from_a_higher_layer(module: str) -> None:
    own, level = _layer_of(module)
    upward = []
    for target in sorted(GRAPH[module]):
        if target == "cachedb.__version__":
            upward.append(target)
            continue
        other, other_level = _layer_of(target)
        if other != own and other_level > level:
            upward.append(f"{target} (layer {other_level} > {level})")
    assert not upward, f"{module} imports upward: {upward}"


def test_the_import_graph_has_no_circle() -> None:
    known = set(GRAPH)

    def resolve(target: str) -> str | None:
        # ``from .x import name`` names a module or an attribute of one: keep the module.
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    edges = {m: {t for t in map(resolve, GRAPH[m]) if t and t != m} for m in GRAPH}
    # A package's __init__ re-exporting its own submodules is not a circle of jobs.
    for module in edges:
        edges[module] = {t for t in edges[module] if not module.startswith(t + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
