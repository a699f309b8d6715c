"""Named, self-contained Python environments: what user code can import.

An environment is a tree with its own copy of the interpreter, the standard library (without
its tests, IDLE, tkinter and ensurepip), lib-dynload and the locked packages in its own
site-packages; nothing in it refers to the host's Python install, so `TREE/bin/python3 -I`
sees only TREE paths. What the tree still needs from the host are shared libraries under /usr
(libc, libm, libssl, ...), which the jail binds; `build` refuses a tree needing any other.

Packages come from a lock with a hash for every file: a requirements file is resolved into one
by pip's own resolver (`pip install --dry-run --report`) against the index or wheel directory
given, PyPI by default, and nothing is installed at run time. The same lock and sources build
byte-identical trees wherever they are built: bytecode is compiled with unchecked-hash pycs
whose file names are relative to the tree, console scripts (whose shebangs hold the build path)
are dropped, and the digest is over contents and names in a fixed order, never timestamps.

The jail never sees a tree at its host path: `mountable` makes a filesystem file of it
(`trees/<digest prefix>.ext4`), which the zygotes mount at one fixed path (`image.ENV_DIR`).

Layout under `<home>/envs/`: `trees/<digest prefix>/` (a tree and its manifest), `names/<name>`
(a link to a tree) and `default` (the name `Image.load()` uses; `data` when unset).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SandboxUnavailable, UsageError
from .image import (
    ENV_DIR,
    FS_TYPE,
    LOCK_FILE,
    PRELOAD,
    Image,
    build_native,
    fs_image_path,
    home,
    native_sha,
)

RUNTIME = Path(__file__).parent / "runtime"
# The specs shipped with execbox, built by name alone (`execbox env build ml`).
SHIPPED = {"data": LOCK_FILE, "ml": RUNTIME / "ml.lock"}
DEFAULT_NAME = "data"
NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")
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
# How a tree is made from the interpreter: a tree of another format is rebuilt, not reused
# (2: the build configuration names the jail's prefix, not the host's).
TREE_FORMAT = 2
TREE_PARTS = ("bin", "lib")  # what the tree digest covers: everything code can import


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
    if not link.is_symlink() or not (link / "manifest.json").is_file():
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
    _write_atomic(envs_dir(base) / "default", name + "\n")


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
    data: dict[str, object] = json.loads((root / "manifest.json").read_text())
    return {
        "name": name,
        "default": name == default_name(base),
        "root": str(root),
        "image_digest": image.digest,
        **data,
    }


# --- what each environment has: curation from demand ----------------------------------------

MISSING = re.compile(r"No module named '([^']+)'")
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
    meta = _manifest(root)
    names = meta.get("modules")
    if not isinstance(names, list):
        names = _importable(root)
        meta["modules"] = names
        _write_atomic(root / "manifest.json", json.dumps(meta, indent=2) + "\n")
    return frozenset(str(n) for n in names)


def _importable(root: Path) -> list[str]:
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
    from .image import image_digest as digest_of

    return [
        name
        for name in list_names(base)
        if digest_of(str(_manifest(lookup(name, base)).get("tree_digest"))) == image_digest
    ]


def missing_module(error_type: str | None, message: str | None) -> str | None:
    """The top-level module a run's ModuleNotFoundError names, or None."""
    if error_type != "ModuleNotFoundError" or not message:
        return None
    found = MISSING.search(message)
    return found.group(1).split(".")[0] if found else None


def missing_hint(
    module: str, image_digest: str, allowed: list[str] | None = None, base: Path | None = None
) -> str | None:
    """What to tell the author of code that imported `module`, missing from the environment
    with `image_digest`: the environments among `allowed` (None: all) that have it, or whom to
    ask. None when that environment has the top-level module (a submodule was missing)."""
    return missing_hint_in(module, names_of(image_digest, base), allowed, base)


