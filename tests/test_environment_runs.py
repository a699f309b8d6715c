"""Runs and sessions choose their environment: a small second environment built here from a
wheel made here (and IPython, which sessions run on, from where pip takes the runtime image's
packages), run in the real sandbox through every face (Python, CLI, HTTP, MCP); profiles allow
or deny it; the cache never crosses environments; hosts per environment start at their first
run and close when idle; a replay whose environment is gone says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, TextContent

import execbox
from execbox import environments
from execbox.errors import UsageError
from execbox.executor import Executor
from execbox.policy import load_profiles
from tests.probes import alive, host_stats, wait_heavy, wait_until
from tests.server.conftest import api_over
from tests.wheels import make_wheel

ENV = "runtiny"  # the environment built here; the default environment lacks its package
GONE = "runtiny-gone"  # a second name of the same tree, removed by the replay test
MISSING = "nosuchenv"  # allowed by the test profiles, never built
PROBE = (
    "try:\n    import envrunpkg\nexcept ModuleNotFoundError:\n    print('lacks')\n"
    "else:\n    print('has', envrunpkg.ANSWER)\n"
)
EXECBOX = [sys.executable, "-m", "execbox.cli"]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> environments.Environment:
    """Environment `runtiny` in the executor's home: envrunpkg from a local wheel directory
    and IPython, built once for the whole test session."""
    wheels = tmp_path_factory.mktemp("envrun-wheels")
    make_wheel(wheels, "envrunpkg", {"envrunpkg/__init__.py": "ANSWER = 42\n"})
    (wheels / "requirements.txt").write_text("envrunpkg\nipython\n")
    return environments.build(
        ENV, requirements=wheels / "requirements.txt", find_links=wheels, log=False
    )


@pytest.fixture(scope="module")
def profiles_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped profiles, with `data` allowing the environments of these tests too."""
    shipped = Path(execbox.__file__).parent / "profiles.toml"
    text = shipped.read_text()
    start = text.index("[profiles.data]\n")
    end = text.index("\n[", start)
    line = 'environments = ["ml", "js-data"]\n'
    assert text.count(line, start, end) == 1, "control: the data profile lists its environments"
    allowed = f'environments = ["ml", "js-data", "{ENV}", "{GONE}", "{MISSING}"]\n'
    text = text[:start] + text[start:end].replace(line, allowed) + text[end:]
    path = tmp_path_factory.mktemp("envrun-profiles") / "profiles.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def ex(
    executor: Executor, tiny: environments.Environment, profiles_file: Path
) -> Iterator[Executor]:
    """An executor whose `data` profile allows `runtiny` (`minimal` allows no other)."""
    with Executor(profiles=profiles_file, pool_size=1, rotate_after_s=None) as ex:
        yield ex


def test_a_run_imports_what_its_environment_has_and_the_default_lacks(
    ex: Executor, tiny: environments.Environment
) -> None:
    there = ex.run("import envrunpkg; print(envrunpkg.ANSWER)", environment=ENV, cache=False)
    assert there.status == "ok" and there.stdout == "42\n", there
    assert there.image_digest == tiny.image.digest != ex.image_digest
    here = ex.run("import envrunpkg", cache=False)
    assert here.status == "error" and here.error is not None
    assert here.error.type == "ModuleNotFoundError", here.error
    assert here.image_digest == ex.image_digest
    # Naming the default environment is the default environment.
    named = ex.run(PROBE, environment=ex.default_environment, cache=False)
    assert ex.default_environment is not None
    assert named.stdout == "lacks\n" and named.image_digest == ex.image_digest


def test_the_record_keeps_the_environment_and_its_digest(ex: Executor) -> None:
    result = ex.run(PROBE, environment=ENV, cache=False)
    record = ex.store.get(result.run_id)
    assert record is not None
    assert record.environment == ENV and record.image_digest == result.image_digest
    assert ex.store.request_of(record).environment == ENV


