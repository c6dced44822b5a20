"""How much a backfill holds back its upstream: the commit latency of the upstream's
barriers (inject -> commit) while a backfill of N rows (1M; 200k with ``--quick``)
runs under a steady writer, for a chain backfill next to an arrangement backfill of
the same table, in the same run (barrier interval 200 ms, one worker).

Both executors here complete a barrier only between two snapshot reads of their
worker (a Spark job or a driver chunk), so the latency follows the size of those
reads; the chain differs in what it reads (one fixed snapshot, then the replay).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import httpx
import psycopg2
from sqlalchemy import text

from bench._pg import fresh_database
from bench.bench_backfill import _load
from service.db import Database
from service.embedded_pg import to_libpq_url
from service.settings import Settings
from spark_workers.runtime import Worker
from tests.kit.live import live_server

INTERVAL_MS = 200


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _writer(http: httpx.Client, stop: threading.Event, n: int) -> None:
    k = 0
    while not stop.is_set():
        ops = [
            {"op": "update", "row": {"id": (k * 7919 + i) % n, "amount": k % 1000}}
            for i in range(20)
        ]
        k += 1
        assert http.post("/v1/tables/orders/dml", json={"ops": ops}).status_code == 200
        stop.wait(0.02)


def _latencies(db: Database, since: float, until: float) -> list[float]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT extract(epoch FROM committed_at - injected_at) FROM barriers "
                "WHERE state = 'committed' AND extract(epoch FROM injected_at) BETWEEN :a AND :b"
            ),
            {"a": since, "b": until},
        ).all()
    return [float(x) * 1000 for (x,) in rows]


def _backfill(db: Database, base: str, kind: str, n: int) -> tuple[list[float], float]:
    with httpx.Client(base_url=base, timeout=120) as http:
        stop = threading.Event()
        writer = threading.Thread(target=_writer, args=(http, stop, n), daemon=True)
        writer.start()
        try:
            t0 = time.time()
            r = http.post(
                "/v1/jobs",
                json={"name": f"mv_{kind}", "upstream": {"table": "orders"}, "backfill": kind},
            )
            assert r.status_code == 202, r.text
            job = r.json()["id"]
            deadline = time.monotonic() + 1800
            while (state := http.get(f"/v1/jobs/{job}").json()["state"]) != "created":
                assert state == "creating", f"job {state}"
                assert time.monotonic() < deadline, "the backfill did not finish"
                time.sleep(0.1)
            t1 = time.time()
        finally:
            stop.set()
            writer.join(timeout=30)
        assert http.delete(f"/v1/jobs/{job}").status_code in (200, 202, 204)
    return _latencies(db, t0, t1), t1 - t0


def run(quick: bool) -> list[dict[str, Any]]:
    n = 200_000 if quick else 1_000_000
    with fresh_database() as (url, db):
        conn = psycopg2.connect(to_libpq_url(url))
        try:
            _load(db, conn, n)
        finally:
            conn.close()
        settings = Settings(
            database_url=url, barrier_interval_ms=INTERVAL_MS, spawn_embedded_worker=False
        )
        with live_server(settings, db) as base:
            worker = Worker(base, "bench-coupling", settings=Settings())
            thread = threading.Thread(target=worker.run, daemon=True)
            thread.start()
            try:
                deadline = time.monotonic() + 120
                while worker.spark is None:
                    assert time.monotonic() < deadline, "the worker did not register"
                    time.sleep(0.05)
                worker.spark.warm_up()
                arr, t_arr = _backfill(db, base, "arrangement", n)
                chain, t_chain = _backfill(db, base, "chain", n)
            finally:
                worker.stop_event.set()
                thread.join(timeout=60)
    note = (
        f"{n:,} rows, a writer updating 20 rows every ~20 ms, barrier interval {INTERVAL_MS} ms; "
        f"backfill took {t_chain:.1f} s (chain) and {t_arr:.1f} s (arrangement); "
        f"{len(chain)} and {len(arr)} barriers"
    )
    out = []
    for label, p in (("p50", 50), ("p99", 99)):
        c, a = (
            (statistics.median(chain), statistics.median(arr))
            if p == 50
            else (
                _pct(chain, 99),
                _pct(arr, 99),
            )
        )
        out.append(
            {
                "name": f"upstream barrier latency {label}: chain vs arrangement",
                "value": round(c, 1),
                "baseline": round(a, 1),
                "ratio": round(c / a, 2),
                "target": None,
                "unit": "ms",
                "passed": None,
                "note": note,
            }
        )
    return out
