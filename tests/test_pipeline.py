"""The pipeline on the real sandbox: policy -> budget -> cache -> sandbox -> redact -> record."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from execbox import Executor, Status, UsageError
from execbox.budget import Budget
from execbox.errors import RecordsError
from tests.probes import host_internals

AWS_KEY = "AKIA" + "Q7XZ3N5B2WJ4K6PD"  # built by concatenation: not a real key


@pytest.fixture()
def approval_profile(executor: Executor, monkeypatch: pytest.MonkeyPatch) -> str:
    data = executor.profiles["data"]
    held = data.model_copy(update={"name": "held", "calls_approval": ["shutil.rmtree"]})
    monkeypatch.setitem(executor.profiles, "held", held)
    return "held"


def test_every_outcome_is_recorded_with_its_evidence(executor: Executor) -> None:
    outcomes = {
        "ok": executor.run("print(1)", files={"in.csv": b"a\n1\n"}, stdin=b"hello"),
        "error": executor.run("1/0"),
        "timeout": executor.run("while True: pass", limits={"timeout_s": 0.5}),
        "policy_denied": executor.run("import subprocess", profile="minimal"),
        "budget_exceeded": executor.run("print(2)", budget=_spent_budget()),
    }
    for expected, result in outcomes.items():
        assert result.status.value == expected, result
        record = executor.store.get(result.run_id)
        assert record is not None, f"{expected} run was not recorded"
        assert record.status == expected
        assert record.result.run_id == result.run_id
        assert record.code_sha256 == result.code_sha256 and len(record.code_sha256) == 64
        assert executor.image is not None and record.image_digest == executor.image.digest
        assert record.limits == result.limits.model_dump()
    ok = executor.store.get(outcomes["ok"].run_id)
    assert ok is not None
    assert ok.inputs[0]["name"] == "in.csv" and ok.inputs[0]["size"] == 4
    assert ok.stdin_sha256 == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    denied = executor.store.get(outcomes["policy_denied"].run_id)
    assert denied is not None and denied.policy.decision == "deny"
    assert denied.policy.rule == outcomes["policy_denied"].error.rule  # type: ignore[union-attr]


def _spent_budget() -> Budget:
    budget = Budget(exec_s=1.0)
    budget.used_exec_s = 1.0
    return budget


def test_policy_denial_names_rule_and_line_and_never_runs(executor: Executor) -> None:
    r = executor.run("x = 1\n\nimport subprocess\nsubprocess.run(['id'])\n", profile="minimal")
    assert r.status is Status.policy_denied
    assert r.error is not None and r.error.rule and r.error.line == 3
    assert "subprocess" in r.error.message
    assert r.stdout == "" and r.metrics.wall_ms == 0


@pytest.mark.parametrize(
    "code",
    [
        "import pathlib\npathlib.os.system('touch /workspace/ran')\n",
        "import logging\nlogging.os.execv('/bin/touch', ['touch', '/workspace/ran'])\n",
        "import sys\nsys.modules['os'].system('touch /workspace/ran')\n",
    ],
)
def test_minimal_denies_the_attribute_chains_to_os_in_runs_and_cells(
    executor: Executor, code: str
) -> None:
    r = executor.run(code, profile="minimal")
    assert (r.status, r.error and r.error.line) == (Status.policy_denied, 2), r
    with executor.session(profile="minimal") as s:
        cell = s.run(code)
        assert cell.status is Status.policy_denied, cell
        assert s.files.list() == []  # the code never ran


def test_minimal_session_cells_must_be_python_and_are_checked_with_earlier_cells(
    executor: Executor,
) -> None:
    escape = "ran = !touch /workspace/ran\n"
    with executor.session(profile="minimal") as s:
        cell = s.run(escape)
        assert cell.status is Status.policy_denied and cell.error is not None, cell
        assert cell.error.rule == "code.not_python"
        assert s.run("get_ipython().system('touch /workspace/ran')").status is Status.policy_denied
        assert s.files.list() == []
        assert s.run("import os").ok
        cell = s.run("os.system('touch /workspace/ran')")  # os imported by the cell before
        assert cell.status is Status.policy_denied, cell
        assert s.files.list() == []
    with executor.session(profile="data") as s:  # control: the escape runs a shell
        assert s.run(escape).ok
        assert [a.path for a in s.files.list()] == ["ran"]


def test_held_run_is_released_once_by_approval(executor: Executor, approval_profile: str) -> None:
    held = executor.run(
        "import shutil\nshutil.rmtree('gone', ignore_errors=True)\nprint('ran')",
        profile=approval_profile,
    )
    assert held.status is Status.needs_approval
    assert held.error is not None and held.error.rule and held.error.line == 2
    assert held.stdout == ""
    released = executor.approve(held.run_id, approved_by="tester")
    assert released.status is Status.ok and released.stdout == "ran\n"
    record = executor.store.get(released.run_id)
    assert record is not None and record.kind == "approval"
    assert record.source_run_id == held.run_id
    original = executor.store.get(held.run_id)
    assert original is not None and original.approved_by == "tester"
    with pytest.raises(UsageError, match="already released"):
        executor.approve(held.run_id)
    with pytest.raises(UsageError, match="not held"):
        executor.approve(released.run_id)


def test_a_rejected_held_run_is_never_released(executor: Executor, approval_profile: str) -> None:
    held = executor.run("import shutil\nshutil.rmtree('gone')", profile=approval_profile)
    assert held.status is Status.needs_approval
    assert executor.store.mark_rejected(held.run_id, "tester")
    with pytest.raises(UsageError, match="was rejected by tester"):
        executor.approve(held.run_id)
    record = executor.store.get(held.run_id)
    assert record is not None and record.approved_at is None


def test_cache_hit_is_identical_marked_cached_recorded_and_fast(executor: Executor) -> None:
    code = (
        "import time, pandas as pd\ntime.sleep(0.3)\n"
        "pd.DataFrame({'a': [1, 2]}).to_csv('out.csv')\nprint('computed')"
    )
    first = executor.run(code, cache=True)
    t = time.perf_counter()
    second = executor.run(code, cache=True)
    hit_s = time.perf_counter() - t
    assert first.cached is False and second.cached is True
    assert second.run_id != first.run_id
    assert second.stdout == first.stdout == "computed\n"
    assert [(a.path, a.sha256, a.data) for a in second.artifacts] == [
        (a.path, a.sha256, a.data) for a in first.artifacts
    ]
    assert second.artifacts[0].data is not None
    assert hit_s < 0.3  # it did not run the 0.3 s sleep again
    record = executor.store.get(second.run_id)
    assert record is not None and record.kind == "cache_hit"
    assert record.source_run_id == first.run_id


def test_cache_misses_on_any_input_change_and_on_opt_out(executor: Executor) -> None:
    base = executor.run("import sys; print(sys.stdin.read())", stdin="a", cache=True)
    assert base.status is Status.ok
    assert (
        executor.run("import sys; print(sys.stdin.read())", stdin="b", cache=True).cached is False
    )
    assert (
        executor.run(
            "import sys; print(sys.stdin.read())", stdin="a", cache=True, limits={"timeout_s": 4}
        ).cached
        is False
    )
    assert (
        executor.run("import sys; print(sys.stdin.read())", stdin="a", cache=False).cached is False
    )
    assert executor.run("import sys; print(sys.stdin.read())", stdin="a", cache=True).cached is True


def test_cache_entries_expire(executor: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "cache_ttl_s", 0.2)
    code = f"print('ttl {time.time()}')"
    executor.run(code, cache=True)
    assert executor.run(code, cache=True).cached is True
    time.sleep(0.3)
    assert executor.run(code, cache=True).cached is False


def test_failed_runs_are_cached_but_sandbox_errors_never(executor: Executor) -> None:
    from execbox.cache import cacheable
    from execbox.contract import RunResult

    code = f"raise SystemExit(3)  # {time.time()}"
    executor.run(code, cache=True)
    assert executor.run(code, cache=True).cached is True
    for status in (
        Status.sandbox_error,
        Status.policy_denied,
        Status.needs_approval,
        Status.budget_exceeded,
    ):
        assert not cacheable(RunResult(run_id="x", status=status))


def test_secrets_are_redacted_in_output_errors_tracebacks_and_records(executor: Executor) -> None:
    code = (
        f"print('key {AWS_KEY}')\n"
        "import sys\nprint('my-registered-value', file=sys.stderr)\n"
        "token = 'ghp_' + 'a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8'\n"
        "raise ValueError('leaked ' + token)\n"
    )
    r = executor.run(code, secrets=["my-registered-value"])
    assert r.status is Status.error
    assert AWS_KEY not in r.stdout and "[REDACTED" in r.stdout
    assert "my-registered-value" not in r.stderr
    assert r.error is not None and "ghp_" not in r.error.message
    assert "ghp_a1B2" not in (r.error.traceback or "")
    executor.store.settle()  # committed just after the result returned
    with executor.store.engine.connect() as conn:
        raw = conn.execute(
            sa.text("select result from runs where run_id = :id"), {"id": r.run_id}
        ).scalar()
    stored = raw if isinstance(raw, str) else json.dumps(raw)
    for secret in (AWS_KEY, "my-registered-value", "ghp_a1B2"):
        assert secret not in stored


def test_a_run_after_a_refused_record_is_refused(
    executor: Executor,
    poisoned_records: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A record is committed just after its run's result returns; one that cannot be written
    is logged, and raised by the first run to start after the failure, before its code runs,
    and only once. The others are kept."""
    executed: list[str] = []
    execute = host_internals(executor).execute

    def counted(slot: Any, request: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        executed.append(request["code"])
        return execute(slot, request, *args, **kwargs)

    monkeypatch.setattr(host_internals(executor), "execute", counted)
    kept = executor.run("print('kept')")
    lost = executor.run("print('poisoned')")
    assert kept.ok and lost.ok and lost.stdout == "poisoned\n"  # the result still returns
    poisoned_records()
    with pytest.raises(RecordsError, match="1 run record.*the records database refused it"):
        executor.run("print('refused')")
    assert f"records: run {lost.run_id}: the records database refused it" in caplog.text
    assert executed == ["print('kept')", "print('poisoned')"]
    assert executor.run("print('after')").ok  # raised once
    assert executed[-1] == "print('after')"
    assert executor.store.get(kept.run_id) is not None
    assert executor.store.get(lost.run_id) is None


def test_replay_of_twenty_recorded_runs_reproduces_them(executor: Executor) -> None:
    ids = []
    for i in range(20):
        r = executor.run(
            f"import sys, hashlib\ndata = open('in.txt').read()\nline = sys.stdin.read()\n"
            f"open('out{i}.txt', 'w').write(data * {i + 1})\n"
            f"print({i}, hashlib.sha256((data + line).encode()).hexdigest())\n"
            + ("raise KeyError('k')\n" if i % 5 == 4 else ""),
            files={"in.txt": f"input {i}".encode()},
            stdin=f"stdin {i}",
            limits={"timeout_s": 3 + i % 3},
        )
        ids.append(r.run_id)
    for run_id in ids:
        report = executor.replay(run_id)
        assert report.matches, (run_id, report.differences)
        assert report.replay.limits == report.original.limits
        assert report.image_changed is False
        record = executor.store.get(report.replay.run_id)
        assert record is not None and record.kind == "replay" and record.source_run_id == run_id


def test_replay_flags_a_different_image_digest(executor: Executor) -> None:
    r = executor.run("print('x')")
    executor.store.settle()
    with executor.store.engine.begin() as conn:
        row = conn.execute(
            sa.text("select result from runs where run_id = :id"), {"id": r.run_id}
        ).scalar()
        assert row is not None, r.run_id
        result: dict[str, Any] = json.loads(row) if isinstance(row, str) else row
        result["image_digest"] = "sha256:" + "0" * 64
        conn.execute(
            sa.text("update runs set result = :r where run_id = :id"),
            {"r": json.dumps(result), "id": r.run_id},
        )
    report = executor.replay(r.run_id)
    assert report.matches and report.image_changed


def test_replay_of_a_denied_run_is_refused(executor: Executor) -> None:
    r = executor.run("import ctypes", profile="minimal")
    with pytest.raises(UsageError, match="never ran"):
        executor.replay(r.run_id)


@pytest.mark.serial
def test_execution_budget_clips_then_refuses(executor: Executor) -> None:
    budget = Budget(exec_s=1.0)
    first = executor.run("import time; time.sleep(0.6); print('one')", budget=budget)
    assert first.status is Status.ok
    second = executor.run("import time; time.sleep(0.6); print('two')", budget=budget)
    assert second.status is Status.budget_exceeded
    assert second.error is not None and "budget" in second.error.message
    assert second.metrics.wall_ms < 600
    third = executor.run("print('three')", budget=budget)
    assert third.status is Status.budget_exceeded and third.stdout == ""
    assert budget.used_exec_s <= 1.0 + 0.2


def test_artifact_budget_caps_what_comes_back(executor: Executor) -> None:
    budget = Budget(artifact_bytes=1500)
    one = executor.run("open('a.bin', 'wb').write(b'x' * 1000)", budget=budget)
    assert [a.size for a in one.artifacts] == [1000]
    two = executor.run("open('b.bin', 'wb').write(b'y' * 1000)", budget=budget)
    assert two.artifacts == [] and two.artifacts_truncated
    assert budget.used_artifact_bytes == 1000


def test_concurrent_runs_share_a_budget_without_overshooting(executor: Executor) -> None:
    from concurrent.futures import ThreadPoolExecutor

    budget = Budget(exec_s=1.0)
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda i: executor.run(f"import time; time.sleep(0.4); print({i})", budget=budget),
                range(6),
            )
        )
    assert sum(r.status is Status.ok for r in results) <= 2
    assert all(r.status in (Status.ok, Status.budget_exceeded) for r in results)
    assert budget.used_exec_s <= 1.0 + 0.2


