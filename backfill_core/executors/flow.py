"""Snapshot-read pacing shared by the executors: rate-limit mutations, the spread of
one row budget over vnodes, and the checks on a read's summary."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from backfill_core.changes import Row
from backfill_core.executors.messages import Mutation, SnapshotRead


def apply_flow_mutation(
    actor_id: int, mutation: Mutation | None, paused: bool, rate_limit: int | None
) -> tuple[bool, int | None]:
    """``(paused, rate_limit)`` after a barrier's pause / resume / throttle."""
    if mutation is None:
        return paused, rate_limit
    if mutation.pause:
        paused = True
    if mutation.resume:
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


def check_summary(read: SnapshotRead, count: int, last_pos: Row | None) -> None:
    if count > read.limit or count < 0:
        raise ValueError("a snapshot read returned more rows than asked for")
    if (count > 0) != (last_pos is not None):
        raise ValueError("a read summary needs the last position exactly when rows were read")


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
