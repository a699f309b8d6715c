"""The containment checklist, one small named step per concern (nsjail's `contain` is the model).

Three processes take part in a run, from three fork servers (see `zygote`):
  supervisor  forked from the supervisors' zygote (standard library only) once per slot; root;
              host pid namespace; new mount, net and uts namespaces. Builds the slot's root
              filesystem and cgroup; for each run, in one call into C (`native/stage.c`):
              fresh scratch mounts, new pid and ipc namespaces, spawns init, asks a program
              zygote for the program; then supervises.
  init        pid 1 of the run's new pid namespace: a small static C program (`native/init.c`)
              the supervisor spawns (vfork and exec, nothing of the supervisor copied). Joins
              the cgroup, mounts /proc, drops every privilege, enters seccomp's strict mode
              and lets the kernel reap orphans. Killing it kills everything in the namespace,
              the program included.
  program     the user's code, forked from the light (standard library) or heavy (numpy,
              pandas, ... pre-imported) program zygote straight into init's namespaces and
              cgroup, contained by one call into C (`native/contain.c`): workspace,
              unprivileged uid, no capabilities, no_new_privs, seccomp last; then empty
              environment, reseeded randomness and, with its request, rlimits.

Each step raises `JailError` naming itself and the call that failed.
Standard library only: the zygote imports this inside the runtime image.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
from dataclasses import dataclass, field

from . import linux, packages

# Each slot's program runs as a uid of its own from this range (see `claim_uid`): per-user
# kernel limits (inotify instances, pipe buffer pages, message queue bytes, pending signals)
# are never shared by two runs at once. The range is one systemd leaves unallocated
# (0x70000000-0x7FFFFFFF), below 2^31 (no sign trouble).
UID_FIRST = 0x7000_0000
UID_COUNT = 1 << 16
UID_LOCKS = "/run/execbox/uids"  # one lock file per uid in use, held by its slot's supervisor
INIT_UID = 65533  # pid 1 of the run's pid namespace, once set-up is done
# Rootless mode: the user namespace maps UID_FIRST to the caller's own uid (see
# `native/enter.c`), and with subordinate ids RUN_UID to the last of them; init and every
# slot's program share one of the two (`share_one_uid`).
RUN_UID = UID_FIRST + 1
shared_uid = False
rootless_uid = UID_FIRST


def share_one_uid(uid: int = UID_FIRST) -> None:
    """Rootless mode: init and every program run as `uid`: UID_FIRST (the caller's), or
    RUN_UID (a subordinate uid) where it is mapped."""
    global shared_uid, rootless_uid
    shared_uid = True
    rootless_uid = uid


def program_uids() -> range:
    """The uids a program may be asked to run as."""
    return (
        range(rootless_uid, rootless_uid + 1)
        if shared_uid
        else range(UID_FIRST, UID_FIRST + UID_COUNT)
    )


def init_uid() -> int:
    return rootless_uid if shared_uid else INIT_UID


STAGING = "/tmp"  # in the private mount namespace a tmpfs is mounted here and becomes the root
HOSTNAME = "sandbox"
ROOT_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class JailError(Exception):
    """A containment step failed (execbox's fault or the host's, never the code's)."""


class step:
    """`with step(name):` turns an error of the block into a JailError that says which step
    failed. A class, not a generator: a supervisor passes a dozen of these each run."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object
    ) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, JailError):
            raise JailError(f"{self.name}: {exc}") from exc


@dataclass
class JailConfig:
    """What every run's root looks like; computed once in the zygote."""

    # Paths bound read-only at the same path: /usr and the runtime image (at `image.ENV_DIR` in
    # the zygotes' own mount namespace, never at a host path of its tree).
    ro_binds: list[str]
    root_links: dict[str, str]  # /bin -> usr/bin on merged-/usr systems
    etc_files: dict[str, bytes]
    etc_links: dict[str, str]
    # The filter's program part (`seccomp.compile_split`), laid out once: forks only install it.
    seccomp: linux.SeccompLoader
    cap_last_cap: int
    libexec: str  # the C parts (`native/`), inside the read-only runtime image
    devices: tuple[str, ...] = ("null", "zero", "full", "random", "urandom")

    @classmethod
    def discover(cls, extra_ro: list[str], seccomp_bpf: bytes, libexec: str) -> JailConfig:
        binds, links = ["/usr"], {}
        for name in ROOT_DIRS:
            path = "/" + name
            if os.path.islink(path):
                links[name] = os.readlink(path)
            elif os.path.isdir(path):
                binds.append(path)
        for path in extra_ro:
            real = os.path.realpath(path)
            if _within(real, STAGING):
                raise JailError(
                    f"{real} is under {STAGING}, where each slot's root is built: "
                    "keep the runtime image elsewhere (EXECBOX_HOME)"
                )
            if not any(_within(real, b) for b in binds):
                binds.append(real)
        etc_files = {
            "hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost\n".encode(),
            "hostname": f"{HOSTNAME}\n".encode(),
            "nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files\n",
            "resolv.conf": b"",
        }
        with contextlib.suppress(OSError), open("/etc/ld.so.cache", "rb") as fh:
            etc_files["ld.so.cache"] = fh.read()
        etc_links = {}
        if os.path.islink("/etc/localtime"):
            target = os.path.realpath("/etc/localtime")
            if target.startswith("/usr/"):
                etc_links["localtime"] = target
        etc_links.update(_alternatives())
        libexec = os.path.realpath(libexec)
        if not any(_within(libexec, b) for b in binds):
            raise JailError(f"{libexec} is outside the jail's read-only paths")
        links.update(packages.root_links(os.path.dirname(libexec)))
        return cls(
            binds,
            links,
            etc_files,
            etc_links,
            linux.SeccompLoader(seccomp_bpf),
            linux.cap_last_cap(),
            libexec,
        )

    @property
    def init(self) -> str:
        return f"{self.libexec}/execbox-init"

    @property
    def contain_library(self) -> str:
        return f"{self.libexec}/libexecbox-contain.so"


def _alternatives() -> dict[str, str]:
    """Debian's alternatives that commands under /usr go through (/usr/bin/awk ->
    /etc/alternatives/awk -> /usr/bin/mawk), each linked to its target: the commands a bash
    run uses resolve, and nothing else of the host's /etc shows."""
    links = {}
    for directory in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                if not entry.is_symlink():
                    continue
                via = os.readlink(entry.path)
                if not via.startswith("/etc/alternatives/"):
                    continue
                target = os.path.realpath(entry.path)
                if target.startswith("/usr/") and os.path.exists(target):
                    links["alternatives/" + via.removeprefix("/etc/alternatives/")] = target
    return links


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base + "/")


@dataclass
class RunSpec:
    """The per-run part of the jail, from the request."""

    timeout_s: float
    cpu_s: float
    memory_bytes: int
    pids: int
    disk_bytes: int
    output_bytes: int
    artifact_bytes: int
    artifact_files: int
    env: dict[str, str] = field(default_factory=dict)
    input_bytes: int = 0
    input_count: int = 0
    language: str = "python"  # or one of `interpreters.EXEC_LANGUAGES`, which exec theirs


# ---- supervisor steps (root) --------------------------------------------------------------


def unshare_namespaces() -> None:
    with step("unshare mount/pid/net/ipc/uts namespaces"):
        linux.unshare(
            linux.CLONE_NEWNS
            | linux.CLONE_NEWPID
            | linux.CLONE_NEWNET
            | linux.CLONE_NEWIPC
            | linux.CLONE_NEWUTS
        )
    with step("make mounts private"):
        linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
    with step("bring up loopback"):
        linux.loopback_up()
    with step("set hostname"):
        socket.sethostname(HOSTNAME)


def _tmpfs_options(size: int, mode: int) -> str:
    return f"size={size},mode={mode:o}"


def _tmpfs(target: str, size: int, mode: int, flags: int = 0) -> None:
    linux.mount(
        "tmpfs",
        target,
        "tmpfs",
        linux.MS_NOSUID | linux.MS_NODEV | flags,
        _tmpfs_options(size, mode),
    )


def _bind_ro(source: str, target: str) -> None:
    linux.mount(source, target, None, linux.MS_BIND)
    ro = linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV
    linux.mount("none", target, None, ro)


# The scratch mounts: (path inside the jail, extra mount flags). A slot is staged with the
# default sizes; `size_scratch` resizes them when a request asks for other limits.
SCRATCH = (("/workspace", 0), ("/tmp", 0), ("/dev/shm", linux.MS_NOEXEC))
STAGED_DISK_BYTES = 100 << 20  # Limits().disk_mib


def scratch_sizes(disk_bytes: int, input_bytes: int = 0, input_count: int = 0) -> dict[str, int]:
    """Inputs live in the workspace too: it gets room beyond the writable allowance."""
    return {
        "/workspace": disk_bytes + input_bytes + 8192 * (input_count + 1),
        "/tmp": disk_bytes,
        "/dev/shm": disk_bytes,
    }


# Inodes the workspace holds per byte of its size. The supervisor makes files and directories
# there for the files API, outside the session's memory cgroup, and an empty one takes no tmpfs
# page: without a count they were bounded only by the host's memory.
WORKSPACE_BYTES_PER_INODE = 2048


def _scratch_options(path: str, size: int) -> str:
    """The tmpfs options (without mode) that give the scratch mount at `path` its `size`."""
    if path == "/workspace":
        return f"size={size},nr_inodes={max(size // WORKSPACE_BYTES_PER_INODE, 1024)}"
    return f"size={size}"


def claim_uid() -> tuple[int, int]:
    """The first uid of the range no other slot holds, on this machine, and the descriptor of
    its lock (held for the slot's life: the kernel lets it go when the supervisor dies,
    however it dies). Called before the slot leaves the host's mount namespace."""
    # Imported here: only supervisors claim uids, and every program forks the light zygote,
    # which imports this module (an extension module is five more mappings in each fork).
    import fcntl

    if shared_uid:  # one uid for every run: shared, no lock to hold
        return rootless_uid, -1
    with step("claim a sandbox uid"):
        os.makedirs(UID_LOCKS, 0o700, exist_ok=True)
        for uid in range(UID_FIRST, UID_FIRST + UID_COUNT):
            fd = os.open(f"{UID_LOCKS}/{uid}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return uid, fd
        raise OSError(0, f"all {UID_COUNT} sandbox uids are in use")


def slot_etc_files(uid: int) -> dict[str, bytes]:
    """The users a slot's /etc names: its program's uid is `sandbox`."""
    return {
        "passwd": (
            f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"sandbox:x:{uid}:{uid}:sandbox:/workspace:/bin/sh\n"
            f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ).encode(),
        "group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n".encode(),
    }


def build_root(cfg: JailConfig, uid: int) -> None:
    """Assemble the run's filesystem under STAGING, its program's uid `uid`; nothing of the
    host is writable in it."""
    r = STAGING
    with step("mount root tmpfs"):
        _tmpfs(r, 1 << 20, 0o755)
    with step("bind read-only system and runtime"):
        for path in cfg.ro_binds:
            os.makedirs(r + path, 0o755, exist_ok=True)
            _bind_ro(path, r + path)
        for name, target in cfg.root_links.items():
            os.symlink(target, f"{r}/{name}")
    with step("write /etc"):
        os.mkdir(f"{r}/etc", 0o755)
        for name, data in (cfg.etc_files | slot_etc_files(uid)).items():
            with open(f"{r}/etc/{name}", "wb") as fh:
                fh.write(data)
        for name, target in cfg.etc_links.items():
            os.makedirs(os.path.dirname(f"{r}/etc/{name}"), 0o755, exist_ok=True)
            os.symlink(target, f"{r}/etc/{name}")
    with step("populate /dev"):
        os.mkdir(f"{r}/dev", 0o755)
        _tmpfs(f"{r}/dev", 64 << 10, 0o755, linux.MS_NOEXEC)
        for dev in cfg.devices:
            open(f"{r}/dev/{dev}", "w").close()
            linux.mount(f"/dev/{dev}", f"{r}/dev/{dev}", None, linux.MS_BIND)
        for name, target in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(target, f"{r}/dev/{name}")
        os.mkdir(f"{r}/dev/shm")
    with step("make mount points"):
        os.mkdir(f"{r}/workspace")
        os.mkdir(f"{r}/tmp")
        os.mkdir(f"{r}/proc")
    if shared_uid:
        with step("mount the slot's own /proc"):
            # In a user namespace the kernel lets init mount the run's /proc only where a
            # procfs is already fully visible in the mount namespace: this one, of the
            # zygotes' pid namespace, which each run's /proc covers (and the run cannot
            # unmount: no capability, no mount call).
            flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
            linux.mount("proc", f"{r}/proc", "proc", flags)


def staged_scratch() -> list[tuple[str, str, int]]:
    """How each run's fresh /workspace, /tmp and /dev/shm are mounted (the supervisor's C
    staging mounts them, `native/stage.c`): (path, tmpfs options, extra mount flags)."""
    sizes = scratch_sizes(STAGED_DISK_BYTES)
    return [
        (path, f"{_scratch_options(path, sizes[path])},mode=1777", extra) for path, extra in SCRATCH
    ]


def size_scratch(spec: RunSpec) -> None:
    """Give /workspace, /tmp and /dev/shm the request's sizes (called inside the jail's root);
    mounts already at the right size are left alone."""
    staged = scratch_sizes(STAGED_DISK_BYTES)
    wanted = scratch_sizes(spec.disk_bytes, spec.input_bytes, spec.input_count)
    with step("size scratch mounts"):
        for path, extra in SCRATCH:
            if wanted[path] != staged[path]:
                linux.mount(
                    "tmpfs",
                    path,
                    "tmpfs",
                    linux.MS_REMOUNT | linux.MS_NOSUID | linux.MS_NODEV | extra,
                    _scratch_options(path, wanted[path]),
                )


def place_inputs(files: list[tuple[str, bytes]]) -> dict[str, tuple[int, int]]:
    """Write inputs root-owned and read-only; the sticky /workspace stops their removal.
    Returns each input's (dev, inode) by name. Their access time is set to 0, so that the
    first read shows (see `inputs_read`). Called inside the jail's root."""
    placed = {}
    with step("place input files"):
        base = "/workspace"
        for name, data in files:
            parts = name.split("/")
            d = base
            for part in parts[:-1]:
                d = f"{d}/{part}"
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d, 0o755)
            fd = os.open(
                f"{base}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444
            )
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                st = os.fstat(fd)
                os.utime(fd, ns=(0, st.st_mtime_ns))
                placed[name] = (st.st_dev, st.st_ino)
            finally:
                os.close(fd)
    return placed


def inputs_read(placed: dict[str, tuple[int, int]]) -> list[str]:
    """The inputs read so far. A read sets a file's access time, which the scratch mounts'
    `relatime` updates while it is not after the modification time: placement set it to 0,
    so a timestamp within the clock tick of placement cannot hide the read. Listing or
    stat-ing a file is not reading it."""
    read = []
    for name, ident in placed.items():
        try:
            st = os.lstat(f"/workspace/{name}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == ident and st.st_atime_ns != 0:
            read.append(name)
    return read


def enter_root() -> None:
    """pivot_root into the staged root, drop the host's tree, make the root read-only."""
    with step("pivot_root"):
        os.mkdir(f"{STAGING}/.oldroot")
        linux.pivot_root(STAGING, f"{STAGING}/.oldroot")
        os.chdir("/")
    with step("detach the host root"):
        linux.umount2("/.oldroot", linux.MNT_DETACH)
        os.rmdir("/.oldroot")
    with step("remount root read-only"):
        linux.mount(
            "none",
            "/",
            None,
            linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV,
        )


# ---- how the program joins the slot (see `program`) -----------------------------------------

# The namespaces of init the program joins, all through one pidfd of init (Linux 5.8): pid
# by its program zygote (setns with CLONE_NEWPID changes only where its next child goes), the
# others by the program in one setns, after it joined the cgroup (its cgroup namespace is
# rooted there); the mount namespace's root and working directory become the program's.
PROGRAM_NAMESPACES = (
    linux.CLONE_NEWPID
    | linux.CLONE_NEWCGROUP
    | linux.CLONE_NEWNET
    | linux.CLONE_NEWIPC
    | linux.CLONE_NEWUTS
    | linux.CLONE_NEWNS
)


# ---- process steps in Python (the program's contain steps are in `native/contain.c`) --------


def name_process(name: str) -> None:
    """What ps and top show for this process (at most 15 bytes are kept)."""
    with open("/proc/self/comm", "w") as f:
        f.write(name)


def close_fds_except(keep: list[int]) -> None:
    """Close every descriptor not in `keep` (the zygote's socket above all)."""
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def set_rlimits(spec: RunSpec) -> None:
    with step("setrlimit"):
        # The supervisor enforces CPU time for the whole tree from the cgroup; the per-process
        # rlimit is only a backstop a second later, so the precise check is what normally fires.
        cpu = max(1, int(spec.cpu_s + 0.999)) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (spec.disk_bytes, spec.disk_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = min(1024, hard) if hard != resource.RLIM_INFINITY else 1024
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


# What init (`native/init.c`), the one program supervisors exec, needs for its set-up before it
# drops them all: CAP_SETGID, CAP_SETUID, CAP_SETPCAP (securebits, bounding set), CAP_SYS_ADMIN
# (its cgroup namespace, the run's /proc).
INIT_CAPABILITIES = frozenset({6, 7, 8, 21})


def empty_bounding_set(cap_last_cap: int, keep: frozenset[int] = frozenset()) -> None:
    """Drop every capability but `keep` from the bounding set. The bounding set only limits
    what an execve can grant, never what a process holds: a program zygote (which never execs)
    empties it once at start, and every program it forks inherits the empty set instead of
    dropping 41 capabilities one call at a time. The supervisors' zygote keeps
    INIT_CAPABILITIES for the init its supervisors exec."""
    with step("drop the capability bounding set"):
        for cap in range(cap_last_cap + 1):
            if cap not in keep:
                linux.prctl(linux.PR_CAPBSET_DROP, cap)


def reset_signals() -> None:
    """Dispositions and mask as a fresh interpreter has them, whatever the host started us with
    (a background job, say, inherits SIGINT ignored and would pass that on to the code)."""
    import signal

    with step("reset signal dispositions"):
        for sig in signal.valid_signals():
            if sig in (signal.SIGKILL, signal.SIGSTOP):
                continue
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):  # signals reserved by the C library
                pass
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])


def set_environment(env: dict[str, str]) -> None:
    with step("set environment"):
        if os.environ:  # the common case, already empty, runs no Python code of os's
            os.environ.clear()
        if env:
            os.environ.update(env)
