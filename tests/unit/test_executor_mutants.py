"""The executors where mutants survived the property tests (`make mutation`, issue 39):
what a barrier reports besides its changes (rows read in the epoch, progress, nothing at
the first barrier), the changes an executor asks for and the ones it drops, the budget
an idle epoch carries over, and refusals the reference models never provoke.

Each test names the planted change it fails on (mutmut's rendering of it)."""

from __future__ import annotations

from typing import Any

import pytest

from backfill_core.changes import Op, RowChange
from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill, VnodeProgress, VnodeState
from backfill_core.executors.chain import ChainBackfill
from backfill_core.executors.flow import check_summary, spread_reads
from backfill_core.executors.messages import Barrier, SnapshotRead
from backfill_core.executors.snapshot import (
    Phase,
    SnapshotBackfill,
    VnodeBackfillProgress,
    log_store_lets_upstream_advance,
    max_pending_epoch_lag,
)
from backfill_core.executors.snapshot import VnodeState as SnapshotVnodeState
from tests.kit.executors import ACTOR, account_rows, account_summary, epoch, first_read, key_of


def _barrier(i: int) -> Barrier:
    """The barrier closing epoch(i) and opening epoch(i + 1): 100 ms apart."""
    return Barrier(EpochPair(epoch(i), epoch(i + 1)))


def _rows(*keys: int) -> list[tuple[Any, ...]]:
    return [(k, f"v{k}") for k in keys]


def _insert(vnode: int, key: int) -> RowChange:
    return RowChange(Op.INSERT, vnode, None, (key, f"v{key}"))


# arrangement --------------------------------------------------------------------------


def test_arrangement_reports_the_rows_of_each_epoch_and_its_progress() -> None:
    """Kills: ``emit = None`` and ``epoch_rows = 1`` at the start, ``rows=None``,
    ``progress=None`` / ``{"VNODES": ...}``, ``epoch_rows = count`` / ``-= count``, and
    ``epoch_rows = 1`` after a barrier."""
    ex = ArrangementBackfill(ACTOR, [0, 1], key_of)
    first = ex.on_barrier(_barrier(0))
    assert (first.emit, first.rows) == ([], 0)
    assert first.progress == {"vnodes": ex.progress_rows()}
    read = first_read(ex, 2)
    assert read is not None and read.vnode == 0
    account_rows(ex, read, _rows(0, 2))
    read = first_read(ex, 2)
    assert read is not None and read.vnode == 0
    account_rows(ex, read, _rows(4))  # short: vnode 0 read to its end this epoch
    out = ex.on_barrier(_barrier(1))
    assert out.rows == 3
    assert out.progress == {"vnodes": ex.progress_rows()}
    assert ex.on_barrier(_barrier(2)).rows == 0  # nothing read in epoch(2)


def test_arrangement_asks_only_for_the_changes_it_can_emit() -> None:
    """Kills: ``prev < closed_epoch`` (a barrier not after the closed epoch asks for a
    range) and ``phase is not FORWARDING`` (every vnode asked for while backfilling)."""
    ex = ArrangementBackfill(ACTOR, [0, 1], key_of)
    ex.on_barrier(_barrier(0))
    read = first_read(ex, 1)
    assert read is not None
    account_rows(ex, read, _rows(0))
    needed = ex.changes_needed(_barrier(1))
    assert needed is not None and needed.vnodes == (0,)  # vnode 1 not started
    ex.on_barrier(_barrier(1))
    assert ex.changes_needed(Barrier(EpochPair(epoch(1), epoch(2)))) is None


def test_arrangement_drops_changes_of_vnodes_it_does_not_own_or_has_not_started() -> None:
    """Kills: ``return True`` for a vnode without progress, and for a vnode not started."""
    ex = ArrangementBackfill(ACTOR, [0, 1], key_of)
    ex.on_barrier(_barrier(0))
    read = first_read(ex, 1)
    assert read is not None
    account_rows(ex, read, _rows(4))  # vnode 0 at key 4, vnode 1 not started
    kept = _insert(0, 2)
    out = ex.on_barrier(_barrier(1), [kept, _insert(0, 8), _insert(1, 1), _insert(3, 3)])
    assert out.emit == [kept]


