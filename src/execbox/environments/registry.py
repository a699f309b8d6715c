"""Names and the trees they point at, under `<home>/envs/`: `trees/<digest prefix>/` (a tree
and its manifest), `names/<name>` (a link to a tree) and `default` (the name `Image.load()`
uses; `data` when unset)."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxUnavailable, UsageError
from ..image import Image, fs_image_path, home
from . import manifest

DEFAULT_NAME = "data"
NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")


def envs_dir(base: Path | None = None) -> Path:
    return (base or home()) / "envs"


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise UsageError(
            f"bad environment name {name!r}: lower-case letters, digits, '-' and '_', "
            "starting with a letter, at most 32"
        )
    return name


@dataclass(frozen=True)
class Environment:
    name: str
    root: Path
    manifest: dict[str, object]

    @property
    def image(self) -> Image:
        return Image.load(self.root)


def lookup(name: str, base: Path | None = None) -> Path:
    """The tree of environment `name` (what the executor will mount for a run naming it)."""
    link = envs_dir(base) / "names" / check_name(name)
    if not link.is_symlink() or not (link / manifest.FILE).is_file():
        known = ", ".join(list_names(base)) or "none"
        hint = (
            "build it with `execbox image build`"
            if name == DEFAULT_NAME
            else f"build it with `execbox env build {name} ...`"
        )
        raise UsageError(f"no environment named {name!r} (built: {known}); {hint}")
    return link.resolve()


def list_names(base: Path | None = None) -> list[str]:
    names = envs_dir(base) / "names"
    return sorted(p.name for p in names.iterdir() if p.is_symlink()) if names.is_dir() else []


def default_name(base: Path | None = None) -> str:
    path = envs_dir(base) / "default"
    return path.read_text().strip() if path.is_file() else DEFAULT_NAME


def default_root(base: Path | None = None) -> Path:
    name = default_name(base)
    try:
        return lookup(name, base)
    except UsageError as exc:
        raise SandboxUnavailable(str(exc)) from exc


def set_default(name: str, base: Path | None = None) -> None:
    lookup(name, base)
    manifest.write_atomic(envs_dir(base) / "default", name + "\n")


def point(name: str, tree: Path, base: Path | None = None) -> None:
    """Point `name` at `tree` (under `trees/`), replacing what it pointed at."""
    names = envs_dir(base) / "names"
    names.mkdir(parents=True, exist_ok=True)
    tmp = names / f".{name}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(Path("..") / "trees" / tree.name)
    tmp.replace(names / name)


def remove(name: str, base: Path | None = None) -> None:
    """Drop the name; its tree goes too when no other name points at it."""
    root = lookup(name, base)
    if name == default_name(base):
        raise UsageError(
            f"{name!r} is the default environment; make another the default first "
            "(`execbox env default NAME`)"
        )
    link = envs_dir(base) / "names" / name
    link.unlink()
    if not any(lookup(other, base) == root for other in list_names(base)):
        shutil.rmtree(root)
        fs_image_path(root).unlink(missing_ok=True)


def show(name: str, base: Path | None = None) -> dict[str, object]:
    root = lookup(name, base)
    image = Image.load(root)
    return {
        "name": name,
        "default": name == default_name(base),
        "root": str(root),
        "image_digest": image.digest,
        **manifest.read(root),
    }
