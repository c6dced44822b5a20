"""The committed ``openapi.yaml`` against the service, with schemathesis.

The app runs on a real uvicorn server over a real Postgres (and a Kafka-protocol broker
for sources), seeded with a table with rows, a job and a source. For every operation
schemathesis sends the schema's examples (the create examples succeed: `orders`, then
`big_orders` on it, then `orders_events`), its coverage cases (boundaries, missing and
wrong-typed values, other methods) and a few generated ones, valid and not, and checks
that no answer is a 5xx and that every answer is documented: its status, its content
type, its body's schema.

Every request carries the admin token (it may do everything); the role matrix is
``test_auth.py``'s. Left out: the event streams and the workers' long poll (they wait by design). Requests
that would wait are made not to: `?wait=true` on DML and foreground job creates.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from sqlalchemy.engine import make_url

from service import migrate
from service.db import Database
from service.embedded_pg import to_libpq_url
from service.settings import Settings
from tests.kit.auth import auth_header, http_client
from tests.kit.e2e import wait_for
from tests.kit.kafka import MockKafka, mock_kafka
from tests.kit.live import live_server

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
EXCLUDED = {
    ("GET", "/v1/events"),  # server-sent event streams
    ("GET", "/v1/jobs/{job_id}/events"),
    ("GET", "/v1/workers/{worker_id}/barriers"),  # the long poll
}
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
]
SEED = {
    "name": "seed",
    "columns": [
        {"name": "id", "type": "bigint", "nullable": False},
        {"name": "amount", "type": "numeric"},
    ],
    "primary_key": ["id"],
}


@pytest.fixture(scope="module")
def broker() -> Iterator[MockKafka]:
    with mock_kafka() as cluster:
        cluster.produce("orders", [(p, {"amount": p}) for p in range(4)])
        yield cluster


@pytest.fixture(scope="module")
def contract_db(pg_server_url: str) -> Iterator[Database]:
    """A database of its own for the whole module (one server, many requests)."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = psycopg2.connect(to_libpq_url(pg_server_url))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    db = Database(make_url(pg_server_url).set(database=name).render_as_string(hide_password=False))
    migrate.upgrade(db.engine)
    try:
        yield db
    finally:
        db.close()
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="module")
def base_url(contract_db: Database, broker: MockKafka) -> Iterator[str]:
    settings = Settings(
        database_url=contract_db.url, spawn_embedded_worker=False, barrier_interval_ms=50
    )
    with live_server(settings, contract_db) as url:
        with http_client(url, timeout=30) as http:
            assert http.post("/v1/tables", json=SEED).status_code == 201
            ops = [{"op": "insert", "row": {"id": i, "amount": str(i)}} for i in range(50)]
            r = http.post("/v1/tables/seed/dml", params={"wait": "true"}, json={"ops": ops})
            assert r.status_code == 200, r.text
            job = {"name": "seed_view", "upstream": {"table": "seed"}, "parallelism": 2}
            assert http.post("/v1/jobs", json=job).status_code == 202
            source = {
                "name": "seed_events",
                "kafka": {"bootstrap_servers": broker.bootstrap, "topic": "orders"},
                "columns": [{"name": "amount", "type": "numeric"}],
            }
            assert http.post("/v1/sources", json=source).status_code == 201
            wait_for(lambda: http.get("/readyz").status_code == 200, 30, "readiness")
        yield url


CONFIG = SchemathesisConfig.from_dict(
    {
        "request-timeout": 20,
        "generation": {"mode": "all", "max-examples": 8},
        "phases": {"stateful": {"enabled": False}},
        "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
        "suppress-health-check": ["all"],
    }
)
# loaded at import, so each operation is a test of its own (the fixture-based lazy
# loader does not run on this pytest); the base URL comes with each call
schema = schemathesis.openapi.from_path(ROOT / "openapi.yaml", config=CONFIG)
for _method, _path in EXCLUDED:
    schema = schema.exclude(method=_method, path=_path)


@schema.parametrize()
def test_the_service_keeps_its_contract(case: Any, base_url: str, broker: MockKafka) -> None:
    _nothing_that_waits(case)
    if case.path == "/v1/sources" and case.method == "POST" and isinstance(case.body, dict):
        kafka = case.body.get("kafka")
        if isinstance(kafka, dict) and isinstance(kafka.get("bootstrap_servers"), str):
            # the real broker: an address that does not answer costs a 5 s timeout
            kafka["bootstrap_servers"] = broker.bootstrap
    case.call_and_validate(base_url=base_url, headers=auth_header("admin"))


def _nothing_that_waits(case: Any) -> None:
    if case.query and str(case.query.get("wait")).lower() in ("true", "1", "yes", "on"):
        case.query["wait"] = "false"  # waits for a commit (up to 30 s)
    body = case.body if case.path == "/v1/jobs" else None
    if isinstance(body, dict) and body.get("background") is False:
        body["background"] = True  # waits for the backfill (up to 600 s)
