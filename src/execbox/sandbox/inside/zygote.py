"""The fork servers. Each starts with an empty environment in the runtime image's interpreter,
compiles the seccomp filter and then only forks. There are three, running this same code:

  supervisors  (role "supervisors"): standard library and execbox.sandbox.inside only. Forks one
               supervisor per run slot, which builds the slot (cgroup, namespaces, root) and,
               for each run, spawns init, a small C program (see `supervisor`). Forking a small
               interpreter is cheap.
  programs     (role "programs"), twice: the heavy one imports numpy, pandas, matplotlib and
               scipy once; the light one only the standard library modules code commonly uses.
               Each forks only programs, straight into the slot a supervisor staged, reaps
               them and reports how they ended (see `program`). Code that imports nothing
               beyond the standard library runs in a fork of the light one: forking, faulting
               and tearing down a 9 MB interpreter costs a fraction of a 90 MB one.

None of them runs user code or sees a request's content (the supervisor reads that from its own
control socket), and none holds secrets: a program can read all of its zygote's memory.

Protocol on the host socket whose fd is argv[1] (SOCK_SEQPACKET): the host sends the options
(JSON), the zygote answers with one READY message (JSON). The supervisors' zygote then takes
messages that each say "<cgroup name> <program kind>" and carry one descriptor (the slot's
control socket), and starts one supervisor per message. A program zygote takes spawn requests
from the supervisors on a second socket (`spawn_fd`; the supervisors' zygote holds the other
end, one per kind in `spawn_fds`). End of file on the host socket ends any of them.
Standard library only.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from . import linux

if TYPE_CHECKING:
    from .cgroup import Hierarchy


def _writable_mplconfig() -> None:
    """matplotlib wants its config directory writable, else it makes a temporary one and
    rebuilds its font cache there: give it, in this zygote's own mount namespace, a tmpfs over
    the image's read-only one with the image's files (the jail binds the image without it)."""
    path = os.environ.get("MPLCONFIGDIR")
    if not path or not os.path.isdir(path) or os.access(path, os.W_OK):
        return
    files = {}
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as fh:
                files[name] = fh.read()
    flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    linux.mount("tmpfs", path, "tmpfs", flags, "size=16m,mode=0755")
    for name, data in files.items():
        with open(os.path.join(path, name), "wb") as fh:
            fh.write(data)


def _preload(modules: list[str]) -> list[str]:
    if "matplotlib" in modules:
        _writable_mplconfig()
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - a missing optional module is reported
            print(f"execbox zygote: cannot preload {name}: {exc}", file=sys.stderr)
    if "matplotlib" in sys.modules:
        import matplotlib

        matplotlib.use("Agg")
    if "pandas" in sys.modules:
        _exercise_pandas()
    return loaded


def _exercise_pandas() -> None:
    """Use pandas once as data code does (build, group, aggregate, describe, print), so the
    work its first use does (modules it imports lazily, caches it fills) is done here once,
    not in every program. Nothing of it is left but that: the frames are garbage."""
    pd: Any = sys.modules["pandas"]

    frame = pd.DataFrame({"k": [i % 4 for i in range(64)], "v": [i * 0.5 for i in range(64)]})
    str(frame.groupby("k")["v"].agg(["sum", "mean", "max"]))
    str(frame.describe())
    str(frame.sort_values("v").head())


def _hierarchy(rootless: dict[str, Any] | None) -> Hierarchy:
    """Where the supervisors make run cgroups: the host's, or in rootless mode the cgroup
    delegated to the user, or none (its caller accepted memory and pids unenforced)."""
    from .cgroup import Hierarchy

    if rootless is None:
        return Hierarchy.discover()
    if rootless["cgroup_version"] is None:
        return Hierarchy.none()
    return Hierarchy.delegated(rootless["cgroup_version"], rootless["cgroup_paths"])


def main(sock: socket.socket, options: dict[str, Any]) -> None:
    started = time.monotonic()
    from . import jail, linux, program, runner, seccomp

    role = options.get("role", "supervisors")
    try:
        jail.name_process(f"execbox-{options.get('kind') or 'sups'}")
        loaded = _preload(options.get("preload", []))
        if role == "programs":
            runner.exercise_errors()
        # The program part goes to every program; a program zygote installs the zygote part
        # itself once it has learned its warm pages (see `seccomp.compile_split`).
        zygote_filter, program_filter = seccomp.compile_split()
        cfg = jail.JailConfig.discover(options["ro_paths"], program_filter, options["libexec"])
        jail.empty_bounding_set(
            cfg.cap_last_cap, jail.INIT_CAPABILITIES if role == "supervisors" else frozenset()
        )
        if role == "programs":
            # What the preloaded modules read from the environment they have read: every
            # program starts from an empty one (clearing it in each fork costs ~100 page copies).
            jail.set_environment({})
        rootless = options.get("rootless")
        if rootless is not None:
            jail.share_one_uid(jail.RUN_UID if rootless.get("subordinate") else jail.UID_FIRST)
        hierarchy = _hierarchy(rootless) if role == "supervisors" else None
        demand_s = float(options["demand_s"]) if hierarchy is not None else 0.0
        if not 0.0 <= demand_s < 3600.0:
            raise ValueError(f"options: demand_s must be seconds in [0, 3600), not {demand_s}")
        # Everything imported so far lives as long as the zygote: move it out of the garbage
        # collector's reach, so a collection in a forked child does not touch (and so copy)
        # every page of the pre-imported heap.
        gc.collect()
        gc.freeze()
        # Program zygotes fork in C, skipping CPython's after-fork work (see `program`).
        if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
            raise RuntimeError("the zygote must be single-threaded to fork safely")
    except Exception as exc:  # noqa: BLE001
        sock.send(json.dumps({"ready": False, "role": role, "error": str(exc)}).encode())
        return
    hello = {
        "ready": True,
        "pid": os.getpid(),
        "role": role,
        "preloaded": loaded,
        "cgroup_version": (hierarchy.version or None) if hierarchy else None,
        "startup_ms": round((time.monotonic() - started) * 1000, 1),
    }
    if hierarchy is None:
        src_paths = options.get("src_paths", [])
        server, warm = program.start(cfg, src_paths, options.get("kind", ""))
        try:
            # From here on this zygote, and every program it forks, runs under the zygote
            # part of the filter; each program adds the program part as it is contained.
            linux.install_seccomp(linux.SeccompLoader(zygote_filter))
        except OSError as exc:
            sock.send(
                json.dumps(
                    {
                        "ready": False,
                        "role": role,
                        "error": f"install the zygote's seccomp filter: {exc}",
                    }
                ).encode()
            )
            return
        hello.update(warm, startup_ms=round((time.monotonic() - started) * 1000, 1))
        sock.send(json.dumps(hello).encode())
        program.main(cfg, server, src_paths, sock, options)
        return
    # Only here: a program zygote's forks would carry the supervisor's modules for nothing.
    from . import supervisor

    spawn = {kind: socket.socket(fileno=int(fd)) for kind, fd in options["spawn_fds"].items()}
    z = supervisor.Zygote(cfg, hierarchy, spawn, demand_s)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps supervisors
    sock.send(json.dumps(hello).encode())
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 256, 1)
        except InterruptedError:
            continue
        if not msg:
            return
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            sock.detach()
            supervisor.serve(z, fds[0], msg.decode("ascii", "replace"))
        os.close(fds[0])
