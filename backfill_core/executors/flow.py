"""Snapshot-read pacing shared by the executors: rate-limit mutations, the spread of
one row budget over vnodes (or over groups of vnodes read under one limit), and the
checks on a read's summary."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from backfill_core.changes import Row
from backfill_core.executors.messages import (
    Barrier,
    Mutation,
    ReadProvenanceError,
    SnapshotBatchRead,
    SnapshotRead,
)


def apply_flow_mutation(
    actor_id: int, mutation: Mutation | None, paused: bool, rate_limit: int | None
) -> tuple[bool, int | None]:
    """``(paused, rate_limit)`` after a barrier's pause / resume / throttle: each applies
    to the actors it names only (those of one job; its graph's other jobs go on)."""
    if mutation is None:
        return paused, rate_limit
    if actor_id in mutation.pause:
        paused = True
    if actor_id in mutation.resume:
        paused = False
    if actor_id in mutation.throttle:
        rate_limit = mutation.throttle[actor_id]
    return paused, rate_limit


def spread_reads(
    pending: Sequence[int], total: int, epoch: int, position: Callable[[int], Row | None]
) -> list[SnapshotRead]:
    """One read per pending vnode, sharing ``total`` rows as evenly as whole rows allow
    (the first vnodes take the remainder; with fewer rows than vnodes, the last wait)."""
    if not pending:
        return []
    share, extra = divmod(total, len(pending))
    reads = []
    for i, v in enumerate(pending):
        limit = share + (1 if i < extra else 0)
        if limit <= 0:
            break
        reads.append(SnapshotRead(v, epoch, position(v), limit))
    return reads


def split_batches(
    pending: Sequence[int],
    total: int,
    parts: int,
    epoch: int,
    position: Callable[[int], Row | None],
) -> list[SnapshotBatchRead]:
    """``pending`` vnodes in up to ``parts`` contiguous groups, each read under its share
    of ``total`` rows (the first groups take the remainder).

    Within a group the vnodes that have a position come first, then those not started,
    each in vnode order: Postgres runs a plain ``Append`` in that order, so a group goes
    on where it stopped before it starts a vnode, and reads whole vnodes one after the
    other, which, where spread reads take a little of every vnode, keeps each vnode's
    rows together in the MV's key index. The accounting does not count on that order.
    """
    n = min(parts, len(pending), total)
    if n <= 0:
        return []
    share, extra = divmod(total, n)
    batches = []
    for i in range(n):
        group = pending[i * len(pending) // n : (i + 1) * len(pending) // n]
        starts = [(v, position(v)) for v in group]
        # stable: the started vnodes, then the fresh ones
        starts.sort(key=lambda s: s[1] is None)
        batches.append(SnapshotBatchRead(epoch, tuple(starts), share + (1 if i < extra else 0)))
    return batches


def account_batch(
    read: SnapshotBatchRead,
    summary: Mapping[int, tuple[int, Row | None]],
    on_read_summary: Callable[[SnapshotRead, int, Row | None], None],
) -> int:
    """Account for a batch read from its per-vnode summary ``(rows read, last key)``, as
    for one read per vnode, whatever order its branches ran in: Postgres promises none
    of an ``Append`` (a parallel one interleaves them). Each vnode's rows are the first
    of its own after its position, its last key is its own; but a vnode that returned
    fewer rows than the limit may have been cut short by the shared limit, after any
    other vnode's rows. Returns the rows read."""
    unknown = set(summary) - {v for v, _ in read.starts}
    if unknown:
        raise ValueError(f"a batch read summarized vnodes it does not read: {sorted(unknown)}")
    total = sum(count for count, _ in summary.values())
    if total > read.limit:
        raise ValueError("a batch read returned more rows than asked for")
    limit_hit = total == read.limit
    for v, after in read.starts:
        count, last = summary.get(v, (0, None))
        # ends show only where the shared limit stopped no branch (each has the limit)
        limit = count if limit_hit else read.limit
        on_read_summary(SnapshotRead(v, read.epoch, after, limit), count, last)
    return total


def check_summary(read: SnapshotRead, count: int, last_pos: Row | None) -> None:
    if count > read.limit or count < 0:
        raise ValueError("a snapshot read returned more rows than asked for")
    if (count > 0) != (last_pos is not None):
        raise ValueError("a read summary needs the last position exactly when rows were read")


def check_vnode_read_planned_now(
    read: SnapshotRead, snapshot_epoch: int, current_pos: Row | None
) -> None:
    """Refuse a snapshot read that is not the one the executor would ask for now."""
    check_planned_now(f"vnode {read.vnode}", read.epoch, snapshot_epoch, read.after, current_pos)


def check_closes_open_epoch(started: bool, open_epoch: int, barrier: Barrier) -> None:
    """A barrier closes the epoch the last one opened: one delivered twice would emit an
    epoch's changes twice, one skipped would never emit them."""
    if started and barrier.epoch.prev != open_epoch:
        raise ValueError(
            f"barrier closing {barrier.epoch.prev} does not close the open epoch {open_epoch}"
        )


def check_planned_now(
    what: str, epoch: int, expected_epoch: int, start: object, expected_start: object
) -> None:
    """Refuse a read of ``what`` planned at another epoch (before a barrier, accounted
    after it) or from another start than where it stands now. Its rows could end a
    vnode or split early; the runtime fails the graph instead (recovery)."""
    if epoch != expected_epoch:
        raise ReadProvenanceError(
            f"a read of {what} planned at epoch {epoch}, where it is read at {expected_epoch}"
        )
    if start != expected_start:
        raise ReadProvenanceError(
            f"a read of {what} from {start}, where its position is {expected_start}"
        )


class _Progress(Protocol):
    @property
    def state(self) -> Any: ...
    @property
    def current_pos(self) -> Row | None: ...
    @property
    def row_count(self) -> int: ...


def vnode_progress_rows(progress: Mapping[int, _Progress]) -> list[dict[str, Any]]:
    """Per-vnode progress as the collect reports it, vnodes ascending."""
    return [
        {
            "vnode": v,
            "state": p.state.value,
            "current_pos": p.current_pos,
            "row_count": p.row_count,
        }
        for v, p in sorted(progress.items())
    ]


class FixedSnapshotReads:
    """Reads of one fixed snapshot (``snapshot_epoch``) per vnode after ``current_pos``,
    within the epoch's row budget: the chain and the snapshot backfill read alike.

    The executor provides ``_reading`` (whether its phase reads the snapshot now),
    ``_pending_vnodes`` (vnodes not yet read to their end, in order) and
    ``on_read_summary``.
    """

    snapshot_epoch: int
    budget: int | None
    started: bool
    pk_of: Callable[[Row], Row]
    progress: Mapping[int, _Progress]

    def _reading(self) -> bool:
        raise NotImplementedError

    def _pending_vnodes(self) -> list[int]:
        raise NotImplementedError

    def on_read_summary(self, read: SnapshotRead, count: int, last_pos: Row | None) -> None:
        raise NotImplementedError

    def next_read(self, max_rows: int) -> SnapshotRead | None:
        """The next snapshot read of the open epoch, or None when there is nothing to do."""
        if not self._reading() or not self.started:
            return None
        if self.budget is not None and self.budget <= 0:
            return None
        pending = self._pending_vnodes()
        if not pending:
            return None
        v = pending[0]
        limit = max_rows if self.budget is None else min(max_rows, self.budget)
        return SnapshotRead(v, self.snapshot_epoch, self.progress[v].current_pos, limit)

    def on_snapshot_rows(self, read: SnapshotRead, rows: Sequence[Row]) -> list[Row]:
        """Account for rows read by ``read`` (pk order); returns the rows to write now."""
        self.on_read_summary(read, len(rows), self.pk_of(rows[-1]) if rows else None)
        return list(rows)

    def next_spread_read(self, max_rows: int) -> list[SnapshotRead]:
        """One read per vnode still to read, sharing ``max_rows`` (and the budget).

        The reads of different vnodes are independent and may run in parallel (the
        Spark path runs them as one job); each is accounted with ``on_read_summary``.
        Empty when there is nothing to do.
        """
        first = self.next_read(max_rows)
        if first is None:
            return []
        return spread_reads(
            self._pending_vnodes(),
            first.limit,
            self.snapshot_epoch,
            lambda v: self.progress[v].current_pos,
        )

    def next_batch_reads(self, max_rows: int, parts: int) -> list[SnapshotBatchRead]:
        """The vnodes still to read in up to ``parts`` groups, each read under one limit,
        its share of ``max_rows`` (and the budget); the groups are independent and
        may run in parallel. Each is accounted with ``on_batch_summary``."""
        first = self.next_read(max_rows)
        if first is None:
            return []
        return split_batches(
            self._pending_vnodes(),
            first.limit,
            parts,
            self.snapshot_epoch,
            lambda v: self.progress[v].current_pos,
        )

    def on_batch_summary(
        self, read: SnapshotBatchRead, summary: Mapping[int, tuple[int, Row | None]]
    ) -> int:
        """Account for a batch read whose rows were handled elsewhere (a Spark task wrote
        them) from its per-vnode ``(rows read, last key)``; returns the rows read."""
        return account_batch(read, summary, self.on_read_summary)
