"""Hostile input over HTTP on a real Postgres: every answer is a clear 4xx (or a success
that stored exactly what was sent), never a 5xx, and nothing is half-written."""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from sqlalchemy import text

from backfill_core.protocol import ErrorCode
from service.api.app import create_app
from service.db import Database
from service.settings import Settings
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import ORDERS
from tests.kit.auth import api_client
from tests.kit.kafka import MockKafka
from tests.kit.meta import scalar

JSON = {"content-type": "application/json"}
DOCS = {
    "name": "docs",
    "columns": [
        {"name": "k", "type": "text", "nullable": False},
        {"name": "body", "type": "text"},
        {"name": "doc", "type": "jsonb"},
    ],
    "primary_key": ["k"],
}
SQLISH = [
    "x; DROP TABLE jobs",
    "Robert'); DROP TABLE relations; --",
    "a' OR '1'='1",
    'double "quoted"',
    "back\\slash\\",
    "$$dollar$$ $tag$ $1",
    "%s %(name)s {0} %%",
    "/* comment */ -- comment",
    "E'\\\\x00'",
    "\\copy store.orders to '/tmp/x'",
]
UNICODE = [
    "emoji \U0001f600\U0001f469\u200d\U0001f469\u200d\U0001f467",
    "RTL \u202eevil\u202c \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
    "combining e\u0301 and zero\u200bwidth",
    "CJK \u6f22\u5b57 and fullwidth \uff21",
    "\ufeffBOM and \U0010ffff last code point",
]


@pytest.fixture
def hostile(db: Database, settings: Settings) -> Iterator[TestClient]:
    """The API, answering crashes with its 500 (so a test sees them as responses)."""
    with api_client(create_app(settings, db), raise_server_exceptions=False) as c:
        yield c


def ok(resp: Any, *statuses: int) -> Any:
    assert resp.status_code < 500, resp.text
    assert resp.status_code in statuses, resp.text
    return resp


def refused(resp: Any) -> dict[str, Any]:
    """A 4xx in the error format."""
    assert 400 <= resp.status_code < 500, resp.text
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] and body["error"]["message"]
    return body["error"]


def rows(client: TestClient, table: str) -> list[dict[str, Any]]:
    r = ok(client.get(f"/v1/tables/{table}/rows", params={"limit": 1000}), 200)
    return list(r.json()["rows"])


def dml(client: TestClient, ops: list[dict[str, Any]], table: str = "docs") -> Any:
    return client.post(f"/v1/tables/{table}/dml", params={"wait": "true"}, json={"ops": ops})


def assert_consistent(db: Database) -> None:
    """Catalog rows and store tables agree: no table without its relation or the other
    way round, every view belongs to a job, and every job has its view and actors."""
    with db.engine.connect() as conn:
        catalog = set(conn.execute(text("SELECT storage_table FROM relations")).scalars())
        store = set(
            conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'store'")
            ).scalars()
        )
        assert catalog == store
        orphan_views = conn.execute(
            text(
                "SELECT count(*) FROM relations r WHERE r.kind = 'mv' AND NOT EXISTS "
                "(SELECT 1 FROM jobs j WHERE j.mv_relation_id = r.id)"
            )
        ).scalar_one()
        jobs_without = conn.execute(
            text(
                "SELECT count(*) FROM jobs j WHERE j.mv_relation_id IS NULL OR NOT EXISTS "
                "(SELECT 1 FROM actors a WHERE a.job_id = j.id)"
            )
        ).scalar_one()
        assert (orphan_views, jobs_without) == (0, 0)
        # the catalog itself is intact
        for table in ("jobs", "relations", "sources", "idempotency_keys"):
            conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


# --- names -------------------------------------------------------------------------


