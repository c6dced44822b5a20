"""Imports: ``POST /v1/tables/{name}/imports`` queues files for a worker to load into a
table with Spark, published at one epoch; ``/v1/imports`` lists, shows and cancels them."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from service.api.claimed import TaskStateJson, view_fields
from service.api.deps import get_ctx
from service.api.epochs import EpochJson
from service.api.errors import ERROR_RESPONSES
from service.api.limits import RequestBody
from service.catalog.models import Import
from service.context import ServiceContext
from service.usecases import imports

router = APIRouter(tags=["imports"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]


class ImportCreate(RequestBody):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"format": "parquet", "path": "s3a://lake/orders/2025/"}]},
    )
    format: Literal["parquet", "csv", "json"] = Field(
        description="`csv`: a header line naming the table's columns, in its order; "
        "`json`: one object per line"
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="an absolute path Spark can read, a file or a directory of files: "
        "`file:/dir`, `s3a://bucket/dir`, `hdfs://namenode/dir` (where the cluster has "
        "those connectors), or `/dir` on Spark's default file system",
    )


class ImportView(BaseModel):
    id: int
    table: str
    format: str
    path: str
    state: TaskStateJson
    epoch: EpochJson | None = Field(description="the epoch the rows were published at")
    rows: int | None = Field(description="rows imported, once succeeded")
    error: str | None
    error_code: str | None = Field(
        description="why it failed: `bad_row`, `key_exists`, `duplicate_key`, "
        "`unreadable_path`, `dropped`, `worker_lost`, `spark`"
    )
    error_details: dict[str, Any] | None = Field(
        description="where: e.g. the `file` and `line` (CSV, JSON) or `row` (Parquet, "
        "from 1) of a bad row, or the `key` of a conflict"
    )
    worker_id: int | None = Field(description="the worker that runs or ran it")
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class ImportList(BaseModel):
    imports: list[ImportView]


def _view(x: Import) -> ImportView:
    return ImportView(**view_fields(x), error_code=x.error_code, error_details=x.error_details)


@router.post(
    "/v1/tables/{name}/imports",
    status_code=202,
    response_model=ImportView,
    operation_id="createImport",
)
def create_import(name: str, body: ImportCreate, ctx: Ctx) -> ImportView:
    return _view(imports.create_import(ctx.db, name, body.format, body.path))


@router.get("/v1/imports", response_model=ImportList, operation_id="listImports")
def list_imports(ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> ImportList:
    return ImportList(imports=[_view(x) for x in imports.list_imports(ctx.db, limit)])


@router.get("/v1/imports/{import_id}", response_model=ImportView, operation_id="getImport")
def get_import(import_id: int, ctx: Ctx) -> ImportView:
    return _view(imports.get_import(ctx.db, import_id))


@router.delete("/v1/imports/{import_id}", response_model=ImportView, operation_id="cancelImport")
def cancel_import(import_id: int, ctx: Ctx) -> ImportView:
    return _view(imports.cancel_import(ctx.db, import_id))
