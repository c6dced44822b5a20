"""Why the Spark path reads through the Python Data Source API and not JDBC: the same
snapshot of a versioned table (N rows; 1M, 200k with ``--quick``) read into Spark
both ways, same session, same server, same partitioning (vnode ranges), materialised
with Spark's ``noop`` sink.

JDBC needs a TCP server and the PostgreSQL JDBC jar: ``BENCH_TCP_DATABASE_URL``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``) and ``BENCH_JDBC_JAR``
(default ``/usr/share/java/postgresql.jar``, Debian's ``libpostgresql-jdbc-java``).
Without them the figure says so instead of guessing.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import psycopg2
from psycopg2 import sql

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType, TableSchema
from state_store.versioned import SCHEMA as STORE_SCHEMA
from state_store.versioned import VersionedTable

TABLE_SCHEMA = TableSchema.build(
    [
        Column("id", ColumnType.BIGINT, False),
        Column("amount", ColumnType.INT),
        Column("note", ColumnType.TEXT),
        Column("price", ColumnType.DOUBLE),
    ],
    ["id"],
)
EPOCH = 1 << 16


def _unavailable(reason: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "snapshot read into Spark: Python Data Source vs JDBC",
            "value": None,
            "baseline": None,
            "ratio": None,
            "target": "informs the choice",
            "unit": "s",
            "passed": None,
            "note": f"JDBC not measurable here: {reason}",
        }
    ]


def run(quick: bool) -> list[dict[str, Any]]:
    n = 200_000 if quick else 1_000_000
    url = os.environ.get("BENCH_TCP_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    jar = os.environ.get("BENCH_JDBC_JAR", "/usr/share/java/postgresql.jar")
    if not os.path.exists(jar):
        return _unavailable(f"no JDBC jar at {jar}")
    try:
        conn = psycopg2.connect(url, connect_timeout=5)
    except psycopg2.Error as e:
        return _unavailable(f"no TCP Postgres at {url} ({str(e).strip()[:80]})")
    name = f"bench_sp_{uuid.uuid4().hex[:8]}"
    table = VersionedTable(name, TABLE_SCHEMA)
    try:
        with conn.cursor() as cur:
            cur.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(STORE_SCHEMA))
            )
            table.create(cur)
            for lo in range(0, n, 100_000):
                rows = [(i, i % 1000, f"note {i}", i / 3) for i in range(lo, min(n, lo + 100_000))]
                table.write(cur, EPOCH, [Version(r) for r in rows])
        conn.commit()
        conn.autocommit = True
        conn.cursor().execute(sql.SQL("VACUUM ANALYZE {}").format(table.ident))
        return _measure(url, jar, name, n)
    finally:
        conn.autocommit = True
        conn.cursor().execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table.ident))
        conn.close()


def _measure(url: str, jar: str, name: str, n: int) -> list[dict[str, Any]]:
    from backfill_core.protocol import MvWrite, TablePlan, VnodeRead
    from spark_workers.datasource import StoreDataSource
    from spark_workers.spark_path import build_session

    spark = build_session("local[*]", {"spark.jars": jar})
    spark.dataSource.register(StoreDataSource)
    parts = max(2, int(spark.sparkContext.defaultParallelism))
    bounds = [(k * 256 // parts, (k + 1) * 256 // parts) for k in range(parts)]
    write = MvWrite(url, name, TABLE_SCHEMA, list(TABLE_SCHEMA.names), None, 0, 0, EPOCH)
    plan = TablePlan(
        write,
        name,
        TABLE_SCHEMA,
        EPOCH,
        [[VnodeRead(v, None, n) for v in range(lo, hi)] for lo, hi in bounds],
    ).to_text()
    # the same snapshot for JDBC: the newest version per key at the epoch, by vnode range
    snapshot = (
        f'(SELECT "_vnode", "id", "amount", "note", "price" FROM (SELECT DISTINCT ON '
        f'("_vnode", "id") * FROM "{STORE_SCHEMA}"."{name}" WHERE "_epoch" <= {EPOCH} '
        f'ORDER BY "_vnode", "id", "_epoch" DESC) v WHERE NOT "_deleted") s'
    )
    predicates = [f'"_vnode" >= {lo} AND "_vnode" < {hi}' for lo, hi in bounds]
    from urllib.parse import urlparse

    u = urlparse(url)
    jdbc_url = f"jdbc:postgresql://{u.hostname}:{u.port or 5432}{u.path}"
    props = {
        "user": u.username or "postgres",
        "password": u.password or "",
        "fetchsize": "10000",
        "driver": "org.postgresql.Driver",
    }

    def python_ds() -> int:
        df = spark.read.format("backfill_store").option("plan", plan).load()
        df.write.format("noop").mode("overwrite").save()
        return n

    def jdbc() -> int:
        df = spark.read.jdbc(jdbc_url, snapshot, predicates=predicates, properties=props)
        df.write.format("noop").mode("overwrite").save()
        return n

    def best(fn: Any) -> float:
        fn()  # warm: Python workers, JIT, connections
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    try:
        assert spark.read.format("backfill_store").option("plan", plan).load().count() == n
        assert (
            spark.read.jdbc(jdbc_url, snapshot, predicates=predicates, properties=props).count()
            == n
        )
        t_ds = best(python_ds)
        t_jdbc = best(jdbc)
    finally:
        spark.stop()
    return [
        {
            "name": "snapshot read into Spark: Python Data Source vs JDBC",
            "value": round(t_ds, 3),
            "baseline": round(t_jdbc, 3),
            "ratio": round(t_ds / t_jdbc, 2),
            "target": "informs the choice",
            "unit": "s",
            "passed": None,
            "note": (
                f"{n:,} rows, {parts} vnode-range partitions, best of 3; value: Python Data "
                "Source (COPY csv -> Arrow), baseline: Spark JDBC with the same snapshot query"
            ),
        }
    ]
