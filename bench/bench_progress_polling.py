"""Dashboards polling: 100 jobs' progress read at 200 requests/s for 60 s (15 s with
``--quick``) while the barrier loop runs (100 ms interval) and a fake worker collects
every barrier with per-vnode progress, so each commit updates all 100 jobs. p99 of
``GET /v1/jobs/{id}/progress`` next to ``GET /healthz`` polled the same way in the
same run. The control plane runs in its own process, as deployed.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

from bench._pg import fresh_database
from spark_workers.client import ControlPlaneClient
from tests.kit.auth import TOKENS, http_client
from tests.kit.live import server_process
from tests.kit.meta import make_job

JOBS = 100
RATE = 200  # requests per second


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _fake_worker(url: str, stop: threading.Event) -> None:
    """Collects every barrier, reporting rows that grow, as a real worker would."""
    client = ControlPlaneClient(url, token=TOKENS["worker"])
    client.register(f"bench-{uuid.uuid4().hex[:6]}", 1000)
    n = 0
    while not stop.is_set():
        batch = []
        for a in client.poll(timeout_ms=500)["assignments"]:
            vnodes = [v for lo, hi in a["vnodes"] for v in range(lo, hi)]
            for b in a["barriers"]:
                n += 1
                progress = {
                    "vnodes": [
                        {"vnode": v, "state": "in_progress", "current_pos": [n], "row_count": n}
                        for v in vnodes
                    ]
                }
                batch.append(
                    {
                        "actor_id": a["actor_id"],
                        "prev_epoch": b["prev"],
                        "curr_epoch": b["curr"],
                        "progress": progress,
                    }
                )
        for k in range(0, len(batch), 500):  # the batched collect takes up to 1,000
            client.collect_many(batch[k : k + 500])
    client.close()


def _poll(base: str, paths: list[str], seconds: float) -> list[float]:
    """GET the paths round-robin at RATE per second (open loop); latencies in ms."""
    out: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter()
    total = int(seconds * RATE)

    def shooter(k: int, stride: int) -> None:
        with http_client(base, timeout=10) as http:
            for i in range(k, total, stride):
                due = start + i / RATE
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)  # pacing the load, not synchronisation
                t0 = time.perf_counter()
                r = http.get(paths[i % len(paths)])
                ms = (time.perf_counter() - t0) * 1000
                assert r.status_code == 200, r.text
                with lock:
                    out.append(ms)

    threads = [threading.Thread(target=shooter, args=(k, 8)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def run(quick: bool) -> list[dict[str, Any]]:
    seconds = 15.0 if quick else 60.0
    with fresh_database() as (url, db):
        stop = threading.Event()
        with server_process(url, barrier_interval_ms=100) as base:
            worker = threading.Thread(target=_fake_worker, args=(base, stop), daemon=True)
            worker.start()
            time.sleep(0.3)  # let the worker register before placing actors
            jobs = [make_job(db, f"poll{i}", 1) for i in range(JOBS)]
            with http_client(base) as http:
                deadline = time.monotonic() + 60
                while http.get(f"/v1/jobs/{jobs[-1]}/progress").json()["rows"] == 0:
                    assert time.monotonic() < deadline, "no progress committed"
                    time.sleep(0.1)
            progress = _poll(base, [f"/v1/jobs/{j}/progress" for j in jobs], seconds)
            health = _poll(base, ["/healthz"], min(seconds, 15.0))
            stop.set()
            worker.join(timeout=30)
    p99, h99 = _pct(progress, 99), _pct(health, 99)
    note = (
        f"{JOBS} jobs (16 vnodes each), {RATE} req/s for {seconds:.0f} s, barrier loop at "
        f"100 ms with a fake worker collecting every barrier; p50 {statistics.median(progress):.1f}"
        f" ms; baseline: /healthz at the same rate"
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
