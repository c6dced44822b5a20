"""Batch reads: the groups of vnodes a Spark job's pushed-down tasks read vnode after
vnode, and their accounting from a per-vnode summary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill
from backfill_core.executors.flow import split_batches
from backfill_core.executors.messages import Barrier, BarrierKind
from spark_workers.spark_path import GROUPS_PER_TASK, groups_per_actor
from tests.kit.executors import ACTOR, epoch, key_of


@given(
    pending=st.sets(st.integers(0, 63)).map(sorted),
    started=st.sets(st.integers(0, 63)),
    total=st.integers(0, 500),
    parts=st.integers(1, 8),
)
def test_groups_cover_the_pending_vnodes_once_in_contiguous_ranges(
    pending: list[int], started: set[int], total: int, parts: int
) -> None:
    batches = split_batches(pending, total, parts, 5, lambda v: (v,) if v in started else None)
    assert len(batches) <= parts
    if not pending or total == 0:
        assert batches == []
        return
    assert sum(b.limit for b in batches) == total
    assert all(b.limit > 0 and b.epoch == 5 for b in batches)
    groups = [sorted(v for v, _ in b.starts) for b in batches]
    assert [v for g in groups for v in g] == pending  # contiguous, in order, each once
    for b in batches:
        # a group goes on with the vnodes it started before it starts another
        flags = [after is None for _, after in b.starts]
        assert flags == sorted(flags)
        assert all((after is None) == (v not in started) for v, after in b.starts)


def started_actor(vnodes: list[int]) -> ArrangementBackfill:
    ex = ArrangementBackfill(ACTOR, vnodes, key_of)
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1)), BarrierKind.CHECKPOINT))
    return ex


def test_a_vnode_read_short_of_the_limit_it_had_left_is_at_its_end() -> None:
    ex = started_actor([0, 1, 2])
    [batch] = ex.next_batch_reads(10, parts=1)
    assert [v for v, _ in batch.starts] == [0, 1, 2] and batch.limit == 10
    # vnode 0 had 4 rows, vnode 1 filled the 6 rows left: vnode 2 was not reached
    assert ex.on_batch_summary(batch, {0: (4, (8,)), 1: (6, (13,))}) == 10
    assert ex.exhausted == {0}
    assert ex.progress[1].current_pos == (13,) and ex.progress[2].current_pos is None
    [again] = ex.next_batch_reads(10, parts=1)
    assert again.starts == ((1, (13,)), (2, None))


def test_a_batch_summary_that_breaks_the_limit_or_its_vnodes_is_refused() -> None:
    ex = started_actor([0, 1])
    [batch] = ex.next_batch_reads(5, parts=1)
    with pytest.raises(ValueError, match="more rows"):
        ex.on_batch_summary(batch, {0: (5, (4,)), 1: (1, (5,))})
    ex = started_actor([0, 1])
    [batch] = ex.next_batch_reads(5, parts=1)
    with pytest.raises(ValueError, match="does not read"):
        ex.on_batch_summary(batch, {3: (1, (3,))})


@given(actors=st.integers(1, 256), cores=st.integers(1, 64))
def test_a_job_has_enough_groups_for_its_tasks_to_take_in_turn(actors: int, cores: int) -> None:
    per_actor = groups_per_actor(actors, cores)
    assert per_actor >= 1
    # enough groups that a task done early finds more to take, and no more than needed
    assert actors * per_actor >= GROUPS_PER_TASK * cores
    assert per_actor == 1 or actors * (per_actor - 1) < GROUPS_PER_TASK * cores


def test_rows_of_a_batch_read_are_accounted_as_its_summary() -> None:
    """The driver's batch read (rows in hand) and a Spark task's (a summary) agree."""
    ex = started_actor([0, 1, 2])
    batch = ex.next_batch_read(10)
    assert batch is not None
    rows = [(0, (k, 0)) for k in (0, 4, 8, 12)] + [(1, (k, 0)) for k in range(1, 12, 2)]
    assert ex.on_batch_rows(batch, rows) == [r for _, r in rows]
    assert ex.exhausted == {0}
    assert ex.progress[1].current_pos == (11,) and ex.progress[2].current_pos is None
    with pytest.raises(ValueError, match="not in the order"):
        ex.on_batch_rows(batch, [(2, (2, 0)), (1, (13, 0))])
