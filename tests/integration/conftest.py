"""Fixtures of the integration tests."""

from __future__ import annotations

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
