"""Known tokens for tests and benches, and clients that send them.

``use_test_tokens`` puts them in the environment (``tests/conftest.py`` does so for every
test, ``bench`` for every bench), so every ``Settings()`` of a control plane or a worker,
in this process or a child, has them with auth left on. Clients send the admin token
unless told otherwise.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.catalog.tokens import Role

TOKENS: dict[Role, str] = {
    "admin": "test-admin-token-0123456789",
    "reader": "test-reader-token-0123456789",
    "worker": "test-worker-token-0123456789",
}


def use_test_tokens(environ: MutableMapping[str, str] = os.environ) -> None:
    for role, token in TOKENS.items():
        environ[f"BACKFILL_{role.upper()}_TOKEN"] = token


def auth_header(role: Role = "admin") -> dict[str, str]:
    """The ``Authorization`` header of ``role``'s test token."""
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def http_client(base_url: str, role: Role = "admin", **kw: Any) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers=auth_header(role), **kw)


def api_client(app: FastAPI, role: Role = "admin", **kw: Any) -> TestClient:
    return TestClient(app, headers=auth_header(role), **kw)
