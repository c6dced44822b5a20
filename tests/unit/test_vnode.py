import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_core.schema import ColumnType as T
from backfill_core.vnode import (
    VnodeBitmap,
    compute_vnode,
    encode_key,
    even_split,
    vnode_hasher,
    vnodes_hasher,
)

# (types, values, canonical bytes, vnode of 256): pinned so hashing never drifts
GOLDEN = [
    ([T.INT], [1], "020000000000000001", 190),
    ([T.BIGINT], [1], "020000000000000001", 190),
    ([T.INT], [-42], "02ffffffffffffffd6", 49),
    ([T.TEXT], ["hello"], "050000000568656c6c6f", 26),
    ([T.TEXT], [""], "0500000000", 109),
    ([T.INT, T.TEXT], [7, "x"], "020000000000000007050000000178", 4),
    ([T.NUMERIC], [Decimal("1.50")], "0400000003312e35", 213),
    ([T.DATE], [dt.date(2024, 2, 29)], "070000000000004d46", 138),
    ([T.TIMESTAMPTZ], [dt.datetime(2024, 1, 1, tzinfo=dt.UTC)], "0900060dd710212000", 178),
    ([T.TIMESTAMP], [dt.datetime(2024, 1, 1, 12, 30)], "0800060de18a56a200", 11),
    ([T.BOOLEAN], [True], "0101", 40),
    ([T.BYTEA], [b"\x00\xff"], "060000000200ff", 167),
    ([T.INT], [None], "00", 141),
]


@pytest.mark.parametrize(("types", "values", "encoded", "vnode"), GOLDEN)
def test_golden_values(types: list[T], values: list[object], encoded: str, vnode: int) -> None:
    assert encode_key(types, values).hex() == encoded
    assert compute_vnode(types, values, 256) == vnode


def test_equal_values_hash_equal_across_representations() -> None:
    assert compute_vnode([T.NUMERIC], [Decimal("1.50")], 256) == compute_vnode(
        [T.NUMERIC], [Decimal("1.5")], 256
    )
    assert compute_vnode([T.SMALLINT], [9], 64) == compute_vnode([T.BIGINT], [9], 64)
    utc = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    plus2 = utc.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert compute_vnode([T.TIMESTAMPTZ], [utc], 256) == compute_vnode(
        [T.TIMESTAMPTZ], [plus2], 256
    )


@pytest.mark.parametrize(("types", "values", "encoded", "vnode"), GOLDEN)
def test_fast_hasher_agrees_with_the_golden_values(
    types: list[T], values: list[object], encoded: str, vnode: int
) -> None:
    assert vnode_hasher(types, 256)(values) == vnode
    # the key's values picked out of a wider tuple (a primary key, a row) by position
    wide = ["pad", *reversed(values), "pad"]
    positions = [len(values) - i for i in range(len(values))]
    assert vnode_hasher(types, 256, positions)(wide) == vnode


@given(st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.integers(1, 4096))
def test_fast_hasher_agrees_with_compute_vnode(i: int, s: str, count: int) -> None:
    for types, values in (([T.BIGINT], [i]), ([T.INT, T.TEXT], [i, s]), ([T.TEXT], [s])):
        expected = compute_vnode(types, values, count)
        assert vnode_hasher(types, count)(values) == expected
        assert vnode_hasher(types, count, [1 + k for k in range(len(values))])([0, *values]) == (
            expected
        )


@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), st.text(max_size=4))
    ),
    st.integers(1, 4096),
)
def test_the_bulk_hasher_agrees_with_the_fast_one(
    keys: list[tuple[int | None, str]], count: int
) -> None:
    columns = [[i for i, _ in keys], [s for _, s in keys]]
    for types, at in (
        ([T.BIGINT], [0]),
        ([T.TEXT], [1]),
        ([T.INT, T.TEXT], [0, 1]),
        ([T.TEXT, T.INT], [1, 0]),
    ):
        one = vnode_hasher(types, count, at)
        assert vnodes_hasher(types, count, at)(columns) == [one(k) for k in keys]
    # without positions: the columns are the key's
    assert vnodes_hasher([T.BIGINT], count)(columns[:1]) == [
        vnode_hasher([T.BIGINT], count)([i]) for i, _ in keys
    ]


@given(st.integers(-(2**63), 2**63 - 1), st.integers(1, 4096))
def test_vnode_in_range(v: int, count: int) -> None:
    assert 0 <= compute_vnode([T.BIGINT], [v], count) < count


def test_spread_is_roughly_even() -> None:
    counts = [0] * 256
    for i in range(25_600):
        counts[compute_vnode([T.BIGINT], [i], 256)] += 1
    assert min(counts) > 50 and max(counts) < 170


@given(st.integers(1, 2048), st.integers(1, 64))
def test_even_split_covers_every_vnode_once_in_contiguous_ranges(count: int, parts: int) -> None:
    split = even_split(count, parts)
    assert len(split) == parts
    seen = [v for bm in split for v in bm]
    assert seen == list(range(count))
    sizes = [len(bm) for bm in split]
    assert max(sizes) - min(sizes) <= 1
    assert all(len(bm.ranges) <= 1 for bm in split)


def test_bitmap_round_trip_and_membership() -> None:
    bm = VnodeBitmap.of(16, [0, 1, 2, 7, 9, 10])
    assert bm.ranges == ((0, 3), (7, 8), (9, 11))
    assert 7 in bm and 8 not in bm and len(bm) == 6
    assert VnodeBitmap.from_json(16, bm.to_json()) == bm
    assert list(VnodeBitmap.full(4)) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        VnodeBitmap.of(4, [4])
