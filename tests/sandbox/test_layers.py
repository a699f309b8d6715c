"""The sandbox's two layers: `execbox.sandbox.inside` runs in the runtime image's interpreter,
where none of execbox's dependencies is installed, so it imports only the standard library and
its own package; `execbox.sandbox.host` may import `inside`, never the reverse. And no module
of the sandbox reaches for another's private names.

Checked on the source with `ast`, every import statement wherever it is (a function's lazy
import runs in the image too), except under `if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

import execbox

PACKAGE = Path(execbox.__file__).resolve().parent
INSIDE = PACKAGE / "sandbox" / "inside"
LOCK = PACKAGE / "runtime" / "requirements.lock"

# Runtime-image packages (never execbox's own dependencies) that code running in a heavy
# program or zygote imports, by module: IPython runs a session's cells; matplotlib is switched
# to a headless backend once the heavy zygote has preloaded it.
IMAGE_IMPORTS = {
    "kernel": {"IPython": "ipython", "traitlets": "traitlets"},
    "zygote": {"matplotlib": "matplotlib"},
    "charts": {"matplotlib": "matplotlib"},  # read a figure a cell made (matplotlib loaded)
}


def _imports(nodes: Iterable[ast.AST]) -> Iterator[tuple[int, str, int, list[str]]]:
    """(line, module, relative level, names) of every import outside `if TYPE_CHECKING:`."""
    for node in nodes:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _imports(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, 0, []
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, node.module or "", node.level, [a.name for a in node.names]
        yield from _imports(ast.iter_child_nodes(node))


def _outside_layer(path: Path, package: str) -> list[str]:
    """The imports in `path` (a module of `package`, dotted) that are neither the standard
    library nor `package` itself, nor one of its `IMAGE_IMPORTS`."""
    allowed = IMAGE_IMPORTS.get(path.stem, {})
    bad = []
    name = package if path.stem == "__init__" else f"{package}.{path.stem}"
    for line, module, level, _names in _imports(ast.parse(path.read_text(), str(path)).body):
        if level:
            parent = package.rsplit(".", level - 1)[0] if level > 1 else package
            target = f"{parent}.{module}" if module else parent
        else:
            target = module
        top = target.split(".")[0]
        if (
            target == package
            or target.startswith(package + ".")
            or top in sys.stdlib_module_names
            or top in allowed
        ):
            continue
        bad.append(f"{name}:{line} imports {target}")
    return bad


def test_in_image_code_imports_only_the_standard_library_and_its_own_package() -> None:
    modules = sorted(INSIDE.glob("*.py"))
    assert len(modules) > 10, modules  # control: the package is where the test looks
    bad = [b for m in modules for b in _outside_layer(m, "execbox.sandbox.inside")]
    # The packages around it run on `import execbox.sandbox.inside` too.
    bad += _outside_layer(PACKAGE / "__init__.py", "execbox")
    bad += _outside_layer(PACKAGE / "sandbox" / "__init__.py", "execbox.sandbox")
    assert not bad, "the runtime image has none of these:\n" + "\n".join(bad)


def test_the_image_packages_in_image_code_may_import_are_in_the_runtime_lock() -> None:
    pinned = {
        m.group(1).lower() for m in re.finditer(r"(?m)^([A-Za-z0-9_.-]+)==", LOCK.read_text())
    }
    wanted = {dist for names in IMAGE_IMPORTS.values() for dist in names.values()}
    assert wanted <= pinned, wanted - pinned


@pytest.mark.parametrize(
    "source, found",
    [
        ("import pydantic\n", "4 imports pydantic"),
        ("def f():\n    from ...contract import Limits\n", "5 imports execbox.contract"),
        ("from ..host import pump\n", "4 imports execbox.sandbox.host"),
        ("import IPython\n", "4 imports IPython"),  # allowed in the kernel only
    ],
)
def test_the_layer_check_names_the_module_and_the_import(
    tmp_path: Path, source: str, found: str
) -> None:
    module = tmp_path / "runner.py"
    module.write_text(
        "from __future__ import annotations\nimport os\nfrom . import protocol\n" + source
    )
    assert _outside_layer(module, "execbox.sandbox.inside") == [
        f"execbox.sandbox.inside.runner:{found}"
    ]


def _private_uses(path: Path) -> Iterator[str]:
    """`from .mod import _name` and `mod._name` where `mod` is a module of the package."""
    tree = ast.parse(path.read_text(), str(path))
    modules: set[str] = set()
    for _line, module, level, names in _imports(tree.body):
        if level and names:
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    yield f"{path.name}: from {'.' * level}{module} import {name}"
                if not module or module in ("inside", "host"):
                    modules.add(name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            yield f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}"


def test_no_sandbox_module_uses_another_modules_private_names() -> None:
    modules = sorted((PACKAGE / "sandbox").glob("*/*.py"))
    assert len(modules) > 15, modules
    bad = [use for m in modules for use in _private_uses(m)]
    assert not bad, "\n".join(bad)


def test_the_private_names_check_sees_both_forms(tmp_path: Path) -> None:
    module = tmp_path / "cells.py"
    module.write_text(
        "from . import outcome\nfrom .supervisor import _clean_error\nx = outcome._hint('a', 'b')\n"
    )
    assert list(_private_uses(module)) == [
        "cells.py: from .supervisor import _clean_error",
        "cells.py:3: outcome._hint",
    ]
