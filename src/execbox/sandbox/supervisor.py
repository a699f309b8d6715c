"""One run, from the zygote's fork to the result frame: supervisor, init and program.

The supervisor reads the request from its control socket, builds the cgroup and the jail,
forks init (pid 1 of the run's pid namespace), enforces wall and CPU time, then reads the
run's own cgroup for OOM kills, CPU and peak memory, collects artifacts, removes the cgroup
and sends the result. Killing init kills every process of the run: the kernel tears down the
whole pid namespace, daemons and grandchildren included.
Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from dataclasses import asdict
from typing import Any

from . import _linux, artifacts, jail, protocol, runner
from .cgroup import Hierarchy, RunCgroup


class Zygote:
    """What the zygote hands every supervisor it forks."""

    def __init__(self, cfg: jail.JailConfig, hierarchy: Hierarchy, src_paths: list[str]) -> None:
        self.cfg = cfg
        self.hierarchy = hierarchy
        self.src_paths = src_paths


def serve(z: Zygote, fds: list[int]) -> None:
    """Entry point of the supervisor process; never returns."""
    ctrl, stdin_r, stdout_w, stderr_w = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    keep = [ctrl, stdin_r, stdout_w, stderr_w, *z.hierarchy.parents.values()]
    jail.close_fds_except(keep)
    code = 0
    try:
        os.write(ctrl, protocol.json_frame(protocol.PID, {"pid": os.getpid()}))
        Supervisor(z, ctrl, stdin_r, stdout_w, stderr_w).run()
    except BaseException as exc:  # noqa: BLE001 - report everything, then exit
        code = 1
        try:
            protocol.send_all(ctrl, protocol.json_frame(protocol.ERR, {"message": str(exc)}))
        except OSError:
            pass
    os._exit(code)


class Supervisor:
    def __init__(self, z: Zygote, ctrl: int, stdin_r: int, stdout_w: int, stderr_w: int) -> None:
        self.z = z
        self.ctrl = ctrl
        self.stdio = (stdin_r, stdout_w, stderr_w)
        self.cg: RunCgroup | None = None
        self.init_pid = 0

    def run(self) -> None:
        kind, payload = protocol.read_frame(self.ctrl)
        if kind != protocol.REQ:
            raise jail.JailError(f"protocol: expected a request, got {kind!r}")
        req = json.loads(payload)
        files = []
        for meta in req["files"]:
            kind, data = protocol.read_frame(self.ctrl, max_len=1 << 34)
            if kind != protocol.FILE or len(data) != meta["size"]:
                raise jail.JailError(f"protocol: bad input file frame for {meta['name']!r}")
            files.append((meta["name"], data))
        spec = jail.RunSpec(**req["spec"])
        try:
            result = self._contain_and_run(req, spec, files)
        finally:
            self._cleanup()
        frames = [protocol.json_frame(protocol.RES, result["meta"])]
        frames += [protocol.frame(protocol.ART, a.data) for a in result["artifacts"]]
        for f in frames:
            protocol.send_all(self.ctrl, f)

    def _cleanup(self) -> None:
        if self.init_pid:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
                os.waitpid(self.init_pid, 0)
            except ChildProcessError:
                pass
            except ProcessLookupError:
                pass
        if self.cg is not None:
            with jail.step("remove cgroup"):
                self.cg.remove()

    def _contain_and_run(self, req: dict[str, Any], spec: jail.RunSpec,
                         files: list[tuple[str, bytes]]) -> dict[str, Any]:
        cfg = self.z.cfg
        marks = [("start", time.monotonic())]
        with jail.step("create cgroup"):
            self.cg = self.z.hierarchy.create(req["cgroup"])
            self.cg.set_limits(spec.memory_bytes, spec.pids)
            self.cg.open_procs()
        marks.append(("cgroup", time.monotonic()))
        jail.unshare_namespaces()
        marks.append(("unshare", time.monotonic()))
        jail.build_root(cfg, spec)
        marks.append(("root", time.monotonic()))
        inputs = jail.place_inputs(files)
        del files
        jail.enter_root()
        marks.append(("pivot", time.monotonic()))

        err_r, err_w = os.pipe()  # the program's structured error (the program can write it)
        setup_r, setup_w = os.pipe()  # set-up failures; closed before the code starts
        status_r, status_w = os.pipe()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(status_r)
            os.close(err_r)
            os.close(setup_r)
            self._init(spec, req["code"], err_w, setup_w, status_w)
        self.init_pid = pid
        self.cg.close_procs()
        for fd in (err_w, setup_w, status_w, *self.stdio):
            os.close(fd)
        killed = self._supervise(pid, started, spec)
        os.waitpid(pid, 0)
        self.init_pid = 0
        wall_ms = (time.monotonic() - started) * 1000
        marks.append(("init_exit", time.monotonic()))

        wait_status, init_error = _read_status(status_r)
        user_error = _clean_error(_read_json(err_r))
        setup_error = os.read(setup_r, 65536).decode("utf-8", "replace")
        for fd in (status_r, err_r, setup_r):
            os.close(fd)
        if init_error:
            raise jail.JailError(init_error)
        if setup_error:
            raise jail.JailError(setup_error)

        oom = self.cg.oom_kills()
        cpu_ms = self.cg.cpu_ns() / 1e6
        mem_peak = self.cg.memory_peak()
        full = [p for p in ("/workspace", "/tmp", "/dev/shm") if _is_full(p)]
        collected, art_truncated = artifacts.collect(
            "/workspace", inputs, spec.artifact_files, spec.artifact_bytes
        )
        marks.append(("collect", time.monotonic()))
        meta = classify(spec, killed, wait_status, user_error, oom, cpu_ms, full)
        meta.update(
            metrics={"wall_ms": round(wall_ms, 3), "cpu_ms": round(cpu_ms, 3),
                     "memory_peak_bytes": mem_peak},
            artifacts=[{k: v for k, v in asdict(a).items() if k != "data"} for a in collected],
            artifacts_truncated=art_truncated,
            phases_ms={name: round((t - marks[i][1]) * 1000, 3)
                       for i, (name, t) in enumerate(marks[1:])},
        )
        return {"meta": meta, "artifacts": collected}

    def _supervise(self, pid: int, started: float, spec: jail.RunSpec) -> str | None:
        """Wait for init to exit; kill it on wall time, CPU time or a host request."""
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(self.ctrl, select.POLLIN)
        deadline = started + spec.timeout_s
        cpu_limit_ns = spec.cpu_s * 1e9
        ncpu = max(1, len(os.sched_getaffinity(0)))
        next_cpu_check = started + spec.cpu_s / ncpu
        killed: str | None = None
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    killed = "timeout"
                elif now >= next_cpu_check:
                    used = self.cg.cpu_ns() if self.cg else 0
                    if used >= cpu_limit_ns:
                        killed = "cpu_limit"
                    else:
                        next_cpu_check = now + max(0.01, (cpu_limit_ns - used) / 1e9 / ncpu)
                if killed:
                    break
                wait_s = min(deadline, next_cpu_check) - now
                events = poller.poll(max(1, int(wait_s * 1000) + 1))
                if any(fd == pidfd for fd, _ in events):
                    return None
                if any(fd == self.ctrl for fd, _ in events):
                    try:
                        kind, payload = protocol.read_frame(self.ctrl, max_len=4096)
                    except EOFError:
                        killed = "host_gone"
                        break
                    if kind == protocol.KILL:
                        killed = payload.decode()
                        break
        finally:
            if killed:
                os.kill(pid, signal.SIGKILL)
            os.close(pidfd)
        return killed

    def _init(self, spec: jail.RunSpec, code: str, err_w: int, setup_w: int,
              status_w: int) -> None:
        """pid 1 of the run's pid namespace. Never returns."""
        try:
            _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
            assert self.cg is not None
            with jail.step("join cgroup"):
                self.cg.join()
                self.cg.close_procs()
            jail.unshare_cgroup_namespace()
            jail.mount_proc()
            stdin_r, stdout_w, stderr_w = self.stdio
            pid = os.fork()
            if pid == 0:
                _program(self.z, spec, code, stdin_r, stdout_w, stderr_w, err_w, setup_w)
            jail.close_fds_except([status_w])
            jail.drop_privileges(jail.INIT_UID, self.z.cfg.cap_last_cap)
            jail.load_seccomp(self.z.cfg)
        except BaseException as exc:  # noqa: BLE001
            _write_quiet(status_w, json.dumps({"error": f"init: {exc}"}).encode())
            os._exit(1)
        while True:
            try:
                reaped, wstatus = os.wait()
            except ChildProcessError:
                os._exit(1)
            except InterruptedError:
                continue
            if reaped == pid:
                _write_quiet(status_w, json.dumps({"status": wstatus}).encode())
                os._exit(0)


