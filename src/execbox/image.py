"""The runtime image: the pinned Python environment user code runs in.

`build()` makes a virtual environment from the lock file (hashes required, no dependencies
resolved at build time, nothing ever installed at run time), warms matplotlib's font cache,
compiles the jail's C parts (`sandbox/native/`: init and the program's contain steps) into
`libexec/`, and computes a digest over what the code can see: the interpreter version, the base
standard library and every installed file (bytecode caches and the venv's `bin/` scripts,
which embed the build path, excluded). Images live under `<home>/images/<digest>`; `current`
points at the newest. `EXECBOX_HOME` overrides the home (default `$XDG_DATA_HOME/execbox`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import SandboxUnavailable, UsageError

LOCK_FILE = Path(__file__).parent / "runtime" / "requirements.lock"
NATIVE = Path(__file__).parent / "sandbox" / "native"  # the jail's C parts, built per image
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]
PRELOAD = ["numpy", "numpy.random", "pandas", "matplotlib", "matplotlib.pyplot", "scipy"]
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
_SKIP_DIRS = {"__pycache__"}


def home() -> Path:
    explicit = os.environ.get("EXECBOX_HOME")
    if explicit:
        return Path(explicit)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "execbox"


@dataclass(frozen=True)
class Image:
    """A built runtime image."""

    root: Path
    digest: str
    python_version: str
    base_prefix: Path
    preload: tuple[str, ...]

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def libexec(self) -> Path:
        """The jail's C parts: `execbox-init` and `libexecbox-contain.so` (see
        `sandbox/native`)."""
        return self.root / "libexec"

    @property
    def mplconfig(self) -> Path:
        return self.root / "mplconfig"

    @property
    def ro_paths(self) -> list[str]:
        """Host paths the jail binds read-only: the image and its base interpreter."""
        return [str(self.root.resolve()), str(self.base_prefix)]

    def zygote_env(self) -> dict[str, str]:
        """The zygote's whole environment: no secrets, nothing inherited from the caller."""
        return {
            "MPLCONFIGDIR": str(self.mplconfig),
            "MPLBACKEND": "Agg",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "LC_ALL": "C.UTF-8",
            # glibc malloc with transparent huge pages: the zygote's heap is mapped with 2 MiB
            # pages, so forking it copies far fewer page-table entries (docs/PERFORMANCE.md).
            "PYTHONMALLOC": "malloc",
            "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
        }

    @classmethod
    def load(cls, path: Path | None = None) -> Image:
        root = path or home() / "images" / "current"
        manifest = root / "manifest.json"
        if not manifest.is_file():
            raise SandboxUnavailable(
                f"no runtime image at {root}; build one with `execbox image build`"
            )
        data = json.loads(manifest.read_text())
        image = cls(
            root.resolve(),
            data["digest"],
            data["python_version"],
            Path(data["base_prefix"]),
            tuple(data.get("preload", PRELOAD)),
        )
        if data.get("native_sha256") != _native_sha() or not all(
            (image.libexec / name).is_file() for name in NATIVE_OUTPUTS
        ):
            raise SandboxUnavailable(
                f"the runtime image at {root} lacks this execbox's init and contain steps; "
                "rebuild it with `execbox image build`"
            )
        return image


