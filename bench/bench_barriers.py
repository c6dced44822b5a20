"""Barrier round trip: inject -> all 8 actors collected -> committed, over loopback HTTP.

Workers answer at once (a 0 ms epoch), so the figure is the protocol's own cost. The
baseline, measured in the same run, is the floor of that path: one loopback HTTP
request to the same server (``/healthz``) timed the same way. The control plane runs in
its own process, as deployed, so the fake workers do not share its interpreter.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

from sqlalchemy import text

from backfill_core.protocol import CollectRequest
from bench._pg import fresh_database
from spark_workers.client import ControlPlaneClient
from tests.kit.auth import TOKENS, http_client
from tests.kit.live import server_process
from tests.kit.meta import make_job

ACTORS = 8
WORKERS = 2


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _fake_worker(url: str, stop: threading.Event) -> None:
    client = ControlPlaneClient(url, token=TOKENS["worker"])
    client.register(f"bench-{uuid.uuid4().hex[:6]}", ACTORS)
    while not stop.is_set():
        batch = [
            CollectRequest(a.actor_id, a.recovery_seq, b.prev, b.curr)
            for a in client.poll(timeout_ms=500).assignments
            for b in a.barriers
        ]
        if batch:
            client.collect_many(batch)
    client.close()


def run(quick: bool) -> list[dict[str, Any]]:
    barriers = 60 if quick else 300
    interval_ms = 100
    with fresh_database() as (url, db):
        stop = threading.Event()
        with server_process(url, barrier_interval_ms=interval_ms) as base:
            threads = [
                threading.Thread(target=_fake_worker, args=(base, stop)) for _ in range(WORKERS)
            ]
            for t in threads:
                t.start()
            time.sleep(0.3)  # let both workers register before placing actors
            make_job(db, "bench", parallelism=ACTORS)
            deadline = time.monotonic() + barriers * interval_ms / 1000 * 3 + 60
            start_count = None
            while time.monotonic() < deadline:
                with db.engine.connect() as conn:
                    n = conn.execute(
                        text(
                            "SELECT count(*) FROM barriers b WHERE state = 'committed' AND EXISTS "
                            "(SELECT 1 FROM barrier_collects c WHERE c.curr_epoch = b.curr_epoch)"
                        )
                    ).scalar_one()
                start_count = start_count if start_count is not None else n
                if n >= barriers + 5:
                    break
                time.sleep(0.2)
            with db.engine.connect() as conn:
                lat = [
                    float(x) * 1000
                    for (x,) in conn.execute(
                        text(
                            "SELECT extract(epoch FROM committed_at - injected_at) FROM barriers b "
                            "WHERE state = 'committed' AND EXISTS (SELECT 1 FROM barrier_collects c "
                            "WHERE c.curr_epoch = b.curr_epoch) ORDER BY curr_epoch"
                        )
                    )
                ][5:]  # skip the warm-up barriers
            floor = []
            with http_client(base) as http:
                for _ in range(200):
                    t0 = time.perf_counter()
                    http.get("/healthz")
                    floor.append((time.perf_counter() - t0) * 1000)
            stop.set()
            for t in threads:
                t.join(timeout=30)
    p50, p99 = statistics.median(lat), _pct(lat, 99)
    f50, f99 = statistics.median(floor), _pct(floor, 99)
    note = (
        f"{len(lat)} barriers, {ACTORS} actors on {WORKERS} fake workers, interval {interval_ms} ms"
    )
    return [
        {
            "name": "barrier round trip p50",
            "value": round(p50, 2),
            "baseline": round(f50, 2),
            "ratio": round(p50 / f50, 1),
            "target": None,
            "unit": "ms",
            "passed": None,
            "note": note + "; baseline: one loopback HTTP request",
        },
        {
            "name": "barrier round trip p99",
            "value": round(p99, 2),
            "baseline": round(f99, 2),
            "ratio": round(p99 / f99, 1),
            "target": "< 100 ms",
            "unit": "ms",
            "passed": p99 < 100,
            "note": note,
        },
    ]


if __name__ == "__main__":
    for row in run(quick=True):
        print(row)
