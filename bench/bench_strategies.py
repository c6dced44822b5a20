"""The worker's read strategies (``spark_workers/reads/``, issue 33), each forced through
the worker's settings, on the same rows and against the same same-run baseline
(``INSERT INTO ... SELECT`` of them, as ``bench_backfill``): what decides which
strategies earn their place (``docs/architecture.md#the-workers-read-strategies``).

N rows (1M; 100k with ``--quick``) in ``orders``; each case creates a view over all of
them with the default kind (no kind named: the snapshot backfill) and with arrangement,
timed until it is ``created``:

* Spark, one job spanning epochs (the default for an unthrottled view with a SQL form);
* Spark, one job per epoch (``spark_rounds`` off), the tasks running the view inside
  Postgres;
* the driver only (``spark_mode=never``), with pushdown;
* rows through Spark (``pushdown`` off: the way of a view without a SQL form);
* the driver without pushdown (the rows through the worker).

Then a throttled arrangement and default-kind view whose per-actor budget is above
``spark_min_rows`` (the case a job per epoch is for): a Spark job per epoch against the
driver; the five cases again on a small view (20k rows, below ``spark_min_rows``, where
``auto`` reads on the driver), against ``INSERT INTO ... SELECT`` of its rows; and a
Kafka source's backlog (200k messages; 50k with ``--quick``, the mock broker of
``bench_source``) read on the driver against through Spark.

One control plane and one worker, whose settings are replaced between views (a view's
actors take them when they start; ``WorkerSettings`` is what a worker reads from its
``BACKFILL_*`` variables); each case checks the worker's counters to show the strategy it
forced did the reads. The baseline runs again before every round of cases.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg2

from backfill_core.changes import Version
from bench._figures import listed, seconds
from bench._live import checkpoint, drop_jobs, live_worker, time_until_created
from bench._pg import fresh_database
from bench.bench_backfill import (
    LOAD_EPOCH,
    PARALLELISM,
    SCHEMA,
    _rows,
    baseline_again,
    load_and_insert_select,
)
from bench.bench_source import COLUMNS, TOPIC, _produce
from service.catalog.queries import storage_of
from service.embedded_pg import to_libpq_url
from service.usecases.tables import create_table
from spark_workers.runtime import Worker
from spark_workers.settings import WorkerSettings
from tests.kit.kafka import MockKafka

ROUNDS = 1  # runs of each case (medians when raised): one keeps a full run near 5 minutes
# rows per second per actor of the throttled case: a budget of 150k rows per actor and
# 1 s epoch, above spark_min_rows (100k), so Spark per epoch may serve it
THROTTLE = 150_000

# case -> the worker's settings for it (``spark_mode=always``: Spark whatever the rows
# left); ``_check`` says what the worker's counters must show
UNTHROTTLED: dict[str, dict[str, Any]] = {
    "Spark spanning epochs": {"spark_mode": "always"},
    "Spark job per epoch": {"spark_mode": "always", "spark_rounds": False},
    "driver, pushdown": {"spark_mode": "never"},
    "rows through Spark": {"spark_mode": "always", "pushdown": False},
    "driver, rows through the worker": {"spark_mode": "never", "pushdown": False},
}
THROTTLED: dict[str, dict[str, Any]] = {
    "Spark job per epoch": {"spark_mode": "always"},
    "driver, pushdown": {"spark_mode": "never"},
}
KAFKA: dict[str, dict[str, Any]] = {
    "Kafka through Spark": {"spark_mode": "always"},
    "Kafka on the driver": {"spark_mode": "never"},
}
SMALL = 20_000  # rows of the small view: below spark_min_rows, where auto reads on the driver
KINDS = {"default kind": None, "arrangement": "arrangement"}


def _settings_of(case: str) -> dict[str, Any]:
    name = case.removesuffix(", throttled")
    return (THROTTLED if case.endswith("throttled") else UNTHROTTLED)[name]


def _counters(worker: Worker) -> dict[str, int]:
    spark = worker.spark
    assert spark is not None
    return {
        "rounds": spark.rounds_jobs,
        "epoch": spark.jobs - spark.source_jobs,
        "pushdown": spark.pushdown_jobs,
        "source": spark.source_jobs,
        "driver_pushdown": worker.driver_pushdowns,
    }


def _check(case: str, before: dict[str, int], after: dict[str, int]) -> None:
    """The forced strategy did the reads (and the ones it excludes did none)."""
    d = {k: after[k] - before[k] for k in before}
    want: dict[str, Callable[[], bool]] = {
        "Spark spanning epochs": lambda: d["rounds"] > 0,
        "Spark job per epoch": lambda: d["rounds"] == 0 and d["pushdown"] > 0,
        "driver, pushdown": lambda: d["epoch"] == 0 and d["driver_pushdown"] > 0,
        "rows through Spark": lambda: d["rounds"] == 0 and d["epoch"] > 0 and d["pushdown"] == 0,
        "driver, rows through the worker": lambda: d["epoch"] == 0 and d["driver_pushdown"] == 0,
        "Kafka through Spark": lambda: d["source"] > 0,
        "Kafka on the driver": lambda: d["source"] == 0,
    }
    assert want[case](), f"{case}: the worker's counters moved by {d}"


def _timed(
    http: httpx.Client,
    worker: Worker,
    case: str,
    overrides: dict[str, Any],
    job: dict[str, Any],
    rows: int,
) -> float:
    """Seconds until ``job`` is created with the worker's settings ``overrides``."""
    settings = WorkerSettings(**overrides)
    worker.settings = settings
    assert worker.spark is not None
    worker.spark.pushdown = settings.pushdown
    before = _counters(worker)
    elapsed = time_until_created(http, job, rows)
    _check(case, before, _counters(worker))
    drop_jobs(http)
    return elapsed


