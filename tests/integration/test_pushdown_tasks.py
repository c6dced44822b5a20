"""A pushed-down Spark task keeps its process's connections (and the statements prepared
on them) for the next task, and replaces one that broke meanwhile or failed a task; the
tasks of a job take its groups of reads from its work queue, each group once; the rounds
of a job spanning epochs run at the epoch the driver released only, a barrier never waits
for them, and a recovery waits for the rounds under way, never for the next ones."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from sqlalchemy import text

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType, TableSchema
from service.catalog.queries import storage_of
from service.db import Database
from service.embedded_pg import to_libpq_url
from service.meta.barriers import gate_graph, lock_graph
from service.usecases.tables import create_table
from spark_workers import pushdown_tasks
from spark_workers.datasource import FencedOff
from spark_workers.pushdown_tasks import run_group
from state_store.locks import GRAPH_GATE_LOCK
from state_store.versioned import VersionedTable
from tests.kit.e2e import wait_for

pytestmark = pytest.mark.db
SCHEMA = TableSchema.build(
    [Column("id", ColumnType.BIGINT, False), Column("v", ColumnType.TEXT)], ["id"], vnode_count=4
)
LOADED, WRITE = 1 << 16, 2 << 16


@pytest.fixture
def setup(db: Database, fresh_db_url: str) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(dsn, a plan reading every vnode of a 20-row upstream into an empty MV, admin)."""
    dsn = to_libpq_url(fresh_db_url)
    rel = create_table(db, "orders", SCHEMA)
    admin = psycopg2.connect(dsn)
    with admin.cursor() as cur:
        storage_of(rel).write(cur, LOADED, [Version((i, f"r{i}")) for i in range(20)])
        VersionedTable("mv", SCHEMA).create(cur, epoch_index=False)
    admin.commit()
    admin.autocommit = True
    plan = {
        "dsn": dsn,
        "upstream_table": rel.storage_table,
        "upstream_schema": SCHEMA.to_json(),
        "mv_table": "mv",
        "mv_schema": SCHEMA.to_json(),
        "columns": ["id", "v"],
        "filter": None,
        "graph_id": rel.graph_id,
        "recovery_seq": 0,
        "read_epoch": LOADED,
        "write_epoch": WRITE,
        "partitions": [],
        # one group: every vnode, one after the other, up to 100 rows in all
        "groups": [[100, [[v, None] for v in range(4)]]],
    }
    try:
        yield dsn, plan, admin
    finally:
        for conn in pushdown_tasks._CONNECTIONS.values():
            conn.close()
        pushdown_tasks._CONNECTIONS.clear()
        admin.close()


_queues = itertools.count()


def _queue(dsn: str, taken: int = 0) -> str:
    """A new work queue, as the driver makes one for a job, ``taken`` groups gone."""
    token = f"q{next(_queues)}"
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        cur.execute("INSERT INTO work_queues (token, taken) VALUES (%s, %s)", [token, taken])
    conn.close()
    return token


def _run(plan: dict[str, Any], write_epoch: int) -> int:
    """Rows read by one task running the whole plan (a work queue of its own), writing at
    ``write_epoch``."""
    plan = plan | {"write_epoch": write_epoch, "queue": _queue(plan["dsn"])}
    return sum(n for _, _, n, _ in run_group(json.dumps(plan), 0))


def _mv_rows(admin: Any, epoch: int) -> int:
    with admin.cursor() as cur:
        cur.execute('SELECT count(*) FROM store."mv" WHERE _epoch = %s', [epoch])
        return int(cur.fetchone()[0])


def _backend(dsn: str) -> int:
    return int(pushdown_tasks._CONNECTIONS[dsn].info.backend_pid)


def test_tasks_of_one_process_share_a_connection_and_outlive_its_loss(
    setup: tuple[str, dict[str, Any], Any],
) -> None:
    dsn, plan, admin = setup
    assert _run(plan, WRITE) == 20 and _mv_rows(admin, WRITE) == 20
    first = _backend(dsn)
    assert _run(plan, WRITE + 1) == 20
    assert _backend(dsn) == first, "the second task opened a connection of its own"

    # the server ends the idle connection (a restart would): the next task replaces it
    with admin.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [first])
    assert _run(plan, WRITE + 2) == 20 and _mv_rows(admin, WRITE + 2) == 20
    assert _backend(dsn) != first


