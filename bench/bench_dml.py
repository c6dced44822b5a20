"""Rows through ``POST /v1/tables/{name}/dml`` on a control plane of its own process.

1. JSON DML: narrow rows (4 columns: bigint key, int, text, double) inserted in batches of
   10,000 ops, one request after another, bodies serialized before the timing; the
   figure is rows/s against the absolute target of 100,000 rows/s (issue 36).
2. bulk CSV body: the same kind of rows in one ``text/csv`` body (inserts) vs a plain
   ``COPY ... FROM STDIN (FORMAT csv)`` of the same CSV text into a plain table with
   ``PRIMARY KEY (id)``, on the same Postgres in the same run; fresh tables each run,
   the two alternating, median of 3.
3. bulk NDJSON body: the same rows as ``application/x-ndjson`` ops, against the same plain
   COPY (reported: the row-at-a-time path, no target).
"""

from __future__ import annotations

import io
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg2

from bench._pg import fresh_database
from service.embedded_pg import to_libpq_url
from tests.kit.auth import http_client
from tests.kit.e2e import wait_for
from tests.kit.live import server_process

KEYS = ("name", "value", "baseline", "ratio", "target", "unit", "passed", "note")
BATCH, REPEATS, JSON_TARGET = 10_000, 3, 100_000
TABLE = {
    "columns": [
        {"name": "id", "type": "bigint", "nullable": False},
        {"name": "a", "type": "int"},
        {"name": "b", "type": "text"},
        {"name": "c", "type": "double"},
    ],
    "primary_key": ["id"],
}
PLAIN_DDL = "CREATE TABLE {} (id bigint PRIMARY KEY, a integer, b text, c double precision)"


def _row(i: int) -> dict[str, Any]:
    return {"id": i, "a": i % 100_000, "b": f"row-{i:09d}-xyz", "c": i / 4}


def _csv(n: int) -> bytes:
    return "".join(f"{i},{i % 100_000},row-{i:09d}-xyz,{i / 4!r}\n" for i in range(n)).encode()


def _figure(
    name: str, value: float, base: float, target: str | None, unit: str, note: str
) -> dict[str, Any]:
    ratio = value / base
    passed = None if target is None else ratio >= float(target[3:])
    figures = (name, round(value), round(base), round(ratio, 3), target or "report", unit)
    return dict(zip(KEYS, (*figures, passed, note), strict=True))


def _fresh_table(http: httpx.Client, name: str) -> None:
    http.delete(f"/v1/tables/{name}")
    r = http.post("/v1/tables", json={"name": name, **TABLE})
    assert r.status_code == 201, r.text


def _post(http: httpx.Client, name: str, body: bytes, content_type: str, rows: int) -> None:
    r = http.post(f"/v1/tables/{name}/dml", content=body, headers={"content-type": content_type})
    assert r.status_code == 200, r.text[:500]
    assert r.json()["count"] == rows, r.text[:500]