def _load_small(db: Any, url: str, n: int) -> float:
    """``orders_small``: the first ``n`` rows of ``orders`` (a view below
    ``spark_min_rows``); seconds of the ``INSERT INTO ... SELECT`` of them into a plain
    table (its baseline, the median of three)."""
    rel = create_table(db, "orders_small", SCHEMA)
    conn = psycopg2.connect(to_libpq_url(url))
    try:
        with conn.cursor() as cur:
            storage_of(rel).write(cur, LOAD_EPOCH, [Version(r) for r in _rows(0, n)])
            cur.execute(
                "UPDATE relations SET gc_epoch = %s WHERE name = 'orders_small'", [LOAD_EPOCH]
            )
            cur.execute(
                "CREATE TABLE public.small_dst (id bigint PRIMARY KEY, amount int, note text)"
            )
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'VACUUM ANALYZE store."{rel.storage_table}"')
        runs = []
        for _ in range(3):  # a few tens of milliseconds: the median of three
            checkpoint(db)
            with conn.cursor() as cur:
                cur.execute("TRUNCATE public.small_dst")
                t0 = time.perf_counter()
                cur.execute(
                    "INSERT INTO public.small_dst SELECT id, amount, note FROM public.plain_src "
                    "WHERE id < %s",
                    [n],
                )
                runs.append(time.perf_counter() - t0)
        return statistics.median(runs)
    finally:
        conn.close()


def _table_cases(
    db: Any, url: str, sizes: dict[str, int], rounds: int, baselines: list[float]
) -> dict[tuple[str, str, str], list[float]]:
    """Seconds of each (size, case, kind): ``sizes`` maps "large" and "small" to rows."""
    cases = [("large", c, s, None) for c, s in UNTHROTTLED.items()]
    cases += [("large", c, s, THROTTLE) for c, s in THROTTLED.items()]
    cases += [("small", c, s, None) for c, s in UNTHROTTLED.items()]
    times: dict[tuple[str, str, str], list[float]] = {}
    with live_worker(db, url, 1000, "bench-strategies") as (http, worker):
        for i in range(rounds):
            if i > 0:
                baselines.append(baseline_again(db, url))
            for c, (size, case, overrides, rate) in enumerate(cases):
                for k, (kind, backfill) in enumerate(KINDS.items()):
                    job: dict[str, Any] = {
                        "name": f"mv_{c}_{k}_{i}",
                        "upstream": {"table": "orders" if size == "large" else "orders_small"},
                        "columns": ["id", "amount", "note"],
                        "parallelism": PARALLELISM,
                        "rate_limit": rate,
                    }
                    if backfill is not None:
                        job["backfill"] = backfill
                    checkpoint(db)  # the previous run's writes (and its drop) are flushed
                    label = case + (", throttled" if rate else "")
                    times.setdefault((size, label, kind), []).append(
                        _timed(http, worker, case, overrides, job, sizes[size])
                    )
    return times


