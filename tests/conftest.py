"""Shared fixtures: a real Postgres (TEST_DATABASE_URL, or one embedded server per session)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
import pytest
from hypothesis import Phase
from hypothesis import settings as hypothesis_settings
from sqlalchemy.engine import make_url

from service import migrate
from service.db import Database
from service.embedded_pg import EmbeddedPostgres, to_libpq_url, to_sqlalchemy_url
from service.settings import Settings
from tests.kit.auth import use_test_tokens

# auth stays on everywhere: every Settings() (and every child process) has the test tokens
use_test_tokens()
# workers start Spark at their first large read, as before the warm-up: dozens of test
# workers (killed and restarted ones too) would each start it, on a 2-core machine; the
# warm-up has a test of its own (tests/e2e/test_spark_path.py)
os.environ.setdefault("BACKFILL_SPARK_WARM_UP", "false")

# CI runs must be reproducible: a fixed example sequence there, fresh exploration locally
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

# `make mutation` runs the covering tests once per mutant: a fixed, shorter example sequence,
# and no shrinking (a failure is all it needs to know; HYPOTHESIS_PROFILE=mutation)
MUTATION_MAX_EXAMPLES = int(os.environ.get("MUTATION_MAX_EXAMPLES", "60"))
hypothesis_settings.register_profile(
    "mutation",
    max_examples=MUTATION_MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
)
if os.environ.get("HYPOTHESIS_PROFILE") == "mutation":
    hypothesis_settings.load_profile("mutation")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under the mutation profile, cap the examples of tests that ask for more explicitly
    (their @settings would otherwise override the profile)."""
    if os.environ.get("HYPOTHESIS_PROFILE") != "mutation":
        return
    for item in items:
        test = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        # where @given keeps the settings it reads at each call
        chosen = getattr(test, "_hypothesis_internal_use_settings", None)
        if chosen is not None and chosen.max_examples > MUTATION_MAX_EXAMPLES:
            test._hypothesis_internal_use_settings = hypothesis_settings(  # type: ignore[union-attr]
                chosen, max_examples=MUTATION_MAX_EXAMPLES
            )


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SQLAlchemy URL of a server where tests may create databases."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield to_sqlalchemy_url(url)
        return
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg"), stop_on_exit=True)
    yield server.start()
    server.stop()


def _admin(url: str):  # type: ignore[no-untyped-def]
    conn = psycopg2.connect(to_libpq_url(url))
    conn.autocommit = True
    return conn


@contextmanager
def _database(server_url: str, name: str, template: str | None = None) -> Iterator[str]:
    """Database ``name`` on the server (a copy of ``template``), dropped afterwards: its
    URL."""
    conn = _admin(server_url)
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


@pytest.fixture(scope="session")
def migrated_template(pg_server_url: str) -> Iterator[str]:
    """A database migrated once, that the ``db`` fixture's databases are copies of
    (``CREATE DATABASE ... TEMPLATE``: a migration per test took a few minutes of CI)."""
    name = f"t_template_{uuid.uuid4().hex[:8]}"
    with _database(pg_server_url, name) as url:
        database = Database(url)
        migrate.upgrade(database.engine)
        database.close()  # a template may have no connection when it is copied
        yield name


@pytest.fixture
def fresh_db_url(pg_server_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database of its own for one test, dropped afterwards: empty, or migrated when
    the test uses ``db`` (the same database)."""
    template = (
        request.getfixturevalue("migrated_template") if "db" in request.fixturenames else None
    )
    with _database(pg_server_url, f"t_{uuid.uuid4().hex[:16]}", template) as url:
        yield url


@pytest.fixture
def db(fresh_db_url: str) -> Iterator[Database]:
    """A migrated catalog in a fresh database (a copy of ``migrated_template``)."""
    database = Database(fresh_db_url)
    yield database
    database.close()


@pytest.fixture
def settings(fresh_db_url: str) -> Settings:
    # fake workers call in only when the test does: on a loaded machine a test step can
    # outlast the default 10 s lease, and a worker declared dead fails the test for nothing
    return Settings(
        database_url=fresh_db_url,
        spawn_embedded_worker=False,
        barrier_interval_ms=20,
        worker_lease_ms=60_000,
    )


@pytest.fixture
def client(db: Database, settings: Settings) -> Iterator[object]:
    from service.api.app import create_app
    from tests.kit.auth import api_client

    with api_client(create_app(settings, db)) as c:
        yield c


@pytest.fixture
def kafka() -> Iterator[object]:
    """A Kafka-protocol broker (librdkafka's mock cluster), alive for the test."""
    from tests.kit.kafka import mock_kafka

    with mock_kafka() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def logical_pg_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A libpq URL of a second embedded Postgres with ``wal_level = logical`` (an upstream
    for CDC), for the session."""
    from tests.kit.pg_logical import logical_postgres

    with logical_postgres(tmp_path_factory.mktemp("pglogical")) as url:
        yield url


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
