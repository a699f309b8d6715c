"""What code can import in each environment: the top-level modules of a tree, listed by the
tree's own interpreter when it is built and kept in its manifest (`modules`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..errors import SandboxUnavailable
from ..image import image_digest as digest_of
from . import manifest
from .registry import list_names, lookup

# Run by the tree's own interpreter: the top-level modules code can import there, the standard
# library's that the tree kept (tests, tkinter and the like were left out) and site-packages'.
_MODULES = """
import importlib.util, json, os, sys
names = set()
for name in sys.stdlib_module_names:
    try:
        if name in sys.builtin_module_names or importlib.util.find_spec(name) is not None:
            names.add(name)
    except (ImportError, ValueError):
        pass
for path in sys.path:
    if not path.endswith("site-packages") or not os.path.isdir(path):
        continue
    for entry in os.listdir(path):
        name = entry.split(".")[0]
        if not name.isidentifier() or name.startswith("__"):
            continue
        full = os.path.join(path, entry)
        if os.path.isdir(full) and "." not in entry:
            names.add(name)  # a package, or a namespace package
        elif entry.endswith((".py", ".so")):
            names.add(name)
print(json.dumps(sorted(names)))
"""


def modules_of(root: Path) -> frozenset[str]:
    """The top-level modules code can import in the tree: the manifest's `modules`, computed
    (and stored) here for a tree built before it was recorded."""
    meta = manifest.read(root)
    names = meta.get("modules")
    if not isinstance(names, list):
        names = importable(root)
        meta["modules"] = names
        manifest.write(root, meta)
    return frozenset(str(n) for n in names)


def importable(root: Path) -> list[str]:
    """The top-level modules the tree's interpreter can import, asked of it."""
    done = subprocess.run(
        [str(root / "bin" / "python3"), "-I", "-c", _MODULES],
        capture_output=True,
        text=True,
        env={},
    )
    if done.returncode != 0:
        raise SandboxUnavailable(f"listing the modules of {root} failed: {done.stderr.strip()}")
    names: list[str] = json.loads(done.stdout)
    return names


def having(module: str, base: Path | None = None) -> list[str]:
    """The environments, by name, in which code can import top-level `module`."""
    return [name for name in list_names(base) if module in modules_of(lookup(name, base))]


def names_of(image_digest: str, base: Path | None = None) -> list[str]:
    """The environments whose image has `image_digest` (more than one name can share a tree)."""
    return [
        name
        for name in list_names(base)
        if digest_of(str(manifest.read(lookup(name, base)).get("tree_digest"))) == image_digest
    ]
