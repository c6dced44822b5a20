"""Export to Parquet (``POST /v1/tables/{name}/exports``) against a plain PySpark job
that writes the same rows to Parquet without the service, in the same run and the same
Spark session: N rows (1M; 200k with ``--quick``).

* value: the worker's export (``spark_workers.exports.write_export``): the snapshot at
  an epoch of the versioned table, read by the store's data source (latest version per
  key at or below the epoch, tombstones dropped), written with ``df.write.parquet``;
* baseline: a plain table with the same rows, read in key ranges by the plain COPY data
  source of ``bench/_plain_copy.py`` (COPY csv -> Arrow, what a user without the service
  would write; Spark's JDBC reader cannot reach the embedded server's unix socket), and
  written with ``df.write.parquet`` too.

Both in as many partitions as the session has cores; best of 2 after a warm-up run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg2

from backfill_core.changes import Version
from backfill_core.protocol import ExportTask
from backfill_core.schema import Column, ColumnType, TableSchema
from bench._pg import fresh_database
from service.embedded_pg import to_libpq_url
from state_store.versioned import VersionedTable

SCHEMA = TableSchema.build(
    [
        Column("id", ColumnType.BIGINT, False),
        Column("amount", ColumnType.INT),
        Column("note", ColumnType.TEXT),
    ],
    ["id"],
)
EPOCH = 1 << 16
NAME = "bench_export"


def _load(dsn: str, n: int) -> None:
    table = VersionedTable(NAME, SCHEMA)
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            table.create(cur)
            cur.execute(
                "CREATE TABLE public.plain_src (id bigint PRIMARY KEY, amount int, note text)"
            )
            for lo in range(0, n, 100_000):
                rows = [(i, i % 1000, f"note {i}") for i in range(lo, min(n, lo + 100_000))]
                table.write(cur, EPOCH, [Version(r) for r in rows])
                cur.execute(
                    "INSERT INTO public.plain_src SELECT i, i %% 1000, 'note ' || i "
                    "FROM generate_series(%s::bigint, %s::bigint - 1) i",
                    (lo, min(n, lo + 100_000)),
                )
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'VACUUM ANALYZE store."{NAME}"')
            cur.execute("VACUUM ANALYZE public.plain_src")
    finally:
        conn.close()


def run(quick: bool) -> list[dict[str, Any]]:
    n = 200_000 if quick else 1_000_000
    with fresh_database() as (url, _db):
        dsn = to_libpq_url(url)
        _load(dsn, n)
        return _measure(dsn, n)


def _measure(dsn: str, n: int) -> list[dict[str, Any]]:
    from bench._plain_copy import PlainCopySource
    from spark_workers.exports import write_export
    from spark_workers.spark_path import SparkPath

    spark = SparkPath("local[*]", dsn)
    session = spark.session()
    session.dataSource.register(PlainCopySource)
    parts = max(2, int(session.sparkContext.defaultParallelism))
    spec = json.dumps(
        {
            "dsn": dsn,
            "source": "public.plain_src",
            "ddl": "id BIGINT, amount INT, note STRING",
            "arrow": {"id": "int64", "amount": "int32", "note": "string"},
            "key": "id",
            "ranges": [[k * n // parts, (k + 1) * n // parts] for k in range(parts)],
        }
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench_export_"))
    runs = iter(range(1000))

    def export() -> int:
        path = tmp / f"export_{next(runs)}"
        task = ExportTask(1, NAME, NAME, SCHEMA.to_json(), EPOCH, "parquet", f"file:{path}")
        return write_export(spark, task, "bench-export")

    def plain() -> int:
        path = tmp / f"plain_{next(runs)}"
        df = session.read.format("plain_pg_copy").option("spec", spec).load()
        df.write.parquet(f"file:{path}")
        return int(session.read.parquet(f"file:{path}").count())

    def best(fn: Any) -> float:
        assert fn() == n  # warm: Python workers, connections; and the rows are all there
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    try:
        t_export = best(export)
        t_plain = best(plain)
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = round(t_plain / t_export, 2)
    return [
        {
            "name": "export to Parquet vs a plain PySpark COPY job to Parquet",
            "value": round(n / t_export),
            "baseline": round(n / t_plain),
            "ratio": ratio,
            "target": ">= 0.7x",
            "unit": "rows/s",
            "passed": ratio >= 0.7,
            "note": (
                f"{n:,} rows, {parts} partitions, best of 2, same Spark session; value: the "
                "worker's export of the snapshot at an epoch (store data source), baseline: "
                "the rows of a plain table read by key range with COPY (bench/_plain_copy.py)"
            ),
        }
    ]
