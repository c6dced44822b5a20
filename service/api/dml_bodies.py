"""The bodies ``POST /v1/tables/{name}/dml`` takes, told apart by ``Content-Type``.

* ``application/json`` (or none): ``{"ops": [...]}``, at most ``MAX_DML_OPS`` ops, read
  whole (``BACKFILL_MAX_BODY_BYTES``) and parsed in one pass; ``json_ops`` is its fast
  path, for bodies that need no error message.
* ``application/x-ndjson``: one op object a line, the shape of the JSON ops.
* ``text/csv``: a header line of column names, then one row a line, each an insert.

A bulk body (NDJSON or CSV) has no op cap: it is read as it comes
(``BodySizeLimit`` lets it through up to ``BACKFILL_MAX_BULK_BODY_BYTES``) into a spool
file, memory first and disk past ``SPOOL_IN_MEMORY``, and only then applied, in one
transaction: a slow client does not hold the epoch open (barriers wait for DML) while
it sends. A line that cannot be read is a 4xx naming it (``line n``).
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal, NamedTuple

import msgspec
from fastapi import Request
from starlette.types import Scope

from backfill_core.schema import ColumnType, TableSchema
from service.api.bodies import SUSPECT_ESCAPES
from service.errors import BadRequest, Invalid, ServiceError, UnsupportedMediaType
from service.usecases.tables import DmlOp

Kind = Literal["json", "ndjson", "csv"]
MEDIA_TYPES: dict[str, Kind] = {
    "application/json": "json",
    "application/x-ndjson": "ndjson",
    "text/csv": "csv",
}
SPOOL_IN_MEMORY = 16 * 1024 * 1024
CSV_BLOCK = 1 << 20  # bytes of a CSV body's records read at a time
CSV_BLOCK_RECORDS = 10_000  # records a block, read line by line (quotes, say)
_DML_PATH = re.compile(r"/v1/tables/[^/]+/dml")
_OPS = frozenset({"insert", "update", "delete"})
_OP_KEYS = frozenset({"op", "row"})


def body_kind(content_type: str | None) -> Kind:
    """The body's kind from its ``Content-Type`` (none is JSON, as FastAPI reads it)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if not media or media.endswith("+json"):
        return "json"
    kind = MEDIA_TYPES.get(media)
    if kind is None:
        raise UnsupportedMediaType(
            f"Content-Type {media!r} is not taken here; use one of {', '.join(MEDIA_TYPES)}",
            {"supported": list(MEDIA_TYPES)},
        )
    return kind


def is_streamed(scope: Scope) -> bool:
    """Whether ``BodySizeLimit`` lets the request's body through unread: a bulk DML body."""
    if scope.get("method") != "POST" or not _DML_PATH.fullmatch(scope.get("path", "")):
        return False
    content_type = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
    try:
        return body_kind(content_type) != "json"
    except UnsupportedMediaType:
        return False  # answered 415 after a read of at most the ordinary limit


class CsvBlock(NamedTuple):
    """Records of a CSV body, consecutive in it."""

    lines: Sequence[int]  # each record's line in the body (its first, if it spans lines)
    keys: Sequence[Sequence[Any]]  # the records' primary keys: one sequence a key column
    texts: Sequence[bytes]  # each record as it is, ending in a newline
    # the text holds "nan" or "inf" in some case: a NaN or an infinity Postgres reads in a
    # double or numeric field may be there (none is otherwise: no check after the COPY)
    nonfinite_possible: bool


@dataclass(frozen=True)
class CsvRows:
    header: list[str]  # the columns, in the records' order
    not_null: list[str]  # columns whose empty field is an empty string, not null
    blocks: Iterator[CsvBlock]

    def records(self) -> Iterator[tuple[int, tuple[Any, ...], bytes]]:
        """(line, key, text) of each record."""
        for block in self.blocks:
            yield from zip(block.lines, zip(*block.keys, strict=True), block.texts, strict=True)


@dataclass
class DmlBody:
    kind: Kind
    raw: bytes = b""  # a JSON body
    spool: IO[bytes] | None = None  # a bulk body, at its start


