"""Dashboards following events: progress and ``/healthz`` read at 200 requests/s each
while 1,000 ``GET /v1/events`` streams (250 with ``--quick``) follow and steering makes
events, against the same reads with no stream open, in the same run. Every stream must
receive each event exactly once.

Four processes: the control plane (``backfill serve``), the fake worker of the
progress-polling bench (every commit updates every job's progress), the streams (one
asyncio loop on raw sockets), and this one, which generates the load.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import text

from bench._load import LoadResult, open_loop, percentile
from bench._pg import fresh_database
from bench.bench_progress_polling import _fake_worker, _wait
from tests.kit.auth import TOKENS, http_client
from tests.kit.live import server_process
from tests.kit.meta import make_job

JOBS = 20
RATE = 200  # requests per second, for each of progress and /healthz
STEERS = 50  # pause + resume pairs: 100 events


async def _follow_all(
    base: str, n: int, after: int, expected: int, opened: Any, closing: Any
) -> list[list[int]]:
    """``n`` streams from ``after``, each reading ``expected`` events and then staying
    open until ``closing`` (a multiprocessing event) is set: their ids."""
    parts = urlsplit(base)
    request = (
        f"GET /v1/events?after={after} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {TOKENS['reader']}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    counted = [0]
    closed = asyncio.Event()

    async def watch_closing() -> None:  # one look for all the streams, not one each
        while not closing.is_set():
            await asyncio.sleep(0.2)
        closed.set()

    async def one() -> list[int]:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n", 1)[0], head[:200]
        counted[0] += 1
        if counted[0] == n:
            opened.set()
        ids: list[int] = []
        while len(ids) < expected:
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b"id: "):
                ids.append(int(line[4:]))
        await closed.wait()  # open through the whole measurement
        writer.close()
        return ids

    watcher = asyncio.create_task(watch_closing())
    tasks = []
    for _ in range(n):  # opened a few at a time: a burst of 1,000 connects is another bench
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(0.002)
    ids = list(await asyncio.gather(*tasks))
    await watcher
    return ids


def _streams(*args: Any) -> None:
    *rest, out = args
    out.put(asyncio.run(_follow_all(*rest)))


def _steer(base: str, job: int) -> None:
    """The events: pause and resume one job, a pair every 0.2 s."""
    with http_client(base, timeout=60) as http:
        for _ in range(STEERS):
            assert http.post(f"/v1/jobs/{job}/pause").status_code == 200
            assert http.post(f"/v1/jobs/{job}/resume").status_code == 200
            time.sleep(0.2)


def _reads(base: str, paths: list[str], seconds: float) -> tuple[LoadResult, LoadResult]:
    progress = open_loop(base, paths, RATE, seconds, token=TOKENS["admin"])
    health = open_loop(base, ["/healthz"], RATE, min(seconds, 15.0), token=TOKENS["admin"])
    for r in (progress, health):
        assert not r.errors, r.errors[:5]
    return progress, health


def run(quick: bool) -> list[dict[str, Any]]:
    streams = 250 if quick else 1_000
    seconds = 15.0 if quick else 30.0
    spawn = mp.get_context("spawn")
    with fresh_database() as (url, db):
        stop = spawn.Event()
        settings = {"barrier_interval_ms": 100, "max_event_streams_per_token": streams + 10}
        with server_process(url, **settings) as base:
            worker = spawn.Process(target=_fake_worker, args=(base, stop), daemon=True)
            worker.start()
            follower = None
            try:
                with db.engine.connect() as conn:
                    alive = text("SELECT count(*) FROM workers WHERE state = 'alive'")
                    _wait("the fake worker did not register", lambda: conn.execute(alive).scalar())
                jobs = [make_job(db, f"ev{i}", 1) for i in range(JOBS)]
                paths = [f"/v1/jobs/{j}/progress" for j in jobs]
                with http_client(base) as http:
                    _wait("no progress", lambda: http.get(paths[-1]).json()["rows"] > 0)
                    quiet = _reads(base, paths, seconds)
                    with db.engine.connect() as conn:
                        after = conn.execute(text("SELECT max(id) FROM events")).scalar() or 0
                    opened, closing, out = spawn.Event(), spawn.Event(), spawn.Queue()
                    follower = spawn.Process(
                        target=_streams,
                        args=(base, streams, after, 2 * STEERS, opened, closing, out),
                        daemon=True,
                    )
                    follower.start()
                    assert opened.wait(120), "the streams did not open"
                    steering = threading.Thread(target=_steer, args=(base, jobs[0]))
                    steering.start()
                    busy = _reads(base, paths, seconds)
                    steering.join()
                    closing.set()
                    got: list[list[int]] = out.get(timeout=120)
                    with db.engine.connect() as conn:
                        ids = conn.execute(
                            text("SELECT id FROM events WHERE id > :a ORDER BY id"), {"a": after}
                        ).scalars()
                        expected = list(ids)[: 2 * STEERS]
            finally:
                stop.set()
                worker.join(timeout=30)
                if follower is not None:
                    follower.join(timeout=30)
    exact = sum(g == expected for g in got)
    return [
        _figure(f"progress p99, {streams} event streams open vs none", busy[0], quiet[0]),
        _figure(f"/healthz p99, {streams} event streams open vs none", busy[1], quiet[1]),
        {
            "name": "event streams that received each event exactly once",
            "value": exact,
            "baseline": streams,
            "ratio": round(exact / streams, 3),
            "target": "all",
            "unit": "streams",
            "passed": exact == streams,
            "note": f"{2 * STEERS} events (pause and resume of one job) while {streams} "
            "streams followed from the same event id",
        },
    ]


def _figure(name: str, busy: LoadResult, quiet: LoadResult) -> dict[str, Any]:
    p99, q99 = percentile(busy.latency_ms, 99), percentile(quiet.latency_ms, 99)
    return {
        "name": name,
        "value": round(p99, 1),
        "baseline": round(q99, 1),
        "ratio": round(p99 / q99, 2),
        "target": "< 50 ms",
        "unit": "ms",
        "passed": p99 < 50,
        "note": f"{RATE} req/s; p50 {statistics.median(busy.latency_ms):.1f} ms with the "
        f"streams, {statistics.median(quiet.latency_ms):.1f} ms without; {JOBS} jobs, "
        "barriers every 100 ms with a fake worker collecting each; open loop, latency from "
        f"each request's due time (the generator's send lag p99 "
        f"{percentile(busy.send_lag_ms, 99):.1f} ms)",
    }
