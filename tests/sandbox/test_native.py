"""The jail's C parts (`sandbox/native`) as the image builds them: init's and the contain steps'
own failure reports, and what the image does when they are missing, stale or cannot be
compiled. How they contain a real run is attacked in `test_isolation` and `test_slot_reuse`."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import mmap
import os
import re
import resource
import shutil
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from execbox import image
from execbox.errors import SandboxUnavailable
from execbox.sandbox.inside import jail, linux

UID = jail.UID_FIRST  # the sandbox uid of the programs these tests contain
UIDS = range(jail.UID_FIRST, jail.UID_FIRST + jail.UID_COUNT)


@pytest.fixture(scope="module")
def libexec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("image")
    image.build_native(root)
    return root / "libexec"


def _init(libexec: Path, *args: str, fds: tuple[int, ...] = ()) -> tuple[int, bytes]:
    """Run init as the supervisor's staging does (report pipe at 3, `fds` from 4 on): its exit
    code and report. Every case fails before init changes anything of the host."""
    report_r, report_w = os.pipe()
    # Out of the way of the target numbers first, so that no dup2 overwrites a later source.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in (report_w, *fds)]
    try:
        pid = os.posix_spawn(
            str(libexec / "execbox-init"),
            ["execbox-init", *args],
            {},
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, 3 + i) for i, fd in enumerate(high)],
        )
    finally:
        for fd in (report_w, *high):
            os.close(fd)
    with os.fdopen(report_r, "rb") as fh:
        report = fh.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), report


@pytest.mark.parametrize(
    # ("65533", "0") is no longer bad: a rootless run with no cgroup joins none.
    "args",
    [(), ("65533",), ("0", "1"), ("65533", "9"), ("x", "1")],
)
def test_init_refuses_bad_arguments_and_says_so(libexec: Path, args: tuple[str, ...]) -> None:
    code, report = _init(libexec, *args)
    assert code == 1 and report.startswith(b"init: "), (code, report)
    assert b"Invalid argument" in report, report


def test_init_carries_no_c_library_where_nolibc_knows_the_target(libexec: Path) -> None:
    """A static C library's start-up (CPU probes that trap on a VM) would cost more than all
    init does: on x86-64 and arm64 targets init is built without one."""
    cc = shutil.which(os.environ.get("CC") or "cc")
    assert cc is not None
    if not image._nolibc_target(cc):
        pytest.skip(f"{cc} targets neither x86-64 nor arm64: init keeps the C library")
    data = (libexec / "execbox-init").read_bytes()
    assert b"glibc" not in data and len(data) < 64 << 10, len(data)


@pytest.mark.parametrize(
    "target, nolibc",
    [
        ("x86_64-linux-gnu", True),
        ("aarch64-linux-gnu", True),
        ("x86_64-linux-gnux32", False),
        ("i686-linux-gnu", False),
        ("arm-linux-gnueabihf", False),
        (None, False),
    ],
)
def test_the_no_c_library_build_follows_the_compilers_target(
    tmp_path: Path, target: str | None, nolibc: bool
) -> None:
    cc = tmp_path / "cc"
    cc.write_text(f"#!/bin/sh\necho {target}\n" if target else "#!/bin/sh\nexit 1\n")
    cc.chmod(0o755)
    assert image._nolibc_target(str(cc)) is nolibc


def test_init_reports_the_step_that_failed(libexec: Path) -> None:
    # A cgroup.procs stand-in it cannot write to: the first step after arming the signal.
    read_end, write_end = os.pipe()
    try:
        code, report = _init(libexec, "65533", "1", fds=(read_end,))
    finally:
        os.close(read_end)
        os.close(write_end)
    assert (code, report) == (1, b"init: join cgroup: Bad file descriptor"), report


def _contain_in_fork(
    libexec: Path, root: Path, uid: int, stdio_from: list[int] | None = None
) -> tuple[dict[str, Any], list[int]]:
    """Call the contain steps in a fork chrooted to `root`, with a seccomp program the kernel
    refuses (one load, no return), so that even a full success ends in a named failure and
    the fork's state can be reported. Returns the report and the four kept descriptors."""
    lib = linux.ContainLibrary(str(libexec / "libexecbox-contain.so"), [])
    refused = linux.SeccompLoader(b"\0" * 8)
    report_r, report_w = os.pipe()
    stray = os.open("/dev/null", os.O_RDONLY)  # not passed: must be closed by the call
    stdio = [os.open("/dev/null", os.O_RDWR) for _ in range(3)]
    keep = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)] + [report_w]
    pid = os.fork()
    if pid == 0:
        try:
            os.chroot(str(root))
            os.chdir("/")
            lib.contain([*(stdio_from or stdio), *keep], 0, uid, refused)
            error = "contained with a refused filter"
        except OSError as exc:
            error = f"{exc.errno} {exc.strerror}"
        open_fds = []
        for fd in range(max(keep) + 64):  # no /proc in the chroot to list them
            try:
                os.fstat(fd)
                open_fds.append(fd)
            except OSError:
                pass
        os.write(
            report_w,
            json.dumps(
                {
                    "error": error,
                    "fds": open_fds,
                    "cwd": os.getcwd(),
                    "uids": os.getresuid(),
                    "gids": os.getresgid(),
                    "groups": os.getgroups(),
                }
            ).encode(),
        )
        os._exit(0)
    os.close(report_w)
    for fd in (stray, *stdio, *keep[:3]):
        os.close(fd)
    with os.fdopen(report_r, "rb") as fh:
        out = json.loads(fh.read())
    os.waitpid(pid, 0)
    return out, keep


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the contain steps need root")


