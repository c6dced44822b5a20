"""One actor on a worker: its executor state machine and the I/O of its barriers (its
reads of the open epoch are the read strategies', ``spark_workers.reads``)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from enum import Enum
from typing import Any

from psycopg2 import sql

from backfill_core.changes import RowChange, Version
from backfill_core.executors.arrangement import ArrangementBackfill, VnodeProgress, VnodeState
from backfill_core.executors.chain import ChainBackfill
from backfill_core.executors.interface import BackfillExecutor
from backfill_core.executors.messages import ChangeRange
from backfill_core.executors.snapshot import SnapshotBackfill, VnodeBackfillProgress
from backfill_core.executors.snapshot import VnodeState as SnapshotVnodeState
from backfill_core.protocol import (
    Assignment,
    BarrierMessage,
    CollectProgress,
    CollectRequest,
    RestoreState,
    VnodeRestore,
)
from backfill_core.schema import TableSchema, coerce_value, value_to_json
from backfill_core.view import View
from state_store.pushdown import READ
from state_store.versioned import VersionedTable
from state_store.view_sql import filter_sql


class ReadsFrom(Enum):
    """Where an actor's backfill reads come from: what decides which strategies can read
    for it (every strategy serves every executor kind whose data it can read)."""

    STATE_STORE = "state_store"  # a table of ours: arrangement, chain, snapshot
    KAFKA = "kafka"  # a source's topic
    POSTGRES_CDC = "postgres_cdc"  # an upstream Postgres table's chunks and change stream


class Fenced(Exception):
    """This actor was superseded by a recovery; its work must stop."""

    def __init__(self, graph_id: int, message: str) -> None:
        super().__init__(message)
        self.graph_id = graph_id


class ActorFailed(Exception):
    """The work of an actor raised: its failure report names the actor, so that it
    counts against the actor's job (its failure policy), not the worker's other jobs.
    ``fatal``: trying again cannot help (a poison message under ``on_error: fail``)."""

    def __init__(self, actor_id: int, error: BaseException, *, fatal: bool = False) -> None:
        super().__init__(str(error) or type(error).__name__)
        self.actor_id = actor_id
        self.fatal = fatal


def fence(cur: Any, graph_id: int, recovery_seq: int, actor_id: int) -> None:
    """Refuse to write once the graph recovered past this actor's incarnation.

    The share lock makes a recovery (which rolls the MV back under an update lock on
    the same row) wait for this write to commit; a write after it sees the new recovery
    sequence and stops, so a zombie actor never leaves rows behind.
    """
    cur.execute("SELECT recovery_seq FROM graphs WHERE id = %s FOR SHARE", [graph_id])
    row = cur.fetchone()
    if row is None or row[0] != recovery_seq:
        raise Fenced(
            graph_id, f"actor {actor_id} belongs to an earlier incarnation of graph {graph_id}"
        )


class ActorRunner:
    """A table backfill actor (arrangement, chain, snapshot) against the state store."""

    reads_from = ReadsFrom.STATE_STORE
    # its snapshot is read once: when its reads run out its backfill is over, and the
    # barrier that reports it is wanted at once
    reads_run_out = True

    def __init__(self, assignment: Assignment, *, pushdown: bool = True) -> None:
        job = assignment.job
        if job.kind not in ("arrangement", "chain", "snapshot"):
            raise ValueError(f"this worker cannot run {job.kind!r} jobs yet")
        if job.upstream_table is None or job.upstream_schema is None:
            raise ValueError(f"job {job.name!r} reads no table")
        self.kind: str = job.kind
        self.actor_id: int = assignment.actor_id
        self.recovery_seq: int = assignment.recovery_seq
        self.graph_id: int = assignment.graph_id
        self.job_id: int = assignment.job_id
        self.job_columns: list[str] = list(job.columns)
        self.job_filter: Any = job.filter
        up_schema = TableSchema.from_json(job.upstream_schema)
        self.upstream = VersionedTable(job.upstream_table, up_schema)
        self.mv = VersionedTable(job.mv_table, TableSchema.from_json(job.mv_schema))
        self.view = View.build(up_schema, job.columns, job.filter)
        # the driver's reads run inside Postgres too when the view has a SQL form: the
        # rows never reach this process, which saves the CPU the upstream shares
        self.pushed_where = filter_sql(job.filter, up_schema, READ) if pushdown else None
        self._pk_types = up_schema.pk_types
        self.pk_types = up_schema.pk_types
        self.estimated_rows: int | None = None  # this actor's share of the upstream
        self.vnode_ranges: list[tuple[int, int]] = [(lo, hi) for lo, hi in assignment.vnodes]
        vnodes = [v for lo, hi in self.vnode_ranges for v in range(lo, hi)]
        restore = assignment.restore or RestoreState()
        self.executor: BackfillExecutor
        self._truncate = False
        # a poll's barriers (``prefetch``) and the change logs read ahead for them
        self._poll: list[BarrierMessage] = []
        self._logs: dict[tuple[int, int, tuple[int, ...]], list[RowChange]] | None = None
        if self.kind == "snapshot":
            if job.snapshot_epoch is None:
                raise ValueError(f"snapshot job {job.name!r} has no snapshot epoch")
            snapshot_epoch = job.snapshot_epoch
            self.executor = SnapshotBackfill(
                self.actor_id,
                vnodes,
                self.upstream.key_of,
                snapshot_epoch,
                rate_limit=job.rate_limit,
                paused=job.paused,
                restore=self._restore_snapshot(restore, snapshot_epoch),
                created=job.state == "created",
                progress_at_first_barrier=True,
            )
        elif self.kind == "chain":
            # no mid-backfill progress (as in the seed): unless the job was created, the
            # actor starts over on an empty view of its vnodes
            finished = restore.finished or job.state == "created"
            self._truncate = not finished
            self.executor = ChainBackfill(
                self.actor_id,
                vnodes,
                self.upstream.key_of,
                rate_limit=job.rate_limit,
                paused=job.paused,
                finished=finished,
            )
        else:
            self.executor = ArrangementBackfill(
                self.actor_id,
                vnodes,
                self.upstream.key_of,
                rate_limit=job.rate_limit,
                paused=job.paused,
                restore=self._restore(restore),
            )

    # progress as JSON ---------------------------------------------------------

    def _key(self, pos: list[Any] | None) -> tuple[Any, ...] | None:
        """A position from JSON back to a typed primary key."""
        if pos is None:
            return None
        return tuple(coerce_value(t, x) for t, x in zip(self._pk_types, pos, strict=True))

    def _restore(self, restore: RestoreState) -> dict[int, VnodeProgress]:
        return {
            v.vnode: VnodeProgress(VnodeState(v.state), self._key(v.current_pos), v.row_count)
            for v in restore.vnodes
        }

    def _restore_snapshot(
        self, restore: RestoreState, snapshot_epoch: int
    ) -> dict[int, VnodeBackfillProgress]:
        # Progress is stored at the committed epoch, a fake one during the snapshot: the
        # executor counts it at the snapshot epoch there (and at the first barrier's
        # epoch once the snapshot is over: ``progress_at_first_barrier``).
        return {
            v.vnode: VnodeBackfillProgress(
                snapshot_epoch, v.row_count, SnapshotVnodeState(v.state), self._key(v.current_pos)
            )
            for v in restore.vnodes
        }

    def rebind(self, graph_id: int, recovery_seq: int) -> None:
        """The job merged into another graph: same executor, new fence."""
        self.graph_id = graph_id
        self.recovery_seq = recovery_seq

    def _progress(self) -> tuple[VnodeRestore, ...]:
        """The executor's per-vnode progress, its positions as JSON values."""
        rows = (VnodeRestore.from_json(r) for r in self.executor.progress_rows())
        return tuple(replace(v, current_pos=self._pos_json(v.current_pos)) for v in rows)

    def _pos_json(self, pos: Any) -> list[Any] | None:
        if pos is None:
            return None
        return [value_to_json(t, x) for t, x in zip(self._pk_types, pos, strict=True)]

    def remaining_estimate(self, conn: Any) -> int:
        """Rows still to read, from the planner's row estimate (cheap, approximate)."""
        if self.estimated_rows is None:
            with conn.cursor() as cur:
                # as the planner does: the rows per page when the statistics were taken
                # (an index build takes them too: a table's epoch index, built after its
                # first write, saw a fraction of a load) times the pages there are now
                cur.execute(
                    "SELECT reltuples, relpages, "
                    "pg_relation_size(oid) / current_setting('block_size')::int "
                    "FROM pg_class WHERE oid = to_regclass(%s)",
                    [f'store."{self.upstream.name}"'],
                )
                row = cur.fetchone()
                total = -1.0
                if row is not None and row[0] is not None and row[0] >= 0 and row[1] > 0:
                    total = float(row[0]) / row[1] * row[2]
                if total < 0:  # never analysed (or when empty): count once
                    cur.execute(sql.SQL("SELECT count(*) FROM {}").format(self.upstream.ident))
                    total = float(cur.fetchone()[0])
            conn.rollback()
            share = len(self.executor.vnodes) / self.upstream.schema.vnode_count
            self.estimated_rows = int(total * share)
        return max(0, self.estimated_rows - self.executor.total_rows)

    # epochs -----------------------------------------------------------------

    def _fence(self, cur: Any) -> None:
        fence(cur, self.graph_id, self.recovery_seq, self.actor_id)

    def has_reads(self) -> bool:
        return bool(self.executor.plan_reads(1))

    def prefetch(self, messages: list[BarrierMessage]) -> None:
        """A poll with several barriers, in one transaction: a replay's, each needing the
        change log of the epochs after the last. The first barrier needing changes reads
        them all at once (``_read_ahead``); the first barrier's fence holds for the rest."""
        self._poll = messages
        self._logs = None

    def close(self) -> None:
        """Nothing held outside the store's connection, which is the worker's."""

    def on_barrier(self, conn: Any, message: BarrierMessage) -> CollectRequest:
        """Complete the closing epoch (write its changes) and return the collect, in the
        caller's transaction: the worker commits once it handled the actor's barriers."""
        barrier = message.barrier
        ex = self.executor
        at = next((i for i, m in enumerate(self._poll) if m is message), None)
        if at is None:  # a poll of one barrier (or what a failed poll left)
            self._poll, self._logs = [], None
        with conn.cursor() as cur:
            if not at:
                self._fence(cur)  # held until the commit: the poll's later barriers are fenced
            needed = ex.changes_needed(barrier)
            if needed is not None and at is not None and self._logs is None:
                self._logs = self._read_ahead(cur, needed, self._poll[at + 1 :])
            changes = self._changes(cur, needed) if needed else []
            if self._truncate:
                for lo, hi in self.vnode_ranges:
                    self.mv.delete_vnodes(cur, lo, hi)
                self._truncate = False
            out = ex.on_barrier(barrier, changes, upstream_latest_epoch=message.upstream_epoch)
            versions = []
            for c in out.emit:
                mc = self.view.change(c)
                if mc is None:
                    continue
                versions.append(
                    Version(mc.new) if mc.new is not None else Version(mc.row, deleted=True)
                )
            self.mv.write(cur, out.write_epoch, versions)
        if at is not None and at == len(self._poll) - 1:
            self._poll, self._logs = [], None
        return CollectRequest(
            self.actor_id,
            self.recovery_seq,
            barrier.epoch.prev,
            barrier.epoch.curr,
            self._report(),
            out.rows,
            out.finished,
        )

    def _read_ahead(
        self, cur: Any, needed: ChangeRange, later: list[BarrierMessage]
    ) -> dict[tuple[int, int, tuple[int, ...]], list[RowChange]]:
        """The change logs the poll's barriers would read one by one, if the executor
        goes on as a replay does: ``needed``, then each ``later`` barrier's epochs after
        the last (a barrier needing anything else reads it itself)."""
        bounds = [needed.after, needed.upto]
        for m in later:
            if m.barrier.epoch.prev > bounds[-1]:
                bounds.append(m.barrier.epoch.prev)
        if len(bounds) < 3:
            return {}
        logs = self.upstream.change_logs(cur, bounds, list(needed.vnodes))
        ranges = itertools.pairwise(bounds)
        return {(lo, hi, needed.vnodes): log for (lo, hi), log in zip(ranges, logs, strict=True)}

    def _changes(self, cur: Any, needed: ChangeRange) -> list[RowChange]:
        key = (needed.after, needed.upto, needed.vnodes)
        read = self._logs.pop(key, None) if self._logs else None
        if read is not None:
            return read
        return self.upstream.change_log_range(cur, needed.after, needed.upto, list(needed.vnodes))

    def _report(self) -> CollectProgress:
        return CollectProgress.of(vnodes=self._progress(), report=self.executor.report())
