"""API smoke tests against a running execbox server container, from the host over loopback:
health, auth refused without a key, a run, an error, limits. Used by tests/image/run
(`make test-image`); exits non-zero on the first failure.

    python tests/image/smoke.py http://127.0.0.1:PORT KEY [--rootless]

--rootless: the server runs as an ordinary user with no delegated cgroup, memory and pids
accepted unenforced: a run past its memory limit is not stopped, and its result says so.
"""

from __future__ import annotations

import sys
import time

import httpx


def check(what: str, ok: bool, detail: object) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}")
    if not ok:
        sys.exit(1)


def main(url: str, key: str, rootless: bool = False) -> None:
    http = httpx.Client(base_url=url, timeout=60)
    response = http.get("/healthz")
    check("healthz", response.status_code == 200, response.status_code)
    response = http.get("/readyz")
    check("readyz", response.status_code == 200, response.text)

    body = {"code": "print(1)"}
    response = http.post("/v1/runs", json=body)
    check("no key refused", response.status_code == 401, response.text)
    response = http.post("/v1/runs", json=body, headers={"Authorization": "Bearer not-a-key"})
    check("wrong key refused", response.status_code == 401, response.text)

    auth = {"Authorization": f"Bearer {key}"}

    def run(code: str, **extra: object) -> dict[str, object]:
        started = time.perf_counter()
        response = http.post("/v1/runs", json={"code": code, **extra}, headers=auth)
        if response.status_code != 200:
            check("run answered", False, response.text)
        result: dict[str, object] = response.json()
        result["_ms"] = round((time.perf_counter() - started) * 1000, 1)
        return result

    r = run("import numpy, os; print(numpy.arange(4).sum(), os.getuid() != 0)")
    check("a run", r["status"] == "ok" and r["stdout"] == "6 True\n", r)
    r = run("raise ValueError('boom')")
    check(
        "an error",
        r["status"] == "error" and r["exit_code"] == 1 and "ValueError: boom" in str(r["stderr"]),
        r["status"],
    )
    r = run("while True: pass", limits={"timeout_s": 1})
    check("a time limit", r["status"] == "timeout", r["status"])
    r = run("x = bytearray(300 << 20); print(len(x))", limits={"memory_mib": 128})
    if rootless:
        check(
            "memory and pids reported unenforced",
            r["status"] == "ok" and r["unenforced_limits"] == ["memory_mib", "pids"],
            r,
        )
        r = run("import os; print(os.getuid(), open('/proc/self/uid_map').read().split())")
        check("a run in a user namespace", r["status"] == "ok", r)
        print(f"rootless run: uid and uid_map {str(r['stdout']).strip()}")
    else:
        check("a memory limit", r["status"] == "memory_limit", r["status"])
        check("limits held", r["unenforced_limits"] == [], r["unenforced_limits"])
    print(f"run latency (print) {run('print(1)')['_ms']} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], rootless="--rootless" in sys.argv[3:])
