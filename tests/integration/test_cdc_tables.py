"""CDC tables through the API and a worker's actor (issue 36): a table of ours mirroring
an upstream Postgres table (``logical_pg_url``, a second embedded server with
``wal_level = logical``). The create mirrors the schema and writes nothing on a 4xx; DML
into it is refused; the drop takes its slot and publication along; and the actor
(``spark_workers.cdc_actor``), driven with the meta by hand, writes like DML so every
committed epoch's table equals the upstream at the LSN recorded with it, across a
restore, while the slot confirms no further than that LSN."""

from __future__ import annotations

from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.catalog.models import CdcTable, Relation
from service.db import Database
from service.embedded_pg import to_libpq_url
from service.meta.loop import MetaLoop
from tests.integration.test_pg_cdc import run

pytestmark = pytest.mark.db

DEADLINE_S = 60.0


def _pg(dsn: str, table: str = "public.orders", **extra: Any) -> dict[str, Any]:
    return {"name": "orders", "postgres": {"dsn": dsn, "table": table, **extra}}


def _upstream_objects(url: str) -> tuple[list[str], list[str]]:
    """The upstream's slots (of its database) and publications."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
            )
            slots = sorted(r[0] for r in cur.fetchall())
            cur.execute("SELECT pubname FROM pg_publication")
            pubs = sorted(r[0] for r in cur.fetchall())
    finally:
        conn.close()
    return slots, pubs


def _nothing_written(db: Database, url: str) -> None:
    with db.transaction() as s:
        assert s.execute(select(Relation.name)).scalars().all() == []
        assert s.execute(select(CdcTable.relation_id)).scalars().all() == []
    assert _upstream_objects(url) == ([], [])


@pytest.fixture
def api(manual: tuple[TestClient, MetaLoop]) -> TestClient:
    return manual[0]


def test_create_mirrors_the_schema_refuses_dml_and_drop_takes_slot_and_publication(
    api: TestClient, db: Database, upstream: str
) -> None:
    run(
        upstream,
        "CREATE TABLE orders (id bigint, region text, amount numeric(10, 2) NOT NULL, "
        "at timestamptz, PRIMARY KEY (region, id))",
    )
    r = api.post("/v1/tables", json=_pg(upstream))
    assert r.status_code == 201, r.text
    body = r.json()
    assert [(c["name"], c["type"], c["nullable"]) for c in body["columns"]] == [
        ("id", "bigint", False),
        ("region", "text", False),
        ("amount", "numeric", False),
        ("at", "timestamptz", True),
    ]
    assert body["primary_key"] == ["region", "id"]
    pg = body["postgres"]
    assert pg["table"] == "public.orders" and pg["job_id"] is not None
    assert "dsn" not in pg and "password" not in r.text.lower()
    assert api.get("/v1/tables/orders").json()["postgres"] == pg
    slots, pubs = _upstream_objects(upstream)
    assert slots == [pg["slot"]] and pubs == [pg["publication"]]
    # its job: kind cdc, one actor; it cannot be dropped, nor rescaled, on its own
    job = api.get(f"/v1/jobs/{pg['job_id']}").json()
    assert job["kind"] == "cdc"
    r = api.delete(f"/v1/jobs/{pg['job_id']}")
    assert r.status_code == 409 and r.json()["error"]["code"] == "job_is_cdc", r.text
    r = api.patch(f"/v1/jobs/{pg['job_id']}", json={"parallelism": 2})
    assert r.status_code == 409 and r.json()["error"]["code"] == "job_is_cdc", r.text
    # its rows change only upstream
    ops = {"ops": [{"op": "insert", "row": {"id": 1, "region": "eu", "amount": "1.00"}}]}
    r = api.post("/v1/tables/orders/dml", json=ops)
    assert r.status_code == 409 and r.json()["error"]["code"] == "table_is_mirrored", r.text
    r = api.post(
        "/v1/tables/orders/dml",
        content=b"id,region,amount\n1,eu,1.00\n",
        headers={"Content-Type": "text/csv"},
    )
    assert r.status_code == 409 and r.json()["error"]["code"] == "table_is_mirrored", r.text
    # a second one of the same name: 409, and nothing more upstream
    assert api.post("/v1/tables", json=_pg(upstream)).status_code == 409
    assert _upstream_objects(upstream) == ([pg["slot"]], [pg["publication"]])
    # drop: the job, the table, the slot and the publication the service made
    assert api.delete("/v1/tables/orders").status_code == 204
    assert api.get(f"/v1/jobs/{pg['job_id']}").status_code == 404
    _nothing_written(db, upstream)


def test_named_publication_and_slot_are_used_and_left(
    api: TestClient, db: Database, upstream: str
) -> None:
    run(
        upstream,
        "CREATE TABLE orders (id int PRIMARY KEY, v text)",
        "ALTER TABLE orders REPLICA IDENTITY FULL",
        "CREATE PUBLICATION mine FOR TABLE orders",
        "SELECT pg_create_logical_replication_slot('mine_"
        + upstream.rsplit("/", 1)[1][:12]
        + "', 'pgoutput')",
    )
    slot = "mine_" + upstream.rsplit("/", 1)[1][:12]
    r = api.post("/v1/tables", json=_pg(upstream, publication="mine", slot=slot))
    assert r.status_code == 201, r.text
    assert r.json()["postgres"] | {"host": "", "job_id": 0} == {
        "host": "",
        "job_id": 0,
        "table": "public.orders",
        "publication": "mine",
        "slot": slot,
    }
    assert api.delete("/v1/tables/orders").status_code == 204
    assert _upstream_objects(upstream) == ([slot], ["mine"])  # the user's: left


@pytest.mark.parametrize(
    ("ddl", "table", "extra", "status", "code", "details"),
    [
        ("CREATE TABLE orders (id int, v text)", "orders", {}, 422, "cdc_no_primary_key", {}),
        (
            "CREATE TABLE orders (id int PRIMARY KEY, spot point)",
            "orders",
            {},
            422,
            "cdc_unsupported_column",
            {"column": "spot", "type": "point"},
        ),
        ("", "public.missing", {}, 422, "cdc_table_not_found", {"field": "postgres.table"}),
        ("", "not a table!", {}, 422, "invalid", {"field": "postgres.table"}),
        (
            "CREATE TABLE orders (id int PRIMARY KEY)",
            "orders",
            {"publication": "nope"},
            422,
            "cdc_publication_mismatch",
            {"field": "postgres.publication"},
        ),
        (
            "CREATE TABLE orders (id int PRIMARY KEY)",
            "orders",
            {"slot": "nope"},
            422,
            "invalid",
            {"field": "postgres.slot"},
        ),
    ],
)
def test_a_bad_upstream_is_a_clear_4xx_that_writes_nothing(
    api: TestClient,
    db: Database,
    upstream: str,
    ddl: str,
    table: str,
    extra: dict[str, Any],
    status: int,
    code: str,
    details: dict[str, Any],
) -> None:
    if ddl:
        run(upstream, ddl)
    r = api.post("/v1/tables", json=_pg(upstream, table, **extra))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, r.text
    assert details.items() <= err["details"].items(), r.text
    _nothing_written(db, upstream)


def test_wal_level_privilege_unreachable_and_body_shapes(
    api: TestClient, db: Database, upstream: str, pg_server_url: str
) -> None:
    # the catalog's own server: wal_level = replica
    r = api.post("/v1/tables", json=_pg(to_libpq_url(pg_server_url), "public.relations"))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "cdc_logical_replication_off"
    assert "wal_level = logical" in r.json()["error"]["message"]
    # a role that may not replicate
    run(upstream, "CREATE TABLE orders (id int PRIMARY KEY)")
    role = "r" + upstream.rsplit("/", 1)[1].split("?")[0][-10:]
    run(upstream, f"CREATE ROLE {role} LOGIN PASSWORD 'sekrit-pw'")
    base, _, query = upstream.partition("?")
    scheme, rest = base.split("://", 1)
    hostpart = rest.split("@", 1)[-1]
    as_role = f"{scheme}://{role}:sekrit-pw@{hostpart}" + (f"?{query}" if query else "")
    r = api.post("/v1/tables", json=_pg(as_role, "public.orders"))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "cdc_insufficient_privilege"
    assert "sekrit-pw" not in r.text
    run(upstream, f"DROP ROLE {role}")
    # nobody there
    r = api.post(
        "/v1/tables",
        json=_pg("postgresql://u:sekrit-pw@127.0.0.1:1/none?connect_timeout=2", "orders"),
    )
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "cdc_upstream_unreachable"
    assert "sekrit-pw" not in r.text
    # not a DSN: not echoed
    r = api.post("/v1/tables", json=_pg("host='unterminated sekrit-pw", "orders"))
    assert r.status_code == 422 and "sekrit-pw" not in r.text, r.text
    # exactly one of the two shapes
    both = _pg(upstream) | {"columns": [{"name": "id", "type": "int"}], "primary_key": ["id"]}
    r = api.post("/v1/tables", json=both)
    assert r.status_code == 422 and "either" in r.text, r.text
    r = api.post("/v1/tables", json={"name": "orders"})
    assert r.status_code == 422 and "postgres" in r.text, r.text
    _nothing_written(db, upstream)
