"""The syscall filter, attacked from inside real runs: the refusals the policy table promises
(test_seccomp_table checks the table against the loaded BPF) reach real programs, and what data
code calls still works under the allow list. Hostile programs run only through `jailed`."""

from __future__ import annotations

import ctypes
import errno
import json
import platform
import socket
import textwrap
from typing import Any

import pytest

from execbox import Executor, Limits, RunResult, Status

SMALL = Limits(timeout_s=10, memory_mib=512, pids=64)
# Calls numbered alike on every architecture since Linux 5.1 (424 on), whether or not this
# libseccomp can name them yet.
COMMON_NUMBERS = {
    "landlock_create_ruleset": 444,
    "memfd_secret": 447,
    "cachestat": 451,
    "statmount": 457,
    "listmount": 458,
    "mseal": 462,
}

PRELUDE = r'''
import ctypes, errno, json, os, socket, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def sys_call(nr, *args):
    """[return value, errno name] of a raw system call; every argument a full 64-bit long."""
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a
                                            for a in args])
    err = ctypes.get_errno()
    return [rc, errno.errorcode.get(err, str(err)) if rc == -1 else None]

def attempt(fn):
    try:
        fn()
        return "OK"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def report(obj):
    print(json.dumps(obj), flush=True)
'''


def nr(name: str) -> int:
    if name in COMMON_NUMBERS:
        return COMMON_NUMBERS[name]
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    number = int(lib.seccomp_syscall_resolve_name(name.encode()))
    if number < 0:
        pytest.skip(f"no {name} on {platform.machine()}")
    return number


def describe(r: RunResult) -> str:
    return (
        f"status={r.status} exit={r.exit_code} signal={r.signal} error={r.error}\n"
        f"stdout={r.stdout[-2000:]!r}\nstderr={r.stderr[-3000:]!r}"
    )


def run_ok(ex: Executor, code: str, **subst: object) -> dict[str, Any]:
    """Run a program that must finish normally and print one JSON line last; return it."""
    body = textwrap.dedent(code)
    for key, value in subst.items():
        body = body.replace(f"@{key}@", str(value))
    r = ex.run(PRELUDE + body, limits=SMALL)
    assert r.status is Status.ok, describe(r)
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.hostile
def test_netlink_socket_with_high_bits_in_the_family_is_refused(jailed: Executor) -> None:
    """Issue 27: the filter compared all 64 bits of the family, the kernel reads the low 32."""
    out = run_ok(
        jailed,
        """
        AF_NETLINK, NETLINK_ROUTE = 16, 0
        res = {}
        for high in (0, 1 << 32, 0xFFFFFFFF << 32):
            for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
                res[f"{high:#x} {kind}"] = sys_call(@SOCKET@, high | AF_NETLINK, kind,
                                                    NETLINK_ROUTE)
        res["plain"] = attempt(lambda: socket.socket(AF_NETLINK, socket.SOCK_DGRAM, 0))
        res["packet"] = sys_call(@SOCKET@, (1 << 32) | 17, socket.SOCK_DGRAM, 0)
        res["raw_inet"] = sys_call(@SOCKET@, (1 << 32) | socket.AF_INET,
                                   (1 << 32) | socket.SOCK_RAW, 1)
        res["tcp"] = sys_call(@SOCKET@, (1 << 32) | socket.AF_INET, socket.SOCK_STREAM, 0)
        report(res)
    """,
        SOCKET=nr("socket"),
    )
    for high in ("0x0", "0x100000000", "0xffffffff00000000"):
        for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
            assert out[f"{high} {kind}"] == [-1, "EAFNOSUPPORT"], out
    assert out["plain"] == "EAFNOSUPPORT", out
    assert out["packet"] == [-1, "EAFNOSUPPORT"], out
    assert out["raw_inet"] == [-1, "EPERM"], out
    assert out["tcp"][0] >= 0, out  # the kernel reads AF_INET: allowed, as the filter must see


@pytest.mark.hostile
def test_calls_off_the_allow_list_fail_with_enosys(jailed: Executor) -> None:
    calls = {
        "personality_linux32": (nr("personality"), 0x0008),
        "personality_query": (nr("personality"), 0xFFFFFFFF),
        "landlock_create_ruleset": (nr("landlock_create_ruleset"), 0, 0, 1),
        "memfd_secret": (nr("memfd_secret"), 0),
        "listmount": (nr("listmount"), 0, 0, 0, 0),
        "statmount": (nr("statmount"), 0, 0, 0, 0),
        "mseal": (nr("mseal"), 0, 0, 0),
    }
    if platform.machine() == "x86_64":
        calls["modify_ldt"] = (nr("modify_ldt"), 0, 0, 0)  # read the LDT
    out = run_ok(
        jailed,
        """
        report({name: sys_call(*call) for name, call in json.loads('@CALLS@').items()})
    """,
        CALLS=json.dumps(calls),
    )
    assert out == {name: [-1, "ENOSYS"] for name in calls}, out


