"""Imports' HTTP side against a real catalog (docs/api.md#imports): bad requests are
clear 4xx that write nothing; a claim creates the import's staging table; the worker's
report that its rows are staged publishes them at one epoch (or fails the import,
writing nothing, on a key that exists or is staged twice); cancel, list, show, and the
sweep of an import whose worker is gone. The worker's side is played through the worker
protocol, the staged rows written as a worker's tasks write them."""

from __future__ import annotations

import decimal
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from backfill_core.schema import TableSchema
from service.db import Database
from state_store.versioned import VersionedTable
from tests.integration.test_exports_api import BAD_PATHS
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_jobs_api import GOOD
from tests.integration.test_tables_api import create, dml, ins, rows
from tests.kit.auth import auth_header
from tests.kit.meta import key_index


def _import(client: TestClient, table: str = "orders", **body: Any) -> Any:
    return client.post(f"/v1/tables/{table}/imports", json={"format": "parquet"} | body)


def _worker(client: TestClient) -> int:
    r = client.post("/v1/workers", json={"name": "w", "capacity": 1})
    assert r.status_code == 201, r.text
    return int(r.json()["worker_id"])


def _report(client: TestClient, w: int, x: int, **body: Any) -> dict[str, Any]:
    r = client.post(f"/v1/workers/{w}/imports/{x}", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _staging_tables(db: Database) -> list[str]:
    with db.engine.begin() as c:
        return list(
            c.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'store' "
                    "AND tablename LIKE '\\_import\\_%' ORDER BY 1"
                )
            ).scalars()
        )


def _stage(db: Database, task: dict[str, Any], ids: list[int]) -> None:
    """Write rows into the staging table as the worker's tasks do: storage layout."""
    schema = TableSchema.from_json(task["table_schema"])
    table = VersionedTable(task["storage_table"], schema)
    conn = psycopg2.connect(db.libpq_url)
    try:
        with conn.cursor() as cur:
            for i in ids:
                row = (i, f"imported {i}", decimal.Decimal("2.25"), None)
                cur.execute(
                    f'INSERT INTO store."{task["staging_table"]}" '
                    "(_vnode, id, _epoch, _deleted, customer, amount, placed) "
                    "VALUES (%s, %s, 0, false, %s, %s, %s)",
                    (table.vnode_of(row), *row),
                )
        conn.commit()
    finally:
        conn.close()


def _row_count(db: Database) -> int:
    with db.engine.begin() as c:
        return int(c.execute(text("SELECT coalesce(sum(delta), 0) FROM row_count_deltas")).scalar())


def test_bad_imports_are_clear_4xx_and_write_nothing(client: TestClient, db: Database) -> None:
    assert_error(_import(client, path="/tmp/x"), 404, "not_found")
    assert_error(_import(client, table="no-such", path="/tmp/x"), 404, "not_found")
    create(client)
    for path in BAD_PATHS:
        err = assert_error(_import(client, path=path), 400, "bad_request")
        assert err["details"] == {"field": "path"}, path
    for body in (
        {"format": "xml", "path": "/tmp/x"},
        {"format": "parquet", "path": ""},
        {"format": "parquet", "path": "/" + "x" * 5000},
        {"format": "parquet"},
        {"path": "/tmp/x"},
        {"format": "csv", "path": "/tmp/x", "extra": 1},
        {"format": ["csv"], "path": "/tmp/x"},
    ):
        r = client.post("/v1/tables/orders/imports", json=body)
        assert_error(r, 422, "validation_error")
    assert client.post("/v1/jobs", json=GOOD).status_code == 202
    err = assert_error(_import(client, table="mv", path="/tmp/x"), 409, "conflict")
    assert "read-only" in err["message"]
    assert client.get("/v1/imports").json() == {"imports": []}
    assert_error(client.get("/v1/imports/1"), 404, "not_found")
    assert_error(client.delete("/v1/imports/1"), 404, "not_found")
    assert _staging_tables(db) == []


def test_readers_see_imports_and_only_admins_start_or_cancel_them(client: TestClient) -> None:
    create(client)
    reader = auth_header("reader")
    r = client.post(
        "/v1/tables/orders/imports", json={"format": "csv", "path": "/x"}, headers=reader
    )
    assert_error(r, 403, "forbidden")
    x = _import(client, path="file:///tmp/orders.csv", format="csv").json()
    assert client.get(f"/v1/imports/{x['id']}", headers=reader).json()["state"] == "queued"
    assert_error(client.delete(f"/v1/imports/{x['id']}", headers=reader), 403, "forbidden")