def _program(z: Zygote, spec: jail.RunSpec, code: str, stdin_r: int, stdout_w: int,
             stderr_w: int, err_w: int, setup_w: int) -> None:
    """The user's process: contain, then run the code. Never returns."""
    try:
        jail.setup_stdio(stdin_r, stdout_w, stderr_w, keep=[err_w, setup_w])
        jail.set_rlimits(spec)
        with jail.step("enter /workspace"):
            os.chdir("/workspace")
        jail.drop_privileges(jail.SANDBOX_UID, z.cfg.cap_last_cap)
        jail.set_environment(spec.env)
        with jail.step("reseed random state"):
            runner.reseed()
        os.umask(0o022)
        jail.load_seccomp(z.cfg)
    except BaseException as exc:  # noqa: BLE001
        _write_quiet(setup_w, f"program set-up: {exc}".encode())
        os._exit(127)
    os.close(setup_w)
    runner.run(code, err_w, z.src_paths)


def _write_quiet(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)
    except OSError:
        pass


def _read_json(fd: int) -> dict[str, Any] | None:
    data = b""
    while len(data) < 128 * 1024:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    if not data:
        return None
    try:
        obj = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _clean_error(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """The program can write anything to its error pipe: keep only a well-formed record."""
    if not obj or not isinstance(obj.get("type"), str) or not isinstance(obj.get("message"), str):
        return None

    def opt_int(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    tb = obj.get("traceback")
    return {"type": obj["type"][:200], "message": obj["message"],
            "line": opt_int(obj.get("line")), "column": opt_int(obj.get("column")),
            "traceback": tb if isinstance(tb, str) else None}


def _read_status(fd: int) -> tuple[int | None, str | None]:
    obj = _read_json(fd) or {}
    status = obj.get("status")
    return (status if isinstance(status, int) else None), obj.get("error")


def _is_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def _hint(setting: str, flag: str) -> str:
    return f"raise limits.{setting} (CLI {flag})"


def classify(spec: jail.RunSpec, killed: str | None, wait_status: int | None,
             user_error: dict[str, Any] | None, oom: int, cpu_ms: float,
             full: list[str]) -> dict[str, Any]:
    """Map how the run ended to a contract status, exit code, signal and error."""
    exit_code: int | None = None
    sig: str | None = None
    if wait_status is not None:
        if os.WIFEXITED(wait_status):
            exit_code = os.WEXITSTATUS(wait_status)
        elif os.WIFSIGNALED(wait_status):
            sig = _signal_name(os.WTERMSIG(wait_status))
    elif killed:
        sig = "SIGKILL"

    def limit(status: str, kind: str, message: str) -> dict[str, Any]:
        return {"status": status, "exit_code": exit_code, "signal": sig,
                "error": {"type": kind, "message": message, "line": None, "column": None,
                          "traceback": user_error.get("traceback") if user_error else None}}

    mib = 1024 * 1024
    if killed == "timeout":
        return limit("timeout", "TimeoutError",
                     f"wall time limit of {spec.timeout_s:g} s exceeded; "
                     + _hint("timeout_s", "--timeout"))
    if killed == "output_limit":
        return limit("output_limit", "OutputLimitExceeded",
                     f"output exceeded {spec.output_bytes} bytes on stdout or stderr; "
                     + _hint("output_bytes", "--output-bytes"))
    if killed == "host_gone":
        return limit("sandbox_error", "SandboxError", "the executor went away during the run")
    failed = exit_code != 0
    if not failed:
        user_error = None  # a clean exit has no uncaught exception: ignore whatever is in the pipe
    # A process killed by its own RLIMIT_CPU just before the cgroup check fired: the tree has
    # used its whole allowance and the run failed, so the CPU limit is what ended it.
    cpu_hit = killed == "cpu_limit" or sig == "SIGXCPU" or (
        failed and cpu_ms >= spec.cpu_s * 1000 * 0.98)
    if cpu_hit:
        return limit("cpu_limit", "CPULimitExceeded",
                     f"CPU time limit of {spec.cpu_s:g} s exceeded; " + _hint("cpu_s", "--cpu"))
    err = user_error or {}
    mem_error = err.get("type") == "MemoryError"
    if (oom and failed) or mem_error:
        return limit("memory_limit", "MemoryLimitExceeded",
                     f"memory limit of {spec.memory_bytes // mib} MiB exceeded; "
                     + _hint("memory_mib", "--memory"))
    if sig == "SIGSYS":
        return limit("forbidden", "ForbiddenSyscall",
                     "the program made a system call the sandbox forbids and was killed")
    enospc = "No space left on device" in str(err.get("message"))
    if failed and (full or enospc):
        return limit("disk_limit", "DiskLimitExceeded",
                     f"disk limit of {spec.disk_bytes // mib} MiB reached in "
                     f"{', '.join(full) or 'the workspace'}; " + _hint("disk_mib", "--disk"))
    error = None
    if user_error:
        error = {k: user_error.get(k) for k in ("type", "message", "line", "column", "traceback")}
    elif failed:
        what = f"signal {sig}" if sig else f"exit code {exit_code}"
        error = {"type": "ProcessError", "message": f"the program ended with {what}",
                 "line": None, "column": None, "traceback": None}
    return {"status": "ok" if not failed else "error", "exit_code": exit_code, "signal": sig,
            "error": error}

