"""The canonical key encoding and vnode sets at the points mutants of `backfill_core/vnode.py`
survived (`make mutation`, issue 39): the types without a golden value, the values a type
normalises, and the refusals of a count or a part of zero."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from backfill_core.schema import ColumnType as T
from backfill_core.vnode import VnodeBitmap, compute_vnode, encode_key, even_split, vnode_hasher

# (types, values, canonical bytes, vnode of 256), as in test_vnode.GOLDEN
GOLDEN = [
    ([T.DOUBLE], [1.5], "033ff8000000000000", 4),
    ([T.DOUBLE], [1.0], "033ff0000000000000", 99),
    # both zeros are one key: -0.0 is written as 0.0
    ([T.DOUBLE], [0.0], "030000000000000000", 107),
    ([T.DOUBLE], [-0.0], "030000000000000000", 107),
    ([T.NUMERIC], [Decimal("1")], "040000000131", 206),
    # normalize() gives 1E+3: the payload is positional, never an exponent
    ([T.NUMERIC], [Decimal("1000")], "040000000431303030", 105),
    ([T.NUMERIC], [Decimal("-0.00")], "040000000130", 88),
    ([T.NUMERIC], [Decimal("NaN")], "04000000034e614e", 198),
    ([T.BOOLEAN], [False], "0100", 190),
    # sorted keys, no spaces, UTF-8 rather than \u escapes
    (
        [T.JSONB],
        [{"b": [1, "é"], "a": None}],
        "0a000000177b2261223a6e756c6c2c2262223a5b312c22c3a9225d7d",
        205,
    ),
    ([T.TIMESTAMP], [dt.datetime(2024, 1, 1, 12, 30, 0, 5)], "0800060de18a56a205", 132),
    (
        [T.TIMESTAMPTZ],
        [dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)],
        "09ffffffffffffffff",
        128,
    ),
]


@pytest.mark.parametrize(("types", "values", "encoded", "vnode"), GOLDEN)
def test_golden_values_of_the_other_types(
    types: list[T], values: list[object], encoded: str, vnode: int
) -> None:
    assert encode_key(types, values).hex() == encoded
    assert compute_vnode(types, values, 256) == vnode
    assert vnode_hasher(types, 256)(values) == vnode


def test_a_key_with_too_few_or_too_many_values_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_key([T.INT, T.TEXT], [1])
    with pytest.raises(ValueError):
        encode_key([T.INT], [1, "x"])
    with pytest.raises(ValueError):
        vnode_hasher([T.INT, T.TEXT], 16, [0])


def test_zero_vnodes_or_parts_are_refused_before_any_division() -> None:
    with pytest.raises(ValueError):
        compute_vnode([T.INT], [1], 0)
    with pytest.raises(ValueError):
        vnode_hasher([T.INT], 0)
    with pytest.raises(ValueError):
        even_split(16, 0)


def test_bitmaps_keep_their_vnode_count_and_hold_no_empty_range() -> None:
    assert VnodeBitmap.of(16, [3]).vnode_count == 16
    assert VnodeBitmap.full(4).vnode_count == 4
    assert VnodeBitmap.full(0).ranges == ()
    # more parts than vnodes: the last parts are empty, with no (n, n) range
    assert even_split(2, 4) == [
        VnodeBitmap(2, ((0, 1),)),
        VnodeBitmap(2, ((1, 2),)),
        VnodeBitmap(2, ()),
        VnodeBitmap(2, ()),
    ]
