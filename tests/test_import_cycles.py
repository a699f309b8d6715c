"""No import cycle between execbox's modules, except through imports under `TYPE_CHECKING` or
inside functions (which run after every module has loaded): a cycle means a third module wants
to exist."""

from __future__ import annotations

import ast
from pathlib import Path

import execbox

SRC = Path(execbox.__file__).parent


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Each module's dotted name: its file, and whether it is a package's `__init__`."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _module_level_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs as it loads: not in a function, not under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo += ast.iter_child_nodes(node)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports as it loads (a package's
    `__init__` counts as imported with any module inside it)."""
    modules = _modules(root)
    top = root.name
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        deps: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = here[: len(here) - node.level + 1] if node.level else []
                prefix = ".".join(base + ([node.module] if node.module else []))
                targets = [prefix, *(f"{prefix}.{alias.name}" for alias in node.names)]
            for target in targets:
                while target.startswith(top + ".") or target == top:
                    if target in modules and target != name and not name.startswith(target + "."):
                        deps.add(target)
                    target = target.rpartition(".")[0]
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_no_import_cycle_between_execbox_modules() -> None:
    graph = import_graph(SRC)
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the tree was read
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import B\n")
    (pkg / "a.py").write_text("from .sub import B\nA = 1\n")
    (pkg / "sub" / "b.py").write_text("from ..a import A\nB = 2\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n"
    )
    (pkg / "d.py").write_text("from . import c\ndef f():\n    from .c import x\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.sub", "pkg.sub.b"]]
