"""Batch reads: the groups of vnodes a Spark job's pushed-down tasks read under one
limit, and their accounting from a per-vnode summary, whatever order the branches ran in."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_core.epoch import EpochPair
from backfill_core.executors.arrangement import ArrangementBackfill, VnodeState
from backfill_core.executors.chain import ChainBackfill
from backfill_core.executors.flow import split_batches
from backfill_core.executors.interface import VnodeRows
from backfill_core.executors.messages import Barrier, BarrierKind, SnapshotRead
from spark_workers.spark_path import GROUPS_PER_TASK, groups_per_actor
from tests.kit.executors import ACTOR, VNODES, account_groups, epoch, key_of, serve_batch


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


# eight rows in each of vnodes 0-2 (a key's vnode is the key modulo 4)
TABLE = {v: [(k, 0) for k in range(v, 32, VNODES)] for v in range(3)}


def rows_of(read: SnapshotRead) -> list[Any]:
    return [r for r in TABLE[read.vnode] if read.after is None or key_of(r) > read.after][
        : read.limit
    ]


def started_chain() -> ChainBackfill:
    ex = ChainBackfill(ACTOR, [0, 1, 2], key_of)
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1)), BarrierKind.CHECKPOINT))
    return ex


def test_an_interleaved_batch_that_hit_its_limit_ends_no_vnode() -> None:
    """Vnode 1's rows came before vnode 0's ran out (a parallel append), and the limit
    stopped the statement: vnode 0's five rows do not show that it ended (it has eight).
    Accounted vnode after vnode, it was completed, and its other rows never read."""
    ex = started_chain()
    [batch] = ex.plan_reads(10, parts=1)
    assert [v for v, _ in batch.starts] == [0, 1, 2] and batch.limit == 10
    served = serve_batch(batch, rows_of, picks=(0, 1))  # 0, 1, 0, 1, ...: 5 rows each
    assert [v for v, _ in served] == [0, 1] * 5
    assert account_groups(ex, batch, {0: (5, (16,)), 1: (5, (17,))}) == 10
    assert [p.state for p in ex.progress.values()] == [VnodeState.IN_PROGRESS] * 2 + [
        VnodeState.NOT_STARTED
    ]
    # each vnode's position is its own last key
    assert ex.progress[0].current_pos == (16,) and ex.progress[1].current_pos == (17,)
    # read on, interleaved, to the end: every row read once, then every vnode ended
    read = 10
    while batches := ex.plan_reads(10, parts=1):
        for batch in batches:
            served = serve_batch(batch, rows_of, picks=(2, 1))
            summary = {v: (sum(1 for u, _ in served if u == v), key_of(r)) for v, r in served}
            read += account_groups(ex, batch, summary)
    assert read == 24
    assert {v: (p.state, p.current_pos, p.row_count) for v, p in ex.progress.items()} == {
        v: (VnodeState.COMPLETED, key_of(rows[-1]), 8) for v, rows in TABLE.items()
    }


@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    limits=st.lists(st.integers(1, 12), min_size=1),
    parts=st.integers(1, 3),
    data=st.data(),
)
def test_interleaved_batches_end_a_vnode_only_once_all_its_rows_are_read(
    sizes: list[int], limits: list[int], parts: int, data: st.DataObject
) -> None:
    """Batches served in random interleavings: a vnode is completed only once every row
    of it was read, its position is always its own last row read, and reading on reads
    every row once."""
    table = {v: [(k, 0) for k in range(v, VNODES * n, VNODES)] for v, n in enumerate(sizes)}

    def rows_of(read: SnapshotRead) -> list[Any]:
        rows = [r for r in table[read.vnode] if read.after is None or key_of(r) > read.after]
        return rows[: read.limit]

    ex = ChainBackfill(ACTOR, list(table), key_of)
    ex.on_barrier(Barrier(EpochPair(epoch(0), epoch(1)), BarrierKind.CHECKPOINT))
    read: dict[int, list[Any]] = {v: [] for v in table}
    turn = 0
    while batches := ex.plan_reads(limits[turn % len(limits)], parts):
        turn += 1
        assert turn < 200, "the reads make no progress"
        for batch in batches:
            picks = tuple(data.draw(st.lists(st.integers(0, 3), max_size=6)))
            served = serve_batch(batch, rows_of, picks)
            summary = {v: (sum(1 for u, _ in served if u == v), key_of(r)) for v, r in served}
            assert account_groups(ex, batch, summary) == len(served)
            for v, r in served:
                read[v].append(r)
            for v, p in ex.progress.items():
                assert p.current_pos == (key_of(read[v][-1]) if read[v] else None)
                assert p.row_count == len(read[v])
                if p.state is VnodeState.COMPLETED:
                    assert read[v] == table[v]
    assert read == table
    assert all(p.state is VnodeState.COMPLETED for p in ex.progress.values())


def test_a_batch_that_read_less_than_its_limit_ends_each_of_its_vnodes() -> None:
    """Then the limit stopped no branch, each of which had the batch's limit: every
    branch ran to its end, in whatever order."""
    ex = started_chain()
    [batch] = ex.plan_reads(30, parts=1)
    served = serve_batch(batch, rows_of, picks=(2, 0, 1))
    assert len(served) == 24
    assert account_groups(ex, batch, {v: (8, key_of(rows[-1])) for v, rows in TABLE.items()})
    assert all(p.state is VnodeState.COMPLETED for p in ex.progress.values())


def test_a_batch_summary_that_breaks_the_limit_or_its_vnodes_is_refused() -> None:
    ex = started_actor([0, 1])
    [batch] = ex.plan_reads(5, parts=1)
    with pytest.raises(ValueError, match="more rows"):
        account_groups(ex, batch, {0: (5, (4,)), 1: (1, (5,))})
    ex = started_actor([0, 1])
    [batch] = ex.plan_reads(5, parts=1)
    with pytest.raises(ValueError, match="does not read"):
        account_groups(ex, batch, {3: (1, (3,))})


@given(actors=st.integers(1, 256), cores=st.integers(1, 64))
def test_a_job_has_enough_groups_for_its_tasks_to_take_in_turn(actors: int, cores: int) -> None:
    per_actor = groups_per_actor(actors, cores)
    assert per_actor >= 1
    # enough groups that a task done early finds more to take, and no more than needed
    assert actors * per_actor >= GROUPS_PER_TASK * cores
    assert per_actor == 1 or actors * (per_actor - 1) < GROUPS_PER_TASK * cores


def test_rows_of_a_batch_read_are_accounted_as_its_summary() -> None:
    """The driver's batch read (rows in hand, the vnodes' interleaved) and a Spark
    task's (a summary) agree."""
    ex = started_actor([0, 1, 2])
    [batch] = ex.plan_reads(10, 1)
    served = serve_batch(batch, rows_of, picks=(1, 0))
    assert [v for v, _ in served] == [1, 0] * 5
    assert ex.account(batch, VnodeRows(served)) == [r for v in (0, 1) for u, r in served if u == v]
    assert ex.exhausted == set()  # the limit was hit
    assert ex.progress[0].current_pos == (16,) and ex.progress[1].current_pos == (17,)
    assert ex.progress[2].current_pos is None
    with pytest.raises(ValueError, match="does not read"):
        ex.account(batch, VnodeRows([(3, (3, 0))]))
