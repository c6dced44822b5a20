"""ETag / If-None-Match for reads that dashboards poll: an unchanged resource costs a 304.

The ETags are weak (``W/``): they leave out the committed epoch, which moves at every
barrier, so a poller gets a 304 as long as nothing else about the job changed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel

NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "unchanged (but for the committed epoch) since If-None-Match's ETag"}
}
_VOLATILE = "committed_epoch"


def _without_epoch(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_epoch(v) for k, v in value.items() if k != _VOLATILE}
    if isinstance(value, list):
        return [_without_epoch(v) for v in value]
    return value


def conditional(request: Request, body: BaseModel) -> Response:
    data = body.model_dump_json().encode()
    stable = json.dumps(_without_epoch(json.loads(data)), sort_keys=True).encode()
    etag = 'W/"' + hashlib.blake2b(stable, digest_size=12).hexdigest() + '"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    wanted = {t.strip() for t in request.headers.get("if-none-match", "").split(",")}
    # weak comparison: W/"x" and "x" match
    if "*" in wanted or {t.removeprefix("W/") for t in wanted} & {etag.removeprefix("W/")}:
        return Response(status_code=304, headers=headers)
    return Response(content=data, media_type="application/json", headers=headers)