def test_hostile_names_are_refused_and_create_nothing(hostile: TestClient, db: Database) -> None:
    ok(hostile.post("/v1/tables", json=ORDERS), 201)
    for name in [*SQLISH, *UNICODE, "nul\x00name", "a" * 64, "a" * 100_000, "", "Orders"]:
        refused(hostile.post("/v1/tables", json=ORDERS | {"name": name}))
        column = {"name": name, "type": "int"}
        refused(hostile.post("/v1/tables", json=ORDERS | {"name": "t2", "columns": [column]}))
        job = {"name": name, "upstream": {"table": "orders"}, "backfill": "arrangement"}
        refused(hostile.post("/v1/jobs", json=job))
        up = {"name": "mv", "upstream": {"table": name}, "backfill": "arrangement"}
        refused(hostile.post("/v1/jobs", json=up))
        cols = {"name": "mv", "upstream": {"table": "orders"}, "columns": ["id", name]}
        refused(hostile.post("/v1/jobs", json=cols | {"backfill": "arrangement"}))
    assert scalar(db, "SELECT count(*) FROM relations") == 1
    assert scalar(db, "SELECT count(*) FROM jobs") == 0
    assert_consistent(db)


def test_hostile_names_in_paths_are_404(hostile: TestClient, db: Database) -> None:
    """A name that cannot exist is a 404 without a query (a NUL in it was a 500)."""
    ok(hostile.post("/v1/tables", json=ORDERS), 201)
    names = [*SQLISH, *UNICODE, "nul\x00name", "%00", "a" * 5000, "..", "orders;", "ORDERS"]
    for name, (method, path) in itertools.product(
        [*names, " orders", "orders\n"],
        [
            ("GET", "/v1/tables/{}"),
            ("DELETE", "/v1/tables/{}"),
            ("GET", "/v1/tables/{}/rows"),
            ("POST", "/v1/tables/{}/dml"),
            ("GET", "/v1/sources/{}"),
            ("DELETE", "/v1/sources/{}"),
        ],
    ):
        url = path.format(quote(name, safe=""))
        r = hostile.request(method, url, json={"ops": [{"op": "delete", "row": {"id": 1}}]})
        assert r.status_code in (404, 405), (method, url, r.text)
        refused(r)
    assert scalar(db, "SELECT count(*) FROM relations") == 1
    assert_consistent(db)


# --- values ------------------------------------------------------------------------


def test_hostile_text_values_round_trip_exactly(hostile: TestClient, db: Database) -> None:
    ok(hostile.post("/v1/tables", json=DOCS), 201)
    values = [*SQLISH, *UNICODE, "x" * 1_000_000, "", " ", "\t\n\r", "\x01\x7f"]
    ops = [
        {"op": "insert", "row": {"k": v[:2000], "body": v, "doc": {v[:100]: [v[:100], {"q": v}]}}}
        for v in values
    ]
    ok(dml(hostile, ops), 200)
    back = {r["k"]: r for r in rows(hostile, "docs")}
    assert len(back) == len(values)
    for op in ops:
        assert back[op["row"]["k"]] == op["row"]
    # hostile keys work as keys: update and delete them
    ok(dml(hostile, [{"op": "update", "row": {"k": SQLISH[0], "body": SQLISH[1]}}]), 200)
    ok(dml(hostile, [{"op": "delete", "row": {"k": SQLISH[2]}}]), 200)
    back = {r["k"]: r for r in rows(hostile, "docs")}
    assert back[SQLISH[0]]["body"] == SQLISH[1] and SQLISH[2] not in back
    # a job whose filter compares with them
    job = {
        "name": "mv",
        "upstream": {"table": "docs"},
        "backfill": "arrangement",
        "filter": {"or": [{"col": "body", "op": "=", "value": v} for v in SQLISH]},
    }
    created = ok(hostile.post("/v1/jobs", json=job), 202).json()
    assert created["filter"] == job["filter"]
    assert_consistent(db)


