"""The tables API over HTTP on a real Postgres: happy paths and every 4xx."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.api.app import create_app
from service.db import Database
from service.settings import Settings
from tests.integration.test_health_and_errors import assert_error
from tests.kit.auth import api_client

ORDERS = {
    "name": "orders",
    "columns": [
        {"name": "id", "type": "bigint", "nullable": False},
        {"name": "customer", "type": "text"},
        {"name": "amount", "type": "numeric"},
        {"name": "placed", "type": "timestamptz"},
    ],
    "primary_key": ["id"],
}


def create(client: TestClient, spec: dict[str, Any] = ORDERS) -> dict[str, Any]:
    r = client.post("/v1/tables", json=spec)
    assert r.status_code == 201, r.text
    return r.json()


def dml(client: TestClient, ops: list[dict[str, Any]], table: str = "orders") -> Any:
    """DML that returns once its epoch is committed (readable by default)."""
    return client.post(f"/v1/tables/{table}/dml", params={"wait": "true"}, json={"ops": ops})


def ins(i: int, **kw: Any) -> dict[str, Any]:
    return {"op": "insert", "row": {"id": i, "customer": f"c{i}", "amount": "1.50"} | kw}


def rows(client: TestClient, **params: Any) -> dict[str, Any]:
    r = client.get("/v1/tables/orders/rows", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_create_get_list_drop(client: TestClient) -> None:
    t = create(client)
    assert t["name"] == "orders" and t["kind"] == "table"
    assert t["distribution_key"] == ["id"] and t["vnode_count"] == 256
    assert client.get("/v1/tables/orders").json() == t
    assert [x["name"] for x in client.get("/v1/tables").json()["tables"]] == ["orders"]
    assert client.delete("/v1/tables/orders").status_code == 204
    assert_error(client.get("/v1/tables/orders"), 404, "not_found")
    create(client)  # the name is free again


def test_dml_and_reads_at_epochs(client: TestClient) -> None:
    create(client)
    r1 = dml(client, [ins(i) for i in range(1, 6)])
    assert r1.status_code == 200, r1.text
    e1 = int(r1.json()["epoch"])
    assert r1.json()["count"] == 5
    r2 = dml(
        client,
        [
            {"op": "update", "row": {"id": 1, "amount": "9"}},
            {"op": "delete", "row": {"id": 2}},
            ins(6, placed="2024-05-01T10:00:00+02:00"),
            {"op": "update", "row": {"id": 6, "customer": "six"}},
        ],
    )
    e2 = int(r2.json()["epoch"])
    assert e2 > e1
    latest = {r["id"]: r for r in rows(client, limit=1000)["rows"]}
    assert set(latest) == {1, 3, 4, 5, 6}
    assert latest[1] == {"id": 1, "customer": "c1", "amount": "9", "placed": None}
    assert latest[6]["customer"] == "six" and latest[6]["placed"] == "2024-05-01T08:00:00Z"
    old = rows(client, epoch=e1, limit=1000)
    assert old["epoch"] == str(e1)
    assert {r["id"]: r["amount"] for r in old["rows"]} == {i: "1.50" for i in range(1, 6)}


def test_pagination_visits_every_row_once(client: TestClient) -> None:
    create(client)
    assert dml(client, [ins(i) for i in range(250)]).status_code == 200
    seen: list[int] = []
    after = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 40}
        if after:
            params["after"] = after
        page = rows(client, **params)
        seen += [r["id"] for r in page["rows"]]
        pages += 1
        after = page["next"]
        if after is None:
            break
    assert sorted(seen) == list(range(250)) and len(seen) == 250
    assert pages == 7


def test_rejected_batches_write_nothing(client: TestClient, db: Database) -> None:
    create(client)
    epoch = int(dml(client, [ins(1)]).json()["epoch"])
    err = assert_error(dml(client, [ins(2), ins(3, amount="lots")]), 422, "invalid")
    assert err["details"] == {"index": 1} and "ops[1]" in err["message"]
    err = assert_error(dml(client, [ins(2), ins(1)]), 409, "conflict")
    assert err["details"] == {"index": 1, "key": [1]}
    err = assert_error(
        dml(client, [{"op": "update", "row": {"id": 99, "amount": "1"}}]), 409, "conflict"
    )
    assert err["details"]["index"] == 0
    assert_error(dml(client, [{"op": "delete", "row": {"id": 98}}]), 409, "conflict")
    assert_error(dml(client, [{"op": "update", "row": {"amount": "1"}}]), 422, "invalid")
    assert_error(dml(client, [{"op": "insert", "row": {"id": 5, "nope": 1}}]), 422, "invalid")
    assert_error(dml(client, [{"op": "upsert", "row": {"id": 5}}]), 422, "validation_error")
    assert_error(dml(client, []), 422, "validation_error")
    assert_error(dml(client, [ins(1)], table="missing"), 404, "not_found")
    page = rows(client)
    assert [r["id"] for r in page["rows"]] == [1] and int(page["epoch"]) >= epoch
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM store.orders")).scalar() == 1


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (ORDERS | {"name": "Orders"}, "name"),
        (ORDERS | {"name": 'x"; drop table relations; --'}, "name"),
        (ORDERS | {"primary_key": []}, None),
        (ORDERS | {"primary_key": ["nope"]}, "primary_key[0]"),
        (ORDERS | {"distribution_key": ["customer"]}, "distribution_key"),
        (ORDERS | {"columns": [{"name": "id", "type": "money"}]}, "columns[0].type"),
        (
            ORDERS | {"columns": [{"name": "ID", "type": "int"}], "primary_key": ["ID"]},
            "columns[0].name",
        ),
        (ORDERS | {"vnode_count": 0}, None),
        (ORDERS | {"extra": 1}, None),
    ],
)
def test_bad_table_specs_are_422_and_create_nothing(
    client: TestClient, db: Database, spec: dict[str, Any], field: str | None
) -> None:
    err = client.post("/v1/tables", json=spec)
    assert err.status_code == 422, err.text
    if field is not None:
        assert err.json()["error"]["details"]["field"] == field
    assert client.get("/v1/tables").json() == {"tables": []}
    with db.engine.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'store'")).scalar()
    assert n == 0


def test_duplicate_name_is_409(client: TestClient) -> None:
    create(client)
    assert_error(client.post("/v1/tables", json=ORDERS), 409, "conflict")


def test_read_errors(client: TestClient, db: Database) -> None:
    create(client)
    epoch = int(dml(client, [ins(1)]).json()["epoch"])
    future = epoch + (3_600_000 << 16)  # an hour ahead: not committed
    err = assert_error(
        client.get("/v1/tables/orders/rows", params={"epoch": future}), 409, "conflict"
    )
    assert int(err["details"]["committed_epoch"]) >= epoch
    assert_error(
        client.get("/v1/tables/orders/rows", params={"after": "!!garbage"}), 400, "bad_request"
    )
    assert_error(client.get("/v1/tables/orders/rows", params={"limit": 0}), 422, "validation_error")
    assert_error(client.get("/v1/tables/nope/rows"), 404, "not_found")
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE relations SET gc_epoch = :e WHERE name = 'orders'"), {"e": epoch})
    assert_error(client.get("/v1/tables/orders/rows", params={"epoch": epoch - 1}), 410, "gone")
    assert rows(client, epoch=epoch)["rows"][0]["id"] == 1


def test_drop_is_409_while_a_job_reads_the_table(client: TestClient, db: Database) -> None:
    create(client)
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (name, kind, parallelism, columns, upstream_relation_id) "
                "SELECT 'mv1', 'arrangement', 1, '[]', id FROM relations WHERE name = 'orders'"
            )
        )
    err = assert_error(client.delete("/v1/tables/orders"), 409, "conflict")
    assert err["details"] == {"jobs": ["mv1"]}


def test_a_waiting_dml_asks_for_rounds_when_barriers_are_minutes_apart(
    db: Database, settings: Settings
) -> None:
    """With ten-minute barriers ``?wait=true`` would wait out its 30 s and answer 504:
    it asks for main rounds instead, and answers once its epoch is committed."""
    slow = settings.model_copy(update={"barrier_interval_ms": 600_000})
    with api_client(create_app(slow, db)) as client:
        create(client)
        r = dml(client, [ins(1), ins(2)])
        assert r.status_code == 200, r.text
        assert int(rows(client)["epoch"]) >= int(r.json()["epoch"])
        assert sorted(x["id"] for x in rows(client)["rows"]) == [1, 2]
