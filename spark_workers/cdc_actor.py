"""A CDC table's actor on a worker (``kind == "cdc"``): the CDC backfill executor
(``backfill_core.executors.cdc``) driven by the upstream's change stream and chunk reads
(``connectors.pg_cdc``), its writes made like DML (``docs/architecture.md#cdc-backfill``).

Between barriers (``step``, run by ``spark_workers.reads.cdc``): poll the stream
briefly, read the next chunk the executor plans, and write what the executor hands out
in one store transaction: the main graph's open epoch taken ``FOR SHARE``
(``state_store.dml.open_dml_epoch``, as DML takes it), the actor fenced, the versions
and the row-count delta at that epoch, and the executor's durable progress (position,
LSN, chunks, state) with the (epoch -> LSN) record. So the table and the progress never
disagree, and a committed epoch's table is the upstream at the largest LSN recorded at
or below it. A new incarnation (a restart, a recovery, another worker) restores the
executor from that progress and opens the stream after its LSN.

The slot confirms the LSN recorded for the main graph's committed epoch, checked after
every poll: nothing a committed epoch holds is asked for again, and nothing beyond it
is acknowledged.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from backfill_core.changes import Row, Version
from backfill_core.executors.cdc import (
    CdcBackfill,
    CdcProgress,
    CdcState,
    CdcWrite,
    ChunkPhase,
)
from backfill_core.protocol import Assignment, BarrierMessage, CollectProgress, CollectRequest
from backfill_core.schema import TableSchema, coerce_value, value_to_json
from connectors import pg_cdc as cdc
from spark_workers.actors import ActorFailed, ReadsFrom, fence
from state_store.dml import MAIN_GRAPH, add_row_count_delta, open_dml_epoch
from state_store.versioned import VersionedTable

log = logging.getLogger(__name__)

# rows of one chunk read, and how long a step waits for the stream
CHUNK_ROWS = 2_000
POLL_S = 0.05
MAX_TRANSACTIONS = 500
LAG_EVERY_S = 1.0  # the slot's lag is read at most this often

_PROGRESS = """
SELECT state, current_pos, lsn, row_count, chunks FROM cdc_tables WHERE relation_id = %s
"""
_SAVE = """
UPDATE cdc_tables SET state = %s, current_pos = %s::jsonb, lsn = %s, row_count = %s,
  chunks = %s, slot_lag_bytes = coalesce(%s, slot_lag_bytes),
  confirmed_lsn = coalesce(%s, confirmed_lsn)
