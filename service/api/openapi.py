"""The committed ``openapi.yaml`` is rendered from the app (a test keeps them equal)."""

from __future__ import annotations

from typing import Any

import yaml

from service.settings import Settings


def openapi_document() -> dict[str, Any]:
    from service.api.app import create_app

    return create_app(Settings(database_url="postgresql://unused/unused")).openapi()


def render_openapi() -> str:
    return yaml.safe_dump(openapi_document(), sort_keys=False, allow_unicode=True)
