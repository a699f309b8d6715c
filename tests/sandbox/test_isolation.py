"""Attack tests: every isolation claim of the sandbox, attacked from inside a real run.

Each hostile program reports what it observed (an errno name, an exception type, a list of
pids) as one JSON line, and the test asserts the precise denial. Where a claim is about the
host (a listener, a canary file, a process), the test sets up the real thing on the host and
checks it from the host side too, with a positive control proving the check can see a hit.
Hostile programs run only through the `jailed` fixture, which has proven the jail is active.
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import select
import signal
import socket
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import execbox
from execbox import Executor, Limits, RunResult, Status
from execbox.image import home
from execbox.sandbox.host import zygotes
from execbox.sandbox.inside import jail
from execbox.sandbox.inside.cgroup import Hierarchy
from tests.probes import alive, host_internals, host_stats, wait_heavy, wait_until

SMALL = Limits(timeout_s=3, memory_mib=256, pids=32)
# A run's own private dirty memory, in KiB: the pages its program holds as its own copies.
PRIVATE_DIRTY_KIB = (
    "with open('/proc/self/smaps_rollup') as fh:\n"
    "    print(fh.read().split('Private_Dirty:')[1].split()[0])\n"
)


@pytest.fixture(params=["run", "cell"])
def jailed(
    request: pytest.FixtureRequest, jailed: Executor, as_session_cells: type[Any]
) -> Executor:
    """Every attack runs twice: as a run, and as a cell of a fresh session (same jail)."""
    if request.param == "cell":
        return as_session_cells(jailed)  # type: ignore[no-any-return]
    return jailed


SANDBOX_UIDS = range(jail.UID_FIRST, jail.UID_FIRST + jail.UID_COUNT)  # one per slot
# Slots take the lowest free uids: more than the executors of every test worker hold at once.
VICTIMS = 256

# What every hostile program starts with: name the errno of whatever failed.
PRELUDE = r'''
import ctypes, errno, json, os, socket, sys, time

def ename(exc):
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return type(exc).__name__

def attempt(fn):
    try:
        fn()
        return "OK"
    except BaseException as exc:
        return ename(exc)

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def checked(rc):
    """[return value, errno name] of a raw libc call."""
    err = ctypes.get_errno()
    return [rc, errno.errorcode.get(err, str(err)) if rc == -1 else None]

def call(name, *args):
    ctypes.set_errno(0)
    return checked(getattr(libc, name)(*args))

def sys_call(nr, *args):
    ctypes.set_errno(0)
    return checked(libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a
                                                      for a in args]))

def report(obj):
    print(json.dumps(obj), flush=True)
'''

# Syscall numbers the hostile programs call by number.
SYSCALLS = {
    "x86_64": {
        "bpf": 321,
        "clone3": 435,
        "pivot_root": 155,
        "fsopen": 430,
        "clone": 56,
        "setns": 308,
    },
    "aarch64": {
        "bpf": 280,
        "clone3": 435,
        "pivot_root": 41,
        "fsopen": 430,
        "clone": 220,
        "setns": 268,
    },
}


def nr(name: str) -> int:
    table = SYSCALLS.get(platform.machine())
    if table is None:
        pytest.skip(f"no syscall numbers for {platform.machine()}")
    return table[name]


def program(code: str, **subst: object) -> str:
    body = textwrap.dedent(code)
    for key, value in subst.items():
        body = body.replace(f"@{key}@", str(value))
    assert not re.search(r"@[A-Z0-9_]+@", body), "unsubstituted placeholder"
    return PRELUDE + body


def describe(r: RunResult) -> str:
    return (
        f"status={r.status} exit={r.exit_code} signal={r.signal} error={r.error}\n"
        f"stdout={r.stdout!r}\nstderr={r.stderr[-3000:]!r}"
    )


def run_ok(ex: Executor, code: str, **kwargs: Any) -> dict[str, Any]:
    """Run a program that must finish normally and print one JSON line last; return it."""
    kwargs.setdefault("limits", SMALL)
    r = ex.run(code, **kwargs)
    assert r.status is Status.ok, describe(r)
    lines = r.stdout.strip().splitlines()
    assert lines, describe(r)
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# ---- host-side helpers ------------------------------------------------------------------------


def host_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def host_cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def host_pids_with_cmdline(cmdline: bytes) -> list[int]:
    return [pid for pid in host_pids() if host_cmdline(pid) == cmdline]


def poll_host_cmdline(cmdline: bytes, *, gone: bool, timeout: float) -> list[int]:
    """The host pids with `cmdline`, polled until there are some (or none, when `gone`) or
    `timeout` passes: an exec'd process shows its argv a moment after its parent sees the exec
    succeed, and a killed one can still show a moment after its run's result came."""
    deadline = time.monotonic() + timeout
    while True:
        found = host_pids_with_cmdline(cmdline)
        if bool(found) != gone or time.monotonic() >= deadline:
            return found
        time.sleep(0.02)


def host_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def host_lan_ipv4() -> str | None:
    """A non-loopback IPv4 address of this host, or None."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    addrs: list[str] = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", out)
    for addr in addrs:
        if not addr.startswith("127."):
            return addr
    try:  # no `ip`: ask the routing table which source address it would use
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            addr = s.getsockname()[0]
            return None if addr.startswith("127.") or addr == "0.0.0.0" else addr
    except OSError:
        return None


def assert_no_pending_connection(server: socket.socket) -> None:
    server.settimeout(0.3)
    try:
        conn, peer = server.accept()
    except TimeoutError:
        return
    conn.close()
    pytest.fail(f"the host listener received a connection from {peer}")


def assert_listener_works(server: socket.socket, address: Any, family: int) -> None:
    """Positive control: the host itself can reach the listener."""
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        client.connect(address)
        server.settimeout(2)
        conn, _ = server.accept()
        conn.close()


def in_thread(fn: Callable[[], RunResult]) -> tuple[threading.Thread, list[Any]]:
    """Start fn in a thread; the list receives its result or the exception it raised."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def joined(thread: threading.Thread, box: list[Any], timeout: float = 20) -> RunResult:
    thread.join(timeout)
    assert not thread.is_alive(), "the run did not return"
    assert box, "the run thread produced nothing"
    if isinstance(box[0], BaseException):
        raise box[0]
    result: RunResult = box[0]
    return result


# ---- network ----------------------------------------------------------------------------------


@pytest.mark.hostile
def test_host_loopback_tcp_is_unreachable(jailed: Executor) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        out = run_ok(
            jailed,
            program(
                """
            def connect():
                socket.create_connection(("127.0.0.1", @PORT@), timeout=2).close()
            report({"connect": attempt(connect)})
        """,
                PORT=port,
            ),
        )
        # The run has a loopback of its own: nothing listens on that port there.
        assert out == {"connect": "ECONNREFUSED"}
        assert_no_pending_connection(server)
        assert_listener_works(server, ("127.0.0.1", port), socket.AF_INET)