WHERE relation_id = %s
"""
_RECORD = """
INSERT INTO cdc_epochs (relation_id, epoch, lsn, state, current_pos)
VALUES (%s, %s, %s, %s, %s::jsonb)
ON CONFLICT (relation_id, epoch) DO UPDATE
SET lsn = EXCLUDED.lsn, state = EXCLUDED.state, current_pos = EXCLUDED.current_pos
"""
# the LSN of the main graph's committed epoch: the last recorded at or below it
_COMMITTED_LSN = """
SELECT e.epoch, e.lsn FROM cdc_epochs e, graphs g
WHERE g.id = %s AND e.relation_id = %s AND e.epoch <= g.committed_epoch
ORDER BY e.epoch DESC LIMIT 1
"""
_FORGET = "DELETE FROM cdc_epochs WHERE relation_id = %s AND epoch < %s"

# errors of the upstream's contents: trying again cannot help (the job fails, with the code)
_FATAL = (cdc.UpstreamSchemaChanged, cdc.TruncateUnsupported, cdc.UnsupportedValue)


class CdcRunner:
    kind = "cdc"
    reads_from = ReadsFrom.POSTGRES_CDC
    # the stream goes on: reads that run out now end nothing
    reads_run_out = False

    def __init__(self, assignment: Assignment, conn: Any) -> None:
        job = assignment.job
        if job.cdc is None:
            raise ValueError(f"job {job.name!r} mirrors no upstream table")
        self.actor_id: int = assignment.actor_id
        self.recovery_seq: int = assignment.recovery_seq
        self.graph_id: int = assignment.graph_id
        self.job_id: int = assignment.job_id
        self.ref = job.cdc
        self.relation_id = job.cdc.relation_id
        self.schema = TableSchema.from_json(job.mv_schema)
        self.table = VersionedTable(job.mv_table, self.schema)
        self._pk_types = self.schema.pk_types
        self.executor = CdcBackfill(
            self.actor_id,
            self.table.key_of,
            rate_limit=job.rate_limit,
            paused=job.paused,
            restore=self._restore(conn),
        )
        self._upstream: Any = None  # the connection of chunk reads and slot checks
        self._table: cdc.UpstreamTable | None = None
        self.stream: cdc.ChangeStream | None = None
        self._saved = self.executor.progress
        self.confirmed: int | None = None
        self.lag_bytes: int | None = None
        self._lag_at = 0.0
        self._committed_epoch_seen = 0
        self._idle = False

    # durable progress -------------------------------------------------------

    def _key(self, pos: Sequence[Any] | None) -> Row | None:
        if pos is None:
            return None
        return tuple(coerce_value(t, x) for t, x in zip(self._pk_types, pos, strict=True))

    def _pos_json(self, pos: Row | None) -> list[Any] | None:
        if pos is None:
            return None
        return [value_to_json(t, x) for t, x in zip(self._pk_types, pos, strict=True)]

    def _restore(self, conn: Any) -> CdcProgress:
        """The durable progress (the table is exact at it), not a checkpoint's."""
        conn.rollback()
        with conn.cursor() as cur:
            cur.execute(_PROGRESS, [self.relation_id])
            row = cur.fetchone()
        conn.rollback()
        if row is None:
            raise ValueError(f"no CDC progress for relation {self.relation_id}")
        state, pos, lsn, rows, chunks = row
        return CdcProgress(CdcState(state), self._key(pos), int(lsn), int(rows), int(chunks))

    # the upstream -----------------------------------------------------------

    def _connect(self) -> cdc.UpstreamTable:
        if self._upstream is None or self._upstream.closed:
            self._upstream = cdc.connect(self.ref.dsn)
            self._table = None
        if self._table is None:
            t = cdc.introspect(self._upstream, cdc.TableRef.parse(self.ref.table))
            if t.schema.to_json()["columns"] != self.schema.to_json()["columns"] or (
                t.schema.primary_key != self.schema.primary_key
            ):
                raise cdc.UpstreamSchemaChanged(
                    f"the upstream table {self.ref.table} no longer has the columns and key "
                    "of the CDC table: drop the table and create it again"
                )
            self._table = t
        if self.stream is None:
            self.stream = cdc.ChangeStream(
                self.ref.dsn,
                self._table,
                slot=self.ref.slot,
                publication=self.ref.publication,
                skip_upto=self.executor.lsn,
            )
        return self._table

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None

    def rebind(self, graph_id: int, recovery_seq: int) -> None:
        self.graph_id = graph_id
        self.recovery_seq = recovery_seq

    def has_reads(self) -> bool:
        """Whether a round of reads is due now: unless the last one found the stream
        quiet and no chunk to read, in which case the worker waits for its next barrier
        (a long poll, not a busy loop of polls) and reads again after it."""
        return not self._idle

    def remaining_estimate(self, conn: Any = None) -> int:
        return 0

    def prefetch(self, messages: list[BarrierMessage]) -> None:
        """Nothing to read ahead: the stream is read between barriers."""

    # between barriers ---------------------------------------------------------

    def step(self, conn: Any) -> int:
        """Poll the stream, read a chunk if one is due, write what came of it; the
        writes made. A failure leaves the executor ahead of what was committed: the
        runner is dropped with it, and its next incarnation restores."""
        try:
            return self._step(conn)
        except _FATAL as e:
            raise ActorFailed(self.actor_id, RuntimeError(f"{e.code}: {e}"), fatal=True) from e
        except cdc.PgCdcError as e:
            self.close()  # connect again on the next incarnation
            raise ActorFailed(self.actor_id, RuntimeError(f"{e.code}: {e}")) from e

    def _step(self, conn: Any) -> int:
        ex = self.executor
        table = self._connect()
        assert self.stream is not None
        batch = self.stream.poll(POLL_S, max_transactions=MAX_TRANSACTIONS)
        writes = ex.on_changes(batch.cdc_events(), upto=batch.position)
        for read in ex.plan_reads(CHUNK_ROWS):
            rows = cdc.read_chunk(
                self._upstream, table, read, low=ex.planned_at_lsn, delivered=self.stream.delivered
            )
            writes += ex.account(read, rows)
        self._measure_lag()
        if writes or ex.progress != self._saved or self.confirmed is None:
            self._write(conn, writes)
        no_chunk = ex.finished or not ex.started or ex.paused or ex.budget == 0
        self._idle = not batch.transactions and ex.chunk_phase is ChunkPhase.IDLE and no_chunk
        return len(writes)

    def _measure_lag(self) -> None:
        now = time.monotonic()
        if now - self._lag_at < LAG_EVERY_S or self._upstream is None:
            return
        self._lag_at = now
        state = cdc.slot_state(self._upstream, self.ref.slot)
        if state is not None:
            self.lag_bytes = state.lag_bytes

    def _write(self, conn: Any, writes: list[CdcWrite]) -> None:
        """One store transaction: the writes at the open epoch (held FOR SHARE), the
        durable progress and the epoch's LSN; then the slot confirms the committed
        epoch's LSN."""
        ex = self.executor
        progress = ex.progress
        with conn.cursor() as cur:
            epoch = open_dml_epoch(cur, int(time.time() * 1000))
            fence(cur, self.graph_id, self.recovery_seq, self.actor_id)
            delta = self._write_rows(cur, epoch, writes)
            add_row_count_delta(cur, self.relation_id, epoch, delta)
            pos = json.dumps(self._pos_json(progress.current_pos))
            cur.execute(
                _SAVE,
                [
                    progress.state.value,
                    pos,
                    progress.lsn,
                    progress.row_count,
                    progress.chunks,
                    self.lag_bytes,
                    self.confirmed,
                    self.relation_id,
                ],
            )
            cur.execute(_RECORD, [self.relation_id, epoch, progress.lsn, progress.state.value, pos])
            cur.execute(_COMMITTED_LSN, [MAIN_GRAPH, self.relation_id])
            committed = cur.fetchone()
            if committed is not None and committed[0] > self._committed_epoch_seen:
                self._committed_epoch_seen = committed[0]
                cur.execute(_FORGET, [self.relation_id, committed[0]])
        conn.commit()
        self._saved = progress
        if committed is not None:
            lsn = int(committed[1])
            assert self.stream is not None
            self.stream.confirm(lsn)
            self.confirmed = lsn

    def _write_rows(self, cur: Any, epoch: int, writes: list[CdcWrite]) -> int:
        """The writes as versions at ``epoch`` (a delete carries the row it deletes, as
        DML's do); the net rows added."""
        if not writes:
            return 0
        keys = list(dict.fromkeys(w.key for w in writes))
        before: dict[Row, Row | None] = dict.fromkeys(keys)
        before.update(self.table.latest_versions(cur, epoch, keys))
        state = dict(before)
        for w in writes:
            state[w.key] = w.row
        versions = []
        for key, row in state.items():
            old = before[key]
            if row == old:
                continue
            versions.append(Version(row) if row is not None else Version(old or (), deleted=True))
        self.table.write(cur, epoch, versions)
        return sum(r is not None for r in state.values()) - sum(
            r is not None for r in before.values()
        )

    # barriers -----------------------------------------------------------------

    def on_barrier(self, conn: Any, message: BarrierMessage) -> CollectRequest:
        barrier = message.barrier
        out = self.executor.on_barrier(barrier)
        self._idle = False  # a new epoch: read the stream (and confirm) at least once
        return CollectRequest(
            self.actor_id,
            self.recovery_seq,
            barrier.epoch.prev,
            barrier.epoch.curr,
            CollectProgress.of(report=self.report()),
            out.rows,
            out.finished,
        )

    def report(self) -> dict[str, Any]:
        """What the jobs API shows of it (``progress.cdc``)."""
        ex = self.executor
        return {
            "cdc": {
                "phase": "streaming" if ex.finished else "backfilling",
                "chunks": ex.chunks,
                "rows": ex.row_count,
                "lsn": cdc.format_lsn(ex.lsn),
                "confirmed_lsn": None if self.confirmed is None else cdc.format_lsn(self.confirmed),
                "slot_lag_bytes": self.lag_bytes,
                "chunk_phase": ex.chunk_phase.value,
            },
        }
