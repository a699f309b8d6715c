"""One cgroup per run, on cgroup v1 or v2: memory (and swap), pids, CPU accounting.

Everything after discovery works through directory file descriptors, because the run supervisor
keeps using its cgroup after it has pivoted into the jail's root, where /sys is not mounted.

Layout: v1 nests `execbox/` under the caller's own cgroup in each controller (runs count against
the caller's limits); v2 uses `execbox/` under the caller's cgroup when it can enable the memory
and pids controllers there, else under the hierarchy root.

Standard library only: the zygote imports this inside the runtime image.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PARENT_NAME = "execbox"
_V1_CONTROLLERS = ("memory", "pids", "cpuacct")


class CgroupUnavailable(OSError):
    pass


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fstype, _source, opts = (right.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((left.split()[4], fstype, set(opts.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or '' for v2) -> this process's cgroup path."""
    paths = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _hid, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _write(dir_fd: int, name: str, value: str) -> None:
    fd = os.open(name, os.O_WRONLY, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _reopen(new: int, at: int) -> None:
    """Put the descriptor `new` at the number `at` (closing what was there), close-on-exec."""
    try:
        os.dup2(new, at, inheritable=False)
    finally:
        os.close(new)


def _mkdir_p(path: str) -> None:
    os.makedirs(path, exist_ok=True)


# The limits only a cgroup enforces for a whole run, by their `Limits` field names.
UNENFORCED_WITHOUT_CGROUP = ("memory_mib", "pids")


@dataclass
class Hierarchy:
    """Where run cgroups are created: one parent directory per controller (one on v2)."""

    version: int
    parents: dict[str, int]  # controller ("" on v2) -> fd of the execbox parent directory
    parent_paths: dict[str, str]
    has_swap: bool

    @classmethod
    def none(cls) -> Hierarchy:
        """No cgroup at all (rootless mode, its caller having accepted memory and pids
        unenforced): runs get a RunCgroup with no directory, whose limits are not applied,
        whose CPU counts 0 and whose peak is unknown (None)."""
        return cls(0, {}, {}, False)

    @classmethod
    def delegated(cls, version: int, paths: dict[str, str]) -> Hierarchy:
        """Run cgroups under directories delegated to this user (rootless mode, see
        `host.rootless.delegated_cgroup`): `paths` maps "memory" and "pids" to theirs. A v1
        delegation has no cpuacct: the CPU counter is not read there (RLIMIT_CPU holds)."""
        if version == 1:
            parents = {c: os.path.join(paths[c], PARENT_NAME) for c in ("memory", "pids")}
            for parent in parents.values():
                _mkdir_p(parent)
            has_swap = os.path.exists(
                os.path.join(parents["memory"], "memory.memsw.limit_in_bytes")
            )
            fds = {c: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for c, p in parents.items()}
            return cls(1, fds, parents, has_swap)
        base = paths["memory"]
        if paths["pids"] != base:
            raise CgroupUnavailable(f"cgroup v2 delegation split: {base} and {paths['pids']}")
        parent = os.path.join(base, PARENT_NAME)
        _mkdir_p(parent)
        _write_path(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
        _write_path(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
        has_swap = os.path.exists(os.path.join(parent, "memory.swap.max"))
        return cls(2, {"": os.open(parent, os.O_RDONLY | os.O_DIRECTORY)}, {"": parent}, has_swap)

    @classmethod
    def discover(cls) -> Hierarchy:
        mounts = _mounts()
        own = _own_paths()
        v1 = {c: m for m, t, o in mounts if t == "cgroup" for c in o if c in _V1_CONTROLLERS}
        if "memory" not in v1 or "pids" not in v1:
            seen = []
            for mnt, fstype, _ in mounts:
                if fstype == "cgroup2":
                    hier = cls._discover_v2(mnt, own.get("", "/"))
                    if hier:
                        return hier
                    seen.append(f"cgroup v2 at {mnt} offers: {_controllers(mnt) or 'none'}")
            # One argument: an OSError's own text, with no "[Errno 0]" before it.
            raise CgroupUnavailable(
                "no usable cgroup: need memory and pids controllers (cgroup v1 or v2)"
                + "".join(f"; {s}" for s in seen)
            )
        paths = {}
        for controller, mnt in v1.items():
            parent = os.path.join(mnt + own.get(controller, "/"), PARENT_NAME)
            _mkdir_p(parent)
            paths[controller] = parent
        has_swap = os.path.exists(os.path.join(paths["memory"], "memory.memsw.limit_in_bytes"))
        return cls(
            1,
            {c: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for c, p in paths.items()},
            paths,
            has_swap,
        )

    @classmethod
    def _discover_v2(cls, mnt: str, own: str) -> Hierarchy | None:
        try:
            available = _read_path(os.path.join(mnt, "cgroup.controllers")).split()
        except OSError:
            return None
        if "memory" not in available or "pids" not in available:
            return None
        for base in (mnt + own, mnt):
            try:
                enabled = _read_path(os.path.join(base, "cgroup.subtree_control")).split()
                if base != mnt and not {"memory", "pids"} <= set(enabled):
                    continue  # cannot enable controllers below a cgroup that holds processes
                if base == mnt:
                    _write_path(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
                parent = os.path.join(base, PARENT_NAME)
                _mkdir_p(parent)
                _write_path(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
            except OSError:
                continue
            has_swap = os.path.exists(os.path.join(parent, "memory.swap.max"))
            return cls(
                2, {"": os.open(parent, os.O_RDONLY | os.O_DIRECTORY)}, {"": parent}, has_swap
            )
        return None

    def create(self, name: str) -> RunCgroup:
        """Make the run's cgroup directories and open everything the run will need."""
        dirs: dict[str, int] = {}
        try:
            for controller, parent_fd in self.parents.items():
                os.mkdir(name, 0o755, dir_fd=parent_fd)
                dirs[controller] = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent_fd)
        except OSError:
            RunCgroup(self, name, dirs).remove()
            raise
        return RunCgroup(self, name, dirs)

    def sweep_orphans(self) -> int:
        """Remove run cgroups left by executors that died without closing (named x<pid>-...)."""
        dead = set()
        for parent in self.parent_paths.values():
            for entry in os.listdir(parent):
                owner = entry[1:].split("-", 1)[0]
                if (
                    entry.startswith("x")
                    and owner.isdigit()
                    and not os.path.exists(f"/proc/{owner}")
                ):
                    dead.add(f"x{owner}-")
        return sum(self.sweep(prefix) for prefix in dead)

    def remove_named(self, name: str) -> int:
        """Remove the run cgroup called exactly `name` (killing what is left in it)."""
        return self._remove(lambda entry: entry == name)

    def sweep(self, prefix: str) -> int:
        """Remove leftover run cgroups whose name starts with `prefix`; return how many."""
        return self._remove(lambda entry: entry.startswith(prefix))

    def _remove(self, wanted: Callable[[str], bool]) -> int:
        removed = 0
        for parent in self.parent_paths.values():
            for entry in os.listdir(parent):
                path = os.path.join(parent, entry)
                if wanted(entry) and os.path.isdir(path):
                    _kill_procs(path)
                    try:
                        os.rmdir(path)
                        removed += 1
                    except OSError:
                        pass
        return removed


def _controllers(mnt: str) -> str:
    try:
        return _read_path(os.path.join(mnt, "cgroup.controllers")).strip()
    except OSError as exc:
        return f"unreadable ({exc.strerror})"


def _read_path(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write_path(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _kill_procs(path: str) -> None:
    import signal

    for _ in range(50):
        try:
            pids = [int(p) for p in _read_path(os.path.join(path, "cgroup.procs")).split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


@dataclass
class RunCgroup:
    hierarchy: Hierarchy
    name: str
    dirs: dict[str, int]
    applied: tuple[int, int] | None = None
    # The file pages the cgroup held at the last peak reset (see `memory_peak`).
    file_base: int = 0
    # Whether each run gets the cgroup anew (`renew`): the kernel keeps a peak but cannot
    # start it over (v2 before 6.12). Known once the peak file is open (`_peak_fd`).
    renews: bool = False
    _peak: int | None = None
    # Counter files stay open once read (a session reads some at every cell): one pread
    # each time instead of open, read and close. Closed by `remove`.
    _kept: dict[tuple[int, str, int], int] = field(default_factory=dict)

    @property
    def v2(self) -> bool:
        return self.hierarchy.version == 2

    def _mem(self) -> int:
        return self.dirs["" if self.v2 else "memory"]

    def unenforced(self) -> list[str]:
        """The run's limits (contract names) this cgroup does not hold: both with no cgroup."""
        return [] if self.dirs else list(UNENFORCED_WITHOUT_CGROUP)

    def set_limits(self, memory_bytes: int, pids: int) -> bool:
        """Memory (RAM and swap) and pids limits; writes only what changed (and says whether
        anything did)."""
        if self.applied == (memory_bytes, pids):
            return False
        if not self.dirs:  # no cgroup (`Hierarchy.none`): accepted unenforced
            pass
        elif self.v2:
            d = self.dirs[""]
            _write(d, "memory.max", str(memory_bytes))
            if self.hierarchy.has_swap:
                _write(d, "memory.swap.max", "0")
            _write(d, "pids.max", str(pids))
        else:
            mem = self.dirs["memory"]
            names = ["memory.limit_in_bytes"]
            if self.hierarchy.has_swap:
                names.append("memory.memsw.limit_in_bytes")
            try:  # lowering: the RAM limit must go first (it may not exceed RAM+swap)
                for name in names:
                    _write(mem, name, str(memory_bytes))
            except OSError:  # raising: RAM+swap first
                for name in reversed(names):
                    _write(mem, name, str(memory_bytes))
            _write(self.dirs["pids"], "pids.max", str(pids))
        self.applied = (memory_bytes, pids)
        return True

    def _kept_fd(self, dir_fd: int, name: str, flags: int) -> int:
        key = (dir_fd, name, flags)
        fd = self._kept.get(key)
        if fd is None:
            fd = self._kept[key] = os.open(name, flags | os.O_CLOEXEC, dir_fd=dir_fd)
        return fd

    def _read(self, dir_fd: int, name: str) -> str:
        return os.pread(self._kept_fd(dir_fd, name, os.O_RDONLY), 65536, 0).decode()

    def cpu_ns(self) -> int:
        if not self.dirs:
            return 0
        if self.v2:
            for line in self._read(self.dirs[""], "cpu.stat").splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) * 1000
            return 0
        if "cpuacct" in self.dirs:
            return int(self._read(self.dirs["cpuacct"], "cpuacct.usage"))
        return 0

    def _peak_fd(self) -> int:
        # One descriptor for reading and resetting: on v2 a reset holds for reads through the
        # descriptor that wrote it. Whether it resets is tried once, on the new cgroup.
        if self._peak is None:
            name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
            try:
                fd = self._kept_fd(self._mem(), name, os.O_RDWR)
            except PermissionError:
                fd = self._kept_fd(self._mem(), name, os.O_RDONLY)
            try:
                os.pwrite(fd, b"0", 0)
            except OSError as exc:  # v2 before 6.12: read-only, or no writer (EINVAL)
                if exc.errno not in (errno.EBADF, errno.EINVAL):
                    raise
                self.renews = True
            self._peak = fd
        return self._peak

    def memory_peak(self) -> int | None:
        """The most memory the cgroup held since the last reset, less the file pages it held
        then; None where the kernel keeps no peak (v2 before 5.19). Page cache stays charged
        to the cgroup that read it in after its readers are gone: a slot's last runs' file
        reads would otherwise count in every later run's peak (64 MiB read by one run showed
        as ~90 MiB in each later `print(1)` of its slot), and tell that run how much they
        read. Only those still charged now are left out: near its limit the run's own memory
        took the place of those the kernel reclaimed, and the peak is all its own. A run that
        evicts them itself reads low by what it evicted."""
        if not self.dirs:
            return None
        try:
            fd = self._peak_fd()
        except FileNotFoundError:
            return None
        peak = int(os.pread(fd, 64, 0))
        if not self.file_base:
            return peak
        return max(0, peak - min(self.file_base, self.file_bytes()))

    def reset_memory_peak(self) -> None:
        """Start the peak over (set-up of a staged slot is not the code's memory), and take
        the file pages the cgroup holds now as the next peak's baseline. Where the peak cannot
        be reset the cgroup is this run's alone (`renew`): its peak is already the run's."""
        if not self.dirs:
            return
        try:
            fd = self._peak_fd()
        except FileNotFoundError:
            return
        if not self.renews:
            os.pwrite(fd, b"0", 0)
        self.file_base = self.file_bytes()

    def renew(self) -> None:
        """Remove the cgroup and make it anew under its name, with its limits, each kept
        descriptor reopened at its old number (the C steps hold them). For kernels that cannot
        reset the peak (v2 before 6.12): a reused cgroup's peak is its lifetime's, an earlier
        run's (another tenant's) memory use. The cgroup must hold no process."""
        kept = list(self._kept.items())
        for controller, dir_fd in self.dirs.items():
            parent = self.hierarchy.parents[controller]
            os.rmdir(self.name, dir_fd=parent)
            os.mkdir(self.name, 0o755, dir_fd=parent)
            _reopen(os.open(self.name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent), dir_fd)
        for (dir_fd, name, flags), fd in kept:
            _reopen(os.open(name, flags | os.O_CLOEXEC, dir_fd=dir_fd), fd)
        applied, self.applied = self.applied, None
        if applied is not None:
            self.set_limits(*applied)
        self.file_base = 0

    def memory_bytes(self) -> int:
        """Memory charged to the cgroup now (page cache and tmpfs included); 0 when
        unreadable or with no cgroup."""
        if not self.dirs:
            return 0
        try:
            return int(
                self._read(self._mem(), "memory.current" if self.v2 else "memory.usage_in_bytes")
            )
        except (OSError, ValueError):
            return 0

    def file_bytes(self) -> int:
        """Page cache charged to the cgroup (and any below it, as its peak counts them): file
        pages on its LRU lists, tmpfs pages not among them. 0 when unreadable."""
        keys = self._file_keys()
        try:
            stat = self._read(self._mem(), "memory.stat")
            return sum(
                int(value)
                for key, _, value in (line.partition(" ") for line in stat.splitlines())
                if key in keys
            )
        except (OSError, ValueError):
            return 0

    def counter_files(self) -> tuple[int, bool, int, int, bool, int, tuple[str, str]]:
        """The kept descriptors the supervisor's C steps read and reset (`linux.SlotSteps`,
        the same counters as `cpu_ns`, `oom_kills`, `memory_peak` and `file_bytes`): CPU (-1:
        none) and whether it is v2's cpu.stat, OOM kills, the peak (-1: none) and whether it
        resets (not `renews`), memory.stat,
        and memory.stat's file-page keys."""
        if not self.dirs:  # no cgroup: nothing to read, no OOM kill counted, no peak
            return -1, False, -1, -1, False, -1, self._file_keys()
        if self.v2:
            cpu = self._kept_fd(self.dirs[""], "cpu.stat", os.O_RDONLY)
        else:
            cpu = (
                self._kept_fd(self.dirs["cpuacct"], "cpuacct.usage", os.O_RDONLY)
                if "cpuacct" in self.dirs
                else -1
            )
        oom = self._kept_fd(self._mem(), self._oom_file(), os.O_RDONLY)
        try:
            peak = self._peak_fd()
        except FileNotFoundError:  # no peak file (v2 before 5.19): unknown, as `memory_peak`
            peak = -1
        stat = self._kept_fd(self._mem(), "memory.stat", os.O_RDONLY)
        return cpu, self.v2, oom, peak, not self.renews, stat, self._file_keys()

    def procs_files(self) -> list[int]:
        """The cgroup's cgroup.procs in each controller's directory, open for writing for the
        cgroup's life: init and each program join the cgroup by writing to their own copies
        (see `native/stage.c`), where opening them for every run cost the supervisor three
        opens and closes a run on v1."""
        return [self._kept_fd(d, "cgroup.procs", os.O_WRONLY) for d in self.dirs.values()]

    def _file_keys(self) -> tuple[str, str]:
        """memory.stat's counters of the file pages on the cgroup's LRU lists."""
        return (
            ("active_file", "inactive_file")
            if self.v2
            else ("total_active_file", "total_inactive_file")
        )

    def _oom_file(self) -> str:
        """The file with the cgroup's "oom_kill N" line."""
        return "memory.events" if self.v2 else "memory.oom_control"

    def oom_kills(self) -> int:
        if not self.dirs:
            return 0
        for line in self._read(self._mem(), self._oom_file()).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        """Remove the run's directories (the cgroup must hold no processes any more)."""
        for fd in self._kept.values():
            os.close(fd)
        self._kept.clear()
        self._peak = None
        for controller, fd in list(self.dirs.items()):
            os.close(fd)
            try:
                os.rmdir(self.name, dir_fd=self.hierarchy.parents[controller])
            except FileNotFoundError:
                pass
        self.dirs.clear()
