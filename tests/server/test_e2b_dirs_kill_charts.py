"""Issue 34's second pass, through the official E2B SDKs (sync and async) against a real
`execbox serve --e2b` on loopback over the real sandbox: directories made empty, commands
killed by pid, figures' chart data and the sandbox's metrics, each with the attacks that
apply to it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .e2b_support import E2BServer, use_sdk

pytest.importorskip("e2b")
pytest.importorskip("e2b_code_interpreter")

from e2b import (  # noqa: E402
    CommandExitException,
    FileType,
    NotFoundException,
    SandboxException,
)
from e2b_code_interpreter import AsyncSandbox, Sandbox  # noqa: E402
from e2b_code_interpreter.charts import ChartType  # noqa: E402

pytestmark = pytest.mark.slow
MIB = 1 << 20
# The names of processes named `sleep` in the sandbox, as code in it sees them.
SLEEPERS = (
    "import os\nsorted(p for p in os.listdir('/proc') if p.isdigit() "
    "and open(f'/proc/{p}/comm').read().strip() == 'sleep')"
)


@pytest.fixture
def sbx(e2b_tenant: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    try:
        yield sandbox
    finally:
        sandbox.kill()


# ---- directories ------------------------------------------------------------------------------


def test_make_dir_makes_an_empty_directory_every_call_sees(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("/home/user/empty") is True
    assert sbx.files.make_dir("empty") is False  # E2B's "already exists"
    assert sbx.files.make_dir("/workspace/a/b/c") is True  # with its parents
    assert sbx.files.exists("empty") and sbx.files.exists("/home/user/a/b")
    info = sbx.files.get_info("empty")
    assert info.type == FileType.DIR and info.path == "/home/user/empty"
    top = {e.name: e.type for e in sbx.files.list("/home/user")}
    assert top == {"empty": FileType.DIR, "a": FileType.DIR}
    assert sbx.files.list("empty") == []
    deep = [e.path for e in sbx.files.list("/home/user", depth=3)]
    assert deep == ["/home/user/a", "/home/user/a/b", "/home/user/a/b/c", "/home/user/empty"]
    # Real directories in the sandbox, the code's own to write in.
    made = sbx.run_code("import os\nopen('a/b/c/f.txt', 'w').write('x')\nos.path.isdir('empty')")
    assert made.error is None and made.text == "True"
    sbx.files.rename("empty", "/home/user/moved")
    assert not sbx.files.exists("empty") and sbx.files.get_info("moved").type == FileType.DIR
    sbx.files.rename("a", "z/a")  # a tree, its file and empty directories with it
    assert sbx.files.read("z/a/b/c/f.txt") == "x" and not sbx.files.exists("a")
    sbx.files.remove("/home/user/z")
    sbx.files.remove("moved")
    assert sbx.files.list("/home/user") == []
    assert sbx.run_code("import os\nos.listdir('.')").text == "[]"


def test_make_dir_refuses_links_escapes_and_files_in_its_way(sbx: Sandbox) -> None:
    planted = sbx.run_code("import os\nos.symlink('/tmp', 'ln')\nopen('f.txt', 'w').write('f')")
    assert planted.error is None
    for path in ("ln/x", "ln", "f.txt", "f.txt/sub"):
        with pytest.raises(SandboxException):
            sbx.files.make_dir(path)
    for outside in ("../x", "a/../../x", "/etc/x", "/home/user/../../tmp/x", "/tmp/x"):
        with pytest.raises(SandboxException):
            sbx.files.make_dir(outside)
    seen = sbx.run_code(
        "import os\n([n for n in os.listdir('/tmp') if n in ('x', 'f.txt')], "
        "os.path.islink('ln'), open('f.txt').read(), "
        "sorted(os.listdir('.')))"
    )
    assert seen.text == "([], True, 'f', ['f.txt', 'ln'])"
    # A rename is no way out either: never through a link, never outside.
    with pytest.raises(SandboxException):
        sbx.files.rename("f.txt", "ln/f.txt")
    with pytest.raises(SandboxException):
        sbx.files.rename("f.txt", "/etc/f.txt")
    assert sbx.run_code("import os\n'f.txt' in os.listdir('/tmp')").text == "False"


def test_directories_count_against_the_workspace(sbx: Sandbox) -> None:
    # A name too long for the workspace's file system is the caller's error, not a crash.
    with pytest.raises(SandboxException):
        sbx.files.make_dir("d" * 300)
    assert sbx.files.make_dir("/".join(["d"] * 40)) is True
    assert len(sbx.files.list("/home/user", depth=64)) == 40


def test_async_make_dir_list_and_remove(e2b_tenant: str) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create()
        try:
            assert await sbx.files.make_dir("/home/user/data/raw") is True
            assert await sbx.files.make_dir("data/raw") is False
            listed = await sbx.files.list("data")
            assert [(e.name, e.type) for e in listed] == [("raw", FileType.DIR)]
            await sbx.files.remove("data")
            assert not await sbx.files.exists("data")
        finally:
            await sbx.kill()

    asyncio.run(main())


# ---- kill -------------------------------------------------------------------------------------


def _wait_listed(sbx: Sandbox, pid: int) -> None:
    deadline = time.monotonic() + 30
    while pid not in [p.pid for p in sbx.commands.list()]:
        assert time.monotonic() < deadline, "the command never showed in commands.list()"
        time.sleep(0.05)


def test_kill_ends_a_background_command_and_all_it_started(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 60 & sleep 60; echo never", background=True)
    _wait_listed(sbx, handle.pid)
    listed = [p for p in sbx.commands.list() if p.pid == handle.pid]
    assert listed[0].cmd == "/bin/bash" and listed[0].args[-1] == "sleep 60 & sleep 60; echo never"
    time.sleep(0.5)  # the command is running, not waiting for its turn
    started = time.monotonic()
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as info:
        handle.wait()
    assert time.monotonic() - started < 5
    assert info.value.exit_code == -1 and info.value.error == "signal: killed"
    assert "never" not in info.value.stdout
    assert sbx.commands.list() == []
    assert sbx.commands.kill(handle.pid) is False  # ended: E2B's "not found"
    assert sbx.commands.kill(4242) is False
    # The session goes on, and nothing the command started is left running.
    assert sbx.run_code(SLEEPERS).text == "[]"
    assert sbx.commands.run("echo after").stdout == "after\n"


def test_a_handles_kill_and_a_command_killed_before_its_turn(sbx: Sandbox) -> None:
    first = sbx.commands.run("sleep 60", background=True)
    queued = sbx.commands.run("touch never.txt", background=True)  # waits for the first
    _wait_listed(sbx, queued.pid)
    assert sbx.commands.kill(queued.pid) is True
    assert first.kill() is True
    for handle in (first, queued):
        with pytest.raises(CommandExitException) as info:
            handle.wait()
        assert info.value.exit_code == -1
    assert not sbx.files.exists("never.txt")
    assert sbx.run_code("1 + 1").text == "2"


def test_a_kill_as_the_command_starts_ends_it_and_not_the_session(sbx: Sandbox) -> None:
    # The kill may come before the cell's turn, as the session takes the cell, or as the
    # interpreter begins it (an interrupt it has not yet armed for): each ends the command.
    for _ in range(5):
        handle = sbx.commands.run("sleep 60", background=True)
        assert sbx.commands.kill(handle.pid) is True
        started = time.monotonic()
        with pytest.raises(CommandExitException) as info:
            handle.wait()
        assert info.value.exit_code == -1 and time.monotonic() - started < 5
    assert sbx.run_code(SLEEPERS).text == "[]"
    assert sbx.run_code("1 + 1").text == "2"


def test_another_sandbox_cannot_kill_a_command(
    sbx: Sandbox, e2b_server: E2BServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = sbx.commands.run("sleep 2; echo finished", background=True)
    _wait_listed(sbx, handle.pid)
    other_name, other_key = e2b_server.key()
    use_sdk(monkeypatch, e2b_server.url, other_key)
    theirs = Sandbox.create()
    try:
        assert theirs.commands.kill(handle.pid) is False  # not a process of their sandbox
        assert theirs.commands.list() == []
        body = json.dumps({"process": {"pid": handle.pid}, "signal": "SIGNAL_SIGKILL"})
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "Content-Type": "application/json"}
        with httpx.Client(base_url=e2b_server.url + "/e2b", headers=headers) as raw:
            # The id of mine with their token, or none: refused before any pid is looked at.
            for token in ({"X-Access-Token": theirs._envd_access_token or ""}, {}):
                answer = raw.post("/process.Process/SendSignal", content=body, headers=token)
                assert answer.status_code == 401, answer.text
    finally:
        theirs.kill()
        e2b_server.revoke(other_name)
    assert handle.wait().stdout == "finished\n"  # it ran to its end


def test_stdin_and_connect_by_pid_say_they_are_not_supported(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 1", background=True)
    with pytest.raises(SandboxException, match="no stdin"):
        sbx.commands.send_stdin(handle.pid, "x")
    with pytest.raises(SandboxException, match="reconnected"):
        sbx.commands.connect(handle.pid)
    assert handle.wait().exit_code == 0


def test_async_kill(e2b_tenant: str) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create()
        try:
            handle = await sbx.commands.run("sleep 60", background=True)
            deadline = time.monotonic() + 30
            while handle.pid not in [p.pid for p in await sbx.commands.list()]:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            assert await sbx.commands.kill(handle.pid) is True
            with pytest.raises(CommandExitException) as info:
                await handle.wait()
            assert info.value.exit_code == -1
            assert await sbx.commands.kill(handle.pid) is False
        finally:
            await sbx.kill()

    asyncio.run(main())


# ---- charts -----------------------------------------------------------------------------------

PLT = "import matplotlib.pyplot as plt\n"


def _chart(sbx: Sandbox, code: str) -> Any:  # the SDK types a chart by its kind
    execution = sbx.run_code(PLT + code)
    assert execution.error is None, execution.error
    figures = [r for r in execution.results if r.png]
    assert len(figures) == 1  # the PNG comes whatever the chart
    return figures[0].chart


def test_a_line_charts_points_are_the_plotted_data(sbx: Sandbox) -> None:
    chart = _chart(
        sbx,
        "plt.plot([1, 2, 3], [3, 1.5, 2], label='series')\nplt.plot([0, 4], [9, 8])\n"
        "plt.title('T')\nplt.xlabel('Time (s)')\nplt.ylabel('Mass [kg]')\nplt.show()",
    )
    assert chart is not None and chart.type == ChartType.LINE
    assert (chart.title, chart.x_label, chart.x_unit, chart.y_unit) == ("T", "Time (s)", "s", "kg")
    assert chart.elements[0].label == "series"
    assert chart.elements[0].points == [(1.0, 3.0), (2.0, 1.5), (3.0, 2.0)]
    assert chart.elements[1].points == [(0.0, 9.0), (4.0, 8.0)]
    assert chart.x_scale.value == "linear" and chart.x_ticks and chart.x_tick_labels


def test_bar_scatter_and_pie_charts(sbx: Sandbox) -> None:
    bar = _chart(sbx, "plt.bar(['a', 'b', 'c'], [3, 5, 2])")
    assert bar is not None and bar.type == ChartType.BAR
    assert [(e.label, e.value) for e in bar.elements] == [("a", 3.0), ("b", 5.0), ("c", 2.0)]
    across = _chart(sbx, "plt.barh(['x', 'y'], [7, 1])\nplt.xlabel('count')")
    assert across.type == ChartType.BAR and across.y_label == "count"
    assert [(e.label, e.value) for e in across.elements] == [("x", 7.0), ("y", 1.0)]
    scatter = _chart(sbx, "plt.scatter([1, 2], [3, 4])")
    assert scatter is not None and scatter.type == ChartType.SCATTER
    assert scatter.elements[0].points == [(1.0, 3.0), (2.0, 4.0)]
    pie = _chart(sbx, "plt.pie([1, 1, 2], labels=['x', 'y', 'z'])")
    assert pie is not None and pie.type == ChartType.PIE
    assert [(e.label, round(e.angle)) for e in pie.elements] == [("x", 90), ("y", 90), ("z", 180)]


def test_several_axes_unknown_kinds_and_large_figures(sbx: Sandbox) -> None:
    both = _chart(
        sbx,
        "fig, (a, b) = plt.subplots(2)\nfig.suptitle('two')\na.plot([1, 2], [2, 1])\n"
        "b.bar(['p'], [4])",
    )
    assert both is not None and both.type == ChartType.SUPERCHART and both.title == "two"
    assert [c.type for c in both.elements] == [ChartType.LINE, ChartType.BAR]
    image = _chart(sbx, "plt.imshow([[1, 2], [3, 4]])")
    assert image is not None and image.type == ChartType.UNKNOWN and image.elements == []
    assert _chart(sbx, "plt.plot(range(30000))") is None  # past the cap: the PNG alone
    assert _chart(sbx, "plt.figure()") is None  # no data, no chart


def test_a_forged_chart_output_does_not_break_the_results(sbx: Sandbox) -> None:
    forged = sbx.run_code(
        "from IPython.display import display\n"
        "display({'application/vnd.execbox.chart+json': '[1, 2]', 'text/plain': 'x'}, raw=True)\n"
        "display({'application/vnd.execbox.chart+json': 'not json', 'text/plain': 'y'}, raw=True)"
    )
    assert forged.error is None
    assert [r.text for r in forged.results] == ["x", "y"]
    assert all(r.chart is None for r in forged.results)


def test_async_chart(e2b_tenant: str) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create()
        try:
            execution = await sbx.run_code(PLT + "plt.plot([5, 6], [7, 8])")
            chart = next(r.chart for r in execution.results if r.png)
            assert chart is not None and chart.elements[0].points == [(5.0, 7.0), (6.0, 8.0)]
        finally:
            await sbx.kill()

    asyncio.run(main())


# ---- metrics ----------------------------------------------------------------------------------


def test_metrics_are_the_sessions_memory_cpu_and_disk(
    sbx: Sandbox, e2b_server: E2BServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = sbx.get_metrics()
    assert len(before) == 1 and before[0].mem_total == 512 * MIB  # the `data` profile's
    assert before[0].cpu_count >= 1 and before[0].disk_total > 0
    sbx.files.write("small.bin", b"x" * (512 << 10))
    busy = sbx.run_code(
        "open('blob.bin', 'wb').write(b'x' * (8 << 20))\nheld = b'x' * (64 << 20)\n"
        "x = 0\nfor i in range(3_000_000):\n    x += i"
    )
    assert busy.error is None, busy.error
    after = sbx.get_metrics()[0]
    assert after.mem_used >= before[0].mem_used + 64 * MIB
    assert after.disk_used >= before[0].disk_used + 8 * MIB
    assert after.cpu_used_pct > 0
    other_name, other_key = e2b_server.key()
    use_sdk(monkeypatch, e2b_server.url, other_key)
    try:
        with pytest.raises(NotFoundException):
            Sandbox.get_metrics(sbx.sandbox_id)  # not their sandbox
    finally:
        e2b_server.revoke(other_name)


def test_async_metrics(e2b_tenant: str) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create()
        try:
            metrics = await sbx.get_metrics()
            assert len(metrics) == 1 and metrics[0].mem_total == 512 * MIB
        finally:
            await sbx.kill()

    asyncio.run(main())
