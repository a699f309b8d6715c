"""What code can import in each environment: the top-level modules of a tree, listed by the
tree's own interpreter when it is built and kept in its manifest (`modules`), and an index of
them over every named environment, read again only when the names or a manifest change."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxUnavailable, UsageError
from ..image import image_digest as digest_of
from . import manifest
from .registry import envs_dir, list_names, lookup

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
    return _modules_in(root, manifest.read(root))


def _modules_in(root: Path, meta: dict[str, object]) -> frozenset[str]:
    names = meta.get("modules")
    if not isinstance(names, list):
        names = importable(root)
        manifest.write(root, {**meta, "modules": names})
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


@dataclass(frozen=True)
class Indexed:
    """One named environment, as the index knows it."""

    root: Path
    modules: frozenset[str]
    image_digest: str
    packages: frozenset[str] = frozenset()  # npm packages JavaScript can require


class Index:
    """What each named environment can import and its image digest, for one state of the
    registry (see `index`)."""

    def __init__(self, entries: Mapping[str, Indexed]) -> None:
        self.entries = dict(sorted(entries.items()))

    def modules(self, name: str) -> frozenset[str]:
        """What environment `name` can import (nothing when no such environment is built)."""
        entry = self.entries.get(name)
        return entry.modules if entry is not None else frozenset()

    def having(self, module: str) -> list[str]:
        return [name for name, entry in self.entries.items() if module in entry.modules]

    def having_package(self, package: str) -> list[str]:
        """The environments whose JavaScript runs can require npm package `package`."""
        return [name for name, entry in self.entries.items() if package in entry.packages]

    def names_of(self, image_digest: str) -> list[str]:
        return [name for name, entry in self.entries.items() if entry.image_digest == image_digest]


# The registry's state an index was read at: each name, its link's target and its manifest's
# identity and mtime (None: no manifest). A rebuild, `env rm` or a new name changes it.
State = tuple[tuple[str, str, tuple[int, int, int] | None], ...]
_indexes: dict[Path, tuple[State, Index]] = {}
_indexes_lock = threading.Lock()


def index(base: Path | None = None) -> Index:
    """The index of the environments under `base` (None: the home), read from their manifests
    when the registry changed since it was last read; a missing module's hint costs a few
    stat calls, not a read of every manifest."""
    envs = envs_dir(base)
    state = _state(envs, base)  # before reading: a change during the read is seen next time
    with _indexes_lock:
        cached = _indexes.get(envs)
    if cached is not None and cached[0] == state:
        return cached[1]
    fresh = _read(state, base, cached)
    with _indexes_lock:
        _indexes[envs] = (state, fresh)
    return fresh


def _state(envs: Path, base: Path | None) -> State:
    found = []
    for name in list_names(base):
        link = envs / "names" / name
        try:
            target = os.readlink(link)
            st = os.stat(link / manifest.FILE)
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            target, stamp = "", None
        found.append((name, target, stamp))
    return tuple(found)


def _read(state: State, base: Path | None, previous: tuple[State, Index] | None) -> Index:
    """The index at `state`: what `previous` knew of a tree whose manifest is unchanged, the
    other manifests read (once per tree)."""
    known = {}
    if previous is not None:
        old_state, old_index = previous
        known = {
            (target, stamp): old_index.entries[name]
            for name, target, stamp in old_state
            if name in old_index.entries
        }
    by_root: dict[Path, Indexed] = {}
    entries = {}
    for name, target, stamp in state:
        if stamp is None:
            continue  # a name whose tree is gone: nothing to import there
        if (target, stamp) in known:
            entries[name] = known[(target, stamp)]
            continue
        try:
            root = lookup(name, base)
        except UsageError:
            continue
        if root not in by_root:  # names sharing a tree read it once
            meta = manifest.read(root)
            npm = meta.get("npm_packages")
            by_root[root] = Indexed(
                root,
                _modules_in(root, meta),
                digest_of(str(meta.get("tree_digest"))),
                frozenset(npm) if isinstance(npm, dict) else frozenset(),
            )
        entries[name] = by_root[root]
    return Index(entries)


def having(module: str, base: Path | None = None) -> list[str]:
    """The environments, by name, in which code can import top-level `module`."""
    return index(base).having(module)


def names_of(image_digest: str, base: Path | None = None) -> list[str]:
    """The environments whose image has `image_digest` (more than one name can share a tree)."""
    return index(base).names_of(image_digest)
