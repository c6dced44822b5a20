"""Shared vocabulary of the executor property tests: rows ``(key, value)`` over a few
vnodes, evenly spaced epochs, an in-memory store, and random mutations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from backfill_core.changes import Version
from backfill_core.executors.messages import SnapshotRead
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

# how an epoch's snapshot reads go: "single" (one vnode at a time, the driver path),
# "spread" (one read per vnode, the Spark path moving rows) or a number of groups of
# vnodes each read vnode after vnode under one limit (the Spark path's pushed-down tasks)
read_modes = st.one_of(st.just("single"), st.just("spread"), st.integers(1, 3))


def read_batches(
    impl: Any,
    model_read: Callable[[int], Any],
    rows_of: Callable[[SnapshotRead], list[Any]],
    sizes: tuple[int, int, int],
    mvs: tuple[StoreModel, StoreModel, int],
) -> int:
    """Batch reads of the open epoch, ``sizes`` = (rows that fit, read chunk, groups),
    until those rows are read or none are left to read. The implementation accounts for
    each batch from its per-vnode summary (rows read, last key), as from a Spark task;
    the model replays the plan (which vnodes, in which order, how many rows in all) row
    by row and finds positions and ends itself. The rows go to ``mvs`` = (the
    implementation's MV, the model's MV, the model's write epoch). Returns the rows the
    implementation read."""
    left, chunk, parts = sizes
    impl_rows: list[Any] = []
    model_rows: list[Any] = []
    while left > 0 and (batches := impl.next_batch_reads(min(chunk * 3, left), parts)):
        for batch in batches:
            remaining = batch.limit
            summary = {}
            for v, after in batch.starts:
                if remaining <= 0:
                    break
                rows = rows_of(SnapshotRead(v, batch.epoch, after, remaining))
                if rows:
                    summary[v] = (len(rows), key_of(rows[-1]))
                impl_rows += rows
                remaining -= len(rows)
            assert impl.on_batch_summary(batch, summary) == batch.limit - remaining
            left -= batch.limit - remaining
            remaining = batch.limit
            for v, _ in batch.starts:
                while remaining > 0 and (row := model_read(v)) is not None:
                    model_rows.append(row)
                    remaining -= 1
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
