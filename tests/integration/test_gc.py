"""GC through the control plane: pins hold it back; reads at readable epochs never change."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.db import Database
from service.meta import gc
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import create, dml, ins, rows


def _versions(db: Database) -> int:
    from sqlalchemy import text

    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM store.orders")).scalar_one())


def test_gc_respects_pins_and_keeps_pinned_reads_exact(client: TestClient, db: Database) -> None:
    create(client)
    e1 = dml(client, [ins(i) for i in range(10)]).json()["epoch"]
    snap1 = rows(client, epoch=e1, limit=100)["rows"]
    gc.pin(db, "orders", "job:test", e1)
    epochs = [e1]
    for round_ in range(3):
        ops = [{"op": "update", "row": {"id": i, "amount": str(round_)}} for i in range(10)]
        epochs.append(dml(client, ops).json()["epoch"])
    epochs.append(dml(client, [{"op": "delete", "row": {"id": 0}}]).json()["epoch"])
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
