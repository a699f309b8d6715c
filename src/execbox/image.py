"""The runtime image: the pinned Python environment user code runs in.

An image is a self-contained environment tree (see `environments`: its own interpreter,
standard library and locked packages) plus the jail's C parts (`sandbox/native/`: init and the
program's contain steps) compiled into its `libexec/`. Its digest, what results, records, cache
keys and replay name, covers the tree (every file code can import), the C parts' sources and
execbox's in-image package (`sandbox/inside/`, which the zygotes load from execbox's own source
tree). The zygotes and the jail see the tree at ENV_DIR and the package at PACKAGE_DIR, never
at their host paths: the tree is mounted from a filesystem file made from it (`<tree>.ext4`,
see `environments/fsimage.py`). `Image.load()` loads the default environment (`data`, from the
shipped lock, unless `execbox env default` chose another). `EXECBOX_HOME` overrides the home
(default `$XDG_DATA_HOME/execbox`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import SandboxUnavailable
from .homedir import home as home

LOCK_FILE = Path(__file__).parent / "runtime" / "requirements.lock"
NATIVE = Path(__file__).parent / "sandbox" / "native"  # the jail's C parts, built per image
INSIDE = Path(__file__).parent / "sandbox" / "inside"  # what the zygotes import from here
# Where the runtime image and execbox's in-image package appear to the zygotes and in the jail
# (the package at PACKAGE_DIR/execbox). Under /run: root can make a mount point there on any
# host without writing to its persistent filesystems (execbox's uid locks live there too).
ENV_DIR = "/run/execbox/env"
PACKAGE_DIR = "/run/execbox/lib"
FS_TYPE = "ext4"  # of the filesystem file the tree is mounted from
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]
# The light program zygote: what the runner needs and the standard-library modules code most
# often imports (a module not listed still imports, from the read-only image, at its own cost).
LIGHT_PRELOAD = [
    "random",
    "json",
    "traceback",
    "linecache",
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "typing",
    "heapq",
    "bisect",
    "string",
    "operator",
    "copy",
    "dataclasses",
    "fractions",
    "decimal",
    "datetime",
    "hashlib",
    "statistics",
]


@dataclass(frozen=True)
class Image:
    """A built runtime image: an environment tree and its digest."""

    root: Path
    digest: str
    python_version: str

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def libexec(self) -> Path:
        """The jail's C parts: `execbox-init` and `libexecbox-contain.so` (see
        `sandbox/native`)."""
        return self.root / "libexec"

    @property
    def fs_image(self) -> Path:
        """The filesystem file made from the tree, which the zygotes mount at ENV_DIR."""
        return fs_image_path(self.root)

    @property
    def base_prefix(self) -> Path:
        """The interpreter's installation: the tree itself (it is self-contained)."""
        return self.root

    def zygote_env(self) -> dict[str, str]:
        """The zygote's whole environment: no secrets, nothing inherited from the caller."""
        return {
            # What site and matplotlib expand "~" to at import, before the jail's passwd
            # applies: the jail's home for its user, not the host's for whoever runs execbox.
            "HOME": "/workspace",
            "MPLCONFIGDIR": f"{ENV_DIR}/mplconfig",
            "MPLBACKEND": "Agg",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "LC_ALL": "C.UTF-8",
            # pyarrow's jemalloc (pandas imports pyarrow where installed, as in `ml`) starts a
            # background thread at import: the zygote must stay single-threaded to fork.
            "JE_ARROW_MALLOC_CONF": "background_thread:false",
            # glibc malloc with transparent huge pages: the zygote's heap is mapped with 2 MiB
            # pages, so forking it copies far fewer page-table entries (docs/PERFORMANCE.md).
            "PYTHONMALLOC": "malloc",
            "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
        }

    @classmethod
    def load(cls, path: Path | None = None) -> Image:
        """The image at `path` (an environment tree), or the default environment's."""
        if path is None:
            from .environments import default_root

            path = default_root()
        root = path.resolve()
        manifest = root / "manifest.json"
        if not manifest.is_file():
            raise SandboxUnavailable(
                f"no runtime image at {root}; build one with `execbox image build`"
            )
        data = json.loads(manifest.read_text())
        if data.get("kind") != "self-contained":
            raise SandboxUnavailable(
                f"the runtime image at {root} is not a self-contained environment; rebuild it "
                "with `execbox image build`"
            )
        if data.get("native_sha256") != native_sha() or not all(
            (root / "libexec" / name).is_file() for name in NATIVE_OUTPUTS
        ):
            raise SandboxUnavailable(
                f"the runtime image at {root} lacks this execbox's init and contain steps; "
                "rebuild it with `execbox image build`"
            )
        from .environments import mountable

        if os.geteuid() == 0:  # rootless mode binds the tree itself (no loop device)
            mountable(root)
        return cls(root, image_digest(data["tree_digest"]), data["python_version"])


