"""Load on the HTTP API: N requests from C concurrent clients against a real `execbox serve`
process, beside the same workload run in-process on an Executor (measured in the same run).
Checks zero errors and zero lost records (every run is in the server's record store and
booked to the tenant). Records are counted only after the server has committed them: a read
of a run through the API waits for the records queued before it (the store's writer commits
in batches), and the count is taken again once the server has stopped.

Then the server's memory under large results: K concurrent `extended` runs each writing
--artifact-mib MiB as three files, their artifacts downloaded (streamed, discarded); the rise
of the server process's peak RSS (VmHWM, reset before) over its RSS before them.
Prints p50/p99, requests/s and the RSS figures; writes bench/results/load.json.

    .venv/bin/python bench/load.py [--requests 2000] [--clients 16] [--artifact-mib 300]
                                   [--artifact-clients 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import httpx
from latency import save_results, stats
from serving import served

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
    return {
        **stats(latencies),
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "requests_per_s": round(total / elapsed, 1),
        "errors": len(failures),
        "first_errors": failures[:5],
    }


def in_process(total: int, clients: int, db: str) -> dict[str, object]:
    with execbox.Executor(records=db, cache=False) as ex:
        ex._host.wait_heavy()  # it starts in the background: not in what is measured
        for i in range(20):  # warm up: pool staged, code paths hot
            ex.run(CODE.format(i=i))
        before = ex.store.count()
        figures = drive(total, clients, lambda _w, i: ex.run(CODE.format(i=i)).status.value)
        figures["records_lost"] = total - (ex.store.count() - before)
    return figures


ARTIFACTS = """
import os
chunk = os.urandom(1 << 20)
for n in range(3):
    with open(f"part{{n}}.bin", "wb") as fh:
        for _ in range({mib_each}):
            fh.write(chunk)
print("written")
"""


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024
    return fields


def artifact_memory(url: str, key: str, pid: int, mib: int, clients: int) -> dict[str, object]:
    """Peak RSS of the server while `clients` runs each write `mib` MiB of artifacts (three
    files) and their artifacts are downloaded."""
    mib_each = max(1, mib // 3)
    body = {
        "code": ARTIFACTS.format(mib_each=mib_each),
        "profile": "extended",
        "cache": False,
        "limits": {
            "artifact_bytes": (3 * mib_each + 8) << 20,
            "disk_mib": 3 * mib_each + 64,
            "timeout_s": 300,
        },
    }
    headers = {"Authorization": f"Bearer {key}"}
    downloaded: list[int] = []
    errors: list[str] = []

    def one() -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=600) as client:
            response = client.post("/v1/runs", json=body)
            if response.status_code != 200 or response.json()["status"] != "ok":
                errors.append(f"{response.status_code}: {response.text[:200]}")
                return
            result = response.json()
            for art in result["artifacts"]:
                got = 0
                with client.stream(
                    "GET", f"/v1/runs/{result['run_id']}/artifacts/{art['path']}"
                ) as download:
                    for chunk in download.iter_bytes():
                        got += len(chunk)
                downloaded.append(got if got == art["size"] else -1)

    before = _status(pid)["VmRSS"]
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS
    threads = [threading.Thread(target=one) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    peak = _status(pid)["VmHWM"]
    return {
        "artifact_runs": clients,
        "artifact_mib_per_run": 3 * mib_each,
        "rss_before_mib": round(before / 2**20, 1),
        "peak_rss_mib": round(peak / 2**20, 1),
        "peak_rss_rise_mib": round((peak - before) / 2**20, 1),
        "artifacts_downloaded_whole": sum(1 for n in downloaded if n > 0),
        "artifacts_listed": len(downloaded),
        "errors": errors[:3],
    }


def _flush(url: str, key: str, run_id: str) -> None:
    """Wait until the server has committed every record queued so far: reading a run through
    the API settles the store's queue first."""
    response = httpx.get(f"{url}/v1/runs/{run_id}", headers={"Authorization": f"Bearer {key}"})
    response.raise_for_status()