def missing_hint_in(
    module: str, here: list[str], allowed: list[str] | None = None, base: Path | None = None
) -> str | None:
    """`missing_hint` for the environment known by the names `here` (none: it has no name)."""
    if any(module in modules_of(lookup(name, base)) for name in here):
        return None
    where = f"environment {here[0]!r}" if here else "this run's environment"
    anywhere = having(module, base)
    others = [n for n in anywhere if allowed is None or n in allowed]
    if not others:
        # Environments the profile does not allow are not named: it could not use them.
        nowhere = (
            "no environment its profile allows has it" if anywhere else "no environment has it"
        )
        return (
            f"{module} is not in {where}, and {nowhere}; ask an operator to add it "
            "(`execbox env requests` lists what runs asked for)"
        )
    which = (
        f"environment {others[0]!r} has it"
        if len(others) == 1
        else "environments " + ", ".join(repr(n) for n in others) + " have it"
    )
    return f"{module} is not in {where}; {which} (run with --environment {others[0]})"


@dataclass
class Request:
    """A module code asked for and its environment lacked (`execbox env requests`)."""

    module: str
    count: int = 0
    lacked_in: list[str] = field(default_factory=list)  # names, or digests no name has now
    available_in: list[str] = field(default_factory=list)  # the environments that have it now
    run_ids: list[str] = field(default_factory=list)  # the newest first
    last_at: float = 0.0


def requests(
    rows: list[tuple[str, str, float, str]], base: Path | None = None, run_ids: int = 5
) -> list[Request]:
    """What code asked for and its environment lacked, from the records' `missing_modules`
    rows (newest first), most asked for first. A module the lacking environment does have
    (the run missed a submodule of it) is not a request."""
    by_digest: dict[str, list[str]] = {}
    found: dict[str, Request] = {}
    for module, run_id, created_at, digest in rows:
        if digest not in by_digest:
            by_digest[digest] = names_of(digest, base)
        lacking = by_digest[digest]
        if any(module in modules_of(lookup(name, base)) for name in lacking):
            continue
        entry = found.setdefault(module, Request(module, last_at=created_at))
        entry.count += 1
        for name in lacking or [digest[:19]]:
            if name not in entry.lacked_in:
                entry.lacked_in.append(name)
        if len(entry.run_ids) < run_ids:
            entry.run_ids.append(run_id)
    for entry in found.values():
        entry.available_in = having(entry.module, base)
    return sorted(found.values(), key=lambda e: (-e.count, e.module))


# --- locks ---------------------------------------------------------------------------------


def _requirement_lines(text: str) -> list[str]:
    """The requirement lines of a requirements file, continuations joined, comments dropped."""
    lines, pending = [], ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith("-"):
            lines.append(line)
    return lines


def check_lock(path: Path) -> None:
    """A lock pins every requirement to one version with at least one hash."""
    if not path.is_file():
        raise UsageError(f"lock file not found: {path}")
    lines = _requirement_lines(path.read_text())
    if not lines:
        raise UsageError(f"lock file {path} names no packages")
    for line in lines:
        if "==" not in line or "--hash=sha256:" not in line:
            raise UsageError(
                f"lock file {path} has a requirement without an exact version and a sha256 "
                f"hash: {line.split()[0]!r}; lock it with `execbox env build NAME "
                "--requirements FILE`"
            )


def resolve(python: Path, requirements: Path, index_args: list[str], log: bool) -> str:
    """Resolve `requirements` for `python` with pip's resolver; the lock's text, one
    `name==version --hash=sha256:...` per package, sorted by name."""
    with tempfile.TemporaryDirectory(prefix="execbox-lock-") as tmp:
        report = Path(tmp) / "report.json"
        _pip(
            python,
            ["install", "--dry-run", "--ignore-installed", "--only-binary", ":all:"],
            ["--report", str(report), "-r", str(requirements), *index_args],
            log,
        )
        installs = json.loads(report.read_text())["install"]
    pins = []
    for item in installs:
        meta, info = item["metadata"], item["download_info"]
        hashes = info.get("archive_info", {}).get("hashes", {})
        digest = hashes.get("sha256")
        if digest is None:
            raise UsageError(
                f"{meta['name']} resolved to {info.get('url')}, which has no sha256 to lock "
                "(a directory or a VCS link): give wheels or an index"
            )
        name = re.sub(r"[-_.]+", "-", meta["name"]).lower()
        pins.append((name, f"{name}=={meta['version']} \\\n    --hash=sha256:{digest}\n"))
    header = f"# Locked by execbox from {requirements.name}; one wheel hash per package.\n"
    return header + "".join(pin for _, pin in sorted(pins))