@pytest.mark.hostile
def test_host_loopback_udp_datagrams_do_not_arrive(jailed: Executor) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        out = run_ok(
            jailed,
            program(
                """
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sent = attempt(lambda: [s.sendto(b"escape", ("127.0.0.1", @PORT@)) for _ in range(5)])
            report({"sent": sent})
        """,
                PORT=port,
            ),
        )
        assert out == {"sent": "OK"}  # sent into the run's own loopback, where nobody listens
        server.settimeout(0.3)
        with pytest.raises(TimeoutError):
            data, peer = server.recvfrom(100)
            pytest.fail(f"the host received {data!r} from {peer}")


@pytest.mark.hostile
def test_host_lan_address_is_unreachable(jailed: Executor) -> None:
    lan = host_lan_ipv4()
    if lan is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    with socket.create_server((lan, 0)) as server:
        port = server.getsockname()[1]
        out = run_ok(
            jailed,
            program(
                """
            def connect():
                socket.create_connection(("@LAN@", @PORT@), timeout=2).close()
            report({"connect": attempt(connect)})
        """,
                LAN=lan,
                PORT=port,
            ),
        )
        assert out == {"connect": "ENETUNREACH"}, f"host LAN address {lan}"
        assert_no_pending_connection(server)
        assert_listener_works(server, (lan, port), socket.AF_INET)


@pytest.mark.hostile
def test_public_internet_addresses_are_unreachable(jailed: Executor) -> None:
    out = run_ok(
        jailed,
        program("""
        def tcp(family, addr):
            def go():
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.settimeout(2)
                    s.connect(addr)
            return go
        def udp_dns():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"\\0" * 12, ("8.8.8.8", 53))
        report({
            "tcp4": attempt(tcp(socket.AF_INET, ("1.1.1.1", 443))),
            "udp4_dns": attempt(udp_dns),
            "tcp6": attempt(tcp(socket.AF_INET6, ("2606:4700:4700::1111", 443))),
        })
    """),
    )
    assert out["tcp4"] == "ENETUNREACH", out
    assert out["udp4_dns"] == "ENETUNREACH", out
    assert out["tcp6"] in ("ENETUNREACH", "EAFNOSUPPORT", "EADDRNOTAVAIL"), out


@pytest.mark.hostile
def test_dns_resolution_of_public_names_fails(jailed: Executor) -> None:
    out = run_ok(
        jailed,
        program("""
        res = {}
        for name in ("pypi.org", "example.com"):
            try:
                res[name] = sorted({ai[4][0] for ai in socket.getaddrinfo(name, 443)})
            except socket.gaierror as exc:
                res[name] = ["gaierror", exc.errno]
        res["localhost"] = sorted({ai[4][0] for ai in socket.getaddrinfo("localhost", 80,
                                                                          socket.AF_INET)})
        with open("/etc/resolv.conf") as fh:
            res["resolv.conf"] = fh.read()
        report(res)
    """),
    )
    for name in ("pypi.org", "example.com"):
        assert out[name][0] == "gaierror", (name, out)
        assert out[name][1] in (socket.EAI_NONAME, socket.EAI_AGAIN, socket.EAI_FAIL), out
    assert out["localhost"] == ["127.0.0.1"], out  # control: the resolver itself works
    assert out["resolv.conf"] == "", out


@pytest.mark.hostile
def test_host_abstract_unix_socket_is_unreachable(jailed: Executor) -> None:
    name = f"execbox-test-{secrets.token_hex(8)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("\0" + name)
        server.listen()
        out = run_ok(
            jailed,
            program(
                """
            def connect():
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(2)
                    s.connect("\\0@NAME@")
            report({"connect": attempt(connect)})
        """,
                NAME=name,
            ),
        )
        assert out == {"connect": "ECONNREFUSED"}
        assert_no_pending_connection(server)
        assert_listener_works(server, "\0" + name, socket.AF_UNIX)


