"""The official E2B SDKs (`e2b`, `e2b-code-interpreter`), unchanged, against a real
`execbox serve --e2b` on loopback over the real sandbox: only the environment variables say
where the server is and which execbox key to use."""

from __future__ import annotations

import asyncio
import base64
import time

import httpx
import pytest

import execbox

from .e2b_support import MAX_REQUEST_BYTES, E2BServer, e2b_serving, use_sdk

pytest.importorskip("e2b")
pytest.importorskip("e2b_code_interpreter")

from e2b import (  # noqa: E402
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)
from e2b_code_interpreter import AsyncSandbox, Sandbox  # noqa: E402

pytestmark = pytest.mark.slow
# A well-formed AWS access key id: redacted by pattern, no registration needed.
AWS_KEY = "AKIA" + "Q3EXAMPLE7KEY2ID"


def test_run_code_keeps_state_and_is_recorded_for_the_key(
    e2b_tenant: str, e2b_server: E2BServer
) -> None:
    sbx = Sandbox.create()
    try:
        seen: list[str] = []
        first = sbx.run_code("x = 41\nprint('hello')", on_stdout=lambda m: seen.append(m.line))
        assert first.logs.stdout == ["hello\n"] and seen == ["hello\n"]
        assert first.error is None and first.results == []
        second = sbx.run_code("x + 1")
        assert second.text == "42" and second.results[0].is_main_result
        assert second.execution_count == 2
        assert e2b_server.runs_of(e2b_tenant) == 2  # each cell is an execbox run owned by the key
    finally:
        sbx.kill()


def test_chart_error_and_stderr_in_e2b_shapes(e2b_tenant: str) -> None:
    sbx = Sandbox.create()
    try:
        chart = sbx.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()"
        )
        png = [r.png for r in chart.results if r.png]
        assert len(png) == 1 and base64.b64decode(png[0]).startswith(b"\x89PNG")
        errors: list[object] = []
        failed = sbx.run_code(
            "import sys\nprint('warn', file=sys.stderr)\ndef f():\n    return 1 / 0\nf()",
            on_error=errors.append,
        )
        assert failed.error is not None and failed.error.name == "ZeroDivisionError"
        assert failed.error.value == "division by zero"
        assert "return 1 / 0" in failed.error.traceback
        assert errors == [failed.error] and failed.logs.stderr[0] == "warn\n"
        html = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        assert html.results[0].is_main_result and "<table" in (html.results[0].html or "")
    finally:
        sbx.kill()


def test_javascript_and_a_new_context_are_sessions_of_their_own(e2b_tenant: str) -> None:
    sbx = Sandbox.create()
    try:
        assert sbx.run_code("let n = 21; n * 2", language="javascript").text == "42"
        assert sbx.run_code("n + 1", language="javascript").text == "22"
        logged = sbx.run_code("console.log('js out')", language="javascript")
        assert logged.logs.stdout == ["js out\n"]
        thrown = sbx.run_code("throw new TypeError('boom')", language="javascript")
        assert thrown.error is not None and thrown.error.name == "TypeError"
        assert thrown.error.value == "boom"
        context = sbx.create_code_context()
        sbx.run_code("y = 5", context=context)
        assert sbx.run_code("y * 2", context=context).text == "10"
        assert sbx.run_code("'y' in dir()").text == "False"  # the default context is apart
        assert context.id in {c.id for c in sbx.list_code_contexts()}
        sbx.remove_code_context(context)
    finally:
        sbx.kill()


def test_commands_stream_output_and_exit_codes(e2b_tenant: str) -> None:
    sbx = Sandbox.create()
    try:
        out: list[str] = []
        done = sbx.commands.run(
            "echo one; echo two >&2; echo $GREETING; pwd",
            envs={"GREETING": "hi"},
            cwd="/home/user",
            on_stdout=out.append,
        )
        assert done.exit_code == 0 and done.stdout == "one\nhi\n/workspace\n"
        assert done.stderr == "two\n" and "".join(out) == done.stdout
        with pytest.raises(CommandExitException) as info:
            sbx.commands.run("echo no >&2; exit 3")
        assert info.value.exit_code == 3 and info.value.stderr == "no\n"
        handle = sbx.commands.run("sleep 0.2; echo later", background=True)
        assert handle.wait().stdout == "later\n"
        sbx.commands.run("echo made > made.txt")  # in the same workspace as the files API
        assert sbx.files.read("/home/user/made.txt") == "made\n"
    finally:
        sbx.kill()


