"""A pushed-down Spark task keeps its process's connection (and the statements prepared
on it) for the next task, and replaces one that broke meanwhile or failed a task."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from backfill_core.changes import Version
from backfill_core.schema import Column, ColumnType, TableSchema
from service.catalog.tables import create_table, storage_of
from service.db import Database
from service.embedded_pg import to_libpq_url
from spark_workers import pushdown_tasks
from spark_workers.pushdown_tasks import run_group
from state_store.versioned import VersionedTable

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
        # one task: every vnode, one after the other, up to 100 rows in all
        "batches": [[[100, [[v, None] for v in range(4)]]]],
    }
    try:
        yield dsn, plan, admin
    finally:
        for conn in pushdown_tasks._CONNECTIONS.values():
            conn.close()
        pushdown_tasks._CONNECTIONS.clear()
        admin.close()


def _run(plan: dict[str, Any], write_epoch: int) -> int:
    """Rows read by the plan's one task, writing at ``write_epoch``."""
    return sum(n for _, n, _ in run_group(json.dumps(plan | {"write_epoch": write_epoch}), 0))


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
    with pytest.raises(RuntimeError, match="recovered past this write"):
        _run(plan | {"recovery_seq": 1}, WRITE + 1)  # fenced off: a recovery came first
    assert dsn not in pushdown_tasks._CONNECTIONS
    with admin.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [first])
        assert cur.fetchone()[0] == 0, "the failed task's connection is still open"
    assert _run(plan, WRITE + 1) == 20 and _mv_rows(admin, WRITE + 1) == 20
