"""Building an environment: a lock (given, shipped, or resolved here from a requirements file)
installed with pip into a fresh self-contained tree, offline when given a wheel directory or an
internal index, with nothing installed at run time. The same lock and sources build
byte-identical trees wherever they are built; the tree goes under its digest and the name
points at it. The manifest `finish` writes is the one place a tree's recorded facts are made."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import UsageError
from ..image import LOCK_FILE, NATIVE_OUTPUTS, build_native, native_sha
from . import manifest, npm
from .lock import check_lock, pip, resolve
from .modules import importable
from .registry import Environment, check_name, envs_dir, lookup, point
from .tree import (
    compile_bytecode,
    copy_python,
    drop_scripts,
    file_sha,
    host_libraries,
    interpreter_info,
    tree_digest,
)

RUNTIME = Path(__file__).parent.parent / "runtime"
# The specs shipped with execbox, built by name alone (`execbox env build ml`).
SHIPPED = {"data": LOCK_FILE, "ml": RUNTIME / "ml.lock", "js-data": LOCK_FILE}
# ... and the npm specs (package.json and package-lock.json) that go with them.
SHIPPED_NPM = {"js-data": RUNTIME / "npm"}
# How a tree is made from the interpreter: a tree of another format is rebuilt, not reused
# (2: the build configuration names the jail's prefix, not the host's).
TREE_FORMAT = 2
# In the home's environments directory: held by the one process building there.
BUILD_LOCK = ".build.lock"


def build(
    name: str,
    requirements: Path | None = None,
    lock: Path | None = None,
    index_url: str | None = None,
    find_links: Path | None = None,
    no_index: bool = False,
    base: Path | None = None,
    python: str | None = None,
    log: bool = True,
    npm_spec: Path | None = None,
    npm_registry: str | None = None,
    npm_cache: Path | None = None,
    npm_offline: bool = False,
) -> Environment:
    """Build environment `name` from a requirements file (resolved and locked here) or a lock
    (`lock`, or the shipped spec of that name), with the npm packages of `npm_spec` (a
    directory with package.json and package-lock.json; see `npm`), and point the name at it."""
    lock, npm_spec = _spec(name, requirements, lock, npm_spec)
    if find_links is not None and not find_links.is_dir():
        raise UsageError(f"--find-links directory not found: {find_links}")
    index_args = []
    if index_url:
        index_args += ["--index-url", index_url]
    if find_links is not None:
        index_args += ["--find-links", str(find_links.resolve())]
    if no_index:
        index_args.append("--no-index")
    interpreter = python or getattr(sys, "_base_executable", None) or sys.executable
    with build_lock(base):
        if lock is not None and not index_args:
            same = _same_build(name, lock, interpreter, base, npm_spec)
            if same is not None:
                return same
        trees = envs_dir(base) / "trees"
        trees.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=trees))
        work.chmod(0o755)  # mkdtemp's 0700 would keep the jail's users out of the whole tree
        try:
            packages: dict[str, str] = {}
            if npm_spec is not None:  # first: a lock npm refuses ends the build before the copy
                (work / npm.DIR).mkdir()
                packages = npm.install(work, npm_spec, npm_registry, npm_cache, npm_offline)
            info = copy_python(work, interpreter)
            py = work / "bin" / "python3"
            lock_text = (
                lock.read_text() if lock is not None else resolve(py, requirements, index_args, log)  # type: ignore[arg-type]
            )
            lock_file = work / "requirements.lock"
            lock_file.write_text(lock_text)
            pip(
                py,
                ["install"],
                [
                    "--no-deps",
                    "--require-hashes",
                    "--only-binary",
                    ":all:",
                    "--no-compile",
                    "--no-warn-script-location",
                    "-r",
                    str(lock_file),
                    *index_args,
                ],
                log,
            )
            drop_scripts(work)
            compile_bytecode(work)
            digest = tree_digest(work)
            libs = host_libraries(work)
            final = trees / digest.removeprefix("sha256:")[:16]
            if (final / manifest.FILE).is_file() and manifest.read(final).get(
                "tree_digest"
            ) == digest:
                shutil.rmtree(work)  # the same tree, built before (maybe by an older execbox)
                refresh_native(final)
            else:
                if final.exists():
                    shutil.rmtree(final)
                work.rename(final)
                finish(final, info, digest, lock_text, libs, packages)
            point(name, final, base)
            return Environment(name, final, manifest.read(final))
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise


@contextmanager
def build_lock(base: Path | None = None) -> Iterator[None]:
    """Hold the home's build lock: two processes building into one home would replace each
    other's trees and names mid-build. A second builder waits here, then finds the tree."""
    envs = envs_dir(base)
    envs.mkdir(parents=True, exist_ok=True)
    try:
        fh = open(envs / BUILD_LOCK, "a")  # noqa: SIM115 (closed below, on every path)
    except PermissionError:
        # A home this user reads but may not write (a system image's, built by root): it
        # can only reuse trees there, and a build of its own would fail on its first write.
        try:
            fh = open(envs / BUILD_LOCK)  # noqa: SIM115
        except OSError:
            yield
            return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # let go when the file closes, or the process dies
        yield


