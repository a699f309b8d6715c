"""The OpenAI Agents SDK's sandbox client over execbox: a SandboxAgent driven by the SDK's own
offline model (`agents.testing.ScriptedModel`) runs its shell commands and file operations in
a real execbox session, in this process and through a real `execbox serve`."""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.integrations.extras import example, requires

requires("agents")

from agents import Runner, set_tracing_disabled  # noqa: E402
from agents.run import RunConfig  # noqa: E402
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig  # noqa: E402
from agents.sandbox.entries import Dir, File, LocalDir, LocalFile  # noqa: E402
from agents.sandbox.errors import (  # noqa: E402
    ConfigurationError,
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Environment  # noqa: E402
from agents.sandbox.snapshot import LocalSnapshotSpec  # noqa: E402
from agents.sandbox.types import User  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

import execbox  # noqa: E402
from execbox.integrations.openai_agents import (  # noqa: E402
    ExecboxSandboxClient,
    ExecboxSandboxClientOptions,
)

pytestmark = pytest.mark.integrations
set_tracing_disabled(True)  # nothing leaves the machine: no trace export

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def shell(*commands: str) -> ScriptedModel:
    """A model that runs each command with the shell tool, one per turn, then says done."""
    steps: list[Any] = [
        [function_call("exec_command", {"cmd": cmd}, call_id=f"call-{i}")]
        for i, cmd in enumerate(commands)
    ]
    return ScriptedModel([*steps, [assistant_message("done")]])


def tool_outputs(model: ScriptedModel) -> list[str]:
    """What the model was shown for each of its tool calls, in order."""
    last = model.calls[-1].input
    assert isinstance(last, list)
    return [
        str(item["output"])
        for item in last
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def agent_with(model: ScriptedModel, files: dict[str, bytes] | None = None) -> SandboxAgent[Any]:
    entries = {name: File(content=data) for name, data in (files or {}).items()}
    return SandboxAgent(
        name="plug", model=model, instructions="Use the shell.",
        default_manifest=Manifest(entries=entries),
    )  # fmt: skip


async def run_agent(agent: SandboxAgent[Any], backend: Any, **options: Any) -> str:
    client = ExecboxSandboxClient(backend, ExecboxSandboxClientOptions(**options))
    config = RunConfig(sandbox=SandboxRunConfig(client=client))
    result = await Runner.run(agent, "go", run_config=config)
    return str(result.final_output)


def test_a_sandbox_agent_runs_its_commands_in_one_execbox_session(backend: Any) -> None:
    model = shell(
        "cat data.txt && id -u && pwd && echo 42 > answer.txt",
        "cat answer.txt; ls no-such-file; exit 3",
    )
    agent = agent_with(model, {"data.txt": b"hello from the manifest\n"})
    assert run(run_agent(agent, backend)) == "done"
    first, second = tool_outputs(model)
    assert "hello from the manifest" in first  # the manifest's file is in the workspace
    lines = first.split("Output:\n", 1)[1].splitlines()
    assert lines[1] != "0" and lines[2] == "/workspace"  # the jail's uid, the jail's workspace
    assert "Process exited with code 0" in first
    # The second step sees the first step's file; an error comes back as the SDK shows one.
    assert "42" in second and "No such file" in second
    assert "Process exited with code 3" in second


async def environment(executor: execbox.Executor) -> bytes:
    options = ExecboxSandboxClientOptions(env={"FROM_OPTIONS": "a"})
    client = ExecboxSandboxClient(executor, options)
    manifest = Manifest(environment=Environment(value={"FROM_MANIFEST": "b"}))
    session = await client.create(manifest=manifest)
    async with session:
        printed: bytes = (await session.exec("env | grep ^FROM_ | sort")).stdout
    await client.delete(session)
    return printed


def test_commands_see_the_options_and_manifest_environment_only(
    executor: execbox.Executor,
) -> None:
    assert run(environment(executor)) == b"FROM_MANIFEST=b\nFROM_OPTIONS=a\n"


async def echoed(executor: execbox.Executor, argv: list[str]) -> bytes:
    client = ExecboxSandboxClient(executor)
    session = await client.create()
    async with session:
        printed: bytes = (await session.exec("printf", "%s|", *argv, shell=False)).stdout
    await client.delete(session)
    return printed


def test_a_commands_arguments_reach_the_jail_intact(executor: execbox.Executor) -> None:
    argv = ["it's", 'a "quote"', "back\\slash", "$(id) `id`", "naïve ✓", "new\nline"]
    assert run(echoed(executor, argv)).decode() == "".join(f"{a}|" for a in argv)


async def materialized(executor: execbox.Executor) -> bytes:
    client = ExecboxSandboxClient(executor)
    manifest = Manifest(
        entries={
            "docs": Dir(children={"a.md": File(content=b"# a")}),
            "copy": LocalDir(src=Path("project")),  # the SDK takes them from its cwd
            "one.txt": LocalFile(src=Path("project/top.txt")),
        }
    )
    session = await client.create(manifest=manifest)
    async with session:
        listing: bytes = (await session.exec("find . -type f | sort | xargs cat")).stdout
    await client.delete(session)
    return listing


def test_the_manifests_entries_from_the_host_are_copied_in(
    executor: execbox.Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "project" / "sub").mkdir(parents=True)
    (tmp_path / "project" / "top.txt").write_bytes(b"top\n")
    (tmp_path / "project" / "sub" / "deep.txt").write_bytes(b"deep\n")
    monkeypatch.chdir(tmp_path)
    # ./copy/sub/deep.txt, ./copy/top.txt, ./docs/a.md, ./one.txt
    assert run(materialized(executor)) == b"deep\ntop\n# atop\n"


def test_the_execbox_session_ends_with_the_run(executor: execbox.Executor) -> None:
    before = {s.id for s in executor.live_sessions()}
    run(run_agent(agent_with(shell("true")), executor))
    assert {s.id for s in executor.live_sessions()} == before


async def files_and_snapshot(backend: Any) -> None:
    client = ExecboxSandboxClient(backend)
    manifest = Manifest(entries={"in/data.txt": File(content=b"from the manifest")})
    session = await client.create(manifest=manifest)
    async with session:
        assert (await session.read(Path("in/data.txt"))).read() == b"from the manifest"
        blob = bytes(range(256)) * 4  # not UTF-8: files keep their bytes
        await session.write(Path("/workspace/out/blob.bin"), io.BytesIO(blob))
        assert (await session.read(Path("out/blob.bin"))).read() == blob
        listing = await session.exec("wc -c out/blob.bin")
        assert listing.stdout.decode().split()[0] == "1024"
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("missing.txt"))
        # A link is never followed, even one the code made to a file outside the workspace.
        assert (await session.exec("ln -s /etc/passwd link")).ok()
        with pytest.raises(WorkspaceArchiveReadError):
            await session.read(Path("link"))
        archive = (await session.persist_workspace()).read()
    await client.delete(session)
    fresh = await client.create(manifest=Manifest())
    async with fresh:
        await fresh.hydrate_workspace(io.BytesIO(archive))
        assert (await fresh.read(Path("out/blob.bin"))).read() == blob
        assert (await fresh.exec("cat in/data.txt")).stdout == b"from the manifest"
        leftovers = await fresh.exec("ls -a")
        assert b".execbox" not in leftovers.stdout  # the archives made on the way are gone
    await client.delete(fresh)


def test_files_and_snapshots_go_through_the_execbox_session(backend: Any) -> None:
    run(files_and_snapshot(backend))


async def timed_out(executor: execbox.Executor) -> tuple[float, bytes, bytes]:
    client = ExecboxSandboxClient(executor)
    session = await client.create()
    async with session:
        started = time.monotonic()
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 60 & sleep 60", timeout=1)
        took = time.monotonic() - started
        comms = b"for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null"
        processes = (await session.exec(comms.decode())).stdout
        again = (await session.exec("echo still here")).stdout
    await client.delete(session)
    return took, processes, again


def test_a_command_past_its_timeout_is_killed_with_its_children(
    executor: execbox.Executor,
) -> None:
    took, processes, again = run(timed_out(executor))
    assert took < 10
    assert b"sleep" not in processes
    assert again == b"still here\n"  # the session goes on


async def refusals(executor: execbox.Executor) -> list[str]:
    client = ExecboxSandboxClient(executor)
    seen: list[str] = []
    for manifest in (
        Manifest(root="/srv"),
        Manifest(users=[User(name="alice")]),
    ):
        with pytest.raises(ConfigurationError) as info:
            await client.create(manifest=manifest)
        seen.append(str(info.value))
    session = await client.create()
    async with session:
        with pytest.raises(ConfigurationError) as info:
            await session.exec("id", user="alice")
        seen.append(str(info.value))
        with pytest.raises(NotImplementedError):
            await session.pty_exec_start("bash", tty=True)
        with pytest.raises(ExposedPortUnavailableError):
            await session.resolve_exposed_port(8080)
    await client.delete(session)
    return seen


def test_what_execbox_cannot_give_fails_with_a_clear_error(executor: execbox.Executor) -> None:
    seen = run(refusals(executor))
    assert "workspace root '/srv'" in seen[0]
    assert "users and groups" in seen[1]
    assert "as user 'alice'" in seen[2]


async def under_minimal(executor: execbox.Executor) -> str:
    options = ExecboxSandboxClientOptions(profile="minimal", default_exec_timeout_s=5)
    client = ExecboxSandboxClient(executor, options)
    session = await client.create()
    with pytest.raises(ExecTransportError) as info:
        await session.start()  # its first command (the workspace's mkdir) is refused
    await client.delete(session)
    return str(info.value)


def test_a_profile_that_refuses_processes_refuses_every_command(
    executor: execbox.Executor,
) -> None:
    message = run(under_minimal(executor))
    assert "policy_denied" in message and "profile 'minimal'" in message


async def resumed(executor: execbox.Executor) -> tuple[bytes, bool]:
    client = ExecboxSandboxClient(executor)
    session = await client.create(manifest=Manifest(entries={"a.txt": File(content=b"1")}))
    await session.start()
    await session.exec("echo 2 >> a.txt")
    payload = client.serialize_session_state(session.state)
    state = client.deserialize_session_state(payload)
    again = await client.resume(state)
    await again.start()
    content = (await again.exec("cat a.txt")).stdout
    await again.aclose()
    await client.delete(again)
    return content, await again.running()


def test_resuming_a_live_session_keeps_its_workspace(executor: execbox.Executor) -> None:
    content, running = run(resumed(executor))
    assert content == b"12\n"  # the manifest was not applied again over the live workspace
    assert running is False


async def restored(executor: execbox.Executor, snapshots: Path) -> tuple[bytes, bool]:
    client = ExecboxSandboxClient(executor)
    session = await client.create(
        snapshot=LocalSnapshotSpec(base_path=snapshots),
        manifest=Manifest(entries={"a.txt": File(content=b"1")}),
    )
    await session.start()
    await session.exec("echo 2 >> a.txt")
    await session.aclose()  # the SDK's lifecycle: persist the snapshot, then shut down
    state = client.deserialize_session_state(client.serialize_session_state(session.state))
    again = await client.resume(state)
    async with again:
        content = (await again.exec("cat a.txt")).stdout
        fresh = again.state.execbox_session_id != session.state.execbox_session_id
    await client.delete(again)
    return content, fresh


def test_resuming_after_the_session_ended_restores_the_snapshot(
    executor: execbox.Executor, tmp_path: Path
) -> None:
    content, fresh = run(restored(executor, tmp_path))
    assert fresh  # a new execbox session ...
    assert content == b"12\n"  # ... filled from the snapshot, not from the manifest


def test_the_sdks_sandbox_example_runs_with_execbox_swapped_in(backend: Any) -> None:
    module = example("openai_agents_sandbox")
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "cat README.md src/app.py"}, call_id="c1")],
            [assistant_message("A tiny demo project with a greet function.")],
        ]
    )
    answer = run(module.main(model, module.QUESTION, backend))
    assert answer == "A tiny demo project with a greet function."
    (output,) = tool_outputs(model)
    assert "# Demo Project" in output and "def greet" in output


