"""A second embedded Postgres set up for logical replication (``wal_level = logical``):
the upstream of the CDC connector's tests (``connectors/pg_cdc``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