def test_unknown_profile_is_a_usage_error(executor: Executor) -> None:
    with pytest.raises(UsageError, match="minimal"):
        executor.run("print(1)", profile="no-such-profile")


@pytest.mark.slow
def test_eight_threads_of_a_hundred_runs_lose_no_record(executor: Executor) -> None:
    from concurrent.futures import ThreadPoolExecutor

    before = executor.store.count()

    def worker(t: int) -> list[str]:
        return [executor.run(f"print({t}, {i})", cache=False).run_id for i in range(100)]

    with ThreadPoolExecutor(8) as pool:
        ids = [run_id for batch in pool.map(worker, range(8)) for run_id in batch]
    assert len(set(ids)) == 800
    assert executor.store.count() == before + 800
    missing = [run_id for run_id in ids if executor.store.get(run_id) is None]
    assert missing == []


# ---- redaction on every path: cache hits, escaped forms, caps, artifacts ------------------

# A value a program shows escaped: a backslash, both quotes, a space, non-ASCII letters.
ESCAPED = "k\\e\"y 'é-"


def _escaped_secret() -> str:
    return ESCAPED + os.urandom(6).hex()


SHOWS = (
    "import json\nv = {v!r}\n"
    "print(v)\nprint(repr(v))\nprint({{'k': [v]}})\nprint(json.dumps(v))\n"
    "print(json.dumps([v], ensure_ascii=False))\n"
    "from urllib.parse import quote, quote_plus\nprint(quote(v), quote_plus(v))\n"
)