def fs_image_path(root: Path) -> Path:
    return root.with_name(root.name + ".ext4")


def image_digest(tree_digest: str) -> str:
    """The digest runs report: the tree's, the jail's C sources', the in-image package's and
    the machine's Node and bash, which JavaScript and bash runs exec (`interpreter_pins`)."""
    h = hashlib.sha256(b"execbox image\0")
    pins = json.dumps(interpreter_pins(), sort_keys=True)
    for part in (tree_digest, native_sha(), inside_sha(), pins):
        h.update(part.encode() + b"\0")
    return "sha256:" + h.hexdigest()


_PINS_FILE = "interpreters.json"  # in the home: sha256 per binary identity, hashed once


def interpreter_pins() -> dict[str, dict[str, str] | None]:
    """For node and bash as the jail finds them: path, version and the binary's sha256; None
    for one the machine lacks. Hashing Node's ~100 MB takes a second or more, so the hash of
    each binary identity (path, device, inode, size, times) is kept in the home and a new
    binary is hashed once; another Node is another digest."""
    from .sandbox.inside import interpreters

    try:
        known = json.loads((home() / _PINS_FILE).read_text())
    except (OSError, ValueError):
        known = {}
    pins: dict[str, dict[str, str] | None] = {}
    changed = False
    for name in ("node", "bash"):
        path = interpreters.find(name)
        if path is None:
            pins[name] = None
            continue
        st = os.stat(path)
        identity = f"{path}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        pin = known.get(identity)
        if not isinstance(pin, dict):
            with open(path, "rb") as fh:
                sha = hashlib.file_digest(fh, "sha256").hexdigest()
            done = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=30, check=False
            )
            version = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
            pin = known[identity] = {"path": path, "version": version, "sha256": sha}
            changed = True
        pins[name] = pin
    if changed:
        try:
            home().mkdir(parents=True, exist_ok=True)
            tmp = home() / f".{_PINS_FILE}.{os.getpid()}"
            tmp.write_text(json.dumps(known))
            tmp.replace(home() / _PINS_FILE)
        except OSError:
            pass  # hashed again by the next process: slower, never wrong
    return pins


def inside_sha() -> str:
    """sha256 of execbox's package as the zygotes import it from execbox's source tree:
    `execbox/__init__.py`, `sandbox/__init__.py` and `sandbox/inside/`."""
    pkg = Path(__file__).parent
    files = {
        "__init__.py": pkg / "__init__.py",
        "sandbox/__init__.py": pkg / "sandbox" / "__init__.py",
    }
    for path in sorted([*INSIDE.rglob("*.py"), *INSIDE.rglob("*.js")]):
        files["sandbox/inside/" + path.relative_to(INSIDE).as_posix()] = path
    h = hashlib.sha256()
    for name, path in files.items():
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


