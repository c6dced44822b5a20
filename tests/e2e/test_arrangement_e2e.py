"""End to end: a real control plane, a real worker, a concurrent writer, exact MVs."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.db import Database
from service.settings import Settings
from spark_workers.runtime import Worker
from tests.kit.live import live_server


def _wait(cond, timeout: float = 120.0, what: str = "condition") -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached before the deadline"
        time.sleep(0.05)


@pytest.fixture
def cluster(db: Database, fresh_db_url: str) -> Iterator[tuple[httpx.Client, Worker]]:
    settings = Settings(
        database_url=fresh_db_url, barrier_interval_ms=50, spawn_embedded_worker=False
    )
    with live_server(settings, db) as url:
        worker = Worker(url, "e2e")
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        with httpx.Client(base_url=url, timeout=60) as http:
            yield http, worker
        worker.stop_event.set()
        t.join(timeout=30)


class Writer:
    """Inserts, updates and deletes random keys until stopped."""

    def __init__(self, http: httpx.Client, table: str, keys: int, seed: int) -> None:
        self.http, self.table, self.rng = http, table, random.Random(seed)
        self.live = set(range(keys))
        self.next_key = keys
        self.stop = threading.Event()
        self.batches = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            ops: list[dict[str, Any]] = []
            touched: set[int] = set()
            for _ in range(20):
                roll = self.rng.random()
                if roll < 0.4 or not self.live:
                    k = self.next_key
                    self.next_key += 1
                    ops.append(
                        {
                            "op": "insert",
                            "row": {"id": k, "amount": self.rng.randrange(100), "note": "new"},
                        }
                    )
                    self.live.add(k)
                else:
                    k = (
                        self.rng.choice(sorted(self.live - touched))
                        if self.live - touched
                        else None
                    )
                    if k is None:
                        continue
                    if roll < 0.75:
                        ops.append(
                            {"op": "update", "row": {"id": k, "amount": self.rng.randrange(100)}}
                        )
                    else:
                        ops.append({"op": "delete", "row": {"id": k}})
                        self.live.discard(k)
                touched.add(k)
            r = self.http.post(f"/v1/tables/{self.table}/dml", json={"ops": ops})
            assert r.status_code == 200, r.text
            self.batches += 1


def load(http: httpx.Client, n: int) -> None:
    r = http.post(
        "/v1/tables",
        json={
            "name": "orders",
            "columns": [
                {"name": "id", "type": "bigint"},
                {"name": "amount", "type": "int"},
                {"name": "note", "type": "text"},
            ],
            "primary_key": ["id"],
        },
    )
    assert r.status_code == 201, r.text
    for lo in range(0, n, 5000):
        ops = [
            {"op": "insert", "row": {"id": i, "amount": i % 100, "note": f"n{i}"}}
            for i in range(lo, min(n, lo + 5000))
        ]
        assert http.post("/v1/tables/orders/dml", json={"ops": ops}).status_code == 200


def test_arrangement_backfill_is_exact_under_concurrent_writes(
    cluster: tuple[httpx.Client, Worker],
) -> None:
    http, _ = cluster
    load(http, 200_000)
    writer = Writer(http, "orders", 200_000, seed=1)
    writer.thread.start()
    body = {
        "name": "big_orders",
        "upstream": {"table": "orders"},
        "columns": ["id", "amount"],
        "filter": {"col": "amount", "op": ">=", "value": 50},
        "backfill": "arrangement",
        "parallelism": 3,
    }
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    _wait(lambda: http.get(f"/v1/jobs/{job}").json()["state"] == "created", what="job created")
    checked = set()
    while len(checked) < 3:
        v = http.get(f"/v1/jobs/{job}/verify").json()
        assert v["equal"], v
        checked.add(v["epoch"])
        time.sleep(0.2)
    writer.stop.set()
    writer.thread.join(timeout=30)
    assert writer.batches > 5
    v = http.get(f"/v1/jobs/{job}/verify").json()
    assert v["equal"] and v["mv_rows"] == v["expected_rows"] > 50_000
    progress = http.get(f"/v1/jobs/{job}/progress").json()
    assert progress["phase"] == "done" and progress["percent"] == 100


def _job(http: httpx.Client, name: str, **extra: Any) -> int:
    body = {
        "name": name,
        "upstream": {"table": "orders"},
        "backfill": "arrangement",
        "parallelism": 2,
    } | extra
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def _created(http: httpx.Client, job: int) -> None:
    _wait(lambda: http.get(f"/v1/jobs/{job}").json()["state"] == "created", what="job created")


def _exact(http: httpx.Client, job: int, times: int = 2) -> None:
    seen: set[int] = set()
    while len(seen) < times:
        v = http.get(f"/v1/jobs/{job}/verify").json()
        assert v["equal"], v
        seen.add(v["epoch"])
        time.sleep(0.1)


def test_pause_rate_limits_and_rescale_keep_the_view_exact(
    cluster: tuple[httpx.Client, Worker],
) -> None:
    http, _ = cluster
    load(http, 10_000)
    writer = Writer(http, "orders", 10_000, seed=2)
    writer.thread.start()
    job = _job(http, "mv", rate_limit=2_000)
    _wait(lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > 0, what="some progress")
    assert http.post(f"/v1/jobs/{job}/pause").json()["paused"] is True
    time.sleep(0.5)
    paused_rows = http.get(f"/v1/jobs/{job}/progress").json()["rows"]
    time.sleep(0.5)
    assert http.get(f"/v1/jobs/{job}/progress").json()["rows"] == paused_rows  # no snapshot reads
    assert http.post(f"/v1/jobs/{job}/resume").json()["paused"] is False
    assert http.patch(f"/v1/jobs/{job}", json={"rate_limit": 0}).json()["rate_limit"] == 0
    assert (
        http.patch(f"/v1/jobs/{job}", json={"rate_limit": 3_000, "parallelism": 4}).status_code
        == 200
    )
    _wait(lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > paused_rows, what="resumed")
    assert (
        http.patch(f"/v1/jobs/{job}", json={"parallelism": 1, "rate_limit": None}).json()[
            "parallelism"
        ]
        == 1
    )
    _created(http, job)
    _exact(http, job)
    writer.stop.set()
    writer.thread.join(timeout=30)
    _exact(http, job, times=1)


def test_a_job_created_before_any_worker_exists(db: Database, fresh_db_url: str) -> None:
    settings = Settings(
        database_url=fresh_db_url, barrier_interval_ms=50, spawn_embedded_worker=False
    )
    with live_server(settings, db) as url, httpx.Client(base_url=url, timeout=60) as http:
        load(http, 5_000)
        writer = Writer(http, "orders", 5_000, seed=3)
        writer.thread.start()
        job = _job(http, "early")
        time.sleep(0.5)  # the main graph waits in recovery for a worker
        worker = Worker(url, "late")
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        _created(http, job)
        _exact(http, job)
        writer.stop.set()
        writer.thread.join(timeout=30)
        worker.stop_event.set()
        t.join(timeout=30)


def test_kill_9_of_the_worker_mid_backfill(db: Database, fresh_db_url: str) -> None:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    settings = Settings(
        database_url=fresh_db_url,
        barrier_interval_ms=50,
        worker_lease_ms=1_000,
        spawn_embedded_worker=False,
    )
    backfill = str(Path(sys.executable).parent / "backfill")
    with live_server(settings, db) as url, httpx.Client(base_url=url, timeout=60) as http:
        load(http, 20_000)
        writer = Writer(http, "orders", 20_000, seed=4)
        writer.thread.start()
        first = subprocess.Popen([backfill, "worker", "--control-plane", url, "--name", "victim"])
        job = _job(http, "survivor", rate_limit=5_000)
        _wait(
            lambda: http.get(f"/v1/jobs/{job}/progress").json()["rows"] > 2_000, what="mid-backfill"
        )
        before = http.get(f"/v1/jobs/{job}/progress").json()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        second = subprocess.Popen([backfill, "worker", "--control-plane", url, "--name", "heir"])
        try:
            after = http.get(f"/v1/jobs/{job}/progress").json()
            assert after["rows"] >= before["rows"]  # committed progress never goes back
            _created(http, job)
            _exact(http, job)
            metrics = http.get("/metrics").text
            assert "backfill_recoveries_total" in metrics
            view = http.get(f"/v1/jobs/{job}").json()
            assert view["recoveries"] >= 1 and view["recovering"] is False
        finally:
            writer.stop.set()
            writer.thread.join(timeout=30)
            second.terminate()
            second.wait(timeout=30)
