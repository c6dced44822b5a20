"""Every limit on a request, once each: a clear 4xx in the error format, nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import text

from service.api.app import create_app
from service.db import Database
from service.settings import Settings
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import ORDERS, create
from tests.kit.auth import api_client

JOB = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "arrangement"}


def count(db: Database, sql: str) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_request_body_size(db: Database, fresh_db_url: str) -> None:
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False, max_body_bytes=4096)
    big = ORDERS | {"name": "big", "columns": [*ORDERS["columns"], {"name": "x" * 5000}]}
    with api_client(create_app(settings, db)) as c:
        # refused from its Content-Length, before it is read or parsed
        err = assert_error(c.post("/v1/tables", json=big), 413, "payload_too_large")
        assert err["details"] == {"max_bytes": 4096}
        # a chunked body (no Content-Length) is cut off once it grows past the limit

        def chunks() -> Iterator[bytes]:
            yield b'{"name": "big", "columns": ['
            for _ in range(100):
                yield b'{"name": "c", "type": "int"},' * 10

        r = c.post("/v1/tables", content=chunks(), headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers
        assert_error(r, 413, "payload_too_large")
        small = b'{"name": "small", "columns": [{"name": "id", "type": "int"}], '

        def small_chunks() -> Iterator[bytes]:
            yield small
            yield b'"primary_key": ["id"]}'

        r = c.post(
            "/v1/tables", content=small_chunks(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 201, r.text
        assert c.post("/v1/tables", json=ORDERS).status_code == 201  # under the limit
    assert count(db, "SELECT count(*) FROM relations") == 2


def test_the_default_body_limit_is_8_mib(client: TestClient) -> None:
    create(client)
    ops = [{"op": "insert", "row": {"id": i, "customer": "c" * 900}} for i in range(9000)]
    assert_error(client.post("/v1/tables/orders/dml", json={"ops": ops}), 413, "payload_too_large")


def test_dml_batch_size(client: TestClient, db: Database) -> None:
    create(client)
    ops = [{"op": "insert", "row": {"id": i}} for i in range(10_001)]
    err = assert_error(
        client.post("/v1/tables/orders/dml", json={"ops": ops}), 422, "validation_error"
    )
    assert err["details"][0]["loc"] == ["body", "ops"]
    assert "10000" in err["details"][0]["msg"]
    assert count(db, "SELECT count(*) FROM store.orders") == 0
    r = client.post("/v1/tables/orders/dml", json={"ops": ops[:10_000]})
    assert r.status_code == 200 and r.json()["count"] == 10_000


def test_page_sizes(client: TestClient) -> None:
    create(client)
    for url, most in (("/v1/tables/orders/rows", 1000), ("/v1/jobs", 500)):
        err = assert_error(client.get(url, params={"limit": most + 1}), 422, "validation_error")
        assert err["details"][0]["loc"] == ["query", "limit"]
        assert client.get(url, params={"limit": most}).status_code in (200, 409)
    assert_error(
        client.get("/v1/tables/orders/rows", params={"after": "x" * 4097}), 422, "validation_error"
    )


def test_parallelism_and_vnode_count(client: TestClient, db: Database) -> None:
    assert_error(
        client.post("/v1/tables", json=ORDERS | {"vnode_count": 32769}), 422, "validation_error"
    )
    create(client, ORDERS | {"vnode_count": 4})
    assert_error(client.post("/v1/jobs", json=JOB | {"parallelism": 257}), 422, "validation_error")
    # at most one actor per vnode of the upstream
    err = assert_error(client.post("/v1/jobs", json=JOB | {"parallelism": 5}), 422, "invalid")
    assert err["details"] == {"field": "parallelism"} and "1..4" in err["message"]
    job = client.post("/v1/jobs", json=JOB | {"parallelism": 4}).json()
    assert_error(
        client.patch(f"/v1/jobs/{job['id']}", json={"parallelism": 257}), 422, "validation_error"
    )
    assert_error(client.patch(f"/v1/jobs/{job['id']}", json={"parallelism": 5}), 422, "invalid")
    assert count(db, "SELECT parallelism FROM jobs") == 4


def test_identifier_length(client: TestClient, db: Database) -> None:
    longest = "t" * 63
    long_col = {"name": "c" * 63, "type": "int", "nullable": False}
    spec = ORDERS | {"name": longest, "columns": [long_col], "primary_key": [long_col["name"]]}
    assert client.post("/v1/tables", json=spec).status_code == 201
    too_long: list[dict[str, Any]] = [
        spec | {"name": "t" * 64},
        spec | {"name": "u", "columns": [long_col | {"name": "c" * 64}]},
    ]
    for bad in too_long:
        assert_error(client.post("/v1/tables", json=bad), 422, "validation_error")
    job = JOB | {"upstream": {"table": longest}}
    assert_error(client.post("/v1/jobs", json=job | {"name": "j" * 64}), 422, "validation_error")
    assert_error(
        client.post("/v1/jobs", json=job | {"columns": ["c" * 64]}), 422, "validation_error"
    )
    assert count(db, "SELECT count(*) FROM relations") == 1


def test_rate_limits_fit_the_catalog(client: TestClient, db: Database) -> None:
    """A rate limit past a Postgres integer was a 500."""
    create(client)
    assert_error(client.post("/v1/jobs", json=JOB | {"rate_limit": 2**31}), 422, "validation_error")
    job = client.post("/v1/jobs", json=JOB | {"rate_limit": 2**31 - 1})
    assert job.status_code == 202, job.text
    jid = job.json()["id"]
    assert_error(
        client.patch(f"/v1/jobs/{jid}", json={"rate_limit": 2**31}), 422, "validation_error"
    )
    source = {
        "name": "s",
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "t"},
        "columns": [{"name": "a", "type": "int"}],
        "rate_limit": 2**31,
    }
    assert_error(client.post("/v1/sources", json=source), 422, "validation_error")


def test_filter_size_and_depth(client: TestClient, db: Database) -> None:
    create(client)
    leaf: dict[str, Any] = {"col": "id", "op": ">", "value": 1}
    deep = leaf
    for _ in range(33):
        deep = {"not": deep}
    for flt in (deep, {"or": [leaf] * 1001}):
        err = assert_error(client.post("/v1/jobs", json=JOB | {"filter": flt}), 422, "invalid")
        assert "too large or too deeply nested" in err["message"]
    assert count(db, "SELECT count(*) FROM jobs") == 0


def test_unknown_query_parameters_are_refused(client: TestClient, db: Database) -> None:
    """A misspelt filter must not silently mean no filter (the document's query objects
    allow no other parameters)."""
    assert client.get("/v1/jobs", params={"state": "creating"}).status_code == 200
    err = assert_error(client.get("/v1/jobs", params={"stat": "creating"}), 422, "validation_error")
    assert "stat" in str(err)
    assert_error(
        client.get("/v1/workers", params={"include_gone": "1", "x": "1"}), 422, "validation_error"
    )
    assert client.get("/healthz", params={"probe": "1"}).status_code == 422
