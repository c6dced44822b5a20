"""/v1/tables: create, list, read, drop, DML and snapshot reads of versioned tables."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from backfill_core.schema import MAX_VNODE_COUNT, Column, SchemaError, TableSchema, parse_type
from service.api.bodies import parse_body
from service.api.deps import get_ctx
from service.api.dml_bodies import DmlBody, bulk_reader, csv_reader, dml_body, json_ops
from service.api.epochs import EpochJson, EpochQuery
from service.api.errors import EPOCH_GONE, ERROR_RESPONSES
from service.api.idempotency import IdempotencyHeader, idempotent
from service.api.limits import STRICT, RequestBody, integer
from service.api.rules import TYPE_DESCRIPTION, Name
from service.catalog import reader_views
from service.catalog.models import Relation
from service.context import ServiceContext
from service.errors import Invalid
from service.heap import collector_paused
from service.usecases import cdc, tables

router = APIRouter(prefix="/v1/tables", tags=["tables"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]

MAX_DML_OPS = 10_000
MAX_PAGE = 1000
WAIT_TIMEOUT_S = 30.0


class ColumnSpec(BaseModel):
    model_config = STRICT
    name: Name
    type: str = Field(
        min_length=1, max_length=40, description=TYPE_DESCRIPTION, examples=["bigint"]
    )
    nullable: bool = True


class ColumnView(BaseModel):
    name: str
    type: str = Field(examples=["bigint"])
    nullable: bool


class PostgresUpstream(BaseModel):
    model_config = STRICT
    dsn: str = Field(
        min_length=1,
        max_length=4096,
        description="libpq connection string or URI of the upstream (a secret: stored, "
        "given to the table's worker, never shown)",
        examples=["postgresql://replicator:secret@db.internal:5432/shop"],
    )
    table: str = Field(min_length=1, max_length=130, examples=["public.orders"])
    publication: Name | None = Field(
        default=None, description="an existing publication of the table (default: one made)"
    )
    slot: Name | None = Field(
        default=None, description="an existing pgoutput slot (default: one made)"
    )


class PostgresView(BaseModel):
    host: str = Field(description="the upstream's host:port/database (never the DSN)")
    table: str
    publication: str
    slot: str
    job_id: int | None = Field(description="the job that mirrors it")


_TABLE_EXAMPLES = [
    {
        "name": "orders",
        "columns": [
            {"name": "id", "type": "bigint", "nullable": False},
            {"name": "customer", "type": "text"},
            {"name": "amount", "type": "numeric"},
        ],
        "primary_key": ["id"],
    },
    {
        "name": "orders",
        "postgres": {
            "dsn": "postgresql://replicator:secret@db.internal:5432/shop",
            "table": "public.orders",
        },
    },
]


def _columns_or_postgres(schema: dict[str, Any]) -> None:
    """The document's TableCreate: `columns` and `primary_key`, or `postgres` (a CDC
    table), never both (the validator's rule, stated for clients). The three may be
    left out, not null."""
    schema["examples"] = _TABLE_EXAMPLES
    props = schema["properties"]
    for key in ("columns", "primary_key", "postgres"):
        prop = props[key]
        props[key] = {
            **prop["anyOf"][0],
            **{k: v for k, v in prop.items() if k in ("description", "title")},
        }
    schema["oneOf"] = [
        {"required": ["columns", "primary_key"], "not": {"required": ["postgres"]}},
        {
            "required": ["postgres"],
            "not": {
                "anyOf": [
                    {"required": ["columns"]},
                    {"required": ["primary_key"]},
                    {"required": ["distribution_key"]},
                ]
            },
        },
    ]


class TableCreate(RequestBody):
    model_config = ConfigDict(json_schema_extra=_columns_or_postgres)
    name: Name = Field(examples=["orders"])
    columns: list[ColumnSpec] | None = Field(default=None, min_length=1, max_length=1000)
    primary_key: list[Name] | None = Field(default=None, min_length=1, max_length=32)
    distribution_key: list[Name] | None = Field(default=None, min_length=1, max_length=32)
    vnode_count: integer(1, MAX_VNODE_COUNT) | None = None
    postgres: PostgresUpstream | None = Field(
        default=None,
        description="a CDC table: its columns and primary key come from this upstream "
        "table, and its rows mirror it (docs/api.md#cdc-tables); instead of "
        "`columns` and `primary_key`",
    )

    @model_validator(mode="after")
    def _one_shape(self) -> TableCreate:
        if self.postgres is not None:
            if self.columns is not None or self.primary_key is not None:
                raise ValueError(
                    "give either `postgres` (a CDC table: its schema comes from the upstream) "
                    "or `columns` and `primary_key`, not both"
                )
            if self.distribution_key is not None:
                raise ValueError("a CDC table is distributed by its primary key")
        elif self.columns is None or self.primary_key is None:
            raise ValueError("give `columns` and `primary_key` (or `postgres` for a CDC table)")
        return self


class TableView(BaseModel):
    name: str
    kind: Literal["table", "mv"]
    columns: list[ColumnView]
    primary_key: list[str]
    distribution_key: list[str]
    vnode_count: int
    sql_name: str = Field(
        description="the view of the latest committed snapshot that SQL clients read "
        "(docs/reading.md)",
        examples=["mv.orders"],
    )
    created_at: dt.datetime
    postgres: PostgresView | None = Field(
        default=None, description="the upstream of a CDC table (null for other tables)"
    )


class TableList(BaseModel):
    tables: list[TableView]


class DmlOpSpec(BaseModel):
    model_config = STRICT
    op: Literal["insert", "update", "delete"]
    row: dict[str, Any] = Field(
        description="column -> value (as its type takes JSON: README); no text anywhere may "
        "hold the NUL character or a lone surrogate"
    )


class DmlRequest(RequestBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "ops": [
                        {"op": "insert", "row": {"id": 1, "customer": "ada", "amount": "250.00"}},
                        {"op": "update", "row": {"id": 1, "amount": "275.00"}},
                    ]
                }
            ]
        }
    )
    ops: list[DmlOpSpec] = Field(min_length=1, max_length=MAX_DML_OPS)


class DmlResult(BaseModel):
    epoch: EpochJson = Field(description="the epoch the batch was written at")
    count: int


class RowsPage(BaseModel):
    epoch: EpochJson = Field(description="the committed epoch read at: pass it back with `after`")
    rows: list[dict[str, Any]]
    next: str | None = Field(
        description="pass back as `after` for the next page; null on the last page"
    )


def _view(rel: Relation, mirror: cdc.CdcInfo | None = None) -> TableView:
    s = rel.schema
    return TableView(
        name=rel.name,
        kind=rel.kind,  # type: ignore[arg-type]
        columns=[ColumnView(**c) for c in s["columns"]],
        primary_key=s["primary_key"],
        distribution_key=s["distribution_key"],
        vnode_count=s["vnode_count"],
        sql_name=reader_views.sql_name(rel),
        created_at=rel.created_at,
        postgres=None
        if mirror is None
        else PostgresView(
            host=mirror.host,
            table=mirror.table,
            publication=mirror.publication,
            slot=mirror.slot,
            job_id=mirror.job_id,
        ),
    )


def _views(ctx: ServiceContext, rels: list[Relation]) -> list[TableView]:
    mirrors = cdc.cdc_of(ctx.db, [r.id for r in rels])
    return [_view(r, mirrors.get(r.id)) for r in rels]


def _schema(body: TableCreate, default_vnodes: int) -> TableSchema:
    assert body.columns is not None and body.primary_key is not None
    try:
        cols = []
        for i, c in enumerate(body.columns):
            try:
                cols.append(Column(c.name, parse_type(c.type), c.nullable))
            except SchemaError as e:
                raise SchemaError(e.message, f"columns[{i}].type") from None
        return TableSchema.build(
            cols, body.primary_key, body.distribution_key, body.vnode_count or default_vnodes
        )
    except SchemaError as e:
        raise Invalid(e.message, {"field": e.path}) from None


@router.post("", status_code=201, response_model=TableView, operation_id="createTable")
def create_table(body: TableCreate, ctx: Ctx, keyed: IdempotencyHeader) -> Response:
    pg = body.postgres
    if pg is not None:
        spec = cdc.CdcSpec(pg.dsn, pg.table, pg.publication, pg.slot)
        vnodes = body.vnode_count or ctx.settings.default_vnode_count
        return idempotent(
            ctx,
            keyed,
            create=lambda claim: cdc.create_cdc_table(ctx.db, body.name, spec, vnodes, claim),
            respond=lambda rel: (201, _views(ctx, [rel])[0]),
            reload=lambda ref: tables.get_table(ctx.db, ref["table"]),
        )
    schema = _schema(body, ctx.settings.default_vnode_count)
    return idempotent(
        ctx,
        keyed,
        create=lambda claim: tables.create_table(ctx.db, body.name, schema, claim=claim),
        respond=lambda rel: (201, _view(rel)),
        reload=lambda ref: tables.get_table(ctx.db, ref["table"]),
    )


@router.get("", response_model=TableList, operation_id="listTables")
def list_tables(ctx: Ctx) -> TableList:
    return TableList(tables=_views(ctx, tables.list_tables(ctx.db)))


@router.get("/{name}", response_model=TableView, operation_id="getTable")
def get_table(name: str, ctx: Ctx) -> TableView:
    return _views(ctx, [tables.get_table(ctx.db, name)])[0]


@router.delete("/{name}", status_code=204, response_class=Response, operation_id="dropTable")
def drop_table(name: str, ctx: Ctx) -> Response:
    tables.drop_table(ctx.db, name)
    return Response(status_code=204)


_TEXT_BODY = {"type": "string"}
DML_BODY_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/DmlRequest"}},
            "application/x-ndjson": {
                "schema": _TEXT_BODY
                | {
                    "description": "one op a line, each as an item of DmlRequest.ops; no cap "
                    "on the ops, BACKFILL_MAX_BULK_BODY_BYTES on the body"
                },
                "example": '{"op": "insert", "row": {"id": 1, "customer": "ada"}}\n'
                '{"op": "delete", "row": {"id": 2}}\n',
            },
            "text/csv": {
                "schema": _TEXT_BODY
                | {
                    "description": "a header line of column names, then one row to insert a "
                    "line; an empty field is null; BACKFILL_MAX_BULK_BODY_BYTES on the body"
                },
                "example": "id,customer,amount\n1,ada,250.00\n2,bob,\n",
            },
        },
    }
}
UNSUPPORTED = {415: ERROR_RESPONSES[404] | {"description": "Unsupported Content-Type"}}


@router.post(
    "/{name}/dml",
    response_model=DmlResult,
    responses={504: ERROR_RESPONSES[404] | {"description": "Not committed in time"}} | UNSUPPORTED,
    operation_id="applyTableDml",
    openapi_extra=DML_BODY_OPENAPI,
)
def apply_dml(
    name: str,
    body: Annotated[DmlBody, Depends(dml_body)],
    ctx: Ctx,
    wait: Annotated[
        bool,
        Query(description="return only once the batch's epoch is committed (readable by default)"),
    ] = False,
) -> DmlResult:
    # the body by its Content-Type: JSON (DmlRequest, at most 10,000 ops), NDJSON or CSV
    # (docs/api.md#bulk-dml); every op is applied at one epoch, or none is
    with collector_paused():
        if body.kind == "json":
            ops = json_ops(body.raw, MAX_DML_OPS)
            if ops is None:  # the model says what is wrong (or reads what json_ops did not)
                parsed = parse_body(DmlRequest, body.raw)
                ops = [tables.DmlOp(o.op, o.row) for o in parsed.ops]
            epoch, count = tables.apply_dml(ctx.db, name, ops, ctx.clock)
        elif body.kind == "ndjson":
            epoch, count = tables.apply_bulk_dml(ctx.db, name, bulk_reader(body), ctx.clock)
        else:
            epoch, count = tables.apply_csv_inserts(ctx.db, name, csv_reader(body), ctx.clock)
    if wait:
        interval = ctx.settings.barrier_interval_ms
        tables.wait_readable(ctx.db, epoch, WAIT_TIMEOUT_S, ctx.signal, interval)
    return DmlResult(epoch=epoch, count=count)


@router.get(
    "/{name}/rows",
    response_model=RowsPage,
    responses=EPOCH_GONE,
    operation_id="readTableRows",
)
def read_rows(
    name: str,
    ctx: Ctx,
    epoch: Annotated[
        EpochQuery | None, Query(description="default: the latest committed epoch")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: Annotated[
        str | None, Query(max_length=4096, description="the `next` of the previous page")
    ] = None,
) -> RowsPage:
    page = tables.read_rows(ctx.db, name, epoch, limit, after)
    return RowsPage(epoch=page.epoch, rows=page.rows, next=page.next)