def test_nul_characters_in_values_are_422(hostile: TestClient) -> None:
    """Postgres stores no NUL in text or jsonb (it was a 500 in jsonb)."""
    ok(hostile.post("/v1/tables", json=DOCS), 201)
    for row in [
        {"k": "a", "body": "nul\x00"},
        {"k": "nul\x00"},
        {"k": "a", "doc": {"v": "nul\x00"}},
        {"k": "a", "doc": {"nul\x00key": 1}},
        {"k": "a", "doc": [[[["deep nul\x00"]]]]},
    ]:
        assert_error(dml(hostile, [{"op": "insert", "row": row}]), 422, "validation_error")
    assert rows(hostile, "docs") == []


SURROGATE = "\\ud800"  # a lone surrogate, as JSON spells it (not encodable as UTF-8)


SURROGATE_BODIES = [
    ("/v1/tables/docs/dml", '{"ops": [{"op": "insert", "row": {"k": "a", "body": "%s"}}]}'),
    ("/v1/tables/docs/dml", '{"ops": [{"op": "insert", "row": {"k": "a", "doc": ["%s"]}}]}'),
    ("/v1/tables/docs/dml", '{"ops": [{"op": "insert", "row": {"k": "a", "%s": 1}}]}'),
    ("/v1/tables", '{"name": "x%s", "columns": [{"name": "a", "type": "int"}]}'),
    (
        "/v1/jobs",
        '{"name": "mv", "upstream": {"table": "docs"}, '
        '"filter": {"col": "doc", "op": "=", "value": {"%s": 1}}}',
    ),
    ("/v1/workers", '{"name": "w%s"}'),
    ("/v1/workers/1/failures", '{"message": "boom %s"}'),
    # the collects, parsed off the event loop by pydantic's own JSON parser (api.bodies)
    (
        "/v1/workers/1/collect",
        '{"actor_id": 1, "recovery_seq": 0, "prev_epoch": 1, "curr_epoch": 2, "progress": {"k": ["%s"]}}',
    ),
    (
        "/v1/workers/1/collects",
        '{"collects": [{"actor_id": 1, "recovery_seq": 0, "prev_epoch": 1, "curr_epoch": 2, "progress": {"%s": 1}}]}',
    ),
    (
        "/v1/sources",
        '{"name": "s", "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "t", '
        '"properties": {"client.id": "%s"}}, "columns": [{"name": "a", "type": "int"}]}',
    ),
]


def test_lone_surrogates_anywhere_are_422(hostile: TestClient, db: Database) -> None:
    """Not encodable as UTF-8: a jsonb value with one was a 500."""
    ok(hostile.post("/v1/tables", json=DOCS), 201)
    for path, body in SURROGATE_BODIES:
        r = hostile.post(path, content=(body % SURROGATE).encode(), headers=JSON)
        err = assert_error(r, 422, "validation_error")
        assert "surrogate" in err["details"][0]["msg"]
        assert r.content.isascii()  # the error is valid UTF-8 JSON even so
    assert rows(hostile, "docs") == []
    assert scalar(db, "SELECT count(*) FROM relations") == 1
    assert scalar(db, "SELECT count(*) FROM workers") == 0


