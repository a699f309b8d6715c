"""Inside the jail: where Node finds an environment's npm packages. They are installed at
build time in the tree's `lib/node_modules` (see `environments.npm`); a link at the root of
each run's filesystem, `/node_modules`, is on the path Node walks from /workspace/main.js for
`require('x')` and from /workspace/main.mjs for `import 'x'`, so both find them with no flag,
variable or loader hook (none costs a run anything). Standard library only."""

from __future__ import annotations

import os

NODE_MODULES = "lib/node_modules"  # in the environment tree


def root_links(env_dir: str) -> dict[str, str]:
    """The root's links to the packages of the environment mounted at `env_dir`: none when
    it has no npm packages (a run there cannot require any)."""
    path = f"{env_dir}/{NODE_MODULES}"
    return {"node_modules": path} if os.path.isdir(path) else {}
