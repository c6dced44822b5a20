"""A use case chosen as a deadlock's victim runs again instead of failing its client."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from service.db import Database, retry_deadlocks


def _deadlocking_pair(db: Database, attempts: dict[str, int]) -> dict[str, object]:
    """Two transactions locking two rows in opposite orders, both inside
    ``retry_deadlocks``: Postgres rolls one back, and its retry must then succeed."""
    with db.transaction() as s:
        s.execute(text("CREATE TABLE locks (id int PRIMARY KEY, v int)"))
        s.execute(text("INSERT INTO locks VALUES (1, 0), (2, 0)"))
    both_hold_one = threading.Barrier(2, timeout=30)
    results: dict[str, object] = {}

    @retry_deadlocks
    def move(name: str, first: int, second: int) -> int:
        attempts[name] = attempts.get(name, 0) + 1
        with db.transaction() as s:
            s.execute(text("UPDATE locks SET v = v + 1 WHERE id = :i"), {"i": first})
            if attempts[name] == 1:
                both_hold_one.wait()  # the first attempts meet: a certain deadlock
            s.execute(text("UPDATE locks SET v = v + 1 WHERE id = :i"), {"i": second})
        return attempts[name]

    def run(name: str, first: int, second: int) -> None:
        try:
            results[name] = move(name, first, second)
        except Exception as e:  # reported to the test, not lost in the thread
            results[name] = e

    threads = [
        threading.Thread(target=run, args=("a", 1, 2)),
        threading.Thread(target=run, args=("b", 2, 1)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_the_victim_of_a_deadlock_is_retried_and_both_succeed(db: Database) -> None:
    attempts: dict[str, int] = {}
    results = _deadlocking_pair(db, attempts)
    # both succeed, a victim after a retry: usually one retry, but on a slow machine the
    # victim's retry can take the first row back before the other woke up, and the
    # two deadlock again
    assert all(isinstance(r, int) for r in results.values()), results
    assert max(results.values()) >= 2, results
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT sum(v) FROM locks")).scalar() == 4  # no lost update


def test_other_database_errors_are_not_retried(db: Database) -> None:
    calls = []

    @retry_deadlocks
    def bad() -> None:
        calls.append(1)
        with db.transaction() as s:
            s.execute(text("SELECT 1/0"))

    with pytest.raises(DBAPIError):
        bad()
    assert calls == [1]
