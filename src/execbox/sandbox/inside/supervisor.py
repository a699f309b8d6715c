"""A run slot, from the supervisors' zygote's fork to its last run: supervisor and init.

The supervisor builds the slot once (cgroup, mount, network and uts namespaces, read-only
root). For each run it mounts fresh scratch tmpfs, makes new pid and ipc namespaces, spawns
init (pid 1 of the run's pid namespace, a small static C program: `native/init.c`) and asks its
program zygote to fork the program into them (see `program`); the run is then staged. That
staging is one call into C (`native/stage.c`), off the request path. Once the program waits for
its code, the supervisor takes the run's baselines and offers the host the short way (the host
writes the code to the program itself, see `protocol`); a request that comes the long way is
read from the control socket and applied first. Those steps, the wait for the run's end and the
teardown are mostly system calls, also in C (`native/supervise.c`); Python reads the requests,
classifies the result and writes it. It enforces wall and CPU time, then reads the
cgroup for OOM kills, CPU and peak memory, collects artifacts and sends the result. Killing
init kills every process of the run: the kernel tears down the whole pid namespace, the
program, daemons and grandchildren included. Then the next run is staged; the host hears of it
once it asks for the slot again (NEXT). A session's slot ends with it. The supervisor is a fork
of a small zygote and init is no fork of Python at all: only the program pays for a big
interpreter.
Standard library only (and the jail's C library, through ctypes).
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import signal
import socket
import termios
import time
from dataclasses import asdict
from typing import Any

from . import artifacts, cells, jail, linux, outcome, protocol
from .cgroup import Hierarchy, RunCgroup

STAGED_MEMORY_BYTES = 512 << 20  # Limits().memory_mib
STAGED_PIDS = 64  # Limits().pids
# The fewest pids a program of each kind needs to get to waiting for its code: Node starts its
# platform's worker threads first. A run's lower limit is kept only until its slot stages the
# next program, else that program could never start and the slot's next run (another tenant's)
# would fail with a sandbox error.
STAGE_MIN_PIDS = {"javascript": 16}
INIT_WAIT_S = 5.0  # how long teardown waits for a killed init (see `end_init`)
PARK_WAIT_S = 30.0  # how long a staged program may take to wait for its code (the host's too)
PARK_MIN_S = 5.0  # and how long a run of any timeout waits for it (see `_await_parked`)


class Zygote:
    """What the light zygote hands every supervisor it forks."""

    def __init__(
        self,
        cfg: jail.JailConfig,
        hierarchy: Hierarchy,
        spawn: dict[str, socket.socket],
        demand_s: float,
    ) -> None:
        self.cfg = cfg
        self.hierarchy = hierarchy
        # To the program zygotes, by kind ("light", "heavy"); each socket is shared by every
        # supervisor (SOCK_SEQPACKET: one message is one request).
        self.spawn = spawn
        # A request that comes before its program waits for its code, or this soon after,
        # finds the slot in demand: its next program is staged without copying its warm
        # pages (see `_stage_run`). The host sets it (`host.zygotes.DEMAND_S`).
        self.demand_s = demand_s


def serve(z: Zygote, ctrl: int, message: str) -> None:
    """Entry point of the supervisor process; never returns. `message` is "<cgroup> <kind>"."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    keep = [ctrl, *(s.fileno() for s in z.spawn.values()), *z.hierarchy.parents.values()]
    jail.close_fds_except(keep)
    code = 0
    try:
        jail.name_process("execbox-sup")
        cgroup_name, kind = message.split(" ")
        if kind not in protocol.SLOT_KINDS:
            raise jail.JailError(f"protocol: unknown slot kind {kind!r}")
        os.write(ctrl, protocol.json_frame(protocol.PID, {"pid": _host_pid()}))
        Supervisor(z, ctrl, cgroup_name, kind).run()
    except BaseException as exc:  # noqa: BLE001 - report everything, then exit
        code = 1
        try:
            protocol.send_all(ctrl, protocol.json_frame(protocol.ERR, {"message": str(exc)}))
        except OSError:
            pass
    os._exit(code)


def _host_pid() -> int:
    """Our pid as the host sees it: in rootless mode the zygotes have a pid namespace of their
    own (see `native/enter.c`), and /proc, still the host's here, names the host's first."""
    if not jail.shared_uid:
        return os.getpid()
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    raise jail.JailError("read our pid in the host's pid namespace: no NSpid line")


