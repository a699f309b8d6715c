"""Runs over HTTP: results, records, artifacts, streaming, errors as JSON, health and metrics.
What the server does is tested over the fake sandbox; what the code printed or raised, over the
real one (`real_alice`)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from execbox import RunResult
from execbox.server import Settings, create_app
from execbox.server.auth import ADMIN
from execbox.server.background import serving
from tests.server.conftest import MAX_REQUEST_BYTES, Api, own_server


@pytest.fixture(scope="module")
def api(fake_api: Api) -> Iterator[Api]:
    yield fake_api  # alice and the tests that take `api` are on the fake sandbox


def test_run_returns_the_contract_result_with_inputs_and_stdin(real_alice: httpx.Client) -> None:
    body = {
        "code": "import sys\nprint(open('data/in.txt').read(), sys.stdin.read())",
        "stdin": base64.b64encode(b"from stdin").decode(),
        "files": [{"name": "data/in.txt", "data": base64.b64encode(b"from file").decode()}],
        "limits": {"timeout_s": 5, "memory_mib": 128},
    }
    response = real_alice.post("/v1/runs", json=body)
    assert response.status_code == 200, response.text
    result = RunResult.model_validate(response.json())
    assert result.status == "ok"
    assert result.stdout == "from file from stdin\n"
    assert result.limits.memory_mib == 128


def test_code_errors_are_results_not_http_errors(real_alice: httpx.Client) -> None:
    response = real_alice.post("/v1/runs", json={"code": "x = 1\nraise ValueError('boom')"})
    assert response.status_code == 200
    result = response.json()
    assert result["status"] == "error"
    assert result["error"]["type"] == "ValueError" and result["error"]["line"] == 2


def test_record_and_artifact_bytes_come_back_for_the_owner(alice: httpx.Client) -> None:
    code = "open('out/report.csv', 'w').write('a,b\\n1,2\\n')"
    result = alice.post("/v1/runs", json={"code": code}).json()
    assert result["status"] == "ok", result
    record = alice.get(f"/v1/runs/{result['run_id']}")
    assert record.status_code == 200
    assert record.json()["code"] == code
    assert record.json()["result"]["artifacts"][0]["path"] == "out/report.csv"
    art = alice.get(f"/v1/runs/{result['run_id']}/artifacts/out/report.csv")
    assert art.status_code == 200
    assert art.content == b"a,b\n1,2\n"
    assert art.headers["content-type"].startswith("text/csv")
    missing = alice.get(f"/v1/runs/{result['run_id']}/artifacts/nope.txt")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "artifact_not_found"


def test_stream_delivers_output_events_before_the_result(real_alice: httpx.Client) -> None:
    code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')"
    events: list[tuple[str, dict[str, object], float]] = []
    with real_alice.stream("POST", "/v1/runs/stream", json={"code": code}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: ") :]), time.monotonic()))
    names = [e[0] for e in events]
    assert names[-1] == "result" and names.count("result") == 1
    assert "".join(str(e[1]["text"]) for e in events if e[0] == "stdout") == "first\nsecond\n"
    first_at = next(t for n, d, t in events if n == "stdout" and "first" in str(d["text"]))
    # 'first' was sent while the program still slept: well before the result arrived.
    assert events[-1][2] - first_at > 0.75
    assert events[-1][1]["stdout"] == "first\nsecond\n"


def test_bad_input_is_a_json_422_with_a_stable_code(alice: httpx.Client) -> None:
    for body in (
        {"code": 1},
        {"code": "x", "limits": {"timeout_s": -1}},
        {"code": "x", "surprise": True},
        {"code": "x", "stdin": "not base64!"},
        {"code": "x", "files": [{"name": "../etc/passwd", "data": ""}]},
    ):
        response = alice.post("/v1/runs", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["code"] == "invalid_request"
    broken = alice.post(
        "/v1/runs", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert broken.status_code == 422 and broken.json()["error"]["code"] == "invalid_request"


def test_unknown_routes_and_methods_answer_json(alice: httpx.Client) -> None:
    missing = alice.get("/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = alice.delete("/v1/runs")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


def test_unknown_run_is_404(alice: httpx.Client) -> None:
    response = alice.get("/v1/runs/" + "0" * 32)
    assert response.status_code == 404 and response.json()["error"]["code"] == "run_not_found"


def test_policy_denial_is_a_result_and_an_unknown_profile_a_400(alice: httpx.Client) -> None:
    denied = alice.post("/v1/runs", json={"code": "import socket", "profile": "minimal"})
    assert denied.status_code == 200
    assert denied.json()["status"] == "policy_denied"
    assert denied.json()["error"]["rule"] == "import.deny"
    unknown = alice.post("/v1/runs", json={"code": "1", "profile": "no-such-profile"})
    assert unknown.status_code == 400, unknown.text
    assert unknown.json()["error"]["code"] == "bad_request"


def test_request_over_the_size_cap_is_a_json_413(alice: httpx.Client) -> None:
    big = {"code": "x = '" + "a" * MAX_REQUEST_BYTES + "'"}
    response = alice.post("/v1/runs", json=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap is counted while reading
        for _ in range(MAX_REQUEST_BYTES // 4096 + 2):
            yield b" " * 4096

    chunked = alice.post("/v1/runs", content=chunks(), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413
    assert chunked.json()["error"]["code"] == "request_too_large"


def test_health_and_readiness(api: Api) -> None:
    with api.http(None) as anon:
        assert anon.get("/healthz").json() == {"status": "ok"}
        ready = anon.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_runs_by_status_and_latency(api: Api, alice: httpx.Client) -> None:
    with api.http(api.key("ops", role=ADMIN)[1]) as ops:
        before = ops.get("/metrics").text
        alice.post("/v1/runs", json={"code": "def broken(:"})
        alice.post("/v1/runs", json={"code": "print(1)"})
        after = ops.get("/metrics").text
    for status in ("error", "ok"):
        assert (
            _metric(after, "execbox_runs_total", kind="run", status=status)
            == _metric(before, "execbox_runs_total", kind="run", status=status) + 1
        )
    assert (
        _metric(after, "execbox_run_seconds_count", kind="run")
        == _metric(before, "execbox_run_seconds_count", kind="run") + 2
    )
    assert _metric(after, "execbox_pool_size") == api.executor.pool_size
    assert "execbox_active_sessions " in after


def test_openapi_document_describes_the_endpoints(api: Api) -> None:
    app = create_app(api.executor, Settings(docs=True))
    with serving(app) as url, httpx.Client(base_url=url) as anon:
        doc = anon.get("/openapi.json").json()
    for path in (
        "/v1/runs",
        "/v1/runs/stream",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/artifacts/{path}",
        "/v1/sessions",
        "/v1/sessions/{session_id}/cells",
        "/v1/sessions/{session_id}/files/{path}",
    ):
        assert path in doc["paths"], path
    assert "HTTPBearer" in doc["components"]["securitySchemes"]


def test_an_artifact_named_by_a_secret_downloads_by_its_redacted_path(
    real_alice: httpx.Client,
) -> None:
    secret = "hunter2-Zq9xK7Lw"
    code = f"open('key-' + {secret!r} + '.txt', 'w').write('bytes as written ' + {secret!r})"
    result = real_alice.post("/v1/runs", json={"code": code, "secrets": [secret]}).json()
    assert result["status"] == "ok", result
    assert [a["path"] for a in result["artifacts"]] == ["key-[REDACTED:secret].txt"]
    record = real_alice.get(f"/v1/runs/{result['run_id']}")
    assert secret not in record.text
    art = real_alice.get(f"/v1/runs/{result['run_id']}/artifacts/key-[REDACTED:secret].txt")
    assert art.status_code == 200 and art.content == f"bytes as written {secret}".encode()
    by_secret = real_alice.get(f"/v1/runs/{result['run_id']}/artifacts/key-{secret}.txt")
    assert by_secret.status_code == 404


def test_the_server_logs_its_effective_settings_without_option_values(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator sees every setting in force at start; the executor's options (which may
    carry secrets) appear by name only."""
    with (
        caplog.at_level("INFO", logger="execbox.server"),
        own_server(
            api.executor,
            header_timeout_s=7.5,
            executor_options={"secrets": ["hunter2-settings-log"]},
        ),
    ):
        pass
    ready = [r.getMessage() for r in caplog.records if "server ready" in r.getMessage()]
    assert ready, caplog.text
    assert "header_timeout_s=7.5" in ready[0] and "max_request_bytes=" in ready[0]
    assert "executor_options=['secrets']" in ready[0]
    assert "hunter2-settings-log" not in caplog.text
