"""The run store on a real SQLite file: durable, concurrent, deduplicated."""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa

from execbox.contract import Artifact, InputFile, RunRequest, RunResult, Status
from execbox.records import PolicyInfo, RunStore


def _run(i: int, art: bytes = b"") -> tuple[RunRequest, RunResult]:
    req = RunRequest(code=f"print({i})", stdin=b"in", files=[InputFile(name="a.csv", data=b"x,y\n")])
    arts = [Artifact(path="out.bin", size=len(art), sha256=f"{i:064x}", mime_type="x/y", data=art)]
    res = RunResult(run_id=f"run{i:05d}", status=Status.ok, stdout=f"{i}\n", code_sha256="c" * 64,
                    image_digest="sha256:img", artifacts=arts if art else [])
    return req, res


def test_record_survives_a_restart_of_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    req, res = _run(1)
    store = RunStore(url)
    store.save(req, res, policy=PolicyInfo(), env={"A": "1"})
    store.close()
    again = RunStore(url).get("run00001")
    assert again is not None
    assert again.result == res and again.code == "print(1)" and again.env == {"A": "1"}
    assert again.inputs == [{"name": "a.csv", "size": 4, "sha256": again.inputs[0]["sha256"]}]
    assert RunStore(url).request_of(again).files[0].data == b"x,y\n"


def test_sqlite_store_uses_wal(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_eight_threads_of_a_hundred_writers_lose_no_record(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(100):
                req, res = _run(t * 1000 + i, art=b"same bytes in every run")
                store.save(req, res, policy=PolicyInfo(), env={})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert store.count() == 800
    with store.engine.connect() as conn:
        # inputs, stdin and the shared artifact bytes are stored once, however often they recur
        assert conn.execute(sa.text("select count(*) from blobs")).scalar() == 3


def test_artifact_bytes_beyond_the_cap_are_not_stored(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db", artifact_bytes_cap=10)
    req, res = _run(7, art=b"more than ten bytes")
    store.save(req, res, policy=PolicyInfo(), env={})
    assert store.artifact_data("run00007", "out.bin") is None
    assert store.get("run00007") is not None


def test_approval_releases_a_held_run_only_once(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    req, res = _run(3)
    store.save(req, res.model_copy(update={"status": Status.needs_approval}),
               policy=PolicyInfo(decision="needs_approval", rule="call.approval"), env={})
    assert store.mark_approved("run00003", "alice") is True
    assert store.mark_approved("run00003", "bob") is False
    rec = store.get("run00003")
    assert rec is not None and rec.approved_by == "alice"


def test_expired_cache_entries_are_not_returned(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    req, res = _run(5)
    store.save(req, res, policy=PolicyInfo(), env={})
    store.cache_store("k" * 64, "run00005", ttl_s=-1)
    assert store.cache_lookup("k" * 64) is None
    store.cache_store("k" * 64, "run00005", ttl_s=60)
    hit = store.cache_lookup("k" * 64)
    assert hit is not None and hit.run_id == "run00005"
    assert store.cache_purge_expired() == 0