def test_a_session_stays_in_its_environment(ex: Executor) -> None:
    with ex.session(environment=ENV) as s:
        s.run("import envrunpkg")
        cell = s.run("print(envrunpkg.ANSWER)")
        assert cell.stdout == "42\n" and cell.image_digest == ex.environment(ENV)
    with ex.session() as s:
        cell = s.run(PROBE)
        assert cell.stdout == "lacks\n" and cell.image_digest == ex.image_digest


def test_a_session_cells_hint_names_only_the_environments_its_profile_allows(
    ex: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = ex.profiles["data"].model_copy(update={"name": "closed", "environments": []})
    monkeypatch.setitem(ex.profiles, "closed", closed)  # it allows no other environment
    with ex.session(profile="closed") as s:
        cell = s.run("import envrunpkg")
    assert cell.error is not None and cell.error.type == "ModuleNotFoundError", cell
    assert cell.error.message.startswith("No module named 'envrunpkg' (")
    assert ENV not in cell.error.message and "--environment" not in cell.error.message
    assert "no environment its profile allows has it" in cell.error.message
    with ex.session() as s:  # control: `data` allows runtiny, so its hint names it
        cell = s.run("import envrunpkg")
    assert cell.error is not None and f"(run with --environment {ENV})" in cell.error.message


def test_the_cache_never_answers_one_environment_with_anothers_result(ex: Executor) -> None:
    code = PROBE + f"print({os.urandom(4).hex()!r})\n"  # new to the cache
    default = ex.run(code, cache=True)
    other = ex.run(code, environment=ENV, cache=True)
    assert not default.cached and default.stdout.startswith("lacks")
    assert not other.cached, "the default environment's result answered a run in another"
    assert other.stdout.startswith("has 42") and other.image_digest != default.image_digest
    again = ex.run(code, environment=ENV, cache=True)
    assert again.cached and again.stdout == other.stdout, "control: the cache answers its own"


def test_a_profile_denies_an_environment_it_does_not_list(ex: Executor) -> None:
    denied = ex.run("print(1)", environment=ENV, profile="minimal")
    assert denied.status == "policy_denied" and denied.error is not None
    assert denied.error.rule == "environment.not_allowed"
    assert repr(ENV) in denied.error.message and "'data'" in denied.error.message, (
        "the message names the asked and the allowed (the default, and a profile that allows)"
    )
    assert denied.stdout == "" and denied.image_digest == ""
    # The shipped profiles: `data` allows `ml` beside the default, not this one.
    shipped = load_profiles()
    assert (
        shipped["data"].environments == ["ml", "js-data"]
        and shipped["minimal"].environments is None
    )
    with pytest.raises(UsageError, match="environment.not_allowed"):
        ex.session(environment=ENV, profile="minimal")


def test_an_unbuilt_or_misnamed_environment_is_a_usage_error_never_the_default(
    ex: Executor,
) -> None:
    with pytest.raises(UsageError, match=f"no environment named '{MISSING}'.*execbox env build"):
        ex.run("print(1)", environment=MISSING)
    with pytest.raises(UsageError, match=f"no environment named '{MISSING}'"):
        ex.session(environment=MISSING)
    for bad in ("Bad", "a b", "../x", "ml\n", "x" * 33):
        with pytest.raises(UsageError, match="environment"):
            ex.run("print(1)", environment=bad)
    assert ex.stats().sessions_open == 0


def _replace_name(name: str, target_of: str) -> None:
    """Point environment `name` at the tree of `target_of` (`<home>/envs/names/<name>` is a
    link to the tree, as `env build` makes it)."""
    names = environments.envs_dir() / "names"
    (names / name).unlink(missing_ok=True)
    (names / name).symlink_to(os.readlink(names / target_of))


def test_replaying_a_run_whose_environment_is_gone_says_which(ex: Executor) -> None:
    _replace_name(GONE, ENV)
    ran = ex.run(PROBE, environment=GONE, cache=False)
    assert ran.stdout == "has 42\n"
    again = ex.replay(ran.run_id)
    assert again.replay.stdout == "has 42\n", "control: replay runs where the run ran"
    environments.remove(GONE)
    assert environments.lookup(ENV).is_dir(), "control: the other name keeps the tree"
    with pytest.raises(UsageError) as err:
        ex.replay(ran.run_id)
    message = str(err.value)
    assert repr(GONE) in message and ran.image_digest in message and "not built" in message


def test_hosts_per_environment_start_at_the_first_run_and_close_when_idle(
    tiny: environments.Environment, profiles_file: Path
) -> None:
    with Executor(
        profiles=profiles_file,
        pool_size=1,
        environment_idle_s=1.0,
        rotate_after_s=None,
        cache=False,
    ) as idle:
        assert idle.stats().environments == {}, "an environment's host started unasked"
        default_pid = idle.stats().host.zygote_pid  # type: ignore[union-attr]
        assert idle.run(PROBE, environment=ENV).stdout == "has 42\n"
        first = idle.stats().environments[ENV]
        assert first.alive and first.zygote_pid != default_pid
        # Its heavy zygote (which ran the import) preloads what its tree has: nothing here.
        assert first.heavy_ready and first.preloaded == ()
        wait_heavy(idle)  # the default's, which starts in the background
        assert "numpy" in host_stats(idle).preloaded, "control: the default's preloads"
        assert wait_until(lambda: ENV not in idle.stats().environments, 30), "it stayed"
        assert wait_until(lambda: not alive(first.zygote_pid), 30), "its zygote still runs"
        assert idle.run(PROBE, environment=ENV).stdout == "has 42\n", "it starts again"
        second = idle.stats().environments[ENV]
        assert second.zygote_pid != first.zygote_pid
        # The default environment's host is never closed for idling.
        host = idle.stats().host
        assert host is not None and host.zygote_pid == default_pid and alive(default_pid)


def test_a_session_keeps_its_environments_host_past_the_idle_time(
    tiny: environments.Environment, profiles_file: Path
) -> None:
    with Executor(
        profiles=profiles_file, pool_size=1, environment_idle_s=1.0, rotate_after_s=None
    ) as idle:
        with idle.session(environment=ENV) as s:
            s.run("import envrunpkg")
            pid = idle.stats().environments[ENV].zygote_pid
            assert not wait_until(lambda: ENV not in idle.stats().environments, 3)
            assert s.run("print(envrunpkg.ANSWER)").stdout == "42\n"
        assert wait_until(lambda: not alive(pid), 30), "idle once the session ended"


# --- the other faces ------------------------------------------------------------------------


def _cli(*args: str, profiles: Path) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, EXECBOX_PROFILES=str(profiles))
    return subprocess.run(
        [*EXECBOX, *args], input=PROBE.encode(), capture_output=True, timeout=120, env=env
    )