def test_nul_in_job_filters_worker_names_and_kafka_settings_is_422(
    hostile: TestClient, db: Database
) -> None:
    ok(hostile.post("/v1/tables", json=DOCS), 201)
    job = {"name": "mv", "upstream": {"table": "docs"}, "backfill": "arrangement"}
    flt = {"col": "doc", "op": "=", "value": {"a": "\x00"}}
    assert_error(hostile.post("/v1/jobs", json=job | {"filter": flt}), 422, "validation_error")
    assert_error(hostile.post("/v1/workers", json={"name": "w\x00"}), 422, "validation_error")
    collect = {
        "actor_id": 1,
        "recovery_seq": 0,
        "prev_epoch": 1,
        "curr_epoch": 2,
        "progress": {"v": ["\x00"]},
    }
    for path, body in [("collect", collect), ("collects", {"collects": [collect]})]:
        err = assert_error(
            hostile.post(f"/v1/workers/1/{path}", json=body), 422, "validation_error"
        )
        assert "NUL" in err["details"][0]["msg"]
    # an escaped backslash before "u0000" is plain text: past the check (an unknown worker)
    text_only = collect | {"progress": {"v": "\\u0000 and \\ud800"}}
    assert_error(
        hostile.post("/v1/workers/1/collect", json=text_only), 404, ErrorCode.UNKNOWN_WORKER
    )
    src = {
        "name": "s",
        "kafka": {"bootstrap_servers": "h\x00:9092", "topic": "t"},
        "columns": [{"name": "a", "type": "int"}],
    }
    assert_error(hostile.post("/v1/sources", json=src), 422, "validation_error")
    # librdkafka refusing a setting is a 422 too (it was a 500)
    src["kafka"] = {"bootstrap_servers": "127.0.0.1:1", "topic": "t", "properties": {"x": "y"}}
    err = assert_error(hostile.post("/v1/sources", json=src), 422, "invalid")
    assert err["details"] == {"field": "kafka.properties"}
    assert scalar(db, "SELECT count(*) FROM jobs") == 0
    assert_consistent(db)


OUT_OF_RANGE = [
    ("amount", "1e999999999"),  # beyond Postgres's numeric (was a 500)
    ("amount", "1e-999999999"),
    ("amount", "NaN"),
    ("amount", "Infinity"),
    ("amount", 1e308 * 10),
    ("id", 2**63),
    ("id", -(2**63) - 1),
    ("id", 1.5),
    ("id", True),
    ("id", "1"),
    ("placed", "0001-01-01T00:00:00+14:00"),
    ("placed", "10000-01-01T00:00:00Z"),
    ("placed", "2024-01-01T00:00:00"),
    ("customer", 12),
    ("customer", ["a"]),
]


def test_out_of_range_and_mistyped_values_are_422(hostile: TestClient) -> None:
    ok(hostile.post("/v1/tables", json=ORDERS), 201)
    for column, value in OUT_OF_RANGE:
        row = {"id": 1, column: value}
        body = json.dumps({"ops": [{"op": "insert", "row": row}]}).encode()  # NaN, Infinity
        r = hostile.post("/v1/tables/orders/dml", content=body, headers=JSON)
        assert r.status_code == 422, (column, value, r.text)
    assert rows(hostile, "orders") == []


# --- types and syntax --------------------------------------------------------------

WRONG = [None, 0, -1, 2**70, 1.5, "", "x", True, [], [1], {}, {"a": 1}]
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "table": ("/v1/tables", ORDERS | {"name": "t2", "distribution_key": ["id"]}),
    "job": (
        "/v1/jobs",
        {
            "name": "mv",
            "upstream": {"table": "orders"},
            "columns": ["id"],
            "filter": {"col": "id", "op": ">", "value": 1},
            "backfill": "arrangement",
            "parallelism": 2,
            "rate_limit": 10,
            "background": True,
        },
    ),
    "dml": ("/v1/tables/orders/dml", {"ops": [{"op": "insert", "row": {"id": 1}}]}),
    "source": (
        "/v1/sources",
        {
            "name": "s",
            "kafka": {"bootstrap_servers": "BROKER", "topic": "t", "properties": {}},
            "format": "json",
            "columns": [{"name": "a", "type": "int"}],
            "rate_limit": 1,
        },
    ),
    "worker": ("/v1/workers", {"name": "w", "capacity": 2}),
    "failure": ("/v1/workers/1/failures", {"actor_id": 1, "message": "m"}),
    "collect": (
        "/v1/workers/1/collect",
        {"actor_id": 1, "recovery_seq": 0, "prev_epoch": 1, "curr_epoch": 2},
    ),
    "collects": (
        "/v1/workers/1/collects",
        {
            "collects": [
                {"actor_id": 1, "recovery_seq": 0, "prev_epoch": 1, "curr_epoch": 2, "rows": 3}
            ]
        },
    ),
}


