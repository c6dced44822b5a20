"""Bulk DML bodies (NDJSON ops, CSV inserts) on ``POST /v1/tables/{name}/dml``: what they
write, and every bad line answered with a 4xx naming it and nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.api.app import create_app
from service.db import Database
from service.meta.loop import MetaLoop
from service.settings import Settings
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_limits import count
from tests.integration.test_tables_api import ORDERS, create, dml, ins, rows
from tests.kit.auth import api_client
from tests.kit.meta import key_index, make_job

NDJSON = {"content-type": "application/x-ndjson"}
CSV = {"content-type": "text/csv"}


def bulk(client: TestClient, body: bytes, headers: dict[str, str]) -> Any:
    """A bulk body that returns once its epoch is committed."""
    return client.post(
        "/v1/tables/orders/dml", params={"wait": "true"}, content=body, headers=headers
    )


def latest(client: TestClient) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in rows(client, limit=1000)["rows"]}


def test_ndjson_inserts_updates_and_deletes(client: TestClient) -> None:
    create(client)
    assert dml(client, [ins(1), ins(2)]).status_code == 200
    body = (
        b'{"op": "insert", "row": {"id": 3, "customer": "c3", "amount": "2.50"}}\n'
        b'{"op": "update", "row": {"id": 1, "amount": "9"}}\n'
        b"\n"  # blank lines hold no op
        b'{"op": "delete", "row": {"id": 2}}\n'
        b'{"op": "update", "row": {"id": 3, "placed": "2024-05-01T10:00:00+02:00"}}'
    )
    r = bulk(client, body, NDJSON)
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 4
    got = latest(client)
    assert set(got) == {1, 3}
    assert got[1] == {"id": 1, "customer": "c1", "amount": "9", "placed": None}
    assert got[3] == {"id": 3, "customer": "c3", "amount": "2.50", "placed": "2024-05-01T08:00:00Z"}


def test_ndjson_over_many_batches_is_one_epoch(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.usecases import tables

    monkeypatch.setattr(tables, "BULK_BATCH", 7)  # a batch's lookups see the earlier ones
    create(client)
    ops = [f'{{"op": "insert", "row": {{"id": {i}}}}}' for i in range(30)]
    ops += [f'{{"op": "delete", "row": {{"id": {i}}}}}' for i in range(0, 30, 2)]
    ops += ['{"op": "insert", "row": {"id": 4, "customer": "again"}}']
    r = bulk(client, "\n".join(ops).encode(), NDJSON)
    assert r.status_code == 200, r.text
    got = latest(client)
    assert sorted(got) == sorted([4, *range(1, 30, 2)])
    assert got[4]["customer"] == "again"
    fresh = [f'{{"op": "insert", "row": {{"id": {i}}}}}' for i in range(100, 120)]
    bad = "\n".join([*fresh, '{"op": "insert", "row": {"id": 105}}']).encode()
    err = assert_error(bulk(client, bad, NDJSON), 409, "conflict")  # in the 3rd batch
    assert err["details"] == {"line": 21, "key": [105]}
    assert 100 not in latest(client)


def test_csv_inserts(client: TestClient) -> None:
    create(client)
    body = (
        b"id,customer,amount,placed\n"
        b"1,ada,250.00,2024-05-01T10:00:00+02:00\n"
        b'2,"bob, jr.",,2024-05-01 10:00:00\n'  # an empty field is null; no offset is UTC
        b'3,"",1e2,\n'  # a quoted empty field is the empty string
        b'4,"two\nlines",-1,\n'
        b"\n"
        b'"6",x"y"" z""",7,\n'  # a quote opens a quoted part anywhere in a field
        b"5,eve,3,"  # no newline at the end
    )
    r = bulk(client, body, CSV)
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 6
    got = latest(client)
    assert got[1] == {
        "id": 1,
        "customer": "ada",
        "amount": "250.00",
        "placed": "2024-05-01T08:00:00Z",
    }
    assert got[2] == {
        "id": 2,
        "customer": "bob, jr.",
        "amount": None,
        "placed": "2024-05-01T10:00:00Z",
    }
    assert got[3]["customer"] == "" and got[3]["amount"] == "100"
    assert got[4]["customer"] == "two\nlines" and got[5]["amount"] == "3"
    assert got[6]["customer"] == 'xy" z"'
    # the rows went to the vnodes JSON DML uses: these updates and deletes find them
    r = dml(client, [{"op": "update", "row": {"id": i, "customer": "x"}} for i in range(1, 7)])
    assert r.status_code == 200, r.text
    assert dml(client, [{"op": "delete", "row": {"id": 3}}]).status_code == 200
    assert sorted(latest(client)) == [1, 2, 4, 5, 6]


