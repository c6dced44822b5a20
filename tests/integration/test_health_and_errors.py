from typing import Any

from fastapi.testclient import TestClient

from service.api.app import create_app
from service.db import Database
from service.errors import Conflict
from service.settings import Settings
from tests.kit.auth import api_client


def assert_error(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_when_migrated(client: TestClient) -> None:
    r = client.get("/readyz")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ready" and body["database"] is True
    assert body["migrations"] == body["migrations_head"] is not None


def test_readyz_is_503_until_migrations_reach_head(fresh_db_url: str) -> None:
    db = Database(fresh_db_url)
    settings = Settings(database_url=fresh_db_url, auto_migrate=False)
    with TestClient(create_app(settings, db)) as c:
        r = c.get("/readyz")
    db.close()
    assert r.status_code == 503
    assert r.json()["status"] == "not_ready"
    assert r.json()["migrations"] is None


def test_readyz_is_503_when_the_database_is_unreachable(db: Database) -> None:
    bad = Database("postgresql://nobody@127.0.0.1:1/none")
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/none", auto_migrate=False)
    with TestClient(create_app(settings, bad)) as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    assert r.json()["database"] is False


def test_unknown_route_and_method_use_the_error_format(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing-here"), 404, "not_found")
    assert_error(client.post("/healthz"), 405, "method_not_allowed")


def test_service_errors_and_crashes_use_the_error_format(db: Database, settings: Settings) -> None:
    app = create_app(settings, db)

    @app.get("/boom/conflict")
    def _conflict() -> None:
        raise Conflict("already there", {"name": "x"})

    @app.get("/boom/crash")
    def _crash() -> None:
        raise RuntimeError("secret internals")

    with api_client(app, raise_server_exceptions=False) as c:
        err = assert_error(c.get("/boom/conflict"), 409, "conflict")
        assert err["details"] == {"name": "x"}
        err = assert_error(c.get("/boom/crash"), 500, "internal")
        assert "secret" not in err["message"]


def test_request_validation_is_422_and_bad_json_is_400(db: Database, settings: Settings) -> None:
    from pydantic import BaseModel

    app = create_app(settings, db)

    class Body(BaseModel):
        n: int

    @app.post("/echo")
    def _echo(body: Body) -> Body:
        return body

    with api_client(app) as c:
        err = assert_error(c.post("/echo", json={"n": "x"}), 422, "validation_error")
        assert err["details"][0]["loc"] == ["body", "n"]
        assert_error(
            c.post("/echo", content=b"{not json", headers={"content-type": "application/json"}),
            400,
            "malformed_json",
        )