def test_staged_rows_are_published_at_one_epoch(client: TestClient, db: Database) -> None:
    create(client)
    before = dml(client, [ins(1), ins(2)]).json()["epoch"]
    w = _worker(client)
    assert client.post(f"/v1/workers/{w}/imports/claim").status_code == 204  # none queued
    r = _import(client, path="file:/data/orders", format="json")
    assert r.status_code == 202, r.text
    x = r.json()
    assert (x["state"], x["table"], x["epoch"], x["rows"]) == ("queued", "orders", None, None)

    task = client.post(f"/v1/workers/{w}/imports/claim").json()
    assert (
        task["id"] == x["id"] and task["format"] == "json" and task["path"] == "file:/data/orders"
    )
    assert _staging_tables(db) == [task["staging_table"]]
    got = client.get(f"/v1/imports/{x['id']}").json()
    assert got["state"] == "running" and got["worker_id"] == w
    assert _report(client, w, x["id"], state="running")["state"] == "running"

    _stage(db, task, list(range(10, 60)))
    answer = _report(client, w, x["id"], state="succeeded", rows=50)
    assert answer == {"state": "succeeded", "error": None}
    done = client.get(f"/v1/imports/{x['id']}").json()
    assert (done["state"], done["rows"], done["error"]) == ("succeeded", 50, None)
    epoch = done["epoch"]
    assert int(epoch) > int(before)
    assert _staging_tables(db) == []
    # committed (so is the import's), at or past the import's epoch: a write below it
    # would be hidden by the imported rows
    later = dml(client, [ins(3)]).json()["epoch"]
    assert int(later) >= int(epoch)
    at = {r["id"] for r in rows(client, epoch=epoch, limit=1000)["rows"]}
    assert at == {1, 2, *range(10, 60)} | ({3} if later == epoch else set())
    assert {r["id"] for r in rows(client, epoch=before, limit=1000)["rows"]} == {1, 2}
    with db.engine.begin() as c:  # all of them at that one epoch
        epochs = c.execute(text("SELECT DISTINCT _epoch FROM store.orders WHERE id >= 10"))
        assert [int(e) for e in epochs.scalars()] == [int(epoch)]
    assert _row_count(db) == 53
    assert_error(client.delete(f"/v1/imports/{x['id']}"), 409, "conflict")
    # a second report of the same end (a retry) changes nothing
    assert _report(client, w, x["id"], state="succeeded", rows=50)["state"] == "succeeded"
    assert _row_count(db) == 53


def test_a_first_import_into_an_empty_table_builds_its_key_index_after_the_rows(
    client: TestClient, db: Database
) -> None:
    create(client)
    before = key_index(db)
    w = _worker(client)
    for ids, state in (([5, 6, 7, 6], "failed"), ([5, 6, 7], "succeeded")):
        x = _import(client, path="/data/orders.csv", format="csv").json()
        task = client.post(f"/v1/workers/{w}/imports/claim").json()
        _stage(db, task, ids)
        assert _report(client, w, x["id"], state="succeeded", rows=len(ids))["state"] == state
        if state == "failed":  # twice in the files: taken back, the index as it was
            got = client.get(f"/v1/imports/{x['id']}").json()
            assert got["error_code"] == "duplicate_key" and got["error_details"] == {"key": [6]}
            assert key_index(db) == before and _row_count(db) == 0
    after = key_index(db)
    assert after is not None and after[1] and after != before  # built again, after the rows
    assert_error(client.post("/v1/tables/orders/dml", json={"ops": [ins(6)]}), 409, "conflict")
    dml(client, [ins(8)])  # committed, and the import's epoch before it
    assert {r["id"] for r in rows(client, limit=1000)["rows"]} == {5, 6, 7, 8}


@pytest.mark.parametrize("clash", ["existing", "duplicate"])
def test_a_key_that_exists_or_is_staged_twice_fails_the_import_writing_nothing(
    client: TestClient, db: Database, clash: str
) -> None:
    create(client)
    e = dml(client, [ins(1), ins(2)]).json()["epoch"]
    w = _worker(client)
    x = _import(client, path="/data/orders.csv", format="csv").json()
    task = client.post(f"/v1/workers/{w}/imports/claim").json()
    _stage(db, task, [5, 6, 2] if clash == "existing" else [5, 6, 7, 6])
    answer = _report(client, w, x["id"], state="succeeded", rows=3 if clash == "existing" else 4)
    assert answer["state"] == "failed"
    got = client.get(f"/v1/imports/{x['id']}").json()
    if clash == "existing":
        assert got["error_code"] == "key_exists" and got["error_details"] == {"key": [2]}
    else:
        assert got["error_code"] == "duplicate_key" and got["error_details"] == {"key": [6]}
    assert "exists" in got["error"] or "more than once" in got["error"]
    assert got["rows"] is None and got["epoch"] is None
    assert _staging_tables(db) == []
    dml(client, [ins(3)])
    assert {r["id"] for r in rows(client, limit=1000)["rows"]} == {1, 2, 3}
    assert {r["id"] for r in rows(client, epoch=e)["rows"]} == {1, 2}
    assert _row_count(db) == 3