def test_arrangement_carries_an_idle_epochs_budget_over() -> None:
    """Kills ``epoch_budget(..., None)`` / a dropped ``self.budget`` in ``on_barrier``."""
    ex = ArrangementBackfill(ACTOR, [0], key_of, rate_limit=10)
    ex.on_barrier(_barrier(0))  # 100 ms at 10 rows/s: one row (the minimum)
    ex.on_barrier(_barrier(1))  # nothing read: that row carries over
    read = first_read(ex, 100)
    assert read is not None and read.limit == 2


def test_vnode_progress_rows_name_every_field() -> None:
    """Kills renamed keys ``"current_pos"`` and ``"row_count"`` (the meta persists these
    rows, and a restore reads them back)."""
    ex = ArrangementBackfill(ACTOR, [0, 1], key_of)
    ex.on_barrier(_barrier(0))
    read = first_read(ex, 2)
    assert read is not None
    account_rows(ex, read, _rows(0, 4))
    assert ex.progress_rows() == [
        {"vnode": 0, "state": "in_progress", "current_pos": (4,), "row_count": 2},
        {"vnode": 1, "state": "not_started", "current_pos": None, "row_count": 0},
    ]


# flow -----------------------------------------------------------------------------------


def test_a_read_summary_with_more_rows_than_asked_or_fewer_than_none_is_refused() -> None:
    """Kills ``count > read.limit and count < 0``."""
    read = SnapshotRead(0, epoch(1), None, 2)
    with pytest.raises(ValueError):
        check_summary(read, 3, (9,))
    with pytest.raises(ValueError):
        check_summary(read, -1, None)


def test_spread_reads_share_the_rows_the_first_vnodes_taking_the_rest() -> None:
    """Kills ``share - (...)``, ``(i < extra) and False``, ``limit < 0``, ``limit <= 1``
    and ``return`` for ``break``."""

    def limits(total: int) -> list[tuple[int, int]]:
        return [(r.vnode, r.limit) for r in spread_reads([0, 1, 2], total, 1, lambda v: None)]

    assert limits(5) == [(0, 2), (1, 2), (2, 1)]
    assert limits(2) == [(0, 1), (1, 1)]  # fewer rows than vnodes: the last one waits


# chain ----------------------------------------------------------------------------------


def test_chain_reports_the_rows_of_each_epoch_and_its_progress() -> None:
    """Kills: ``epoch_rows = 1`` at the start and after a barrier, and
    ``{"VNODES": ...}`` in the progress."""
    ex = ChainBackfill(ACTOR, [0, 1], key_of)
    first = ex.on_barrier(_barrier(0))
    assert (first.emit, first.rows) == ([], 0)
    read = first_read(ex, 2)
    assert read is not None
    account_rows(ex, read, _rows(0, 2))
    out = ex.on_barrier(_barrier(1))
    assert out.rows == 2
    assert out.progress["vnodes"] == ex.progress_rows()
    assert ex.on_barrier(_barrier(2)).rows == 0


def test_chain_asks_for_no_changes_without_vnodes_or_at_a_barrier_already_closed() -> None:
    """Kills: ``... and not self.vnodes`` and ``prev < closed_epoch`` in ``changes_needed``."""
    empty = ChainBackfill(ACTOR, [], key_of, finished=True)
    empty.on_barrier(_barrier(0))
    assert empty.changes_needed(_barrier(1)) is None
    ex = ChainBackfill(ACTOR, [0], key_of, finished=True)
    ex.on_barrier(_barrier(0))
    ex.on_barrier(_barrier(1))
    assert ex.changes_needed(Barrier(EpochPair(epoch(1), epoch(2)))) is None
    assert ex.changes_needed(_barrier(2)) is not None


