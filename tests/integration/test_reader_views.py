"""The SQL views other services read (``mv.<name>``, docs/reading.md): exactly the
committed snapshot, while writes go on and across a recovery; the reader role; plans."""

from __future__ import annotations

import datetime as dt
import random
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from backfill_core.changes import Version
from backfill_core.epoch import EPOCH_PHYSICAL_SHIFT
from backfill_core.schema import Column, ColumnType, TableSchema
from service import cli, migrate
from service.catalog.models import MAIN_GRAPH_ID, Graph, Relation, Worker
from service.catalog.queries import get_relation, storage_of
from service.db import Database, raw_cursor
from service.meta import gc
from service.meta.loop import MetaLoop
from service.usecases import tables
from tests.integration.test_tables_api import create, dml, ins
from tests.kit.meta import FakeWorker, barriers_of, committed_epoch, make_job


def view_rows(db: Database, name: str) -> list[dict[str, Any]]:
    """The view's rows as the API shows rows, in key order."""
    with db.transaction() as s:
        schema = TableSchema.from_json(get_relation(s, name).schema)
        cur = raw_cursor(s)
        cur.execute(f'SELECT * FROM mv."{name}"')
        assert [d[0] for d in cur.description] == list(schema.names)  # user columns only
        rows = [schema.row_to_json(dict(zip(schema.names, r, strict=True))) for r in cur]
    return sorted(rows, key=lambda r: [r[k] for k in schema.primary_key])


def api_rows(client: TestClient, name: str) -> tuple[int, list[dict[str, Any]]]:
    """Every row ``GET .../rows`` returns at the latest committed epoch, in key order."""
    out: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 1000}
    while True:
        page = client.get(f"/v1/tables/{name}/rows", params=params).json()
        out += page["rows"]
        params["epoch"] = page["epoch"]
        if page["next"] is None:
            schema = client.get(f"/v1/tables/{name}").json()["primary_key"]
            return int(page["epoch"]), sorted(out, key=lambda r: [r[k] for k in schema])
        params["after"] = page["next"]


def assert_view_is_committed_snapshot(client: TestClient, db: Database, name: str) -> None:
    epoch, rows = api_rows(client, name)
    assert epoch == committed_epoch(db)
    assert view_rows(db, name) == rows