@needs_root
def test_contain_runs_every_step_up_to_seccomp_and_names_the_failed_one(
    libexec: Path, tmp_path: Path
) -> None:
    """Every step but the last succeeds: by then stdio is on 0-2, every other descriptor but
    the program's four is closed, the working directory is /workspace and the process has the
    sandbox uid and gid and no groups."""
    (tmp_path / "workspace").mkdir()
    out, keep = _contain_in_fork(libexec, tmp_path, UID)
    assert out["error"] == f"{errno.EINVAL} load seccomp filter: Invalid argument", out
    assert out["fds"] == sorted([0, 1, 2, *keep]), out
    assert out["cwd"] == "/workspace", out
    assert out["uids"] == [UID] * 3 and out["gids"] == [UID] * 3, out
    assert out["groups"] == [], out


@needs_root
@pytest.mark.parametrize("uid", [0, 2**32 - 1])  # root, and (uid_t)-1: "leave it unchanged"
def test_contain_refuses_to_stay_root(libexec: Path, tmp_path: Path, uid: int) -> None:
    (tmp_path / "workspace").mkdir()
    out, _keep = _contain_in_fork(libexec, tmp_path, uid)
    assert out["error"] == f"{errno.EINVAL} check the unprivileged uid: Invalid argument", out
    assert out["uids"] == [0, 0, 0], out  # and it stops there: nothing claims it dropped


@needs_root
def test_contain_checks_the_descriptors_before_it_changes_anything(
    libexec: Path, tmp_path: Path
) -> None:
    """stdout taken from descriptor 0: a dup2 onto 0-2 could overwrite a source."""
    (tmp_path / "workspace").mkdir()
    source = os.open("/dev/null", os.O_RDWR)
    try:
        out, _keep = _contain_in_fork(libexec, tmp_path, UID, stdio_from=[source, 0, source])
    finally:
        os.close(source)
    assert out["error"] == (
        f"{errno.EBADF} check the program's descriptors: Bad file descriptor"
    ), out
    assert out["cwd"] == "/" and out["uids"] == [0, 0, 0], out


