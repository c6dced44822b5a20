from __future__ import annotations

from fastapi import Request

from service.context import ServiceContext


def get_ctx(request: Request) -> ServiceContext:
    ctx: ServiceContext = request.app.state.ctx
    return ctx
