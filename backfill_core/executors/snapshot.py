"""Snapshot backfill (seed: ``snapshot_backfill_executor.rs``), decided once per epoch.

The job runs in its own creating graph, decoupled from the upstream. ``snapshot_epoch``
is fixed by the meta before the job starts (the ``prev`` of the upstream checkpoint that
created it). The barriers the executor sees, in order:

1. Phase 1 (``snapshot``): *fake* barriers whose epochs are tiny (``k << 16``). Between
   them the runtime asks ``plan_reads`` and accounts for the rows read at
   ``snapshot_epoch``; they are written at the open (fake) epoch. Each vnode is
   ``Consuming{last pk read}`` (the next read starts after it) until a read comes back
   short, then ``Consumed``. When every vnode is ``Consumed`` the barrier reports
   ``finished_snapshot`` (the snapshot is done, not the job). The phase ends with the
   barrier ``{prev: last fake, curr: snapshot_epoch}``, accepted only then.
2. Phase 2 (``log_store``): the barrier ``{snapshot_epoch, e1}`` (nothing to replay: the
   snapshot covers ``snapshot_epoch``), then one barrier per upstream epoch after it,
   ``{e_k, e_k+1}``, each emitting the change log of ``e_k``, i.e. ``(e_k-1, e_k]``,
   written at ``e_k`` (the meta leaves out epochs that changed nothing upstream: the
   range then spans them). The barrier that reaches the upstream's latest epoch caught up:
   it reports finish (phase ``finishing``, the seed's ``finish_consuming_log_store``)
   and the meta merges the job into the main graph there. Unlike the seed, the merge
   can miss (the upstream committed that epoch first): the creating graph then replays
   on, and its next barrier (a creating graph's: it names the upstream's latest epoch)
   puts the job back in the log store, lag cap included.
3. Phase 3 (``done``): every later barrier forwards the change log of the epoch it closes.

The upstream is known through ``upstream_latest_epoch``, an argument of ``on_barrier``:
the latest epoch the upstream had sealed when the meta injected the barrier (the seed's
newest pending upstream barrier). It gives the pending lag in ms, the lag cap, and, in
phase 1, the clock: fake epochs carry no wall time, so the rate limit of an epoch is
applied over the time the upstream advanced between two barriers (the barrier's own
``elapsed_ms`` when the upstream epoch is not given).

The lag cap is the seed's ``max_pending_epoch_lag``: unlimited in phase 1 (the upstream
never waits for the snapshot), the pending lag when the log store starts, then at every
replayed epoch ``min(pending lag, cap - elapsed / 2)``. The meta lets the upstream seal
an epoch only while ``upstream_may_advance`` holds, so the upstream advances about one
epoch for every two the job replays and the job catches up.

A vnode-bitmap update (``on_vnode_update``) in phase 2 fails the job, as in the seed;
in phase 1 and phase 3 it re-partitions the per-vnode progress.

Per-vnode ``row_count`` is the number of snapshot rows read (the seed stores the
epoch's change-log count there in phase 2; the snapshot count is what dashboards show,
the change-log rows of an epoch are the barrier output's ``rows``).

Recovery: a job whose first barrier's ``prev`` is below ``snapshot_epoch`` resumes
phase 1 from the restored positions; at or above it, phase 2 from that (committed)
epoch, every vnode ``Consumed`` there; ``created=True`` (merged before the crash)
forwards at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from backfill_core.changes import Row, RowChange
from backfill_core.epoch import lag_ms
from backfill_core.executors.arrangement import epoch_budget
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
    CONSUMING = "consuming"  # snapshot rows left after ``current_pos`` (None: not started)
    CONSUMED = "consumed"  # everything up to ``epoch`` is emitted


@dataclass(frozen=True, slots=True)
class VnodeBackfillProgress:
    """The seed's ``VnodeBackfillProgress{epoch, row_count, Consuming{pk} | Consumed}``."""

    epoch: int
    row_count: int = 0
    state: VnodeState = VnodeState.CONSUMING
    current_pos: Row | None = None  # the last pk read; the next read starts after it