@needs_root
def test_a_program_whose_slot_init_is_gone_dies_as_if_killed_with_it(libexec: Path) -> None:
    """The program joins its slot's namespaces through a pidfd of init. An init gone by then
    (its slot killed from outside after the program's fork) must end the program as a kill
    would have (SIGKILL: the request goes to another slot), not as a set-up failure."""
    lib = linux.ContainLibrary(str(libexec / "libexecbox-contain.so"), [jail.PROGRAM_NAMESPACES])
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    pidfd = os.pidfd_open(gone)
    os.waitpid(gone, 0)  # reaped: the pidfd names no process any more
    fds = [os.open("/dev/null", os.O_RDWR) for _ in range(3 + 4)]
    try:
        pid = os.fork()
        if pid == 0:
            try:
                lib.contain([pidfd, *fds], 0, UID, linux.SeccompLoader(b"\0" * 8))
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
    finally:
        for fd in (pidfd, *fds):
            os.close(fd)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def test_an_image_without_this_execboxs_native_parts_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "img"
    (root / "libexec").mkdir(parents=True)
    manifest = {
        "kind": "self-contained",
        "tree_digest": "sha256:x",
        "python_version": "3.11.0",
        "native_sha256": "stale",
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SandboxUnavailable, match="execbox image build"):
        image.Image.load(root)


def test_a_missing_compiler_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-anywhere")
    with pytest.raises(SandboxUnavailable, match="needs a C compiler"):
        image.build_native(tmp_path)


def test_a_failed_compile_shows_the_compilers_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'cc: out of cheese' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    with pytest.raises(SandboxUnavailable, match="compiling init.c failed:\ncc: out of cheese"):
        image.build_native(tmp_path)
    assert not list((tmp_path / "libexec").iterdir())  # nothing half-built left


def test_an_image_under_the_jails_staging_directory_is_refused_by_name(tmp_path: Path) -> None:
    """Each slot's root is built on a tmpfs over /tmp: an image there could not be bound into
    it (every run would fail with a bare ENOENT from mount)."""
    under = f"{jail.STAGING}/execbox-home/images/x"
    with pytest.raises(jail.JailError, match="EXECBOX_HOME"):
        jail.JailConfig.discover([under], b"\0" * 8, f"{under}/libexec")


WARM = 32  # pages of the region `_serve_in_fork` marks warm, when asked to


