"""The fork server. Started with an empty environment in the runtime image's interpreter, it
imports the heavy modules once, compiles the seccomp filter, discovers the cgroup hierarchy and
then only forks: one supervisor per request. It never runs user code and never sees a request's
content (the supervisor reads that from its own control socket).

Protocol on the socket whose fd is argv[1] (SOCK_SEQPACKET): the host sends the options (JSON), the zygote answers with
one READY message (JSON); each message it receives names a cgroup and carries four descriptors (control socket, stdin,
stdout, stderr of one run slot) and starts one supervisor, which stages the slot. End of file ends the zygote.
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
from typing import Any


def _preload(modules: list[str]) -> list[str]:
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
    return loaded


def main(sock: socket.socket, options: dict[str, Any]) -> None:
    started = time.monotonic()
    from . import jail, seccomp, supervisor
    from .cgroup import Hierarchy

    try:
        loaded = _preload(options.get("preload", []))
        cfg = jail.JailConfig.discover(options["ro_paths"], seccomp.compile_filter())
        hierarchy = Hierarchy.discover()
        # Everything imported so far lives as long as the zygote: move it out of the garbage
        # collector's reach, so a collection in a forked child does not touch (and so copy)
        # every page of the pre-imported heap.
        gc.collect()
        gc.freeze()
        if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
            raise RuntimeError("the zygote must be single-threaded to fork safely")
    except Exception as exc:  # noqa: BLE001
        sock.send(json.dumps({"ready": False, "error": str(exc)}).encode())
        return
    z = supervisor.Zygote(cfg, hierarchy, options.get("src_paths", []))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps supervisors
    sock.send(json.dumps({
        "ready": True,
        "pid": os.getpid(),
        "preloaded": loaded,
        "cgroup_version": hierarchy.version,
        "startup_ms": round((time.monotonic() - started) * 1000, 1),
    }).encode())
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 64, 4)
        except InterruptedError:
            continue
        if not msg:
            return
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            sock.detach()
            supervisor.serve(z, fds, msg.decode("ascii", "replace"))
        for fd in fds:
            os.close(fd)