def _spec(
    name: str, requirements: Path | None, lock: Path | None, npm_spec: Path | None
) -> tuple[Path | None, Path | None]:
    """The lock and npm spec to build `name` from (a shipped spec's when neither a
    requirements file nor a lock is given), checked."""
    check_name(name)
    if requirements is not None and lock is not None:
        raise UsageError("give --requirements or --lock, not both")
    if requirements is None and lock is None:
        if name not in SHIPPED:
            raise UsageError(
                f"no spec for {name!r}: give --requirements FILE (or --lock FILE); shipped "
                f"specs: {', '.join(SHIPPED)}"
            )
        lock = SHIPPED[name]
        npm_spec = npm_spec or SHIPPED_NPM.get(name)
    if requirements is not None and not requirements.is_file():
        raise UsageError(f"requirements file not found: {requirements}")
    if lock is not None:
        check_lock(lock)
    if npm_spec is not None:
        npm.check_lock(npm_spec)
    return lock, npm_spec


def _same_build(
    name: str, lock: Path, interpreter: str, base: Path | None, npm_spec: Path | None
) -> Environment | None:
    """The environment `name` when it was built from this lock (and npm spec) with this
    interpreter (its C parts brought up to date): a rebuild would give the same tree."""
    try:
        root = lookup(name, base)
    except UsageError:
        return None
    meta = manifest.read(root)
    lock_sha = hashlib.sha256(lock.read_bytes()).hexdigest()
    executable = Path(str(interpreter_info(interpreter)["executable"]))
    if meta.get("lock_sha256") != lock_sha or meta.get("interpreter_sha256") != file_sha(
        executable
    ):
        return None
    if meta.get("tree_format") != TREE_FORMAT:
        return None
    if meta.get("npm_lock_sha256") != (npm.lock_sha(npm_spec) if npm_spec else None):
        return None
    refresh_native(root)
    return Environment(name, root, manifest.read(root))


def finish(
    root: Path,
    info: dict[str, object],
    digest: str,
    lock_text: str,
    libs: list[str],
    npm_packages: dict[str, str] | None = None,
) -> None:
    """What is made at the tree's final path: the jail's C parts, matplotlib's font cache
    (it records absolute font paths: derived from the tree, so outside its digest) and the
    manifest."""
    build_native(root)
    packages = sorted(
        p.name.split("-")[0].lower()
        for p in (root / "lib").glob("python3.*/site-packages/*.dist-info")
    )
    if "matplotlib" in packages:
        subprocess.run(
            [
                str(root / "bin" / "python3"),
                "-I",
                "-c",
                "import matplotlib; matplotlib.use('Agg'); import matplotlib.font_manager",
            ],
            check=True,
            capture_output=True,
            env={"MPLCONFIGDIR": str(root / "mplconfig")},
        )
    else:
        (root / "mplconfig").mkdir()
    manifest.write(
        root,
        {
            "kind": "self-contained",
            "tree_format": TREE_FORMAT,
            "tree_digest": digest,
            "python_version": info["version"],
            "lock_sha256": hashlib.sha256(lock_text.encode()).hexdigest(),
            "interpreter_sha256": file_sha(Path(str(info["executable"]))),
            "native_sha256": native_sha(),
            "packages": packages,
            "host_libraries": libs,
            "modules": importable(root),
            "npm_packages": npm_packages or {},
            "npm_lock_sha256": npm.lock_sha(root / npm.DIR) if npm_packages else None,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )


def refresh_native(root: Path) -> None:
    """Rebuild the jail's C parts of a tree when execbox's changed (outside the tree digest;
    the image digest covers their sources)."""
    meta = manifest.read(root)
    present = all((root / "libexec" / name).is_file() for name in NATIVE_OUTPUTS)
    if meta.get("native_sha256") != native_sha() or not present:
        build_native(root)
        meta["native_sha256"] = native_sha()
        manifest.write(root, meta)
