"""End-to-end helpers: waiting with a deadline, loading a table, a concurrent writer."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from service.db import Database
from service.settings import Settings
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.auth import http_client
from tests.kit.live import live_server


def wait_for(cond, timeout: float = 120.0, what: str = "condition") -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached before the deadline"
        time.sleep(0.05)


class Writer:
    """Inserts, updates and deletes random keys until stopped."""

    def __init__(self, http: httpx.Client, table: str, keys: int, seed: int) -> None:
        self.http, self.table, self.rng = http, table, random.Random(seed)
        self.live = set(range(keys))
        self.next_key = keys
        self.stop = threading.Event()
        self.running = threading.Event()  # cleared: hold the writes (see ``paused``)
        self.running.set()
        self._in_flight = threading.Lock()
        self.batches = 0
        self.epochs: list[int] = []  # the epoch of every batch, as DML answered
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> Writer:
        """Writes until the block ends (however it ends)."""
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No write is in flight or starts inside the block (e.g. while the control plane
        restarts)."""
        self.running.clear()
        with self._in_flight:
            pass
        try:
            yield
        finally:
            self.running.set()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.running.wait(timeout=0.1):
                continue
            with self._in_flight:
                if self.running.is_set():
                    self._write_batch()

    def _write_batch(self) -> None:
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
                k = self.rng.choice(sorted(self.live - touched)) if self.live - touched else None
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
        self.epochs.append(int(r.json()["epoch"]))
        self.batches += 1


def load(http: httpx.Client, n: int, *, committed: bool = True) -> None:
    """Create ``orders`` with ``n`` rows, committed when it returns unless ``committed`` is
    false: a snapshot job created next reads them all at its snapshot epoch (the last
    committed one; rows not committed yet would reach it only through phase 2's replay)."""
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
        params = {"wait": "true"} if committed and lo + 5000 >= n else {}
        r = http.post("/v1/tables/orders/dml", params=params, json={"ops": ops})
        assert r.status_code == 200, r.text


@contextmanager
def running_cluster(
    db: Database, url: str, worker_settings: WorkerSettings, name: str = "e2e", **server: Any
) -> Iterator[tuple[httpx.Client, Worker]]:
    """A live control plane (50 ms barriers, no spawned worker; ``server`` overrides its
    settings) and one in-process worker."""
    defaults: dict[str, Any] = {"barrier_interval_ms": 50, "spawn_embedded_worker": False}
    settings = Settings(database_url=url, **(defaults | server))
    with live_server(settings, db) as base:
        worker = Worker(base, name, settings=worker_settings)
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        with http_client(base, timeout=60) as http:
            yield http, worker
        worker.stop_event.set()
        t.join(timeout=30)


def create_job(http: httpx.Client, name: str, kind: str = "arrangement", **extra: Any) -> int:
    body = {
        "name": name,
        "upstream": {"table": "orders"},
        "backfill": kind,
        "parallelism": 2,
    } | extra
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def wait_created(http: httpx.Client, job: int, timeout: float = 120.0) -> None:
    try:
        wait_for(
            lambda: http.get(f"/v1/jobs/{job}").json()["state"] == "created",
            timeout,
            what="job created",
        )
    except AssertionError as e:  # say where it stood
        progress = http.get(f"/v1/jobs/{job}/progress").json()
        raise AssertionError(f"{e}; job {http.get(f'/v1/jobs/{job}').json()}; {progress}") from None


def assert_exact(http: httpx.Client, job: int, times: int = 2, timeout: float = 60.0) -> None:
    """The view is exact at ``times`` distinct committed epochs (each one verified)."""
    seen: set[int] = set()

    def verified_at_enough_epochs() -> bool:
        v = http.get(f"/v1/jobs/{job}/verify").json()
        assert v["equal"], v
        seen.add(int(v["epoch"]))
        return len(seen) >= times

    wait_for(verified_at_enough_epochs, timeout, f"the view verified at {times} committed epochs")