def test_a_failed_task_leaves_no_connection_behind(
    setup: tuple[str, dict[str, Any], Any],
) -> None:
    dsn, plan, admin = setup
    assert _run(plan, WRITE) == 20
    first = _backend(dsn)
    with pytest.raises(FencedOff):
        _run(plan | {"recovery_seq": 1}, WRITE + 1)  # fenced off: a recovery came first
    assert dsn not in pushdown_tasks._CONNECTIONS
    # closed by the task; its server process leaves pg_stat_activity a moment later
    wait_for(
        lambda: _one(admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", first) == 0,
        30,
        "the failed task's connection closed",
    )
    assert _run(plan, WRITE + 1) == 20 and _mv_rows(admin, WRITE + 1) == 20


def test_the_tasks_of_a_job_take_each_group_once(setup: tuple[str, dict[str, Any], Any]) -> None:
    """Tasks sharing a work queue: what one took, the next does not run again; a group
    that read nothing still says it ran; a task whose queue is gone runs nothing."""
    dsn, plan, admin = setup
    groups = [[5, [[0, None], [1, None]]], [100, [[2, None]]], [3, [[3, [100]]]]]
    # another task of the job got here first and took group 0
    job = json.dumps(plan | {"groups": groups, "queue": _queue(dsn, taken=1)})
    got = run_group(job, 1)
    assert {g for g, *_ in got} == {1, 2}
    in_vnode_2 = sum(VersionedTable("mv", SCHEMA).vnode_of((i, "")) == 2 for i in range(20))
    assert [(v, n) for g, v, n, _ in got if g == 1] == [(2, in_vnode_2)]
    assert [(v, n) for g, v, n, _ in got if g == 2] == [(pushdown_tasks.NO_ROWS, 0)]
    assert run_group(job, 0) == [], "a task ran groups another had taken"
    assert _mv_rows(admin, WRITE) == in_vnode_2
    # the driver deleted the queue (its job failed, say): a task still to start stops
    gone = json.dumps(plan | {"groups": groups, "queue": "no such queue"})
    assert run_group(gone, 0) == []
    assert _mv_rows(admin, WRITE) == in_vnode_2


# a job spanning epochs (spark_workers.rounds) ----------------------------------------

WHOLE = 1 << 40  # a group's limit when it reads its vnodes to their ends
BOTH_HALVES = [[WHOLE, [[0, None], [1, None]]], [WHOLE, [[2, None], [3, None]]]]


def _rounds_job(dsn: str, plan: dict[str, Any], released: int | None) -> str:
    """A job spanning epochs over ``BOTH_HALVES`` (reading the load), the driver having
    released epoch ``released`` (None: it is handling a barrier)."""
    token = _queue(dsn)
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        cur.execute(
            "UPDATE work_queues SET read_epoch = %s, write_epoch = %s WHERE token = %s",
            [LOADED, released, token],
        )
    conn.close()
    return json.dumps(plan | {"groups": BOTH_HALVES, "queue": token, "rounds": True})


def _in_thread(job: str) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(run_group(job, 0)), daemon=True)
    t.start()
    return t, out


def _one(admin: Any, query: str, *params: Any) -> Any:
    with admin.cursor() as cur:
        cur.execute(query, list(params))
        return cur.fetchone()[0]


def test_rounds_wait_while_the_driver_handles_a_barrier(
    setup: tuple[str, dict[str, Any], Any],
) -> None:
    """The driver closed the epoch it had released (a barrier closing it came): the task
    takes a group and waits, writing nothing, until the driver releases the next epoch;
    then every group runs there as a round of its own, its summary left for the driver."""
    dsn, plan, admin = setup
    job = _rounds_job(dsn, plan, released=None)
    token = json.loads(job)["queue"]
    task, out = _in_thread(job)
    wait_for(lambda: _one(admin, "SELECT taken FROM work_queues WHERE token = %s", token) == 1)
    assert task.is_alive()
    assert _one(admin, "SELECT count(*) FROM work_rounds WHERE token = %s", token) == 0
    assert _one(admin, 'SELECT count(*) FROM store."mv"') == 0
    with admin.cursor() as cur:  # the driver handled the barrier and releases its epoch
        cur.execute("UPDATE work_queues SET write_epoch = %s WHERE token = %s", [WRITE + 1, token])
    task.join(60)
    assert not task.is_alive() and out == [[]]
    with admin.cursor() as cur:
        cur.execute(
            "SELECT grp, read_epoch, write_epoch, summary FROM work_rounds WHERE token = %s "
            "ORDER BY grp",
            [token],
        )
        rounds = cur.fetchall()
    assert [r[:3] for r in rounds] == [(0, LOADED, WRITE + 1), (1, LOADED, WRITE + 1)]
    mv = VersionedTable("mv", SCHEMA)
    for grp, _, _, summary in rounds:
        for vnode, n, last in json.loads(summary):
            keys = [i for i in range(20) if mv.vnode_of((i, "")) == vnode]
            assert vnode in (2 * grp, 2 * grp + 1) and (n, last) == (len(keys), [max(keys)])
    assert _mv_rows(admin, WRITE + 1) == 20


