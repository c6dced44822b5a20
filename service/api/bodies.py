"""Request bodies parsed on a request thread instead of the event loop.

FastAPI parses and validates a declared body on the event loop thread, before the
endpoint runs in the thread pool. The workers' batched collects are the largest bodies
the control plane takes (up to 1,000 actors' per-vnode progress, ten times a second and
more), and parsing one held the loop for tens of milliseconds, during which every other
request (a dashboard's progress read, ``/healthz``) waited. Routes taking such a body
declare ``raw: RawBody`` and call ``parse_body`` from their (sync) endpoint: the bytes are
read on the loop, the parsing happens in the thread pool, in one pass of pydantic's JSON
parser (no ``json.loads`` into Python objects first, and no ``json.dumps`` back for the
text check when the bytes show no escape that could hide such text). Errors are the
same ``RequestValidationError`` (``loc`` starting with ``body``) a declared body gives.
``document_raw_bodies`` puts the model in the OpenAPI document as if it were declared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import Schema
from pydantic import BaseModel, ValidationError

from service.api.limits import TEXT_CHECKED

M = TypeVar("M", bound=BaseModel)

# the only ways JSON text can spell a NUL or a lone surrogate (raw control characters and
# invalid UTF-8 are not JSON); a body without them needs no text check
SUSPECT_ESCAPES = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


async def _raw_body(request: Request) -> bytes:
    return await request.body()


RawBody = Annotated[bytes, Depends(_raw_body)]


def parse_body(model: type[M], raw: bytes) -> M:
    """``raw`` as a ``model``, or the RequestValidationError a declared body would raise."""
    if not raw.strip():
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        if SUSPECT_ESCAPES.search(raw) is None:
            return model.model_validate_json(raw, context=TEXT_CHECKED)
        # rare: Python's parser keeps lone surrogates for the text check to name them
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body",),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": str(e)},
                    }
                ]  # fmt: skip
            ) from None
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
        ) from None


def raw_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route taking ``model`` as a raw body."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def document_raw_bodies(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Add ``models`` (and the models they use) to the document's component schemas."""

    def components() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for model in models:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            out.update(schema.pop("$defs", {}))
            out[model.__name__] = schema
        return out

    document_components(app, components)


def document_components(app: FastAPI, components: Callable[[], dict[str, Any]]) -> None:
    """Add the schemas ``components()`` names to the document's component schemas (one
    already there is kept)."""
    base: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = base()
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, sub in components().items():
            # as FastAPI renders its own: through the document's model, no nulls
            rendered = jsonable_encoder(Schema(**sub), by_alias=True, exclude_none=True)
            schemas.setdefault(name, rendered)
        doc["components"]["schemas"] = dict(sorted(schemas.items()))
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
