"""The dashboard: one static page (HTML, vanilla JS, CSS) over the public API.

``GET /dashboard`` serves the page and ``GET /dashboard/assets/{name}`` its files from
``service/dashboard/``, installed as package data. Nothing is built and nothing is fetched
from elsewhere, so it works offline. The routes stay out of the OpenAPI document.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

from fastapi import APIRouter
from fastapi.responses import Response

from service.errors import NotFound

router = APIRouter(include_in_schema=False)

ASSETS: Traversable = resources.files("service") / "dashboard"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# the page is small and changes with the package: always revalidate
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def _asset(name: str) -> Response:
    suffix = name[name.rfind(".") :] if "." in name else ""
    # only plain file names of known kinds: no paths, no hidden files
    if "/" in name or "\\" in name or name.startswith(".") or suffix not in MEDIA_TYPES:
        raise NotFound(f"no dashboard asset {name!r}", {"asset": name})
    item = ASSETS / name
    if not item.is_file():
        raise NotFound(f"no dashboard asset {name!r}", {"asset": name})
    return Response(content=item.read_bytes(), media_type=MEDIA_TYPES[suffix], headers=HEADERS)


@router.get("/dashboard")
def dashboard() -> Response:
    return _asset("index.html")


@router.get("/dashboard/assets/{name}")
def dashboard_asset(name: str) -> Response:
    return _asset(name)