class Supervisor:
    """One run slot. The slot (cgroup, mount, network and uts namespaces, root) is built once
    and serves run after run; each run gets fresh pid and ipc namespaces with their own init, a
    fresh /proc, fresh scratch mounts and new stdio pipes, all staged before its request
    arrives. Between runs nothing of the last one is left: init's death ends every process of
    its pid namespace, the cgroup is checked empty, the scratch tmpfs are replaced. Only the
    cgroup's memory and pids limits stay as the last run set them, for the short way of a next
    run that asks for the same (see `_wait_request`); one that asks for others has them
    applied before its code is sent."""

    def __init__(self, z: Zygote, ctrl: int, cgroup_name: str, kind: str) -> None:
        self.z = z
        self.cgroup_name = cgroup_name
        self.program_kind, warm_all = protocol.SLOT_KINDS[kind]
        self.warm = linux.WARM_ALL if warm_all else linux.WARM_BASE
        self.in_demand = False  # whether the last request came as its program got ready
        self.ctrl = ctrl
        self.cg: RunCgroup | None = None
        self.init_pid = 0
        self.run_fds: list[int] = []  # of the staged run, closed when it ends
        self.go_w = -1
        self.host_fds: list[int] = []  # the host's ends of the staged run's stdio
        self.ctrl_sock = socket.socket(fileno=ctrl)  # never closed: the process ends with os._exit
        self.runs = 0
        self.uid = 0  # the program's, claimed for the slot's life (see `_stage_slot`)
        self.uid_lock = -1
        self.steps: linux.SlotSteps | None = None  # see `_stage_slot`
        # Where this process's children go by default; each run points them at a fresh pid
        # namespace (unshare) and back (setns) for the next one.
        self.own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def run(self) -> None:
        try:
            self._stage_slot()
            while True:
                self._stage_run()
                steps = self.steps
                assert steps is not None
                host_fds, self.host_fds = self.host_fds, []
                # RDY (after NEXT: the host asks for the slot again once it has read a
                # result); the host's ends of the run's stdio go with it and are closed here.
                if not steps.hand_over(self.ctrl, bool(self.runs), host_fds):
                    return
                request = self._wait_request()
                if request is None:  # the host closed an idle slot
                    return
                kind, payload = request
                parked = steps.baselines.parked
                self.in_demand = (
                    not parked or time.monotonic() - steps.baselines.parked_at < self.z.demand_s
                )
                if kind == protocol.RUN:  # the host has the code on its way to the program
                    if not parked:
                        raise jail.JailError("protocol: a RUN before the slot offered it (PRK)")
                    run = json.loads(payload)
                    spec = jail.RunSpec(**run["spec"])
                    self._check_staged(spec)
                    # CLOCK_MONOTONIC is the machine's, the host's reading included.
                    started = min(float(run["sent"]), time.monotonic())
                    result = self._execute(None, spec, [], started)
                elif kind == protocol.REQ:
                    req = json.loads(payload)
                    files = []
                    for meta in req["files"]:
                        kind, data = protocol.read_frame(self.ctrl, max_len=1 << 34)
                        if kind != protocol.FILE or len(data) != meta["size"]:
                            raise jail.JailError(
                                f"protocol: bad input file frame for {meta['name']!r}"
                            )
                        files.append((meta["name"], data))
                    spec = jail.RunSpec(**req["spec"])
                    if req.get("session"):  # a session's slot serves nothing after it
                        cells.serve(self, spec, files)
                        return
                    result = (
                        self._execute(req["code"], spec, files, 0.0)
                        if self._await_parked(spec.timeout_s)
                        else None
                    )
                else:
                    raise jail.JailError(f"protocol: expected a request, got {kind!r}")
                if result is None:  # the program was gone before its code: nothing ran
                    frames = [protocol.frame(protocol.LOST, b"")]
                else:
                    frames = [protocol.json_frame(protocol.RES, result["meta"])]
                    frames += [protocol.frame(protocol.ART, a.data) for a in result["artifacts"]]
                for f in frames:
                    protocol.send_all(self.ctrl, f)
                self.runs += 1
                self._end_run()  # after the result: the caller does not wait for teardown
        finally:
            self._cleanup()

    def end_init(self) -> None:
        """Kill init, and with it everything in the run's pid namespace, and reap it. init's
        exit waits until every process of the namespace is reaped, the program by its zygote;
        should that never happen (the zygote died and nothing reaps its orphans), teardown goes
        on without it after INIT_WAIT_S."""
        if not self.init_pid:
            return
        pid, self.init_pid = self.init_pid, 0
        assert self.steps is not None  # made before any init is
        self.steps.end_init(pid, INIT_WAIT_S)

    def request_untaken(self, delivered: bool) -> bool:
        """Whether the staged program, now ended, never took its request: our write of it
        was refused (`delivered` False), or some of it is still unread in its go pipe. A
        program reads its request in full before any of the code runs, and nobody writes
        to the pipe after it, so code that started always leaves it empty."""
        return not delivered or _unread(self.go_w) > 0

    def close_go(self) -> None:
        """Close the program's go pipe (the code has been sent, or the session took it)."""
        if self.go_w >= 0:
            self.run_fds.remove(self.go_w)
            os.close(self.go_w)
            self.go_w = -1

    def _end_run(self) -> None:
        """Everything of the run gone: its processes, /proc, descriptors; the cgroup empty."""
        assert self.steps is not None
        pid, self.init_pid = self.init_pid, 0
        fds, self.run_fds, self.go_w = self.run_fds, [], -1
        if self.steps.end_run(pid, INIT_WAIT_S, fds):
            raise jail.JailError(
                "check the cgroup is empty: processes of the last run survived its pid namespace"
            )

    def _cleanup(self) -> None:
        self.end_init()
        if self.cg is not None:
            with jail.step("remove cgroup"):
                self.cg.remove()
            self.cg = None

    def _stage_slot(self) -> None:
        """What every run of this slot shares: the cgroup (its limits set for a run that asks
        for others, its counters read per run), the mount, network and uts namespaces and the
        read-only root."""
        with jail.step("create cgroup"):
            self.cg = self.z.hierarchy.create(self.cgroup_name)
            self.cg.set_limits(STAGED_MEMORY_BYTES, STAGED_PIDS)
        with jail.step("open the cgroup's cgroup.procs"):
            procs = self.cg.procs_files()
        self.uid, self.uid_lock = jail.claim_uid()
        jail.unshare_namespaces()
        with jail.step("open /proc/self/net"):
            # The host's /proc, kept past pivot_root: its net/ shows our current namespace.
            net_dir = os.open("/proc/self/net", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        jail.build_root(self.z.cfg, self.uid)
        jail.enter_root()
        self.stager = linux.Stager(
            self.z.cfg.contain_library,
            scratch=jail.staged_scratch(),
            own_pid_ns=self.own_pid_ns,
            cgroup_procs=procs,
            init=self.z.cfg.init,
            init_uid=jail.init_uid(),
            spawn=self.z.spawn[self.program_kind].fileno(),
            uid=self.uid,
            net_dir=net_dir,
        )
        self.steps = linux.SlotSteps(
            self.z.cfg.contain_library,
            self.cg.counter_files(),
            list(self.cg.dirs.values()),
            jail.JailError,
        )

    def _stage_run(self) -> None:
        """Everything of one run that does not depend on its request: fresh scratch mounts,
        fresh pid and ipc namespaces with their init, and the program process waiting, already
        contained, for its code. In C (`native/stage.c`): as Python steps, its sixty-odd
        system calls cost the supervisor more CPU than the calls themselves.

        The program copies its warm pages while it waits (`program`): a head start for a
        request that comes later, paid in CPU by every program whether its code writes those
        pages or not. When the slot's last request came as its program got ready (callers
        waiting for slots: the machine's CPU is the bottleneck), the next program is staged
        without them, ready sooner, and its code faults in only the pages it writes. A run
        can tell which it got (from its own memory), and so whether the request before it
        found the slot's program ready: a bit of timing, nothing of what any run computed."""
        assert self.steps is not None and self.cg is not None and self.cg.applied is not None
        if self.runs and self.cg.renews:
            with jail.step("make the cgroup anew"):  # its peak would be the last run's
                self.cg.renew()
        memory_bytes, pids = self.cg.applied
        least = STAGE_MIN_PIDS.get(self.program_kind, 0)
        if pids < least:
            self.cg.set_limits(memory_bytes, least)
        self.steps.new_run()
        warm = linux.WARM_NONE if self.in_demand else self.warm
        staged, error = self.stager.stage(first=not self.runs, warm=warm)
        self.init_pid = staged.init_pid  # killed by `end_init`, also when staging failed
        if error:
            raise jail.JailError(error)
        self.host_fds = [staged.stdin_w, staged.stdout_r, staged.stderr_r]
        self.err_r, self.setup_r = staged.err_r, staged.setup_r
        self.status_r, self.go_w, self.done_r = staged.status_r, staged.go_w, staged.done_r
        self.run_fds = [self.err_r, self.setup_r, self.status_r, self.go_w, self.done_r]

    def _wait_request(self) -> tuple[bytes, bytes] | None:
        """The host's next frame (None at end of file). Meanwhile, once the staged program
        says it waits for its code, take the run's baselines and offer the host the short way
        (PRK, see `protocol`): the run's token and the limits the slot has now, with the write
        end of the program's go pipe. A run's memory and pids limits stay applied for the
        next, so a caller's usual limits take the short way once each slot of the pool has run
        with them; slots are staged with the defaults."""
        assert self.cg is not None and self.cg.applied is not None and self.steps is not None
        memory_bytes, pids = self.cg.applied
        offer = (
            f'"memory_bytes":{memory_bytes},"pids":{pids},"disk_bytes":{jail.STAGED_DISK_BYTES}'
        ).encode()
        if not self.steps.await_request(self.ctrl, self.done_r, self.go_w, offer):
            return None  # the host closed the slot as its program got ready
        try:
            return protocol.read_frame(self.ctrl)
        except EOFError:
            return None

    def _await_parked(self, timeout_s: float) -> bool:
        """For a request that came the long way: the program must be waiting for its code and
        the baselines taken before the code is sent (True). Waits `timeout_s` (the run's own),
        at least PARK_MIN_S (a loaded machine may take that to ready a program; the wait is
        not the run's time) and at most PARK_WAIT_S, within the host's backstop. False when
        the program ended in set-up with no error of its own (killed from outside: the
        request may go to another program); a set-up that failed, or never ends, raises."""
        assert self.steps is not None
        if self.steps.baselines.parked:
            return True
        wait_s = min(PARK_WAIT_S, max(PARK_MIN_S, timeout_s))
        parked = self.steps.await_parked(self.done_r, wait_s)
        if parked:
            return True
        ready = parked is not None
        self.end_init()  # everything of the run is gone before its reports are read
        status, init_error = outcome.read_status(self.status_r)
        setup_error = outcome.read_available(self.setup_r).decode("utf-8", "replace")
        if setup_error or init_error:
            raise jail.JailError(setup_error or init_error or "")
        if (
            ready
            and status is not None
            and os.WIFSIGNALED(status)
            and os.WTERMSIG(status) == signal.SIGKILL
        ):
            return False  # killed from outside; any other end in set-up is ours to report
        if ready:
            raise jail.JailError(
                "program set-up: the program ended before its code came"
                + (f" (wait status {status})" if status is not None else "")
            )
        raise jail.JailError(f"program set-up: not waiting for its code within {wait_s:g} s")

    def _check_staged(self, spec: jail.RunSpec) -> None:
        """A RUN must ask for what the slot is staged with: nothing is applied for it."""
        assert self.cg is not None
        staged = (self.cg.applied, jail.scratch_sizes(jail.STAGED_DISK_BYTES))
        wanted = (
            (spec.memory_bytes, spec.pids),
            jail.scratch_sizes(spec.disk_bytes, spec.input_bytes, spec.input_count),
        )
        if wanted != staged:
            raise jail.JailError(
                f"protocol: a RUN with limits {wanted} in a slot staged with {staged}"
            )

    def _execute(
        self, code: str | None, spec: jail.RunSpec, files: list[tuple[str, bytes]], started: float
    ) -> dict[str, Any] | None:
        """One run; `code` None when the host has written it to the program (RUN), which it
        started sending at `started`. None when the program was gone before it took its code
        (see `request_untaken`): nothing of the request ran."""
        assert self.cg is not None and self.steps is not None
        base = self.steps.baselines
        inputs: dict[str, tuple[int, int]] = {}
        delivered = True
        if code is not None:
            with jail.step("apply limits"):
                changed = self.cg.set_limits(spec.memory_bytes, spec.pids)
            jail.size_scratch(spec)
            inputs = jail.place_inputs(files)
            if changed or files:
                # Lowering the memory limit reclaims what the cgroup holds beyond it: the peak
                # taken at PARKED would still show it.
                self.steps.reset_peak()
            del files
            go = protocol.go_frame(self.program_kind, code, vars(spec), base.token.decode())
            started = time.monotonic()
            try:
                protocol.send_all(self.go_w, go)
            except BrokenPipeError:
                delivered = False  # the program is gone; init's report may say why
        killed, reported = self._supervise(started, spec)
        wall_ms = (time.monotonic() - started) * 1000
        wait_status: int | None = reported
        init_error: str | None = None
        if reported is not None:
            os.kill(self.init_pid, signal.SIGKILL)  # the program is done: end the rest now
        else:
            self.end_init()  # everything of the run is gone before we look at its files
            wait_status, init_error = outcome.read_status(self.status_r)
        left = self.steps.collect(self.err_r, self.setup_r)
        user_error = outcome.clean_error(outcome.parse_json(left.error))
        setup_error = left.setup.decode("utf-8", "replace")
        if init_error:
            raise jail.JailError(init_error)
        if setup_error:
            raise jail.JailError(setup_error)
        oom = left.oom_kills - base.oom_kills
        # Killed from outside before it took its code; not by its own memory limit, which a
        # large request alone can reach (that run's status is memory_limit).
        lost = reported is None and not killed and not oom and self.request_untaken(delivered)
        self.close_go()
        if lost:
            return None
        cpu_ms = (left.cpu_ns - base.cpu_ns) / 1e6
        mem_peak = left.memory_peak
        # Only a failed run's status can be the disk limit (see `outcome.classify`).
        full = [] if wait_status == 0 else [p for p, _ in jail.SCRATCH if outcome.disk_full(p)]
        if left.workspace_inodes == 1 and not inputs:  # nothing but its root: no files
            collected: list[artifacts.Collected] = []
            art_truncated = False
        else:
            collected, art_truncated = artifacts.collect(
                "/workspace", set(inputs.values()), spec.artifact_files, spec.artifact_bytes
            )
        meta = outcome.classify(spec, killed, wait_status, user_error, oom, cpu_ms, full)
        meta.update(
            metrics={
                "wall_ms": round(wall_ms, 3),
                "cpu_ms": round(cpu_ms, 3),
                "memory_peak_bytes": mem_peak,
            },
            artifacts=[{k: v for k, v in asdict(a).items() if k != "data"} for a in collected],
            artifacts_truncated=art_truncated,
        )
        if inputs:
            meta["inputs_read"] = jail.inputs_read(inputs)
        if self.cg is not None and self.cg.unenforced():
            meta["unenforced_limits"] = self.cg.unenforced()
        return {"meta": meta, "artifacts": collected}

    def _supervise(self, started: float, spec: jail.RunSpec) -> tuple[str | None, int | None]:
        """Wait for the program to report its exit or for its status to arrive from its
        zygote; kill init (and so the program) on wall time, CPU time or a host request.
        Returns (why it was killed, the program's reported wait status)."""
        assert self.steps is not None
        # The first CPU check comes at once and sets the next (see `execbox_watch`).
        self.steps.start_watch(
            self.done_r, self.status_r, self.ctrl, started + spec.timeout_s, started, spec.cpu_s
        )
        killed: str | None = None
        while not killed:
            how, status = self.steps.watch()
            if how == linux.WATCH_REPORTED:
                return None, status
            if how == linux.WATCH_ENDED:
                return None, None
            if how == linux.WATCH_TIMEOUT:
                killed = "timeout"
            elif how == linux.WATCH_CPU:
                killed = "cpu_limit"
            else:  # a frame from the host
                try:
                    kind, payload = protocol.read_frame(self.ctrl, max_len=4096)
                except EOFError:
                    killed = "host_gone"
                else:
                    if kind == protocol.KILL:
                        killed = payload.decode()
        os.kill(self.init_pid, signal.SIGKILL)
        return killed, None


def _unread(fd: int) -> int:
    """Bytes in the pipe of `fd` (either end) that nobody has read."""
    if fd < 0:
        return 0
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return count[0]
