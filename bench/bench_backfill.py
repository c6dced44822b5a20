"""MV creation: a whole arrangement backfill of N rows (2M; 200k with ``--quick``), and
one of the default kind (no kind named: the snapshot backfill), through the real control plane and a real worker (Spark data path), against
``INSERT INTO ... SELECT`` of the same rows into a plain table with the same primary
key, in the same run on the same server; and against a plain PySpark copy job of the
same rows into such a table (``bench/_plain_copy.py``: what a user would run without the
service). Then the same backfill with barrier intervals of 200 ms and 1000 ms: the time
to create should hardly depend on it. Each timed step runs three times (the baseline's
runs alternating with the 1000 ms ones) and the figures are medians: single runs on
this kind of machine move by 30% and more. The 1000 ms runs come before and after the
200 ms ones (two, three, one), so a trend over the bench's minutes falls on both sides.

The worker's SparkSession is started before the clock runs (a worker is long-lived),
and each worker's first view is not timed (it pays what a first view after a start
does: the default_kind bench's figure); the job is created through the API and timed
until it reads ``created``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg2

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType, TableSchema
from bench._figures import listed, seconds
from bench._live import checkpoint, drop_jobs, live_worker, time_until_indexed
from bench._pg import fresh_database
from bench._plain_copy import spark_copy
from service.catalog.queries import storage_of
from service.db import Database
from service.embedded_pg import to_libpq_url
from service.meta.indexer import EpochIndexer
from service.usecases.tables import create_table

SCHEMA = TableSchema.build(
    [
        Column("id", ColumnType.BIGINT, False),
        Column("amount", ColumnType.INT),
        Column("note", ColumnType.TEXT),
    ],
    ["id"],
)
LOAD_EPOCH = 1 << 16  # below any epoch the barrier loop will commit
PARALLELISM = 4  # the MV's actors, and the copy job's partitions
ROUNDS = 3  # runs of each timed step (medians)


def _rows(lo: int, hi: int) -> list[tuple[Any, ...]]:
    return [(i, i * 7 % 1000, f"order-{i:09d}") for i in range(lo, hi)]


def _load(db: Database, conn: Any, n: int) -> None:
    rel = create_table(db, "orders", SCHEMA)
    store = storage_of(rel)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE public.plain_src (id bigint PRIMARY KEY, amount int, note text)")
        cur.execute("CREATE TABLE public.plain_dst (id bigint PRIMARY KEY, amount int, note text)")
        cur.execute("CREATE TABLE public.spark_dst (id bigint PRIMARY KEY, amount int, note text)")
        for lo in range(0, n, 200_000):
            rows = _rows(lo, min(n, lo + 200_000))
            store.write(cur, LOAD_EPOCH, [Version(r) for r in rows])
            cur.copy_from(_Lines(f"{a}\t{b}\t{c}\n" for a, b, c in rows), "plain_src", columns=None)
        # as if loaded long ago: garbage collection has been through the load (one version
        # per key, nothing to remove), or its first run (6 s over 2M rows) would come
        # during a timed run, on a barrier interval's whim
        cur.execute("UPDATE relations SET gc_epoch = %s WHERE name = 'orders'", [LOAD_EPOCH])
        conn.commit()
    # its epoch index, as a table written through the API has after its first write;
    # otherwise the leader builds it while the first view reads the table (0.8 s of 2M
    # rows, in that view's time: bench/HISTORY.md 2026-12-07 08:30)
    assert EpochIndexer(db).build(rel.id), "the epoch index of orders"
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE public.plain_src")
        cur.execute(f'VACUUM ANALYZE store."{rel.storage_table}"')
    conn.autocommit = False


class _Lines:
    """A file-like object over an iterator of COPY lines."""

    def __init__(self, lines: Any) -> None:
        self.data = "".join(lines)
        self.pos = 0

    def read(self, size: int = -1) -> str:
        if size < 0:
            size = len(self.data) - self.pos
        out = self.data[self.pos : self.pos + size]
        self.pos += len(out)
        return out

    readline = read


def _insert_select(conn: Any) -> float:
    with conn.cursor() as cur:
        t0 = time.perf_counter()
        cur.execute("INSERT INTO public.plain_dst SELECT id, amount, note FROM public.plain_src")
        conn.commit()
        elapsed = time.perf_counter() - t0
    # as the loaded tables: vacuumed once written, outside the timing. Otherwise
    # autovacuum takes up the 2M rows just inserted (VACUUM ANALYZE plain_dst) while the
    # next MV creation runs, which then pays for the baseline's upkeep: the first creation
    # of every run was the slowest (bench/HISTORY.md#the-full-run-of-2026-11-26)
    autocommit, conn.autocommit = conn.autocommit, True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE public.plain_dst")
    conn.autocommit = autocommit
    return elapsed


def load_and_insert_select(db: Database, url: str, n: int) -> float:
    """Loads ``n`` rows into ``orders`` and ``plain_src``; seconds of the INSERT INTO ...
    SELECT of them into ``plain_dst`` (the baseline every backfill bench compares with)."""
    conn = psycopg2.connect(to_libpq_url(url))
    try:
        _load(db, conn, n)
        checkpoint(db)  # the load's writes are not flushed inside the timing
        return _insert_select(conn)
    finally:
        conn.close()


def _spark_copy(url: str, n: int, parts: int) -> float:
    """The plain PySpark copy of ``plain_src`` into ``spark_dst`` in ``parts`` key ranges."""
    spec = {
        "dsn": to_libpq_url(url),
        "source": "public.plain_src",
        "target": "public.spark_dst",
        "ddl": "id BIGINT, amount INT, note STRING",
        "arrow": {"id": "int64", "amount": "int32", "note": "string"},
        "key": "id",
        "ranges": [[k * n // parts, (k + 1) * n // parts] for k in range(parts)],
    }
    elapsed = spark_copy(spec)
    conn = psycopg2.connect(spec["dsn"])
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM public.spark_dst")
            copied = cur.fetchone()[0]
    finally:
        conn.close()
    assert copied == n, f"the copy job wrote {copied} rows, not {n}"
    return elapsed


def baseline_again(db: Database, url: str) -> float:
    """Seconds of another ``INSERT ... SELECT`` into the emptied ``plain_dst``."""
    conn = psycopg2.connect(to_libpq_url(url))
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE public.plain_dst")
        conn.commit()
        checkpoint(db)
        return _insert_select(conn)
    finally:
        conn.close()


def _create_mvs(
    db: Database,
    url: str,
    interval_ms: int,
    n: int,
    rounds: int,
    between: Callable[[], None] | None = None,
    default_kind: list[float] | None = None,
) -> list[tuple[float, float | None]]:
    """``rounds`` MVs created one after the other by one control plane and worker, after
    an untimed one (the worker's first): seconds until each is created, and until its
    epoch index is built. ``between`` runs before every round. With ``default_kind``,
    each round also creates the MV without naming a kind (``auto``: the snapshot
    backfill) and adds its seconds there."""
    out = []
    kinds = ["arrangement", *(["auto"] if default_kind is not None else [])]
    with live_worker(db, url, interval_ms, f"bench-{interval_ms}") as (http, worker):
        for i in range(-1, rounds):
            if between is not None and i >= 0:
                between()
            for kind in kinds[: 1 if i < 0 else None]:
                job: dict[str, Any] = {
                    "name": f"mv_{interval_ms}_{kind}_{i + 1}",
                    "upstream": {"table": "orders"},
                    "columns": ["id", "amount", "note"],
                    "parallelism": PARALLELISM,
                }
                if kind != "auto":
                    job["backfill"] = kind
                checkpoint(db)  # the previous run's writes (and its drop) are flushed first
                if i < 0:
                    time_until_indexed(http, db, job, n)  # the worker's first view
                elif kind == "auto" and default_kind is not None:
                    default_kind.append(time_until_indexed(http, None, job, n)[0])
                else:
                    out.append(time_until_indexed(http, db, job, n))
                spark = worker.spark
                assert spark is not None and spark.jobs + spark.rounds_jobs > 0, "no Spark"
                drop_jobs(http)
    return out


def run(quick: bool) -> list[dict[str, Any]]:
    """Medians of ``ROUNDS`` runs each (one with ``quick``): the machine's speed moves
    single runs by 30% and more. A baseline comes before every timed round, at either
    interval; the 1000 ms rounds before and after the 200 ms ones."""
    n = 200_000 if quick else 2_000_000
    rounds = 1 if quick else ROUNDS
    with fresh_database() as (url, db):
        load_and_insert_select(db, url, n)  # the database's first after the load: not counted
        baselines: list[float] = []
        default_1000: list[float] = []
        runs_1000: list[tuple[float, float | None]] = []
        runs_200: list[tuple[float, float | None]] = []

        def again() -> None:
            baselines.append(baseline_again(db, url))

        for interval_ms, block in ((1000, (rounds + 1) // 2), (200, rounds), (1000, rounds // 2)):
            if interval_ms == 200:
                runs_200 += _create_mvs(db, url, 200, n, block, again)
            elif block:
                runs_1000 += _create_mvs(db, url, 1000, n, block, again, default_kind=default_1000)
        checkpoint(db)
        spark = _spark_copy(url, n, PARALLELISM)
    baseline = statistics.median(baselines)
    created = [c for c, _ in runs_1000]
    t1000 = statistics.median(created)
    indexed = statistics.median([i or 0.0 for _, i in runs_1000])
    created_200 = [c for c, _ in runs_200]
    t200 = statistics.median(created_200)
    medians = (
        f" (medians of {rounds}: MV creation {listed(created)} s, "
        f"INSERT ... SELECT before every round {listed(baselines)} s)"
        if rounds > 1
        else ""
    )
    note = f"{n:,} rows, {PARALLELISM} actors, one worker (Spark local[*])"
    t_default = statistics.median(default_1000)
    default_listed = f" (medians of {rounds}: {listed(default_1000)} s)" if rounds > 1 else ""
    spread = max(t200, t1000) / min(t200, t1000)
    return [
        seconds(
            "MV creation, default kind (snapshot) vs INSERT ... SELECT",
            t_default,
            baseline,
            1.5,
            note + ", no kind named (auto), barrier interval 1000 ms" + default_listed,
        ),
        seconds(
            "MV creation, default kind vs arrangement",
            t_default,
            t1000,
            1.2,
            note + ", barrier interval 1000 ms, each round creating both one after the other",
        ),
        seconds(
            "MV creation vs INSERT ... SELECT",
            t1000,
            baseline,
            1.5,
            note + ", barrier interval 1000 ms; baseline INSERT INTO ... SELECT" + medians,
        ),
        seconds(
            "MV creation and its epoch index vs INSERT ... SELECT",
            indexed or 0,
            baseline,
            None,
            note + ", barrier interval 1000 ms: until the MV's index on _epoch, "
            "built once it is created, exists (service/meta/indexer.py)",
        ),
        seconds(
            "MV creation vs a plain PySpark copy job",
            t1000,
            spark,
            None,
            note + f", barrier interval 1000 ms; baseline: a PySpark job (same session "
            f"settings, {PARALLELISM} key-range partitions) copying the rows with COPY csv <-> "
            "Arrow into a plain table with the same primary key (bench/_plain_copy.py)",
        ),
        seconds(
            "MV creation, barrier interval 200 vs 1000 ms",
            t200,
            t1000,
            1.3,
            "the larger of the two times over the smaller"
            + (f" (medians of {rounds}: 200 ms {listed(created_200)} s)" if rounds > 1 else ""),
            ratio=spread,
        ),
    ]
