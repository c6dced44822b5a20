"""Statements prepared once per connection (``service.db.Prepared``): the barrier loop's
rounds run them by name."""

from __future__ import annotations

import psycopg2
import pytest

from service.db import Database, Prepared

TWO = Prepared(
    "test_two", {"a": "bigint", "b": "text"}, "SELECT :a + 1", "SELECT :b || '!', :a, :b"
)


def test_a_statement_is_prepared_once_per_connection_and_outlives_a_rollback(
    db: Database,
) -> None:
    conn = psycopg2.connect(db.libpq_url)
    try:
        cur = conn.cursor()
        first = TWO.ready(cur)
        assert first == TWO.text and "PREPARE" not in first
        cur.execute(first, {"a": 41, "b": "x"})
        assert cur.fetchall() == [("x!", 41, "x")]
        conn.rollback()  # a prepared statement is the session's, not the transaction's
        cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'test_two_%'")
        assert cur.fetchone() == (2,)
        cur.execute(TWO.ready(cur), {"a": 1, "b": "y"})
        assert cur.fetchall() == [("y!", 1, "y")]
        cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'test_two_%'")
        assert cur.fetchone() == (2,)
    finally:
        conn.close()
    other = psycopg2.connect(db.libpq_url)  # a connection of its own prepares anew
    try:
        cur = other.cursor()
        cur.execute(TWO.ready(cur), {"a": 2, "b": "z"})
        assert cur.fetchall() == [("z!", 2, "z")]
    finally:
        other.close()


def test_a_statement_prepared_in_a_failed_transaction_is_prepared_again(db: Database) -> None:
    """A PREPARE that failed (its transaction had failed before) is not counted: the next
    transaction prepares it."""
    conn = psycopg2.connect(db.libpq_url)
    try:
        cur = conn.cursor()
        with pytest.raises(psycopg2.errors.DivisionByZero):
            cur.execute("SELECT 1 / 0")
        with pytest.raises(psycopg2.errors.InFailedSqlTransaction):
            TWO.ready(cur)
        conn.rollback()
        cur.execute(TWO.ready(cur), {"a": 3, "b": "w"})
        assert cur.fetchall() == [("w!", 3, "w")]
    finally:
        conn.close()


def test_a_prepared_read_alone_is_retried_once_on_a_new_connection_after_its_died(
    db: Database,
) -> None:
    """``rows_alone`` runs on the readers' pool, which has no pre-ping: a connection found
    dead (Postgres restarted, or the backend ended) is dropped and the read retried."""
    one = Prepared("test_pid", {}, "SELECT pg_backend_pid()")
    [(pid,)] = db.rows_alone(one, {})
    admin = psycopg2.connect(db.libpq_url)
    admin.autocommit = True
    try:
        for _ in range(2 * 8):  # every pooled reader: whichever the next read gets
            admin.cursor().execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend' AND pid = %s",
                (pid,),
            )
            [(again,)] = db.rows_alone(one, {})
            assert again != pid
            pid = again
    finally:
        admin.close()