def test_chain_carries_an_idle_epochs_budget_over() -> None:
    """Kills ``epoch_budget(..., None)`` / a dropped ``self.budget`` in ``on_barrier``."""
    ex = ChainBackfill(ACTOR, [0], key_of, rate_limit=10)
    ex.on_barrier(_barrier(0))
    ex.on_barrier(_barrier(1))
    read = first_read(ex, 100)
    assert read is not None and read.limit == 2


def test_chain_refuses_a_read_of_a_vnode_it_does_not_own_or_read_to_its_end() -> None:
    """Kills ``p is None and ...`` (an AttributeError, not the refusal) and
    ``... COMPLETED and phase is not SNAPSHOT`` (a completed vnode read again)."""
    ex = ChainBackfill(ACTOR, [0, 1], key_of)
    ex.on_barrier(_barrier(0))
    with pytest.raises(ValueError):
        account_summary(ex, SnapshotRead(5, ex.snapshot_epoch, None, 10), 0, None)
    read = first_read(ex, 10)
    assert read is not None and read.vnode == 0
    account_summary(ex, read, 0, None)  # vnode 0 is empty: read to its end
    with pytest.raises(ValueError):
        account_summary(ex, read, 0, None)


# snapshot -------------------------------------------------------------------------------


def test_snapshot_refuses_a_read_of_a_vnode_it_does_not_own_or_consumed() -> None:
    """Kills ``p is None and ...`` and ``... CONSUMED and phase is not SNAPSHOT``."""
    s = epoch(5)
    ex = SnapshotBackfill(ACTOR, [0, 1], key_of, s)
    ex.on_barrier(Barrier(EpochPair(0, 1 << 16)))
    with pytest.raises(ValueError):
        account_summary(ex, SnapshotRead(5, s, None, 10), 0, None)
    read = first_read(ex, 10)
    assert read is not None and read.vnode == 0
    account_summary(ex, read, 0, None)
    with pytest.raises(ValueError):
        account_summary(ex, read, 0, None)


def test_the_upstream_may_advance_while_it_is_behind_the_replay() -> None:
    """Kills ``return False`` for an upstream behind the epoch replayed next."""
    assert log_store_lets_upstream_advance(epoch(3), epoch(4), 0)
    assert not log_store_lets_upstream_advance(epoch(5), epoch(4), 100)


def test_the_lag_cap_shrinks_by_whole_units() -> None:
    """Kills ``elapsed / 2`` (a float cap, half a millisecond off)."""
    assert max_pending_epoch_lag(10, 100, 3) == 9


def test_the_snapshot_epoch_must_be_positive() -> None:
    """Kills ``snapshot_epoch < 0`` and ``<= 1``."""
    with pytest.raises(ValueError):
        SnapshotBackfill(ACTOR, [0], key_of, 0)
    assert SnapshotBackfill(ACTOR, [0], key_of, 1).snapshot_epoch == 1


def _in_log_store() -> SnapshotBackfill:
    """A snapshot job whose empty snapshot is consumed, at the start of its log store."""
    s = epoch(3)
    ex = SnapshotBackfill(ACTOR, [0, 1], key_of, s)
    ex.on_barrier(Barrier(EpochPair(0, 1 << 16)), upstream_latest_epoch=s)
    for read in iter(lambda: first_read(ex, 10), None):
        account_rows(ex, read, [])
    ex.on_barrier(Barrier(EpochPair(1 << 16, s)), upstream_latest_epoch=s)
    assert ex.phase is Phase.LOG_STORE
    return ex


