"""An MV's epoch index comes once its backfill is done, a table's once its first write
committed, off the barrier loop (service/meta/indexer.py); garbage collection runs off
it too (service/meta/chores.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient
from psycopg2 import errors
from sqlalchemy import select

from backfill_core.changes import Version
from service.catalog.models import Relation
from service.catalog.queries import storage_of
from service.db import Database, raw_cursor
from service.meta import gc
from service.meta.indexer import BUILD_LOCK, EpochIndexer
from service.meta.loop import MetaLoop
from service.settings import Settings
from state_store.versioned import VersionedTable
from tests.e2e.test_snapshot_e2e import gc_epoch
from tests.integration.test_tables_api import create, dml, ins
from tests.kit.e2e import wait_for
from tests.kit.meta import FakeWorker, committed_epoch

Manual = tuple[TestClient, MetaLoop]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The live loop's (``client``): garbage collection keeps nothing it need not."""
    return settings.model_copy(update={"gc_retention_ms": 0})


def _mv(db: Database, name: str) -> tuple[int, bool, VersionedTable]:
    """The relation's id, whether the catalog says it is indexed, and its storage."""
    with db.transaction() as s:
        rel = s.execute(select(Relation).where(Relation.name == name)).scalar_one()
        return rel.id, rel.epoch_indexed, storage_of(rel)


def _index_state(db: Database, table: VersionedTable) -> str | None:
    conn = psycopg2.connect(db.libpq_url)
    try:
        with conn.cursor() as cur:
            return table.epoch_index_state(cur)
    finally:
        conn.close()


def _job(client: TestClient, name: str, upstream: str = "orders") -> int:
    body = {"name": name, "upstream": {"table": upstream}, "backfill": "arrangement"}
    r = client.post("/v1/jobs", json=body | {"parallelism": 2})
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def _state(client: TestClient, job_id: int) -> str:
    return str(client.get(f"/v1/jobs/{job_id}").json()["state"])


@contextmanager
def _autocommit(db: Database) -> Iterator[Any]:
    conn = psycopg2.connect(db.libpq_url)
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()


def test_an_mv_gets_its_epoch_index_once_its_job_is_created(manual: Manual, db: Database) -> None:
    client, loop = manual
    create(client)
    job_id = _job(client, "mv")
    mv_id, indexed, table = _mv(db, "mv")
    assert not indexed and _index_state(db, table) is None
    orders_id = _mv(db, "orders")[0]
    assert loop.indexer.run_once() == [orders_id]  # not mv: creating, and no job reads it

    worker = FakeWorker(client).register()
    for _ in range(20):  # until created, at an epoch after the first (whose prev is 0)
        loop.tick()
        worker.collect_all(finished=True)
        if _state(client, job_id) == "created" and committed_epoch(db) > 0:
            break
    assert _state(client, job_id) == "created"

    # two versions of a key below the committed epoch: GC leaves the MV alone until its
    # epoch index is there (it would scan all of it), then compacts it
    c = committed_epoch(db)
    row = (1, "c1", None, None)
    with db.transaction() as s:
        cur = raw_cursor(s)
        table.write(cur, c - 2, [Version(row)])
        table.write(cur, c - 1, [Version((1, "c1-new", None, None))])
    assert "mv" not in {r.relation for r in gc.run_gc(db, retention_ms=0)}

    assert loop.indexer.run_once() == [mv_id]
    assert _mv(db, "mv")[1] and _index_state(db, table) == "valid"
    assert loop.indexer.run_once() == []
    done = {r.relation: r.removed_versions for r in gc.run_gc(db, retention_ms=0)}
    assert done["mv"] == 1


def test_a_creating_mv_that_a_job_reads_is_indexed_at_once(manual: Manual, db: Database) -> None:
    client, loop = manual
    create(client)
    first = _job(client, "first")
    _job(client, "second", upstream="first")  # reads first's change logs every epoch
    assert _state(client, first) == "creating"
    first_id, _, table = _mv(db, "first")
    second_id, _, _ = _mv(db, "second")
    orders_id = _mv(db, "orders")[0]
    # (not second: nothing reads it yet)
    assert loop.indexer.run_once() == [orders_id, first_id]
    assert _index_state(db, table) == "valid"


def test_a_table_gets_its_epoch_index_once_its_first_write_committed(
    manual: Manual, db: Database
) -> None:
    client, loop = manual
    create(client)
    orders_id, indexed, table = _mv(db, "orders")
    assert not indexed and _index_state(db, table) is None
    assert loop.indexer.run_once() == []  # nothing written yet
    for ops in ([ins(i) for i in range(3)], [{"op": "update", "row": {"id": 0, "amount": "2"}}]):
        # the first load is written without an epoch index to keep up
        r = client.post("/v1/tables/orders/dml", json={"ops": ops})
        assert r.status_code == 200, r.text
        loop.tick()  # (the next write goes at a later epoch)
    for _ in range(3):  # committed epochs past the writes
        loop.tick()
    # a plain table is collected without its epoch index (scanned)
    assert {r.relation: r.removed_versions for r in gc.run_gc(db, retention_ms=0)} == {"orders": 1}
    assert loop.indexer.run_once() == [orders_id]
    assert _mv(db, "orders")[1] and _index_state(db, table) == "valid"
    assert loop.indexer.run_once() == []