def test_files_round_trip_list_rename_remove(e2b_tenant: str) -> None:
    sbx = Sandbox.create()
    try:
        sbx.files.write("/home/user/data/a.txt", "alpha")
        sbx.files.write("data/b.bin", b"\x00\x01", use_octet_stream=True)
        assert sbx.files.read("/home/user/data/a.txt") == "alpha"
        assert sbx.files.read("data/b.bin", format="bytes") == bytearray(b"\x00\x01")
        assert sbx.run_code("open('data/a.txt').read()").text == "'alpha'"
        assert {e.name for e in sbx.files.list("/home/user/data")} == {"a.txt", "b.bin"}
        assert sbx.files.exists("/home/user/data") and not sbx.files.exists("nope.txt")
        assert sbx.files.get_info("data/a.txt").size == 5
        sbx.files.rename("data/a.txt", "/home/user/c.txt")
        assert sbx.files.read("c.txt") == "alpha" and not sbx.files.exists("data/a.txt")
        sbx.files.remove("/home/user/data")
        assert not sbx.files.exists("data/b.bin")
        with pytest.raises(NotFoundException):
            sbx.files.read("/home/user/missing.txt")
        with pytest.raises(SandboxException, match="outside the sandbox's workspace"):
            sbx.files.read("/etc/passwd")
    finally:
        sbx.kill()


def test_links_planted_by_code_are_not_followed(e2b_tenant: str) -> None:
    sbx = Sandbox.create()
    try:
        sbx.run_code("import os\nos.symlink('/etc/passwd', 'link')")
        with pytest.raises(SandboxException, match="not a regular file"):
            sbx.files.read("/home/user/link")
        sbx.files.write("/home/user/link", "replaced")  # replaces the link, never writes through
        assert sbx.run_code("import os\nos.path.islink('link')").text == "False"
    finally:
        sbx.kill()


def test_list_connect_timeout_and_kill(e2b_tenant: str) -> None:
    sbx = Sandbox.create(metadata={"team": "blue"}, timeout=120)
    try:
        listed = Sandbox.list(query=None).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
        assert listed[0].metadata == {"team": "blue"}
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.run_code("6 * 7").text == "42"
        sbx.set_timeout(300)
        info = sbx.get_info()
        assert (info.end_at - info.started_at).total_seconds() > 250
    finally:
        assert sbx.kill()
    assert not sbx.is_running()
    assert Sandbox.list().next_items() == []
    with pytest.raises(SandboxException):
        sbx.run_code("1")


