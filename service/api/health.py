"""Liveness and readiness."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from service import migrate
from service.api.deps import get_ctx
from service.context import ServiceContext

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: bool
    migrations: str | None
    migrations_head: str | None


@router.get("/healthz", response_model=Health, operation_id="getHealth")
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness}},
    operation_id="getReadiness",
)
def readyz(ctx: Annotated[ServiceContext, Depends(get_ctx)]) -> Readiness | JSONResponse:
    db_ok = ctx.db.ping()
    current = head = None
    if db_ok:
        try:
            current = migrate.current_revision(ctx.db.engine)
            head = migrate.head_revision(ctx.db.engine)
        except Exception:
            db_ok = False
    ready = db_ok and current is not None and current == head
    body = Readiness(
        status="ready" if ready else "not_ready",
        database=db_ok,
        migrations=current,
        migrations_head=head,
    )
    if ready:
        return body
    return JSONResponse(status_code=503, content=body.model_dump())
