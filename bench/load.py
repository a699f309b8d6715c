"""Load on the HTTP API: N requests from C concurrent clients against a real `execbox serve`
process, beside the same workload run in-process on an Executor (measured in the same run).
Checks zero errors and zero lost records (every run is in the server's record store and
booked to the tenant). Prints p50/p99 and requests/s; writes bench/results/load.json.

    .venv/bin/python bench/load.py [--requests 2000] [--clients 16]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import httpx
from latency import save_results, stats

import execbox
from execbox.records import RunStore
from execbox.server.auth import KeyStore

CODE = "print({i})"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))], 3)


def drive(total: int, clients: int, one: Callable[[int, int], str]) -> dict[str, object]:
    """Call `one(worker, i)` for i in 0..total-1 from `clients` threads; `one` returns the
    run's status. Returns latency stats, throughput and failures."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    counter = iter(range(total))

    def worker(w: int) -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            t = time.perf_counter()
            try:
                status = one(w, i)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                status = f"{type(exc).__name__}: {exc}"
            ms = (time.perf_counter() - t) * 1000
            with lock:
                latencies.append(ms)
                if status != "ok":
                    failures.append(status)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {**stats(latencies), "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99), "requests_per_s": round(total / elapsed, 1),
            "errors": len(failures), "first_errors": failures[:5]}


def in_process(total: int, clients: int, db: str) -> dict[str, object]:
    with execbox.Executor(records=db, cache=False) as ex:
        ex._host.wait_heavy()  # it starts in the background: not in what is measured
        for i in range(20):  # warm up: pool staged, code paths hot
            ex.run(CODE.format(i=i))
        before = ex.store.count()
        figures = drive(total, clients, lambda _w, i: ex.run(CODE.format(i=i)).status.value)
        figures["records_lost"] = total - (ex.store.count() - before)
    return figures


def over_http(total: int, clients: int, db: str) -> dict[str, object]:
    key = KeyStore(RunStore(db).engine).create("load", max_concurrent=clients * 2,
                                               max_sessions=1, rpm=10 * total)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "execbox.cli", "serve", "--port",
                               str(port), "--db", db, "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.1)
        remotes = [execbox.Client(url, key) for _ in range(clients)]
        for i in range(20):
            remotes[0].run(CODE.format(i=i), cache=False)
        store = RunStore(db)
        before = store.count()
        keys = KeyStore(store.engine)
        booked_before = keys.count_runs("load")
        figures = drive(total, clients,
                        lambda w, i: remotes[w].run(CODE.format(i=i), cache=False).status.value)
        figures["records_lost"] = total - (store.count() - before)
        figures["tenant_runs_lost"] = total - (keys.count_runs("load") - booked_before)
        for remote in remotes:
            remote.close()
        store.close()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        local = in_process(args.requests, args.clients, f"sqlite:///{tmp}/local.db")
        remote = over_http(args.requests, args.clients, f"sqlite:///{tmp}/server.db")
    result = {"requests": args.requests, "clients": args.clients, "cpus": os.cpu_count(),
              "in_process": local, "http": remote,
              "ratio_http_over_in_process_p50": round(float(remote["p50_ms"])  # type: ignore[arg-type]
                                                      / float(local["p50_ms"]), 2),  # type: ignore[arg-type]
              "ratio_http_over_in_process_rps": round(float(remote["requests_per_s"])  # type: ignore[arg-type]
                                                      / float(local["requests_per_s"]), 2)}  # type: ignore[arg-type]
    print(f"{args.requests} requests (print), {args.clients} concurrent clients, "
          f"{os.cpu_count()} CPUs, every run recorded, cache off")
    print(f"{'':<12}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}{'errors':>8}{'lost':>6}")
    for name, fig in (("in-process", local), ("HTTP", remote)):
        print(f"{name:<12}{fig['p50_ms']:>10}{fig['p99_ms']:>10}{fig['requests_per_s']:>10}"
              f"{fig['errors']:>8}{fig['records_lost']:>6}")
    print(f"HTTP / in-process: p50 x{result['ratio_http_over_in_process_p50']}, "
          f"throughput x{result['ratio_http_over_in_process_rps']}")
    for name, fig in (("in-process", local), ("HTTP", remote)):
        if fig["errors"] or fig["records_lost"] or fig.get("tenant_runs_lost"):
            print(f"{name}: FAILURES {fig['first_errors']}", file=sys.stderr)
    save_results("load", result)


if __name__ == "__main__":
    main()