def _pip(python: Path, command: list[str], args: list[str], log: bool) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "--disable-pip-version-check",
            *command,
            "--quiet",
            *args,
        ],
        stdout=None if log else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:
        raise UsageError(f"pip {command[0]} failed:\n{done.stderr.strip()}")


# --- the self-contained tree ---------------------------------------------------------------

_PROBE = (
    "import json, os, sys, sysconfig; print(json.dumps({"
    "'version': '.'.join(map(str, sys.version_info[:3])), "
    "'stdlib': sysconfig.get_paths()['stdlib'], "
    "'dynload': [p for p in sys.path if p.endswith('lib-dynload')], "
    "'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED')), "
    "'prefixes': sorted({sysconfig.get_config_var(v) for v in ('prefix', 'exec_prefix')}), "
    "'executable': os.path.realpath(sys.executable)}))"
)


def _interpreter_info(python: str) -> dict[str, object]:
    done = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"cannot run the interpreter {python}: {done.stderr.strip()}")
    info: dict[str, object] = json.loads(done.stdout)
    return info


def _ldd(path: Path) -> dict[str, str]:
    """The shared libraries `path` needs: name -> where the loader finds it ('' when not)."""
    done = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    found = {}
    for line in done.stdout.splitlines():
        name, arrow, where = line.strip().partition(" => ")
        if arrow:
            found[name] = "" if where.startswith("not found") else where.split(" (")[0]
    return found