# What each C source becomes in libexec/, and how: init is static (the jail has no loader
# cache for it, and a static binary starts fastest), and where `native/nolibc.h` knows the
# system calls (x86-64 and arm64 targets) it has no C library at all, whose start-up is most of
# a static program's exec on a virtual machine; the contain
# steps (which the program zygotes call) and the staging of each run (which supervisors call)
# are one library.
NATIVE_OUTPUTS = {
    "execbox-init": (["init.c"], ["-static", "-s"]),
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


def _native_sha() -> str:
    h = hashlib.sha256(json.dumps([CFLAGS, NATIVE_OUTPUTS, NOLIBC]).encode())
    for path in sorted(NATIVE.iterdir()):
        if path.suffix in (".c", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


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


def _hash_tree(h: hashlib._Hash, root: Path, skip: set[str]) -> int:
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and d not in skip)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
            if path.is_symlink():
                h.update(b"L" + os.readlink(path).encode() + b"\0")
            elif path.is_file():
                with path.open("rb") as fh:
                    h.update(b"F" + hashlib.file_digest(fh, "sha256").digest())
            count += 1
    return count


def compute_digest(root: Path, base_prefix: Path, python_version: str) -> str:
    """sha256 over the interpreter version, base stdlib and installed files."""
    h = hashlib.sha256()
    h.update(f"python {python_version}\0".encode())
    stdlib = Path(
        sysconfig.get_paths(vars={"installed_base": str(base_prefix), "base": str(base_prefix)})[
            "stdlib"
        ]
    )
    h.update(b"stdlib\0")
    _hash_tree(h, stdlib, {"site-packages", "test", "idlelib"})
    h.update(b"image\0")
    for sub in sorted(
        p for p in root.iterdir() if p.is_dir() and p.name not in ("bin", "mplconfig")
    ):
        _hash_tree(h, sub, set())
    return "sha256:" + h.hexdigest()


def build(
    lock: Path = LOCK_FILE,
    dest_home: Path | None = None,
    python: str | None = None,
    log: bool = True,
) -> Image:
    """Build the image from `lock` and make it current; reuses an identical build."""
    if not lock.is_file():
        raise UsageError(f"lock file not found: {lock}")
    base = dest_home or home()
    images = base / "images"
    images.mkdir(parents=True, exist_ok=True)
    lock_sha = hashlib.sha256(lock.read_bytes()).hexdigest()
    current = images / "current"
    manifest_path = current / "manifest.json"
    if manifest_path.is_file():
        meta = json.loads(manifest_path.read_text())
        if meta.get("lock_sha256") == lock_sha and (current / "bin" / "python").exists():
            native_sha = _native_sha()
            if meta.get("native_sha256") != native_sha:  # same packages, other C parts
                root = current.resolve()
                build_native(root)
                meta["native_sha256"] = native_sha
                meta["digest"] = compute_digest(
                    root, Path(meta["base_prefix"]), meta["python_version"]
                )
                _write_manifest(root, meta)
            return Image.load(current)
    interpreter: str = python or getattr(sys, "_base_executable", None) or sys.executable
    tag = hashlib.sha256(f"{lock_sha}\0{os.path.realpath(interpreter)}".encode()).hexdigest()
    final = images / tag[:16]
    work = images / f".build-{tag[:16]}"
    out = None if log else subprocess.DEVNULL
    for stale in (work, final):
        if stale.exists():
            shutil.rmtree(stale)
    try:
        subprocess.run(
            [interpreter, "-m", "venv", "--without-pip", str(work)], check=True, stdout=out
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(work / "bin" / "python"),
                "install",
                "--quiet",
                "--no-deps",
                "--require-hashes",
                "--only-binary",
                ":all:",
                "-r",
                str(lock),
            ],
            check=True,
            stdout=out,
        )
        work.rename(final)  # before the font cache is made: it records absolute paths
        build_native(final)
        probe = subprocess.run(
            [
                str(final / "bin" / "python"),
                "-I",
                "-c",
                "import sys, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot, "
                "matplotlib.font_manager; print(sys.base_prefix); "
                "print('.'.join(map(str, sys.version_info[:3])))",
            ],
            check=True,
            capture_output=True,
            text=True,
            env={"MPLCONFIGDIR": str(final / "mplconfig")},
        )
        base_prefix, version = probe.stdout.split()
        manifest = {
            "digest": compute_digest(final, Path(base_prefix), version),
            "python_version": version,
            "base_prefix": base_prefix,
            "lock_sha256": lock_sha,
            "native_sha256": _native_sha(),
            "preload": PRELOAD,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _write_manifest(final, manifest)
        tmp_link = images / ".current.tmp"
        if tmp_link.is_symlink() or tmp_link.exists():
            tmp_link.unlink()
        tmp_link.symlink_to(final.name)
        tmp_link.replace(current)
        return Image.load(current)
    except (subprocess.CalledProcessError, OSError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise SandboxUnavailable(f"building the runtime image failed: {exc}") from exc


def _write_manifest(root: Path, manifest: Mapping[str, object]) -> None:
    tmp = root / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(root / "manifest.json")


def verify(image: Image) -> bool:
    """Recompute the digest; False when the image was changed after it was built."""
    return compute_digest(image.root, image.base_prefix, image.python_version) == image.digest
