"""Pushed-down snapshot reads as Spark tasks: the tasks of a job take its groups of reads
(each a group of vnodes read vnode after vnode under one limit) one at a time from the
job's work queue, run each as one ``state_store.pushdown.write_view`` statement, all in
one transaction per task under the same fence and at the same epochs as the
``backfill_store`` writer, and return what the executors account for, per group and
vnode: ``(group, vnode, rows read, last key read as JSON)``.

The plan is ``backfill_core.protocol.TablePlan`` (as for the rows-moving path): only where
the view is evaluated differs. The rows never leave Postgres, so a backfill costs the
server what an ``INSERT ... SELECT`` does, spread over Spark's tasks. No rows flow
through Spark either, so the tasks are a plain RDD job: a Python Data Source would add
its planning round trips for nothing.

The queue (a row of ``work_queues``, bumped on a connection of its own, outside the
task's transaction) balances the tasks: with the groups dealt out in advance, one task
often finished well before the other, its core idle meanwhile
(``bench/HISTORY.md#groups-tasks-and-the-work-queue``).
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from backfill_core.protocol import TablePlan
from backfill_core.schema import value_to_json
from spark_workers.datasource import fence_task, fenced_off
from state_store.locks import GRAPH_GATE_LOCK
from state_store.options import worker_dsn

T = TypeVar("T")
NO_ROWS = -1  # the vnode of a group's one entry when it read no rows (it still ran)
# One connection per Spark Python worker process and database (and one for work queues),
# kept between tasks (Spark reuses its Python workers): a new one prepared and planned
# the statement again in every task of every epoch, which cost several times a small
# read (bench/HISTORY.md#prepared-pushed-down-statements-and-kept-connections).
_CONNECTIONS: dict[str, Any] = {}


def _in_transaction(dsn: str, work: Callable[[Any], T]) -> T:
    """``work(cursor)`` in one transaction on this process's connection to ``dsn``,
    committed. A connection that fails is closed and forgotten; one that had broken while
    idle (a restarted server) is replaced once, before any work was done on it."""

    conn = _connection(dsn, dsn)
    try:
        with conn.cursor() as cur:
            result = work(cur)
        conn.commit()
        return result
    except BaseException:
        _forget(dsn, conn)
        raise


def _connection(key: str, dsn: str, *, autocommit: bool = False) -> Any:
    """The connection this process keeps under ``key`` (replaced if it stopped
    answering), or a new one to ``dsn``, kept from now on."""
    import psycopg2

    conn = _kept_connection(key)
    if conn is None:
        conn = _CONNECTIONS[key] = psycopg2.connect(worker_dsn(dsn))
        conn.autocommit = autocommit
    return conn


def _kept_connection(key: str) -> Any:
    """The connection kept under ``key`` if it still answers, or None."""
    import psycopg2

    conn = _CONNECTIONS.get(key)
    if conn is None or conn.closed:
        return None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
        return conn
    except psycopg2.OperationalError:
        _forget(key, conn)
        return None


def _claims(dsn: str, queue: str) -> Iterator[int]:
    """The indexes of the groups this task takes from work queue ``queue``, in order,
    until the queue is gone: each one is taken once, by whichever task asks first. The
    claims commit at once (autocommit, on a connection of their own that this process
    keeps too), so another task never waits on them."""
    import psycopg2

    key = _queue_key(dsn)
    conn = _connection(key, dsn, autocommit=True)
    try:
        with conn.cursor() as cur:
            while True:
                cur.execute(CLAIM, [queue])
                row = cur.fetchone()
                if row is None:  # the driver deleted it: its job is over
                    return
                yield int(row[0])
    except psycopg2.Error:
        _forget(key, conn)
        raise


def _queue_key(dsn: str) -> str:
    return f"{dsn} (work queue)"


# the driver creates a job's queue (nothing taken) and deletes it after the job
CLAIM = "UPDATE work_queues SET taken = taken + 1 WHERE token = %s RETURNING taken - 1"


def _forget(key: str, conn: Any) -> None:
    if _CONNECTIONS.get(key) is conn:
        del _CONNECTIONS[key]
    conn.close()


def _freeze_imports() -> None:
    """Once per Spark Python worker process, after its first task's imports: leave the objects
    alive then (modules, classes, psycopg2's) out of every later garbage collection.
    Spark reuses its Python workers, and collections that walked those objects cost more
    CPU per task than Spark's own handling of a task
    (``bench/HISTORY.md#freezing-imports-out-of-garbage-collection``)."""
    from pyspark import TaskContext

    if TaskContext.get() is not None and not gc.get_freeze_count():
        gc.collect()
        gc.freeze()


# one process per branch keeps each vnode's rows in key order (any order of the branches
# would do: ``flow.account_batch``); the rows read are kept once for the write and the
# summary: in memory
_STATEMENT_SETTINGS = "SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL work_mem = '64MB'"


def run_group(plan_text: str, index: int) -> list[tuple[int, int, int, str]]:
    """Run groups of the plan's reads inside Postgres, taking them from its work queue
    until none is left (a Spark task's body; ``index`` is the task's). Every group this
    task ran has at least one entry, ``(group, NO_ROWS, 0, "null")`` when it read none.

    A job spanning epochs (``plan.rounds``) runs each group as a round of its own
    (``_run_rounds``) and leaves the summaries in ``work_rounds`` instead."""
    from state_store.pushdown import READ, write_view
    from state_store.versioned import VersionedTable
    from state_store.view_sql import filter_sql

    _freeze_imports()
    plan = TablePlan.from_text(plan_text)
    w = plan.write
    if plan.groups is None or plan.queue is None:
        raise ValueError("a pushed-down plan has groups of reads and a work queue")
    if not plan.groups:
        # the worker's warm-up: connect now, so the first job finds the connections kept
        _connection(w.dsn, w.dsn)
        _connection(_queue_key(w.dsn), w.dsn, autocommit=True)
        return []
    groups = [
        (limit, [(v, plan.pk_from_json(a), limit) for v, a in starts])
        for limit, starts in plan.groups
    ]
    where = filter_sql(w.filter, plan.upstream_schema, READ)
    if where is None:
        raise ValueError("this view has no SQL form; the driver should not push it down")
    upstream = VersionedTable(plan.upstream_table, plan.upstream_schema)
    mv = VersionedTable(w.mv_table, w.mv_schema)
    queue = plan.queue

    def write(cur: Any, g: int, read_epoch: int, write_epoch: int) -> dict[int, tuple[int, Any]]:
        limit, reads = groups[g]
        return write_view(cur, upstream, mv, read_epoch, reads, where, write_epoch, limit=limit)

    if plan.rounds:
        _run_rounds(plan, len(groups), write)
        return []

    def work(cur: Any) -> dict[int, dict[int, tuple[int, Any]]]:
        fence_task(cur, w.graph_id, w.recovery_seq)
        cur.execute(_STATEMENT_SETTINGS)
        done: dict[int, dict[int, tuple[int, Any]]] = {}
        for g in _claims(w.dsn, queue):
            if g >= len(groups):
                break
            done[g] = write(cur, g, plan.read_epoch, w.write_epoch)
        return done

    done = _in_transaction(w.dsn, work)
    out: list[tuple[int, int, int, str]] = []
    for g, summary in done.items():
        out += [(g, v, n, _key_json(plan, last)) for v, (n, last) in summary.items()] or [
            (g, NO_ROWS, 0, "null")
        ]
    return out


def _key_json(plan: TablePlan, key: Any) -> str:
    return json.dumps(_key_values(plan, key))


def _key_values(plan: TablePlan, key: Any) -> list[Any]:
    types = plan.upstream_schema.pk_types
    return [value_to_json(t, x) for t, x in zip(types, key, strict=True)]


# A round's fence, in one statement after the gate (which a recovery takes exclusively:
# none rolls back the round's rows under it): the graph's incarnation, and the epochs the
# driver released (none: it is handling a barrier; no row: the job is over). No lock of
# the graph's row: barriers and collects do not wait for rounds.
_ROUND_FENCE = """
SELECT g.recovery_seq, q.token, q.read_epoch, q.write_epoch
FROM graphs g LEFT JOIN work_queues q ON q.token = %s
WHERE g.id = %s
"""
# Then the epoch's own lock, shared (``epoch_lock``), and a second look at the queue:
# the driver moves the queue to the next epoch and then takes this lock exclusively, to
# wait for the rounds of the epoch it moved from. A round that locked it in time is
# waited for; one that did not finds the queue moved and tries again at the next epoch.
_ROUND_EPOCH = (
    "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0)); "
    "SELECT read_epoch, write_epoch FROM work_queues WHERE token = %s"
)


def epoch_lock(queue: str, write_epoch: int) -> str:
    """The text whose hash keys the advisory lock of a job's rounds at ``write_epoch``."""
    return f"backfill rounds {queue} {write_epoch}"


_ROUND_DONE = (
    "INSERT INTO work_rounds (token, grp, read_epoch, write_epoch, summary) "
    "VALUES (%s, %s, %s, %s, %s)"
)
# how long a task waits between two looks at a queue with no epoch released (the driver
# is handling barriers some of the job's actors did not have yet: rare, some tens of ms)
ROUND_WAIT_S = (0.001, 0.005)


def _run_rounds(
    plan: TablePlan,
    n_groups: int,
    write: Callable[[Any, int, int, int], dict[int, tuple[int, Any]]],
) -> None:
    """Run each group this task takes as one round: a transaction at the epoch the driver
    released, fenced like any write and through the graph's gate, which leaves its
    summary in ``work_rounds``. While the driver has no epoch released the task waits: a
    round is accounted in the epoch it is written at, before the barrier closing that
    epoch is handled. It stops when the queue is gone."""
    assert plan.queue is not None
    queue, dsn = plan.queue, plan.write.dsn
    for g in _claims(dsn, queue):
        if g >= n_groups:
            return
        wait = ROUND_WAIT_S[0]
        while True:
            ran = _in_transaction(dsn, lambda cur, g=g: _round(plan, queue, g, cur, write))
            if ran is not None:
                break
            time.sleep(wait)
            wait = min(wait * 2, ROUND_WAIT_S[1])
        if not ran:
            return


def _round(
    plan: TablePlan,
    queue: str,
    g: int,
    cur: Any,
    write: Callable[[Any, int, int, int], dict[int, tuple[int, Any]]],
) -> bool | None:
    """One attempt at group ``g``: True when it ran, None to wait, False to stop."""
    graph_id = plan.write.graph_id
    cur.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", [GRAPH_GATE_LOCK, graph_id])
    cur.execute(_ROUND_FENCE, [queue, graph_id])
    row = cur.fetchone()
    if row is None or row[0] != plan.write.recovery_seq:
        raise fenced_off(graph_id)
    _, found, read_epoch, write_epoch = row
    if found is None:
        return False  # the driver ended the job
    if write_epoch is None:
        return None
    cur.execute(_ROUND_EPOCH, [epoch_lock(queue, write_epoch), queue])
    if cur.fetchone() != (read_epoch, write_epoch):
        return None  # moved on meanwhile (or gone: the next look says so)
    cur.execute(_STATEMENT_SETTINGS)
    summary = write(cur, g, read_epoch, write_epoch)
    done = [[v, n, _key_values(plan, last)] for v, (n, last) in summary.items()]
    cur.execute(_ROUND_DONE, [queue, g, read_epoch, write_epoch, json.dumps(done)])
    return True