def test_cli_run_chooses_the_environment(ex: Executor, profiles_file: Path) -> None:
    ran = _cli("run", "-", "--json", "--environment", ENV, profiles=profiles_file)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["stdout"] == "has 42\n" and result["image_digest"] == ex.environment(ENV)
    denied = _cli(
        "run", "-", "--json", "--environment", ENV, "--profile", "minimal", profiles=profiles_file
    )
    assert denied.returncode == 1
    result = json.loads(denied.stdout)
    assert result["status"] == "policy_denied"
    assert result["error"]["rule"] == "environment.not_allowed"
    missing = _cli("run", "-", "--environment", MISSING, profiles=profiles_file)
    assert missing.returncode == 2 and missing.stdout == b""
    assert f"no environment named '{MISSING}'".encode() in missing.stderr
    assert b"execbox env build" in missing.stderr


def test_http_runs_and_sessions_choose_the_environment(ex: Executor) -> None:
    with api_over(ex) as api:
        _, key = api.key("envrun")
        with api.http(key) as http:
            ran = http.post("/v1/runs", json={"code": PROBE, "environment": ENV})
            assert ran.status_code == 200, ran.text
            assert ran.json()["stdout"] == "has 42\n"
            denied = http.post(
                "/v1/runs", json={"code": PROBE, "environment": ENV, "profile": "minimal"}
            )
            assert denied.json()["status"] == "policy_denied"
            assert denied.json()["error"]["rule"] == "environment.not_allowed"
            missing = http.post("/v1/runs", json={"code": PROBE, "environment": MISSING})
            assert missing.status_code == 400, missing.text
            assert "execbox env build" in missing.json()["error"]["message"]
            bad = http.post("/v1/runs", json={"code": PROBE, "environment": "../x"})
            assert bad.status_code == 422, bad.text
            made = http.post("/v1/sessions", json={"environment": ENV})
            assert made.status_code == 201, made.text
            sid = made.json()["session_id"]
            cell = http.post(f"/v1/sessions/{sid}/cells", json={"code": PROBE})
            assert cell.status_code == 200, cell.text
            assert cell.json()["stdout"] == "has 42\n"
            http.delete(f"/v1/sessions/{sid}")
            refused = http.post("/v1/sessions", json={"environment": ENV, "profile": "minimal"})
            assert refused.status_code == 400 and "environment.not_allowed" in refused.text
            gone = http.post("/v1/sessions", json={"environment": MISSING})
            assert gone.status_code == 400 and "execbox env build" in gone.text


