"""A CSV body's records read a block at a time answer as the reading line by line does;
a JSON body's fast path reads only what the request model reads, and as it does."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from backfill_core.schema import Column, ColumnType, TableSchema
from service.api import dml_bodies
from service.api.tables import DmlRequest
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


# JSON bodies: well-formed ops, and the ways a body can be off (a key too many or too
# few, a wrong type, a constant that is not JSON, an escape the text check must see)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # NaN and infinities written as Python writes them: not JSON
    st.text(max_size=6),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
_ROWS = st.dictionaries(st.sampled_from(["id", "a", "b", "\u0000", "é"]), _VALUES, max_size=3)
_OPS = st.fixed_dictionaries(
    {"op": st.sampled_from(["insert", "update", "delete"]), "row": _ROWS}
) | st.dictionaries(st.sampled_from(["op", "row", "x"]), st.sampled_from(["insert", 1]) | _ROWS)
_BODIES = st.fixed_dictionaries({"ops": st.lists(_OPS, max_size=4)}) | _VALUES


def _model_ops(raw: bytes) -> list[tuple[str, Any]] | None:
    try:
        return [(o.op, o.row) for o in DmlRequest.model_validate_json(raw).ops]
    except ValidationError:
        return None


def _fast_ops(raw: bytes) -> list[tuple[str, Any]] | None:
    ops = dml_bodies.json_ops(raw, 3)
    return None if ops is None else [(o.op, o.row) for o in ops]


@settings(max_examples=400, deadline=None)
@given(_BODIES, st.sampled_from(["", "dup", "escape"]))
def test_json_fast_path_reads_what_the_model_reads(body: Any, twist: str) -> None:
    text = json.dumps(body)
    if twist == "dup" and text.startswith('{"ops": '):  # a key given twice: the last counts
        text = '{"ops": [], ' + text[1:]
    elif twist == "escape":
        text = text.replace("a", "\\ud800", 1)
    raw = text.encode()
    fast = _fast_ops(raw)
    if fast is not None:  # a body the fast path takes is one the model takes, as read
        model = DmlRequest.model_validate_json(raw)
        assert len(model.ops) <= 3
        assert fast == [(o.op, o.row) for o in model.ops]


@settings(max_examples=300, deadline=None)
@given(_OPS | _VALUES)
def test_ndjson_fast_path_reads_what_the_line_reader_reads(line: Any) -> None:
    raw = json.dumps(line).encode() + b"\n"
    try:
        slow: Any = dml_bodies._ndjson_op(1, raw)
    except ServiceError as e:
        slow = (e.message, e.details)
    try:
        fast: Any = [op for _, op in dml_bodies._ndjson_ops(io.BytesIO(raw))]
    except ServiceError as e:
        fast = (e.message, e.details)
    assert fast == [slow] if isinstance(slow, dml_bodies.DmlOp) else fast == slow


@pytest.mark.parametrize(
    "raw",
    [
        b'{"ops": [{"op": "insert", "row": {"id": 1, "a": "x", "c": 1.5, "j": {"k": [1]}}}]}',
        b'{"ops": [{"op": "delete", "row": {"id": 123456789012345678901234567890}}]}',
        b'{"ops": [{"op": "update", "row": {"id": 1, "a": null}}, {"op": "insert", "row": {}}]}',
    ],
)
def test_json_fast_path_takes_plain_bodies(raw: bytes) -> None:
    assert _fast_ops(raw) == _model_ops(raw) is not None


@pytest.mark.parametrize(
    "raw",
    [
        b'{"ops": []}',
        b'{"ops": [{"op": "insert", "row": {}}], "x": 1}',
        b'{"ops": [{"op": "insert", "row": {}, "x": 1}]}',
        b'{"ops": [{"op": "upsert", "row": {}}]}',
        b'{"ops": [{"op": "insert", "row": []}]}',
        b'{"ops": [{"op": "insert"}]}',
        b'{"ops": [{"op": "insert", "row": {"c": NaN}}]}',
        b'{"ops": [{"op": "insert", "row": {"a": "\\u0000"}}]}',
        b'{"ops": [{"op": "insert", "row": {"a": "\\ud800"}}]}',
        b'{"ops": [' + b", ".join([b'{"op": "insert", "row": {}}'] * 4) + b"]}",
        b"[]",
        b"",
    ],
)
def test_json_fast_path_leaves_the_rest_to_the_model(raw: bytes) -> None:
    assert _fast_ops(raw) is None
