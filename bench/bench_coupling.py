"""How much a backfill holds back its upstream: the commit latency (inject -> commit) of
the upstream's (main graph's) barriers while a backfill of N rows (2M; 200k with
``--quick``) runs under a steady writer, next to the same workload without a backfill,
in the same run (barrier interval 200 ms).

The main graph always carries a standing MV (a created arrangement job, forwarding the
writer's changes) on worker A, so its barriers need a worker's collect. The backfill's
actors go to worker B (the least loaded). An arrangement or chain backfill runs *in* the
main graph, so every upstream barrier waits for worker B between two snapshot reads;
a snapshot backfill runs in a creating graph of its own and the upstream only waits
for worker A (and once, for one barrier round trip of B, at the merge).
"""

from __future__ import annotations

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
from tests.kit.auth import http_client
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
                "WHERE graph_id = 1 AND state = 'committed' "
                "AND extract(epoch FROM injected_at) BETWEEN :a AND :b"
            ),
            {"a": since, "b": until},
        ).all()
    return [float(x) * 1000 for (x,) in rows]


def _wait_state(http: httpx.Client, job: int, want: str) -> None:
    deadline = time.monotonic() + 1800
    while (state := http.get(f"/v1/jobs/{job}").json()["state"]) != want:
        assert state == "creating", f"job {state}"
        assert time.monotonic() < deadline, f"the job did not get {want}"
        time.sleep(0.1)


def _backfill(
    db: Database, base: str, kind: str, n: int, idle_s: float = 0.0
) -> tuple[list[float], float]:
    """Upstream latencies while a ``kind`` backfill runs (``none``: ``idle_s`` of writes)."""
    with http_client(base, timeout=120) as http:
        stop = threading.Event()
        writer = threading.Thread(target=_writer, args=(http, stop, n), daemon=True)
        writer.start()
        job = None
        try:
            t0 = time.time()
            if kind == "none":
                stop.wait(idle_s)
            else:
                r = http.post(
                    "/v1/jobs",
                    json={"name": f"mv_{kind}", "upstream": {"table": "orders"}, "backfill": kind},
                )
                assert r.status_code == 202, r.text
                job = r.json()["id"]
                _wait_state(http, job, "created")
            t1 = time.time()
        finally:
            stop.set()
            writer.join(timeout=30)
        if job is not None:
            assert http.delete(f"/v1/jobs/{job}").status_code in (200, 202, 204)
    return _latencies(db, t0, t1), t1 - t0


def _worker(base: str, name: str, capacity: int) -> tuple[Worker, threading.Thread]:
    worker = Worker(base, name, capacity=capacity, settings=Settings())
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while worker.spark is None:
        assert time.monotonic() < deadline, "the worker did not register"
        time.sleep(0.05)
    return worker, thread


def run(quick: bool) -> list[dict[str, Any]]:
    n = 200_000 if quick else 2_000_000
    with fresh_database() as (url, db):
        conn = psycopg2.connect(to_libpq_url(url))
        try:
            _load(db, conn, n)
        finally:
            conn.close()
        settings = Settings(
            database_url=url, barrier_interval_ms=INTERVAL_MS, spawn_embedded_worker=False
        )
        results: dict[str, tuple[list[float], float]] = {}
        with live_server(settings, db) as base:
            # A is full with the standing MV's one actor: every backfill actor goes to B
            a, ta = _worker(base, "bench-coupling-a", capacity=1)
            workers = [(a, ta)]
            try:
                with http_client(base, timeout=120) as http:
                    # the standing MV: a small projection, created before worker B exists
                    r = http.post(
                        "/v1/jobs",
                        json={
                            "name": "standing",
                            "upstream": {"table": "orders"},
                            "backfill": "arrangement",
                            "columns": ["id"],
                            "filter": {"col": "id", "op": "<", "value": 1000},
                            "parallelism": 1,
                        },
                    )
                    assert r.status_code == 202, r.text
                    _wait_state(http, r.json()["id"], "created")
                b, tb = _worker(base, "bench-coupling-b", capacity=64)
                workers.append((b, tb))
                b.spark.warm_up()  # type: ignore[union-attr]
                results["snapshot"] = _backfill(db, base, "snapshot", n)
                results["none"] = _backfill(db, base, "none", n, idle_s=results["snapshot"][1])
                results["arrangement"] = _backfill(db, base, "arrangement", n)
                results["chain"] = _backfill(db, base, "chain", n)
            finally:
                for w, _ in workers:
                    w.stop_event.set()
                for _, t in workers:
                    t.join(timeout=60)
    base_lat, _ = results["none"]
    note = (
        f"{n:,} rows, a writer updating 20 rows every ~20 ms, barrier interval {INTERVAL_MS} ms, "
        "a standing MV on worker A, the backfill on worker B; backfill took "
        + ", ".join(f"{k} {v[1]:.1f} s" for k, v in results.items() if k != "none")
    )
    out = []
    for kind in ("snapshot", "arrangement", "chain"):
        lat, _ = results[kind]
        value, baseline = _pct(lat, 99), _pct(base_lat, 99)
        ratio = round(value / baseline, 2) if baseline else None
        out.append(
            {
                "name": f"upstream barrier latency p99: {kind} backfill vs none",
                "value": round(value, 1),
                "baseline": round(baseline, 1),
                "ratio": ratio,
                "target": "<= 1.2" if kind == "snapshot" else None,
                "unit": "ms",
                "passed": (ratio is not None and ratio <= 1.2) if kind == "snapshot" else None,
                "note": note + f"; {len(lat)} upstream barriers ({len(base_lat)} without)",
            }
        )
    return out
