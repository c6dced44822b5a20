"""CDC backfill: a table mirrored from an upstream Postgres through logical replication,
its initial contents read in primary-key chunks and merged with the change stream
(DBLog's watermarks, as Flink CDC's incremental snapshot does for Postgres with LSNs).

No seed: the rules are DBLog's, stated in ``docs/architecture.md#cdc-backfill``.

The change stream delivers the upstream's committed changes in commit-LSN order, a
transaction at a time (``on_changes``; every event of a transaction carries its commit
LSN, a primary-key change is a delete of the old key and an insert of the new one).
``lsn`` is the stream's position: every change at or below it has been delivered.

A chunk is read by the caller as the executor plans it (``plan_reads``): ``low`` = the
upstream's current WAL LSN; ``SELECT ... WHERE pk > after ORDER BY pk LIMIT n`` in a
short transaction of its own; ``high`` = the current WAL LSN again. The read's snapshot
holds every change at or below ``low`` and none above ``high``. The chunk covers the
keys ``(after, last key read]``, or ``(after, +inf)`` when the table ended. A ``low``
below the true one (not below the stream's position at planning, which is checked) is
still exact: it only lets more changes replace the read's rows.

The merge: the chunk is held until the stream passes ``high``. A change at an LSN in
``(low, high]`` to a key of the chunk's range replaces that key's entry in the held
chunk (the change wins; a delete takes the key out; an insert of a key the read missed
puts it in); a change at or below ``low`` is already in the read. When the stream passes
``high`` the held rows are written and ``current_pos`` moves to the chunk's last key (or
to the end). Changes to keys at or below ``current_pos`` are always written; changes to
keys above it are dropped (a later chunk reads them, from a snapshot taken after them).

So after the stream passes ``L``, our table is exactly the upstream at ``L`` restricted
to the keys at or below ``current_pos``, and holds no key above it; once the last chunk
is merged it is the upstream at ``L``. A restore keeps that: it restores
``current_pos`` and ``lsn`` (the checkpoint's, our table rolled back to it), drops any
held or planned chunk, and the stream resumes after ``lsn``; the chunk is read again.

Reads are positioned by LSN watermarks, not by an epoch's snapshot, so a planned read
may be accounted after a barrier; a held chunk waits across barriers for the stream.
A read is planned only while no other is planned or held: the next chunk starts after
the last key of this one. Changes that arrive while a read is planned and not yet
accounted are kept (those above ``current_pos``) and merged when it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backfill_core.changes import Op, Row
from backfill_core.executors.arrangement import epoch_budget
from backfill_core.executors.flow import apply_flow_mutation, check_closes_open_epoch
from backfill_core.executors.interface import ReadGrouping
from backfill_core.executors.messages import Barrier, ReadProvenanceError

__all__ = [
    "CdcBackfill",
    "CdcBarrierOutput",
    "CdcEvent",
    "CdcProgress",
    "CdcState",
    "CdcWrite",
    "ChunkPhase",
    "ChunkRead",
    "ChunkRows",
    "key_change",
]


class CdcState(StrEnum):
    BACKFILLING = "backfilling"  # chunks left after ``current_pos``
    FINISHED = "finished"  # every chunk merged: every change is written


class ChunkPhase(StrEnum):
    IDLE = "idle"  # no chunk: the next read may be planned
    READING = "reading"  # planned, not yet accounted: changes above current_pos are kept
    HOLDING = "holding"  # accounted, waiting for the stream to pass its high watermark


@dataclass(frozen=True, slots=True)
class CdcEvent:
    """One committed change of the upstream table at commit LSN ``lsn``: ``row`` is the
    full new row (None for a delete), ``key`` its primary key (the old one for a delete)."""

    lsn: int
    op: Op
    key: Row
    row: Row | None

    def __post_init__(self) -> None:
        if (self.row is None) != (self.op is Op.DELETE):
            raise ValueError(f"a CDC {self.op} at {self.lsn} with row={self.row!r}")


def key_change(lsn: int, old_key: Row, new_key: Row, new_row: Row) -> tuple[CdcEvent, CdcEvent]:
    """A primary-key update as the executor takes it: the old key deleted, the new inserted."""
    return CdcEvent(lsn, Op.DELETE, old_key, None), CdcEvent(lsn, Op.INSERT, new_key, new_row)


@dataclass(frozen=True, slots=True)
class CdcWrite:
    """What to write to our table: ``row`` at ``key``, or delete ``key`` (row None)."""

    key: Row
    row: Row | None


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """Read the first ``limit`` rows after ``after`` (pk, exclusive; None: the start)
    between two WAL LSN watermarks. ``chunk`` numbers the table's chunks from 1."""

    chunk: int
    after: Row | None
    limit: int


