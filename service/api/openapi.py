"""The committed ``openapi.yaml`` is rendered from the app (a test keeps them equal)."""

from __future__ import annotations

from typing import Any

import yaml

from service.settings import DEFAULT_OPEN_PATHS, Settings


def openapi_document() -> dict[str, Any]:
    """The document of the default configuration (auth on), whatever the environment."""
    from service.api.app import create_app

    settings = Settings(
        database_url="postgresql://unused/unused", auth=True, open_paths=DEFAULT_OPEN_PATHS
    )
    return create_app(settings).openapi()


def render_openapi() -> str:
    return yaml.safe_dump(openapi_document(), sort_keys=False, allow_unicode=True)
