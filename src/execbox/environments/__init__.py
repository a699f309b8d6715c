"""Named, self-contained Python environments: what user code can import.

An environment is a tree with its own interpreter, standard library and locked packages;
nothing in it refers to the host's Python install. Its parts, one reason to change each:

- `registry`: names and the trees they point at under `<home>/envs/`, the default;
- `manifest`: a tree's recorded facts (`manifest.json`), read and amended atomically;
- `lock`: requirements resolved into a lock with a hash per wheel (pip's resolver);
- `tree`: the self-contained tree (interpreter, standard library, bytecode) and its digest;
- `elf`: the shared libraries a binary loads and its run path, rewritten in place;
- `build`: a lock installed into a fresh tree, the tree's manifest, the name pointed at it;
- `fsimage`: the ext4 file the jail mounts a tree from, at one fixed path (`image.ENV_DIR`);
- `modules`: the top-level modules code can import in each environment, and their index;
- `demand`: curation from demand, the missing-module hint and `execbox env requests`;
- `npm`: npm packages locked with integrity hashes, installed into a tree at build time;
- `doctor`: what mounting an environment needs of the host (`execbox doctor`).
"""

from __future__ import annotations

from .build import RUNTIME, SHIPPED, SHIPPED_NPM, TREE_FORMAT, build, refresh_native
from .demand import (
    MISSING,
    Request,
    missing_hint,
    missing_hint_in,
    missing_module,
    missing_package,
    missing_package_hint,
    requests,
)
from .elf import runpath
from .fsimage import FS_BLOCK, FS_FORMAT, mountable
from .lock import check_lock, resolve
from .modules import having, modules_of, names_of
from .npm import packages_of as npm_packages_of
from .registry import (
    DEFAULT_NAME,
    NAME,
    Environment,
    check_name,
    default_name,
    default_root,
    envs_dir,
    list_names,
    lookup,
    remove,
    set_default,
    show,
)
from .tree import HOST_LIB_DIRS, STDLIB_SKIP, TREE_PARTS, host_libraries, tree_digest

__all__ = [
    "DEFAULT_NAME",
    "FS_BLOCK",
    "FS_FORMAT",
    "HOST_LIB_DIRS",
    "MISSING",
    "NAME",
    "RUNTIME",
    "SHIPPED",
    "SHIPPED_NPM",
    "STDLIB_SKIP",
    "TREE_FORMAT",
    "TREE_PARTS",
    "Environment",
    "Request",
    "build",
    "check_lock",
    "check_name",
    "default_name",
    "default_root",
    "envs_dir",
    "having",
    "host_libraries",
    "list_names",
    "lookup",
    "missing_hint",
    "missing_hint_in",
    "missing_module",
    "missing_package",
    "missing_package_hint",
    "modules_of",
    "mountable",
    "names_of",
    "npm_packages_of",
    "refresh_native",
    "remove",
    "requests",
    "resolve",
    "runpath",
    "set_default",
    "show",
    "tree_digest",
]