def _clean(text: str, secret: str) -> bool:
    """No form of `secret` in `text`: its random tail is what every form keeps as is."""
    return secret[-12:] not in text and text.count("[REDACTED:secret]") >= 1


@pytest.mark.parametrize("first_with_secrets", [False, True])
def test_the_cache_answers_only_callers_with_the_same_secrets_in_both_orders(
    executor: Executor, first_with_secrets: bool
) -> None:
    """A result stored redacted for one set of secrets never answers another set: the
    secrets are part of the cache key. Each caller gets its own text, and a hit for the same
    set is redacted as its first run was, result and record."""
    secret = _escaped_secret()
    code = SHOWS.format(v=secret)
    sets: list[list[str]] = [[secret], []] if first_with_secrets else [[], [secret]]
    first = executor.run(code, cache=True, secrets=sets[0])
    again = executor.run(code, cache=True, secrets=sets[1])
    assert first.status is Status.ok and not first.cached and not again.cached
    with_secrets, without = (first, again) if first_with_secrets else (again, first)
    assert "[REDACTED" not in without.stdout and secret in without.stdout
    assert _clean(with_secrets.stdout, secret), with_secrets.stdout
    assert with_secrets.stdout.count("[REDACTED:secret]") == 7  # each line, both URL forms
    hit = executor.run(code, cache=True, secrets=[secret])
    assert hit.cached and hit.stdout == with_secrets.stdout
    executor.store.settle()
    for run_id in (with_secrets.run_id, hit.run_id):
        record = executor.store.get(run_id)
        assert record is not None and _clean(record.model_dump_json(), secret)


