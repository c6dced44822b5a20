"""Epoch indexes of MVs and tables, built once their first load is written.

An MV's table, and a user table, is created with its key index only: a backfill writes
every row of the MV, a first load (a CSV body, an import, a CDC table's backfill) every
row of the table, and an index on ``_epoch`` kept up row by row cost those writes a
third of their time or more (all of an epoch's rows go to one end of it, where the
writers queue). Built at once afterwards it costs a tenth of that. Until it exists the
relation is correct, only some reads of it are slower: rollback and change-log reads
scan the table, and garbage collection scans a plain table and leaves an MV or a CDC
table alone (``gc.run_gc``).

The leader builds it ``CONCURRENTLY`` (the writers go on meanwhile), on a thread of its
own (``chores.Chore``): for a relation a job writes (an MV, a CDC table) when that job
is created; for a plain table once a write of it committed (it has a row count delta);
for either at once when a job reads it (its change logs are read every epoch). One build
per relation at a time: a session advisory lock on the relation's id, which
``stop_build`` takes to drop the relation, cancelling a build under way
(``docs/architecture.md#layout-and-indexes``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import psycopg2
from psycopg2 import errors

from backfill_core.schema import TableSchema
from service.db import Database, Prepared
from service.errors import Unavailable
from state_store.versioned import VersionedTable

log = logging.getLogger(__name__)

BUILD_LOCK = 0x6D76_6978  # "mvix": the advisory lock's first key (the relation id is the second)
STOP_BUILD_TIMEOUT_S = 30.0

# prepared, and read alone: the leader looks up to five times a second (``INDEXER_GAP_S``)
_PENDING = Prepared(
    "indexer_pending",
    {},
    """
    SELECT r.id FROM relations r
    WHERE NOT r.epoch_indexed AND (
      EXISTS (SELECT 1 FROM jobs j WHERE j.upstream_relation_id = r.id)
      OR CASE WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.mv_relation_id = r.id)
        THEN EXISTS (SELECT 1 FROM jobs j WHERE j.mv_relation_id = r.id AND j.state = 'created')
        ELSE EXISTS (SELECT 1 FROM row_count_deltas d WHERE d.relation_id = r.id) END)
    ORDER BY r.id
    """,
)


def pending(db: Database) -> list[int]:
    """The relations whose epoch index is due: the job writing them is created (an MV, a
    CDC table), a plain table was written, or a job reads them."""
    return [int(row[0]) for row in db.rows_alone(_PENDING, {})]


class EpochIndexer:
    """Builds the due epoch indexes (a ``Chore`` of the leader: a build of a large MV
    takes a while, and the barrier loop must not wait for it)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._stopping = False
        self._building: Any = None  # the connection of the build under way

    def run_once(self) -> list[int]:
        """Build every due index; the relations built."""
        built = []
        for rel_id in pending(self.db):
            if self._stopping:
                break
            if self.build(rel_id):
                built.append(rel_id)
        return built

    def build(self, rel_id: int) -> bool:
        """Build one relation's epoch index; False if another build holds it, or the
        relation is gone (or indexed) meanwhile, or the build was cancelled (by a drop, or
        ``stop``)."""
        conn = psycopg2.connect(self.db.libpq_url)
        conn.autocommit = True  # a concurrent build runs outside a transaction
        self._building = conn
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s, %s)", [BUILD_LOCK, rel_id])
                if not cur.fetchone()[0]:
                    return False
                cur.execute(
                    "SELECT storage_table, schema FROM relations "
                    "WHERE id = %s AND NOT epoch_indexed",
                    [rel_id],
                )
                row = cur.fetchone()
                if row is None:
                    return False
                table = VersionedTable(row[0], TableSchema.from_json(row[1]))
                t0 = time.perf_counter()
                try:
                    table.build_epoch_index(cur)
                except (errors.UndefinedTable, errors.QueryCanceled):
                    return False  # dropped, or its drop (or our stop) cancelled the build
                cur.execute("UPDATE relations SET epoch_indexed = true WHERE id = %s", [rel_id])
                log.info("built the epoch index of %s in %.2f s", row[0], time.perf_counter() - t0)
                return True
        finally:
            self._building = None
            conn.close()  # and with it the advisory lock

    def cancel(self) -> None:
        """Stop: cancel the build under way, start no other."""
        self._stopping = True
        building = self._building
        if building is not None:
            with contextlib.suppress(psycopg2.Error):  # it ended meanwhile
                building.cancel()


def stop_build(cur: Any, rel_id: int, timeout_s: float = STOP_BUILD_TIMEOUT_S) -> None:
    """Hold the relation's build lock until the caller's transaction ends, cancelling a
    build under way (to drop the relation). Never waits on the lock: a concurrent build
    waits for older transactions to end, this one among them, and would deadlock with
    it."""
    deadline = time.monotonic() + timeout_s
    while True:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [BUILD_LOCK, rel_id])
        if cur.fetchone()[0]:
            return
        if time.monotonic() > deadline:
            raise Unavailable(
                "an index build on this view did not stop in time; retry in a moment",
                {"relation_id": rel_id},
            )
        cur.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s AND objid = %s AND objsubid = 2 AND granted",
            [BUILD_LOCK, rel_id],
        )
        time.sleep(0.01)  # the cancelled build ends its statement and closes