def _write_every_page(buf: mmap.mmap | bytearray) -> int:
    """Write a byte to each page of `buf`: the page faults it cost."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for at in range(0, len(buf), mmap.PAGESIZE):
        buf[at] = 1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _serve_in_fork(
    libexec: Path,
    root: Path,
    requests: list[tuple[bytes, list[int]]],
    close: list[int],
    read: list[int],
    warm: str | None = None,
) -> tuple[str, list[bytes]]:
    """A program zygote's fork server (`serve_programs`) in a fork chrooted to `root`, with
    the real seccomp filter and the fork's own pid namespace as the slot's. Each request is
    sent in turn, our copies of `close` closed, and each descriptor of `read` read to its
    end; then the host end is closed. A child that comes back contained reports its uids
    and cwd on its exit-report descriptor and exits 0 once its go descriptor ends (so all
    children live until every request is sent and `close` closed). With `warm` not None, the
    server's fork first writes a WARM-page private region (shared with each child, then) and
    gives it to the server as warm pages: none ("none"), its first half as the base and the
    rest as more ("split"); each child then also reports how many page faults writing every
    page of it cost. Returns what the server's fork said when `serve_programs` returned, and
    what was read."""
    from execbox.sandbox.inside import seccomp

    lib = linux.ContainLibrary(str(libexec / "libexecbox-contain.so"), [linux.CLONE_NEWPID])
    loader = linux.SeccompLoader(seccomp.compile_filter())
    host, host_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    spawn, spawn_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    said_r, said_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        said = "raised"
        try:
            host.close()
            spawn.close()
            for fd in (*close, *read):  # the copies this fork inherited: only sent ones count
                os.close(fd)
            own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
            region = None
            if warm is not None:
                region = mmap.mmap(-1, WARM * mmap.PAGESIZE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                region.write(b"z" * len(region))  # present, and shared with every child
                start = ctypes.addressof(ctypes.c_char.from_buffer(region))
                if warm == "split":
                    half = start + len(region) // 2
                    lib.set_warm([(start, half)], [(half, start + len(region))])
            os.chroot(str(root))
            os.chdir("/")
            kept = lib.serve_programs(
                host_child.fileno(), spawn_child.fileno(), own_pid_ns, UIDS, loader
            )
            if kept is not None:  # a forked child, contained: it lives until go_r ends
                report = f"{os.getresuid()} {os.getcwd()}"
                if region is not None:
                    _write_every_page(bytearray(mmap.PAGESIZE))  # the loop's own first faults
                    report += f" {_write_every_page(region)}"
                os.write(kept[3], report.encode())
                while os.read(kept[0], 4096):
                    pass
                os._exit(0)
            said = "returned at end of file"
        except OSError as exc:
            said = f"raised {exc}"
        finally:
            os.write(said_w, said.encode())
            os._exit(0)
    host_child.close()
    spawn_child.close()
    os.close(said_w)
    try:
        for message, fds in requests:
            socket.send_fds(spawn, [message], fds)
        for fd in close:
            os.close(fd)
        got = []
        for fd in read:
            with os.fdopen(fd, "rb") as fh:
                got.append(fh.read())
        host.close()
        with os.fdopen(said_r, "rb") as fh:
            return fh.read().decode(), got
    finally:
        spawn.close()
        os.waitpid(pid, 0)


@needs_root
def test_the_fork_server_forks_contained_programs_reports_their_end_and_drops_bad_requests(
    libexec: Path, tmp_path: Path
) -> None:
    """Six malformed requests are dropped (two of them naming a uid outside the range) (their pipes closed unanswered) and the server goes
    on; a program whose contain step fails says which on its set-up descriptor and exits 127;
    contained ones come back to Python as the sandbox uid in /workspace, 66 alive at once
    (past the first size of the server's table of children); each end is reported as
    {"status": N}; end of file on the host ends the loop."""
    (tmp_path / "workspace").mkdir()
    pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    ours: list[int] = [pid_ns]  # closed once sent
    joinable = os.open("/dev/null", os.O_WRONLY)  # for cgroup.procs: writing "0" succeeds
    refused = os.open("/dev/null", os.O_RDONLY)  # and here fails
    ours += [joinable, refused]
    requests, read = [], []
    good_layout = b"1 1 1 %d" % (UID + 1)
    for layout, cgroup in (
        (b"1 x 1 %d" % UID, joinable),
        (b"1 1 1", joinable),
        (b"1 1 3 %d" % UID, joinable),
        (b"1 2 1 %d" % UID, joinable),
        (b"1 1 1 0", joinable),
        (b"1 1 1 %d" % (UID - 1), joinable),
        (b"1 1 0 %d" % UID, refused),
        *[(good_layout, joinable)] * 66,
    ):
        (status_r, status_w), (io_r, io_w), (go_r, go_w) = os.pipe(), os.pipe(), os.pipe()
        (setup_r, setup_w), (done_r, done_w) = os.pipe(), os.pipe()
        ours += [status_w, io_r, io_w, go_r, go_w, setup_w, done_w]
        read += [status_r, setup_r, done_r]
        requests.append(
            (layout, [status_w, pid_ns, cgroup, io_r, io_w, io_w, go_r, io_w, setup_w, done_w])
        )  # go, error, set-up, report
    said, got = _serve_in_fork(libexec, tmp_path, requests, ours, read)
    assert said == "returned at end of file"
    bad_layout, no_uid, bad_warm, too_few, root, below, failing, *good = (
        got[i : i + 3] for i in range(0, len(got), 3)
    )
    assert bad_layout == no_uid == bad_warm == too_few == root == below == [b"", b"", b""]
    status, setup, _done = failing
    assert json.loads(status) == {"status": 127 << 8}
    assert setup == b"program set-up: contain the program: join cgroup: Bad file descriptor"
    assert len(good) == 66
    for status, setup, done in good:
        assert json.loads(status) == {"status": 0} and setup == b"", setup
        assert done.decode() == f"({UID + 1}, {UID + 1}, {UID + 1}) /workspace"


@needs_root
@pytest.mark.parametrize(
    "warm, asked, faults_from, faults_to",
    [
        # The slack is the Python loop's own faults: a full suite on a loaded machine saw 5 once.
        ("split", b"1", 0, 8),  # all its warm pages
        ("split", b"0", WARM // 2, WARM // 2 + 8),  # the base: the other half still faults
        ("split", b"2", WARM, WARM + 8),  # none (its slot is in demand): every page faults
        ("none", b"1", WARM, WARM + 8),  # the control: one fault for each page
    ],
)
def test_a_forked_program_has_its_warm_pages_copied_before_it_returns(
    libexec: Path, tmp_path: Path, warm: str, asked: bytes, faults_from: int, faults_to: int
) -> None:
    """The pages the server is given as warm are the child's own by the time it returns
    contained, all of them, only the base or none as the request asks: writing them costs no
    page fault. The control, without warm pages: one fault for each page."""
    (tmp_path / "workspace").mkdir()
    pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    joinable = os.open("/dev/null", os.O_WRONLY)
    (status_r, status_w), (io_r, io_w), (go_r, go_w) = os.pipe(), os.pipe(), os.pipe()
    (setup_r, setup_w), (done_r, done_w) = os.pipe(), os.pipe()
    request = (
        b"1 1 " + asked + b" %d" % UID,
        [status_w, pid_ns, joinable, io_r, io_w, io_w, go_r, io_w, setup_w, done_w],
    )
    ours = [pid_ns, joinable, status_w, io_r, io_w, go_r, go_w, setup_w, done_w]
    said, got = _serve_in_fork(
        libexec, tmp_path, [request], ours, [status_r, setup_r, done_r], warm=warm
    )
    assert said == "returned at end of file"
    status, setup, done = got
    assert json.loads(status) == {"status": 0} and setup == b"", setup
    faults = int(done.decode().rsplit(" ", 1)[1])
    assert faults_from <= faults <= faults_to, f"{faults} faults writing {WARM} pages"


def test_written_pages_are_exactly_the_pages_a_fork_wrote(libexec: Path) -> None:
    """What a training fork reports (`execbox_written_pages`): of the ranges it is given, the
    pages it wrote (its own copies), contiguous ones as one range; not the pages it only
    shares with its parent, nor pages outside the ranges."""
    lib = linux.ContainLibrary(str(libexec / "libexecbox-contain.so"), [])
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 16 * page, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.write(b"z" * len(region))  # every page present, shared once forked
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    asked = lib.warm_array([(start, start + 12 * page)])  # page 14 is written, not asked for
    out_r, out_w = os.pipe()
    pid = lib.fork()
    if pid == 0:
        try:
            for n in (2, 3, 4, 9, 14):
                region[n * page] = 1
            lib.report_written(asked, out_w)
        finally:
            os._exit(0)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as fh:
        data = fh.read()
    assert os.waitpid(pid, 0)[1] == 0
    pairs = memoryview(data).cast("Q").tolist()
    assert [p - start for p in pairs] == [2 * page, 5 * page, 9 * page, 10 * page]


def test_the_fork_server_refuses_a_layout_without_the_pid_namespace_first(libexec: Path) -> None:
    lib = linux.ContainLibrary(str(libexec / "libexecbox-contain.so"), [linux.CLONE_NEWNS])
    with pytest.raises(OSError, match="check the namespace layout: Invalid argument"):
        lib.serve_programs(-1, -1, -1, UIDS, linux.SeccompLoader(b"\0" * 8))


def _open_fds() -> set[int]:
    fds = set()
    for fd in range(1024):  # no /proc of our own once init has mounted its own
        try:
            os.fstat(fd)
            fds.add(fd)
        except OSError:
            pass
    return fds


def _net_files(host_proc: int) -> set[int]:
    """The descriptors open on /proc/<pid>/net/ files: the staging keeps the network state's
    files open for its namespace's life (not a leak of one staging)."""
    return {
        fd
        for fd in _open_fds()
        if re.fullmatch(r"/proc/\d+/net/[a-z0-9_]+", _link(f"self/fd/{fd}", host_proc))
    }


def _link(path: str, host_proc: int) -> str:
    try:
        return os.readlink(path, dir_fd=host_proc)
    except OSError:
        return ""


def _stage_again(
    stager: linux.Stager, out: dict[str, Any], host_proc: int
) -> tuple[linux.StagedRun, str | None]:
    """A staging after a run; what it opened beyond the descriptors it returns (closed here)
    and the network state's files goes to out["leaked_again"]: a slot stages again after
    every run."""
    before = _open_fds()
    again, error = stager.stage(first=False, warm=linux.WARM_NONE)
    out["again_error"] = error
    if error is None:
        for name, *_ in again._fields_[1:-1]:
            os.close(getattr(again, name))
    leaked = _open_fds() - before - _net_files(host_proc)
    out.setdefault("leaked_again", []).extend(sorted(leaked))
    out.setdefault("net_files", []).append(len(_net_files(host_proc)))
    return again, error


def _stage_after_runs(stager: linux.Stager, out: dict[str, Any], host_proc: int) -> None:
    """Stage again three times: after a run that used the network (the new namespace's
    state, then a datagram to a port nobody listens on), after one that did not, and after
    one that used the namespace the first of them made (the state's files, kept open, must be
    those of the namespace in use). Each staging's fresh_net and network namespace go to
    `out`."""
    for i in range(3):
        if i != 1:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.sendto(b"x", ("127.0.0.1", 9))
        again, error = _stage_again(stager, out, host_proc)
        out["fresh_net"].append(again.fresh_net)
        out.setdefault("net", []).append(os.readlink("self/ns/net", dir_fd=host_proc))
        if again.init_pid:
            os.kill(again.init_pid, 9)
            os.waitpid(again.init_pid, 0)
        if error:
            break


def _stage_in_fork(
    libexec: Path,
    tmp_path: Path,
    *,
    init: str | None = None,
    init_uid: int = jail.INIT_UID,
    n_scratch: int = 2,
) -> dict[str, Any]:
    """Call the supervisor's C staging (`native/stage.c`) in a fork with a mount and a network
    namespace of its own (/ made private first: nothing it mounts reaches the host; the
    staging makes the pid and ipc ones), with a plain file as the cgroup's cgroup.procs. Returns its error, the
    spawn request as the program zygote would receive it and what init and the pipes looked
    like; out["staged"] and out["request"] are the descriptors of both sides."""
    scratch = []
    for i in range(n_scratch):
        (tmp_path / f"scratch{i}").mkdir()
        scratch.append(
            (
                str(tmp_path / f"scratch{i}"),
                "size=65536,mode=1777",
                linux.MS_NOEXEC if i == 1 else 0,
            )
        )
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cgroup.procs").write_text("")
    report_r, report_w = os.pipe()
    back_ours, back_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    spawn_ours, spawn_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        out: dict[str, Any] = {}
        try:
            linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWNET)
            linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
            linux.loopback_up()
            net_dir = os.open("/proc/self/net", os.O_PATH | os.O_DIRECTORY)
            host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
            own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
            procs = os.open(str(cgroup / "cgroup.procs"), os.O_WRONLY)
            stager = linux.Stager(
                str(libexec / "libexecbox-contain.so"),
                scratch=scratch,
                own_pid_ns=own_pid_ns,
                cgroup_procs=[procs],
                init=init or str(libexec / "execbox-init"),
                init_uid=init_uid,
                spawn=spawn_ours.fileno(),
                uid=UID,
                net_dir=net_dir,
            )
            ipc_before = os.readlink("/proc/self/ns/ipc")
            before = _open_fds()
            net_first = os.readlink("/proc/self/ns/net")
            staged, error = stager.stage(first=True, warm=linux.WARM_ALL)
            out["fresh_net"] = [staged.fresh_net]
            fds = [getattr(staged, name) for name, *_ in staged._fields_[1:-1]]
            out["error"] = error
            out["init_pid"] = staged.init_pid
            returned = set(fds if error is None else [])
            out["leaked"] = sorted(_open_fds() - before - returned - _net_files(host_proc))
            out["net_files"] = [len(_net_files(host_proc))]
            # The spawn request, as the program zygote would take it, while init lives: its
            # namespaces come as a pidfd, which must name init.
            spawn_theirs.setblocking(False)
            try:
                msg, request, _flags, _addr = socket.recv_fds(spawn_theirs, 256, 64)
            except BlockingIOError:
                msg, request = b"", []
            out["message"] = msg.decode()
            if len(request) > 1:
                with open(
                    f"self/fdinfo/{request[1]}", opener=lambda p, f: os.open(p, f, dir_fd=host_proc)
                ) as fh:
                    out["pidfd_of"] = [int(ln.split()[1]) for ln in fh if ln.startswith("Pid:")]
            if staged.init_pid:
                with open(
                    f"{staged.init_pid}/status", opener=lambda p, f: os.open(p, f, dir_fd=host_proc)
                ) as fh:
                    status = fh.read().splitlines()
                out["nspid"] = [ln.split()[1:] for ln in status if ln.startswith("NSpid:")][0]
                # Spawned with every signal blocked (vfork), it unblocks them itself.
                out["sigblk"] = [ln.split()[1] for ln in status if ln.startswith("SigBlk:")][0]
                out["new_ipc"] = (
                    os.readlink(f"{staged.init_pid}/ns/ipc", dir_fd=host_proc) != ipc_before
                )
                os.kill(staged.init_pid, 9)
                os.waitpid(staged.init_pid, 0)
            if error is None:
                # (init's /proc is on /proc now: it does not show this process)
                out["mounts"] = [p for p, _, _ in scratch if os.path.ismount(p)]
                out["flags"] = [
                    os.statvfs(p).f_flag & (os.ST_NOEXEC | os.ST_NOSUID | os.ST_NODEV)
                    for p, _, _ in scratch
                ]
                out["modes"] = [oct(os.stat(p).st_mode & 0o7777) for p, _, _ in scratch]
                out["procs"] = (cgroup / "cgroup.procs").read_text()
                socket.send_fds(back_ours, [b"staged"], fds)
                socket.send_fds(back_ours, [b"request"], request)
                for path, _, _ in scratch:
                    Path(path, "left").write_text("by the last run")
                _stage_after_runs(stager, out, host_proc)
                out["net_first"] = net_first
                out["mounts_again"] = [p for p, _, _ in scratch if os.path.ismount(p)]
                out["left"] = [p for p, _, _ in scratch if Path(p, "left").exists()]
                for path, _, _ in scratch:  # replaced, not stacked: one unmount and it is gone
                    linux.umount2(path, 0)
                out["stacked"] = [p for p, _, _ in scratch if os.path.ismount(p)]
        except BaseException as exc:  # noqa: BLE001
            out["exception"] = repr(exc)
        os.write(report_w, json.dumps(out).encode())
        os._exit(0)
    os.close(report_w)
    with os.fdopen(report_r, "rb") as fh:
        out = json.loads(fh.read())
    os.waitpid(pid, 0)
    back_theirs.setblocking(False)
    out["staged"], out["request"] = [], []
    try:
        out["staged"] = socket.recv_fds(back_theirs, 16, 16)[1]
        out["request"] = socket.recv_fds(back_theirs, 16, 64)[1]
    except BlockingIOError:
        pass
    for sock in (back_ours, back_theirs, spawn_ours, spawn_theirs):
        sock.close()
    return out


