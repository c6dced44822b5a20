"""Rearranged chain backfill (seed: ``rearranged_chain_excerpt.rs``), decided once per epoch.

The snapshot is fixed at the ``prev`` of the job's first barrier (``snapshot_epoch``).
Every later epoch reads more of that same snapshot per vnode after ``current_pos``
(vnodes ascending, within the row budget) and the rows are written at the open epoch.
Upstream barriers are never held back: each passes at once, and the epoch it closes
is remembered (the seed's rearranged barrier leaving a phantom behind); none of its
changes are emitted yet. Once every vnode was read to its end (a vnode that ended
stays ended: the snapshot does not move), the remembered epochs are replayed in order,
at most ``replay_epochs_per_barrier`` per barrier, as the net change over
``(replayed_upto, upto]`` written at the barrier's ``prev``. The barrier whose ``prev``
the replay reaches is the seed's phantom catching up with the last rearranged barrier:
from there on the actor reports finish and forwards each closed epoch's changes.

Pause, resume and throttle pace the snapshot reads only. The replay is not paced: the
change logs of a few epochs are small next to a snapshot, and a paced replay could
fall behind an upstream that keeps writing and never catch up. Each barrier adds one
remembered epoch and replays up to ``replay_epochs_per_barrier`` of them, so with at
least two per barrier the backlog shrinks until the replay catches up.

There is no mid-backfill recovery, as in the seed (a recovered actor whose barrier is
not the one that added it just forwards): when a chain job recovers before it was
created, the runtime truncates its MV and starts a fresh executor. A job that was
already created comes back with ``finished=True`` and forwards from its first barrier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backfill_core.changes import Row, RowChange
from backfill_core.executors.arrangement import VnodeProgress, VnodeState, epoch_budget
from backfill_core.executors.flow import (
    VnodeReads,
    apply_flow_mutation,
    check_closes_open_epoch,
    check_summary,
    check_vnode_read_planned_now,
    vnode_progress_rows,
)
from backfill_core.executors.messages import Barrier, BarrierOutput, ChangeRange, SnapshotRead

DEFAULT_REPLAY_EPOCHS_PER_BARRIER = 8


class Phase(StrEnum):
    SNAPSHOT = "snapshot"  # reading the snapshot; closed epochs are remembered
    REPLAY = "replay"  # snapshot ended; remembered epochs are being replayed
    FORWARDING = "forwarding"


@dataclass(frozen=True, slots=True)
class _Replay:
    """The changes one barrier emits: epochs ``(after, upto]``, and whether that catches up."""

    after: int
    upto: int
    epochs: int
    caught_up: bool


class ChainBackfill(VnodeReads):
    def __init__(
        self,
        actor_id: int,
        vnodes: Iterable[int],
        pk_of: Callable[[Row], Row],
        *,
        rate_limit: int | None = None,
        paused: bool = False,
        finished: bool = False,
        replay_epochs_per_barrier: int = DEFAULT_REPLAY_EPOCHS_PER_BARRIER,
    ) -> None:
        # with one epoch per barrier the backlog would never shrink (one is added each time)
        if replay_epochs_per_barrier < 2:
            raise ValueError("replay_epochs_per_barrier must be at least 2 to ever catch up")
        self.actor_id = actor_id
        self.vnodes = tuple(sorted(vnodes))
        self.pk_of = pk_of
        self.rate_limit = rate_limit
        self.paused = paused
        self.replay_epochs_per_barrier = replay_epochs_per_barrier
        initial = VnodeProgress(VnodeState.COMPLETED) if finished else VnodeProgress()
        self.progress: dict[int, VnodeProgress] = {v: initial for v in self.vnodes}
        self.phase = Phase.FORWARDING if finished else Phase.SNAPSHOT
        self.started = False
        self.closed_epoch = 0  # the last epoch a barrier closed
        self.snapshot_epoch = 0  # fixed at the first barrier's prev
        self.open_epoch = 0  # snapshot rows are written here
        self.replayed_upto = 0  # changes up to here are emitted
        self.rearranged_epochs: list[int] = []  # closed, not yet replayed, in order
        self.budget: int | None = 0
        self.epoch_rows = 0

    @property
    def total_rows(self) -> int:
        return sum(p.row_count for p in self.progress.values())

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FORWARDING

    @property
    def snapshot_ended(self) -> bool:
        return all(p.state is VnodeState.COMPLETED for p in self.progress.values())

    # barriers -------------------------------------------------------------

    def changes_needed(self, barrier: Barrier) -> ChangeRange | None:
        """Which upstream changes ``on_barrier`` needs (None: none)."""
        if not self.started or barrier.epoch.prev <= self.closed_epoch or not self.vnodes:
            return None
        if self.phase is Phase.FORWARDING:
            return ChangeRange(self.closed_epoch, barrier.epoch.prev, self.vnodes)
        replay = self._replay(barrier)
        if replay is None:
            return None
        return ChangeRange(replay.after, replay.upto, self.vnodes)

    def on_barrier(
        self,
        barrier: Barrier,
        changes: Sequence[RowChange] = (),
        *,
        upstream_latest_epoch: int | None = None,
    ) -> BarrierOutput:
        """Pass the barrier on at once, emitting what the closing epoch completes (the
        upstream's latest epoch paces nothing here)."""
        check_closes_open_epoch(self.started, self.open_epoch, barrier)
        if changes and self.changes_needed(barrier) is None:
            raise ValueError("changes given at a barrier that needs none")
        emit: list[RowChange] = []
        if not self.started:
            if self.phase is not Phase.FORWARDING:
                self.snapshot_epoch = self.replayed_upto = barrier.epoch.prev
        elif self.phase is Phase.FORWARDING:
            emit = list(changes)
        else:
            replay = self._replay(barrier)
            self.rearranged_epochs.append(barrier.epoch.prev)
            if replay is not None:
                emit = list(changes)
                self.phase = Phase.REPLAY
                self.replayed_upto = replay.upto
                del self.rearranged_epochs[: replay.epochs]
                if replay.caught_up:
                    self.phase = Phase.FORWARDING
        self.started = True
        out = BarrierOutput(
            write_epoch=barrier.epoch.prev,
            emit=emit,
            progress={
                "vnodes": self.progress_rows(),
                "phase": self.phase.value,
                "replay_pending_epochs": len(self.rearranged_epochs),
            },
            rows=self.epoch_rows,
            finished=self.phase is Phase.FORWARDING,
        )
        self._apply_mutation(barrier)
        self.closed_epoch = barrier.epoch.prev
        self.open_epoch = barrier.epoch.curr
        self.budget = epoch_budget(self.rate_limit, self.paused, barrier.elapsed_ms, self.budget)
        self.epoch_rows = 0
        return out

    def _replay(self, barrier: Barrier) -> _Replay | None:
        """The remembered epochs this barrier replays (None while the snapshot is read)."""
        if self.phase is Phase.SNAPSHOT and not self.snapshot_ended:
            return None
        # the closing epoch is remembered by this very barrier
        pending = [*self.rearranged_epochs, barrier.epoch.prev]
        n = min(len(pending), self.replay_epochs_per_barrier)
        return _Replay(self.replayed_upto, pending[n - 1], n, n == len(pending))

    def _apply_mutation(self, barrier: Barrier) -> None:
        self.paused, self.rate_limit = apply_flow_mutation(
            self.actor_id, barrier.mutation, self.paused, self.rate_limit
        )

    # snapshot side --------------------------------------------------------

    def _account_vnode(self, read: SnapshotRead, count: int, last_pos: Row | None) -> None:
        """Account for one vnode's read.

        ``count`` rows were read after ``read.after``, the last of them at ``last_pos``.
        A read returning fewer rows than asked for ended its vnode for good.
        """
        check_summary(read, count, last_pos)
        p = self.progress.get(read.vnode)
        if p is None or p.state is VnodeState.COMPLETED or self.phase is not Phase.SNAPSHOT:
            raise ValueError(f"vnode {read.vnode} has nothing left to read")
        check_vnode_read_planned_now(read, self.snapshot_epoch, p.current_pos)
        if last_pos is not None:
            p = VnodeProgress(VnodeState.IN_PROGRESS, last_pos, p.row_count + count)
            self.epoch_rows += count
            if self.budget is not None:
                self.budget -= count
        if count < read.limit:
            p = VnodeProgress(VnodeState.COMPLETED, p.current_pos, p.row_count)
        self.progress[read.vnode] = p

    def _reading(self) -> bool:
        return self.phase is Phase.SNAPSHOT

    def _pending_vnodes(self) -> list[int]:
        return [v for v in self.vnodes if self.progress[v].state is not VnodeState.COMPLETED]

    # progress -------------------------------------------------------------

    def progress_rows(self) -> list[dict[str, Any]]:
        return vnode_progress_rows(self.progress)
