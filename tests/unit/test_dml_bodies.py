"""A CSV body's records read a block at a time answer as the reading line by line does."""

from __future__ import annotations

import io
from typing import Any

import pytest

from backfill_core.schema import Column, ColumnType, TableSchema
from service.api import dml_bodies
from service.errors import ServiceError

INT_KEY = TableSchema.build(
    [Column("a", ColumnType.TEXT), Column("id", ColumnType.BIGINT, False)], ["id"]
)
TEXT_KEY = TableSchema.build(
    [Column("k", ColumnType.TEXT, False), Column("v", ColumnType.INT)], ["k"]
)
PLAIN = "".join(f"x{i},{i}\n" for i in range(40))

BODIES: list[tuple[TableSchema, str]] = [
    (INT_KEY, "a,id\n" + PLAIN),
    (INT_KEY, "a,id\n" + PLAIN.rstrip("\n")),  # no newline at the end
    (INT_KEY, "id,a\n" + "".join(f"{i},x{i}\n" for i in range(40))),
    (INT_KEY, "a,id\n" + PLAIN + "\n" + PLAIN.replace("x", "y")),  # a blank line
    (INT_KEY, "a,id\n" + PLAIN + '"q\nr",7\n' + "z,8\n"),  # a quoted newline
    (INT_KEY, "a,id\n" + PLAIN.replace("\n", "\r\n")),
    (INT_KEY, "a,id\n" + PLAIN + "w,0x1f\n"),  # a key Postgres reads, int() does not
    (INT_KEY, "a,id\n" + PLAIN + "w,nope\n"),
    (INT_KEY, "a,id\n" + PLAIN + "short\n" + PLAIN),
    (INT_KEY, "a,id\n" + PLAIN + "w,\n"),
    (TEXT_KEY, "k,v\n" + "".join(f"k{i},{i}\n" for i in range(40))),
    (TEXT_KEY, "v,k\n" + "".join(f"{i},k{i}\n" for i in range(40)) + "1,é\n"),
]


def _read(schema: TableSchema, body: bytes) -> list[Any]:
    out: list[Any] = []
    try:
        for record in dml_bodies._csv_rows(io.BytesIO(body), schema).records():
            out.append(record)
    except ServiceError as e:
        out.append((e.message, e.details))
    return out


def _line_by_line(schema: TableSchema, body: bytes) -> list[Any]:
    rows = dml_bodies._csv_rows(io.BytesIO(body), schema)
    index = rows.header.index(schema.primary_key[0])
    convert = dml_bodies._int_key if schema is INT_KEY else dml_bodies._text_key
    spool = io.BytesIO(body)
    next(spool)
    out: list[Any] = []
    try:
        for record in dml_bodies._csv_records(iter(spool), [(index, convert)], 1):
            out.append(record)
    except ServiceError as e:
        out.append((e.message, e.details))
    return out


@pytest.mark.parametrize("block", [7, 64, 1 << 20])
@pytest.mark.parametrize(("schema", "body"), BODIES)
def test_block_reading_answers_as_line_by_line(
    monkeypatch: pytest.MonkeyPatch, schema: TableSchema, body: str, block: int
) -> None:
    monkeypatch.setattr(dml_bodies, "CSV_BLOCK", block)
    data = body.encode()
    assert _read(schema, data) == _line_by_line(schema, data)


def test_bad_utf8_in_a_text_key_names_its_line() -> None:
    body = b"k,v\n" + b"a,1\n" * 3 + b"\xff,2\n"
    assert _read(TEXT_KEY, body)[-1][1] == {"line": 5}


def test_plain_lines_are_read_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    def line_by_line(*args: Any) -> Any:
        raise AssertionError("read line by line")

    monkeypatch.setattr(dml_bodies, "_csv_records", line_by_line)
    records = _read(INT_KEY, ("a,id\n" + PLAIN).encode())
    assert [(n, k) for n, k, _ in records] == [(i + 2, (i,)) for i in range(40)]