@needs_root
def test_staging_mounts_scratch_spawns_init_and_asks_for_the_program(
    libexec: Path, tmp_path: Path
) -> None:
    out = _stage_in_fork(libexec, tmp_path)
    try:
        _check_staged(out, tmp_path)
    finally:
        for fd in out["staged"] + out["request"]:
            os.close(fd)


def _check_staged(out: dict[str, Any], tmp_path: Path) -> None:
    assert out.get("error") is None and "exception" not in out, out.get("exception")
    assert out["leaked"] == [], out  # only the eight descriptors it returns stay open
    assert out["nspid"][-1] == "1", out  # init is pid 1 of a new pid namespace
    assert out["new_ipc"] is True, out  # and of a new ipc namespace
    assert int(out["sigblk"], 16) == 0, out  # with no signal blocked
    assert sorted(out["mounts"]) == sorted(str(tmp_path / f"scratch{i}") for i in range(2)), out
    nosuid_nodev = os.ST_NOSUID | os.ST_NODEV
    assert out["flags"] == [nosuid_nodev, nosuid_nodev | os.ST_NOEXEC], out
    assert out["modes"] == ["0o1777", "0o1777"], out
    assert out["procs"] == "0", out  # init joined the "cgroup"
    assert out["again_error"] is None, out
    assert out["leaked_again"] == [], out  # each staging after a run closes what it opened
    assert sorted(out["mounts_again"]) == sorted(out["mounts"]), out
    assert out["left"] == [] and out["stacked"] == [], out  # fresh: nothing of the last run
    # Only the staging after a run that used the network made a new network namespace.
    assert out["fresh_net"] == [0, 1, 0, 1], out
    assert out["net"][0] == out["net"][1] != out["net_first"], out
    assert out["net"][2] != out["net"][1], out
    # The five files of the network state stay open, one set, across stagings.
    assert out["net_files"] == [5, 5, 5, 5], out
    # "1 <cgroups> <warm> <uid>": status_w, a pidfd of init (its namespaces are the
    # program's), the cgroup.procs file, then stdin_r, stdout_w, stderr_w, go_r, err_w,
    # setup_w, done_w.
    assert out["message"] == f"1 1 1 {UID}", out
    request, staged = out["request"], out["staged"]
    assert len(request) == 1 + 1 + 1 + 7 and len(staged) == 8, out
    assert out["pidfd_of"] == [out["init_pid"]], out
    status_w, (stdin_r, stdout_w, stderr_w, go_r, err_w, setup_w, done_w) = (
        request[0],
        request[3:],
    )
    stdin_w, stdout_r, stderr_r, err_r, setup_r, status_r, go_w, done_r = staged
    for writer, reader in (
        (stdin_w, stdin_r),
        (stdout_w, stdout_r),
        (stderr_w, stderr_r),
        (go_w, go_r),
        (err_w, err_r),
        (setup_w, setup_r),
        (status_w, status_r),
        (done_w, done_r),
    ):
        os.write(writer, b"%d" % writer)
        os.set_blocking(reader, False)
        assert os.read(reader, 16) == b"%d" % writer, (writer, reader)


