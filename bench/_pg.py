"""A fresh, migrated catalog database on a private embedded Postgres, for one bench."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
from sqlalchemy.engine import make_url

from service import migrate
from service.db import Database
from service.embedded_pg import EmbeddedPostgres, to_libpq_url, to_sqlalchemy_url


@contextmanager
def fresh_database(server: str | None = None) -> Iterator[tuple[str, Database]]:
    """Yields (SQLAlchemy URL, Database) of a new database on ``server`` (a Postgres URL;
    default: an embedded Postgres of its own); everything is dropped afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(tmp) if server is None else None
        server_url = pg.start() if pg is not None else to_sqlalchemy_url(server)
        name = f"bench_{uuid.uuid4().hex[:8]}"
        admin = psycopg2.connect(to_libpq_url(server_url))
        admin.autocommit = True
        admin.cursor().execute(f'CREATE DATABASE "{name}"')
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        db = Database(url)
        try:
            migrate.upgrade(db.engine)
            yield url, db
        finally:
            db.close()
            admin.cursor().execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            admin.close()
            if pg is not None:
                pg.stop()