class Phase(StrEnum):
    SNAPSHOT = "snapshot"  # phase 1: reading the snapshot under fake epochs
    LOG_STORE = "log_store"  # phase 2: replaying upstream change logs, one epoch per barrier
    FINISHING = "finishing"  # caught up with the upstream at this barrier: finish reported
    DONE = "done"  # phase 3: merged into the main graph, forwarding


class VnodeUpdateDuringLogStore(ValueError):
    """A rescale reached the job while it consumed the log store (the seed fails the job)."""


def max_pending_epoch_lag(cap: int | None, pending_lag: int, elapsed: int) -> int:
    """The seed's lag cap after the job consumed an epoch (any one unit: ms or raw epochs).

    ``cap`` is the previous cap (None: unlimited, as in phase 1), ``pending_lag`` how far
    the upstream is ahead of the epoch just consumed, ``elapsed`` how far that epoch is
    from the one consumed before. Never above the lag, and at least half the elapsed
    distance below the previous cap: the cap shrinks until the job catches up.
    """
    if pending_lag < 0 or elapsed < 0:
        raise ValueError("lags and elapsed distances are never negative")
    if cap is None:
        return pending_lag
    return min(pending_lag, max(0, cap - elapsed // 2))


def upstream_may_advance(pending_lag: int, cap: int | None) -> bool:
    """Whether the upstream may seal one more epoch (the seed's ``can_consume_upstream``)."""
    return cap is None or pending_lag < cap


def log_store_lets_upstream_advance(
    upstream_latest_epoch: int, next_replayed_epoch: int, cap_ms: int | None
) -> bool:
    """Whether the upstream may seal another epoch while a job replays its log store.

    The seed asks right after it consumed an epoch, before the cap shrinks: the lag is
    the upstream's distance from the epoch replayed next (the open epoch), under the cap
    of the last barrier. The executor and the meta (from a collect's ``curr_epoch`` and
    reported cap) both ask this, so the property test checks what runs.
    """
    if upstream_latest_epoch < next_replayed_epoch:
        return True
    return upstream_may_advance(lag_ms(upstream_latest_epoch, next_replayed_epoch), cap_ms)


class SnapshotBackfill(VnodeReads):
    def __init__(
        self,
        actor_id: int,
        vnodes: Iterable[int],
        pk_of: Callable[[Row], Row],
        snapshot_epoch: int,
        *,
        rate_limit: int | None = None,
        paused: bool = False,
        restore: Mapping[int, VnodeBackfillProgress] | None = None,
        created: bool = False,
        progress_at_first_barrier: bool = False,
    ) -> None:
        """``progress_at_first_barrier``: ``restore`` holds progress committed at the epoch
        the first barrier closes, whatever epoch it names (the worker stores none):
        resuming after the snapshot, every vnode is consumed at that epoch."""
        if snapshot_epoch <= 0:
            raise ValueError(f"snapshot_epoch must be positive, got {snapshot_epoch}")
        self.actor_id = actor_id
        self.vnodes = tuple(sorted(vnodes))
        self.pk_of = pk_of
        self.snapshot_epoch = snapshot_epoch
        self.rate_limit = rate_limit
        self.paused = paused
        restore = restore or {}
        self.progress: dict[int, VnodeBackfillProgress] = {
            v: restore.get(v, VnodeBackfillProgress(snapshot_epoch)) for v in self.vnodes
        }
        self.created = created
        self.progress_at_first_barrier = progress_at_first_barrier
        self.phase = Phase.DONE if created else Phase.SNAPSHOT
        self.started = False
        self.closed_epoch = 0  # the last epoch a barrier closed
        self.open_epoch = 0  # snapshot rows are written here (phase 1)
        self.consumed_epoch = 0  # change logs up to here are emitted (phase 2 and 3)
        self.upstream_latest_epoch: int | None = None
        self.pending_epoch_lag_ms: int | None = None
        self.max_pending_epoch_lag_ms: int | None = None  # None: unlimited
        self.budget: int | None = 0
        self.epoch_rows = 0

    @property
    def total_rows(self) -> int:
        """Snapshot rows read, all vnodes."""
        return sum(p.row_count for p in self.progress.values())

    @property
    def finished_snapshot(self) -> bool:
        return all(p.state is VnodeState.CONSUMED for p in self.progress.values())

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.FINISHING, Phase.DONE)

    # barriers -------------------------------------------------------------

    def changes_needed(self, barrier: Barrier) -> ChangeRange | None:
        """Which upstream changes ``on_barrier`` needs (None: none)."""
        if not self.started or self.phase is Phase.SNAPSHOT or not self.vnodes:
            return None
        if barrier.epoch.prev <= self.consumed_epoch:
            return None
        return ChangeRange(self.consumed_epoch, barrier.epoch.prev, self.vnodes)

    def on_barrier(
        self,
        barrier: Barrier,
        changes: Sequence[RowChange] = (),
        *,
        upstream_latest_epoch: int | None = None,
    ) -> BarrierOutput:
        """Complete the closing epoch, then open the next one.

        ``upstream_latest_epoch``: the latest epoch the upstream had sealed when the meta
        injected this barrier (None: not known; then no lag is reported).
        """
        check_closes_open_epoch(self.started, self.open_epoch, barrier)
        if changes and self.changes_needed(barrier) is None:
            raise ValueError("changes given at a barrier that needs none")
        if (
            self.progress_at_first_barrier
            and not self.started
            and barrier.epoch.prev >= self.snapshot_epoch
        ):
            self.progress = {
                v: replace(p, epoch=barrier.epoch.prev) for v, p in self.progress.items()
            }
        if (
            upstream_latest_epoch is not None
            and self.upstream_latest_epoch is not None
            and upstream_latest_epoch < self.upstream_latest_epoch
        ):
            raise ValueError("the upstream's latest epoch went back")
        elapsed_ms = barrier.elapsed_ms
        if upstream_latest_epoch is not None and self.upstream_latest_epoch is not None:
            elapsed_ms = lag_ms(upstream_latest_epoch, self.upstream_latest_epoch)
        rows = self.epoch_rows
        emit: list[RowChange] = []
        if not self.started:
            self._first_barrier(barrier, upstream_latest_epoch)
        elif self.phase is Phase.SNAPSHOT:
            self._snapshot_barrier(barrier, upstream_latest_epoch)
        elif self.phase is Phase.LOG_STORE or upstream_latest_epoch is not None:
            # a creating graph's barrier after the job finished means the meta did not
            # merge it (the upstream committed the epoch it was to join at first) and
            # replays on: the log store again, lag cap and all, so the upstream waits
            # for the job instead of the job chasing it for ever
            emit = self._owned(changes)
            rows = len(emit)
            self.phase = Phase.LOG_STORE
            self._log_store_barrier(barrier, upstream_latest_epoch)
        else:
            emit = self._owned(changes)
            rows = len(emit)
            self._consume(barrier.epoch.prev)
            self.phase = Phase.DONE
            self.pending_epoch_lag_ms = 0
        self.started = True
        if upstream_latest_epoch is not None:
            self.upstream_latest_epoch = upstream_latest_epoch
        out = BarrierOutput(
            write_epoch=barrier.epoch.prev,
            emit=emit,
            progress={"vnodes": self.progress_rows(), **self.report()},
            rows=rows,
            finished=self.finished,
        )
        self.paused, self.rate_limit = apply_flow_mutation(
            self.actor_id, barrier.mutation, self.paused, self.rate_limit
        )
        self.closed_epoch = barrier.epoch.prev
        self.open_epoch = barrier.epoch.curr
        self.budget = epoch_budget(self.rate_limit, self.paused, elapsed_ms, self.budget)
        self.epoch_rows = 0
        return out

    def _owned(self, changes: Sequence[RowChange]) -> list[RowChange]:
        """The changes of the vnodes this actor owns (a change log may hold others)."""
        owned = set(self.vnodes)
        return [c for c in changes if c.vnode in owned]

    def _first_barrier(self, barrier: Barrier, latest: int | None) -> None:
        prev = barrier.epoch.prev
        if self.phase is Phase.DONE:  # created before a recovery: forward at once
            self._expect_consumed_at(prev)
            self.consumed_epoch = prev
            self.pending_epoch_lag_ms = 0
        elif prev < self.snapshot_epoch:  # a new job, or phase 1 again after a recovery
            for v, p in self.progress.items():
                if p.epoch != self.snapshot_epoch:
                    raise ValueError(
                        f"vnode {v} has progress at epoch {p.epoch}, "
                        f"not at the snapshot epoch {self.snapshot_epoch}"
                    )
            self._snapshot_barrier(barrier, latest)
        else:  # phase 2 again from the committed epoch
            self._expect_consumed_at(prev)
            self.phase = Phase.LOG_STORE
            self.consumed_epoch = prev
            self._log_store_barrier(barrier, latest)

    def _expect_consumed_at(self, epoch: int) -> None:
        for v, p in self.progress.items():
            if p.state is not VnodeState.CONSUMED or p.epoch != epoch:
                raise ValueError(
                    f"vnode {v} must be consumed at epoch {epoch} to resume there, "
                    f"it is {p.state.value} at {p.epoch}"
                )

    def _snapshot_barrier(self, barrier: Barrier, latest: int | None) -> None:
        if barrier.epoch.curr > self.snapshot_epoch:
            raise ValueError(
                f"a barrier opening {barrier.epoch.curr} during the snapshot, which is "
                f"read at {self.snapshot_epoch}"
            )
        if latest is not None:
            self.pending_epoch_lag_ms = lag_ms(latest, self.snapshot_epoch)
        if barrier.epoch.curr == self.snapshot_epoch:
            if not self.finished_snapshot:
                raise ValueError("the snapshot epoch opened before the snapshot was consumed")
            self.phase = Phase.LOG_STORE
            self.consumed_epoch = self.snapshot_epoch

    def _log_store_barrier(self, barrier: Barrier, latest: int | None) -> None:
        prev = barrier.epoch.prev
        if latest is not None and latest < prev:
            raise ValueError(f"epoch {prev} is replayed before the upstream sealed it")
        elapsed = lag_ms(prev, self.consumed_epoch)
        self._consume(prev)
        if latest is None:
            self.pending_epoch_lag_ms = None
            return
        lag = lag_ms(latest, prev)
        self.pending_epoch_lag_ms = lag
        self.max_pending_epoch_lag_ms = max_pending_epoch_lag(
            self.max_pending_epoch_lag_ms, lag, elapsed
        )
        if latest == prev:
            self.phase = Phase.FINISHING

    def _consume(self, epoch: int) -> None:
        self.consumed_epoch = epoch
        self.progress = {v: replace(p, epoch=epoch) for v, p in self.progress.items()}

    def upstream_may_advance(self, upstream_latest_epoch: int) -> bool:
        """Whether the upstream may seal another epoch now (False: the meta holds it back).

        Only the log store holds the upstream back: while the upstream is ahead of the
        epoch the job replays next (the open epoch) by at least the lag cap.
        """
        if self.phase is not Phase.LOG_STORE:
            return True
        return log_store_lets_upstream_advance(
            upstream_latest_epoch, self.open_epoch, self.max_pending_epoch_lag_ms
        )

    # rescale --------------------------------------------------------------

    def on_vnode_update(
        self,
        vnodes: Iterable[int],
        restore: Mapping[int, VnodeBackfillProgress] | None = None,
    ) -> None:
        """Own ``vnodes`` from now on; call it right after ``on_barrier`` of the barrier
        that carries the update, with the progress the vnodes' previous owners reported
        at that barrier (``restore``; a vnode missing there has not started).

        Kept vnodes keep their progress. In phase 3 every vnode must be consumed at the
        closed epoch. In phase 2 the update fails the job, as in the seed.
        """
        if self.phase in (Phase.LOG_STORE, Phase.FINISHING) and self.started:
            raise VnodeUpdateDuringLogStore(
                "a vnode bitmap update during the log-store phase of a snapshot backfill "
                f"(actor {self.actor_id}, replaying epoch {self.consumed_epoch}); "
                "rescale the job before its snapshot finishes or after it is created"
            )
        restore = restore or {}
        new_vnodes = tuple(sorted(vnodes))
        progress: dict[int, VnodeBackfillProgress] = {}
        for v in new_vnodes:
            p = self.progress.get(v) or restore.get(v)
            if self.phase is Phase.DONE:
                if p is None or p.state is not VnodeState.CONSUMED:
                    raise ValueError(f"vnode {v} moved to a created job without being consumed")
                p = replace(p, epoch=self.consumed_epoch) if self.started else p
            elif p is None:
                p = VnodeBackfillProgress(self.snapshot_epoch)
            elif p.epoch != self.snapshot_epoch:
                raise ValueError(f"vnode {v} has progress at {p.epoch}, not the snapshot epoch")
            progress[v] = p
        self.vnodes = new_vnodes
        self.progress = progress

    # snapshot side --------------------------------------------------------

    def _account_vnode(self, read: SnapshotRead, count: int, last_pos: Row | None) -> None:
        """Account for one vnode's read.

        A read returning fewer rows than asked for consumed its vnode.
        """
        check_summary(read, count, last_pos)
        p = self.progress.get(read.vnode)
        if p is None or p.state is VnodeState.CONSUMED or self.phase is not Phase.SNAPSHOT:
            raise ValueError(f"vnode {read.vnode} has nothing left to read")
        check_vnode_read_planned_now(read, self.snapshot_epoch, p.current_pos)
        if last_pos is not None:
            p = replace(p, current_pos=last_pos, row_count=p.row_count + count)
            self.epoch_rows += count
            if self.budget is not None:
                self.budget -= count
        if count < read.limit:
            p = replace(p, state=VnodeState.CONSUMED)
        self.progress[read.vnode] = p

    def _reading(self) -> bool:
        return self.phase is Phase.SNAPSHOT

    def _pending_vnodes(self) -> list[int]:
        return [v for v in self.vnodes if self.progress[v].state is VnodeState.CONSUMING]

    # progress -------------------------------------------------------------

    def progress_rows(self) -> list[dict[str, Any]]:
        """Per vnode: vnode, state, current_pos, row_count, epoch (vnodes ascending)."""
        rows = vnode_progress_rows(self.progress)
        for row in rows:
            row["epoch"] = self.progress[row["vnode"]].epoch
        return rows

    def report(self) -> dict[str, Any]:
        """What a collect reports besides the vnodes' rows (the meta derives percentages
        from its row estimate, and the pending epoch count from its epoch list)."""
        return {
            "phase": self.phase.value,
            "snapshot_epoch": self.snapshot_epoch,
            "finished_snapshot": self.finished_snapshot,
            "consumed_vnodes": sum(p.state is VnodeState.CONSUMED for p in self.progress.values()),
            "snapshot_rows": self.total_rows,
            "consumed_epoch": self.consumed_epoch,
            "pending_epoch_lag_ms": self.pending_epoch_lag_ms,
            "max_pending_epoch_lag_ms": self.max_pending_epoch_lag_ms,
        }
