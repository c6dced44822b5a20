"""The default kind (no kind named: the snapshot backfill) as a deployment runs it: the
worker in a process of its own (its own Spark application), the control plane beside
it. A 400k-row view (100k with ``--quick``), where fixed costs around barriers weigh
most, against ``INSERT INTO ... SELECT`` of the same rows in the same run; the first view
after the worker started against the same view on the warm worker; and 100 ms barriers
against 1000 ms, the views at the two intervals alternating on one worker. Medians of
five runs each, the baselines alternating with them.

The first view of each of four worker processes is created once the worker logs that
Spark is ready (its application and Python workers started at start-up,
``spark_warm_up``): what a view created a minute after a worker started pays, against a
warm view on the same worker right after it. A fifth worker, started before them,
creates the database's first view after its load; that view is reported but not
counted: what it pays more is the database's, not the worker's (bench/HISTORY.md,
2026-12-07 04:30 and 06:40).
"""

from __future__ import annotations

import statistics
from typing import Any

import httpx

from bench._figures import listed, seconds
from bench._live import checkpoint, drop_jobs, spark_ready_worker, time_until_created
from bench._pg import fresh_database
from bench.bench_backfill import PARALLELISM, baseline_again, load_and_insert_select
from service.db import Database
from service.settings import Settings
from tests.kit.auth import http_client
from tests.kit.live import RestartableServer

# five, not three: a view this small takes about a second, and on a shared VM single runs
# (the baseline's too) move more than the targets' margins (bench/HISTORY.md, 2026-11-28 10:30)
ROUNDS = 5
# first views, each of a worker process started for it: one is a single sample of a
# second or so, which a shared machine moves by more than the target's margin
STARTS = 4


def _create(http: httpx.Client, db: Database, name: str, n: int) -> float:
    """Seconds until the default-kind view ``name`` over every row is created; dropped
    afterwards."""
    job = {
        "name": name,
        "upstream": {"table": "orders"},
        "columns": ["id", "amount", "note"],
        "parallelism": PARALLELISM,
    }
    checkpoint(db)  # the previous run's writes (and its drop) are flushed first
    seconds = time_until_created(http, job, n)
    drop_jobs(http)
    return seconds


def _settings(url: str, interval_ms: int) -> Settings:
    return Settings(database_url=url, barrier_interval_ms=interval_ms, spawn_embedded_worker=False)


def _restart(cp: RestartableServer, url: str, interval_ms: int) -> None:
    """The control plane started again, at ``interval_ms``, on its port: the worker
    process keeps its URL (and its warm Spark)."""
    cp.settings = _settings(url, interval_ms)
    cp.restart()


def _warm_view(
    cp: RestartableServer,
    db: Database,
    url: str,
    n: int,
    name: str,
    interval_ms: int,
    baselines: list[float],
) -> float:
    """Seconds of a view on the worker once warm: the control plane started again at
    ``interval_ms``, an untimed view proving the worker back and warm, another baseline."""
    _restart(cp, url, interval_ms)
    with http_client(cp.url, timeout=1800) as http:
        _create(http, db, f"again_{name}", n)
        baselines.append(baseline_again(db, url))
        return _create(http, db, f"warm_{name}", n)


def _runs(
    db: Database,
    url: str,
    n: int,
    rounds: int,
    starts: int,
    baselines: list[float],
    worker_env: dict[str, str],
) -> tuple[float, list[tuple[float, float]], dict[int, list[float]]]:
    """Seconds of the database's first view after the load, on a worker of its own; of
    the first view of ``starts`` more worker processes, each once its Spark is ready (at
    1000 ms), each paired with a warm view on the same worker right after it; then, on
    the last worker, of ``rounds`` views at each interval, in the order 1000, 100, 100,
    1000, ... Every timed view follows a baseline. A shared machine's slow spells, and
    a trend over the bench's minutes, so fall on both sides of each figure alike, not
    on one block (bench/HISTORY.md, 2026-11-29 02:50 and 2026-12-07 06:40)."""
    after_load = 0.0
    pairs: list[tuple[float, float]] = []
    warm: dict[int, list[float]] = {1000: [], 100: []}
    with RestartableServer(_settings(url, 1000), db) as cp:
        for start in range(starts + 1):
            if start:
                _restart(cp, url, 1000)
            with spark_ready_worker(cp.url, f"bench-default-kind-{start}", worker_env):
                with http_client(cp.url, timeout=1800) as http:
                    baselines.append(baseline_again(db, url))
                    first = _create(http, db, f"first_{start}", n)
                if not start:
                    after_load = first
                    continue
                pairs.append((first, _warm_view(cp, db, url, n, f"{start}", 1000, baselines)))
                if start < starts:
                    continue
                for i in range(2 * rounds):
                    interval_ms = 1000 if i % 4 in (0, 3) else 100
                    warm[interval_ms].append(
                        _warm_view(cp, db, url, n, f"{start}_{i}", interval_ms, baselines)
                    )
    return after_load, pairs, warm


def run(quick: bool) -> list[dict[str, Any]]:
    return figures(quick, None, {}, "Spark local[*], the embedded Postgres")


def figures(
    quick: bool, server: str | None, worker_env: dict[str, str], shape: str
) -> list[dict[str, Any]]:
    """The figures with the database on ``server`` (None: an embedded one) and the worker
    process's environment given ``worker_env`` besides (its Spark master); ``shape``
    says which, in the notes."""
    n = 100_000 if quick else 400_000
    rounds, starts = (1, 1) if quick else (ROUNDS, STARTS)
    with fresh_database(server) as (url, db):
        baselines = [load_and_insert_select(db, url, n)]
        after_load, pairs, warm = _runs(db, url, n, rounds, starts, baselines, worker_env)
    firsts, paired = [f for f, _ in pairs], [w for _, w in pairs]
    warm_1000, warm_100 = warm[1000], warm[100]
    baseline = statistics.median(baselines)
    t1000, t100 = statistics.median(warm_1000), statistics.median(warm_100)
    note = (
        f"{n:,} rows, {PARALLELISM} actors, no kind named (auto), a worker process of its "
        f"own, the control plane in the bench's process; {shape}"
    )
    medians = f" (medians of {rounds}: " if rounds > 1 else None
    return [
        seconds(
            f"MV creation, default kind, {n // 1000}k rows vs INSERT ... SELECT",
            t1000,
            baseline,
            2.0,
            note
            + ", barrier interval 1000 ms"
            + (f"{medians}{listed(warm_1000)} s; INSERT {listed(baselines)} s)" if medians else ""),
        ),
        seconds(
            "MV creation, default kind, first view after the worker started vs warm",
            statistics.median(firsts),
            statistics.median(paired),
            1.2,
            note + ", barrier interval 1000 ms; the first view once the worker logged "
            "that Spark is ready, against a warm view on the same worker right after it"
            + (
                f" (medians of {starts} workers started: {listed(firsts)} s; warm "
                f"{listed(paired)} s)"
                if starts > 1
                else ""
            )
            + f"; not counted: the database's first view after its load, {after_load:.2f} s",
        ),
        seconds(
            "MV creation, default kind, barrier interval 100 vs 1000 ms",
            t100,
            t1000,
            1.1,
            note + "; the views at the two intervals alternate (1000, 100, 100, 1000, ...) on "
            "one worker, the control plane started again at each view's interval"
            + (f"{medians}100 ms {listed(warm_100)} s)" if medians else ""),
        ),
    ]