@pytest.mark.hostile
def test_host_observation_calls_are_refused(jailed: Executor) -> None:
    """inotify on the shared read-only tree, and the page-cache probes (mincore, cachestat,
    RWF_NOWAIT reads) would show the host's and other tenants' activity."""
    out = run_ok(
        jailed,
        """
        import mmap
        res = {"inotify_init1": sys_call(@INOTIFY_INIT1@, 0)}
        # On a descriptor the program has (stdin): refused before the kernel looks at it.
        res["inotify_add_watch"] = sys_call(@INOTIFY_ADD_WATCH@, 0, b"/usr/bin", 0xFFF)
        page = mmap.mmap(-1, mmap.PAGESIZE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        vec = ctypes.create_string_buffer(1)
        res["mincore"] = sys_call(@MINCORE@, addr, mmap.PAGESIZE, vec)
        fd = os.open(sys.executable, os.O_RDONLY)
        res["cachestat"] = sys_call(@CACHESTAT@, fd, ctypes.create_string_buffer(16),
                                    ctypes.create_string_buffer(64), 0)
        buf = bytearray(16)
        res["preadv2_nowait"] = attempt(lambda: os.preadv(fd, [buf], 0, os.RWF_NOWAIT))
        iov = (ctypes.c_void_p * 2)(ctypes.addressof(ctypes.c_char.from_buffer(buf)), 16)
        res["preadv2_nowait_high"] = sys_call(@PREADV2@, fd, iov, 1, 0, 0, (1 << 32) | 0x8)
        res["preadv2_hipri_high"] = sys_call(@PREADV2@, fd, iov, 1, 0, 0, (1 << 32) | 0x1)
        res["preadv2"] = os.preadv(fd, [buf], 0, 0)
        res["pwritev2_nowait"] = sys_call(@PWRITEV2@, os.open("f", os.O_CREAT | os.O_WRONLY),
                                          iov, 1, 0, 0, 0x8)
        res["mapped_bytes_read"] = bytes(buf[:4]) == open(sys.executable, "rb").read(4)
        report(res)
    """,
        INOTIFY_INIT1=nr("inotify_init1"),
        INOTIFY_ADD_WATCH=nr("inotify_add_watch"),
        MINCORE=nr("mincore"),
        CACHESTAT=nr("cachestat"),
        PREADV2=nr("preadv2"),
        PWRITEV2=nr("pwritev2"),
    )
    eopnotsupp = errno.errorcode[errno.EOPNOTSUPP]  # named ENOTSUP too, the same number
    assert out == {
        "inotify_init1": [-1, "ENOSYS"],
        "inotify_add_watch": [-1, "ENOSYS"],
        "mincore": [-1, "ENOSYS"],
        "cachestat": [-1, "ENOSYS"],
        "preadv2_nowait": eopnotsupp,
        "preadv2_nowait_high": [-1, eopnotsupp],
        "preadv2_hipri_high": [16, None],
        "preadv2": 16,
        "pwritev2_nowait": [-1, eopnotsupp],
        "mapped_bytes_read": True,
    }, out


def test_data_code_threads_processes_and_loopback_sockets_still_work(executor: Executor) -> None:
    out = run_ok(
        executor,
        """
        import multiprocessing, subprocess, threading
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
        import pandas as pd
        from scipy import linalg, optimize, sparse, stats

        res = {}
        a = np.random.default_rng(0).random((200, 200))
        res["numpy"] = bool(np.allclose(a @ np.linalg.inv(a), np.eye(200), atol=1e-6))
        frame = pd.DataFrame({"k": np.arange(100) % 3, "v": np.arange(100.0)})
        frame.to_csv("f.csv")
        res["pandas"] = pd.read_csv("f.csv").groupby("k").v.sum().tolist()
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3])
        fig.savefig("plot.png")
        res["png"] = open("plot.png", "rb").read(8) == b"\\x89PNG\\r\\n\\x1a\\n"
        res["scipy"] = [round(optimize.minimize_scalar(lambda x: (x - 2) ** 2).x, 3),
                        round(float(stats.norm.cdf(0)), 3),
                        float(linalg.det(np.eye(3))), float(sparse.eye(4).sum())]
        box = []
        threads = [threading.Thread(target=box.append, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        res["threads"] = sorted(box)
        res["sh"] = subprocess.run(["/bin/sh", "-c", "echo $((6 * 7))"], capture_output=True,
                                   text=True).stdout
        with multiprocessing.get_context("fork").Pool(2) as pool:
            res["pool"] = pool.map(abs, [-1, -2, -3])
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family) as server:
                server.bind((host, 0))
                server.listen()
                with socket.create_connection(server.getsockname()[:2]) as client:
                    peer, _ = server.accept()
                    client.sendall(b"ping")
                    res[family.name] = peer.recv(4).decode()
                    peer.close()
        left, right = socket.socketpair()
        left.send(b"unix")
        res["socketpair"] = right.recv(4).decode()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        udp.sendto(b"udp", udp.getsockname())
        res["udp"] = udp.recv(3).decode()
        report(res)
    """,
    )
    assert out == {
        "numpy": True,
        "pandas": [1683.0, 1617.0, 1650.0],
        "png": True,
        "scipy": [2.0, 0.5, 1.0, 4.0],
        "threads": list(range(8)),
        "sh": "42\n",
        "pool": [1, 2, 3],
        "AF_INET": "ping",
        "AF_INET6": "ping",
        "socketpair": "unix",
        "udp": "udp",
    }, out
