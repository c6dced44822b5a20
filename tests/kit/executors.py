"""Shared vocabulary of the executor property tests: rows ``(key, value)`` over a few
vnodes, evenly spaced epochs, an in-memory store, and random mutations."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from backfill_core.changes import Row, Version
from backfill_core.executors.interface import (
    BackfillExecutor,
    ReadGrouping,
    VnodeRows,
    VnodeSummary,
)
from backfill_core.executors.messages import SnapshotBatchRead, SnapshotRead
from backfill_core.executors.source import OffsetRead, SourceBackfill, SplitOffsets, SplitSummary
from tests.kit.store_model import StoreModel

VNODES = 4
ACTOR = 7
SPACING_MS = 100


def key_of(r: tuple[Any, ...]) -> tuple[Any, ...]:
    return (r[0],)


def vnode_of(r: tuple[Any, ...]) -> int:
    return int(r[0]) % VNODES


def epoch(i: int) -> int:
    return (i + 1) * SPACING_MS << 16


def new_store() -> StoreModel:
    return StoreModel(key_of, vnode_of)


def in_vnodes(
    rows: list[tuple[int, Any]], vnodes: set[int], upto: dict[int, Any] | None = None
) -> list[Any]:
    """The rows of ``vnodes`` (each at or below its position in ``upto``, when given)."""
    return [
        (v, r)
        for v, r in rows
        if v in vnodes and (upto is None or (upto.get(v) is not None and key_of(r) <= upto[v]))
    ]


# source backfill: a second actor of the same job, and Kafka offsets with holes
OTHER_ACTOR = 8
# an actor of another job of the same graph
OTHER_JOB_ACTOR = 9

# the actors a pause or resume names: some include the actor under test, some do not
# (another job's pause must leave it running, another job's resume must leave it paused)
named_actors = st.sets(st.sampled_from((ACTOR, OTHER_ACTOR, OTHER_JOB_ACTOR))).map(sorted)

# barrier mutations a flow-controlled executor must follow
mutations = st.one_of(
    st.none(),
    st.builds(lambda a: {"pause": a}, named_actors),
    st.builds(lambda a: {"resume": a}, named_actors),
    st.builds(lambda r: {"throttle": {str(ACTOR): r}}, st.one_of(st.none(), st.integers(0, 60))),
)


# reads through the executor interface, seen as the one vnode each reads ------------------


def one_vnode(read: SnapshotBatchRead) -> SnapshotRead:
    """A read of one vnode (``FIRST`` / ``EACH`` plans) as that vnode's read."""
    [(vnode, after)] = read.starts
    return SnapshotRead(vnode, read.epoch, after, read.limit)


def of_one_vnode(read: SnapshotRead) -> SnapshotBatchRead:
    """The interface's read of ``read``'s vnode alone (a group of one)."""
    return SnapshotBatchRead(read.epoch, ((read.vnode, read.after),), read.limit)


def first_read(ex: BackfillExecutor, max_rows: int) -> SnapshotRead | None:
    """The read of the first vnode still to read, with the whole budget (None: none)."""
    reads = ex.plan_reads(max_rows, grouping=ReadGrouping.FIRST)
    return one_vnode(reads[0]) if reads else None


def each_read(ex: BackfillExecutor, max_rows: int) -> list[SnapshotRead]:
    """One read per vnode still to read, sharing ``max_rows``."""
    return [one_vnode(r) for r in ex.plan_reads(max_rows, grouping=ReadGrouping.EACH)]


def account_rows(ex: BackfillExecutor, read: SnapshotRead, rows: list[Any]) -> list[Row]:
    """Account for one vnode's read from its rows; returns the rows to write."""
    return ex.account(of_one_vnode(read), VnodeRows([(read.vnode, r) for r in rows]))


def account_summary(
    ex: BackfillExecutor, read: SnapshotRead, count: int, last_pos: Row | None
) -> None:
    """Account for one vnode's read from its summary (rows written elsewhere)."""
    assert ex.account(of_one_vnode(read), VnodeSummary({read.vnode: (count, last_pos)})) == []


def account_groups(
    ex: BackfillExecutor, read: SnapshotBatchRead, summary: dict[int, tuple[int, Any]]
) -> int:
    """Account for a group read from its per-vnode summary; returns the rows read."""
    result = VnodeSummary(summary)
    assert ex.account(read, result) == []
    return result.rows


def account_offsets(
    ex: SourceBackfill, read: OffsetRead, offsets: list[int], *, end: int | None = None
) -> int:
    """Account for a split read from its offsets; returns how many leading ones show."""
    return ex.account(read, SplitOffsets(offsets, end=end))