@dataclass(frozen=True, slots=True)
class ChunkRows:
    """A chunk read's result: the WAL LSN before (``low``) and after (``high``) its
    statement, its rows in key order, and whether the table ended within it (a read
    returning fewer rows than its limit did)."""

    low: int
    high: int
    rows: Sequence[Row]
    ended: bool


@dataclass(frozen=True, slots=True)
class CdcProgress:
    """What a checkpoint commits (and a restore takes back): the last key merged, the
    stream position everything written is exact at, rows read and chunks merged."""

    state: CdcState = CdcState.BACKFILLING
    current_pos: Row | None = None  # None: no chunk merged yet (or the table was empty)
    lsn: int = 0
    row_count: int = 0
    chunks: int = 0

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CdcProgress:
        """Parse ``progress_rows()[0]`` (committed progress)."""
        pos = row.get("current_pos")
        return cls(
            CdcState(row["state"]),
            None if pos is None else tuple(pos),
            int(row["lsn"]),
            int(row.get("row_count", 0)),
            int(row.get("chunks", 0)),
        )


@dataclass(frozen=True, slots=True)
class CdcBarrierOutput:
    """At a barrier: the epoch it closes (``write_epoch``: the writes of ``on_changes``
    and ``account`` since the last barrier belong to it), the stream position the table
    is exact at then (``lsn``: recorded with the epoch, and the slot may confirm up to it
    once the epoch is committed), progress, snapshot rows read in the epoch, finish."""

    write_epoch: int
    lsn: int
    progress: dict[str, Any]
    rows: int
    finished: bool


@dataclass(slots=True)
class _Held:
    """A chunk accounted and not yet merged: its rows by key, changed in place by the
    changes in ``(low, high]`` to keys of its range ``(after, upto]`` (upto None: +inf)."""

    read: ChunkRead
    low: int
    high: int
    upto: Row | None
    ended: bool
    last_key: Row | None  # the last key read (None: the read found no row)
    rows: dict[Row, Row]
    read_rows: int

    def covers(self, key: Row) -> bool:
        after = self.read.after
        return (after is None or key > after) and (self.upto is None or key <= self.upto)