def test_the_log_store_reports_no_lag_when_the_upstream_is_not_known() -> None:
    """Kills ``pending_epoch_lag_ms = ""`` at the start and in ``_log_store_barrier``."""
    ex = SnapshotBackfill(ACTOR, [0], key_of, epoch(3))
    ex.on_barrier(Barrier(EpochPair(0, 1 << 16)))
    assert ex.report()["pending_epoch_lag_ms"] is None
    ex = _in_log_store()
    ex.on_barrier(_barrier(3))
    assert ex.report()["pending_epoch_lag_ms"] is None


def test_the_log_store_refuses_an_epoch_the_upstream_has_not_sealed() -> None:
    """Kills ``latest is None and latest < prev``."""
    ex = _in_log_store()
    with pytest.raises(ValueError):
        ex.on_barrier(_barrier(3), upstream_latest_epoch=epoch(2))


def test_the_log_store_reports_the_changes_it_emits_as_the_epochs_rows() -> None:
    """Kills ``rows = None`` in the log-store branch of ``on_barrier``."""
    ex = _in_log_store()
    ex.on_barrier(_barrier(3), upstream_latest_epoch=epoch(5))  # nothing to replay yet
    changes = [_insert(0, 4), _insert(1, 5), _insert(3, 7)]  # vnode 3 is not this actor's
    out = ex.on_barrier(_barrier(4), changes, upstream_latest_epoch=epoch(5))
    assert out.rows == 2 and len(out.emit) == 2


def test_a_recovery_into_the_log_store_needs_every_vnode_consumed() -> None:
    """Kills ``state is not CONSUMED and epoch != ...`` in ``_expect_consumed_at``."""
    s = epoch(3)
    restore = {
        0: VnodeBackfillProgress(epoch(4), state=SnapshotVnodeState.CONSUMED),
        1: VnodeBackfillProgress(epoch(4), state=SnapshotVnodeState.CONSUMING),
    }
    ex = SnapshotBackfill(ACTOR, [0, 1], key_of, s, restore=restore)
    with pytest.raises(ValueError):
        ex.on_barrier(_barrier(4), upstream_latest_epoch=epoch(6))


def test_progress_restored_at_the_first_barrier_resumes_the_log_store_there() -> None:
    """The worker stores no epoch with a vnode's progress: restored at the snapshot
    epoch, it is taken at the epoch the first barrier closes (``progress_at_first_barrier``),
    where a restore naming its epochs must name that one; phase 1 keeps the snapshot's."""
    s = epoch(3)
    consumed = {v: VnodeBackfillProgress(s, 4, SnapshotVnodeState.CONSUMED) for v in (0, 1)}
    strict = SnapshotBackfill(ACTOR, [0, 1], key_of, s, restore=consumed)
    with pytest.raises(ValueError, match="must be consumed at epoch"):
        strict.on_barrier(_barrier(4), upstream_latest_epoch=epoch(6))
    ex = SnapshotBackfill(
        ACTOR, [0, 1], key_of, s, restore=consumed, progress_at_first_barrier=True
    )
    ex.on_barrier(_barrier(4), upstream_latest_epoch=epoch(6))
    assert ex.phase is Phase.LOG_STORE and ex.consumed_epoch == epoch(4)
    assert {p.epoch for p in ex.progress.values()} == {epoch(4)}
    consuming = {0: VnodeBackfillProgress(s, 2, current_pos=(4,))}
    ex = SnapshotBackfill(ACTOR, [0], key_of, s, restore=consuming, progress_at_first_barrier=True)
    ex.on_barrier(Barrier(EpochPair(1 << 16, 2 << 16)), upstream_latest_epoch=s)
    assert ex.phase is Phase.SNAPSHOT and ex.progress[0].epoch == s


def test_a_rescale_gives_a_vnode_new_to_the_snapshot_its_start() -> None:
    """Kills ``p = None`` and ``VnodeBackfillProgress(None)`` for a vnode without progress."""
    s = epoch(3)
    ex = SnapshotBackfill(ACTOR, [0], key_of, s)
    ex.on_barrier(Barrier(EpochPair(0, 1 << 16)))
    ex.on_vnode_update([0, 2])
    assert ex.vnodes == (0, 2)
    assert ex.progress[2] == VnodeBackfillProgress(s)
    read = first_read(ex, 10)
    assert read is not None and read.vnode == 0


