"""Guards of the executors at their exact boundaries (issue 39: each one survived a
mutation before these tests)."""

from __future__ import annotations

import pytest

from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill
from backfill_core.executors.chain import ChainBackfill
from backfill_core.executors.messages import Barrier
from backfill_core.executors.snapshot import Phase, SnapshotBackfill, VnodeUpdateDuringLogStore
from tests.kit.executors import account_rows, epoch, first_read, key_of

S = epoch(3)


def _finishing() -> SnapshotBackfill:
    """A snapshot job that caught up with its upstream at this barrier (phase 2's end)."""
    ex = SnapshotBackfill(1, [0, 1], key_of, S)
    ex.on_barrier(Barrier(EpochPair(0, 1 << 16)), upstream_latest_epoch=S)
    assert first_read(ex, 10) is not None
    for read in iter(lambda: first_read(ex, 10), None):
        account_rows(ex, read, [])
    ex.on_barrier(Barrier(EpochPair(1 << 16, S)), upstream_latest_epoch=S)
    ex.on_barrier(Barrier(EpochPair(S, epoch(4))), upstream_latest_epoch=S)
    return ex


def test_a_rescale_of_a_snapshot_job_that_is_finishing_fails_it() -> None:
    """The barrier that reports finish is still the log store's (the seed fails a vnode
    update there): the job is not merged yet, its progress is per replayed epoch."""
    ex = _finishing()
    assert ex.phase is Phase.FINISHING
    with pytest.raises(VnodeUpdateDuringLogStore):
        ex.on_vnode_update([0, 1, 2])
    assert ex.vnodes == (0, 1)


@pytest.mark.parametrize("kind", ["arrangement", "chain"])
def test_a_barrier_delivered_twice_or_skipped_is_refused(kind: str) -> None:
    """Each barrier closes the epoch the last one opened: a duplicate would emit the
    epoch's changes twice, a skipped one would never emit them."""
    ex: ArrangementBackfill | ChainBackfill = (
        ArrangementBackfill(1, [0], key_of)
        if kind == "arrangement"
        else ChainBackfill(1, [0], key_of)
    )
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1))))
    ex.on_barrier(Barrier(EpochPair(epoch(1), epoch(2))))
    with pytest.raises(ValueError, match="does not close the open epoch"):
        ex.on_barrier(Barrier(EpochPair(epoch(1), epoch(2))))  # delivered twice
    with pytest.raises(ValueError, match="does not close the open epoch"):
        ex.on_barrier(Barrier(EpochPair(epoch(3), epoch(4))))  # epoch 2 skipped
    ex.on_barrier(Barrier(EpochPair(epoch(2), epoch(3))))