def test_csv_into_an_epoch_that_already_has_versions(
    manual: tuple[TestClient, MetaLoop],
) -> None:
    client, loop = manual  # no barrier loop: the epoch stays open between the requests
    create(client)
    assert client.post("/v1/tables/orders/dml", json={"ops": [ins(1), ins(2)]}).status_code == 200
    r = client.post("/v1/tables/orders/dml", json={"ops": [{"op": "delete", "row": {"id": 2}}]})
    assert r.status_code == 200
    taken = client.post(
        "/v1/tables/orders/dml", content=b"id,customer\n3,c\n1,again\n", headers=CSV
    )
    assert assert_error(taken, 409, "conflict")["details"] == {"line": 3, "key": [1]}
    r = client.post("/v1/tables/orders/dml", content=b"id,customer\n2,back\n3,new\n", headers=CSV)
    assert r.status_code == 200, r.text
    loop.tick()
    loop.tick()
    got = latest(client)
    assert sorted(got) == [1, 2, 3] and got[2]["customer"] == "back"


def test_json_inserts_into_an_epoch_that_already_has_versions(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """A batch of inserts only (looked up by key, written as it came) at an epoch whose
    earlier batches wrote the same keys: a deleted key comes back, a live one or one
    twice in the batch is a 409 naming the op, and a rejected batch writes nothing."""
    client, loop = manual  # no barrier loop: the epoch stays open between the requests

    def post(ops: list[dict[str, Any]]) -> Any:
        return client.post("/v1/tables/orders/dml", json={"ops": ops})

    create(client)
    assert post([ins(1), ins(2)]).status_code == 200
    assert post([{"op": "delete", "row": {"id": 2}}]).status_code == 200
    r = post([ins(3), ins(2, customer="back")])
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 2
    err = assert_error(post([ins(4), ins(5), ins(4)]), 409, "conflict")
    assert err["details"] == {"index": 2, "key": [4]}
    err = assert_error(post([ins(6), ins(1), ins(6)]), 409, "conflict")
    assert err["details"] == {"index": 1, "key": [1]}
    loop.tick()
    loop.tick()
    got = latest(client)
    assert sorted(got) == [1, 2, 3] and got[2]["customer"] == "back"
    assert count(db, "SELECT sum(delta) FROM row_count_deltas") == 3


BAD_NDJSON = [
    (
        b'{"op": "insert", "row": {"id": 7}}\n{"op": "insert", "row": {"id": 8}',
        400,
        "malformed_json",
    ),
    (
        b'{"op": "insert", "row": {"id": 7}}\n{"op": "insert", "row": {"id": 8, "nope": 1}}',
        422,
        "invalid",
    ),
    (
        b'{"op": "insert", "row": {"id": 7}}\n{"op": "insert", "row": {"id": "eight"}}',
        422,
        "invalid",
    ),
    (b'{"op": "insert", "row": {"id": 7}}\n{"op": "insert", "row": {"id": 1}}', 409, "conflict"),
    (b'{"op": "insert", "row": {"id": 7}}\n{"op": "delete", "row": {"id": 99}}', 409, "conflict"),
    (b'{"op": "insert", "row": {"id": 7}}\n{"op": "upsert", "row": {"id": 8}}', 422, "invalid"),
    (b'{"op": "insert", "row": {"id": 7}}\n[1, 2]', 422, "invalid"),
    (b'{"op": "insert", "row": {"id": 7}}\n' + b"[" * 100_000, 400, "bad_request"),
    (
        b'{"op": "insert", "row": {"id": 7}}\n{"op": "insert", "row": {"id": 8, "customer": "\\u0000"}}',
        422,
        "invalid",
    ),
]
BAD_CSV = [
    (b"id,customer\n7,a\n8,b,extra\n", 422, "invalid"),
    (b"id,customer\n7,a\neight,b\n", 422, "invalid"),
    (b"id,amount\n7,1\n8,lots\n", 422, "invalid"),
    (b"id,amount\n7,1\n8,NaN\n", 422, "invalid"),
    (b"id,customer\n7,a\n1,b\n", 409, "conflict"),  # the key exists
    (b"id,customer\n7,a\n7,b\n", 409, "conflict"),  # twice in the body
    (b'id,customer\n7,a\n8,"open\n', 400, "bad_request"),
]


@pytest.mark.parametrize(
    ("body", "status", "code", "headers"),
    [(*case, NDJSON) for case in BAD_NDJSON] + [(*case, CSV) for case in BAD_CSV],
)
def test_a_bad_line_is_named_and_nothing_is_written(
    client: TestClient, body: bytes, status: int, code: str, headers: dict[str, str]
) -> None:
    create(client)
    assert dml(client, [ins(1)]).status_code == 200
    err = assert_error(bulk(client, body, headers), status, code)
    line = 2 if headers is NDJSON else 3
    assert err["details"]["line"] == line, err
    assert err["message"].startswith(f"line {line}: "), err
    assert sorted(latest(client)) == [1]


def test_a_first_load_builds_the_key_index_after_its_rows(client: TestClient, db: Database) -> None:
    create(client)
    before = key_index(db)
    r = bulk(client, b"id,customer\n" + b"".join(b"%d,c%d\n" % (i, i) for i in range(50)), CSV)
    assert r.status_code == 200, r.text
    after = key_index(db)
    assert after is not None and after[1] and after != before  # dropped, then built again
    r = bulk(client, b"id,customer\n60,x\n", CSV)  # the table has rows: kept up as they come
    assert r.status_code == 200 and key_index(db) == after
    assert_error(bulk(client, b"id,customer\n61,y\n7,again\n", CSV), 409, "conflict")
    assert sorted(latest(client)) == [*range(50), 60]


def column_defaults(db: Database, table: str = "orders") -> list[str]:
    with db.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND atthasdef"
                ),
                {"t": f"store.{table}"},
            ).scalars()
        )