def random_ops(rng: random.Random, live: set[int]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for key in rng.sample(range(60), 12):
        if key in live and rng.random() < 0.5:
            ops.append({"op": "delete", "row": {"id": key}})
            live.discard(key)
        elif key in live:
            ops.append({"op": "update", "row": {"id": key, "v": f"u{rng.random():.6f}"}})
        else:
            ops.append({"op": "insert", "row": {"id": key, "v": f"i{key}"}})
            live.add(key)
    return ops


def test_the_view_is_the_committed_snapshot_while_writing_and_across_a_recovery(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    w1 = FakeWorker(client, name="w1").register()
    make_job(db, "j", parallelism=2)  # the table j_src and the view j_mv
    loop.tick()
    loop.tick()
    w1.collect_all()
    rng, live = random.Random(35), set[int]()
    with db.transaction() as s:
        mv = storage_of(get_relation(s, "j_mv"))
    for _ in range(6):
        # the writer goes on: DML and the MV's rows at the open epoch, not committed yet
        r = client.post("/v1/tables/j_src/dml", json={"ops": random_ops(rng, live)})
        assert r.status_code == 200, r.text
        open_epoch = int(r.json()["epoch"])
        with db.transaction() as s:
            mv.write(raw_cursor(s), open_epoch, [Version((rng.randrange(20), f"e{open_epoch}"))])
        for name in ("j_src", "j_mv"):
            assert_view_is_committed_snapshot(client, db, name)
        loop.tick()
        w1.collect_all()
        assert committed_epoch(db) >= open_epoch  # now visible
        for name in ("j_src", "j_mv"):
            assert_view_is_committed_snapshot(client, db, name)
    assert view_rows(db, "j_src")  # the comparisons were not of empty views

    # versions a recovery rolls back: an update, a new key and a delete of the MV
    loop.tick()
    open_epoch = barriers_of(db)[-1].curr_epoch
    before = view_rows(db, "j_mv")
    first = before[0]["id"]
    with db.transaction() as s:
        cur = raw_cursor(s)
        mv.write(cur, open_epoch, [Version((first, "rolled back")), Version((999, "new"))])
        mv.write(cur, open_epoch, [Version((before[-1]["id"], None), deleted=True)])
    assert view_rows(db, "j_mv") == before
    assert_view_is_committed_snapshot(client, db, "j_mv")
    FakeWorker(client, name="w2").register()
    with db.transaction() as s:
        s.execute(
            update(Worker)
            .where(Worker.id == w1.worker_id)
            .values(lease_expires_at=dt.datetime.now(dt.UTC))
        )
    loop.tick()  # expires w1 and recovers the graph: the versions above are rolled back
    assert barriers_of(db)[-1].kind == "initial"
    assert view_rows(db, "j_mv") == before
    assert_view_is_committed_snapshot(client, db, "j_mv")


def _e(n: int) -> int:
    return n << EPOCH_PHYSICAL_SHIFT


@pytest.mark.parametrize("composite", [False, True])
def test_the_view_shows_no_superseded_deleted_or_uncommitted_version_around_the_gc_epoch(
    db: Database, composite: bool
) -> None:
    """The view leaves to garbage collection the versions at or below its epoch and checks
    keys only against the versions above it: keys updated, deleted, re-inserted and
    updated twice above the GC epoch, and versions above the committed epoch (which a
    recovery rolls back), never show a superseded or uncommitted row."""
    cols = [Column("id", ColumnType.BIGINT), Column("v", ColumnType.TEXT)]
    pk = ["id"]
    if composite:
        cols.insert(1, Column("part", ColumnType.TEXT))
        pk = ["id", "part"]
    schema = TableSchema.build(cols, pk)
    tables.create_table(db, "gct", schema)

    def row(k: int, v: str | None) -> tuple[Any, ...]:
        return (k, f"p{k % 3}", v) if composite else (k, v)

    def write(epoch: int, puts: dict[int, str], deletes: range | list[int] = ()) -> None:
        with db.transaction() as s:
            cur = raw_cursor(s)
            table = storage_of(get_relation(s, "gct"))
            versions = [Version(row(k, v)) for k, v in puts.items()]
            versions += [Version(row(k, None), deleted=True) for k in deletes]
            table.write(cur, _e(epoch), versions)

    def set_committed(epoch: int) -> None:
        with db.transaction() as s:
            s.execute(
                update(Graph)
                .where(Graph.id == MAIN_GRAPH_ID)
                .values(committed_epoch=_e(epoch), current_epoch=_e(epoch))
            )

    def shown(where: str = "") -> dict[int, str]:
        with db.transaction() as s:
            cur = raw_cursor(s)
            cur.execute(f"SELECT id, v FROM mv.gct {where}")
            got = cur.fetchall()
        out = dict(got)
        assert len(out) == len(got), got  # one row per key
        return out

    # below the GC epoch: keys 0-39, 0-9 updated, 10-14 deleted, 0-4 updated again
    write(1, {k: "a" for k in range(40)})
    write(2, {k: "b" for k in range(10)}, range(10, 15))
    write(3, {k: "c" for k in range(5)})
    set_committed(5)
    (done,) = gc.run_gc(db, retention_ms=2)  # committed - 2 ms: epoch 3
    assert done.safe_epoch == _e(3) and done.removed_versions == 10 + 5 + 10
    # above it and committed: updates, deletes, a key updated twice, a key updated then
    # deleted, a new key and a key deleted below the GC epoch inserted again
    write(4, {**{k: "d" for k in range(20, 25)}, 0: "d", 1: "d", 100: "d"}, range(25, 30))
    write(5, {0: "e", 10: "f"}, [1])
    # above the committed epoch: not shown, and rolled back by a recovery
    write(6, {2: "x", 200: "x", 30: "x"}, [3, 20])
    write(7, {0: "y", 3: "y"}, [21])
    expected = {
        **{k: "a" for k in range(15, 40)},
        **{k: "b" for k in range(5, 10)},
        **{k: "c" for k in range(2, 5)},
        **{k: "d" for k in range(20, 25)},
        0: "e",
        10: "f",
        100: "d",
    }
    for k in range(25, 30):
        del expected[k]
    with db.transaction() as s:
        assert s.get(Relation, get_relation(s, "gct").id).gc_epoch == _e(3)
        table = storage_of(get_relation(s, "gct"))
        snap = table.snapshot(raw_cursor(s), _e(5), (0, schema.vnode_count))
    assert {r[0]: r[-1] for _, r in snap} == expected  # the store's own snapshot read
    assert shown() == expected
    for k in (0, 1, 2, 3, 10, 12, 20, 21, 25, 30, 100, 200):
        assert shown(f"WHERE id = {k}") == ({k: expected[k]} if k in expected else {}), k
    with db.transaction() as s:
        storage_of(get_relation(s, "gct")).rollback(raw_cursor(s), _e(5))
    assert shown() == expected
    # the committed epoch moves on: what was above it shows, superseding what it updates
    write(6, {2: "x", 200: "x", 30: "x"}, [3, 20])
    set_committed(6)
    expected.update({2: "x", 200: "x", 30: "x"})
    del expected[3], expected[20]
    assert shown() == expected
    # garbage collection passes all of it: the same rows, with nothing above its epoch
    (done,) = gc.run_gc(db, retention_ms=0)
    assert done.safe_epoch == _e(6)
    assert shown() == expected


def test_tables_and_views_get_their_sql_view_and_lose_it_when_dropped(
    client: TestClient, db: Database
) -> None:
    t = create(client)
    assert t["sql_name"] == "mv.orders"
    placed = "2026-11-27T10:00:00.123456Z"
    r = dml(client, [ins(1, placed=placed), ins(2, amount="12345678901234567890.000001")])
    assert r.status_code == 200, r.text
    assert view_rows(db, "orders") == api_rows(client, "orders")[1]
    assert client.delete("/v1/tables/orders").status_code == 204
    with db.transaction() as s:
        cur = raw_cursor(s)
        cur.execute("SELECT to_regclass('mv.orders'), to_regclass('store.orders')")
        assert cur.fetchone() == (None, None)


@pytest.mark.parametrize("name", ["v", "x", "vn"])
def test_a_relation_named_like_the_views_own_aliases_gets_its_view(
    client: TestClient, db: Database, name: str
) -> None:
    """The view's SQL names a series and a subquery: a relation of the same name
    (``v`` hid the series inside the subquery, and creating it failed) reads right."""
    body = {"name": name, "columns": [{"name": "id", "type": "bigint"}], "primary_key": ["id"]}
    assert client.post("/v1/tables", json=body).status_code == 201, name
    ops = [{"op": "insert", "row": {"id": i}} for i in range(5)]
    r = client.post(f"/v1/tables/{name}/dml", json={"ops": ops}, params={"wait": "true"})
    assert r.status_code == 200, r.text
    assert view_rows(db, name) == api_rows(client, name)[1] == [{"id": i} for i in range(5)]


def test_a_key_lookup_through_the_view_uses_the_key_index(client: TestClient, db: Database) -> None:
    create(client)
    for lo in range(0, 4000, 1000):
        assert dml(client, [ins(i) for i in range(lo, lo + 1000)]).status_code == 200
    with db.transaction() as s:
        cur = raw_cursor(s)
        cur.execute("ANALYZE store.orders")
        cur.execute("EXPLAIN SELECT * FROM mv.orders WHERE id = 1234")
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("SELECT * FROM mv.orders WHERE id = 1234")
        assert cur.fetchone()[0] == 1234
    # the key index (``<prefix>_key``) probed per vnode with the key as an index condition
    assert re.search(r"Index Scan using _orders_\w+_key on orders", plan), plan
    assert "Seq Scan on orders" not in plan, plan
    assert "(id = 1234)" in plan, plan  # the key reaches the index, not a filter afterwards


@pytest.fixture
def reader(db: Database, fresh_db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A connection as a role made by ``backfill db create-reader-role``."""
    role = f"reader_{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("DATABASE_URL", fresh_db_url)
    monkeypatch.setenv("TEST_READER_PASSWORD", "s3cret'\"pw")
    args = ["db", "create-reader-role", role, "--password-env", "TEST_READER_PASSWORD"]
    assert cli.main(args) == 0
    assert cli.main(args) == 1  # exists already
    conn = psycopg2.connect(db.libpq_url, user=role, password="s3cret'\"pw")
    conn.autocommit = True
    yield conn
    conn.close()
    with db.transaction() as s:
        raw_cursor(s).execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


def test_a_bad_role_name_is_refused(db: Database, fresh_db_url: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_db_url)
    assert cli.main(["db", "create-reader-role", 'x"; DROP TABLE relations; --']) == 2


def test_the_reader_role_selects_from_the_views_and_nothing_else(
    client: TestClient, db: Database, reader: Any
) -> None:
    create(client)  # after the role: granted by default privileges
    assert dml(client, [ins(1), ins(2)]).status_code == 200
    cur = reader.cursor()
    cur.execute("SELECT id FROM mv.orders ORDER BY id")
    assert cur.fetchall() == [(1,), (2,)]
    for q in (
        "SELECT * FROM store.orders",
        "SELECT * FROM relations",
        "SELECT * FROM graphs",
        "SELECT * FROM api_tokens",
        "INSERT INTO mv.orders (id) VALUES (3)",
        "DELETE FROM mv.orders",
        "CREATE TABLE mv.x (a int)",
        "CREATE TABLE public.x (a int)",
        "CREATE VIEW mv.y AS SELECT 1",
    ):
        with pytest.raises(psycopg2.Error):
            cur.execute(q)
    # even when it turns its read-only default off, privileges stop every write
    cur.execute("SET default_transaction_read_only = off")
    for q in (
        "INSERT INTO store.orders VALUES (0, 3, 1, false)",
        "UPDATE relations SET name = 'x'",
        "DROP VIEW mv.orders",
        "CREATE TABLE mv.x (a int)",
    ):
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute(q)
    assert view_rows(db, "orders") == api_rows(client, "orders")[1]


def test_the_migration_makes_views_of_existing_relations(client: TestClient, db: Database) -> None:
    create(client)
    assert dml(client, [ins(1), ins(2)]).status_code == 200
    # an operator stops the control plane to downgrade: the barrier loop's reads of the
    # catalog and the migrations' DDL would deadlock
    client.app.state.meta_loop.stop()  # type: ignore[attr-defined]
    migrate.downgrade(db.engine, "0012")  # a catalog from before the views
    with db.transaction() as s:
        cur = raw_cursor(s)
        cur.execute("SELECT to_regnamespace('mv'), to_regclass('store.orders') IS NOT NULL")
        assert cur.fetchone() == (None, True)
    migrate.upgrade(db.engine)
    assert view_rows(db, "orders") == api_rows(client, "orders")[1]
