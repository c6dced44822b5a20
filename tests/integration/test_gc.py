"""GC through the control plane: pins hold it back; reads at readable epochs never change."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.db import Database
from service.meta import gc
from service.usecases import tables, verify
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import create, dml, ins, rows


def _versions(db: Database) -> int:
    from sqlalchemy import text

    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM store.orders")).scalar_one())


def test_gc_respects_pins_and_keeps_pinned_reads_exact(client: TestClient, db: Database) -> None:
    create(client)
    e1 = int(dml(client, [ins(i) for i in range(10)]).json()["epoch"])
    snap1 = rows(client, epoch=e1, limit=100)["rows"]
    gc.pin(db, "orders", "job:test", e1)
    epochs = [e1]
    for round_ in range(3):
        ops = [{"op": "update", "row": {"id": i, "amount": str(round_)}} for i in range(10)]
        epochs.append(int(dml(client, ops).json()["epoch"]))
    epochs.append(int(dml(client, [{"op": "delete", "row": {"id": 0}}]).json()["epoch"]))
    snaps = {e: rows(client, epoch=e, limit=100)["rows"] for e in epochs}
    before = _versions(db)

    results = gc.run_gc(db, retention_ms=0)
    assert [r.safe_epoch for r in results] == [e1]  # held back by the pin
    assert _versions(db) == before  # nothing at or below e1 is shadowed yet
    for e in epochs:
        assert rows(client, epoch=e, limit=100)["rows"] == snaps[e]
    assert snaps[e1] == snap1

    gc.unpin(db, "orders", "job:test")
    results = gc.run_gc(db, retention_ms=0)
    assert results[0].safe_epoch >= epochs[-1]  # barriers have committed later epochs too
    assert results[0].removed_versions == before - 9  # nine live keys keep one version each
    assert rows(client, limit=100)["rows"] == snaps[epochs[-1]]
    assert_error(client.get("/v1/tables/orders/rows", params={"epoch": e1}), 410, "gone")


def test_retention_keeps_recent_epochs(client: TestClient, db: Database) -> None:
    create(client)
    dml(client, [ins(1)])
    dml(client, [{"op": "update", "row": {"id": 1, "amount": "2"}}])
    assert [r.removed_versions for r in gc.run_gc(db, retention_ms=3_600_000)] == [0]
    assert _versions(db) == 2


def test_safe_epoch() -> None:
    assert gc.safe_epoch(10 << 16, 3, None) == 7 << 16
    assert gc.safe_epoch(10 << 16, 3, 5 << 16) == 5 << 16
    assert gc.safe_epoch(2 << 16, 5, None) == 0


def _gc_after_the_epoch_check(
    db: Database, monkeypatch: pytest.MonkeyPatch, module: Any
) -> list[int]:
    """Run a real GC (in its own transactions) right after ``module`` has checked the
    epoch it reads against gc_epoch, and before it reads; the versions it removed."""
    removed: list[int] = []
    readable_epoch = tables.readable_epoch

    def gc_meanwhile(*args: Any) -> int:
        epoch = readable_epoch(*args)
        removed.extend(r.removed_versions for r in gc.run_gc(db, retention_ms=0))
        return epoch

    monkeypatch.setattr(module, "readable_epoch", gc_meanwhile)
    return removed


def test_a_page_of_rows_at_an_epoch_sees_one_snapshot_while_gc_runs(
    client: TestClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GC that commits after a read checked its epoch, and before it read the rows,
    removes none of the versions the read needs (the chaos harness found ``verify``
    missing an upstream key deleted after the epoch it read at)."""
    create(client)
    e1 = int(dml(client, [ins(i) for i in range(10)]).json()["epoch"])
    dml(client, [{"op": "delete", "row": {"id": 0}}])
    removed = _gc_after_the_epoch_check(db, monkeypatch, tables)
    page = tables.read_rows(db, "orders", e1, 100, None)
    assert sum(removed) == 2  # the key's insert and its tombstone
    assert [r["id"] for r in page.rows if r["id"] == 0] == [0]


def test_verify_sees_one_snapshot_while_gc_runs(
    client: TestClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(client)
    e1 = int(dml(client, [ins(i) for i in range(10)]).json()["epoch"])
    dml(client, [{"op": "delete", "row": {"id": 0}}])
    body = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "arrangement"}
    job = client.post("/v1/jobs", json=body).json()["id"]  # no worker: the MV stays empty
    removed = _gc_after_the_epoch_check(db, monkeypatch, verify)
    assert verify.verify(db, job, e1).expected_rows == 10
    assert sum(removed) == 2
