"""The zombie fence of driver-side actors (``spark_workers.actors.fence``), pinned without
chance interleavings: an actor of an earlier incarnation of its graph writes nothing,
and a recovery waits for a write that passed the fence, then rolls it back (issue 39)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from backfill_core.changes import Version
from backfill_core.protocol import Assignment
from service.catalog.queries import get_relation, storage_of
from service.db import Database, raw_cursor
from service.meta import recovery
from service.meta.loop import MetaLoop
from spark_workers.actors import ActorRunner, Fenced, fence
from spark_workers.reads.driver import read_table
from tests.kit.e2e import wait_for
from tests.kit.meta import FakeWorker, committed_epoch, make_job

GRAPH = 1


@pytest.fixture
def actor_conn(db: Database) -> Iterator[Any]:
    """The actor's own connection, as a worker holds one."""
    conn = psycopg2.connect(db.libpq_url)
    yield conn
    conn.close()


def _mv_versions(db: Database) -> int:
    with db.transaction() as s:
        return storage_of(get_relation(s, "j_mv")).count_versions(raw_cursor(s))


def _load_upstream(db: Database, rows: int) -> None:
    """Rows of the job's upstream, committed at the first epoch any barrier reads."""
    with db.transaction() as s:
        up = storage_of(get_relation(s, "j_src"))
        up.write(raw_cursor(s), 1, [Version((i, f"v{i}")) for i in range(rows)])


def _start(manual: tuple[TestClient, MetaLoop], db: Database) -> tuple[FakeWorker, dict[str, Any]]:
    client, loop = manual
    w = FakeWorker(client).register()
    make_job(db, "j", parallelism=1)
    _load_upstream(db, 40)
    loop.tick()
    loop.tick()
    [a] = w.poll()
    return w, a


def test_an_actor_of_an_earlier_incarnation_writes_nothing(
    manual: tuple[TestClient, MetaLoop], db: Database, actor_conn: Any
) -> None:
    client, loop = manual
    w, a = _start(manual, db)
    assignment = Assignment.from_json(a)
    zombie = ActorRunner(assignment, pushdown=False)
    for b in assignment.barriers:  # the initial barrier, then one whose snapshot has the rows
        zombie.on_barrier(actor_conn, b)
    assert read_table(zombie, actor_conn, 5) == 5  # the live incarnation writes
    written = _mv_versions(db)
    assert written == 5

    # the worker is presumed dead (a failure report): the graph recovers without it
    r = client.post(f"/v1/workers/{w.worker_id}/failures", json={"message": "presumed dead"})
    assert r.status_code == 202
    loop.tick()
    [fresh] = w.poll()
    assert fresh["recovery_seq"] == a["recovery_seq"] + 1
    rolled_back = _mv_versions(db)  # the uncommitted epoch's rows are gone
    assert rolled_back == 0

    with pytest.raises(Fenced):
        read_table(zombie, actor_conn, 5)
    actor_conn.rollback()
    with pytest.raises(Fenced):
        zombie.on_barrier(actor_conn, Assignment.from_json(fresh).barriers[0])
    actor_conn.rollback()
    assert _mv_versions(db) == rolled_back


def test_a_recovery_waits_for_a_write_that_passed_the_fence_then_rolls_it_back(
    manual: tuple[TestClient, MetaLoop], db: Database, actor_conn: Any
) -> None:
    _, a = _start(manual, db)
    seq, actor = a["recovery_seq"], a["actor_id"]
    mv = storage_of(_relation(db, "j_mv"))
    with actor_conn.cursor() as cur:  # a write under the fence, not yet committed
        fence(cur, GRAPH, seq, actor)
        mv.write(cur, committed_epoch(db) + 1, [Version((1, "zombie"))])

    done = threading.Event()

    def recover() -> None:
        with db.transaction() as s:
            assert recovery.recover(s, GRAPH, int(time.time() * 1000))
        done.set()

    t = threading.Thread(target=recover, daemon=True)
    t.start()
    wait_for(lambda: _waiting_on_a_lock(db), timeout=30, what="the recovery to wait for the write")
    assert not done.is_set()
    actor_conn.commit()
    t.join(timeout=60)
    assert done.is_set(), "the recovery did not go on once the write committed"
    assert _mv_versions(db) == 0  # the write was above the committed epoch: rolled back
    with actor_conn.cursor() as cur, pytest.raises(Fenced):
        fence(cur, GRAPH, seq, actor)


def _relation(db: Database, name: str) -> Any:
    with db.transaction() as s:
        rel = get_relation(s, name)
        s.expunge(rel)
        return rel


def _waiting_on_a_lock(db: Database) -> bool:
    with db.engine.connect() as c:
        q = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        return int(c.execute(text(q)).scalar_one()) > 0
