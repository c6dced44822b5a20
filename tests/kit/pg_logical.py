"""A second embedded Postgres set up for logical replication (``wal_level = logical``):
the upstream of the CDC connector's tests (``connectors/pg_cdc``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg2

from service.embedded_pg import EmbeddedPostgres, to_libpq_url

LOGICAL_SETTINGS = {"wal_level": "logical", "max_replication_slots": "8", "max_wal_senders": "8"}


@contextmanager
def logical_postgres(data_dir: Path) -> Iterator[str]:
    """Start an embedded server under ``data_dir``, switch it to logical replication
    (the settings need a restart) and yield its libpq URL; stop it on exit."""
    server = EmbeddedPostgres(data_dir, stop_on_exit=True)
    try:
        url = to_libpq_url(server.start())
        conn = psycopg2.connect(url)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                for name, value in LOGICAL_SETTINGS.items():
                    # names and values are this module's constants
                    cur.execute(f"ALTER SYSTEM SET {name} = %s", [value])
        finally:
            conn.close()
        server.restart("fast")
        yield url
    finally:
        server.stop()


def random_change(cur: Any, rng: random.Random, keys: int, v: int) -> None:
    """One upstream transaction on ``t (id int PRIMARY KEY, v int)`` with keys below
    ``keys``, drawn from ``rng``: an insert (an update on a conflict), an update, a
    delete, a key change, or a transaction of several statements."""
    k, k2 = rng.randrange(1, keys), rng.randrange(1, keys)
    op = rng.choice(["ins", "upd", "del", "key", "txn"])
    if op == "ins":
        cur.execute(
            "INSERT INTO t VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v",
            [k, v],
        )
    elif op == "upd":
        cur.execute("UPDATE t SET v = %s WHERE id = %s", [v, k])
    elif op == "del":
        cur.execute("DELETE FROM t WHERE id = %s", [k])
    elif op == "key":
        cur.execute(
            "UPDATE t SET id = %s WHERE id = %s AND NOT EXISTS (SELECT FROM t WHERE id = %s)",
            [k2, k, k2],
        )
    else:
        cur.execute("BEGIN")
        cur.execute("UPDATE t SET v = v + 1 WHERE id BETWEEN %s AND %s", [k, k + 20])
        cur.execute("DELETE FROM t WHERE id = %s", [k2])
        cur.execute("COMMIT")
