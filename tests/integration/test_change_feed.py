"""A relation's change feed (``GET /v1/tables/{name}/changes``, docs/reading.md): applying
it to the snapshot at an epoch gives the snapshot at every later marker; resuming after a
marker loses and repeats nothing; NDJSON and SSE; follow; clear 4xx."""

from __future__ import annotations

import itertools
import json
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from backfill_core.changes import Op, Version
from backfill_core.schema import Column, ColumnType, TableSchema
from service.db import Database
from service.settings import Settings
from state_store.feed import changes_by_epoch
from state_store.versioned import VersionedTable
from tests.integration.test_events_api import parse_sse
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import ORDERS, create, dml, ins
from tests.kit.auth import http_client
from tests.kit.live import RestartableServer, live_server

SCHEMA = TableSchema.build(
    [Column("k", ColumnType.INT), Column("v", ColumnType.TEXT)], ["k"], vnode_count=8
)
E = 1 << 16
_names = itertools.count()

batch = st.lists(
    st.tuples(st.integers(0, 9), st.booleans(), st.sampled_from(["a", "b", "", None])),
    max_size=8,
)


def _snapshot(cur: Any, table: VersionedTable, epoch: int) -> dict[Any, Any]:
    return {r[0]: r for _, r in table.snapshot(cur, epoch, (0, SCHEMA.vnode_count))}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=st.lists(batch, min_size=1, max_size=8),
    gc_at=st.integers(0, 8),
    start=st.integers(0, 8),
    piece=st.integers(1, 4),
)
def test_the_feed_applied_to_a_snapshot_gives_every_later_snapshot(
    conn: Any, history: list[Any], gc_at: int, start: int, piece: int
) -> None:
    table = VersionedTable(f"feed_{next(_names)}", SCHEMA)
    with conn.cursor() as cur:
        table.create(cur)
        for i, versions in enumerate(history, start=1):  # epoch i*E; some write nothing
            table.write(cur, i * E, [Version((k, v), deleted) for k, deleted, v in versions])
        committed = len(history) * E
        # versions above the committed epoch (a recovery would roll them back) never show
        table.write(cur, committed + E, [Version((0, "uncommitted"))])
        gc_epoch = min(gc_at, len(history)) * E
        table.gc(cur, gc_epoch)
        after = max(min(start, len(history)) * E, gc_epoch)  # a resumable epoch

        state = _snapshot(cur, table, after)
        markers: list[int] = []
        last = after
        while True:  # in pieces, each resuming after the last marker, as a client does
            got = changes_by_epoch(cur, table, last, committed, piece)
            if not got:
                break
            for epoch, changes in got:
                assert epoch > last
                for c in changes:
                    key = c.new[0] if c.new is not None else c.old[0]
                    if c.op is Op.INSERT:
                        assert key not in state
                        state[key] = c.new
                    elif c.op is Op.UPDATE:
                        assert state[key] == c.old
                        state[key] = c.new
                    else:
                        assert state.pop(key) == c.old
                assert state == _snapshot(cur, table, epoch), f"at marker {epoch}"
                markers.append(epoch)
                last = epoch
        assert state == _snapshot(cur, table, committed)
        changed = {i * E for i, versions in enumerate(history, start=1) if versions}
        assert set(markers) <= changed and all(m > after for m in markers)
        table.drop(cur)
    conn.rollback()


