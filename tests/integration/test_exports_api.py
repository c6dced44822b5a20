"""Exports' HTTP side against a real catalog (docs/reading.md#exports): bad requests are
clear 4xx that write nothing; an export pins its epoch from its creation until its
worker reports the end (through the worker protocol, as a worker does), cancelled or
not; GC keeps that epoch readable."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.db import Database
from service.meta.gc import run_gc
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import create, dml, ins, rows
from tests.kit.auth import auth_header


def _pins(db: Database) -> dict[str, int]:
    with db.engine.begin() as c:
        return {h: int(e) for h, e in c.execute(text("SELECT holder, epoch FROM epoch_pins"))}


def _export(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/tables/orders/exports", json={"format": "parquet"} | body)


BAD_PATHS = [
    "out/orders",  # relative
    "file:out/orders",  # relative, with a scheme
    "file://",  # no path at all
    "ftp://host/orders",  # a scheme Spark has no writer for here
    "s3a:/orders",  # no bucket
    "file:/tmp/a/../b",
    "/",
    "/tmp/with\nnewline",
]


def test_bad_exports_are_clear_4xx_and_write_nothing(client: TestClient, db: Database) -> None:
    assert_error(_export(client, path="/tmp/x"), 404, "not_found")
    create(client)
    committed = int(dml(client, [ins(1)]).json()["epoch"])
    for path in BAD_PATHS:
        err = assert_error(_export(client, path=path), 400, "bad_request")
        assert err["details"] == {"field": "path"}, path
    for body in ({"format": "csv", "path": "/tmp/x"}, {"path": "/tmp/x", "extra": 1}, {}):
        r = client.post("/v1/tables/orders/exports", json=body)
        assert_error(r, 422, "validation_error")
    far = str((1 << 62) + 1)
    err = assert_error(_export(client, path="/tmp/x", epoch=far), 409, "conflict")
    assert int(err["details"]["committed_epoch"]) >= committed
    with db.engine.begin() as c:  # as if garbage collection had passed the first epoch
        c.execute(text("UPDATE relations SET gc_epoch = :e"), {"e": committed + 1})
    err = assert_error(_export(client, path="/tmp/x", epoch=str(committed)), 410, "gone")
    assert err["details"] == {"oldest_readable_epoch": str(committed + 1)}
    assert client.get("/v1/exports").json() == {"exports": []}
    assert _pins(db) == {}
    assert_error(client.get("/v1/exports/1"), 404, "not_found")
    assert_error(client.delete("/v1/exports/1"), 404, "not_found")


def test_readers_see_exports_and_only_admins_start_or_cancel_them(client: TestClient) -> None:
    create(client)
    dml(client, [ins(1)])
    reader = auth_header("reader")
    r = client.post(
        "/v1/tables/orders/exports", json={"format": "parquet", "path": "/x"}, headers=reader
    )
    assert_error(r, 403, "forbidden")
    x = _export(client, path="file:///tmp/orders").json()
    assert client.get(f"/v1/exports/{x['id']}", headers=reader).json()["state"] == "queued"
    assert_error(client.delete(f"/v1/exports/{x['id']}", headers=reader), 403, "forbidden")


def _worker(client: TestClient) -> int:
    r = client.post("/v1/workers", json={"name": "w", "capacity": 1})
    assert r.status_code == 201, r.text
    return int(r.json()["worker_id"])


def _report(client: TestClient, w: int, x: int, **body: Any) -> str:
    r = client.post(f"/v1/workers/{w}/exports/{x}", json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["state"])


def test_an_export_pins_its_epoch_until_its_worker_reports_the_end(
    client: TestClient, db: Database
) -> None:
    create(client)
    e1 = dml(client, [ins(1), ins(2)]).json()["epoch"]
    dml(client, [{"op": "update", "row": {"id": 1, "amount": "9"}}])
    w = _worker(client)
    assert client.post(f"/v1/workers/{w}/exports/claim").status_code == 204  # none queued

    # an export at an older epoch: queued and pinned at once
    r = _export(client, path="s3a://lake/orders", epoch=e1)
    assert r.status_code == 202, r.text
    first = r.json()
    assert (first["state"], first["epoch"], first["table"]) == ("queued", e1, "orders")
    assert _pins(db) == {f"export:{first['id']}": int(e1)}

    # garbage collection with no retention stops at the pinned epoch
    run_gc(db, retention_ms=0)
    assert rows(client, epoch=e1)["rows"][0]["amount"] == "1.50"

    task = client.post(f"/v1/workers/{w}/exports/claim").json()
    assert task["id"] == first["id"] and task["epoch"] == int(e1)
    assert task["path"] == "s3a://lake/orders" and task["table_schema"]["primary_key"] == ["id"]
    got = client.get(f"/v1/exports/{first['id']}").json()
    assert got["state"] == "running" and got["worker_id"] == w
    assert _report(client, w, first["id"], state="running") == "running"

    # cancelled while running: the pin stays until the worker says it stopped
    assert client.delete(f"/v1/exports/{first['id']}").json()["state"] == "cancelled"
    assert f"export:{first['id']}" in _pins(db)
    assert _report(client, w, first["id"], state="running") == "cancelled"
    assert _report(client, w, first["id"], state="cancelled") == "cancelled"
    assert _pins(db) == {}
    assert client.delete(f"/v1/exports/{first['id']}").json()["state"] == "cancelled"

    # the default epoch is the latest committed one; succeeded with its rows
    second = _export(client, path="file:/tmp/orders").json()
    assert int(second["epoch"]) > int(e1)
    assert client.post(f"/v1/workers/{w}/exports/claim").json()["id"] == second["id"]
    assert _report(client, w, second["id"], state="succeeded", rows=2) == "succeeded"
    done = client.get(f"/v1/exports/{second['id']}").json()
    assert (done["state"], done["rows"], done["error"]) == ("succeeded", 2, None)
    assert _pins(db) == {}
    assert_error(client.delete(f"/v1/exports/{second['id']}"), 409, "conflict")

    # cancelled while queued: never handed out
    third = _export(client, path="/tmp/orders").json()
    assert client.delete(f"/v1/exports/{third['id']}").json()["state"] == "cancelled"
    assert _pins(db) == {}
    assert client.post(f"/v1/workers/{w}/exports/claim").status_code == 204
    listed = client.get("/v1/exports").json()["exports"]
    assert [x["id"] for x in listed] == [third["id"], second["id"], first["id"]]


@pytest.mark.parametrize("state", ["queued", "running"])
def test_a_report_that_is_not_the_protocols_is_a_422(client: TestClient, state: str) -> None:
    w = _worker(client)
    r = client.post(f"/v1/workers/{w}/exports/1", json={"state": state, "rows": -1})
    assert_error(r, 422, "validation_error")


def test_an_export_whose_worker_is_gone_fails_and_frees_its_epoch(
    client: TestClient, db: Database
) -> None:
    create(client)
    dml(client, [ins(1)])
    w = _worker(client)
    x = _export(client, path="/tmp/orders").json()
    assert client.post(f"/v1/workers/{w}/exports/claim").json()["id"] == x["id"]
    with db.engine.begin() as c:  # its lease lapsed: the leader's next round expires it
        c.execute(text("UPDATE workers SET lease_expires_at = now() - interval '1 s'"))
    dml(client, [ins(2)])  # (a few rounds of the leader)
    deadline_rounds = 200
    for _ in range(deadline_rounds):
        got = client.get(f"/v1/exports/{x['id']}").json()
        if got["state"] != "running":
            break
        dml(client, [{"op": "update", "row": {"id": 2, "amount": "3"}}])
    assert got["state"] == "failed" and "lost" in got["error"]
    assert _pins(db) == {}