def over_http(
    total: int, clients: int, db: str, artifact_mib: int, artifact_clients: int
) -> dict[str, object]:
    key = KeyStore(RunStore(db).engine).create(
        "load", max_concurrent=clients * 2, max_sessions=1, rpm=10 * total
    )
    with served(db, "--log-level", "warning", start_s=60) as (url, server):
        remotes = [execbox.Client(url, key) for _ in range(clients)]
        last = ""
        for i in range(20):
            last = remotes[0].run(CODE.format(i=i), cache=False).run_id
        _flush(url, key, last)
        store = RunStore(db)
        before = store.count()
        keys = KeyStore(store.engine)
        booked_before = keys.count_runs("load")
        run_ids: list[str] = []

        def one(w: int, i: int) -> str:
            result = remotes[w].run(CODE.format(i=i), cache=False)
            run_ids.append(result.run_id)
            return result.status.value

        figures = drive(total, clients, one)
        _flush(url, key, run_ids[-1])
        figures["records_lost"] = total - (store.count() - before)
        figures["tenant_runs_lost"] = total - (keys.count_runs("load") - booked_before)
        for remote in remotes:
            remote.close()
        extra = 0  # runs after the load's: the memory part's
        if artifact_mib:
            figures["memory"] = artifact_memory(
                url, key, server.pid, artifact_mib, artifact_clients
            )
            extra = artifact_clients
    # Once more with the server gone (its store closed: every queued record committed).
    figures["records_lost_after_stop"] = total + extra - (store.count() - before)
    store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--artifact-mib",
        type=int,
        default=300,
        help="Artifact bytes of each run of the memory part (0: skip it).",
    )
    parser.add_argument("--artifact-clients", type=int, default=1, help="Such runs at once.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        local = in_process(args.requests, args.clients, f"sqlite:///{tmp}/local.db")
        remote = over_http(
            args.requests,
            args.clients,
            f"sqlite:///{tmp}/server.db",
            args.artifact_mib,
            args.artifact_clients,
        )
    result = {
        "requests": args.requests,
        "clients": args.clients,
        "cpus": os.cpu_count(),
        "in_process": local,
        "http": remote,
        "ratio_http_over_in_process_p50": round(
            float(remote["p50_ms"])  # type: ignore[arg-type]
            / float(local["p50_ms"]),
            2,
        ),  # type: ignore[arg-type]
        "ratio_http_over_in_process_rps": round(
            float(remote["requests_per_s"])  # type: ignore[arg-type]
            / float(local["requests_per_s"]),
            2,
        ),
    }  # type: ignore[arg-type]
    print(
        f"{args.requests} requests (print), {args.clients} concurrent clients, "
        f"{os.cpu_count()} CPUs, every run recorded, cache off"
    )
    print(f"{'':<12}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}{'errors':>8}{'lost':>6}")
    for name, fig in (("in-process", local), ("HTTP", remote)):
        print(
            f"{name:<12}{fig['p50_ms']:>10}{fig['p99_ms']:>10}{fig['requests_per_s']:>10}"
            f"{fig['errors']:>8}{fig['records_lost']:>6}"
        )
    print(
        f"HTTP / in-process: p50 x{result['ratio_http_over_in_process_p50']}, "
        f"throughput x{result['ratio_http_over_in_process_rps']}; HTTP records lost counted "
        f"again after the server stopped: {remote['records_lost_after_stop']}"
    )
    memory = remote.get("memory")
    if isinstance(memory, dict):
        print(
            f"server memory, {memory['artifact_runs']} extended run(s) x "
            f"{memory['artifact_mib_per_run']} MiB of artifacts (3 files), downloaded: "
            f"RSS {memory['rss_before_mib']} MiB -> peak {memory['peak_rss_mib']} MiB "
            f"(+{memory['peak_rss_rise_mib']} MiB); {memory['artifacts_downloaded_whole']} of "
            f"{memory['artifacts_listed']} artifacts downloaded whole"
        )
        if memory["errors"]:
            print(f"memory part: FAILURES {memory['errors']}", file=sys.stderr)
    for name, fig in (("in-process", local), ("HTTP", remote)):
        if (
            fig["errors"]
            or fig["records_lost"]
            or fig.get("tenant_runs_lost")
            or fig.get("records_lost_after_stop")
        ):
            print(f"{name}: FAILURES {fig['first_errors']}", file=sys.stderr)
    save_results("load", result)


if __name__ == "__main__":
    main()
