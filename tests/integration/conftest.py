"""Fixtures of the integration tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient

from service import migrate
from service.db import Database
from service.meta.loop import MetaLoop
from tests.kit.meta import manual_api


@pytest.fixture
def manual(db: Database, fresh_db_url: str) -> Iterator[tuple[TestClient, MetaLoop]]:
    """The API without its barrier loop, and that loop to drive by hand (``tick``)."""
    with manual_api(db, fresh_db_url) as api:
        yield api


@pytest.fixture(scope="module")
def conn(pg_server_url: str) -> Iterator[Any]:
    """A psycopg2 connection to a migrated catalog, shared by a module's examples."""
    db = Database(pg_server_url)
    migrate.upgrade(db.engine)
    c = psycopg2.connect(db.libpq_url)
    yield c
    c.close()
    db.close()


CDC_DEADLINE_S = 30.0


@pytest.fixture
def upstream(logical_pg_url: str) -> Iterator[str]:
    """A fresh database on the logical server; its slots and itself dropped after."""
    name = f"cdc_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(logical_pg_url)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    base, _, query = logical_pg_url.partition("?")
    yield f"{base.rsplit('/', 1)[0]}/{name}?{query}"
    with admin.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE database = %s AND active_pid IS NOT NULL",
            [name],
        )
        deadline = time.monotonic() + CDC_DEADLINE_S
        while True:
            cur.execute(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                [name],
            )
            slots = cur.fetchall()
            if not slots:
                break
            for slot, pid in slots:
                if pid is None:
                    cur.execute("SELECT pg_drop_replication_slot(%s)", [slot])
            assert time.monotonic() < deadline, slots
        cur.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    admin.close()