def test_a_deleted_key_may_be_imported_again(client: TestClient, db: Database) -> None:
    create(client)
    dml(client, [ins(1), ins(2)])
    dml(client, [{"op": "delete", "row": {"id": 2}}])
    w = _worker(client)
    x = _import(client, path="/data/orders.csv", format="csv").json()
    task = client.post(f"/v1/workers/{w}/imports/claim").json()
    _stage(db, task, [2, 3])
    assert _report(client, w, x["id"], state="succeeded", rows=2)["state"] == "succeeded"
    dml(client, [ins(4)])
    got = {r["id"]: r["customer"] for r in rows(client)["rows"]}
    assert got == {1: "c1", 2: "imported 2", 3: "imported 3", 4: "c4"}
    assert _row_count(db) == 4


def test_cancel_failure_and_a_lost_worker_drop_the_staging_table(
    client: TestClient, db: Database
) -> None:
    create(client)
    w = _worker(client)
    # cancelled while queued: never handed out
    queued = _import(client, path="/data/a").json()
    assert client.delete(f"/v1/imports/{queued['id']}").json()["state"] == "cancelled"
    assert client.post(f"/v1/workers/{w}/imports/claim").status_code == 204

    # cancelled while running: the staging table stays until the worker stopped
    running = _import(client, path="/data/b").json()
    task = client.post(f"/v1/workers/{w}/imports/claim").json()
    _stage(db, task, [1])
    assert client.delete(f"/v1/imports/{running['id']}").json()["state"] == "cancelled"
    assert _staging_tables(db) == [task["staging_table"]]
    assert _report(client, w, running["id"], state="running")["state"] == "cancelled"
    assert _report(client, w, running["id"], state="cancelled")["state"] == "cancelled"
    assert _staging_tables(db) == []
    # a staged report after the cancel publishes nothing
    assert _report(client, w, running["id"], state="succeeded", rows=1)["state"] == "cancelled"

    # failed on the worker: its error, code and details, and no staging table
    failing = _import(client, path="/data/c", format="csv").json()
    client.post(f"/v1/workers/{w}/imports/claim")
    where = {"file": "file:/data/c/1.csv", "line": 3, "why": "cannot read"}
    r = _report(
        client,
        w,
        failing["id"],
        state="failed",
        error="file:/data/c/1.csv, line 3: cannot read",
        error_code="bad_row",
        details=where,
    )
    assert r["state"] == "failed"
    got = client.get(f"/v1/imports/{failing['id']}").json()
    assert (got["error_code"], got["error_details"]) == ("bad_row", where)
    assert _staging_tables(db) == []

    # its worker gone: the leader fails it and drops its staging table
    lost = _import(client, path="/data/d").json()
    client.post(f"/v1/workers/{w}/imports/claim")
    with db.engine.begin() as c:
        c.execute(text("UPDATE workers SET lease_expires_at = now() - interval '1 s'"))
    for _ in range(200):  # (rounds of the leader: each DML waits for one)
        got = client.get(f"/v1/imports/{lost['id']}").json()
        if got["state"] != "running":
            break
        dml(client, [ins(100 + _)])
    assert got["state"] == "failed" and got["error_code"] == "worker_lost"
    assert _staging_tables(db) == []
    listed = client.get("/v1/imports").json()["imports"]
    assert [x["id"] for x in listed] == [lost["id"], failing["id"], running["id"], queued["id"]]
    assert rows(client)["rows"] == [] or all(r["id"] >= 100 for r in rows(client)["rows"])


@pytest.mark.parametrize("state", ["queued", "running"])
def test_a_report_that_is_not_the_protocols_is_a_422(client: TestClient, state: str) -> None:
    w = _worker(client)
    body: dict[str, Any] = {"state": state, "rows": -1}
    assert_error(client.post(f"/v1/workers/{w}/imports/1", json=body), 422, "validation_error")