def _mutations(body: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """The body with one field (at any depth) replaced by each wrong value, or dropped."""
    if isinstance(body, dict):
        for k, v in body.items():
            for w in WRONG:
                yield f"{path}.{k}={w!r}", body | {k: w}
            yield f"{path}.{k} dropped", {x: y for x, y in body.items() if x != k}
            for where, inner in _mutations(v, f"{path}.{k}"):
                yield where, body | {k: inner}
    elif isinstance(body, list) and body:
        for where, inner in _mutations(body[0], f"{path}[0]"):
            yield where, [inner, *body[1:]]


@pytest.mark.parametrize("endpoint", sorted(set(BODIES) - {"source"}))
def test_wrong_json_types_everywhere_are_4xx(
    hostile: TestClient, db: Database, endpoint: str
) -> None:
    _wrong_types(hostile, db, *BODIES[endpoint])


@pytest.mark.kafka
def test_wrong_json_types_in_sources_are_4xx(
    kafka: MockKafka, hostile: TestClient, db: Database
) -> None:
    kafka.produce("t", [(0, {"a": 1})])  # a real broker, so that well-typed sources exist
    path, good = BODIES["source"]
    good = good | {"kafka": good["kafka"] | {"bootstrap_servers": kafka.bootstrap}}
    _wrong_types(hostile, db, path, good)


def _request_schema(client: TestClient, path: str) -> Draft202012Validator:
    """The published schema of ``path``'s POST body (OpenAPI components resolved)."""
    spec = client.app.openapi()  # type: ignore[attr-defined]
    for template, ops in spec["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path):
            schema = ops["post"]["requestBody"]["content"]["application/json"]["schema"]
            return Draft202012Validator(schema | {"components": spec["components"]})
    raise AssertionError(f"{path} is not in the OpenAPI document")


def _wrong_types(hostile: TestClient, db: Database, path: str, good: dict[str, Any]) -> None:
    """Every body the published schema refuses is a 422 ``validation_error``; one it
    admits may still be refused by a rule the schema cannot say (a 4xx), never a 5xx."""
    ok(hostile.post("/v1/tables", json=ORDERS), 201)
    schema = _request_schema(hostile, path)
    assert schema.is_valid(good)
    statuses: dict[int, int] = {}
    for where, body in _mutations(good):
        kafka = body.get("kafka")
        if isinstance(kafka, dict) and kafka.get("bootstrap_servers") == "x":
            continue  # a host name lookup: slow, and not about types
        r = hostile.post(path, json=body)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if not schema.is_valid(body):
            assert r.status_code == 422, (where, r.text)
            assert refused(r)["code"] == "validation_error", (where, r.text)
        else:
            assert r.status_code < 500, (where, r.text)
            if r.status_code >= 400:
                refused(r)
    for top in (None, [], "x", 1, [good]):
        refused(hostile.post(path, json=top))
    assert 422 in statuses
    assert_consistent(db)


MALFORMED = [
    b"",
    b"{",
    b'{"name": "x"',
    b'{"name": "x"} trailing',
    b"{'name': 'x'}",
    b'{"name": "x",}',
    b"\xff\xfe\x00{",
    b'{"name": "\xc3\x28"}',  # invalid UTF-8
    b"\x00",
    b"[" * 100_000,
    b'{"a":' * 100_000,
    b'{"name": 1' + b"0" * 10_000 + b"}",  # an integer past Python's digit limit
    b'{"name": "x", "name": 1}',
    b"null",
    b"true",
    b'"\\u0000"',
]


@pytest.mark.parametrize("endpoint", sorted(BODIES))
def test_malformed_json_bodies_are_4xx(hostile: TestClient, db: Database, endpoint: str) -> None:
    ok(hostile.post("/v1/tables", json=ORDERS), 201)
    path, _ = BODIES[endpoint]
    for raw in MALFORMED:
        for headers in (JSON, {"content-type": "text/plain"}, {}):
            refused(hostile.post(path, content=raw, headers=headers))
    refused(hostile.patch("/v1/jobs/1", content=b"{", headers=JSON))
    assert scalar(db, "SELECT count(*) FROM relations") == 1
    assert_consistent(db)


# --- size and depth ----------------------------------------------------------------


def test_huge_batches_are_all_or_nothing(hostile: TestClient, db: Database) -> None:
    ok(hostile.post("/v1/tables", json=DOCS), 201)
    big = "y" * 700
    ops = [{"op": "insert", "row": {"k": f"k{i}", "body": big}} for i in range(10_000)]
    ops[-1]["row"]["doc"] = {"bad": "\x00"}
    err = assert_error(dml(hostile, ops), 422, "validation_error")
    assert "ops[9999]" in err["details"][0]["msg"]
    ops[-1]["row"].pop("doc")
    assert_error(dml(hostile, [*ops, ops[0]]), 422, "validation_error")  # 10 001 ops
    ops[-1]["row"]["k"] = ops[0]["row"]["k"]  # a duplicate key, the last of 10 000
    err = assert_error(dml(hostile, ops), 409, "conflict")
    assert err["details"]["index"] == 9999
    assert rows(hostile, "docs") == []
    ops[-1]["row"]["k"] = "last"
    assert ok(dml(hostile, ops), 200).json()["count"] == 10_000
    assert scalar(db, "SELECT count(*) FROM store.docs") == 10_000
    # 12 MiB of rows: refused before it is parsed
    huge = [{"op": "insert", "row": {"k": f"h{i}", "body": "z" * 1200}} for i in range(10_000)]
    assert_error(dml(hostile, huge), 413, "payload_too_large")
    assert scalar(db, "SELECT count(*) FROM store.docs") == 10_000


def _nested(depth: int, leaf: str, key: str = "not") -> bytes:
    return (f'{{"{key}": ' * depth + leaf + "}" * depth).encode()


def test_deeply_nested_filters_and_values_are_4xx(hostile: TestClient, db: Database) -> None:
    ok(hostile.post("/v1/tables", json=DOCS), 201)
    leaf = '{"col": "k", "op": "=", "value": "a"}'

    def job(flt: bytes) -> Any:
        body = b'{"name": "mv", "upstream": {"table": "docs"}, "backfill": "arrangement", '
        return hostile.post("/v1/jobs", content=body + b'"filter": ' + flt + b"}", headers=JSON)

    assert ok(job(_nested(32, leaf)), 202).json()["name"] == "mv"
    ok(hostile.delete("/v1/jobs/1"), 204)
    err = assert_error(job(_nested(33, leaf)), 422, "invalid")
    assert "deeply nested" in err["message"]
    for depth in (900, 5_000, 200_000):  # past the JSON parser's own recursion limit
        refused(job(_nested(depth, leaf)))
    wide = json.dumps({"or": [json.loads(leaf)] * 1001}).encode()
    assert_error(job(wide), 422, "invalid")
    ands = ('{"and": [' * 40 + leaf + "]}" * 40).encode()
    assert_error(job(ands), 422, "invalid")
    # deep jsonb values in rows
    for depth, status in ((100, 200), (101, 422), (900, 422), (100_000, 400)):
        doc = b"[" * depth + b"1" + b"]" * depth
        body = b'{"ops": [{"op": "insert", "row": {"k": "d%d", "doc": %s}}]}' % (depth, doc)
        r = hostile.post("/v1/tables/docs/dml", content=body, headers=JSON)
        assert r.status_code == status, (depth, r.text)
    assert scalar(db, "SELECT count(*) FROM jobs") == 0
    assert_consistent(db)


# --- concurrency -------------------------------------------------------------------


def _race(n: int, call: Callable[[int], Any]) -> list[Any]:
    start = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        start.wait()
        out[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_concurrent_duplicate_creates_make_exactly_one(hostile: TestClient, db: Database) -> None:
    tables = _race(8, lambda _: hostile.post("/v1/tables", json=ORDERS))
    assert sorted(r.status_code for r in tables) == [201] + [409] * 7, [r.text for r in tables]
    for r in tables:
        if r.status_code == 409:
            assert_error(r, 409, "conflict")
    job = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "arrangement"}
    jobs = _race(8, lambda _: hostile.post("/v1/jobs", json=job))
    assert sorted(r.status_code for r in jobs) == [202] + [409] * 7, [r.text for r in jobs]

    # a table and a job racing for one name: one wins
    def either(i: int) -> Any:
        if i % 2:
            return hostile.post("/v1/tables", json=ORDERS | {"name": "both"})
        return hostile.post("/v1/jobs", json=job | {"name": "both"})

    mixed = _race(8, either)
    assert sorted(r.status_code for r in mixed if r.status_code < 300) in ([201], [202])
    assert all(r.status_code in (201, 202, 409) for r in mixed), [r.text for r in mixed]
    # and racing drops: one 204, the others 404 or 409
    drops = _race(6, lambda _: hostile.delete("/v1/tables/both"))
    assert all(r.status_code in (204, 404, 409) for r in drops), [r.text for r in drops]
    assert scalar(db, "SELECT count(*) FROM jobs WHERE name IN ('mv', 'both')") in (1, 2)
    assert_consistent(db)


def test_names_near_the_limits_of_storage_names(
    manual: tuple[TestClient, Any], db: Database
) -> None:
    """Index and staging-table names were the table name plus a suffix cut at 63 bytes:
    a 63-character table clashed with its own index, `orders_key` with the index of
    `orders`, and a table dropped and made again with other columns found the old
    staging table in a pooled session (all 500s)."""
    client = manual[0]  # no barriers: every batch below writes the same open epoch
    one = {"name": "id", "type": "bigint", "nullable": False}
    for name, extra in [
        ("t" * 63, {"name": "a", "type": "text"}),
        ("t" * 62 + "u", {"name": "b", "type": "int"}),
        ("orders", {"name": "a", "type": "text"}),
        ("orders_key", {"name": "a", "type": "text"}),
        ("orders_epoch", {"name": "a", "type": "text"}),
        ("orders", {"name": "c", "type": "jsonb"}),  # made again below, other columns
    ]:
        if name == "orders" and client.get("/v1/tables/orders").status_code == 200:
            ok(client.delete("/v1/tables/orders"), 204)
        spec = {"name": name, "columns": [one, extra], "primary_key": ["id"]}
        ok(client.post("/v1/tables", json=spec), 201)
        # a second write of a key in the same epoch goes through the staging table
        value = {"text": "x", "int": 1, "jsonb": {"k": 1}}[extra["type"]]
        for op in ("insert", "update"):
            r = client.post(
                f"/v1/tables/{name}/dml",
                json={"ops": [{"op": op, "row": {"id": 1, extra["name"]: value}}]},
            )
            ok(r, 200)
    assert_consistent(db)


def test_a_collect_whose_progress_is_not_the_protocols_is_422(
    hostile: TestClient, db: Database
) -> None:
    """Decoded once at the edge (``backfill_core.protocol``): a wrong member of an
    actor's progress is the worker's error, not a 500 nor a row the meta reads later."""
    collect = {"actor_id": 1, "recovery_seq": 0, "prev_epoch": 1, "curr_epoch": 2}
    for progress in ({"vnodes": [{"vnode": "1", "state": "done"}]}, {"splits": "0"}):
        for path, body in [
            ("collect", collect | {"progress": progress}),
            ("collects", {"collects": [collect, collect | {"progress": progress}]}),
        ]:
            err = assert_error(
                hostile.post(f"/v1/workers/1/{path}", json=body), 422, "validation_error"
            )
            assert err["details"][0]["loc"][-1] == "progress"
    assert_error(
        hostile.post("/v1/workers/1/collect", json=collect | {"extra": 1}), 422, "validation_error"
    )
    assert scalar(db, "SELECT count(*) FROM barrier_collects") == 0