async def dml_body(request: Request) -> AsyncIterator[DmlBody]:
    """The request's DML body (a dependency): JSON whole, a bulk body spooled."""
    kind = body_kind(request.headers.get("content-type"))
    if kind == "json":
        yield DmlBody(kind, raw=await request.body())
        return
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
        async for chunk in request.stream():
            spool.write(chunk)
        spool.seek(0)
        yield DmlBody(kind, spool=spool)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _JsonBody(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    ops: list[DmlOp]


_JSON_BODY = msgspec.json.Decoder(_JsonBody)


def json_ops(raw: bytes, max_ops: int) -> list[DmlOp] | None:
    """The ops of a JSON body that is valid as it stands, decoded into ``DmlOp``s in one
    pass of msgspec's parser, which checks the shape (``{"ops": [{"op", "row"}]}``,
    nothing else) as it goes; None for any body the model should read instead, to answer
    exactly as it does (its errors)."""
    if SUSPECT_ESCAPES.search(raw) is not None:
        return None
    try:
        ops = _JSON_BODY.decode(raw).ops
    except (msgspec.DecodeError, RecursionError):
        return None  # (NaN and Infinity are not JSON to msgspec, as to the model)
    if not 1 <= len(ops) <= max_ops:
        return None
    return ops


# bulk bodies ----------------------------------------------------------------


def bulk_reader(body: DmlBody) -> Callable[[TableSchema], Iterator[tuple[int, DmlOp]]]:
    """``read_ops`` of ``tables.apply_bulk_dml``: reads the spool from its start each time
    (a transaction retried after a deadlock reads it again)."""
    spool = body.spool
    assert spool is not None

    def read_ops(schema: TableSchema) -> Iterator[tuple[int, DmlOp]]:
        spool.seek(0)
        return _ndjson_ops(spool)

    return read_ops


def _line_error(line: int, message: str, cls: type[BadRequest | Invalid] = Invalid) -> Exception:
    return cls(f"line {line}: {message}", {"line": line})


_JSON_OP = msgspec.json.Decoder(DmlOp)


def _ndjson_ops(spool: IO[bytes]) -> Iterator[tuple[int, DmlOp]]:
    for number, line in enumerate(spool, 1):
        if not line.strip():
            continue  # blank lines (a trailing one, say) hold no op
        try:
            op = _JSON_OP.decode(line)
        except (msgspec.DecodeError, RecursionError):
            op = _ndjson_op(number, line)  # (read again, for its error)
        yield number, op


def _ndjson_op(number: int, line: bytes) -> DmlOp:
    """A line msgspec did not take, read by the standard library's parser: the 4xx that
    names what is wrong with it, or its op where only msgspec refused a value (a number
    past a double's range, an infinity here, which the row's check then refuses)."""
    try:
        o = json.loads(line, parse_constant=_reject_constant)
    except ValueError as e:
        raise BadRequest(
            f"line {number}: not valid JSON ({e})", {"line": number}, code="malformed_json"
        ) from None
    except RecursionError:
        raise _line_error(number, "JSON nested past the parser's depth", BadRequest) from None
    if type(o) is not dict or o.keys() != _OP_KEYS:
        raise _line_error(number, 'an op is an object with exactly "op" and "row"')
    if type(o["op"]) is not str or o["op"] not in _OPS:
        raise _line_error(number, '"op" must be "insert", "update" or "delete"')
    if type(o["row"]) is not dict:
        raise _line_error(number, '"row" must be an object')
    return DmlOp(o["op"], o["row"])


_KEY_TYPES = {
    ColumnType.SMALLINT: "int",
    ColumnType.INT: "int",
    ColumnType.BIGINT: "int",
    ColumnType.TEXT: "text",
}


def _int_key(field: bytes | str) -> int:
    try:
        return int(field)
    except ValueError:
        return int(field, 0)  # Postgres 16 reads 0x1f, 0o17 and 0b1 too


def _text_key(field: bytes | str) -> str:
    return field.decode("utf-8") if isinstance(field, bytes) else field


def csv_reader(body: DmlBody) -> Callable[[TableSchema], CsvRows]:
    """``read_csv`` of ``tables.apply_csv_inserts``: reads the spool from its start each
    time (the reading of a failed line's key, a retried transaction)."""
    spool = body.spool
    assert spool is not None

    def read_csv(schema: TableSchema) -> CsvRows:
        spool.seek(0)
        return _csv_rows(spool, schema)

    return read_csv


def _csv_rows(spool: IO[bytes], schema: TableSchema) -> CsvRows:
    lines = iter(spool)
    first = next(lines, b"")
    try:
        header = next(csv.reader([first.decode("utf-8")], strict=True), [])
    except (csv.Error, UnicodeDecodeError) as e:
        raise _line_error(1, f"the header is not valid CSV ({e})", BadRequest) from None
    for i, name in enumerate(header):
        if not schema.has(name):
            raise _line_error(1, f"unknown column {name!r} in the header")
        if name in header[:i]:
            raise _line_error(1, f"column {name!r} twice in the header")
    missing = [c.name for c in schema.columns if not c.nullable and c.name not in header]
    if missing:
        raise _line_error(1, f"the header must name the column(s) {', '.join(missing)}")
    kinds = [_KEY_TYPES.get(schema.column(n).type) for n in schema.primary_key]
    if None in kinds:
        raise Invalid(
            "a CSV body takes a table whose primary key columns are integers or text; "
            "send its rows as NDJSON",
            {"primary_key": list(schema.primary_key)},
        )
    keys = [
        (header.index(n), _int_key if k == "int" else _text_key)
        for n, k in zip(schema.primary_key, kinds, strict=True)
    ]
    not_null = [c.name for c in schema.columns if not c.nullable]  # all in the header
    if len(keys) > 1:
        return CsvRows(header, not_null, _grouped(_csv_records(lines, keys, 1)))
    plain_key: Callable[[bytes], Any] = int if kinds[0] == "int" else bytes.decode
    return CsvRows(header, not_null, _block_records(spool, keys, plain_key))


def _nonfinite_possible(text: bytes) -> bool:
    # every spelling of NaN and infinity Postgres reads (NaN, inf, -Infinity, ...)
    lowered = text.lower()
    return b"nan" in lowered or b"inf" in lowered


def _grouped(records: Iterator[tuple[int, tuple[Any, ...], bytes]]) -> Iterator[CsvBlock]:
    """Records read line by line (``_csv_records``) as blocks; those before a line that
    cannot be read come before its error, as they would one by one."""
    chunk: list[tuple[int, tuple[Any, ...], bytes]] = []
    try:
        for record in records:
            chunk.append(record)
            if len(chunk) == CSV_BLOCK_RECORDS:
                yield _block_of(chunk)
                chunk = []
    except ServiceError:
        if chunk:
            yield _block_of(chunk)
        raise
    if chunk:
        yield _block_of(chunk)


def _block_of(records: list[tuple[int, tuple[Any, ...], bytes]]) -> CsvBlock:
    lines, keys, texts = zip(*records, strict=True)
    return CsvBlock(
        lines, list(zip(*keys, strict=True)), texts, _nonfinite_possible(b"".join(texts))
    )


def _block_records(
    spool: IO[bytes],
    keys: Sequence[tuple[int, Callable[[Any], Any]]],
    plain_key: Callable[[bytes], Any],
) -> Iterator[CsvBlock]:
    """The blocks of a body with a one-column key, each the lines of ``CSV_BLOCK`` bytes
    while they are plain (no quote, carriage return or blank line: every line one
    record) and their keys read as they are (``plain_key``): the lines split, and the
    keys found, without a Python step per record. From the first other block on, line
    by line."""
    (index, _), number = keys[0], 1
    # a match a line (each follows a newline): its key's field; a line short of fields
    # has none
    field = re.compile(rb"\n(?:[^,\n]*,){%d}([^,\n]*)" % index)
    while block := spool.read(CSV_BLOCK):
        if not block.endswith(b"\n"):
            block += spool.readline()  # the rest of the block's last line
        if not block.endswith(b"\n"):
            block += b"\n"  # the body's last line
        lines = block.splitlines(keepends=True)
        found = None
        if not (b'"' in block or b"\r" in block or b"\n\n" in block or block[0] == 0x0A):
            found = field.findall(b"\n" + block[:-1])
        try:
            if found is None or len(found) != len(lines):  # a line short of the key's field
                raise ValueError
            read = list(map(plain_key, found))
        except (ValueError, UnicodeDecodeError):  # the line-by-line reading words it
            yield from _grouped(_csv_records(itertools.chain(lines, spool), keys, number))
            return
        yield CsvBlock(
            range(number + 1, number + 1 + len(lines)), [read], lines, _nonfinite_possible(block)
        )
        number += len(lines)


def _quoted_fields(record: str) -> list[str]:
    """The fields of a CSV record holding quotes, as Postgres reads them (``csv`` reads
    a quote inside an unquoted field as itself, Postgres as the start of a quoted part:
    a key read the other way would put its row in the wrong vnode)."""
    fields: list[str] = []
    field: list[str] = []
    quoted = False
    i, n = 0, len(record)
    while i < n:
        c = record[i]
        if quoted:
            if c == '"':
                if i + 1 < n and record[i + 1] == '"':
                    field.append('"')
                    i += 1
                else:
                    quoted = False
            else:
                field.append(c)
        elif c == '"':
            quoted = True
        elif c == ",":
            fields.append("".join(field))
            field = []
        else:
            field.append(c)
        i += 1
    if quoted:
        raise ValueError("a quoted field is not closed")
    fields.append("".join(field))
    return fields


def _csv_records(
    lines: Iterator[bytes], keys: Sequence[tuple[int, Callable[[Any], Any]]], number: int
) -> Iterator[tuple[int, tuple[Any, ...], bytes]]:
    """(line, key, record) of each record, ``number`` the line before the first; a record
    with quoted newlines spans lines."""
    single = keys[0] if len(keys) == 1 else None  # the usual key, without a generator
    for raw in lines:
        number += 1
        start = number
        fields: list[Any]
        if b'"' in raw:
            while raw.count(b'"') % 2:
                more = next(lines, None)
                if more is None:
                    break
                raw += more
                number += 1
            try:
                fields = _quoted_fields(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as e:
                raise _line_error(start, f"not valid UTF-8 ({e})", BadRequest) from None
            except ValueError as e:
                raise _line_error(start, f"not valid CSV ({e})", BadRequest) from None
        else:
            if not raw.strip(b"\r\n"):
                continue  # a blank line
            fields = raw.rstrip(b"\r\n").split(b",")
        try:
            if single is not None:
                key = (single[1](fields[single[0]]),)
            else:
                key = tuple(convert(fields[i]) for i, convert in keys)
        except IndexError:
            raise _line_error(start, "fewer fields than the header names") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise _line_error(start, f"bad key: {e}") from None
        if not raw.endswith(b"\n"):
            raw += b"\n"
        yield start, key, raw
