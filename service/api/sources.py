"""/v1/sources: Kafka topics as sources that jobs backfill from and then follow."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field

from backfill_core.schema import Column, SchemaError, parse_type
from connectors.kafka import redacted_properties
from service.api.deps import get_ctx
from service.api.errors import ERROR_RESPONSES
from service.api.idempotency import IdempotencyHeader, idempotent
from service.api.limits import MAX_INT32, STRICT, RequestBody, integer
from service.api.rules import Name
from service.api.tables import ColumnSpec, ColumnView
from service.catalog.models import Source
from service.context import ServiceContext
from service.errors import Invalid
from service.usecases import sources

router = APIRouter(prefix="/v1/sources", tags=["sources"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]


class KafkaSettings(BaseModel):
    model_config = STRICT
    bootstrap_servers: str = Field(max_length=1000, examples=["kafka:9092"])
    topic: str = Field(max_length=249, examples=["orders"])
    properties: dict[str, str] | None = Field(
        default=None,
        max_length=100,
        description="extra librdkafka client settings (e.g. security.protocol); secret "
        "ones (`*password*`, `*secret*`, `sasl.*`, `ssl.key*`) are write-only: read back "
        'as `"***"`',
    )


class SourceCreate(RequestBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "orders_events",
                    "kafka": {"bootstrap_servers": "kafka:9092", "topic": "orders"},
                    "columns": [
                        {"name": "id", "type": "bigint"},
                        {"name": "amount", "type": "double"},
                    ],
                }
            ]
        }
    )
    name: Name = Field(examples=["orders_events"])
    kafka: KafkaSettings
    format: Literal["json"] = "json"
    columns: list[ColumnSpec] = Field(
        min_length=1,
        max_length=1000,
        description="fields of each message's JSON object; `_partition` and `_offset` are "
        "added and form the key",
    )
    rate_limit: integer(0, MAX_INT32) | None = Field(
        default=None,
        description="messages/s the shared source reads; null: no limit",
    )
    on_error: Literal["skip", "fail"] = Field(
        default="skip",
        description="a message that is not a valid row (not a JSON object, or a field "
        "that does not fit its column): `skip` it (counted), or `fail` the job reading it",
    )


class SourceView(BaseModel):
    name: str
    kafka: KafkaSettings
    format: Literal["json"]
    columns: list[ColumnView]
    primary_key: list[str]
    rate_limit: int | None
    on_error: Literal["skip", "fail"]
    start_offsets: dict[str, int] = Field(
        description="partition -> where the shared source started (the topic's end then)"
    )
    created_at: dt.datetime


class SourceList(BaseModel):
    sources: list[SourceView]


def _view(src: Source) -> SourceView:
    props = src.kafka.get("properties")
    return SourceView(
        name=src.name,
        # secrets are write-only: stored for the workers' clients, never shown
        kafka=KafkaSettings(**(src.kafka | {"properties": redacted_properties(props or {})})),
        format="json",
        columns=[ColumnView(**c) for c in src.schema["columns"]],
        primary_key=src.schema["primary_key"],
        rate_limit=src.rate_limit,
        on_error="fail" if src.on_error == "fail" else "skip",
        start_offsets={k: int(v) for k, v in src.start_offsets.items()},
        created_at=src.created_at,
    )


def _columns(body: SourceCreate) -> list[Column]:
    cols = []
    for i, c in enumerate(body.columns):
        try:
            cols.append(Column(c.name, parse_type(c.type), True))
        except SchemaError as e:
            raise Invalid(e.message, {"field": f"columns[{i}].type"}) from None
    return cols


@router.post("", status_code=201, response_model=SourceView, operation_id="createSource")
def create_source(body: SourceCreate, ctx: Ctx, keyed: IdempotencyHeader) -> Response:
    columns = _columns(body)
    return idempotent(
        ctx,
        keyed,
        create=lambda claim: sources.create_source(
            ctx.db,
            body.name,
            body.kafka.model_dump(),
            columns,
            body.rate_limit,
            ctx.settings.default_vnode_count,
            on_error=body.on_error,
            claim=claim,
        ),
        respond=lambda src: (201, _view(src)),
        reload=lambda ref: sources.read_source(ctx.db, ref["source"]),
    )


@router.get("", response_model=SourceList, operation_id="listSources")
def list_sources(ctx: Ctx) -> SourceList:
    return SourceList(sources=[_view(s) for s in sources.list_sources(ctx.db)])


@router.get("/{name}", response_model=SourceView, operation_id="getSource")
def get_source(name: str, ctx: Ctx) -> SourceView:
    return _view(sources.read_source(ctx.db, name))


@router.delete("/{name}", status_code=204, response_class=Response, operation_id="dropSource")
def drop_source(name: str, ctx: Ctx) -> Response:
    sources.drop_source(ctx.db, name)
    return Response(status_code=204)
