"""The self-contained tree: its own copy of the interpreter, the standard library (without its
tests, IDLE, tkinter and ensurepip), lib-dynload and libpython, so that `TREE/bin/python3 -I`
sees only TREE paths; bytecode the same wherever it is built; and its digest, over contents and
names in a fixed order, never timestamps. What the tree still needs from the host are shared
libraries under /usr (libc, libm, libssl, ...), which the jail binds."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import UsageError
from ..image import ENV_DIR
from .elf import ldd, set_runpath

# Left out of the copied standard library: tests, IDLE and tkinter (no display in the jail),
# ensurepip (nothing is installed at run time), the host's own packages, the C build
# configuration (for compiling extensions) and Debian's marker that would stop pip.
STDLIB_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "EXTERNALLY-MANAGED",
    "tests",  # lib2to3's and distutils' (their data does not even compile)
    "config-*",
    "_tkinter*",
}
HOST_LIB_DIRS = ("/usr/", "/lib/", "/lib64/")  # the jail binds /usr (and /lib is /usr/lib)
TREE_PARTS = ("bin", "lib")  # what the tree digest covers: everything code can import

_PROBE = (
    "import json, os, sys, sysconfig; print(json.dumps({"
    "'version': '.'.join(map(str, sys.version_info[:3])), "
    "'stdlib': sysconfig.get_paths()['stdlib'], "
    "'dynload': [p for p in sys.path if p.endswith('lib-dynload')], "
    "'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED')), "
    "'prefixes': sorted({sysconfig.get_config_var(v) for v in ('prefix', 'exec_prefix')}), "
    "'executable': os.path.realpath(sys.executable)}))"
)


def interpreter_info(python: str) -> dict[str, object]:
    """What a build needs to know of the interpreter `python`: version, where its standard
    library, lib-dynload and executable are, its build prefixes, whether libpython is shared."""
    done = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"cannot run the interpreter {python}: {done.stderr.strip()}")
    info: dict[str, object] = json.loads(done.stdout)
    return info


def file_sha(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def copy_python(work: Path, interpreter: str) -> dict[str, object]:
    """Copy the interpreter, its standard library, lib-dynload and libpython into `work`;
    the interpreter's `interpreter_info`."""
    info = interpreter_info(interpreter)
    version = str(info["version"])
    short = ".".join(version.split(".")[:2])
    executable = Path(str(info["executable"]))
    stdlib = Path(str(info["stdlib"]))
    bin_dir, lib = work / "bin", work / "lib"
    bin_dir.mkdir(parents=True)
    shutil.copy2(executable, bin_dir / f"python{short}")
    for alias in ("python3", "python"):
        (bin_dir / alias).symlink_to(f"python{short}")
    dest_stdlib = lib / f"python{short}"
    shutil.copytree(stdlib, dest_stdlib, symlinks=True, ignore=shutil.ignore_patterns(*STDLIB_SKIP))
    dynload = info["dynload"]
    assert isinstance(dynload, list)
    for source in dynload:
        dest = dest_stdlib / "lib-dynload"
        shutil.copytree(
            source,
            dest,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(*STDLIB_SKIP),
        )
    (dest_stdlib / "site-packages").mkdir()
    if info["shared"]:  # libpython as a shared library: the tree gets its own copy
        needs = ldd(executable)
        libpython = next((n for n in needs if n.startswith("libpython")), None)
        if libpython and not needs[libpython].startswith(HOST_LIB_DIRS):
            shutil.copy2(needs[libpython], lib / libpython)
            # The host install's lib directory, in the run paths of the interpreter,
            # libpython and lib-dynload: the tree's own lib/ instead (a loader would look there
            # first for every library, outside the jail's view).
            host_lib = str(Path(needs[libpython]).parent)
            if not set_runpath(bin_dir / f"python{short}", "$ORIGIN/../lib", host_lib):
                raise UsageError(
                    f"{executable} finds {libpython} by no run path of {host_lib!r}: cannot "
                    "point it at the tree's own copy"
                )
            set_runpath(lib / libpython, "$ORIGIN", host_lib)
            for module in sorted((dest_stdlib / "lib-dynload").glob("*.so")):
                set_runpath(module, "$ORIGIN/../..", host_lib)
    prefixes = info["prefixes"]
    assert isinstance(prefixes, list)
    for prefix in own_prefixes(prefixes):
        for data in dest_stdlib.glob("_sysconfigdata_*.py"):
            _relocate_sysconfig(data, prefix)
    return info


