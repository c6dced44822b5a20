import datetime as dt
from decimal import Decimal

import pytest

from backfill_core.schema import (
    Column,
    ColumnType,
    SchemaError,
    TableSchema,
    coerce_value,
    parse_type,
    value_to_json,
)


def orders() -> TableSchema:
    return TableSchema.build(
        [
            Column("id", ColumnType.BIGINT),
            Column("amount", ColumnType.NUMERIC),
            Column("note", ColumnType.TEXT, False),
        ],
        ["id"],
    )


def test_build_defaults_distribution_key_to_primary_key_and_makes_keys_not_null() -> None:
    s = TableSchema.build(
        [Column("id", ColumnType.INT, True), Column("x", ColumnType.TEXT)], ["id"]
    )
    assert s.distribution_key == ("id",)
    assert s.column("id").nullable is False


@pytest.mark.parametrize(
    ("columns", "pk", "dk", "path"),
    [
        ([], ["id"], None, "columns"),
        ([Column("Bad", ColumnType.INT)], ["Bad"], None, "columns[0].name"),
        ([Column("a;drop", ColumnType.INT)], ["a;drop"], None, "columns[0].name"),
        ([Column("_x", ColumnType.INT)], ["_x"], None, "columns[0].name"),
        (
            [Column("a", ColumnType.INT), Column("a", ColumnType.INT)],
            ["a"],
            None,
            "columns[1].name",
        ),
        ([Column("a", ColumnType.INT)], [], None, "primary_key"),
        ([Column("a", ColumnType.INT)], ["b"], None, "primary_key[0]"),
        ([Column("a", ColumnType.JSONB)], ["a"], None, "primary_key[0]"),
        (
            [Column("a", ColumnType.INT), Column("b", ColumnType.INT)],
            ["a"],
            ["b"],
            "distribution_key",
        ),
    ],
)
def test_bad_schemas_name_the_problem(
    columns: list[Column], pk: list[str], dk: list[str] | None, path: str
) -> None:
    with pytest.raises(SchemaError) as e:
        TableSchema.build(columns, pk, dk)
    assert e.value.path == path


def test_unknown_type() -> None:
    with pytest.raises(SchemaError, match="unknown column type 'money'"):
        parse_type("money")
    assert parse_type("INTEGER") is ColumnType.INT


def test_coerce_row() -> None:
    s = orders()
    assert s.coerce_row({"id": 1, "amount": "2.50", "note": "x"}) == {
        "id": 1,
        "amount": Decimal("2.50"),
        "note": "x",
    }
    with pytest.raises(SchemaError, match="unknown column"):
        s.coerce_row({"id": 1, "note": "x", "zzz": 1})
    with pytest.raises(SchemaError, match="missing value for column 'note'"):
        s.coerce_row({"id": 1})
    with pytest.raises(SchemaError, match="must not be null"):
        s.coerce_row({"id": 1, "note": None})
    with pytest.raises(SchemaError, match="'id' of type bigint"):
        s.coerce_row({"id": "1", "note": "x"})


@pytest.mark.parametrize(
    ("t", "raw"),
    [
        (ColumnType.INT, True),
        (ColumnType.INT, 2**31),
        (ColumnType.SMALLINT, 40000),
        (ColumnType.DOUBLE, "1.0"),
        (ColumnType.NUMERIC, "NaN"),
        (ColumnType.NUMERIC, "1e131072"),  # beyond Postgres's numeric
        (ColumnType.NUMERIC, "1e-16384"),
        (ColumnType.JSONB, {"a": ["nul\x00"]}),
        (ColumnType.JSONB, {"key \x00": 1}),
        (ColumnType.JSONB, ["lone \ud800"]),
        (ColumnType.TEXT, "nul\x00"),
        (ColumnType.TEXT, "lone \ud800 surrogate"),
        (ColumnType.BOOLEAN, 1),
        (ColumnType.DATE, "2024-13-01"),
        (ColumnType.TIMESTAMP, "2024-01-01T00:00:00Z"),
        (ColumnType.TIMESTAMPTZ, "2024-01-01T00:00:00"),
        (ColumnType.BYTEA, "not base64!"),
    ],
)
def test_bad_values(t: ColumnType, raw: object) -> None:
    with pytest.raises(SchemaError):
        coerce_value(t, raw)


def test_values_at_postgres_limits() -> None:
    assert coerce_value(ColumnType.NUMERIC, "1e131071") == Decimal("1e131071")
    assert coerce_value(ColumnType.NUMERIC, "1e-16383") == Decimal("1e-16383")
    assert coerce_value(ColumnType.NUMERIC, "0e999999") == 0
    deep: object = 1
    for _ in range(100):
        deep = [deep]
    assert coerce_value(ColumnType.JSONB, deep) == deep
    with pytest.raises(SchemaError, match="deeper"):
        coerce_value(ColumnType.JSONB, [deep])


def test_json_round_trip() -> None:
    cases = [
        (ColumnType.NUMERIC, "12.340"),
        (ColumnType.DATE, "2024-02-29"),
        (ColumnType.TIMESTAMP, "2024-01-01T10:00:00"),
        (ColumnType.TIMESTAMPTZ, "2024-01-01T10:00:00Z"),
        (ColumnType.BYTEA, "AAH/"),
        (ColumnType.JSONB, {"a": [1, None]}),
        (ColumnType.DOUBLE, 1.5),
    ]
    for t, raw in cases:
        assert value_to_json(t, coerce_value(t, raw)) == raw
    tz = coerce_value(ColumnType.TIMESTAMPTZ, "2024-01-01T12:00:00+02:00")
    assert tz == dt.datetime(2024, 1, 1, 10, tzinfo=dt.UTC)


def test_the_compiled_insert_coercer_answers_as_coerce_row() -> None:
    schema = TableSchema.build(
        [
            Column("id", ColumnType.BIGINT, False),
            Column("s", ColumnType.SMALLINT),
            Column("d", ColumnType.DOUBLE),
            Column("t", ColumnType.TEXT, False),
            Column("b", ColumnType.BOOLEAN),
            Column("n", ColumnType.NUMERIC),
            Column("j", ColumnType.JSONB),
            Column("ts", ColumnType.TIMESTAMPTZ),
        ],
        ["id"],
    )
    base = {"id": 1, "t": "x"}
    rows: list[object] = [
        base,
        base | {"s": 5, "d": 2.5, "b": True, "n": "1.50", "j": {"a": [1]}, "ts": "2024-01-01Z"},
        base | {"d": 0.0},
        base | {"d": -0.0},
        base | {"d": 3},
        base | {"d": 4.0},
        base | {"d": float("nan")},
        base | {"d": float("inf")},
        base | {"d": True},
        base | {"s": 2**15},
        base | {"s": -(2**15)},
        base | {"s": 1.0},
        base | {"s": 1.5},
        base | {"s": False},
        base | {"id": 2**63},
        base | {"id": None},
        {"t": "x"},
        base | {"t": "é"},
        base | {"t": "a\x00"},
        base | {"t": "\ud800"},
        base | {"t": 5},
        base | {"b": 1},
        base | {"n": 1e400},
        base | {"j": float("nan")},
        base | {"ts": "2024-01-01T00:00:00"},
        base | {"nope": 1},
        base | {"s": None},
        [1, "x"],
        "row",
    ]
    coerce = schema.insert_coercer()
    for raw in rows:
        try:
            want: object = tuple(schema.coerce_row(raw, full=True).values())
        except SchemaError as e:
            want = e.message
        try:
            got: object = coerce(raw)
        except SchemaError as e:
            got = e.message
        assert repr(got) == repr(want), raw