def test_a_first_load_leaves_no_column_defaults(client: TestClient, db: Database) -> None:
    """A first load's COPY takes the epoch and deleted flag from column defaults, dropped
    before it commits: the writes after it name both."""
    create(client)
    r = bulk(client, b"id,customer\n1,a\n2,b\n", CSV)
    assert r.status_code == 200, r.text
    assert column_defaults(db) == []
    assert dml(client, [ins(3)]).status_code == 200
    assert sorted(latest(client)) == [1, 2, 3]


# every spelling of NaN and infinity Postgres reads in a numeric field
NONFINITE = ["NaN", "nan", "Infinity", "-Infinity", "+inf", "-INF", " inf "]


@pytest.mark.parametrize("first_load", [True, False])
@pytest.mark.parametrize("value", NONFINITE)
def test_nan_and_infinity_in_any_spelling_are_refused(
    client: TestClient, value: str, first_load: bool
) -> None:
    create(client)
    if not first_load:
        assert dml(client, [ins(1)]).status_code == 200
    body = b"id,customer,amount\n7,x,1.5\n8,y,%s\n" % value.encode()
    err = assert_error(bulk(client, body, CSV), 422, "invalid")
    assert err["details"]["line"] == 3, err
    assert sorted(latest(client)) == ([] if first_load else [1])


@pytest.mark.parametrize(("body", "status", "code"), [c for c in BAD_CSV if b"\n1,b" not in c[0]])
def test_a_bad_first_load_is_named_and_nothing_is_written(
    client: TestClient, db: Database, body: bytes, status: int, code: str
) -> None:
    create(client)
    before = key_index(db)
    err = assert_error(bulk(client, body, CSV), status, code)
    assert err["details"]["line"] == 3, err
    assert latest(client) == {}
    assert key_index(db) == before  # taken back with the rows


def test_a_first_load_into_a_table_being_read_keeps_its_key_index(
    client: TestClient, db: Database
) -> None:
    create(client)
    before = key_index(db)
    with db.engine.connect() as reader:  # a read under way: no wait for it, the usual COPY
        reader.execute(text("SELECT count(*) FROM store.orders"))
        assert bulk(client, b"id,customer\n1,a\n", CSV).status_code == 200
    assert key_index(db) == before
    create(client, ORDERS | {"name": "read"})
    make_job(db, "reader", 1, upstream="read")  # a job reads it: the usual COPY
    was = key_index(db, "read")
    r = client.post("/v1/tables/read/dml", content=b"id,customer\n1,a\n", headers=CSV)
    assert r.status_code == 200, r.text
    assert key_index(db, "read") == was


def test_a_line_after_quoted_newlines(client: TestClient) -> None:
    create(client)
    body = b'id,customer\n7,"a\nb\nc"\n8,d,extra\n'
    err = assert_error(bulk(client, body, CSV), 422, "invalid")
    assert err["details"] == {"line": 5}, err  # the record's first line


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"id,nope\n7,a\n", "unknown column 'nope'"),
        (b"id,id\n7,7\n", "twice"),
        (b"customer\na\n", "must name the column(s) id"),
    ],
)
def test_a_bad_csv_header_is_line_1(client: TestClient, body: bytes, fragment: str) -> None:
    create(client)
    err = assert_error(bulk(client, body, CSV), 422, "invalid")
    assert err["details"] == {"line": 1} and fragment in err["message"]