def _kafka_cases(n: int, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    kafka = MockKafka()
    try:
        _produce(kafka, n)
        with (
            fresh_database() as (url, db),
            live_worker(db, url, 1000, "bench-strategies-kafka") as (http, worker),
        ):
            r = http.post(
                "/v1/sources",
                json={
                    "name": TOPIC,
                    "kafka": {"bootstrap_servers": kafka.bootstrap, "topic": TOPIC},
                    "columns": [c.to_json() for c in COLUMNS],
                },
            )
            assert r.status_code == 201, r.text
            for i in range(rounds):
                for c, (case, overrides) in enumerate(KAFKA.items()):
                    job = {
                        "name": f"kafka_{c}_{i}",
                        "upstream": {"source": TOPIC},
                        "parallelism": PARALLELISM,
                    }
                    times.setdefault(case, []).append(_timed(http, worker, case, overrides, job, n))
    finally:
        kafka.close()
    return times


def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def run(quick: bool) -> list[dict[str, Any]]:
    load_before = os.getloadavg()[0]
    sizes = {"large": 100_000 if quick else 1_000_000, "small": SMALL}
    n_kafka = 50_000 if quick else 200_000
    rounds = 1 if quick else ROUNDS
    with fresh_database() as (url, db):
        baselines = {"large": [load_and_insert_select(db, url, sizes["large"])]}
        baselines["small"] = [_load_small(db, url, SMALL)]
        times = _table_cases(db, url, sizes, rounds, baselines["large"])
    kafka = _kafka_cases(n_kafka, rounds)
    # the machine may be shared: the load says how much, the ratios are what to compare
    shared = f"; load average {load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after"
    out = []
    for (size, case, kind), ts in times.items():
        n = sizes[size]
        baseline = statistics.median(baselines[size])
        note = (
            f"{n:,} rows, {PARALLELISM} actors, one worker (Spark local[*], the embedded "
            "Postgres), barrier interval 1000 ms; the worker's settings forced per case "
            f"({', '.join(f'{k}={v}' for k, v in _settings_of(case).items())}); baseline "
            "INSERT INTO ... SELECT of the same rows" + shared
        )
        if case.endswith("throttled"):
            note += f"; rate_limit {THROTTLE:,} rows/s per actor"
        if rounds > 1:
            note += f"; medians of {rounds}: {listed(ts)} s (baseline {listed(baselines[size])} s)"
        out.append(
            seconds(
                f"MV creation, {_size(n)} rows, {kind}, {case} vs INSERT ... SELECT",
                statistics.median(ts),
                baseline,
                None,
                note,
            )
        )
    spark_t = statistics.median(kafka["Kafka through Spark"])
    driver_t = statistics.median(kafka["Kafka on the driver"])
    out.append(
        seconds(
            "source backfill, Kafka through Spark vs on the driver",
            spark_t,
            driver_t,
            None,
            f"{n_kafka:,} JSON messages in 4 partitions (mock broker, bench_source), "
            f"{PARALLELISM} actors, one worker; spark_mode always against never{shared}"
            + (
                f" (medians of {rounds}: Spark {listed(kafka['Kafka through Spark'])} s, "
                f"driver {listed(kafka['Kafka on the driver'])} s)"
                if rounds > 1
                else ""
            ),
        )
    )
    return out
