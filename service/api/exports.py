"""Exports: ``POST /v1/tables/{name}/exports`` queues a relation's snapshot at a
committed epoch for a worker to write as Parquet with Spark; ``/v1/exports`` lists,
shows and cancels them."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from service.api.claimed import TaskStateJson, view_fields
from service.api.deps import get_ctx
from service.api.epochs import EpochJson, EpochQuery
from service.api.errors import EPOCH_GONE, ERROR_RESPONSES
from service.api.limits import RequestBody
from service.catalog.models import Export
from service.context import ServiceContext
from service.usecases import exports

router = APIRouter(tags=["exports"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]


class ExportCreate(RequestBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"format": "parquet", "path": "s3a://lake/orders/2026-11-27"}]
        },
    )
    format: Literal["parquet"]
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="an absolute path Spark can write, which must not exist yet: `file:/dir`, "
        "`s3a://bucket/dir`, `hdfs://namenode/dir` (where the cluster has those connectors), "
        "or `/dir` on Spark's default file system",
    )
    # a decimal string, bounded as the epoch of a read (``/rows?epoch=``)
    epoch: EpochQuery | None = Field(
        default=None, description="a committed epoch; default: the latest committed one"
    )


class ExportView(BaseModel):
    id: int
    table: str
    format: str
    path: str
    epoch: EpochJson = Field(description="the committed epoch whose snapshot is written")
    state: TaskStateJson
    rows: int | None = Field(description="rows written, once succeeded")
    error: str | None
    worker_id: int | None = Field(description="the worker that runs or ran it")
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class ExportList(BaseModel):
    exports: list[ExportView]


def _view(x: Export) -> ExportView:
    return ExportView(**view_fields(x))


@router.post(
    "/v1/tables/{name}/exports",
    status_code=202,
    response_model=ExportView,
    responses=EPOCH_GONE,
    operation_id="createExport",
)
def create_export(name: str, body: ExportCreate, ctx: Ctx) -> ExportView:
    return _view(exports.create_export(ctx.db, name, body.format, body.path, body.epoch))


@router.get("/v1/exports", response_model=ExportList, operation_id="listExports")
def list_exports(ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> ExportList:
    return ExportList(exports=[_view(x) for x in exports.list_exports(ctx.db, limit)])


@router.get("/v1/exports/{export_id}", response_model=ExportView, operation_id="getExport")
def get_export(export_id: int, ctx: Ctx) -> ExportView:
    return _view(exports.get_export(ctx.db, export_id))


@router.delete("/v1/exports/{export_id}", response_model=ExportView, operation_id="cancelExport")
def cancel_export(export_id: int, ctx: Ctx) -> ExportView:
    return _view(exports.cancel_export(ctx.db, export_id))
