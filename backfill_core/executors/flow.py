"""Snapshot-read pacing shared by the executors: rate-limit mutations, the spread of
one row budget over vnodes (or over groups of vnodes read under one limit), and the
checks on a read's summary."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from backfill_core.changes import Row
from backfill_core.executors.interface import ReadGrouping, VnodeRows, VnodeSummary
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
    account_vnode: Callable[[SnapshotRead, int, Row | None], None],
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
        account_vnode(SnapshotRead(v, read.epoch, after, limit), count, last)
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


class VnodeReads:
    """Snapshot reads per vnode after its ``current_pos``, within the epoch's row budget,
    planned and accounted through the executor interface (``interface.BackfillExecutor``):
    every table kind reads alike.

    The executor provides ``_reading`` (whether its phase reads the snapshot now),
    ``_pending_vnodes`` (vnodes with rows left to read in the open epoch, in order) and
    ``_account_vnode`` (one vnode's read, from its count and last key).
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

    def _account_vnode(self, read: SnapshotRead, count: int, last_pos: Row | None) -> None:
        raise NotImplementedError

    def _read_limit(self, max_rows: int) -> int:
        """Rows the reads planned now may read in all (0: none)."""
        if not self._reading() or not self.started:
            return 0
        if self.budget is not None and self.budget <= 0:
            return 0
        return max_rows if self.budget is None else min(max_rows, self.budget)

    def plan_reads(
        self, max_rows: int, parts: int = 1, *, grouping: ReadGrouping = ReadGrouping.GROUPS
    ) -> list[SnapshotBatchRead]:
        """The snapshot reads of the open epoch to run now, sharing ``max_rows`` (and the
        budget), as ``grouping`` lays them out (``parts``: groups at most, for
        ``GROUPS``); empty when there is nothing to do. The reads are independent and
        may run in parallel (the seed merges one stream per vnode)."""
        limit = self._read_limit(max_rows)
        pending = self._pending_vnodes() if limit > 0 else []
        if not pending:
            return []

        def position(v: int) -> Row | None:
            return self.progress[v].current_pos

        if grouping is ReadGrouping.FIRST:
            v = pending[0]
            return [SnapshotBatchRead(self.snapshot_epoch, ((v, position(v)),), limit)]
        if grouping is ReadGrouping.EACH:
            return [
                SnapshotBatchRead(r.epoch, ((r.vnode, r.after),), r.limit)
                for r in spread_reads(pending, limit, self.snapshot_epoch, position)
            ]
        return split_batches(pending, limit, parts, self.snapshot_epoch, position)

    def account(self, read: SnapshotBatchRead, result: VnodeSummary | VnodeRows) -> list[Row]:
        """Account for ``read`` from its per-vnode summary (its rows were written
        elsewhere: nothing to forward) or from its rows (returns them, to write at the
        open epoch, each vnode's together in the read's order)."""
        if isinstance(result, VnodeSummary):
            account_batch(read, result.per_vnode, self._account_vnode)
            return []
        groups: dict[int, list[Row]] = {}
        for v, row in result.rows:
            groups.setdefault(v, []).append(row)
        account_batch(
            read, {v: (len(g), self.pk_of(g[-1])) for v, g in groups.items()}, self._account_vnode
        )
        return [row for v, _ in read.starts for row in groups.get(v, [])]

    def report(self) -> dict[str, Any]:
        """What a collect reports besides ``progress_rows`` (nothing, unless a kind has more)."""
        return {}
