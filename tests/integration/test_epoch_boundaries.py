"""Reads at an epoch at the exact edges of what is readable: the committed epoch is
readable and the next one (by a single logical step) is a 409; the GC's epoch is
readable and the one before it a 410 (issue 39: ``epoch > committed + 1 ms`` survived)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.catalog.queries import get_relation
from service.db import Database
from service.meta import gc
from service.meta.loop import MetaLoop
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import create, ins
from tests.kit.meta import committed_epoch


def _rows(client: TestClient, epoch: int) -> object:
    return client.get("/v1/tables/orders/rows", params={"epoch": epoch})


def test_the_committed_and_collected_edges(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual  # no barrier loop: the committed epoch moves only by tick
    create(client)
    for i in range(3):
        r = client.post("/v1/tables/orders/dml", json={"ops": [ins(i)]})
        assert r.status_code == 200, r.text
        loop.tick()
    committed = committed_epoch(db)
    assert committed > 0
    assert _rows(client, committed).status_code == 200
    assert_error(_rows(client, committed + 1), 409, "conflict")
    r = client.get("/v1/tables/orders/rows", params={"epoch": committed + 1})
    assert r.json()["error"]["details"]["committed_epoch"] == str(committed)  # exact in JS

    [result] = gc.run_gc(db, retention_ms=0)
    with db.transaction() as s:
        gc_epoch = get_relation(s, "orders").gc_epoch
    assert 0 < gc_epoch == result.safe_epoch
    assert _rows(client, gc_epoch).status_code == 200
    err = assert_error(_rows(client, gc_epoch - 1), 410, "gone")
    assert err["details"]["oldest_readable_epoch"] == str(gc_epoch)
