"""The product's import graph: the daemons stand apart from the tools and the lab, no circles.

Between the product and the lab (``localcluster/``, ``bench/``, ``tests/``) imports go one way: the
lab imports the product, the product nothing of the lab (docs/design.md "Components").

Read statically (every ``import`` in every module, also those inside functions and those under
``if TYPE_CHECKING:``, and ``importlib.import_module`` / ``__import__`` of a literal name), so a
circle or a forbidden import fails here even where no test runs the line that imports. An import
for type checking is an edge too: two modules that need each other's names to be read are one
piece, whether or not the interpreter executes the import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "driver", "controller", "kubeletplugin", "instaslice", "protos")
DAEMONS = ("controller", "kubeletplugin")
SHARED = ("api", "driver", "protos")
LAB = ("localcluster", "bench", "tests")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PRODUCT
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
        if "_pb2" not in path.name
    }


MODULES = _modules()


def _imported_by_name(node: ast.Call) -> str | None:
    """The module named by ``importlib.import_module("x")`` or ``__import__("x")``, if literal."""
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _imports(tree: ast.AST, *, package: str) -> Iterator[str]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Call) and (by_name := _imported_by_name(node)):
            yield by_name
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        yield from _imports(node, package=package)


def _edges() -> dict[str, set[str]]:
    """Module → the product modules it imports (a name that is a module's attribute counts as
    that module)."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for imported in _imports(ast.parse(path.read_text(encoding="utf-8")), package=package):
            module = imported
            while module and module not in MODULES:
                module = module.rpartition(".")[0]
            if module and module != name:
                targets.add(module)
        edges[name] = targets
    return edges


def _all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {name for name in _imports(tree, package="") if name}


def _forbidden_imports(package: str, forbidden: tuple[str, ...]) -> list[str]:
    """``"<module> imports <name>"`` for each import of a ``forbidden`` package in ``package``."""
    return sorted(
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if name.split(".")[0] == package
        for imported in _all_imports(path)
        if imported.split(".")[0] in forbidden
    )


@pytest.mark.parametrize("package", PRODUCT)
def test_the_product_imports_nothing_of_the_lab(package: str) -> None:
    """The lab imports the product (the demo and the soak draw ``instaslice.status``'s slice map,
    bench replays traces with ``instaslice.planning``), never the reverse: ``instaslice demo``
    starts ``python -m localcluster.demo`` by name and imports nothing of it."""
    offending = _forbidden_imports(package, LAB)
    assert not offending, "\n".join(offending)


@pytest.mark.parametrize("package", [*DAEMONS, *SHARED])
def test_daemons_and_their_core_import_neither_the_tools_nor_the_lab(package: str) -> None:
    offending = _forbidden_imports(package, ("instaslice", *LAB))
    assert not offending, "\n".join(offending)


@pytest.mark.parametrize("package", SHARED)
def test_shared_core_imports_no_daemon(package: str) -> None:
    offending = _forbidden_imports(package, DAEMONS)
    assert not offending, "\n".join(offending)


def test_the_two_daemons_do_not_import_each_other() -> None:
    offending = sorted(
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if name.split(".")[0] in DAEMONS
        for imported in _all_imports(path)
        if imported.split(".")[0] in DAEMONS and imported.split(".")[0] != name.split(".")[0]
    )
    assert not offending, "\n".join(offending)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    edges = _edges()
    # A package's __init__ re-exporting its modules is not a circle with them.
    for name in edges:
        if MODULES[name].name != "__init__.py":
            edges[name] = {t for t in edges[name] if not name.startswith(f"{t}.")}
    assert _cycles(edges) == []


def test_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_inside_functions_and_by_a_literal_name_are_seen() -> None:
    tree = ast.parse(
        "import importlib\n"
        "def demo() -> None:\n"
        "    from localcluster import demo\n"
        "    importlib.import_module('bench.simulate')\n"
        "    __import__('tests.tiers')\n"
        "    importlib.import_module(name_from_elsewhere)\n"
    )
    found = set(_imports(tree, package="instaslice"))
    assert {"localcluster.demo", "bench.simulate", "tests.tiers"} <= found


def test_imports_for_type_checking_are_edges() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from driver.placement.state import GpuState\n"
        "    import driver.placement.tables\n"
    )
    found = set(_imports(tree, package="driver.placement"))
    assert {"driver.placement.state.GpuState", "driver.placement.tables"} <= found
