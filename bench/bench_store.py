"""State store figures, each against a baseline measured in the same run (medians of 3).

1. write: ``VersionedTable.write`` of N rows (50k batches, one transaction) vs COPY of the
   same rows, serialized with the same ``copy_line`` inside the timing, into a plain table
   with ``PRIMARY KEY (id)``; fresh tables each run, store and plain runs alternating.
2. snapshot read of those rows (after VACUUM ANALYZE and a warm-up): ``snapshot()`` over 8
   vnode ranges in pages of 10k via ``after`` vs ``SELECT * FROM plain ORDER BY id`` on a
   server-side cursor read with ``fetchmany(10k)``.
3. change log: k = 2,000 changes at one epoch on a small and a big table; ``change_log``
   over all vnodes (median of 5) should cost O(k), not O(table).
"""

from __future__ import annotations

import io
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import psycopg2
from psycopg2 import sql

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType, TableSchema
from service.embedded_pg import EmbeddedPostgres, to_libpq_url
from state_store.encoding import copy_encoders, copy_line
from state_store.versioned import SCHEMA, VersionedTable

KEYS = ("name", "value", "baseline", "ratio", "target", "unit", "passed", "note")
BATCH, PAGE, K, REPEATS = 50_000, 10_000, 2_000, 3
RANGES = [(lo, lo + 32) for lo in range(0, 256, 32)]
E1, E2 = 1 << 16, 2 << 16
COLUMNS = [
    Column("id", ColumnType.BIGINT),
    Column("a", ColumnType.INT),
    Column("b", ColumnType.TEXT),
    Column("c", ColumnType.DOUBLE),
    Column("d", ColumnType.NUMERIC),
]
TABLE_SCHEMA = TableSchema.build(COLUMNS, ["id"])
PLAIN_DDL = (
    "CREATE TABLE {} (id bigint, a integer, b text, c double precision, d numeric, "
    "PRIMARY KEY (id))"
)


def _row(i: int, gen: int = 0) -> tuple[Any, ...]:
    return (i, (i * 7 + gen) % 100_000, f"row-{i:09d}-{gen}-xyz", i / 4 + gen, Decimal(i) / 100)


@contextmanager
def _connection(tag: str) -> Iterator[Any]:
    """DATABASE_URL if set (this run's tables are dropped at the end), else embedded."""
    url = os.environ.get("DATABASE_URL")
    with tempfile.TemporaryDirectory() as tmp:
        pg = None if url else EmbeddedPostgres(tmp, stop_on_exit=True)
        conn = psycopg2.connect(to_libpq_url(url) if url else to_libpq_url(pg.start()))
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            conn.commit()
            yield conn
        finally:
            if url:
                conn.rollback()
                with conn.cursor() as cur:
                    for t in ("plain", "store", "cl_small", "cl_big"):
                        drop = sql.SQL("DROP TABLE IF EXISTS {}")
                        cur.execute(drop.format(sql.Identifier(SCHEMA, f"{tag}_{t}")))
                conn.commit()
            conn.close()
            if pg is not None:
                pg.stop()


def _outside_txn(conn: Any, stmt: sql.Composable) -> None:
    """VACUUM / CHECKPOINT; a refused CHECKPOINT (not superuser) is skipped."""
    conn.commit()
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(stmt)
    except psycopg2.errors.InsufficientPrivilege:
        pass
    finally:
        conn.autocommit = False


class _LastRead(psycopg2.extensions.cursor):  # type: ignore[misc]
    """Remembers the last read it ran, without the settings sent along with it."""

    last_read: bytes = b""

    def execute(self, query: Any, vars: Any = None) -> None:
        super().execute(query, vars)
        statements = [x for x in self.query.split(b"; ") if x.strip()]
        if not statements[-1].lstrip().upper().startswith(b"SET"):
            self.last_read = statements[-1]