def _runpath_at(binary: Path, data: bytes | bytearray) -> tuple[int, int] | None:
    """Where the DT_RUNPATH (or DT_RPATH) string of an ELF64 little-endian file is: its
    offset and length; None when it has none."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise UsageError(f"{binary} is not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, offset, vaddr, _, filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == 1:
            loads.append((vaddr, offset, filesz))
        elif p_type == 2:
            dynamic = (offset, filesz)
    if dynamic is None:
        return None
    entries: dict[int, int] = {}
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        entries.setdefault(tag, value)
    where = entries.get(29, entries.get(15))  # DT_RUNPATH, else DT_RPATH
    if where is None:
        return None
    strtab_vaddr = entries[5]  # DT_STRTAB
    strtab = next(
        off + strtab_vaddr - va for va, off, size in loads if va <= strtab_vaddr < va + size
    )
    start = strtab + where
    return start, data.index(b"\0", start) - start


def runpath(binary: Path) -> str | None:
    data = binary.read_bytes()
    at = _runpath_at(binary, data)
    return None if at is None else data[at[0] : at[0] + at[1]].decode()


def _set_runpath(binary: Path, new_path: str, old_path: str) -> bool:
    """Rewrite the run path of `binary` in place when it is `old_path` (`new_path` must not be
    longer); whether it was."""
    data = bytearray(binary.read_bytes())
    at = _runpath_at(binary, data)
    if at is None or data[at[0] : at[0] + at[1]] != old_path.encode():
        return False
    new = new_path.encode()
    if len(new) > at[1]:
        raise UsageError(f"{binary}: run path {new_path!r} is longer than {old_path!r}")
    data[at[0] : at[0] + at[1]] = new + b"\0" * (at[1] - len(new))
    binary.write_bytes(bytes(data))
    return True


def _copy_python(work: Path, interpreter: str) -> dict[str, object]:
    """Copy the interpreter, its standard library, lib-dynload and libpython into `work`."""
    info = _interpreter_info(interpreter)
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
        needs = _ldd(executable)
        libpython = next((n for n in needs if n.startswith("libpython")), None)
        if libpython and not needs[libpython].startswith(HOST_LIB_DIRS):
            shutil.copy2(needs[libpython], lib / libpython)
            # The host install's lib directory, in the run paths of the interpreter,
            # libpython and lib-dynload: the tree's own lib/ instead (a loader would look there
            # first for every library, outside the jail's view).
            host_lib = str(Path(needs[libpython]).parent)
            if not _set_runpath(bin_dir / f"python{short}", "$ORIGIN/../lib", host_lib):
                raise UsageError(
                    f"{executable} finds {libpython} by no run path of {host_lib!r}: cannot "
                    "point it at the tree's own copy"
                )
            _set_runpath(lib / libpython, "$ORIGIN", host_lib)
            for module in sorted((dest_stdlib / "lib-dynload").glob("*.so")):
                _set_runpath(module, "$ORIGIN/../..", host_lib)
    prefixes = info["prefixes"]
    assert isinstance(prefixes, list)
    for prefix in _own_prefixes(prefixes):
        for data in dest_stdlib.glob("_sysconfigdata_*.py"):
            _relocate_sysconfig(data, prefix)
    return info


def _own_prefixes(prefixes: list[str]) -> list[str]:
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
        for name, where in _ldd(path).items():
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


def _compile(tree: Path) -> None:
    """Bytecode for every module of the tree, the same bytes wherever it is built."""
    subprocess.run([str(tree / "bin" / "python3"), "-I", "-c", _COMPILE, str(tree)], check=True)


def _drop_scripts(tree: Path) -> None:
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
) -> Environment:
    """Build environment `name` from a requirements file (resolved and locked here) or a lock
    (`lock`, or the shipped spec of that name), and point the name at it."""
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
    if requirements is not None and not requirements.is_file():
        raise UsageError(f"requirements file not found: {requirements}")
    if lock is not None:
        check_lock(lock)
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
    if lock is not None and not index_args:
        same = _same_build(name, lock, interpreter, base)
        if same is not None:
            return same
    trees = envs_dir(base) / "trees"
    trees.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=trees))
    work.chmod(0o755)  # mkdtemp's 0700 would keep the jail's users out of the whole tree
    try:
        info = _copy_python(work, interpreter)
        py = work / "bin" / "python3"
        lock_text = (
            lock.read_text() if lock is not None else resolve(py, requirements, index_args, log)  # type: ignore[arg-type]
        )
        lock_file = work / "requirements.lock"
        lock_file.write_text(lock_text)
        _pip(
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
        _drop_scripts(work)
        _compile(work)
        digest = tree_digest(work)
        libs = host_libraries(work)
        final = trees / digest.removeprefix("sha256:")[:16]
        if (final / "manifest.json").is_file() and _manifest(final).get("tree_digest") == digest:
            shutil.rmtree(work)  # the same tree, built before
        else:
            if final.exists():
                shutil.rmtree(final)
            work.rename(final)
            _finish(final, info, digest, lock_text, libs)
        _point(name, final, base)
        return Environment(name, final, _manifest(final))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _same_build(name: str, lock: Path, interpreter: str, base: Path | None) -> Environment | None:
    """The environment `name` when it was built from this lock with this interpreter (its
    C parts brought up to date): a rebuild would give the same tree."""
    try:
        root = lookup(name, base)
    except UsageError:
        return None
    meta = _manifest(root)
    lock_sha = hashlib.sha256(lock.read_bytes()).hexdigest()
    if meta.get("lock_sha256") != lock_sha or meta.get("interpreter_sha256") != _file_sha(
        _interpreter_path(interpreter)
    ):
        return None
    if meta.get("tree_format") != TREE_FORMAT:
        return None
    refresh_native(root)
    return Environment(name, root, _manifest(root))


def _interpreter_path(interpreter: str) -> Path:
    return Path(str(_interpreter_info(interpreter)["executable"]))


def _file_sha(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _finish(
    root: Path, info: dict[str, object], digest: str, lock_text: str, libs: list[str]
) -> None:
    """What is made at the tree's final path: the jail's C parts and matplotlib's font cache
    (it records absolute font paths: derived from the tree, so outside its digest)."""
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
    has_data_stack = all(p.split(".")[0] in packages for p in PRELOAD)
    manifest = {
        "kind": "self-contained",
        "tree_format": TREE_FORMAT,
        "tree_digest": digest,
        "python_version": info["version"],
        "lock_sha256": hashlib.sha256(lock_text.encode()).hexdigest(),
        "interpreter_sha256": _file_sha(Path(str(info["executable"]))),
        "native_sha256": native_sha(),
        "packages": packages,
        "host_libraries": libs,
        "preload": PRELOAD if has_data_stack else [],
        "modules": _importable(root),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write_atomic(root / "manifest.json", json.dumps(manifest, indent=2) + "\n")


def refresh_native(root: Path) -> None:
    """Rebuild the jail's C parts of a tree when execbox's changed (outside the tree digest;
    the image digest covers their sources)."""
    meta = _manifest(root)
    if meta.get("native_sha256") != native_sha():
        build_native(root)
        meta["native_sha256"] = native_sha()
        _write_atomic(root / "manifest.json", json.dumps(meta, indent=2) + "\n")


# The filesystem file: ext4 made by e2fsprogs' `mke2fs -d` from the tree (e2fsprogs is part of
# every Debian-like base system, so this needs nothing installed). No journal: it is mounted
# read-only. FS_FORMAT names what goes into it; a change remakes every tree's file.
FS_FORMAT = "1"
FS_BLOCK = 4096


def mountable(root: Path) -> Path:
    """The tree's filesystem file, made when it is missing or older than the tree's C parts.
    The jail mounts the tree from it: its own filesystem, whose root is the tree, so nothing
    (not even /proc/self/mountinfo) names the directory it was made from."""
    fs = fs_image_path(root)
    meta = _manifest(root)
    key = f"{FS_FORMAT}:{meta.get('native_sha256')}"
    if meta.get("fs_image") == key and fs.is_file():
        return fs
    mke2fs = shutil.which(
        "mke2fs", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    )
    if mke2fs is None:
        raise SandboxUnavailable(
            "making the runtime image's filesystem needs mke2fs: install e2fsprogs "
            "(Debian: apt-get install e2fsprogs)"
        )
    blocks, inodes = _fs_size(root)
    tmp = fs.with_name(f".{fs.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    size_kib = (blocks * FS_BLOCK * 5 // 4 + inodes * 256 + (64 << 20)) >> 10
    done = subprocess.run(
        [
            mke2fs,
            "-q",
            "-t",
            FS_TYPE,
            "-O",
            "^has_journal,^resize_inode",
            "-m",
            "0",
            "-b",
            str(FS_BLOCK),
            "-N",
            str(inodes + 256),
            "-E",
            "root_owner=0:0",
            "-L",
            "execbox-env",
            "-d",
            str(root),
            str(tmp),
            f"{size_kib}k",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SandboxUnavailable(f"mke2fs failed for {root}: {done.stderr.strip()}")
    tmp.chmod(0o644)
    tmp.replace(fs)
    meta["fs_image"] = key
    _write_atomic(root / "manifest.json", json.dumps(meta, indent=2) + "\n")
    return fs


def _fs_size(root: Path) -> tuple[int, int]:
    """Blocks and inodes the tree takes in a filesystem of FS_BLOCK blocks."""
    blocks = inodes = 1
    for _dirpath, dirnames, filenames in os.walk(root):
        inodes += len(dirnames) + len(filenames)
        blocks += len(dirnames)
        for name in filenames:
            st = os.lstat(os.path.join(_dirpath, name))
            blocks += -(-st.st_size // FS_BLOCK)
    return blocks, inodes


def _manifest(root: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((root / "manifest.json").read_text())
    return data


def _point(name: str, tree: Path, base: Path | None) -> None:
    names = envs_dir(base) / "names"
    names.mkdir(parents=True, exist_ok=True)
    tmp = names / f".{name}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(Path("..") / "trees" / tree.name)
    tmp.replace(names / name)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