def account_split_summary(
    ex: SourceBackfill,
    read: OffsetRead,
    count: int,
    last_offset: int | None,
    visible: int,
    *,
    last_visible: int | None = None,
    end: int | None = None,
) -> None:
    """Account for a split read from its summary (the visible rows written elsewhere)."""
    summary = SplitSummary(count, last_offset, visible, last_visible=last_visible, end=end)
    assert ex.account(read, summary) == 0


@dataclass(frozen=True)
class Batches:
    """Snapshot reads in ``parts`` groups of vnodes, each under one limit (the Spark
    path's pushed-down tasks), whose branches Postgres runs in an order of its own:
    each next row comes from the branch ``picks`` names (cycled), an index among those
    with rows left. No picks: the branches in order."""

    parts: int
    picks: tuple[int, ...] = ()


# how an epoch's snapshot reads go: "single" (one vnode at a time, the driver path),
# "spread" (one read per vnode, the Spark path moving rows) or ``Batches``
read_modes = st.one_of(
    st.just("single"),
    st.just("spread"),
    st.builds(Batches, st.integers(1, 3), st.lists(st.integers(0, 3), max_size=8).map(tuple)),
)


def serve_batch(
    batch: SnapshotBatchRead, rows_of: Callable[[SnapshotRead], list[Any]], picks: tuple[int, ...]
) -> list[tuple[int, Any]]:
    """``(vnode, row)`` as Postgres may return a batch read: its branches (each a vnode's
    rows after its position, up to the batch's limit) interleaved as ``picks`` say,
    until the limit of them all."""
    branches = [
        (v, deque(rows_of(SnapshotRead(v, batch.epoch, after, batch.limit))))
        for v, after in batch.starts
    ]
    out: list[tuple[int, Any]] = []
    while len(out) < batch.limit and (live := [b for b in branches if b[1]]):
        v, rows = live[picks[len(out) % len(picks)] % len(live)] if picks else live[0]
        out.append((v, rows.popleft()))
    return out


def read_batches(
    impl: Any,
    model_read: Callable[[int], Any],
    rows_of: Callable[[SnapshotRead], list[Any]],
    sizes: tuple[int, int, Batches],
    mvs: tuple[StoreModel, StoreModel, int],
) -> int:
    """Batch reads of the open epoch, ``sizes`` = (rows that fit, read chunk, how the
    batches go), until those rows are read or none are left to read. Each batch's
    branches run interleaved; the implementation accounts for it from its per-vnode
    summary (rows read, last key), as from a Spark task. The model replays the rows'
    vnodes in the order they came, row by row, and finds positions itself; it looks for
    the ends of the batch's vnodes only where the runtime could see them, when the
    batch read less than its limit (then every branch ran to its end). The rows go to
    ``mvs`` = (the implementation's MV, the model's MV, the model's write epoch).
    Returns the rows the implementation read."""
    left, chunk, mode = sizes
    impl_rows: list[Any] = []
    model_rows: list[Any] = []
    while left > 0 and (batches := impl.plan_reads(min(chunk * 3, left), mode.parts)):
        for batch in batches:
            served = serve_batch(batch, rows_of, mode.picks)
            summary = {v: (sum(1 for u, _ in served if u == v), key_of(r)) for v, r in served}
            assert account_groups(impl, batch, summary) == len(served)
            impl_rows += [r for _, r in served]
            left -= len(served)
            for v, _ in served:
                if (row := model_read(v)) is not None:
                    model_rows.append(row)
            if len(served) < batch.limit:
                for v, _ in batch.starts:
                    while (row := model_read(v)) is not None:  # none: the vnode ended
                        model_rows.append(row)
    impl_mv, model_mv, model_epoch = mvs
    impl_mv.write(impl.open_epoch, [Version(r) for r in impl_rows])
    model_mv.write(model_epoch, [Version(r) for r in model_rows])
    return len(impl_rows)


# epochs of a random workload: upstream ops (key, value, delete?), snapshot rows that fit
# before the barrier, a mutation carried by it, read chunk size, how the reads go
epoch_histories = st.lists(
    st.tuples(
        st.lists(
            st.tuples(st.integers(0, 15), st.integers(0, 9), st.booleans()), max_size=6
        ),  # ops
        st.one_of(st.just(1_000), st.integers(0, 8)),  # snapshot rows that fit before the barrier
        mutations,
        st.integers(1, 4),  # read chunk size
        read_modes,
    ),
    min_size=2,
    max_size=14,
)


def offsets_from_gaps(gaps: list[int], after: int = -1) -> list[int]:
    """Ascending offsets after ``after``, each ``gap`` past the previous one (1: no hole)."""
    out = []
    for g in gaps:
        after += g
        out.append(after)
    return out


# per partition: the offsets' gaps (an empty list is an empty partition)
offset_gaps = st.lists(st.integers(1, 3), max_size=8)