def test_dropping_a_table_cancels_its_build_under_way(manual: Manual, db: Database) -> None:
    client, _ = manual
    create(client)
    orders_id = _mv(db, "orders")[0]
    outcome = _build_under_way(db, orders_id, lambda: client.delete("/v1/tables/orders"))
    assert outcome and isinstance(outcome[0], errors.QueryCanceled)
    assert not EpochIndexer(db).build(orders_id)  # gone: nothing to build


def test_an_invalid_index_left_by_a_failed_build_is_built_again(
    manual: Manual, db: Database
) -> None:
    client, loop = manual
    create(client)
    _job(client, "mv")
    mv_id, _, table = _mv(db, "mv")
    with _autocommit(db) as writer, _autocommit(db) as builder:
        # an uncommitted write keeps a concurrent build waiting after it has made its index
        writer.autocommit = False
        with writer.cursor() as cur:
            table.write(cur, 5, [Version((1, "c1", None, None))])
        failed: list[BaseException] = []

        def build() -> None:
            try:
                with builder.cursor() as cur:
                    table.build_epoch_index(cur)
            except BaseException as e:  # noqa: BLE001 - the test looks at it
                failed.append(e)

        thread = threading.Thread(target=build)
        thread.start()
        wait_for(lambda: _index_state(db, table) == "invalid", 30, "the build's invalid index")
        builder.cancel()
        thread.join(timeout=30)
        writer.rollback()
    assert failed and isinstance(failed[0], errors.QueryCanceled)
    assert _index_state(db, table) == "invalid"

    assert EpochIndexer(db).build(mv_id)
    assert _index_state(db, table) == "valid" and _mv(db, "mv")[1]


def test_dropping_an_mv_cancels_its_build_under_way(manual: Manual, db: Database) -> None:
    client, _ = manual
    create(client)
    job_id = _job(client, "mv")
    mv_id, _, _ = _mv(db, "mv")
    outcome = _build_under_way(db, mv_id, lambda: client.delete(f"/v1/jobs/{job_id}"))
    assert outcome and isinstance(outcome[0], errors.QueryCanceled)
    assert not EpochIndexer(db).build(mv_id)  # gone: nothing to build


def _build_under_way(db: Database, rel_id: int, drop: Callable[[], Any]) -> list[BaseException]:
    """Drop the relation (``drop``, a request) while a build of its index is under way:
    the build lock held and a long statement running; how the statement ended."""
    outcome: list[BaseException] = []
    with _autocommit(db) as builder:
        with builder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s, %s)", [BUILD_LOCK, rel_id])

        def building() -> None:
            try:
                with builder.cursor() as cur:
                    cur.execute("SELECT pg_sleep(120)")
            except BaseException as e:  # noqa: BLE001 - the test looks at it
                outcome.append(e)
            builder.close()  # as EpochIndexer.build does: the lock goes with the session

        thread = threading.Thread(target=building)
        thread.start()
        wait_for(lambda: _sleeping(db), 30, "the build's statement")
        t0 = time.monotonic()
        assert drop().status_code in (200, 202, 204)
        thread.join(timeout=30)
        assert time.monotonic() - t0 < 60, "the drop waited for the build"
    with db.transaction() as s:
        assert s.execute(select(Relation).where(Relation.id == rel_id)).first() is None
    return outcome


def _sleeping(db: Database) -> bool:
    with _autocommit(db) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(120)'")
        return bool(cur.fetchone()[0])


def test_garbage_collection_never_holds_barriers_back(client: TestClient, db: Database) -> None:
    """A GC that waits (here on a lock on the table it compacts) does not stop the
    barrier loop: epochs go on being committed meanwhile."""
    create(client)
    dml(client, [ins(i) for i in range(10)])
    dml(client, [{"op": "update", "row": {"id": i, "amount": "2"}} for i in range(10)])
    with _autocommit(db) as locker:
        locker.autocommit = False
        with locker.cursor() as cur:
            cur.execute('LOCK TABLE store."orders" IN ACCESS EXCLUSIVE MODE')
        wait_for(lambda: _gc_waiting(db), 60, "a garbage collection waiting on the table")
        before = committed_epoch(db)
        wait_for(lambda: committed_epoch(db) > before, 60, "epochs committed meanwhile")
        assert _gc_waiting(db)
        locker.rollback()
    wait_for(lambda: gc_epoch(db, "orders") > 0, 60, "the garbage collection done")


def _gc_waiting(db: Database) -> bool:
    with _autocommit(db) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'WITH k AS (SELECT DISTINCT%%'"
        )
        return bool(cur.fetchone()[0])