def feed(client: Any, name: str = "orders", **params: Any) -> list[dict[str, Any]]:
    r = client.get(f"/v1/tables/{name}/changes", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


def apply(state: dict[int, dict[str, Any]], lines: list[dict[str, Any]], client: Any) -> int:
    """Apply the feed's lines; at each marker, the state equals the rows at that epoch."""
    last = 0
    for line in lines:
        if "op" not in line:
            last = int(line["epoch"])
            rows = client.get("/v1/tables/orders/rows", params={"epoch": line["epoch"]}).json()
            assert sorted(state.values(), key=lambda r: r["id"]) == sorted(
                rows["rows"], key=lambda r: r["id"]
            )
        elif line["op"] == "delete":
            assert state.pop(line["row"]["id"]) == line["row"]
        else:
            if line["op"] == "update":
                assert state[line["row"]["id"]] == line["old"]
            state[line["row"]["id"]] = line["row"]
    return last


def test_the_feed_over_http_resumes_exactly_after_a_marker(client: TestClient) -> None:
    create(client)
    e1 = dml(client, [ins(1), ins(2)]).json()["epoch"]
    upd = {"op": "update", "row": {"id": 1, "amount": "9"}}
    e2 = dml(client, [upd, {"op": "delete", "row": {"id": 2}}, ins(3)]).json()["epoch"]
    everything = feed(client, after="0")
    state: dict[int, dict[str, Any]] = {}
    assert apply(state, everything, client) >= int(e2)
    markers = [line["epoch"] for line in everything if "op" not in line]
    assert markers[:2] == [e1, e2]
    ops = [line["op"] for line in everything if "op" in line]
    assert sorted(ops[:2]) == ["insert", "insert"] and sorted(ops[2:]) == sorted(
        ["update", "delete", "insert"]
    )
    # resuming after the first marker gives exactly the rest
    tail = feed(client, after=e1)
    assert tail[:4] == everything[3:7]  # the second epoch's changes and marker
    assert [x for x in tail if "op" in x] == [x for x in everything[3:] if "op" in x]
    # after the last marker: nothing but a marker at the committed epoch (or nothing new)
    rest = feed(client, after=markers[-1])
    assert all("op" not in x for x in rest)

    # SSE: the same, markers carrying their epoch as the event id
    r = client.get(
        "/v1/tables/orders/changes", params={"after": "0"}, headers={"Accept": "text/event-stream"}
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)  # the events with an id: the markers
    assert [str(e["id"]) for e in events][:2] == markers[:2]  # then the committed epoch
    assert "event: update\ndata: " in r.text
    r = client.get(
        "/v1/tables/orders/changes",
        headers={"Accept": "text/event-stream", "Last-Event-ID": e1},
    )
    assert "event: insert" in r.text and [str(e["id"]) for e in parse_sse(r.text)][0] == e2


def test_bad_feed_requests_are_clear_4xx(client: TestClient, db: Database) -> None:
    assert_error(client.get("/v1/tables/nope/changes"), 404, "not_found")
    create(client)
    dml(client, [ins(1)])
    for bad in ("abc", "-1", "1.5", "99999999999999999999"):
        r = client.get("/v1/tables/orders/changes", params={"after": bad})
        assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error"  # as /rows
    r = client.get("/v1/tables/orders/changes", headers={"Last-Event-ID": "x"})
    assert assert_error(r, 400, "bad_request")["details"] == {"field": "Last-Event-ID"}
    far = str((1 << 63) - 1)
    details = assert_error(
        client.get("/v1/tables/orders/changes", params={"after": far}), 409, "conflict"
    )["details"]
    assert set(details) == {"committed_epoch"}
    with db.engine.begin() as c:  # as if garbage collection had passed epoch 5
        c.execute(text("UPDATE relations SET gc_epoch = 5 WHERE name = 'orders'"))
    err = assert_error(client.get("/v1/tables/orders/changes", params={"after": "4"}), 410, "gone")
    assert err["details"] == {"oldest_readable_epoch": "5"}
    assert client.get("/v1/tables/orders/changes", params={"after": "5"}).status_code == 200


def test_a_followed_feed_sends_each_epoch_once_committed(db: Database, settings: Settings) -> None:
    with live_server(settings, db) as url, http_client(url, timeout=30) as http:
        create(http, ORDERS)  # type: ignore[arg-type]
        with http.stream("GET", "/v1/tables/orders/changes", params={"follow": "true"}) as s:
            lines = s.iter_lines()
            start = json.loads(next(lines))  # a marker at the committed epoch at once
            assert set(start) == {"epoch"}
            with http_client(url, timeout=30) as writer:
                e1 = dml(writer, [ins(1)]).json()["epoch"]  # type: ignore[arg-type]
                seen = []
                for line in lines:
                    if line:
                        seen.append(json.loads(line))
                    if seen and seen[-1].get("epoch") == e1:
                        break
        assert [x["op"] for x in seen if "op" in x] == ["insert"]
        assert int(e1) > int(start["epoch"])


def test_the_feed_resumes_exactly_after_a_control_plane_restart(
    db: Database, settings: Settings
) -> None:
    with RestartableServer(settings, db) as server:
        with http_client(server.url, timeout=30) as http:
            create(http, ORDERS)  # type: ignore[arg-type]
            dml(http, [ins(1), ins(2)])  # type: ignore[arg-type]
            state: dict[int, dict[str, Any]] = {}
            last = apply(state, feed(http, after="0"), http)
        server.restart()  # the same database, a new process state
        with http_client(server.url, timeout=30) as http:
            upd = {"op": "update", "row": {"id": 1, "amount": "9"}}
            e = dml(http, [upd, {"op": "delete", "row": {"id": 2}}, ins(3)]).json()["epoch"]  # type: ignore[arg-type]
            rest = feed(http, after=str(last))
            assert int(e) > last and apply(state, rest, http) >= int(e)
            # exactly the batch after the restart: nothing lost, nothing repeated
            assert sorted((x["op"], x["row"]["id"]) for x in rest if "op" in x) == [
                ("delete", 2),
                ("insert", 3),
                ("update", 1),
            ]
