"""Shared vocabulary of the executor property tests: rows ``(key, value)`` over a few
vnodes, evenly spaced epochs, an in-memory store, and random mutations."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

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


# barrier mutations a flow-controlled executor must follow
mutations = st.one_of(
    st.none(),
    st.just({"pause": True}),
    st.just({"resume": True}),
    st.builds(lambda r: {"throttle": {str(ACTOR): r}}, st.one_of(st.none(), st.integers(0, 60))),
)

# epochs of a random workload: upstream ops (key, value, delete?), snapshot rows that fit
# before the barrier, a mutation carried by it, read chunk size, spread reads or not
epoch_histories = st.lists(
    st.tuples(
        st.lists(
            st.tuples(st.integers(0, 15), st.integers(0, 9), st.booleans()), max_size=6
        ),  # ops
        st.one_of(st.just(1_000), st.integers(0, 8)),  # snapshot rows that fit before the barrier
        mutations,
        st.integers(1, 4),  # read chunk size
        st.booleans(),  # spread: one read per vnode at a time (the Spark path)
    ),
    min_size=2,
    max_size=14,
)


# source backfill: a second actor of the same job, and Kafka offsets with holes
OTHER_ACTOR = 8


def offsets_from_gaps(gaps: list[int], after: int = -1) -> list[int]:
    """Ascending offsets after ``after``, each ``gap`` past the previous one (1: no hole)."""
    out = []
    for g in gaps:
        after += g
        out.append(after)
    return out


# per partition: the offsets' gaps (an empty list is an empty partition)
offset_gaps = st.lists(st.integers(1, 3), max_size=8)
