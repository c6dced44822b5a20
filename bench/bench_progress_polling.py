"""Dashboards polling: 100 jobs' progress read at 200 requests/s for 60 s (15 s with
``--quick``) while the barrier loop runs (100 ms interval) and a fake worker collects
every barrier with per-vnode progress, so each commit updates all 100 jobs. p99 of
``GET /v1/jobs/{id}/progress`` next to ``GET /healthz`` polled the same way in the
same run.

Three processes, so that the harness does not share an interpreter with what it
measures: the control plane (``backfill serve``, as deployed), the fake worker, and
this one, which only generates the load (``bench/_load.py``: open loop, latency from
each request's due time; the generator's own lateness is in the note).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
import uuid
from typing import Any

from sqlalchemy import text

from backfill_core.protocol import CollectRequest
from bench._load import LoadResult, open_loop, percentile
from bench._pg import fresh_database
from spark_workers.client import ControlPlaneClient
from tests.kit.auth import TOKENS, http_client
from tests.kit.live import server_process
from tests.kit.meta import make_job

JOBS = 100
RATE = 200  # requests per second


def _fake_worker(url: str, stop: Any) -> None:
    """Collects every barrier, reporting rows that grow, as a real worker would. Runs in
    a process of its own (``stop`` is a multiprocessing event)."""
    client = ControlPlaneClient(url, token=TOKENS["worker"])
    client.register(f"bench-{uuid.uuid4().hex[:6]}", 1000)
    vnodes: dict[int, list[int]] = {}
    n = 0
    while not stop.is_set():
        batch = []
        for a in client.poll(timeout_ms=500).assignments:
            mine = vnodes.setdefault(a.actor_id, [v for lo, hi in a.vnodes for v in range(lo, hi)])
            for b in a.barriers:
                n += 1
                progress = {
                    "vnodes": [
                        {"vnode": v, "state": "in_progress", "current_pos": [n], "row_count": n}
                        for v in mine
                    ]
                }
                batch.append(
                    CollectRequest.from_json(
                        {
                            "actor_id": a.actor_id,
                            "recovery_seq": a.recovery_seq,
                            "prev_epoch": b.prev,
                            "curr_epoch": b.curr,
                            "progress": progress,
                        }
                    )
                )
        for k in range(0, len(batch), 500):  # the batched collect takes up to 1,000
            client.collect_many(batch[k : k + 500])
    client.close()


def _poll(base: str, paths: list[str], seconds: float) -> LoadResult:
    result = open_loop(base, paths, RATE, seconds, token=TOKENS["admin"])
    assert not result.errors, result.errors[:5]
    return result


def _wait(what: str, done: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def run(quick: bool) -> list[dict[str, Any]]:
    seconds = 15.0 if quick else 60.0
    spawn = mp.get_context("spawn")
    with fresh_database() as (url, db):
        stop = spawn.Event()
        with server_process(url, barrier_interval_ms=100) as base:
            worker = spawn.Process(target=_fake_worker, args=(base, stop), daemon=True)
            worker.start()
            try:
                with db.engine.connect() as conn:
                    registered = text("SELECT count(*) FROM workers WHERE state = 'alive'")
                    _wait(
                        "the fake worker did not register",
                        lambda: conn.execute(registered).scalar(),
                    )
                jobs = [make_job(db, f"poll{i}", 1) for i in range(JOBS)]
                with http_client(base) as http:
                    last = f"/v1/jobs/{jobs[-1]}/progress"
                    _wait("no progress committed", lambda: http.get(last).json()["rows"] > 0)
                progress = _poll(base, [f"/v1/jobs/{j}/progress" for j in jobs], seconds)
                health = _poll(base, ["/healthz"], min(seconds, 15.0))
            finally:
                stop.set()
                worker.join(timeout=30)
    lat, base_lat = progress.latency_ms, health.latency_ms
    p99, h99 = percentile(lat, 99), percentile(base_lat, 99)
    note = (
        f"{JOBS} jobs (16 vnodes each), {RATE} req/s for {seconds:.0f} s, barrier loop at "
        f"100 ms with a fake worker (own process) collecting every barrier; latency from "
        f"each request's due time (open loop); p50 {statistics.median(lat):.1f} ms, /healthz "
        f"p50 {statistics.median(base_lat):.1f} ms; the generator's own send lag p99 "
        f"{percentile(progress.send_lag_ms, 99):.1f} ms; baseline: /healthz at the same rate"
    )
    return [
        {
            "name": "progress polling p99, 100 jobs at 200 req/s",
            "value": round(p99, 1),
            "baseline": round(h99, 1),
            "ratio": round(p99 / h99, 1),
            "target": "< 50 ms",
            "unit": "ms",
            "passed": p99 < 50,
            "note": note,
        }
    ]