def _secs(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _indexed(conn: Any, name: str) -> None:
    """Wait (with a deadline) for the table's epoch index, built after its first write
    (``service.meta.indexer``): nothing of that build overlaps what comes next."""

    def built() -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT epoch_indexed FROM relations WHERE name = %s", [name])
            return bool(cur.fetchone()[0])

    wait_for(built, 600, f"the epoch index of {name}")


def _checkpoint(conn: Any) -> None:
    with conn.cursor() as cur:
        cur.execute("CHECKPOINT")


def run(quick: bool) -> list[dict[str, Any]]:
    json_rows = 50_000 if quick else 200_000
    bulk_rows = 200_000 if quick else 1_000_000
    with fresh_database() as (url, _db), server_process(url) as base:
        conn = psycopg2.connect(to_libpq_url(url))
        conn.autocommit = True
        try:
            with http_client(base, timeout=600) as http:
                return [
                    _json_figure(http, conn, json_rows),
                    *_bulk_figures(http, conn, bulk_rows),
                ]
        finally:
            with conn.cursor() as cur:
                cur.execute("DROP TABLE IF EXISTS bench_plain")
            conn.close()


def _json_figure(http: httpx.Client, conn: Any, n: int) -> dict[str, Any]:
    bodies = [
        json.dumps({"ops": [{"op": "insert", "row": _row(i)} for i in range(lo, lo + BATCH)]})
        for lo in range(0, n, BATCH)
    ]
    warm = json.dumps({"ops": [{"op": "insert", "row": _row(-i - 1)} for i in range(BATCH)]})
    runs = []
    for _ in range(REPEATS):
        _fresh_table(http, "bench_json")
        _post(http, "bench_json", warm.encode(), "application/json", BATCH)
        _indexed(conn, "bench_json")  # the batches keep it up, as in any table but a new one
        _checkpoint(conn)
        runs.append(
            _secs(
                lambda: [
                    _post(http, "bench_json", b.encode(), "application/json", BATCH) for b in bodies
                ]
            )
        )
    rate = n / statistics.median(runs)
    note = (
        f"{n:,} rows in batches of {BATCH:,} ops, one request after another, into a table "
        f"of {BATCH:,} rows; median of {REPEATS}; baseline: the target, {JSON_TARGET:,} rows/s"
    )
    return _figure("JSON DML, narrow rows", rate, JSON_TARGET, ">= 1.0", "rows/s", note)


def _bulk_figures(http: httpx.Client, conn: Any, n: int) -> list[dict[str, Any]]:
    data = _csv(n)
    csv_body = b"id,a,b,c\n" + data
    ndjson_body = "".join(
        json.dumps({"op": "insert", "row": _row(i)}) + "\n" for i in range(n)
    ).encode()

    def plain() -> None:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.copy_expert(
                "COPY bench_plain (id, a, b, c) FROM STDIN WITH (FORMAT csv)", io.BytesIO(data)
            )
            cur.execute("COMMIT")

    bulk, indexed, ndjson, copies = [], [], [], []
    for _ in range(REPEATS):
        with conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS bench_plain")
            cur.execute(PLAIN_DDL.format("bench_plain"))
        _fresh_table(http, "bench_csv")
        _checkpoint(conn)
        t0 = time.perf_counter()
        _post(http, "bench_csv", csv_body, "text/csv", n)
        bulk.append(time.perf_counter() - t0)
        _indexed(conn, "bench_csv")
        indexed.append(time.perf_counter() - t0)
        _checkpoint(conn)
        copies.append(_secs(plain))
    for _ in range(REPEATS if n <= 200_000 else 1):
        _fresh_table(http, "bench_ndjson")
        _checkpoint(conn)
        ndjson.append(
            _secs(lambda: _post(http, "bench_ndjson", ndjson_body, "application/x-ndjson", n))
        )
    copy_rate = n / statistics.median(copies)
    size = f"{len(csv_body) / 2**20:.0f} MiB"
    return [
        _figure(
            "bulk CSV body vs plain COPY",
            n / statistics.median(bulk),
            copy_rate,
            ">= 0.7",
            "rows/s",
            f"{n:,} rows in one text/csv body ({size}) into a fresh table, request to answer; "
            "baseline: COPY of the same CSV into a fresh plain table with PRIMARY KEY (id) "
            f"over psycopg2, one transaction; alternating, median of {REPEATS}",
        ),
        _figure(
            "bulk CSV body, until its epoch index is built, vs plain COPY",
            n / statistics.median(indexed),
            copy_rate,
            None,
            "rows/s",
            "the same request, until the leader built the new table's epoch index after it "
            "(CREATE INDEX CONCURRENTLY, after the answer: service/meta/indexer.py); "
            "baseline as above",
        ),
        _figure(
            "bulk NDJSON body vs plain COPY",
            n / statistics.median(ndjson),
            copy_rate,
            None,
            "rows/s",
            f"the same {n:,} rows as application/x-ndjson insert ops (row by row in the "
            f"control plane), median of {len(ndjson)}; baseline as above",
        ),
    ]