# What each C source becomes in libexec/, and how: init is static (the jail has no loader
# cache for it, and a static binary starts fastest), and where `native/nolibc.h` knows the
# system calls (x86-64 and arm64 targets) it has no C library at all, whose start-up is most of
# a static program's exec on a virtual machine; enter starts the zygotes (on the host); the contain
# steps (which the program zygotes call) and the staging of each run (which supervisors call)
# are one library.
NATIVE_OUTPUTS = {
    "execbox-init": (["init.c"], ["-static", "-s"]),
    "execbox-enter": (["enter.c"], ["-static", "-s"]),
    "libexecbox-contain.so": (["contain.c", "stage.c", "supervise.c"], ["-shared", "-fPIC", "-s"]),
}
NOLIBC = [
    "-DEXECBOX_NOLIBC",
    "-nostdlib",
    "-nostartfiles",
    "-ffreestanding",
    "-fno-stack-protector",
    "-fno-tree-loop-distribute-patterns",
    "-U_FORTIFY_SOURCE",
]
NOLIBC_OUTPUTS = {"execbox-init"}
NOLIBC_TARGETS = ("x86_64-", "aarch64-")  # of `cc -dumpmachine`; not x32 (32-bit longs)


def native_sha() -> str:
    h = hashlib.sha256(json.dumps([CFLAGS, NATIVE_OUTPUTS, NOLIBC]).encode())
    for path in sorted(NATIVE.iterdir()):
        if path.suffix in (".c", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def interpreter_problem(language: str) -> str | None:
    """Why this machine cannot run `language` (no Node, or one older than 20, for
    javascript; no bash), or None. Asked once per process, as the digest is computed once."""
    from .sandbox.inside import interpreters

    if language == "python":
        return None
    name = "node" if language == "javascript" else "bash"
    pin = interpreter_pins().get(name)
    if pin is None:
        return f"{language} runs need {name} in /usr/bin or /usr/local/bin, which the jail shows"
    if name == "node":
        major = pin["version"].removeprefix("v").split(".")[0]
        if not major.isdigit() or int(major) < interpreters.NODE_MIN_MAJOR:
            return (
                f"javascript runs need Node.js {interpreters.NODE_MIN_MAJOR} or newer; "
                f"{pin['path']} is {pin['version'] or 'of an unknown version'}"
            )
    return None


def _nolibc_target(cc: str) -> bool:
    """Whether `cc` builds for a target `native/nolibc.h` knows (what the compiler targets,
    not what the kernel runs: a 32-bit user space on a 64-bit kernel must not get it)."""
    done = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True)
    target = done.stdout.strip()
    return done.returncode == 0 and target.startswith(NOLIBC_TARGETS) and not target.endswith("x32")


def build_native(root: Path) -> None:
    """Compile the jail's C parts into `root/libexec`."""
    cc = shutil.which(os.environ.get("CC") or "cc")
    if cc is None:
        raise SandboxUnavailable(
            "building the runtime image needs a C compiler for the jail's "
            "init: install gcc (Debian: apt-get install gcc libc6-dev)"
        )
    dest = root / "libexec"
    dest.mkdir(exist_ok=True)
    nolibc = _nolibc_target(cc)
    for name, (sources, flags) in NATIVE_OUTPUTS.items():
        if nolibc and name in NOLIBC_OUTPUTS:
            flags = [*flags, *NOLIBC]
        tmp = dest / f".{name}.{os.getpid()}.tmp"  # a concurrent build has its own
        done = subprocess.run(
            [cc, *CFLAGS, *flags, "-o", str(tmp), *(str(NATIVE / source) for source in sources)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise SandboxUnavailable(
                f"compiling {', '.join(sources)} failed:\n{done.stderr.strip()}"
            )
        tmp.replace(dest / name)


def build(
    lock: Path = LOCK_FILE,
    dest_home: Path | None = None,
    python: str | None = None,
    log: bool = True,
) -> Image:
    """Build the `data` environment from `lock` (reusing a build of the same lock)."""
    from . import environments

    env = environments.build(
        environments.DEFAULT_NAME, lock=lock, base=dest_home, python=python, log=log
    )
    return env.image


def verify(image: Image) -> bool:
    """Recompute the digest; False when the image was changed after it was built."""
    from .environments import tree_digest

    return image_digest(tree_digest(image.root)) == image.digest
