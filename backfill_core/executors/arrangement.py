"""Arrangement backfill (seed: ``arrangement_backfill.rs``), decided once per epoch.

During epoch ``c`` (opened by a barrier whose ``prev`` is ``p``) the actor reads the
upstream snapshot at ``p`` per vnode after ``current_pos``, within a row budget, and
the rows are written at ``c``. The barrier that closes ``c`` brings the upstream's
changes of ``c``: a change is emitted only where ``pk <= current_pos`` of its vnode
(all of them for a completed vnode, none for a vnode not started); keys above
``current_pos`` arrive later through a snapshot read at an epoch that contains them.
When every vnode's snapshot read reached its end within one epoch, the whole snapshot
at ``p`` has been emitted, so that barrier emits every change, persists ``Completed``
and reports finish; from then on the actor forwards.

The order of reads is fixed (vnodes ascending), as the reference model's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backfill_core.changes import Row, RowChange
from backfill_core.executors.flow import (
    VnodeReads,
    apply_flow_mutation,
    check_closes_open_epoch,
    check_summary,
    check_vnode_read_planned_now,
    vnode_progress_rows,
)
from backfill_core.executors.messages import Barrier, BarrierOutput, ChangeRange, SnapshotRead


class VnodeState(StrEnum):
    NOT_STARTED = "not_started"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@dataclass(frozen=True, slots=True)
class VnodeProgress:
    state: VnodeState = VnodeState.NOT_STARTED
    current_pos: Row | None = None
    row_count: int = 0


class Phase(StrEnum):
    BACKFILLING = "backfilling"
    FORWARDING = "forwarding"


def epoch_budget(
    rate_limit: int | None, paused: bool, elapsed_ms: int, left: int | None = 0
) -> int | None:
    """Rows the snapshot side may read in the next epoch (None: no limit).

    A token bucket refilled at each barrier: the closing epoch's length stands in for the
    next one's (unknown when it opens), at least one row per epoch. What the last epoch
    did not use (``left``) carries over, up to one second's worth, so epochs that closed
    before the worker could read (several barriers handled at once) keep their share
    while an idle actor cannot save up a burst. Paused or throttled to 0: nothing.
    """
    if paused or rate_limit == 0:
        return 0
    if rate_limit is None:
        return None
    fresh = max(1, rate_limit * elapsed_ms // 1000)
    return min(fresh + max(0, left or 0), max(fresh, rate_limit))


class ArrangementBackfill(VnodeReads):
    def __init__(
        self,
        actor_id: int,
        vnodes: Iterable[int],
        pk_of: Callable[[Row], Row],
        *,
        rate_limit: int | None = None,
        paused: bool = False,
        restore: Mapping[int, VnodeProgress] | None = None,
    ) -> None:
        self.actor_id = actor_id
        self.vnodes = tuple(sorted(vnodes))
        self.pk_of = pk_of
        self.rate_limit = rate_limit
        self.paused = paused
        restore = restore or {}
        self.progress: dict[int, VnodeProgress] = {
            v: restore.get(v, VnodeProgress()) for v in self.vnodes
        }
        done = all(p.state is VnodeState.COMPLETED for p in self.progress.values())
        self.phase = Phase.FORWARDING if done else Phase.BACKFILLING
        self.started = False
        self.closed_epoch = 0  # changes up to here are applied
        self.snapshot_epoch = 0  # snapshot reads of the open epoch happen here
        self.open_epoch = 0  # snapshot rows are written here
        self.budget: int | None = 0
        self.exhausted = self._completed()  # vnodes with nothing left to read this epoch
        self.epoch_rows = 0

    @property
    def total_rows(self) -> int:
        return sum(p.row_count for p in self.progress.values())

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FORWARDING

    # barriers -------------------------------------------------------------

    def changes_needed(self, barrier: Barrier) -> ChangeRange | None:
        """Which upstream changes ``on_barrier`` needs (None: none)."""
        if not self.started or barrier.epoch.prev <= self.closed_epoch:
            return None
        if self.phase is Phase.FORWARDING or self._snapshot_done():
            vnodes = self.vnodes
        else:
            vnodes = tuple(
                v for v in self.vnodes if self.progress[v].state is not VnodeState.NOT_STARTED
            )
        if not vnodes:
            return None
        return ChangeRange(self.closed_epoch, barrier.epoch.prev, vnodes)

    def on_barrier(
        self,
        barrier: Barrier,
        changes: Sequence[RowChange] = (),
        *,
        upstream_latest_epoch: int | None = None,
    ) -> BarrierOutput:
        """Complete the closing epoch, then open the next one (the upstream's latest
        epoch paces nothing here)."""
        check_closes_open_epoch(self.started, self.open_epoch, barrier)
        emit: list[RowChange] = []
        if self.started:
            if self.phase is Phase.FORWARDING or self._snapshot_done():
                emit = list(changes)
                if self.phase is Phase.BACKFILLING:
                    self._complete_all()
            else:
                emit = [c for c in changes if self._visible(c)]
        self.started = True
        out = BarrierOutput(
            write_epoch=barrier.epoch.prev,
            emit=emit,
            progress={"vnodes": self.progress_rows()},
            rows=self.epoch_rows,
            finished=self.phase is Phase.FORWARDING,
        )
        self._apply_mutation(barrier)
        self.closed_epoch = barrier.epoch.prev
        self.snapshot_epoch = barrier.epoch.prev
        self.open_epoch = barrier.epoch.curr
        self.budget = epoch_budget(self.rate_limit, self.paused, barrier.elapsed_ms, self.budget)
        self.exhausted = self._completed()
        self.epoch_rows = 0
        return out

    def _completed(self) -> set[int]:
        """Vnodes restored as completed (a rescale deals them next to unfinished ones):
        the view holds all their rows, so they are never read again and every change
        of theirs is emitted, as in the seed."""
        return {v for v, p in self.progress.items() if p.state is VnodeState.COMPLETED}

    def _visible(self, change: RowChange) -> bool:
        p = self.progress.get(change.vnode)
        if p is None:
            return False
        # a completed vnode may have no position at all (it had no rows)
        if p.state is VnodeState.COMPLETED:
            return True
        if p.state is VnodeState.NOT_STARTED or p.current_pos is None:
            return False
        return self.pk_of(change.row) <= p.current_pos

    def _snapshot_done(self) -> bool:
        return (
            self.phase is Phase.BACKFILLING and self.started and self.exhausted >= set(self.vnodes)
        )

    def _complete_all(self) -> None:
        self.progress = {
            v: VnodeProgress(VnodeState.COMPLETED, p.current_pos, p.row_count)
            for v, p in self.progress.items()
        }
        self.phase = Phase.FORWARDING

    def _apply_mutation(self, barrier: Barrier) -> None:
        self.paused, self.rate_limit = apply_flow_mutation(
            self.actor_id, barrier.mutation, self.paused, self.rate_limit
        )

    # snapshot side --------------------------------------------------------

    def _reading(self) -> bool:
        return self.phase is not Phase.FORWARDING

    def _pending_vnodes(self) -> list[int]:
        return [v for v in self.vnodes if v not in self.exhausted]

    def _account_vnode(self, read: SnapshotRead, count: int, last_pos: Row | None) -> None:
        """Account for one vnode's read: ``count`` rows after ``read.after``, the last of
        them at ``last_pos``."""
        check_summary(read, count, last_pos)
        if read.vnode not in self.progress or read.vnode in self.exhausted:
            raise ValueError(f"vnode {read.vnode} has nothing to read in this epoch")
        p = self.progress[read.vnode]
        check_vnode_read_planned_now(read, self.snapshot_epoch, p.current_pos)
        if last_pos is not None:
            self.progress[read.vnode] = VnodeProgress(
                VnodeState.IN_PROGRESS, last_pos, p.row_count + count
            )
            self.epoch_rows += count
            if self.budget is not None:
                self.budget -= count
        if count < read.limit:
            self.exhausted.add(read.vnode)

    # progress -------------------------------------------------------------

    def progress_rows(self) -> list[dict[str, Any]]:
        return vnode_progress_rows(self.progress)
