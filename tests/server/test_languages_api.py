"""`language` over HTTP, through the real server on loopback and the real sandbox."""

from __future__ import annotations

import httpx

from execbox import RunResult


def test_javascript_and_bash_run_over_http_and_bad_language_requests_are_422(
    real_alice: httpx.Client,
) -> None:
    for language, code, out in [
        ("javascript", "console.log([1, 2].map((x) => x * 21).join(' '))", "21 42\n"),
        ("bash", 'read -r x; echo "got $x" $((6 * 7))', "got in 42\n"),
    ]:
        body = {"language": language, "code": code, "stdin": "aW4K"}  # "in\n"
        response = real_alice.post("/v1/runs", json=body)
        assert response.status_code == 200, response.text
        result = RunResult.model_validate(response.json())
        assert (result.status, result.stdout, result.exit_code) == ("ok", out, 0), language
    response = real_alice.post("/v1/runs", json={"language": "ruby", "code": "puts 1"})
    assert response.status_code == 422, response.text
    assert all(name in response.text for name in ("python", "javascript", "bash")), response.text
    # A variable the bash runner sets is the caller's mistake, said as such.
    env = {"BASH_ENV": "/workspace/x"}
    response = real_alice.post("/v1/runs", json={"language": "bash", "code": "true", "env": env})
    assert response.status_code == 422, response.text
    assert "BASH_ENV is set by execbox for bash runs" in response.text


def test_a_javascript_session_over_http(real_alice: httpx.Client) -> None:
    response = real_alice.post("/v1/sessions", json={"language": "javascript"})
    assert response.status_code == 201, response.text
    sid = response.json()["session_id"]
    try:
        url = f"/v1/sessions/{sid}/cells"
        first = real_alice.post(url, json={"code": "let x = 41"})
        assert first.status_code == 200 and first.json()["status"] == "ok", first.text
        second = real_alice.post(url, json={"code": "x + 1"}).json()
        assert second["outputs"][-1] == {"mime_type": "text/plain", "data": "42"}
    finally:
        real_alice.delete(f"/v1/sessions/{sid}")
    bad = real_alice.post("/v1/sessions", json={"language": "bash"})
    assert bad.status_code == 422, bad.text