@needs_root
@pytest.mark.parametrize(
    "case, expected",
    [
        ("no init", "spawn init: No such file or directory"),
        ("init refuses", "init: the uid argument: Invalid argument"),
        ("too many scratch mounts", "stage a run: malformed arguments: Invalid argument"),
    ],
)
def test_staging_names_the_step_that_failed_and_sends_nothing(
    libexec: Path, tmp_path: Path, case: str, expected: str
) -> None:
    out = _stage_in_fork(
        libexec,
        tmp_path,
        init=str(tmp_path / "missing") if case == "no init" else None,
        init_uid=0 if case == "init refuses" else jail.INIT_UID,
        n_scratch=5 if case == "too many scratch mounts" else 2,
    )
    assert out.get("error") == expected, out
    assert out["leaked"] == [], out  # everything it opened is closed again
    assert (out["init_pid"] > 0) is (case == "init refuses"), out  # the caller's to reap
    assert out["message"] == "" and out["request"] == [] and out["staged"] == [], out


@pytest.mark.parametrize(
    "uids", [range(0, 10), range(jail.UID_FIRST, jail.UID_FIRST), range(0x7FFF_FFF0, 0x8000_0010)]
)
def test_the_fork_server_refuses_a_uid_range_with_root_or_past_2_31(
    libexec: Path, uids: range
) -> None:
    lib = linux.ContainLibrary(str(libexec / "libexecbox-contain.so"), [linux.CLONE_NEWPID])
    with pytest.raises(OSError, match="check the uid range: Invalid argument"):
        lib.serve_programs(-1, -1, -1, uids, linux.SeccompLoader(b"\0" * 8))
