"""An import's publication holds no barrier back (issue 36): its rows go at an epoch
reserved ahead of the open one, barriers go on committing while its INSERT runs, and
the rows appear together at the first committed epoch at or past it; later DML of the
table is not hidden by them (docs/architecture.md#the-workers, imports)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.db import Database
from tests.integration.test_imports_api import _import, _report, _stage, _worker
from tests.integration.test_tables_api import create, dml, rows
from tests.kit.meta import committed_epoch

IMPORTED = list(range(10, 60))


def _until(what: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() >= deadline:
            return got
        time.sleep(0.01)


def _ids_at(client: TestClient, epoch: int) -> set[int]:
    return {r["id"] for r in rows(client, epoch=str(epoch), limit=1000)["rows"]}


def _waiting_on(db: Database, table: str) -> bool:
    with db.engine.begin() as c:
        return bool(
            c.execute(
                text(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c "
                    "ON c.oid = l.relation WHERE c.relname = :t AND NOT l.granted)"
                ),
                {"t": table},
            ).scalar()
        )


def _staged_import(client: TestClient, db: Database, ids: list[int]) -> tuple[int, int, str]:
    """An import of ``ids`` whose rows are staged: (worker, import, staging table)."""
    w = _worker(client)
    x = _import(client, path="file:/data/orders", format="csv").json()["id"]
    task = client.post(f"/v1/workers/{w}/imports/claim").json()
    _stage(db, task, ids)
    return w, x, task["staging_table"]


def test_barriers_commit_while_the_publication_runs_and_its_rows_appear_at_once(
    client: TestClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the epoch reserved well ahead (50 rows at 10 rows/s: 5 s) of the barriers that
    # go on meanwhile (every 20 ms)
    monkeypatch.setattr("service.meta.imports.PUBLISH_ROWS_PER_S", 10, raising=False)
    create(client)
    w, x, staging = _staged_import(client, db, IMPORTED)
    blocker = psycopg2.connect(db.libpq_url)  # the INSERT ... SELECT waits for it
    answers: list[dict[str, Any]] = []
    try:
        with blocker.cursor() as cur:
            cur.execute(f'LOCK TABLE store."{staging}" IN ACCESS EXCLUSIVE MODE')
        publishing = threading.Thread(
            target=lambda: answers.append(_report(client, w, x, state="succeeded", rows=50))
        )
        publishing.start()
        assert _until(lambda: _waiting_on(db, staging)), "the publication never waited"
        seen = [committed_epoch(db)]
        for _ in range(3):  # barriers go on committing
            e = _until(lambda: committed_epoch(db) > seen[-1] and committed_epoch(db), 10.0)
            assert e, "no epoch committed while the publication ran"
            seen.append(e)
        assert publishing.is_alive() and not answers
        assert not _ids_at(client, seen[-1]) & set(IMPORTED)
    finally:
        blocker.commit()
        blocker.close()
    publishing.join(60)
    assert answers == [{"state": "succeeded", "error": None}]
    epoch = int(client.get(f"/v1/imports/{x}").json()["epoch"])
    assert epoch > seen[-1]
    assert _until(lambda: committed_epoch(db) >= epoch, 60.0)
    assert _ids_at(client, epoch) == set(IMPORTED)
    with db.engine.begin() as c:
        committed = [
            int(e)
            for e in c.execute(
                text(
                    "SELECT prev_epoch FROM barriers WHERE graph_id = 1 AND state = 'committed' "
                    "AND prev_epoch > :after ORDER BY prev_epoch"
                ),
                {"after": seen[-1]},
            ).scalars()
        ]
        at = c.execute(text("SELECT DISTINCT _epoch FROM store.orders")).scalars()
        assert [int(e) for e in at] == [epoch]
    before = [e for e in committed if e < epoch]
    first = min(e for e in committed if e >= epoch)
    if before:  # the last committed epoch before it has none of them; the first at it all
        assert not _ids_at(client, before[-1]) & set(IMPORTED)
    assert _ids_at(client, first) == set(IMPORTED)


def test_dml_right_after_an_import_is_not_hidden_by_its_rows(
    client: TestClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (10 rows at 5 rows/s: the import's epoch 2 s ahead of the open one)
    monkeypatch.setattr("service.meta.imports.PUBLISH_ROWS_PER_S", 5, raising=False)
    create(client)
    w, x, _ = _staged_import(client, db, list(range(10, 20)))
    assert _report(client, w, x, state="succeeded", rows=10)["state"] == "succeeded"
    imported_at = int(client.get(f"/v1/imports/{x}").json()["epoch"])
    ops = [
        {"op": "update", "row": {"id": 10, "customer": "changed"}},
        {"op": "delete", "row": {"id": 11}},
        {"op": "insert", "row": {"id": 1, "customer": "new", "amount": "1.00"}},
    ]
    r = dml(client, ops)
    assert r.status_code == 200, r.text
    at = int(r.json()["epoch"])
    assert at >= imported_at
    got = {row["id"]: row for row in rows(client, limit=1000)["rows"]}
    assert set(got) == {1, *range(10, 20)} - {11}
    assert got[10]["customer"] == "changed" and got[12]["customer"] == "imported 12"
    # and a key the import added is a key that exists
    r = client.post(
        "/v1/tables/orders/dml",
        json={"ops": [{"op": "insert", "row": {"id": 12, "customer": "x", "amount": "1.00"}}]},
    )
    assert r.status_code == 409, r.text


def test_a_barrier_waits_for_a_held_epoch_only_and_drops_a_passed_one(db: Database) -> None:
    from sqlalchemy.exc import OperationalError

    from backfill_core.epoch import Epoch
    from service.meta import epochs

    def release(s: Session, closing: int) -> None:  # as the main graph's barrier does
        s.execute(text(epochs.RELEASE_HOLDS), {"g": 1, "closing": closing})

    now = 1_800_000_000_000
    first = epochs.reserve_hold(db, "import:1", 0, 5_000, now)
    assert first == Epoch.from_unix_ms(now + 5_000)
    later = epochs.reserve_hold(db, "import:2", first, 5_000, now)
    assert later > first  # above the floor given (a table's last import's epoch)
    with db.transaction() as held:
        assert epochs.hold_kept(held, "import:1", first)
        with db.transaction() as barrier:  # one closing an epoch at or past it waits
            barrier.execute(text("SET LOCAL lock_timeout = '100ms'"))
            with pytest.raises(OperationalError):
                release(barrier, first)
        with db.transaction() as barrier:  # one closing an earlier epoch does not
            release(barrier, first - 1)
        epochs.drop_hold(held, "import:1")
    with db.transaction() as barrier:  # a hold nobody holds (a rolled-back one): dropped
        release(barrier, later)
    with db.transaction() as s:
        assert not epochs.hold_kept(s, "import:2", later)  # passed: reserve again
        assert s.execute(text("SELECT count(*) FROM epoch_holds")).scalar() == 0
