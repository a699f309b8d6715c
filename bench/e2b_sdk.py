"""`run_code("1+1")` through the official E2B SDK against `execbox serve --e2b`, beside the
same cell in a session through execbox's own HTTP API and in-process, all in the same run
over one server. Prints medians and ratios; writes bench/results/e2b.json.

    .venv/bin/python bench/e2b_sdk.py [--cells 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

import httpx  # noqa: E402
from latency import save_results, stats  # noqa: E402

from execbox.executor import Executor  # noqa: E402
from execbox.server import Settings, create_app  # noqa: E402
from execbox.server.background import serving  # noqa: E402

CODE = "1+1"
# This file is not named e2b.py: bench/ leads sys.path, and the SDK imports `e2b`.


def timed(call: object, n: int) -> list[float]:
    assert callable(call)
    for _ in range(20):  # warm both paths the same
        call()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=200)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Executor(cache=False, records=f"sqlite:///{tmp}/runs.db") as executor,
    ):
        app = create_app(executor, Settings(e2b=True))
        with serving(app) as url:
            key = app.state.execbox.keys.create(f"bench-{uuid.uuid4().hex[:6]}", rpm=1 << 30)
            os.environ.update(E2B_API_URL=f"{url}/e2b", E2B_SANDBOX_URL=f"{url}/e2b")
            os.environ["E2B_API_KEY"] = key
            from e2b_code_interpreter import Sandbox

            results: dict[str, object] = {}
            with executor.session() as session:
                results["in_process_cell"] = stats(timed(lambda: session.run(CODE), args.cells))
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
                sid = http.post("/v1/sessions", json={}).json()["session_id"]
                cell = f"/v1/sessions/{sid}/cells"
                results["execbox_http_cell"] = stats(
                    timed(
                        lambda: http.post(cell, json={"code": CODE}).raise_for_status(), args.cells
                    )
                )
                http.delete(f"/v1/sessions/{sid}")
            sbx = Sandbox.create()
            try:
                assert sbx.run_code(CODE).text == "2"
                results["e2b_sdk_run_code"] = stats(timed(lambda: sbx.run_code(CODE), args.cells))
            finally:
                sbx.kill()
    base = results["execbox_http_cell"]["median_ms"]  # type: ignore[index]
    e2b = results["e2b_sdk_run_code"]["median_ms"]  # type: ignore[index]
    results["ratio_e2b_to_execbox_http"] = round(e2b / base, 3)
    for name, value in results.items():
        print(f"{name:28} {value}")
    save_results("e2b", results)


if __name__ == "__main__":
    main()