def test_a_wrong_key_is_refused(e2b_server: E2BServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", e2b_server.url + "/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", e2b_server.url + "/e2b")
    monkeypatch.setenv("E2B_API_KEY", "ebx_" + "x" * 43)
    with pytest.raises(AuthenticationException):
        Sandbox.create()


def test_another_key_cannot_reach_the_sandbox(
    e2b_tenant: str, e2b_server: E2BServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    sbx = Sandbox.create()
    try:
        sbx.files.write("secret.txt", "mine")
        other_name, other = e2b_server.key()
        monkeypatch.setenv("E2B_API_KEY", other)
        with pytest.raises(NotFoundException):
            Sandbox.connect(sbx.sandbox_id)
        assert Sandbox.list().next_items() == []
        assert Sandbox.kill(sbx.sandbox_id) is False  # the SDK's "not found"
        # Knowing the id is not enough on the sandbox's own face: its token is required.
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
        with httpx.Client(base_url=e2b_server.url + "/e2b", headers=headers) as raw:
            assert raw.get("/files", params={"path": "secret.txt"}).status_code == 401
            assert raw.post("/execute", json={"code": "1"}).status_code == 401
            forged = {"X-Access-Token": "x" * 43}
            assert raw.post("/execute", json={"code": "1"}, headers=forged).status_code == 401
        assert sbx.files.read("secret.txt") == "mine"  # the owner still reaches it
    finally:
        sbx.kill()
        e2b_server.revoke(other_name)


def test_what_execbox_cannot_do_is_an_error_naming_it(e2b_tenant: str) -> None:
    with pytest.raises(SandboxException, match="internet access"):
        Sandbox.create(allow_internet_access=True)
    with pytest.raises(SandboxException, match="template 'no-such-template' not found"):
        Sandbox.create(template="no-such-template")
    sbx = Sandbox.create()
    try:
        with pytest.raises(SandboxException, match="pausing sandboxes"):
            sbx.pause()
        with pytest.raises(SandboxException, match="environment variables for one execution"):
            sbx.run_code("1", envs={"A": "1"})
        with pytest.raises(SandboxException, match="watching directories"):
            sbx.files.watch_dir("/home/user")
        with pytest.raises(SandboxException, match="'r' language"):
            sbx.run_code("1", language="r")
    finally:
        sbx.kill()


def test_async_client(e2b_tenant: str, e2b_server: E2BServer) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create()
        try:
            await sbx.run_code("z = 6")
            assert (await sbx.run_code("z * 7")).text == "42"
            out: list[str] = []
            chart = await sbx.run_code(
                "import matplotlib.pyplot as plt\nprint('plotting')\nplt.bar([1, 2], [3, 4])",
                on_stdout=lambda m: out.append(m.line),
            )
            assert out == ["plotting\n"]
            assert any(r.png and base64.b64decode(r.png)[:4] == b"\x89PNG" for r in chart.results)
            failed = await sbx.run_code("{}['missing']")
            assert failed.error is not None and failed.error.name == "KeyError"
            assert "{}['missing']" in failed.error.traceback
            await sbx.files.write("/home/user/a.txt", "async")
            assert await sbx.files.read("/home/user/a.txt") == "async"
            done = await sbx.commands.run("cat a.txt")
            assert done.stdout == "async" and done.exit_code == 0
            assert [s.sandbox_id for s in (await AsyncSandbox.list().next_items())] == [
                sbx.sandbox_id
            ]
        finally:
            await sbx.kill()
        assert not await sbx.is_running()

    asyncio.run(main())
    assert e2b_server.runs_of(e2b_tenant) == 5


def test_getting_started_example_runs_unchanged(e2b_tenant: str) -> None:
    # E2B's README example, as published.
    with Sandbox.create() as sandbox:
        sandbox.run_code("x = 1")
        execution = sandbox.run_code("x+=1; x")
        print(execution.text)  # outputs 2
        assert execution.text == "2"


def test_the_profile_in_metadata_holds_for_commands_and_cells(e2b_tenant: str) -> None:
    sbx = Sandbox.create(metadata={"execbox.profile": "minimal"})
    try:
        with pytest.raises(CommandExitException) as info:
            sbx.commands.run("echo hi")
        assert info.value.exit_code == -1
        refusal = info.value.error or ""
        assert "'subprocess' is denied by profile 'minimal'" in refusal
        refused = sbx.run_code("import subprocess")
        assert refused.error is not None and "subprocess" in refused.error.value
        slow = sbx.run_code("import time\ntime.sleep(30)")
        assert slow.error is not None and "timeout_s" in slow.error.value
    finally:
        sbx.kill()


SANDBOX_CALLS = [
    ("GET", "/health", None),
    ("GET", "/files?path=a.txt", None),
    ("POST", "/files?path=a.txt", b"x"),
    ("POST", "/execute", b'{"code": "1"}'),
    ("GET", "/contexts", None),
    ("POST", "/contexts", b"{}"),
    ("DELETE", "/contexts/default", None),
    ("POST", "/filesystem.Filesystem/Stat", b'{"path": "a.txt"}'),
    ("POST", "/filesystem.Filesystem/Remove", b'{"path": "a.txt"}'),
    ("POST", "/process.Process/Start", b"\x00\x00\x00\x00\x02{}"),
    ("POST", "/process.Process/List", b"{}"),
]


@pytest.mark.parametrize(("method", "path", "body"), SANDBOX_CALLS)
def test_every_sandbox_call_needs_that_sandboxs_token(
    e2b_tenant: str, e2b_server: E2BServer, method: str, path: str, body: bytes | None
) -> None:
    mine, theirs = Sandbox.create(), Sandbox.create()
    try:
        mine.files.write("a.txt", "kept")
        assert mine.get_info().sandbox_id == mine.sandbox_id
        headers = {"E2b-Sandbox-Id": mine.sandbox_id, "Content-Type": "application/json"}
        other_token = theirs._envd_access_token
        with httpx.Client(base_url=e2b_server.url + "/e2b", headers=headers) as raw:
            for token in (None, "", "x" * 43, other_token):
                extra = {"X-Access-Token": token} if token is not None else {}
                answer = raw.request(method, path, content=body, headers=extra)
                assert answer.status_code == 401, (token, answer.text)
                assert answer.json()["code"] == 401
            traffic = {"E2B-Traffic-Access-Token": other_token or ""}
            assert raw.request(method, path, content=body, headers=traffic).status_code == 401
        assert mine.files.read("a.txt") == "kept"
        assert mine.run_code("1 + 1").text == "2"
    finally:
        mine.kill()
        theirs.kill()


def test_output_is_redacted_on_every_face(e2b_tenant: str) -> None:
    sbx = Sandbox.create()
    try:
        streamed: list[str] = []
        code = f"key = {AWS_KEY!r}\nprint(key)\nkey"
        shown = sbx.run_code(code, on_stdout=lambda m: streamed.append(m.line))
        assert AWS_KEY not in "".join(streamed) + "".join(shown.logs.stdout)
        assert streamed and AWS_KEY not in (shown.text or "") and shown.text
        failed = sbx.run_code(f"raise ValueError({AWS_KEY!r})")
        assert failed.error is not None and AWS_KEY not in failed.error.value
        assert AWS_KEY not in failed.error.traceback
        out: list[str] = []
        done = sbx.commands.run(f"echo {AWS_KEY}; echo {AWS_KEY} >&2", on_stdout=out.append)
        assert done.stdout.strip() and AWS_KEY not in done.stdout + done.stderr + "".join(out)
    finally:
        sbx.kill()


def test_a_sandbox_ends_at_its_timeout(e2b_tenant: str) -> None:
    sbx = Sandbox.create(timeout=2)
    assert sbx.run_code("1").error is None
    deadline = time.monotonic() + 15
    while sbx.is_running() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not sbx.is_running()
    assert Sandbox.list().next_items() == []


def test_paths_and_sizes_are_held_to_the_workspace(e2b_tenant: str) -> None:
    sbx = Sandbox.create()
    try:
        for outside in ("/home/user/../../etc/passwd", "/tmp/x", "../x", "a/../../x"):
            with pytest.raises(SandboxException):
                sbx.files.write(outside, "x")
            with pytest.raises(SandboxException):
                sbx.files.read(outside)
        with pytest.raises(SandboxException, match="outside the sandbox's workspace"):
            sbx.commands.run("pwd", cwd="/etc")
        with pytest.raises(SandboxException):
            sbx.files.write("big.bin", b"x" * (MAX_REQUEST_BYTES + 1))
        assert not sbx.files.exists("big.bin")
        assert sbx.run_code("import os\nsorted(os.listdir('.'))").text == "[]"
    finally:
        sbx.kill()


def test_base_sdk_getting_started_runs_unchanged(e2b_tenant: str) -> None:
    # The `e2b` package's README example, as published.
    from e2b import Sandbox as BaseSandbox

    sandbox = BaseSandbox.create()
    try:
        result = sandbox.commands.run('echo "Hello from E2B Sandbox!"')
        print(result.stdout)
        assert result.stdout == "Hello from E2B Sandbox!\n"
        sandbox.files.write_files(
            [{"path": "one.txt", "data": "1"}, {"path": "/home/user/dir/two.txt", "data": "2"}]
        )
        assert sandbox.commands.run("cat one.txt dir/two.txt").stdout == "12"
    finally:
        sandbox.kill()


def test_cell_and_command_time_limits_come_from_metadata_and_the_sdk(e2b_tenant: str) -> None:
    sbx = Sandbox.create(metadata={"execbox.timeout_s": "1"})
    try:
        slow = sbx.run_code("import time\ntime.sleep(3)")
        assert slow.error is not None and "timeout_s" in slow.error.value
        # The SDK's command timeout sets the command's wall time (here longer than the cell's).
        assert sbx.commands.run("sleep 1.5; echo done", timeout=10).stdout == "done\n"
        # Past it the SDK gives up first, as against E2B; the cell ends at the same time.
        with pytest.raises(TimeoutException):
            sbx.commands.run("sleep 5", timeout=2)
        assert sbx.run_code("1 + 1").text == "2"
    finally:
        sbx.kill()
    with pytest.raises(SandboxException, match="execbox.timeout_s"):
        Sandbox.create(metadata={"execbox.timeout_s": "soon"})


def test_the_servers_result_budget_holds_on_the_e2b_face(
    executor: execbox.Executor,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A cell and a file read hold their result in memory: each books the most it may hold
    # first, as on execbox's own API; a budget smaller than that refuses them.
    del executor
    budget = {"max_result_bytes": 4 << 20, "tenant_result_bytes": 2 << 20}
    with e2b_serving(tmp_path_factory, **budget) as (url, state):
        e2b_server = E2BServer(url, state)
        use_sdk(monkeypatch, url, e2b_server.key()[1])
        sbx = Sandbox.create()
        try:
            with pytest.raises(SandboxException, match="result"):
                sbx.run_code("1")
            with pytest.raises(SandboxException, match="result"):
                sbx.files.read("a.txt")
        finally:
            sbx.kill()
