from __future__ import annotations

from fastapi import Request

from service.context import ServiceContext


async def get_ctx(request: Request) -> ServiceContext:
    # async: FastAPI runs a plain function dependency on its thread pool, a hop per
    # request that cost more than the progress read itself (bench/HISTORY.md)
    ctx: ServiceContext = request.app.state.ctx
    return ctx
