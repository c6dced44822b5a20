"""Pushed-down snapshot reads as Spark tasks: each task runs its batches of reads (each
a group of vnodes read vnode after vnode under one limit) as one
``state_store.pushdown.write_view`` statement each, in one transaction under the same
fence and at the same epochs as the ``backfill_store`` writer, and returns what the
executors account for, per vnode: ``(vnode, rows read, last key read as JSON)``.

The plan is ``datasource.Plan`` (the same JSON as the rows-moving path): only where
the view is evaluated differs. The rows never leave Postgres, so a backfill costs the
server what an ``INSERT ... SELECT`` does, spread over Spark's tasks. No rows flow
through Spark either, so the tasks are a plain RDD job over the groups: a Python Data
Source would add its planning round trips (measured: about 0.35 s against 0.13 s per
job) for nothing.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from typing import Any, TypeVar

from backfill_core.schema import value_to_json
from service.db import WORKER_DATA_OPTIONS
from spark_workers.datasource import Plan, _fence

T = TypeVar("T")
# One connection per Spark Python worker process and database, kept between tasks (Spark
# reuses its Python workers): a new one prepared and planned the statement again, some
# 60-75 ms of every task of every epoch, where a prepared one runs a small read in 10.
_CONNECTIONS: dict[str, Any] = {}


def _in_transaction(dsn: str, work: Callable[[Any], T]) -> T:
    """``work(cursor)`` in one transaction on this process's connection to ``dsn``,
    committed. A connection that fails is closed and forgotten; one that had broken while
    idle (a restarted server) is replaced once, before any work was done on it."""
    import psycopg2

    conn = _kept_connection(dsn)
    if conn is None:
        conn = _CONNECTIONS[dsn] = psycopg2.connect(dsn, options=WORKER_DATA_OPTIONS)
    try:
        with conn.cursor() as cur:
            result = work(cur)
        conn.commit()
        return result
    except BaseException:
        _forget(dsn, conn)
        raise


def _kept_connection(dsn: str) -> Any:
    """The connection kept for ``dsn`` if it still answers (its transaction begun), or
    None."""
    import psycopg2

    conn = _CONNECTIONS.get(dsn)
    if conn is None or conn.closed:
        return None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
        return conn
    except psycopg2.OperationalError:
        _forget(dsn, conn)
        return None


def _forget(dsn: str, conn: Any) -> None:
    if _CONNECTIONS.get(dsn) is conn:
        del _CONNECTIONS[dsn]
    conn.close()


def _freeze_imports() -> None:
    """Once per Spark Python worker process, after its first task's imports: leave the objects
    alive then (modules, classes, psycopg2's) out of every later garbage collection.
    Spark reuses its Python workers, and collections that walked those objects took some
    30 ms of CPU per task, three times what Spark's own handling of a task costs there."""
    from pyspark import TaskContext

    if TaskContext.get() is not None and not gc.get_freeze_count():
        gc.collect()
        gc.freeze()


def run_group(plan_text: str, index: int) -> list[tuple[int, int, str]]:
    """Run group ``index`` of the plan's reads inside Postgres (a Spark task's body)."""
    from state_store.pushdown import READ, write_view
    from state_store.versioned import VersionedTable
    from state_store.view_sql import filter_sql

    _freeze_imports()
    plan = Plan.from_json(plan_text)
    if plan.batches is None:
        raise ValueError("a pushed-down plan has batches of reads")
    batches = [
        (limit, [(v, plan.pk_from_json(a), limit) for v, a in starts])
        for limit, starts in plan.batches[index]
    ]
    if not batches:
        return []
    where = filter_sql(plan.filter, plan.upstream_schema, READ)
    if where is None:
        raise ValueError("this view has no SQL form; the driver should not push it down")
    upstream = VersionedTable(plan.upstream_table, plan.upstream_schema)
    mv = VersionedTable(plan.mv_table, plan.mv_schema)

    def work(cur: Any) -> dict[int, tuple[int, Any]]:
        _fence(cur, plan.graph_id, plan.recovery_seq)
        # one process per branch keeps each vnode's rows in key order, and the branches
        # run in order (a batch's limit counts them so)
        cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        # the rows read are kept once for the write and the summary: in memory
        cur.execute("SET LOCAL work_mem = '64MB'")
        summary: dict[int, tuple[int, Any]] = {}
        for limit, reads in batches:
            summary |= write_view(
                cur, upstream, mv, plan.read_epoch, reads, where, plan.write_epoch, limit=limit
            )
        return summary

    summary = _in_transaction(plan.dsn, work)
    types = plan.upstream_schema.pk_types
    return [
        (vnode, count, json.dumps([value_to_json(t, x) for t, x in zip(types, last, strict=True)]))
        for vnode, (count, last) in summary.items()
    ]