SECRET = "plugs36a-host-secret-0a1b2c3d"


@pytest.mark.hostile
def test_a_hostile_command_cannot_read_the_hosts_environment(
    jailed: execbox.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLUGS36A_SECRET", SECRET)
    assert os.environ["PLUGS36A_SECRET"] == SECRET
    model = shell(
        "env; cat /proc/1/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; "
        "grep -r plugs36a /proc/*/cmdline 2>/dev/null; echo scanned"
    )
    run(run_agent(agent_with(model), jailed))
    (output,) = tool_outputs(model)
    assert "scanned" in output and SECRET not in output


@pytest.mark.hostile
def test_a_fork_bomb_is_contained_and_reported(jailed: execbox.Executor) -> None:
    before = {s.id for s in jailed.live_sessions()}
    model = shell("bomb() { bomb | bomb & }; bomb; wait; sleep 2")
    started = time.monotonic()
    run(run_agent(agent_with(model), jailed, limits={"pids": 32}))
    (bomb,) = tool_outputs(model)
    assert time.monotonic() - started < 60
    # The step came back to the model (the pids limit makes forks fail, or the tool's timeout
    # kills the command's group), and ending the run ended the session with all it started.
    assert "Process exited with code" in bomb or "timed out" in bomb, bomb
    assert {s.id for s in jailed.live_sessions()} == before
    assert jailed.run("print(1)").stdout == "1\n"  # the host's executor is untouched