def _secs(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _plan(cur: Any, query: bytes | str, analyze: bool = True) -> str:
    """A compact plan, ``Node[index](child, ...)``, plus the execution time if analyzed."""
    q = query.decode() if isinstance(query, bytes) else query
    cur.execute(f"EXPLAIN ({'ANALYZE, ' if analyze else ''}FORMAT JSON) {q}")
    raw = cur.fetchone()[0]
    top = (raw if isinstance(raw, list) else json.loads(raw))[0]

    def walk(n: dict[str, Any]) -> str:
        name = n["Node Type"] + (f"[{n['Index Name']}]" if "Index Name" in n else "")
        kids = ", ".join(walk(k) for k in n.get("Plans", []))
        return name + (f"({kids})" if kids else "")

    return walk(top["Plan"]) + (f" {top['Execution Time']:.0f} ms" if analyze else "")


def _figure(name: str, value: float, base: float, unit: str, target: str, note: str) -> dict:
    """``target`` is ``">= x"`` or ``"<= x"`` on the ratio value / baseline."""
    ratio, bound = value / base, float(target[3:])
    ok = ratio >= bound if target.startswith(">=") else ratio <= bound
    d = 1 if unit == "ms" else 0
    figures = (name, round(value, d), round(base, d), round(ratio, 3), target, unit, ok, note)
    return dict(zip(KEYS, figures, strict=True))


def _write_and_read(conn: Any, n: int, tag: str) -> list[dict[str, Any]]:
    rows = [_row(i) for i in range(n)]
    versions = [Version(r) for r in rows]
    encs = copy_encoders([c.type for c in COLUMNS])
    plain = sql.Identifier(SCHEMA, f"{tag}_plain")
    store = VersionedTable(f"{tag}_store", TABLE_SCHEMA)

    def write_store() -> None:
        with conn.cursor() as cur:
            for off in range(0, n, BATCH):
                store.write(cur, E1, versions[off : off + BATCH])
        conn.commit()

    def write_plain() -> None:
        copy = sql.SQL("COPY {} (id, a, b, c, d) FROM STDIN").format(plain)
        with conn.cursor() as cur:
            for off in range(0, n, BATCH):
                buf = io.StringIO()
                for r in rows[off : off + BATCH]:
                    buf.write(copy_line(encs, r))
                buf.seek(0)
                cur.copy_expert(copy, buf)
        conn.commit()

    ws, wp = [], []  # alternating runs on fresh tables, so drift hits both
    for _ in range(REPEATS):
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(plain))
            store.drop(cur)
            cur.execute(sql.SQL(PLAIN_DDL).format(plain))
            store.create(cur)
        _outside_txn(conn, sql.SQL("CHECKPOINT"))
        ws.append(_secs(write_store))
        _outside_txn(conn, sql.SQL("CHECKPOINT"))
        wp.append(_secs(write_plain))
    w_store, w_plain = n / statistics.median(ws), n / statistics.median(wp)
    rows.clear()
    versions.clear()
    for t in (plain, store.ident):
        _outside_txn(conn, sql.SQL("VACUUM ANALYZE {}").format(t))

    def read_store() -> int:
        got = 0
        with conn.cursor() as cur:
            for rng in RANGES:
                after = None
                while True:
                    page = store.snapshot(cur, E1, rng, after=after, limit=PAGE)
                    got += len(page)
                    if len(page) < PAGE:
                        break
                    after = (page[-1][0], store.key_of(page[-1][1]))
        conn.commit()
        return got

    def read_plain() -> int:
        got = 0
        with conn.cursor(name=f"scan_{uuid.uuid4().hex[:8]}") as cur:
            cur.itersize = PAGE
            cur.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(plain))
            while batch := cur.fetchmany(PAGE):
                got += len(batch)
        conn.commit()
        return got

    assert read_store() == read_plain() == n  # and warms the cache for both
    rs, rp = [], []
    for _ in range(REPEATS):
        rs.append(_secs(read_store))
        rp.append(_secs(read_plain))
    r_store, r_plain = n / statistics.median(rs), n / statistics.median(rp)
    with conn.cursor(cursor_factory=_LastRead) as cur:
        store.snapshot(cur, E1, RANGES[0], after=(3, (n // 2,)), limit=PAGE)  # a mid-range page
        cur.execute("SET LOCAL enable_sort = off")  # as the read runs it
        p_store = _plan(cur, cur.last_read)
        declare = sql.SQL("DECLARE c CURSOR FOR SELECT * FROM {} ORDER BY id").format(plain)
        p_plain = _plan(cur, declare.as_string(cur), analyze=False)
        size = "pg_total_relation_size(%s::regclass) >> 20"
        cur.execute(f"SELECT {size}, {size}", [store.ident.as_string(cur), plain.as_string(cur)])
        mb_store, mb_plain = cur.fetchone()
        store.drop(cur)
        cur.execute(sql.SQL("DROP TABLE {}").format(plain))
    conn.commit()
    w_note = (
        f"{n:,} rows, {BATCH:,}/batch, 1 txn, serialization timed for both; baseline COPY into "
        f"a plain table with PRIMARY KEY (id); size store {mb_store} MB vs plain {mb_plain} MB"
    )
    r_note = (
        f"8 vnode ranges x pages of {PAGE:,} via after, one version per key; baseline named "
        f"cursor fetchmany({PAGE:,}); store page plan: {p_store}; plain plan: {p_plain}"
    )
    return [
        _figure("store write", w_store, w_plain, "rows/s", ">= 0.7", w_note),
        _figure("store snapshot read", r_store, r_plain, "rows/s", ">= 0.5", r_note),
    ]


def _change_log_ms(conn: Any, n: int, name: str) -> tuple[float, str]:
    table = VersionedTable(name, TABLE_SCHEMA)
    rng = random.Random(42)
    picked = rng.sample(range(n), 1_500)
    changes = [Version(_row(i, 1)) for i in picked[:1_000]]  # updates
    changes += [Version(_row(i), deleted=True) for i in picked[1_000:]]  # deletes
    changes += [Version(_row(i, 1)) for i in range(n, n + K - len(changes))]  # inserts
    with conn.cursor() as cur:
        table.create(cur)
        for off in range(0, n, BATCH):
            table.write(cur, E1, [Version(_row(i)) for i in range(off, min(n, off + BATCH))])
        table.write(cur, E2, changes)
    conn.commit()
    _outside_txn(conn, sql.SQL("VACUUM ANALYZE {}").format(table.ident))
    with conn.cursor() as cur:
        assert len(table.change_log(cur, E2, (0, 256))) == K  # and warms the cache
        times = [_secs(lambda: table.change_log(cur, E2, (0, 256))) for _ in range(5)]
        plan = _plan(cur, cur.query)
        table.drop(cur)
    conn.commit()
    return statistics.median(times) * 1000, plan


def run(quick: bool) -> list[dict[str, Any]]:
    n = 100_000 if quick else 1_000_000
    small, big = (200_000, 400_000) if quick else (100_000, 2_000_000)
    tag = f"bench_{uuid.uuid4().hex[:8]}"
    with _connection(tag) as conn:
        out = _write_and_read(conn, n, tag)
        t_small, _ = _change_log_ms(conn, small, f"{tag}_cl_small")
        t_big, plan = _change_log_ms(conn, big, f"{tag}_cl_big")
    note = (
        f"k={K:,} (1,000 updates, 500 deletes, 500 inserts) at one epoch, {big:,} vs {small:,} "
        f"rows, median of 5; big plan: {plan}"
    )
    out.append(_figure("change log O(k), big/small", t_big, t_small, "ms", "<= 1.5", note))
    return out


if __name__ == "__main__":
    for fig in run(quick=True):
        print(fig)
