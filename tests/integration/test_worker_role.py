"""The workers' database role (``backfill db create-worker-role``, service/worker_role.py):
it reads and writes what workers do (the store, the fences, the work tables) and cannot
read tokens or change the catalog."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg2
import pytest
from psycopg2 import errorcodes, sql
from sqlalchemy.engine import make_url

from service.cli import main as backfill
from service.db import Database
from service.worker_role import create_worker_role

pytestmark = pytest.mark.db


@pytest.fixture
def worker_role(db: Database) -> Iterator[str]:
    """A new role's name; the role (cluster-wide) is dropped after the test."""
    role = f"w_{uuid.uuid4().hex[:12]}"
    yield role
    conn = psycopg2.connect(db.libpq_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cur.fetchone():
            cur.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            cur.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    conn.close()


def connect_as(db: Database, role: str):  # type: ignore[no-untyped-def]
    # the embedded server trusts its unix socket: the role's name is enough to log in
    url = make_url(db.url).set(username=role, password=None)
    return psycopg2.connect(url.render_as_string(hide_password=False).replace("+psycopg2", ""))


def refused(conn, statement: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    except psycopg2.Error as e:
        conn.rollback()
        assert e.pgcode == errorcodes.INSUFFICIENT_PRIVILEGE, e.pgcode
        return True
    conn.rollback()
    return False


def owner_runs(db: Database, *statements: str) -> None:
    conn = psycopg2.connect(db.libpq_url)
    with conn, conn.cursor() as cur:
        for s in statements:
            cur.execute(s)
    conn.close()


def test_the_worker_role_reaches_the_store_and_work_tables_only(
    db: Database,
    worker_role: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    owner_runs(
        db,
        "CREATE TABLE store.upstream (k bigint PRIMARY KEY)",
        "INSERT INTO store.upstream VALUES (1)",
    )
    monkeypatch.setenv("DATABASE_URL", db.url)
    assert backfill(["db", "create-worker-role", worker_role]) == 0
    assert f"worker role {worker_role} created" in capsys.readouterr().out
    conn = connect_as(db, worker_role)
    try:
        # tokens and the catalog's control: refused
        assert refused(conn, "SELECT * FROM api_tokens")
        assert refused(conn, "UPDATE jobs SET state = state")
        assert refused(conn, "UPDATE graphs SET recovery_seq = recovery_seq + 1")
        assert refused(conn, "DELETE FROM actors")
        assert refused(conn, "CREATE TABLE store.mine (k int)")
        # what workers do: read the fences, the upstream; write the work tables and MVs
        for ok in (
            "SELECT recovery_seq FROM graphs WHERE id = 1 FOR SHARE",
            "SELECT id FROM actors",
            "SELECT * FROM split_progress",
            "SELECT k FROM store.upstream",
            "INSERT INTO work_queues (token) VALUES ('t')",
            "UPDATE work_queues SET taken = taken + 1 WHERE token = 't'",
            "DELETE FROM work_queues WHERE token = 't'",
            "CREATE TEMP TABLE staging (k bigint)",
        ):
            assert not refused(conn, ok), ok
        # a view the control plane creates after the grants: writable by the workers too
        owner_runs(db, "CREATE TABLE store.mv (k bigint PRIMARY KEY)")
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO store.mv SELECT k FROM store.upstream")
            cur.execute("DELETE FROM store.mv")
    finally:
        conn.close()


def test_creating_the_role_again_changes_nothing_but_the_password(
    db: Database, worker_role: str
) -> None:
    conn = psycopg2.connect(db.libpq_url)
    try:
        assert create_worker_role(conn, worker_role) is True
        assert create_worker_role(conn, worker_role, password="a-secret") is False
        with conn.cursor() as cur:
            cur.execute(
                "SELECT rolsuper, rolcreaterole, rolcreatedb, rolcanlogin, rolpassword IS NOT NULL"
                " FROM pg_authid WHERE rolname = %s",
                [worker_role],
            )
            assert cur.fetchone() == (False, False, False, True, True)
    finally:
        conn.close()


def test_without_a_name_the_role_is_the_worker_urls_user_with_its_password(
    db: Database,
    worker_role: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DATABASE_URL", db.url)
    monkeypatch.delenv("BACKFILL_WORKER_DATABASE_URL", raising=False)
    assert backfill(["db", "create-worker-role"]) == 2
    assert "BACKFILL_WORKER_DATABASE_URL" in capsys.readouterr().err
    theirs = make_url(db.url).set(username=worker_role, password="a-secret")
    monkeypatch.setenv("BACKFILL_WORKER_DATABASE_URL", theirs.render_as_string(False))
    assert backfill(["db", "create-worker-role"]) == 0
    assert f"worker role {worker_role} created" in capsys.readouterr().out
    conn = psycopg2.connect(db.libpq_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [worker_role])
            (stored,) = cur.fetchone()
            # the password the URL gives: SCRAM-hashed, never stored as given
            assert stored and "a-secret" not in stored
    finally:
        conn.close()
    worker_conn = connect_as(db, worker_role)
    try:
        assert not refused(worker_conn, "SELECT id FROM actors"), "granted as by name"
    finally:
        worker_conn.close()


def test_registration_hands_workers_their_own_url(db: Database, fresh_db_url: str) -> None:
    from service.api.app import create_app
    from service.settings import Settings
    from tests.kit.auth import api_client

    theirs = "postgresql+psycopg2://backfill_worker:pw@db.example:5432/backfill?sslmode=require"
    for configured, expected in ((theirs, theirs.replace("+psycopg2", "")), (None, db.libpq_url)):
        settings = Settings(
            database_url=fresh_db_url,
            worker_database_url=configured,
            spawn_embedded_worker=False,
            run_barrier_loop=False,
        )
        with api_client(create_app(settings, db), role="worker") as c:
            r = c.post("/v1/workers", json={"name": "w", "capacity": 1})
            assert r.status_code == 201, r.text
            assert r.json()["database_url"] == expected