def test_rounds_stop_when_the_driver_ends_the_job(setup: tuple[str, dict[str, Any], Any]) -> None:
    dsn, plan, admin = setup
    job = _rounds_job(dsn, plan, released=None)
    token = json.loads(job)["queue"]
    task, out = _in_thread(job)
    wait_for(lambda: _one(admin, "SELECT taken FROM work_queues WHERE token = %s", token) == 1)
    with admin.cursor() as cur:  # a barrier changed the actors: the driver ends the job
        cur.execute("DELETE FROM work_queues WHERE token = %s", [token])
    task.join(60)
    assert not task.is_alive() and out == [[]]
    assert _one(admin, 'SELECT count(*) FROM store."mv"') == 0
    assert _one(admin, "SELECT count(*) FROM work_rounds") == 0


def test_rounds_are_fenced_off_after_a_recovery(setup: tuple[str, dict[str, Any], Any]) -> None:
    dsn, plan, admin = setup
    job = _rounds_job(dsn, plan | {"recovery_seq": 1}, released=WRITE)
    with pytest.raises(FencedOff):
        run_group(job, 0)
    assert _one(admin, 'SELECT count(*) FROM store."mv"') == 0


def test_barriers_never_wait_for_rounds_and_a_recovery_for_those_under_way_only(
    setup: tuple[str, dict[str, Any], Any], db: Database
) -> None:
    """Rounds fence themselves with the graph's gate, held shared, and lock nothing of its
    row: a barrier's lock of the row does not wait for them. A recovery takes the gate
    exclusively: it waits for the round under way, and the next round (the tasks' rounds
    overlap: shared requests would otherwise never leave it free) waits behind it."""
    dsn, plan, admin = setup
    graph = plan["graph_id"]
    fence = "SELECT pg_advisory_xact_lock_shared(%s, %s); SELECT recovery_seq FROM graphs "
    fence += "WHERE id = %s"
    under_way = psycopg2.connect(dsn)
    with under_way.cursor() as cur:
        cur.execute(fence, [GRAPH_GATE_LOCK, graph, graph])
    with db.transaction() as s:  # a barrier's injection or collect
        s.execute(text("SET LOCAL lock_timeout = '20s'"))
        lock_graph(s, graph)
    order: list[str] = []

    def recovery() -> None:
        with db.transaction() as s:
            gate_graph(s, graph)
            order.append("recovery")

    def next_round() -> None:
        conn = psycopg2.connect(dsn)
        with conn, conn.cursor() as cur:
            cur.execute(fence, [GRAPH_GATE_LOCK, graph, graph])
            order.append("round")
        conn.close()

    waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    threads = [threading.Thread(target=recovery, daemon=True)]
    threads[0].start()
    wait_for(lambda: _one(admin, waiting) == 1, what="the recovery waiting")
    threads.append(threading.Thread(target=next_round, daemon=True))
    threads[1].start()
    wait_for(lambda: _one(admin, waiting) == 2, what="the next round queued behind it")
    assert order == []
    under_way.commit()
    for t in threads:
        t.join(60)
    assert order == ["recovery", "round"]
    under_way.close()


def test_moving_a_job_on_waits_for_the_rounds_of_the_epoch_it_leaves_only(
    setup: tuple[str, dict[str, Any], Any],
) -> None:
    """The driver moves the queue to the next epoch, then waits for the rounds still at
    the epoch it left (they hold its lock shared): a round there is over before the driver
    accounts, while the tasks' rounds at the next epoch go on meanwhile."""
    dsn, plan, admin = setup
    job = _rounds_job(dsn, plan, released=WRITE)
    token = json.loads(job)["queue"]
    under_way = psycopg2.connect(dsn)  # a round at WRITE, still writing
    with under_way.cursor() as cur:
        cur.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))",
            [pushdown_tasks.epoch_lock(token, WRITE)],
        )
    moved: list[str] = []

    def move_on() -> None:  # RoundsJob.close with the next epochs
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(
                "UPDATE work_queues SET write_epoch = %s WHERE token = %s", [WRITE + 1, token]
            )
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                [pushdown_tasks.epoch_lock(token, WRITE)],
            )
        moved.append("moved")
        conn.close()

    driver = threading.Thread(target=move_on, daemon=True)
    driver.start()
    waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    wait_for(lambda: _one(admin, waiting) == 1, what="the driver waiting for the round")
    assert run_group(job, 0) == []  # the tasks' rounds at the next epoch do not wait
    assert _one(admin, "SELECT min(write_epoch) FROM work_rounds WHERE token = %s", token) == (
        WRITE + 1
    )
    assert _mv_rows(admin, WRITE + 1) == 20 and moved == []
    under_way.commit()
    driver.join(60)
    assert moved == ["moved"]
    under_way.close()