def test_secrets_registered_later_on_an_executor_are_never_answered_from_before(
    tmp_path: object,
) -> None:
    secret = _escaped_secret()
    code = SHOWS.format(v=secret)
    db = f"sqlite:///{tmp_path}/runs.db"
    with Executor(cache=True, records=db) as before:
        assert secret in before.run(code).stdout  # cached, in clear: nobody registered it
    with Executor(cache=True, records=db, secrets=[secret]) as after:
        fresh = after.run(code)
        assert not fresh.cached and _clean(fresh.stdout, secret), fresh.stdout
        hit = after.run(code)
        assert hit.cached and hit.stdout == fresh.stdout
        after.store.settle()
        record = after.store.get(hit.run_id)
        assert record is not None and record.kind == "cache_hit"
        assert _clean(record.model_dump_json(), secret)


def test_too_many_secrets_are_refused_before_anything_runs(executor: Executor) -> None:
    from execbox.contract import MAX_SECRETS, MAX_SECRETS_BYTES

    flood = [f"secret-{i:06d}-" + "x" * 20 for i in range(100_000)]
    started = time.perf_counter()
    with pytest.raises(UsageError, match=r"100000 secrets given; at most 256 .*MAX_SECRETS"):
        executor.run("print(1)", secrets=flood)
    assert time.perf_counter() - started < 2.0  # refused by counting, nothing built
    big = ["y" * (MAX_SECRETS_BYTES // 2 + 1)] * 2
    with pytest.raises(UsageError, match="MAX_SECRETS_BYTES"):
        executor.run("print(1)", secrets=big)
    with pytest.raises(UsageError, match="MAX_SECRETS"):
        executor.session(secrets=flood)
    with executor.session() as session:
        with pytest.raises(UsageError, match="MAX_SECRETS_BYTES"):
            session.run("print(1)", secrets=big)
        assert session.run("print(1)").stdout == "1\n"  # a refused call costs the session nothing
    at_cap = [f"s{i:03d}-" + "z" * 8 for i in range(MAX_SECRETS)]
    assert executor.run(f"print({at_cap[-1]!r})", secrets=at_cap).stdout == "[REDACTED:secret]\n"


def test_artifacts_are_returned_as_written_not_redacted(executor: Executor) -> None:
    """What the program writes to a file comes back byte for byte (its sha256 is the file's):
    redaction covers output and errors, and the result's schema says artifacts are not."""
    import hashlib

    from execbox.contract import RunResult

    secret = _escaped_secret()
    code = f"open('out.txt', 'w').write({secret!r})\nprint({secret!r})\n"
    result = executor.run(code, secrets=[secret])
    assert result.stdout == "[REDACTED:secret]\n"
    (art,) = result.artifacts
    assert art.data == secret.encode()
    assert art.sha256 == hashlib.sha256(secret.encode()).hexdigest()
    described = RunResult.model_json_schema()["properties"]["artifacts"]["description"]
    assert "not to artifact bytes" in described


CUT_SECRET = "hunter2-Zq9xK7LwPm4vRt8sYb2nHc6dJf3gAe"


def test_secrets_in_error_types_mime_types_and_artifact_paths_are_redacted(
    executor: Executor,
) -> None:
    secret = "hunter2-Zq9xK7Lw"
    code = (
        f"open({secret!r} + '.txt', 'w').write('kept')\n"
        f"raise type({secret!r}, (Exception,), {{}})('x')"
    )
    r = executor.run(code, secrets=[secret], cache=False)
    assert r.error is not None and r.error.type == "[REDACTED:secret]", r.error
    assert [(a.path, a.data) for a in r.artifacts] == [("[REDACTED:secret].txt", b"kept")]
    record = executor.store.get(r.run_id)
    assert record is not None and secret not in record.model_dump_json()
    # The record keeps the bytes under the path the result shows.
    assert executor.store.artifact_data(r.run_id, "[REDACTED:secret].txt") == b"kept"
    with executor.session(secrets=[secret]) as s:
        cell = s.run(
            "from IPython.display import display\n"
            f"display({{'text/x-' + {secret!r}: 'a', 'text/plain': 'b'}}, raw=True)\n"
            f"raise type({secret!r}, (Exception,), {{}})('x')"
        )
    assert secret not in cell.model_dump_json(), cell
    assert "text/x-[REDACTED:secret]" in [o.mime_type for o in cell.outputs]
    assert cell.error is not None and cell.error.type == "[REDACTED:secret]"


# A second attack read 20 to 40 of this value's 52 characters from displays that cut it short
# with marks other than an ellipsis, or with none.
PARTED = "hunter2-Zq9xK7Lw-abcdefghijklmnopqrstuvwxyz0123456789"
SHOWN_CUT = {
    "textwrap.shorten": "import textwrap\nprint(textwrap.shorten('x ' + V[:30] + ' ' + V[30:], 40,"
    " placeholder=' [...]'))",
    "spaced dots": "print(V[:40] + '. . .')",
    "[truncated]": "print(V[:40] + '[truncated]')",
    "(more)": "print(V[:40] + ' (more)')",
    "no mark": "print(V[:40])",
    "split over two lines": "print(V[:26]); print(V[26:])",
    "a forged cut mark": "print(V[:26] + '\\n...[truncated]...\\n' + V[26:])",
    "pandas column of 24": "import pandas as pd\npd.set_option('display.max_colwidth', 24)\n"
    "print(pd.DataFrame({'a': [V]}))",
    "its end": "print('...' + V[-30:])",
    "an artifact's path": "open(V[:30] + '.txt', 'w').write('x')",
}


@pytest.mark.parametrize("how", list(SHOWN_CUT))
def test_a_secret_shown_cut_short_leaves_no_long_start_or_end(executor: Executor, how: str) -> None:
    streamed: list[bytes] = []
    r = executor.run(
        f"V = {PARTED!r}\n" + SHOWN_CUT[how],
        secrets=[PARTED],
        cache=False,
        on_stdout=streamed.append,
    )
    assert r.status is Status.ok, r
    shown = r.model_dump_json() + "".join(a.path for a in r.artifacts)
    assert "[REDACTED:secret]" in shown, shown
    for piece in (PARTED[:16], PARTED[-16:]):
        assert piece not in shown, (how, r.stdout)
    assert b"".join(streamed).decode() == r.stdout


def test_artifact_paths_equal_once_redacted_stay_distinct(executor: Executor) -> None:
    one, two = "first-Zq9xK7Lw", "second-Pm4vRt8s"
    code = (
        f"open({one!r} + '.txt', 'w').write('1')\nopen({two!r} + '.txt', 'w').write('2')\n"
        "open('[REDACTED:secret].txt~2', 'w').write('3')"
    )
    r = executor.run(code, secrets=[one, two], cache=False)
    paths = {a.path: a.data for a in r.artifacts}
    assert paths == {
        "[REDACTED:secret].txt": b"1",
        "[REDACTED:secret].txt~3": b"2",
        "[REDACTED:secret].txt~2": b"3",
    }, paths
    for path, data in paths.items():
        assert executor.store.artifact_data(r.run_id, path) == data


def test_a_secret_cut_by_an_error_cap_leaves_no_piece(jailed: Executor) -> None:
    s = CUT_SECRET
    # A run's traceback keeps its last 32 KiB: the cut falls inside the secret.
    for back in (32 * 1024 - 20, 32 * 1024 - 30):
        r = jailed.run(f"raise ValueError({s!r} + 'y' * {back})", secrets=[s], cache=False)
        assert r.error is not None and r.error.traceback is not None
        assert r.error.traceback.startswith("...\n[REDACTED:secret]"), r.error.traceback[:60]
        assert s[-12:] not in r.model_dump_json()
    # A record too long for the error pipe has its message halved, inside the secret.
    for pad in (20000, 24000, 28000):
        r = jailed.run(
            f"raise ValueError('x' * {pad} + {s!r} + 'x' * {pad})", secrets=[s], cache=False
        )
        assert s[:12] not in r.model_dump_json(), pad
    # A cell's message is cut at 16 KiB.
    with jailed.session(secrets=[s]) as session:
        cell = session.run(f"raise ValueError('x' * (16 * 1024 - 20) + {s!r})")
    assert cell.error is not None
    assert cell.error.message.endswith("[REDACTED:secret] …(truncated)"), cell.error.message[-60:]
    assert s[:8] not in cell.model_dump_json()


def test_a_secret_cut_with_a_long_exception_name_leaves_no_piece(executor: Executor) -> None:
    s = CUT_SECRET
    # The sandbox keeps 200 characters of a type name: the cut falls 10 characters into s.
    code = f"raise type('E' * 190 + {s!r}, (Exception,), {{}})('x')"
    r = executor.run(code, secrets=[s], cache=False)
    assert r.error is not None
    assert r.error.type == "E" * 190 + "[REDACTED:secret] …(truncated)", r.error.type
    assert s[:10] not in r.model_dump_json()


def test_an_exception_named_past_the_error_pipe_is_reported_not_timed_out(
    executor: Executor,
) -> None:
    # A type name longer than the error record's cap was never cut: the report never fit.
    r = executor.run(
        "raise type('E' * 70000, (Exception,), {})('x')", cache=False, limits={"timeout_s": 5}
    )
    assert r.status == Status.error and r.error is not None, r
    assert r.error.type == "E" * 200 + " …(truncated)"


class _CallerGone(Exception):
    pass


def _raising(data: bytes) -> None:
    raise _CallerGone(data.decode())


@pytest.mark.parametrize("face", ["fresh", "cached", "undecodable"])
def test_a_raising_output_callback_still_records_the_run_and_settles_its_budget(
    executor: Executor, face: str
) -> None:
    """The caller's own exception reaches it, but only after the run is recorded and its
    budget settled: every run is recorded, whatever its caller did."""
    code: str | bytes = f"print('callback {face} {time.time_ns()}')"
    if face == "cached":
        executor.run(code, cache=True)  # stored: the next run of it is a hit
    if face == "undecodable":
        code = b"print('\xff')"
    budget = Budget(exec_s=60)
    before = executor.store.count()
    with pytest.raises(_CallerGone):
        executor.run(
            code, budget=budget, on_stdout=_raising, on_stderr=_raising, cache=face == "cached"
        )
    assert executor.store.count() == before + 1, "the run was not recorded"
    record = executor.store.list(limit=1)[0]
    assert record.kind == ("cache_hit" if face == "cached" else "run"), record.kind
    assert budget._reserved_s == 0.0, "the budget's reservation was not settled"
