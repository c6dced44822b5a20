"""GET /v1/workers: the workers for operators and dashboards (the worker protocol below
``/v1/workers/{id}`` is ``workers.py``'s)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from service.api.deps import get_ctx
from service.api.errors import ERROR_RESPONSES
from service.context import ServiceContext
from service.usecases import workers

router = APIRouter(prefix="/v1/workers", tags=["workers"], responses=ERROR_RESPONSES)
Ctx = Annotated[ServiceContext, Depends(get_ctx)]


class PlacedActorView(BaseModel):
    id: int
    job_id: int
    graph_id: int
    state: str


class WorkerView(BaseModel):
    id: int
    name: str
    state: str = Field(description="alive, dead (its lease expired) or stopped (deregistered)")
    capacity: int = Field(description="how many actors it may run")
    registered_at: dt.datetime
    last_heartbeat_at: dt.datetime
    lease_expires_at: dt.datetime
    actors: list[PlacedActorView] = Field(description="the live actors placed on it")


class WorkerList(BaseModel):
    workers: list[WorkerView]


@router.get("", response_model=WorkerList, operation_id="listWorkers")
def list_workers(
    ctx: Ctx,
    include_gone: Annotated[
        bool, Query(description="also the dead and deregistered workers")
    ] = False,
) -> WorkerList:
    return WorkerList(
        workers=[
            WorkerView.model_validate(w, from_attributes=True)
            for w in workers.list_workers(ctx.db, include_gone=include_gone)
        ]
    )
