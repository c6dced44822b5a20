"""Bearer tokens and roles: the role matrix over every route of the app, the admin token
generated (and shown) once, tokens stored only as hashes, open paths, the auth switch."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.api.app import create_app
from service.catalog import tokens
from service.db import Database
from service.settings import Settings
from spark_workers.client import ControlPlaneClient, ProtocolError
from tests.kit.auth import TOKENS, auth_header
from tests.kit.live import live_server

IDENTITIES: dict[str, dict[str, str]] = {
    "none": {},
    "wrong": {"Authorization": "Bearer not-a-token-of-this-service"},
    "malformed": {"Authorization": f"Basic {TOKENS['admin']}"},
    "reader": auth_header("reader"),
    "worker": auth_header("worker"),
    "admin": auth_header("admin"),
}
OPEN = {"/healthz", "/readyz", "/metrics"}
PUBLIC = {"/dashboard", "/dashboard/assets/{name}", "/docs", "/docs/oauth2-redirect", "/redoc"}
PUBLIC |= {"/openapi.json"}
# nothing waits: event streams end, long polls return at once, DML does not wait
NO_WAIT = {"follow": "false", "timeout_ms": "0", "wait": "false"}
ADMIN_TOKEN = re.compile(r"admin token: (\S+) \(shown once")


def allowed(method: str, path: str) -> set[str] | None:
    """The issue's rules, written out again (not imported): None means open to all."""
    if (path in OPEN or path in PUBLIC) and method == "GET":
        return None
    if path.startswith("/v1/workers/") or (path == "/v1/workers" and method != "GET"):
        return {"worker", "admin"}  # the worker protocol; the list is for operators
    if method == "GET":
        return {"reader", "admin"}
    return {"admin"}


def every_route(app: FastAPI) -> Iterator[tuple[str, str, str]]:
    """(method, template, a concrete path) for every route and method of the app."""
    for route in iter_route_contexts(app.routes):  # included routers' routes too
        concrete = re.sub(r"\{[^}]+\}", "1", route.path)
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                yield method, route.path, concrete


@pytest.fixture
def anonymous(db: Database, settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, db), raise_server_exceptions=False) as c:
        yield c


def test_role_matrix_over_every_route(anonymous: TestClient) -> None:
    app: FastAPI = anonymous.app  # type: ignore[assignment]
    checked = 0
    for method, template, path in every_route(app):
        roles = allowed(method, template)
        for who, headers in IDENTITIES.items():
            r = anonymous.request(method, path, headers=headers, params=NO_WAIT)
            where = f"{who} {method} {template} -> {r.status_code} {r.text[:200]}"
            assert r.status_code < 500, where
            if roles is None or who in roles:
                assert r.status_code not in (401, 403), where
            elif who in ("none", "wrong", "malformed"):
                assert r.status_code == 401, where
                assert r.json()["error"]["code"] == "unauthorized", where
                assert r.headers["WWW-Authenticate"].startswith("Bearer"), where
            else:
                assert r.status_code == 403, where
                assert r.json()["error"]["code"] == "forbidden", where
            checked += 1
    assert checked >= 25 * len(IDENTITIES), "fewer routes than the API has"


def test_head_requests_are_reads(anonymous: TestClient) -> None:
    assert anonymous.head("/v1/jobs").status_code == 401
    assert anonymous.head("/v1/jobs", headers=auth_header("worker")).status_code == 403
    assert anonymous.head("/v1/jobs", headers=auth_header("reader")).status_code != 403


def test_an_anonymous_body_is_never_read(anonymous: TestClient) -> None:
    r = anonymous.post("/v1/tables", content=b"{not json", headers={"content-type": "x"})
    assert r.status_code == 401
    assert r.headers["Connection"] == "close"


def test_the_openapi_document_declares_the_scheme(anonymous: TestClient) -> None:
    doc = anonymous.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["security"] == [{"bearer": []}]
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    assert set(doc["paths"]["/v1/jobs"]["post"]["responses"]) >= {"401", "403"}


def _start(settings: Settings, db: Database) -> TestClient:
    with TestClient(create_app(settings, db)) as c:
        return c


def _rows(db: Database) -> list[tuple[str, str, str]]:
    with db.engine.connect() as conn:
        return [
            tuple(r) for r in conn.execute(text("SELECT token_hash, role, source FROM api_tokens"))
        ]  # type: ignore[misc]


def _dump(db: Database) -> str:
    with db.engine.connect() as conn:
        return " ".join(conn.execute(text("SELECT t::text FROM api_tokens t")).scalars())