def _text(result: Any) -> str:
    assert isinstance(result, CallToolResult), result
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def test_mcp_tools_choose_the_environment(ex: Executor) -> None:
    from execbox.mcp.server import build_server

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Client(build_server(ex), read_timeout_seconds=60) as client:
            call = client.call_tool
            out["ran"] = await call("run_python", {"code": PROBE, "environment": ENV})
            out["default"] = await call("run_python", {"code": PROBE})
            out["missing"] = await call("run_python", {"code": PROBE, "environment": MISSING})
            made = await call("session_create", {"environment": ENV})
            sid = made.structured_content["session_id"]
            out["cell"] = await call("session_run", {"session_id": sid, "code": PROBE})
            await call("session_close", {"session_id": sid})
        async with Client(build_server(ex, profile="minimal"), read_timeout_seconds=60) as client:
            out["denied"] = await client.call_tool(
                "run_python", {"code": "print(1)", "environment": ENV}
            )
        async with Client(build_server(ex, environment=ENV), read_timeout_seconds=60) as client:
            out["server_default"] = await client.call_tool("run_python", {"code": PROBE})
        return out

    out = anyio.run(main)
    assert "has 42" in _text(out["ran"]) and "lacks" in _text(out["default"])
    assert out["missing"].is_error and "execbox env build" in _text(out["missing"])
    assert "has 42" in _text(out["cell"])
    assert "environment.not_allowed" in _text(out["denied"])
    assert "has 42" in _text(out["server_default"])


def test_tool_schemas_describe_the_environment_and_tool_calls_run_there(
    ex: Executor, tiny: environments.Environment
) -> None:
    from execbox import tools

    described = tools.anthropic_tool(environment=ENV)["description"]
    assert "envrunpkg 1.0" in described and "numpy" not in described
    assert "numpy" in tools.anthropic_tool()["description"], "control: the default's packages"
    with pytest.raises(UsageError, match=MISSING):
        tools.openai_tool(environment=MISSING)
    call = {"type": "tool_use", "name": "run_python", "input": {"code": PROBE}}
    assert "has 42" in tools.execute_tool_call(ex, call, environment=ENV)
    assert "lacks" in tools.execute_tool_call(ex, call)
    denied = tools.execute_tool_call(ex, call, environment=ENV, profile="minimal")
    assert "environment.not_allowed" in denied


def test_a_session_in_an_environment_without_ipython_is_refused_clearly(
    ex: Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from execbox.backend import LocalBackend

    backend = ex._backend
    assert isinstance(backend, LocalBackend)
    digest = ex.environment(ENV)
    assert "IPython" in environments.modules_of(backend.image.root), "control: the default has it"
    monkeypatch.setattr(
        environments, "modules_of", lambda tree: frozenset({"envrunpkg"})
    )  # as a tree built without ipython
    with pytest.raises(UsageError, match=f"'{ENV}' has no IPython.*ipython"):
        ex.session(environment=ENV)
    assert ex.stats().sessions_open == 0 and digest