def own_prefixes(prefixes: list[str]) -> list[str]:
    """The interpreter's build prefixes that name a host directory the jail does not show: not
    /usr (bound in the jail), longest first (one may contain the other)."""
    own = [p for p in prefixes if p and p != "/usr" and not p.startswith(HOST_LIB_DIRS)]
    return sorted(own, key=len, reverse=True)


def _relocate_sysconfig(path: Path, prefix: str) -> None:
    """The build configuration (`sysconfig.get_config_vars()`) names the host's install
    prefix in dozens of values: name the jail's instead, where the tree is."""
    text = path.read_text()
    pattern = re.compile(re.escape(prefix) + r"(?![\w.+-])")
    path.write_text(pattern.sub(ENV_DIR, text))


def host_libraries(tree: Path) -> list[str]:
    """The shared libraries the tree's interpreter and lib-dynload load from the host (all
    under /usr, which the jail binds); a library found nowhere, or elsewhere, is an error."""
    short = next((tree / "lib").glob("python3.*")).name
    files = [tree / "bin" / short, *sorted((tree / "lib" / short / "lib-dynload").glob("*.so"))]
    host = set()
    for path in files:
        for name, where in ldd(path).items():
            if not where:
                raise UsageError(f"{path.name} needs {name}, which the loader cannot find")
            if Path(where).resolve().is_relative_to(tree.resolve()):
                continue
            if not where.startswith(HOST_LIB_DIRS):
                raise UsageError(f"{path.name} needs {where}, outside the tree and /usr")
            host.add(name)
    return sorted(host)


def tree_digest(tree: Path) -> str:
    """sha256 over every file name, link target, executable bit and content under the tree's
    bin/ and lib/ (the interpreter, the standard library, bytecode and packages), in order."""
    h = hashlib.sha256()
    for part in TREE_PARTS:
        top = tree / part
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(
                filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]
            ):
                path = Path(dirpath) / name
                rel = path.relative_to(tree).as_posix()
                h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
                if path.is_symlink():
                    h.update(b"L" + os.readlink(path).encode() + b"\0")
                else:
                    with path.open("rb") as fh:
                        mode = b"X" if os.stat(path).st_mode & 0o111 else b"F"
                        h.update(mode + hashlib.file_digest(fh, "sha256").digest())
    return "sha256:" + h.hexdigest()


# Run by the tree's own interpreter (its magic number): every module compiled in one order, to
# an unchecked-hash pyc (no timestamp: the tree never changes) whose file name is relative to
# the tree (no build path), marshalled at version 2: later versions share an object only when
# the compiling process happens to hold another reference to it (an interned name used by a
# module it imported), so the same source gave different bytes in two builds.
_COMPILE = """
import importlib.util, marshal, os, sys, warnings
warnings.simplefilter("ignore")
root = sys.argv[1]
for dirpath, dirnames, filenames in os.walk(os.path.join(root, "lib")):
    dirnames.sort()
    for name in sorted(filenames):
        if not name.endswith(".py"):
            continue
        path = os.path.join(dirpath, name)
        with open(path, "rb") as fh:
            source = fh.read()
        try:
            code = compile(source, os.path.relpath(path, root), "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            continue  # a template or a test's data: it imports (or fails) without a cache
        header = importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little")
        pyc = importlib.util.cache_from_source(path)
        os.makedirs(os.path.dirname(pyc), exist_ok=True)
        with open(pyc, "wb") as fh:
            fh.write(header + importlib.util.source_hash(source) + marshal.dumps(code, 2))
"""


def compile_bytecode(tree: Path) -> None:
    """Bytecode for every module of the tree, the same bytes wherever it is built."""
    subprocess.run([str(tree / "bin" / "python3"), "-I", "-c", _COMPILE, str(tree)], check=True)


def drop_scripts(tree: Path) -> None:
    """Console scripts hold the build path in their shebang and nothing in the jail runs them."""
    for path in (tree / "bin").iterdir():
        if not path.name.startswith("python"):
            path.unlink()
    # ... and so do their lines in the packages' RECORD files (a script's hash covers it).
    for record in (tree / "lib").glob("python3.*/site-packages/*.dist-info/RECORD"):
        lines = record.read_text().splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith("../../../bin/")]
        if kept != lines:
            record.write_text("".join(kept))
