"""The default kind (no kind named: the snapshot backfill) as a deployment runs it: the
worker in a process of its own (its own Spark application), the control plane beside
it. A 400k-row view (100k with ``--quick``), where fixed costs around barriers weigh
most, against ``INSERT INTO ... SELECT`` of the same rows in the same run; the first view
after the worker started against the same view on the warm worker; and 100 ms barriers
against 1000 ms. Medians of five runs each, the baselines alternating with them.

The first view is created once the worker logs that Spark is ready (its application and
Python workers started at start-up, ``spark_warm_up``): what a view created a minute
after a worker started pays.
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
from tests.kit.live import live_server

# five, not three: a view this small takes about a second, and on a shared VM single runs
# (the baseline's too) move more than the targets' margins (bench/HISTORY.md, 2026-11-28 10:30)
ROUNDS = 5


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


def _runs(
    db: Database,
    url: str,
    interval_ms: int,
    n: int,
    rounds: int,
    baselines: list[float],
    worker_env: dict[str, str],
) -> tuple[float, list[float]]:
    """A control plane at ``interval_ms`` and a new worker process: seconds of the first
    view once Spark is ready, then of ``rounds`` more, each after another baseline."""
    settings = Settings(
        database_url=url, barrier_interval_ms=interval_ms, spawn_embedded_worker=False
    )
    with (
        live_server(settings, db) as base,
        http_client(base, timeout=1800) as http,
        spark_ready_worker(base, f"bench-{interval_ms}", worker_env),
    ):
        first = _create(http, db, f"first_{interval_ms}", n)
        warm = []
        for i in range(rounds):
            baselines.append(baseline_again(db, url))
            warm.append(_create(http, db, f"warm_{interval_ms}_{i}", n))
    return first, warm


def run(quick: bool) -> list[dict[str, Any]]:
    return figures(quick, None, {}, "Spark local[*], the embedded Postgres")


def figures(
    quick: bool, server: str | None, worker_env: dict[str, str], shape: str
) -> list[dict[str, Any]]:
    """The figures with the database on ``server`` (None: an embedded one) and the worker
    process's environment given ``worker_env`` besides (its Spark master); ``shape``
    says which, in the notes."""
    n = 100_000 if quick else 400_000
    rounds = 1 if quick else ROUNDS
    with fresh_database(server) as (url, db):
        baselines = [load_and_insert_select(db, url, n)]
        first, warm_1000 = _runs(db, url, 1000, n, rounds, baselines, worker_env)
        _, warm_100 = _runs(db, url, 100, n, rounds, baselines, worker_env)
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
            first,
            t1000,
            1.2,
            note + ", barrier interval 1000 ms; the first view once the worker logged "
            "that Spark is ready, against the median of the views after it",
        ),
        seconds(
            "MV creation, default kind, barrier interval 100 vs 1000 ms",
            t100,
            t1000,
            1.1,
            note + (f"{medians}100 ms {listed(warm_100)} s)" if medians else ""),
        ),
    ]