def test_a_rescale_of_a_created_job_moves_vnodes_to_the_epoch_it_consumed() -> None:
    """Kills ``replace(p, epoch=...) if (self.started) and False`` / ``replace(p, )``."""
    consumed = {0: VnodeBackfillProgress(epoch(6), state=SnapshotVnodeState.CONSUMED)}
    ex = SnapshotBackfill(ACTOR, [0], key_of, epoch(3), created=True, restore=consumed)
    ex.on_barrier(_barrier(6))
    ex.on_barrier(_barrier(7))
    moved = VnodeBackfillProgress(epoch(6), 5, SnapshotVnodeState.CONSUMED)
    ex.on_vnode_update([0, 1], restore={1: moved})
    assert ex.progress[1].epoch == epoch(7)
    assert ex.progress[1].row_count == 5


def test_vnode_progress_restored_as_completed_is_kept_by_the_arrangement() -> None:
    """The restored vnode stays completed: its changes all pass (no read, no position)."""
    ex = ArrangementBackfill(
        ACTOR, [0, 1], key_of, restore={0: VnodeProgress(VnodeState.COMPLETED)}
    )
    ex.on_barrier(_barrier(0))
    change = _insert(0, 9)
    out = ex.on_barrier(_barrier(1), [change])
    assert out.emit == [change]


def test_a_created_snapshot_job_reports_the_changes_it_forwards_as_the_epochs_rows() -> None:
    """Kills ``rows = None`` in the forwarding branch of ``on_barrier``."""
    consumed = {
        v: VnodeBackfillProgress(epoch(6), state=SnapshotVnodeState.CONSUMED) for v in (0, 1)
    }
    ex = SnapshotBackfill(ACTOR, [0, 1], key_of, epoch(3), created=True, restore=consumed)
    ex.on_barrier(_barrier(6))
    out = ex.on_barrier(_barrier(7), [_insert(0, 4), _insert(1, 5), _insert(3, 7)])
    assert out.rows == 2 and len(out.emit) == 2


def test_a_snapshot_job_reports_its_phase_one_in_full() -> None:
    """Kills ``consumed_epoch = None`` / ``= 1`` at the start, and every renamed key and
    ``is not CONSUMED`` in ``report``."""
    s = epoch(3)
    ex = SnapshotBackfill(ACTOR, [0, 1], key_of, s)
    out = ex.on_barrier(Barrier(EpochPair(0, 1 << 16)), upstream_latest_epoch=epoch(4))
    read = first_read(ex, 10)
    assert read is not None and read.vnode == 0
    account_rows(ex, read, [])  # vnode 0 is empty: consumed
    assert out.progress == {
        "vnodes": [
            {"vnode": v, "state": "consuming", "current_pos": None, "row_count": 0, "epoch": s}
            for v in (0, 1)
        ],
        "phase": "snapshot",
        "snapshot_epoch": s,
        "finished_snapshot": False,
        "consumed_vnodes": 0,
        "snapshot_rows": 0,
        "consumed_epoch": 0,
        "pending_epoch_lag_ms": 100,
        "max_pending_epoch_lag_ms": None,
    }
    assert ex.report()["consumed_vnodes"] == 1


def test_a_created_snapshot_job_reports_no_lag_from_its_first_barrier() -> None:
    """Kills ``pending_epoch_lag_ms = None`` / ``= 1`` for a job created before a recovery."""
    consumed = {0: VnodeBackfillProgress(epoch(6), state=SnapshotVnodeState.CONSUMED)}
    ex = SnapshotBackfill(ACTOR, [0], key_of, epoch(3), created=True, restore=consumed)
    ex.on_barrier(_barrier(6))
    assert ex.report()["pending_epoch_lag_ms"] == 0