class CdcBackfill:
    def __init__(
        self,
        actor_id: int,
        key_of: Callable[[Row], Row],
        *,
        start_lsn: int = 0,
        rate_limit: int | None = None,
        paused: bool = False,
        restore: CdcProgress | None = None,
    ) -> None:
        """``start_lsn``: where a new job's stream starts (the slot's consistent point);
        ``restore``: committed progress, whose ``lsn`` the stream resumes after."""
        self.actor_id = actor_id
        self.key_of = key_of
        self.rate_limit = rate_limit
        self.paused = paused
        p = restore if restore is not None else CdcProgress(lsn=start_lsn)
        self.state = p.state
        self.current_pos = p.current_pos
        self.lsn = p.lsn
        self.row_count = p.row_count
        self.chunks = p.chunks
        self.chunk_phase = ChunkPhase.IDLE
        self.planned: ChunkRead | None = None
        self.planned_at_lsn = 0
        self.pending: list[CdcEvent] = []  # changes above current_pos while READING
        self.held: _Held | None = None
        self.started = False
        self.open_epoch = 0
        self.budget: int | None = 0
        self.epoch_rows = 0

    @property
    def finished(self) -> bool:
        return self.state is CdcState.FINISHED

    @property
    def total_rows(self) -> int:
        return self.row_count

    @property
    def progress(self) -> CdcProgress:
        """What a checkpoint at this point commits."""
        return CdcProgress(self.state, self.current_pos, self.lsn, self.row_count, self.chunks)

    # barriers -------------------------------------------------------------

    def on_barrier(self, barrier: Barrier) -> CdcBarrierOutput:
        """Close the open epoch (its writes were handed out by ``on_changes`` and
        ``account``), then open the next one. A planned or held chunk carries over."""
        check_closes_open_epoch(self.started, self.open_epoch, barrier)
        out = CdcBarrierOutput(
            write_epoch=barrier.epoch.prev,
            lsn=self.lsn,
            progress={"table": self.progress_rows(), **self.report()},
            rows=self.epoch_rows if self.started else 0,
            finished=self.finished,
        )
        self.started = True
        self.paused, self.rate_limit = apply_flow_mutation(
            self.actor_id, barrier.mutation, self.paused, self.rate_limit
        )
        self.open_epoch = barrier.epoch.curr
        self.budget = epoch_budget(self.rate_limit, self.paused, barrier.elapsed_ms, self.budget)
        self.epoch_rows = 0
        return out

    # the change stream ----------------------------------------------------

    def on_changes(self, events: Sequence[CdcEvent], *, upto: int | None = None) -> list[CdcWrite]:
        """The stream delivered ``events`` (whole transactions, LSNs ascending, all above
        ``lsn``) and passed ``upto`` (at or above the last event; default: the last
        event's LSN, or nowhere new). Returns the writes, in order."""
        last = self.lsn
        for e in events:
            if e.lsn <= self.lsn:
                raise ValueError(
                    f"a change at LSN {e.lsn}, where the stream already passed {self.lsn} "
                    "(delivered twice, or a transaction split over two deliveries)"
                )
            if e.lsn < last:
                raise ValueError(f"changes out of LSN order: {e.lsn} after {last}")
            last = e.lsn
        if upto is not None and upto < last:
            raise ValueError(f"the stream cannot pass {upto} before its change at {last}")
        writes: list[CdcWrite] = []
        for e in events:
            self._on_change(e, writes)
        self.lsn = max(last, upto if upto is not None else last)
        self._passed(self.lsn, writes)
        return writes

    def _passed(self, lsn: int, writes: list[CdcWrite]) -> None:
        """The stream passed ``lsn``: merge a held chunk whose high watermark it reached."""
        if self.held is not None and lsn >= self.held.high:
            self._merge(writes)

    def _on_change(self, e: CdcEvent, writes: list[CdcWrite]) -> None:
        # the stream passed everything below this change's LSN: a chunk whose high
        # watermark lies below it is merged before the change is looked at
        self._passed(e.lsn - 1, writes)
        if self._written(e.key):
            writes.append(CdcWrite(e.key, e.row))
        elif self.chunk_phase is ChunkPhase.READING:
            self.pending.append(e)
        elif self.held is not None and e.lsn > self.held.low and self.held.covers(e.key):
            # the read may or may not have seen this change: the change wins
            if e.row is None:
                self.held.rows.pop(e.key, None)
            else:
                self.held.rows[e.key] = e.row
        # otherwise a key not read yet (or a change the held read already holds): dropped

    def _written(self, key: Row) -> bool:
        """Whether our table holds ``key``'s upstream state: at or below current_pos."""
        if self.finished:
            return True
        return self.current_pos is not None and key <= self.current_pos

    def _merge(self, writes: list[CdcWrite]) -> None:
        held = self.held
        assert held is not None
        writes.extend(CdcWrite(k, held.rows[k]) for k in sorted(held.rows))
        if held.ended:
            self.state = CdcState.FINISHED
        if held.last_key is not None:
            self.current_pos = held.last_key
        self.row_count += held.read_rows
        self.chunks += 1
        self.held = None
        self.chunk_phase = ChunkPhase.IDLE

    # chunk reads ----------------------------------------------------------

    def plan_reads(
        self, max_rows: int, parts: int = 1, *, grouping: ReadGrouping = ReadGrouping.GROUPS
    ) -> list[ChunkRead]:
        """The next chunk (one read at most, whatever ``parts`` and ``grouping``: it starts
        after the last key of the one before), within ``max_rows`` and the budget; empty
        before the first barrier, while another chunk is planned or held, when paused or
        out of budget, and once finished. The caller runs it between two WAL LSN reads."""
        if not self.started or self.finished or self.chunk_phase is not ChunkPhase.IDLE:
            return []
        limit = max_rows if self.budget is None else min(max_rows, self.budget)
        if limit <= 0:
            return []
        read = ChunkRead(self.chunks + 1, self.current_pos, limit)
        self.planned = read
        self.planned_at_lsn = self.lsn
        self.chunk_phase = ChunkPhase.READING
        return [read]

    def account(self, read: ChunkRead, result: ChunkRows) -> list[CdcWrite]:
        """Take a planned chunk's rows: held until the stream passes ``result.high`` (at
        once if it has), the changes kept since it was planned merged into it. Returns
        the writes due now."""
        if self.chunk_phase is not ChunkPhase.READING or read != self.planned:
            raise ReadProvenanceError(f"chunk {read.chunk} after {read.after} was not planned now")
        rows = list(result.rows)
        self._check_result(read, result, rows)
        keys = [self.key_of(r) for r in rows]
        last_key = keys[-1] if keys else None
        self.held = _Held(
            read,
            result.low,
            result.high,
            None if result.ended else last_key,
            result.ended,
            last_key,
            dict(zip(keys, rows, strict=True)),
            len(rows),
        )
        self.chunk_phase = ChunkPhase.HOLDING
        self.planned = None
        self.epoch_rows += len(rows)
        if self.budget is not None:
            self.budget -= len(rows)
        # replay what arrived while the read ran, then merge if the stream passed high
        pending, self.pending = self.pending, []
        writes: list[CdcWrite] = []
        for e in pending:
            self._on_change(e, writes)
        self._passed(self.lsn, writes)
        return writes

    def _check_result(self, read: ChunkRead, result: ChunkRows, rows: list[Row]) -> None:
        if not self.planned_at_lsn <= result.low <= result.high:
            raise ValueError(
                f"chunk {read.chunk}: watermarks low={result.low} high={result.high} must "
                f"ascend from the stream's position when it was planned ({self.planned_at_lsn})"
            )
        if len(rows) > read.limit:
            raise ValueError(f"chunk {read.chunk} returned more rows than its limit")
        if len(rows) < read.limit and not result.ended:
            raise ValueError(f"chunk {read.chunk} came back short: the table ended there")
        last = read.after
        for r in rows:
            k = self.key_of(r)
            if last is not None and not k > last:
                raise ValueError(f"chunk {read.chunk}: keys must ascend after {read.after}")
            last = k

    # progress -------------------------------------------------------------

    def progress_rows(self) -> list[dict[str, Any]]:
        """The table's one progress row (a CDC table is read by one actor)."""
        p = self.progress
        return [
            {
                "state": p.state.value,
                "current_pos": p.current_pos,
                "lsn": p.lsn,
                "row_count": p.row_count,
                "chunks": p.chunks,
            }
        ]

    def report(self) -> dict[str, Any]:
        """The chunk in flight (planned or held), besides the committed progress."""
        chunk: dict[str, Any] | None = None
        if self.planned is not None:
            chunk = {"chunk": self.planned.chunk, "after": self.planned.after}
        elif self.held is not None:
            chunk = {
                "chunk": self.held.read.chunk,
                "after": self.held.read.after,
                "upto": self.held.upto,
                "low": self.held.low,
                "high": self.held.high,
                "rows": self.held.read_rows,
            }
        return {"chunk_phase": self.chunk_phase.value, "chunk": chunk}