@pytest.mark.hostile
def test_host_unix_socket_file_is_unreachable(jailed: Executor, tmp_path: Path) -> None:
    path = str(tmp_path / "host.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen()
        out = run_ok(
            jailed,
            program(
                """
            def connect():
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(2)
                    s.connect("@PATH@")
            report({"connect": attempt(connect)})
        """,
                PATH=path,
            ),
        )
        assert out == {"connect": "ENOENT"}
        assert_no_pending_connection(server)
        assert_listener_works(server, path, socket.AF_UNIX)


@pytest.mark.hostile
def test_only_network_interface_is_loopback(jailed: Executor) -> None:
    out = run_ok(
        jailed,
        program("""
        with open("/proc/net/dev") as fh:
            ifaces = sorted(line.split(":")[0].strip() for line in fh.readlines()[2:])
        with open("/proc/net/route") as fh:
            routes = fh.readlines()[1:]
        # control: the run can talk to itself over its own loopback
        srv = socket.create_server(("127.0.0.1", 0))
        cli = socket.create_connection(srv.getsockname(), timeout=2)
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        report({"ifaces": ifaces, "routes": routes, "self": conn.recv(4).decode(),
                "hostname": socket.gethostname()})
    """),
    )
    assert out["ifaces"] == ["lo"], out
    assert out["routes"] == [], out
    assert out["self"] == "ping", out
    assert out["hostname"] == "sandbox", out


# ---- host files, descriptors and secrets ------------------------------------------------------


@pytest.mark.hostile
def test_host_canary_files_are_invisible(jailed: Executor, tmp_path: Path) -> None:
    token = secrets.token_hex(16)
    canaries = [
        tmp_path / f"canary-{token}",
        Path("/tmp") / f"execbox-canary-{token}",
        Path("/root") / f"execbox-canary-{token}",
        Path("/etc") / f"execbox-canary-{token}",
    ]
    control = os.path.realpath("/usr/bin/env")  # on the host and bound read-only into runs
    # execbox's own source checkout (src layout) and its home, which holds the image's tree.
    checkout = str(Path(execbox.__file__).resolve().parents[2])
    execbox_home = str(home().resolve())
    try:
        for path in canaries:
            path.write_text(token)
        out = run_ok(
            jailed,
            program(
                """
            paths = json.loads('@PATHS@')
            res = {}
            for p in paths:
                def read(p=p):
                    with open(p, "rb") as fh:
                        fh.read()
                res[p] = [os.path.exists(p), attempt(read),
                          os.path.basename(p) in (os.listdir(os.path.dirname(p))
                                                  if os.path.isdir(os.path.dirname(p)) else [])]
            report(res)
        """,
                PATHS=json.dumps(
                    [str(p) for p in canaries]
                    + ["/etc/shadow", checkout, execbox_home, "/proc/1/root/etc/shadow"]
                    + [control]
                ),
            ),
        )
    finally:
        for path in canaries:
            path.unlink(missing_ok=True)
    for path in canaries:
        assert out[str(path)] == [False, "ENOENT", False], (path, out)
    assert out["/etc/shadow"] == [False, "ENOENT", False], out
    assert out[checkout][0] is False, out  # execbox's own source is not there
    assert out[execbox_home][0] is False, out  # nor its home, with the image's host path
    assert out["/proc/1/root/etc/shadow"][0] is False, out
    assert out[control] == [True, "OK", True], out  # control: the checks do see bound files


@pytest.mark.hostile
def test_no_host_descriptors_are_inherited(jailed: Executor) -> None:
    out = run_ok(
        jailed,
        program("""
        fds = {}
        for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
            try:
                fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the descriptor listdir used, closed by now
                pass
        report(fds)
    """),
    )
    assert set(out) >= {"0", "1", "2"}, out
    others = {fd: target for fd, target in out.items() if not target.startswith("pipe:")}
    assert others == {}, f"descriptors other than pipes leak into the run: {others}"
    # stdio, the error-record pipe and the exit-report pipe, nothing else
    assert len(out) <= 5, f"more descriptors than stdio and the two report pipes: {out}"


@pytest.mark.hostile
def test_host_environment_canary_is_not_visible(
    jailed: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, secret = f"EXECBOX_CANARY_{secrets.token_hex(4).upper()}", secrets.token_hex(16)
    monkeypatch.setenv(name, secret)
    code = program("""
        import subprocess
        child = subprocess.run(["/usr/bin/env"], capture_output=True, text=True).stdout
        report({"environ": dict(os.environ), "child": child})
    """)
    # The session executor started before the canary existed; a fresh one starts after it.
    with Executor() as fresh:
        results = [run_ok(jailed, code), run_ok(fresh, code)]
    for out in results:
        assert name not in out["environ"] and secret not in json.dumps(out), out
        assert out == {"environ": {}, "child": ""}, out


def test_run_environment_is_empty_by_default(executor: Executor) -> None:
    out = run_ok(
        executor,
        program("""
        import subprocess
        child = subprocess.run(["/usr/bin/env"], capture_output=True, text=True).stdout
        report({"environ": dict(os.environ), "child": child})
    """),
    )
    assert out == {"environ": {}, "child": ""}


def test_env_argument_arrives_exactly(executor: Executor) -> None:
    out = run_ok(
        executor,
        program("""
        import subprocess
        child = subprocess.run(["/usr/bin/env"], capture_output=True, text=True).stdout
        report({"environ": dict(os.environ), "child": child})
    """),
        env={"A": "1"},
    )
    assert out == {"environ": {"A": "1"}, "child": "A=1\n"}


# ---- processes and privileges -----------------------------------------------------------------


@pytest.mark.hostile
def test_proc_shows_only_the_runs_own_processes(jailed: Executor) -> None:
    host_pid = os.getpid()
    out = run_ok(
        jailed,
        program("""
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        cmdlines = {}
        for p in pids:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                cmdlines[p] = fh.read().decode(errors="replace")
        with open("/proc/1/status") as fh:
            ppid1 = [l.split()[1] for l in fh if l.startswith("PPid:")][0]
        report({"pids": pids, "self": os.getpid(), "ppid": os.getppid(), "ppid1": ppid1,
                "cmdlines": cmdlines})
    """),
    )
    assert out["pids"] == [1, out["self"]], out  # init and the program, nothing else
    # The program's parent (the heavy zygote) and init's (the supervisor) are outside the
    # namespace: both show as 0, nothing of the host is named.
    assert out["self"] == 2 and out["ppid"] == 0 and out["ppid1"] == "0", out
    assert host_pid not in out["pids"] or host_pid <= 2
    for cmdline in out["cmdlines"].values():
        assert "pytest" not in cmdline, out  # the test process is not visible


@pytest.mark.hostile
def test_run_has_no_root_no_capabilities_and_seccomp(jailed: Executor) -> None:
    out = run_ok(
        jailed,
        program("""
        def status(pid):
            with open(f"/proc/{pid}/status") as fh:
                return dict(l.rstrip("\\n").split(":\\t", 1) for l in fh if ":\\t" in l)
        own = status("self")
        init = status(1)   # contained before the program was even forked
        keys = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                "NoNewPrivs", "Seccomp", "SigIgn")
        report({"own": {k: own.get(k) for k in keys}, "init": {k: init.get(k) for k in keys},
                "getuid": os.getuid(), "getgid": os.getgid(), "groups": os.getgroups()})
    """),
    )
    own, init = out["own"], out["init"]
    for proc in (own, init):
        uids = [int(x) for x in proc["Uid"].split()]
        gids = [int(x) for x in proc["Gid"].split()]
        assert len(uids) == 4 and 0 not in uids, proc
        assert len(gids) == 4 and 0 not in gids, proc
        assert proc["Groups"].strip() == "", proc
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(proc[cap], 16) == 0, (cap, proc)
        assert proc["NoNewPrivs"] == "1", proc
    assert own["Seccomp"] == "2", own  # our filter
    assert init["Seccomp"] == "1", init  # strict mode: read, write, exit and sigreturn only
    # init ignores SIGCHLD (the kernel reaps the namespace's orphans) and SIGPIPE.
    ignored = int(init["SigIgn"], 16)
    assert ignored & (1 << (signal.SIGCHLD - 1)) and ignored & (1 << (signal.SIGPIPE - 1)), init
    assert out["getuid"] in SANDBOX_UIDS and out["getgid"] == out["getuid"], out
    assert out["groups"] == [], out


@pytest.mark.hostile
def test_orphans_of_a_run_are_reaped_not_left_as_zombies(jailed: Executor) -> None:
    """A grandchild whose parent is gone belongs to init, which never waits: it goes away only
    because init ignores SIGCHLD (the kernel then reaps it). Control: the child, whose parent
    is the program, is a zombie until the program waits for it."""
    out = run_ok(
        jailed,
        program("""
        import time
        def state(pid):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    return fh.read().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):  # reaped before open, or between
                return "gone"                                 # open and read (ESRCH)
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            grandchild = os.fork()
            if grandchild == 0:
                time.sleep(0.2)  # outlives its parent: init's orphan when it ends
                os._exit(0)
            os.write(w, str(grandchild).encode())
            os._exit(0)
        grandchild = int(os.read(r, 32))
        deadline = time.monotonic() + 2
        while state(child) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        child_state = state(child)  # ended, not yet waited for by the program
        deadline = time.monotonic() + 2
        while state(grandchild) != "gone" and time.monotonic() < deadline:
            time.sleep(0.02)
        report({"child": child_state, "grandchild": state(grandchild),
                "waited": os.waitpid(child, 0)[0] == child})
    """),
    )
    assert out == {"child": "Z", "grandchild": "gone", "waited": True}, out


@pytest.mark.hostile
def test_mount_unshare_chroot_and_setuid_are_denied(jailed: Executor) -> None:
    flags = {"NEWNS": 0x00020000, "NEWUSER": 0x10000000, "NEWNET": 0x40000000, "NEWPID": 0x20000000}
    out = run_ok(
        jailed,
        program(
            """
        with open("/tmp/before", "w") as fh:
            fh.write("mine")
        res = {}
        res["mount_tmpfs_over_tmp"] = call("mount", b"tmpfs", b"/tmp", b"tmpfs",
                                           ctypes.c_ulong(0), None)
        res["bind_mount"] = call("mount", b"/tmp", b"/workspace", None, ctypes.c_ulong(4096), None)
        res["umount_proc"] = call("umount2", b"/proc", 2)
        res["unshare_user"] = call("unshare", @NEWUSER@)
        res["unshare_mount"] = call("unshare", @NEWNS@)
        res["unshare_net"] = call("unshare", @NEWNET@)
        res["chroot"] = call("chroot", b"/tmp")
        res["pivot_root"] = sys_call(@PIVOT@, b"/tmp", b"/tmp")
        res["fsopen"] = sys_call(@FSOPEN@, b"tmpfs", 0)
        fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        res["setns"] = sys_call(@SETNS@, fd, 0)
        rc = sys_call(@CLONE@, @NEWUSER@ | @NEWPID@ | 17, 0, 0, 0, 0)
        if rc[0] == 0:
            os._exit(0)   # a child that should never have existed
        res["clone_newuser"] = rc
        setuid = attempt(lambda: os.setuid(0))
        setresuid = attempt(lambda: os.setresuid(0, 0, 0))
        setgid = attempt(lambda: os.setgid(0))
        with open("/tmp/before") as fh:
            tmp_intact = fh.read() == "mine"
        report({"calls": res, "setuid": setuid, "setresuid": setresuid, "setgid": setgid,
                "tmp_intact": tmp_intact, "uid": os.getuid(), "continued": True})
    """,
            PIVOT=nr("pivot_root"),
            FSOPEN=nr("fsopen"),
            SETNS=nr("setns"),
            CLONE=nr("clone"),
            **flags,
        ),
    )
    denied = {name: rv for name, rv in out["calls"].items() if rv != [-1, "EPERM"]}
    assert denied == {}, f"calls that did not fail with EPERM: {denied}"
    assert out["setuid"] == out["setresuid"] == out["setgid"] == "EPERM", out
    assert out["tmp_intact"] is True and out["uid"] in SANDBOX_UIDS and out["continued"], out


@pytest.mark.hostile
def test_system_runtime_and_root_are_not_writable(jailed: Executor) -> None:
    out = run_ok(
        jailed,
        program("""
        import numpy
        site = os.path.dirname(os.path.dirname(numpy.__file__))
        targets = {
            "/": "/execbox-write-test",
            "/usr": "/usr/execbox-write-test",
            "/usr/bin": "/usr/bin/execbox-write-test",
            "/etc": "/etc/execbox-write-test",
            "site-packages": site + "/execbox-write-test",
            "stdlib": os.path.dirname(os.__file__) + "/execbox-write-test",
            "sys.prefix": sys.prefix + "/execbox-write-test",
        }
        res = {name: attempt(lambda p=p: open(p, "w").close()) for name, p in targets.items()}
        res["append /etc/passwd"] = attempt(lambda: open("/etc/passwd", "a").close())
        res["append numpy"] = attempt(lambda: open(numpy.__file__, "a").close())
        res["mkdir /"] = attempt(lambda: os.mkdir("/execbox-dir"))
        res["chmod site"] = attempt(lambda: os.chmod(site, 0o777))
        res["hostname"] = attempt(lambda: open("/proc/sys/kernel/hostname", "w").write("x"))
        report({"res": res, "site": site})
    """),
    )
    res = out["res"]
    assert "site-packages" in out["site"], out
    bad = {
        name: e for name, e in res.items() if name != "chmod site" and e not in ("EROFS", "EACCES")
    }
    assert bad == {}, f"writes that did not fail with EROFS/EACCES: {bad}"
    assert res["chmod site"] in ("EROFS", "EPERM"), res


@pytest.mark.hostile
def test_only_scratch_mounts_are_writable(jailed: Executor) -> None:
    """Even root could not write the system: everything but scratch space is a read-only mount."""
    out = run_ok(
        jailed,
        program("""
        import numpy
        mounts = []
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                f = line.split()
                mounts.append([f[4], f[5].split(",")])
        report({"mounts": mounts, "site": os.path.dirname(numpy.__file__), "prefix": sys.prefix})
    """),
    )
    mounts: dict[str, list[str]] = {point: opts for point, opts in out["mounts"]}
    scratch = {
        "/tmp",
        "/workspace",
        "/dev",
        "/dev/shm",
        "/proc",
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
    }
    writable = {point for point, opts in mounts.items() if "ro" not in opts}
    assert writable <= scratch, f"writable mounts beyond scratch space: {writable - scratch}"

    def mount_of(path: str) -> str:
        return max(
            (m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len
        )

    for path in ("/", "/etc/passwd", "/usr/bin", out["site"], out["prefix"]):
        assert "ro" in mounts[mount_of(path)], (path, mount_of(path), mounts)
    for point in ("/tmp", "/workspace", "/dev/shm", "/dev"):
        assert "nosuid" in mounts[point] and "nodev" in mounts[point], (point, mounts)


# ---- nothing persists between runs ------------------------------------------------------------


@pytest.mark.hostile
def test_nothing_persists_between_runs(jailed: Executor) -> None:
    mark = secrets.token_hex(8)
    key = secrets.randbelow(1 << 30) + 1
    first = run_ok(
        jailed,
        program(
            """
        import builtins, json as json_module
        for d in ("/tmp", "/workspace", "/dev/shm"):
            with open(f"{d}/persist-@MARK@", "w") as fh:
                fh.write("x")
        json_module.MARK = 1
        builtins.EXECBOX_MARK = 1
        sys.modules["execbox_mark"] = object()
        shm = call("shmget", @KEY@, 4096, 0o1000 | 0o666)   # IPC_CREAT
        report({"shm": shm, "files": [os.path.exists(f"{d}/persist-@MARK@")
                                      for d in ("/tmp", "/workspace", "/dev/shm")]})
    """,
            MARK=mark,
            KEY=key,
        ),
    )
    assert first["files"] == [True, True, True] and first["shm"][0] >= 0, first
    second = run_ok(
        jailed,
        program(
            """
        import builtins, json as json_module
        report({
            "files": [os.path.exists(f"{d}/persist-@MARK@") for d in ("/tmp", "/workspace",
                                                                      "/dev/shm")],
            "json_mark": hasattr(json_module, "MARK"),
            "builtin": hasattr(builtins, "EXECBOX_MARK"),
            "module": "execbox_mark" in sys.modules,
            "shm": call("shmget", @KEY@, 0, 0),
        })
    """,
            MARK=mark,
            KEY=key,
        ),
    )
    assert second == {
        "files": [False, False, False],
        "json_mark": False,
        "builtin": False,
        "module": False,
        "shm": [-1, "ENOENT"],
    }


# ---- processes do not outlive their run -------------------------------------------------------


@pytest.mark.serial
@pytest.mark.hostile
def test_daemonized_grandchild_does_not_outlive_its_run(jailed: Executor) -> None:
    marker = str(10**9 + secrets.randbelow(10**9))
    cmdline = f"sleep\0{marker}\0".encode()
    ready = threading.Event()

    def on_stdout(chunk: bytes) -> None:
        if b"ready" in chunk:
            ready.set()

    code = program(
        """
        import signal
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                os.execv("/bin/sleep", ["sleep", "@MARKER@"])
            os._exit(0)
        os.waitpid(pid, 0)
        want = b"sleep\\x00@MARKER@\\x00"
        def seen():
            for p in os.listdir("/proc"):
                try:
                    with open(f"/proc/{p}/cmdline", "rb") as fh:
                        if fh.read() == want:
                            return True
                except OSError:
                    pass
            return False
        deadline = time.monotonic() + 2
        while not seen() and time.monotonic() < deadline:
            time.sleep(0.01)
        print("ready" if seen() else "no daemon", flush=True)
        time.sleep(2.0)   # the host looks for the daemon now
        report({"daemon_seen": True})
    """,
        MARKER=marker,
    )
    limits = Limits(timeout_s=10, memory_mib=256, pids=32)
    thread, box = in_thread(lambda: jailed.run(code, limits=limits, on_stdout=on_stdout))
    assert ready.wait(5), "the run never reported its daemon running"
    during = host_pids_with_cmdline(cmdline)
    r = joined(thread, box)
    after = poll_host_cmdline(cmdline, gone=True, timeout=3.0)
    assert r.status is Status.ok, describe(r)
    assert during, "control failed: the host scan did not see the daemon while the run was live"
    assert after == [], f"the daemon outlived its run: host pids {after}"
    # it is killed when the program ends, not when the time limit runs out
    assert r.metrics.wall_ms < 5000, r.metrics


@pytest.mark.serial
@pytest.mark.hostile
def test_daemon_holding_stdout_does_not_delay_the_result(jailed: Executor) -> None:
    marker = str(10**9 + secrets.randbelow(10**9))
    started = time.monotonic()
    r = jailed.run(
        program(
            """
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "@MARKER@"])   # keeps stdout and stderr open
            os._exit(0)
        report({"parent": "done"})
    """,
            MARKER=marker,
        ),
        limits=Limits(timeout_s=20, memory_mib=256, pids=32),
    )
    elapsed = time.monotonic() - started
    assert r.status is Status.ok, describe(r)
    assert elapsed < 5, f"the result waited {elapsed:.1f} s for a daemon"
    assert poll_host_cmdline(f"sleep\0{marker}\0".encode(), gone=True, timeout=3.0) == []


@pytest.mark.hostile
def test_kill_minus_one_only_kills_the_runs_own_processes(jailed: Executor) -> None:
    marker = str(10**9 + secrets.randbelow(10**9))
    # Host processes with the very uids slots take first: only the pid namespace protects
    # them.
    victims = [
        subprocess.Popen(
            ["/bin/sleep", marker],
            user=uid,
            group=uid,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        for uid in SANDBOX_UIDS[:VICTIMS]
    ]
    try:
        zygote = host_stats(jailed).zygote_pid
        out = run_ok(
            jailed,
            program("""
            import signal
            child = os.fork()
            if child == 0:
                time.sleep(30)
                os._exit(0)
            time.sleep(0.1)
            rc = attempt(lambda: os.kill(-1, signal.SIGKILL))
            _, st = os.waitpid(child, 0)
            report({"kill": rc, "child_signal": os.WTERMSIG(st) if os.WIFSIGNALED(st) else None,
                    "survived": True, "uid": os.getuid()})
        """),
        )
        assert out["uid"] in SANDBOX_UIDS[:VICTIMS], "control: a victim had the run's uid"
        del out["uid"]
        assert out == {"kill": "OK", "child_signal": signal.SIGKILL, "survived": True}
        assert all(v.poll() is None for v in victims), "a host process with a sandbox uid died"
        assert os.path.exists(f"/proc/{zygote}") and host_stats(jailed).alive, "the zygote died"
        assert host_stats(jailed).zygote_pid == zygote
        after = jailed.run("print('next run')", limits=SMALL)
        assert after.status is Status.ok and after.stdout == "next run\n", describe(after)
    finally:
        for victim in victims:
            victim.kill()
            victim.wait()


# ---- seccomp ----------------------------------------------------------------------------------


@pytest.mark.hostile
@pytest.mark.parametrize("call", ["ptrace_traceme", "bpf"])
def test_forbidden_syscall_kills_the_program(jailed: Executor, call: str) -> None:
    invoke = {
        "ptrace_traceme": "libc.ptrace(0, 0, None, None)",
        "bpf": f"sys_call({nr('bpf')}, 0, 0, 0)",
    }[call]
    r = jailed.run(
        program(
            """
        print("before", flush=True)
        rv = @INVOKE@
        print("after", rv, flush=True)
    """,
            INVOKE=invoke,
        ),
        limits=SMALL,
    )
    assert r.status is Status.forbidden, describe(r)
    assert r.signal == "SIGSYS", describe(r)
    assert r.stdout == "before\n", describe(r)
    assert r.error is not None and r.error.type == "ForbiddenSyscall", describe(r)


@pytest.mark.hostile
def test_32bit_syscall_abi_is_killed(jailed: Executor) -> None:
    """The filter is for the native ABI only: an `int 0x80` (i386) syscall must not slip past."""
    if platform.machine() != "x86_64":
        pytest.skip("the i386 syscall ABI exists on x86_64 only")
    r = jailed.run(
        program("""
        import mmap
        # mov eax, 20 (getpid on i386); int 0x80; ret
        code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        fn = ctypes.CFUNCTYPE(ctypes.c_long)(addr)
        print("before", flush=True)
        print("after", fn(), flush=True)
    """),
        limits=SMALL,
    )
    assert r.status is Status.forbidden, describe(r)
    assert r.signal == "SIGSYS" and r.stdout == "before\n", describe(r)


@pytest.mark.hostile
def test_clone3_fails_with_enosys_and_sockets_are_filtered(jailed: Executor) -> None:
    out = run_ok(
        jailed,
        program(
            """
        res = {"clone3": sys_call(@CLONE3@, 0, 0)}
        res["netlink"] = attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0))
        res["netlink_raw"] = attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
        res["packet"] = attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0))
        res["raw_inet"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))
        report(res)
    """,
            CLONE3=nr("clone3"),
        ),
    )
    assert out["clone3"] == [-1, "ENOSYS"], out
    assert out["netlink"] == "EAFNOSUPPORT", out
    assert out["netlink_raw"] in ("EAFNOSUPPORT", "EPERM"), out
    assert out["packet"] == "EAFNOSUPPORT", out
    assert out["raw_inet"] == "EPERM", out


def test_fork_threads_and_subprocess_still_work(executor: Executor) -> None:
    out = run_ok(
        executor,
        program("""
        import subprocess, threading
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        _, st = os.waitpid(pid, 0)
        box = []
        threads = [threading.Thread(target=lambda i=i: box.append(i * i)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        echo = subprocess.run(["/bin/echo", "hi"], capture_output=True, text=True).stdout
        report({"fork": os.waitstatus_to_exitcode(st), "threads": sorted(box), "echo": echo})
    """),
    )
    assert out == {"fork": 7, "threads": [0, 1, 4, 9], "echo": "hi\n"}


# ---- concurrent runs --------------------------------------------------------------------------


@pytest.mark.hostile
def test_concurrent_runs_cannot_see_or_signal_each_other(jailed: Executor) -> None:
    mark = secrets.token_hex(8)
    sleeper = str(10**9 + secrets.randbelow(10**9))
    port = 20000 + secrets.randbelow(20000)
    ready = threading.Event()

    def on_stdout(chunk: bytes) -> None:
        if b"ready" in chunk:
            ready.set()

    a_code = program(
        """
        import select, subprocess
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        u.bind("\\0execbox-@MARK@")
        u.listen()
        t = socket.create_server(("127.0.0.1", @PORT@))
        for d in ("/tmp", "/workspace", "/dev/shm"):
            with open(f"{d}/@MARK@", "w") as fh:
                fh.write("a")
        child = subprocess.Popen(["sleep", "@SLEEPER@"], executable="/bin/sleep")
        print("ready", flush=True)
        readable, _, _ = select.select([u, t], [], [], 1.5)
        report({"unix_conn": u in readable, "tcp_conn": t in readable,
                "child_alive": child.poll() is None})
    """,
        MARK=mark,
        PORT=port,
        SLEEPER=sleeper,
    )
    b_code = program(
        """
        import signal
        def conn_unix():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                s.connect("\\0execbox-@MARK@")
        def conn_tcp():
            socket.create_connection(("127.0.0.1", @PORT@), timeout=1).close()
        cmdlines = []
        for p in os.listdir("/proc"):
            if p.isdigit():
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    cmdlines.append(fh.read())
        res = {
            "unix": attempt(conn_unix),
            "tcp": attempt(conn_tcp),
            "files": [os.path.exists(f"{d}/@MARK@") for d in ("/tmp", "/workspace", "/dev/shm")],
            "sees_sleeper": b"sleep\\x00@SLEEPER@\\x00" in cmdlines,
            "kill": attempt(lambda: os.kill(-1, signal.SIGKILL)),
        }
        report(res)
    """,
        MARK=mark,
        PORT=port,
        SLEEPER=sleeper,
    )
    thread, box = in_thread(lambda: jailed.run(a_code, limits=SMALL, on_stdout=on_stdout))
    assert ready.wait(5), "run A never became ready"
    assert poll_host_cmdline(f"sleep\0{sleeper}\0".encode(), gone=False, timeout=2.0), (
        "control: A's child not seen"
    )
    b = run_ok(jailed, b_code)
    a = joined(thread, box)
    assert a.status is Status.ok, describe(a)
    a_out = json.loads(a.stdout.strip().splitlines()[-1])
    assert b == {
        "unix": "ECONNREFUSED",
        "tcp": "ECONNREFUSED",
        "files": [False, False, False],
        "sees_sleeper": False,
        "kill": "ESRCH",
    }
    assert a_out == {"unix_conn": False, "tcp_conn": False, "child_alive": True}


# ---- many runs leave nothing behind -----------------------------------------------------------


def _cgroup_entries(hier: Hierarchy, prefix: str) -> set[str]:
    """This executor's run cgroups (other executors on the host may be running too)."""
    return {
        f"{controller}:{name}"
        for controller, parent in hier.parent_paths.items()
        for name in os.listdir(parent)
        if name.startswith(prefix) and os.path.isdir(os.path.join(parent, name))
    }


def _zygote_children(zygote: int) -> list[int]:
    return [pid for pid in host_pids() if host_ppid(pid) == zygote]


def _mountinfo() -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return sorted(fh.read().splitlines())


def _fd_count(pid: int | str) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _describe_process(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/wchan") as fh:
            wchan = fh.read()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return f"{pid} state={fields[0]} wchan={wchan} age={age:.1f}s"
    except OSError:
        return f"{pid} (gone)"


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_500_runs_leave_no_cgroups_processes_mounts_or_descriptors(executor: Executor) -> None:
    # An executor of its own, so no other test's runs share its pool.
    with Executor(cache=False) as own:
        _check_500_runs_leave_nothing(own)


def _pace(ex: Executor) -> None:
    """Wait until every slot of `ex` is staged and its program waits for its code (its offer,
    PRK, has come), and then the demand window `ex`'s host started with: the next request
    comes to an idle slot."""
    pool = host_internals(ex).pool

    def parked() -> bool:
        try:
            ready = [slot for kind in pool._ready.values() for slot in list(kind)]
        except RuntimeError:  # the staging thread changed a queue as we copied it
            return False
        return len(ready) >= 3 * ex.pool_size and all(
            slot.go_w >= 0 or select.select([slot.ctrl], [], [], 0)[0] for slot in ready
        )

    assert wait_until(parked, 30, every_s=0.01), "the pool's programs never all waited"
    # The offers came after their programs got ready: past the window from now, a request is
    # sure to find its slot idle. The window is the time to wait, not a guess at an ordering.
    time.sleep(zygotes.DEMAND_S)


def _settled(executor: Executor, hier: Hierarchy, timeout_s: float = 10.0) -> bool:
    """Wait until the pool is full and quiet: every slot staged and waiting, nothing of a
    finished run still cleaning up, nothing being staged."""
    host, pool = host_stats(executor), executor.pool_size
    zygote, prefix = host.zygote_pid, host.slot_prefix
    heavy, light = host.heavy_zygote_pid, host.light_zygote_pid
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < deadline:
        names = {e.split(":", 1)[1] for e in _cgroup_entries(hier, prefix)}
        supervisors = _zygote_children(zygote)
        inits = [pid for sup in supervisors for pid in _zygote_children(sup)]
        # pool_size slots of each kind (light, heavy, pandas), each with one init and one
        # staged program
        full = (
            sum(host_stats(executor).staged.values()) == 3 * pool
            and len(supervisors) == 3 * pool
            and len(names) == 3 * pool
            and len(inits) == 3 * pool
            and len(_zygote_children(heavy)) == 2 * pool
            and len(_zygote_children(light)) == pool
        )
        quiet = quiet + 1 if full else 0
        if quiet >= 3:  # three looks in a row, 50 ms apart
            return True
        time.sleep(0.05)
    return False


def _check_500_runs_leave_nothing(executor: Executor) -> None:
    # With pre-staged slots, what may exist between runs is exactly the staged pool: one
    # cgroup name, one supervisor, one init and one program per waiting slot. Everything of a
    # finished run is gone, its status pipe in the program zygote included. The slots are
    # reused: 500 runs on a handful of slots, each restaged between runs.
    hier = Hierarchy.discover()
    host = host_stats(executor)
    zygote, prefix = host.zygote_pid, host.slot_prefix
    heavy, light = host.heavy_zygote_pid, host.light_zygote_pid
    for _ in range(2):  # warm up: anything created once is not a leak, the records'
        executor.run("pass", limits=SMALL)  # writer's database included (see `records`)
    executor.store.settle()
    assert _settled(executor, hier), "control: the pool never settled before the runs"
    slots_before = host_stats(executor).idle_slots
    before = (
        _mountinfo(),
        _fd_count("self"),
        _fd_count(zygote),
        _fd_count(heavy),
        _fd_count(light),
    )
    statuses: dict[Status, int] = {}
    for _ in range(500):
        r = executor.run("pass", limits=SMALL)
        statuses[r.status] = statuses.get(r.status, 0) + 1
    assert statuses == {Status.ok: 500}, statuses
    settled = _settled(executor, hier)
    names = {e.split(":", 1)[1] for e in _cgroup_entries(hier, prefix)}
    kids = _zygote_children(zygote)
    assert settled, (
        f"leftovers after 500 runs: cgroups {sorted(names)}, supervisors "
        f"{[_describe_process(p) for p in kids]}, staging error "
        f"{host_internals(executor).pool._error}"
    )
    assert names == host_stats(executor).idle_slots, "cgroups other than the staged slots"
    assert host_stats(executor).idle_slots == slots_before, "slots were replaced, not reused"
    after = (_mountinfo(), _fd_count("self"), _fd_count(zygote), _fd_count(heavy), _fd_count(light))
    assert set(after[0]) ^ set(before[0]) == set(), "host mounts changed"
    assert after[1] <= before[1], f"test process descriptors grew {before[1]} -> {after[1]}"
    assert after[2] <= before[2], f"zygote descriptors grew {before[2]} -> {after[2]}"
    assert after[3] <= before[3], f"heavy zygote descriptors grew {before[3]} -> {after[3]}"
    assert after[4] <= before[4], f"light zygote descriptors grew {before[4]} -> {after[4]}"
    assert host_stats(executor).alive


def _maps_heavy_modules(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as fh:
        return "/numpy/" in fh.read()


def test_only_heavy_programs_are_forks_of_the_heavy_zygote() -> None:
    """Supervisors and init come from the supervisors' zygote, light programs from the light
    one: they must not carry (and fork, and tear down) the pre-imported runtime; the staged
    heavy programs must."""
    with Executor(cache=False) as own:  # no other test's sessions among its processes
        _check_only_programs_are_heavy(own)


def _pages(kib: int) -> int:
    return kib * 1024 // os.sysconf("SC_PAGESIZE")


def _staged_private_pages(zygote: int) -> list[int]:
    pages = []
    for pid in _zygote_children(zygote):
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("Private_Dirty:"))
        pages.append(_pages(kib))
    return pages


def test_staged_programs_already_hold_the_pages_programs_write_first() -> None:
    """Each program zygote learned at start which of its pages programs write (its warm
    pages), and every staged program, waiting for its code, already holds them as its own
    copies: its private dirty memory is at least that much (a staged heavy program without
    them holds ~1,600 pages; its warm pages are ~2,500)."""
    with Executor(cache=False) as own:
        wait_heavy(own)  # its entries come once it is ready
        warm = host_stats(own).warm_pages
        assert warm["light"] > 100 and warm["heavy"] > 1000, warm
        # Its program waiting first: a request that comes before has the slot's next program
        # staged without the warm pages (the slot is in demand, see `supervisor`).
        assert _settled(own, Hierarchy.discover()), "the pool never settled"
        own.run("pass", limits=SMALL)
        assert _settled(own, Hierarchy.discover()), "the pool never settled"
        base = host_stats(own).warm_base_pages
        host = host_stats(own)
        for kind, zygote, slots in (
            ("light", host.light_zygote_pid, 1),
            ("heavy", host.heavy_zygote_pid, 2),
        ):  # heavy and pandas
            staged = _staged_private_pages(zygote)
            assert len(staged) == slots * own.pool_size, (kind, staged)
            assert min(staged) >= base[kind], (kind, staged, base)
            assert sum(n >= warm[kind] for n in staged) >= own.pool_size, (kind, staged, warm)


def test_only_pandas_slots_copy_pandas_pages_whatever_ran_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A heavy program's warm pages are a base (what every heavy program writes) and the pages
    pandas' use writes besides; only programs of "pandas" slots copy those, and what earlier
    runs imported changes nothing of it: a run can not read from its own memory what the run
    before it in its slot did."""
    # Only a request that comes before its program is ready finds a slot in demand: a paced
    # one never does (see the test below).
    monkeypatch.setattr(zygotes, "DEMAND_S", 0.0)
    with Executor(cache=False, pool_size=1) as own:
        wait_heavy(own)  # its entries come once it is ready
        warm, base = host_stats(own).warm_pages, host_stats(own).warm_base_pages
        assert 500 < base["heavy"] < warm["heavy"] - 1000, (base, warm)
        assert base["light"] == warm["light"], (base, warm)  # the light zygote has no more
        pandas = "import pandas as pd\nprint(pd.Series([1, 2]).sum())"
        numpy = "import numpy as np\nprint(np.ones(3).sum())"
        seen: dict[str, list[int]] = {}
        for before in (pandas, numpy, pandas, numpy):
            # Paced: a request that comes as its slot's program gets ready is served, and the
            # slot's next program staged without its warm pages (see the test below).
            _pace(own)
            assert own.run(before, limits=SMALL).status is Status.ok
            for kind, probe in (
                ("heavy", "import numpy\n" + PRIVATE_DIRTY_KIB),
                ("pandas", "import pandas\n" + PRIVATE_DIRTY_KIB),
            ):
                _pace(own)
                r = own.run(probe, limits=SMALL)
                assert r.status is Status.ok, describe(r)
                seen.setdefault(kind, []).append(_pages(int(r.stdout)))
        heavy, pandas_slot = seen["heavy"], seen["pandas"]
        # The same code sees the same memory after either neighbour (a few pages of noise) ...
        assert max(heavy) - min(heavy) < 100 and max(pandas_slot) - min(pandas_slot) < 100, seen
        # ... and only the pandas slot's program holds pandas' pages.
        assert base["heavy"] <= min(heavy) and max(heavy) < warm["heavy"] <= min(pandas_slot), (
            seen,
            base,
            warm,
        )


def test_a_slot_in_demand_stages_its_next_program_without_warm_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Copying warm pages is a head start paid in CPU by every program. A request that finds
    its slot's program not yet waiting for its code (callers queue for slots: CPU is short)
    has the slot's next program staged without them; a request that comes to an idle slot
    has the next one copy them again. With one light slot: B queues while A runs, so it takes
    the slot as it is restaged; C, paced, runs in the program staged after B and holds ~90
    fewer private pages than D, staged after C came to an idle slot, and E, the same again."""
    # B must wait for A's slot, not have one more staged for it (see SlotPool).
    monkeypatch.setattr("execbox.sandbox.host.pool.GROW_AFTER_S", 60.0)
    # The window, 2 ms by default, widened so that no stall of this loaded machine between
    # B's slot getting ready and B's request makes B find it idle; `_pace` waits it out.
    monkeypatch.setattr(zygotes, "DEMAND_S", 1.0)
    with Executor(cache=False, pool_size=1) as own:
        warm = host_stats(own).warm_pages["light"]
        queued: list[RunResult] = []
        a = threading.Thread(
            target=lambda: queued.append(own.run("import time\ntime.sleep(0.5)", limits=SMALL))
        )
        a.start()
        # A holds the only light slot: B waits for it
        assert wait_until(lambda: host_stats(own).in_use == 1, 10, every_s=0.005)
        b = own.run("print(1)", limits=SMALL)
        a.join()
        assert b.status is Status.ok and queued[0].status is Status.ok, (b, queued)
        pages = []
        for _ in range(3):  # C, D, E
            _pace(own)
            r = own.run(PRIVATE_DIRTY_KIB, limits=SMALL)
            assert r.status is Status.ok, describe(r)
            pages.append(_pages(int(r.stdout)))
        cold, after_idle, again = pages
        assert after_idle - cold > min(40, warm // 4), (pages, warm)
        assert abs(again - after_idle) < 20, pages


def _check_only_programs_are_heavy(executor: Executor) -> None:
    executor.run("pass", limits=SMALL)
    assert _settled(executor, Hierarchy.discover()), "the pool never settled"
    host = host_stats(executor)
    zygote, heavy, light = host.zygote_pid, host.heavy_zygote_pid, host.light_zygote_pid
    assert _maps_heavy_modules(heavy), "control: the heavy zygote has numpy mapped"
    supervisors = _zygote_children(zygote)
    inits = [pid for sup in supervisors for pid in _zygote_children(sup)]
    programs = _zygote_children(heavy)
    light_programs = _zygote_children(light)
    assert supervisors and len(inits) == len(supervisors) == len(programs) + len(light_programs), (
        supervisors,
        inits,
        programs,
        light_programs,
    )
    for pid in [zygote, light, *supervisors, *inits, *light_programs]:
        assert not _maps_heavy_modules(pid), f"process {pid} carries the heavy modules"
    for pid in programs:
        assert _maps_heavy_modules(pid), f"staged program {pid} lacks the pre-imported modules"


def test_closing_an_executor_leaves_no_cgroups_processes_or_mounts() -> None:
    hier = Hierarchy.discover()
    mounts = _mountinfo()
    with Executor(cache=False) as ex:
        host = host_stats(ex)
        zygote, prefix = host.zygote_pid, host.slot_prefix
        for _ in range(20):
            assert ex.run("pass", limits=SMALL).status is Status.ok
        assert _cgroup_entries(hier, prefix), "control: staged slots have cgroups"
        assert wait_until(lambda: sum(host_stats(ex).staged.values()) == 3 * ex.pool_size, 30)
        supervisors = [s.sup_pid for q in host_internals(ex).pool._ready.values() for s in q]
        assert all(alive(pid) for pid in supervisors), "control: the supervisors run"
    # Gone when close returns (they used to go on tearing down for up to seconds after).
    assert [pid for pid in supervisors if alive(pid)] == []
    deadline = time.monotonic() + 5
    while (
        _cgroup_entries(hier, prefix) or os.path.exists(f"/proc/{zygote}")
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _cgroup_entries(hier, prefix) == set()
    assert not os.path.exists(f"/proc/{zygote}"), "the zygote outlived its executor"
    assert set(_mountinfo()) ^ set(mounts) == set(), "host mounts changed"


def test_closing_an_executor_ends_its_runs_in_flight_before_it_returns() -> None:
    # Their supervisors, init and programs used to go on for a second or more after close.
    ex = Executor(cache=False)
    outcomes: list[RunResult] = []
    printed: list[bytes] = []
    threads = [
        threading.Thread(
            target=lambda: outcomes.append(
                ex.run(
                    "import time\nprint('on', flush=True)\ntime.sleep(30)",
                    limits={"timeout_s": 40},
                    on_stdout=printed.append,
                )
            )
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    pool = host_internals(ex).pool
    assert wait_until(lambda: len(printed) == 3, 20), (printed, host_stats(ex))  # they run
    supervisors = [slot.sup_pid for slot in pool._busy.values()]
    assert all(alive(pid) for pid in supervisors), "control: the supervisors run"
    began = time.monotonic()
    ex.close()
    assert time.monotonic() - began < 15
    assert [pid for pid in supervisors if alive(pid)] == []
    for t in threads:
        t.join(10)
    assert [r.status for r in outcomes] == [Status.sandbox_error] * 3, outcomes


def test_each_run_has_fresh_randomness_and_its_own_main_thread_id(executor: Executor) -> None:
    """Programs are forked in C, where CPython's after-fork hooks do not run: what a program
    could tell apart is redone for it. Every run, light or heavy, draws other random numbers
    than the last (the zygote's generators are shared by every fork), and the main thread's
    native id is the program's own, not its zygote's."""
    probe = (
        "import random, threading{extra}; print(random.getrandbits(64){draw}, "
        "threading.main_thread().native_id == threading.get_native_id())"
    )
    for extra, draw in (("", ""), (", numpy", ", numpy.random.randint(2**62)")):
        outs = []
        for _ in range(3):
            r = executor.run(probe.format(extra=extra, draw=draw))
            assert r.status is Status.ok, r
            outs.append(r.stdout)
        assert all(out.endswith(" True\n") for out in outs), outs
        assert len(set(outs)) == 3, outs


def test_run_sees_no_host_source_paths_in_its_command_line(executor: Executor) -> None:
    import execbox as pkg

    src = str(Path(pkg.__file__).resolve().parent.parent)
    r = executor.run("print(open('/proc/self/cmdline', 'rb').read())")
    assert r.status is Status.ok, r
    assert src not in r.stdout