def test_csv_empty_fields_in_columns_that_are_not_nullable(client: TestClient) -> None:
    spec = {
        "name": "notes",
        "columns": [
            {"name": "k", "type": "text"},
            {"name": "body", "type": "text", "nullable": False},
            {"name": "n", "type": "int", "nullable": False},
        ],
        "primary_key": ["k"],
    }
    create(client, spec)
    path = "/v1/tables/notes/dml"
    body = b'k,body,n\n,,1\nq"u""o"te,x,2\n'
    r = client.post(path, params={"wait": "true"}, content=body, headers=CSV)
    assert r.status_code == 200, r.text  # the empty string, in the key too
    got = client.get("/v1/tables/notes/rows").json()["rows"]
    assert sorted(got, key=lambda r: r["n"]) == [
        {"k": "", "body": "", "n": 1},
        {"k": 'qu"ote', "body": "x", "n": 2},
    ]
    # in the vnodes JSON DML computes: found by key
    ops = [{"op": "update", "row": {"k": k, "n": 3}} for k in ("", 'qu"ote')]
    r = client.post(path, json={"ops": ops})
    assert r.status_code == 200, r.text
    err = assert_error(client.post(path, content=b"k,body,n\na,b,\n", headers=CSV), 422, "invalid")
    assert err["details"] == {"line": 2, "column": "n"}


def test_bodies_without_rows_and_keys_csv_cannot_read(client: TestClient) -> None:
    create(client)
    assert_error(bulk(client, b"", NDJSON), 422, "invalid")
    assert_error(bulk(client, b"id,customer\n", CSV), 422, "invalid")
    spec = {
        "name": "days",
        "columns": [{"name": "day", "type": "date", "nullable": False}],
        "primary_key": ["day"],
    }
    create(client, spec)
    r = client.post("/v1/tables/days/dml", content=b"day\n2024-01-01\n", headers=CSV)
    assert "NDJSON" in assert_error(r, 422, "invalid")["message"]
    r = client.post(
        "/v1/tables/days/dml",
        content=b'{"op": "insert", "row": {"day": "2024-01-01"}}',
        headers=NDJSON,
    )
    assert r.status_code == 200, r.text


def test_an_unsupported_content_type_is_415(client: TestClient) -> None:
    create(client)
    for media in ("text/plain", "application/xml", "multipart/form-data; boundary=x"):
        r = client.post(
            "/v1/tables/orders/dml", content=b"id\n1\n", headers={"content-type": media}
        )
        err = assert_error(r, 415, "unsupported_media_type")
        assert "text/csv" in err["message"]
    # JSON by another name is still JSON
    r = client.post(
        "/v1/tables/orders/dml",
        content=b'{"ops": [{"op": "insert", "row": {"id": 5}}]}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200, r.text


def test_bulk_bodies_have_their_own_size_limit(db: Database, fresh_db_url: str) -> None:
    settings = Settings(
        database_url=fresh_db_url,
        run_barrier_loop=False,
        max_body_bytes=4096,
        max_bulk_body_bytes=8192,
    )
    csv = b"id,customer\n" + b"".join(b"%d,%s\n" % (i, b"c" * 40) for i in range(300))
    assert len(csv) > 8192
    with api_client(create_app(settings, db)) as c:
        create(c)
        # over the bulk limit: from its Content-Length, or once a chunked body passes it
        err = assert_error(
            c.post("/v1/tables/orders/dml", content=csv, headers=CSV), 413, "payload_too_large"
        )
        assert err["details"] == {"max_bytes": 8192}

        def chunks() -> Iterator[bytes]:
            yield csv[:4000]
            yield csv[4000:]

        r = c.post("/v1/tables/orders/dml", content=chunks(), headers=CSV)
        assert "content-length" not in r.request.headers
        assert_error(r, 413, "payload_too_large")
        # under it, and over the JSON limit: taken
        small = csv[:6000].rsplit(b"\n", 1)[0] + b"\n"
        assert len(small) > 4096
        r = c.post("/v1/tables/orders/dml", content=small, headers=CSV)
        assert r.status_code == 200, r.text
    assert count(db, "SELECT count(*) FROM store.orders") == small.count(b"\n") - 1
