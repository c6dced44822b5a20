"""A worker's writes commit without waiting for the WAL flush; the collects that vouch
for them go out only after ``flush_wal`` (``spark_workers.runtime``). Without it a
collect that outlived a crash of Postgres committed an epoch whose writes were lost
(chaos seed 742049, bench/HISTORY.md 2026-11-29 00:20)."""

from __future__ import annotations

import psycopg2

from service.db import Database
from state_store.options import flush_wal, worker_dsn


def _lsns(cur: object) -> tuple[int, int]:
    cur.execute(  # type: ignore[attr-defined]
        "SELECT pg_current_wal_flush_lsn() - '0/0', pg_current_wal_insert_lsn() - '0/0'"
    )
    flushed, inserted = cur.fetchone()  # type: ignore[attr-defined]
    return int(flushed), int(inserted)


def test_flush_wal_makes_every_write_committed_before_it_durable(db: Database) -> None:
    admin = psycopg2.connect(db.libpq_url)
    admin.autocommit = True
    acur = admin.cursor()
    # the WAL writer would flush an asynchronous commit within a few hundred ms itself
    acur.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
    acur.execute("SELECT pg_reload_conf()")
    worker = psycopg2.connect(worker_dsn(db.libpq_url))
    try:
        with worker.cursor() as cur:
            cur.execute("CREATE TABLE durability_probe (x int)")
        worker.commit()
        written = None
        for attempt in range(20):  # until no other commit flushed past ours meanwhile
            with worker.cursor() as cur:
                cur.execute("INSERT INTO durability_probe VALUES (%s)", [attempt])
            worker.commit()  # asynchronous: not flushed yet
            flushed, inserted = _lsns(acur)
            if flushed < inserted:
                written = inserted
                break
        assert written is not None, "the worker's commits were flushed at once"
        flush_wal(worker)
        flushed, _ = _lsns(acur)
        assert flushed >= written
    finally:
        worker.close()
        acur.execute("ALTER SYSTEM RESET wal_writer_delay")
        acur.execute("SELECT pg_reload_conf()")
        admin.close()