def test_without_an_admin_token_one_is_generated_and_shown_once(
    db: Database, fresh_db_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(database_url=fresh_db_url, admin_token=None, run_barrier_loop=False)
    with TestClient(create_app(settings, db)) as c:
        shown = ADMIN_TOKEN.findall(capfd.readouterr().err)
        assert len(shown) == 1, "the generated admin token is printed exactly once"
        token = shown[0]
        admin = {"Authorization": f"Bearer {token}"}
        assert c.get("/v1/jobs").status_code == 401
        assert c.post("/v1/tables", json={}, headers=admin).status_code == 422  # past auth
    assert token not in _dump(db), "the token itself is never stored"
    assert (hashlib.sha256(token.encode()).hexdigest(), "admin", "generated") in _rows(db)

    with TestClient(create_app(settings, db)) as c:  # second start: nothing new
        assert not ADMIN_TOKEN.findall(capfd.readouterr().err)
        assert c.get("/v1/jobs", headers=admin).status_code == 200

    # a configured admin token replaces the generated one
    configured = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    with TestClient(create_app(configured, db)) as c:
        assert not ADMIN_TOKEN.findall(capfd.readouterr().err)
        assert c.get("/v1/jobs", headers=admin).status_code == 401
        assert c.get("/v1/jobs", headers=auth_header("admin")).status_code == 200


def test_configured_tokens_are_stored_hashed_and_replaced_when_changed(
    db: Database, fresh_db_url: str
) -> None:
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    _start(settings, db)
    assert sorted(_rows(db)) == sorted(
        (hashlib.sha256(t.encode()).hexdigest(), role, "settings") for role, t in TOKENS.items()
    )
    dump = _dump(db)
    assert not any(t in dump for t in TOKENS.values()), "a token is stored in plain text"

    new_reader = "another-reader-token-0123456789"
    changed = Settings(database_url=fresh_db_url, run_barrier_loop=False, reader_token=new_reader)
    with TestClient(create_app(changed, db)) as c:
        assert c.get("/v1/jobs", headers=auth_header("reader")).status_code == 401
        assert (
            c.get("/v1/jobs", headers={"Authorization": f"Bearer {new_reader}"}).status_code == 200
        )
    assert len(_rows(db)) == 3


def test_a_token_revoked_elsewhere_stops_working_after_the_reload(db: Database) -> None:
    now = [0.0]
    authority = tokens.TokenAuthority({}, clock=lambda: now[0])
    authority.start(db)
    token = tokens.new_token()
    tokens.store(db, tokens.hash_token(token), "reader", tokens.SESSION)
    now[0] += tokens.MISS_RELOAD_S
    assert authority.role_of(token) == "reader"  # an unknown token reloads the snapshot
    tokens.revoke(db, tokens.hash_token(token))
    assert authority.role_of(token) == "reader"  # cached
    now[0] += tokens.RELOAD_S
    assert authority.role_of(token) is None


def test_open_paths_are_configurable(db: Database, fresh_db_url: str) -> None:
    settings = Settings(database_url=fresh_db_url, open_paths=("/v1/jobs",))
    with TestClient(create_app(settings, db)) as c:
        assert c.get("/v1/jobs").status_code == 200
        assert c.get("/healthz").status_code == 401
        assert c.get("/metrics", headers=auth_header("reader")).status_code == 200
        assert c.post("/v1/jobs", json={}).status_code == 401  # open to reads only


def test_the_auth_switch_turns_it_all_off(
    db: Database, fresh_db_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(database_url=fresh_db_url, auth=False, admin_token=None)
    with TestClient(create_app(settings, db)) as c:
        assert c.get("/v1/jobs").status_code == 200
        spec = {"name": "t", "columns": [{"name": "id", "type": "bigint"}], "primary_key": ["id"]}
        assert c.post("/v1/tables", json=spec).status_code == 201
        assert "securitySchemes" not in c.get("/openapi.json").json()["components"]
    assert not ADMIN_TOKEN.findall(capfd.readouterr().err)
    assert _rows(db) == []


def test_the_worker_client_sends_its_token(db: Database, fresh_db_url: str) -> None:
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    with live_server(settings, db) as url:
        for token, status in ((None, 401), (TOKENS["reader"], 403), ("x" * 20, 401)):
            client = ControlPlaneClient(url, token=token)
            with pytest.raises(ProtocolError) as e:
                client.register("w", 1)
            assert e.value.status == status
            client.close()
        client = ControlPlaneClient(url, token=TOKENS["worker"])
        assert client.register("w", 1).worker_id == client.worker_id
        client.heartbeat()
        client.close()


def test_the_embedded_worker_gets_its_own_worker_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.meta import spawner

    started: list[dict[str, Any]] = []

    class FakePopen:
        def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
            started.append(env)

        def poll(self) -> int | None:
            return None

    monkeypatch.setattr(spawner.subprocess, "Popen", FakePopen)
    spawner.EmbeddedWorkerSpawner(lambda: "http://127.0.0.1:1", "the-token").ensure()
    (env,) = started
    assert env["BACKFILL_WORKER_TOKEN"] == "the-token"
    assert "BACKFILL_ADMIN_TOKEN" not in env and "BACKFILL_READER_TOKEN" not in env
