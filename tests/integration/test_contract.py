"""The committed ``openapi.yaml`` against the service, with schemathesis and every check.

The app runs on a real uvicorn server over a real Postgres (and a Kafka-protocol broker
for sources), seeded with a table with rows, a job and a source, with auth on. For every
operation schemathesis sends the schema's examples (the create examples succeed:
`orders`, then `big_orders` on it, then `orders_events`), its coverage cases
(boundaries, missing and wrong-typed values, other methods) and generated ones, valid
and not; then the stateful phase chains operations through the document's links. Every
check is on (``CHECKS``): no 5xx; every answer documented (status, content type, headers,
schema, the event streams' events too); 405 with an ``Allow`` of the documented methods;
requests the schema calls invalid refused and the ones it calls valid accepted (a bulk
DML body, text of any kind to the schema, may be a 400 or a 422 for its lines); auth
enforced; a deleted resource gone and a created one there.

What a request's schema cannot say, the checks are told (``STATE_DEPENDENT``): a valid
request may still name columns its table does not have (a 422 ``invalid`` of the
service's own checks), or pass a cursor no page gave (400); never a 422
``validation_error``, which would mean the document is looser than the request models
(``valid_data_passes_validation``), but for the NUL character or a lone surrogate in a
free-form value (a DML row, a filter's value), which no body may carry. The worker protocol (internal, its requests are
the workers' own) is held to every check but that one, and its long poll is left out.

Every request carries the admin token (it may do everything); the role matrix is
``test_auth.py``'s. Requests that would wait are made not to: `?wait=true` on DML,
foreground job creates, following event streams. ``make fuzz`` runs the same with many
more examples (``CONTRACT_EXAMPLES``, ``CONTRACT_SEED``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import psycopg2
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from sqlalchemy.engine import make_url

from service import migrate
from service.api.limits import UNSTORABLE_TEXT
from service.db import Database
from service.embedded_pg import to_libpq_url
from service.settings import Settings
from tests.kit.auth import auth_header, http_client
from tests.kit.e2e import wait_for
from tests.kit.kafka import MockKafka, mock_kafka
from tests.kit.live import live_server

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
EXCLUDED = {("GET", "/v1/workers/{worker_id}/barriers")}  # the long poll: it waits
# every check schemathesis has (`--checks all`)
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "positive_data_acceptance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
    "object_level_authorization",
]
# a request the schema calls valid is accepted, or refused for the state it meets: no
# such resource (404), a conflict (409), read at a collected epoch (410)
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "410", "429", "5xx"]
# ... or for what the document cannot know: the columns of the table the request names
# (a DML row's, a job's columns and filter, a key's), the parallelism its vnodes allow,
# a reachable Kafka topic; a cursor (`after`) is opaque, like an id; an export's or an
# import's path must be one Spark can use (absolute, of a scheme it has, no dot
# segments: a 400)
STATE_DEPENDENT = {
    "createTable": ["422"],
    "createJob": ["422"],
    "updateJob": ["422"],
    "createSource": ["422"],
    "applyTableDml": ["422", "400"],  # 400: a bulk body's line that is not JSON or CSV
    "readTableRows": ["400"],
    "createExport": ["400"],
    "createImport": ["400"],
}
EXAMPLES = int(os.environ.get("CONTRACT_EXAMPLES", "8"))
RANDOM_SEED = int(os.environ.get("CONTRACT_SEED", "20261127"))
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
        "seed": RANDOM_SEED,
        "generation": {"mode": "all", "max-examples": EXAMPLES},
        "checks": {
            **{name: {"enabled": True} for name in CHECKS},
            "positive_data_acceptance": {"expected-statuses": ACCEPTED},
        },
        "operations": [
            *(
                {
                    "include-operation-id": op,
                    "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED + extra}},
                }
                for op, extra in STATE_DEPENDENT.items()
            ),
            # the worker protocol's requests are the workers' (backfill_core.protocol)
            {"include-tag": "internal", "checks": {"positive_data_acceptance": {"enabled": False}}},
        ],
        "suppress-health-check": ["all"],
    }
)
# the bulk DML bodies are text, which no schema can say more of (docs/api.md#bulk-dml)
BULK_MEDIA_TYPES = ("application/x-ndjson", "text/csv")
for _media_type in BULK_MEDIA_TYPES:
    schemathesis.serializer.alias(_media_type, "text/plain")
# loaded at import, so each operation is a test of its own (the fixture-based lazy
# loader does not run on this pytest); the base URL comes with each call
schema = schemathesis.openapi.from_path(ROOT / "openapi.yaml", config=CONFIG)
for _method, _path in EXCLUDED:
    schema = schema.exclude(method=_method, path=_path)


def valid_data_passes_validation(ctx: Any, response: Any, case: Any) -> bool | None:
    """A request the schema calls valid is never refused by the request models: a
    `validation_error` (or `malformed_json`) means the document is looser than them."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code < 400:
        return None
    if case.operation.tags and "internal" in case.operation.tags:
        return None
    if case.media_type in BULK_MEDIA_TYPES:
        return None  # any text is schema-valid; its lines are checked by the service
    try:
        error = response.json()["error"]
        code = error["code"]
    except (ValueError, KeyError, TypeError):
        return None
    if code == "validation_error" and {d["type"] for d in error["details"]} == {UNSTORABLE_TEXT}:
        return None  # a NUL or a lone surrogate in a free-form value (limits.RequestBody)
    if code in ("validation_error", "malformed_json"):
        raise AssertionError(f"a schema-valid request was refused as {code}: {response.text}")
    return None


@schema.parametrize()
def test_the_service_keeps_its_contract(case: Any, base_url: str, broker: MockKafka) -> None:
    _prepare(case, broker)
    case.call_and_validate(
        base_url=base_url,
        headers=auth_header("admin"),
        additional_checks=[valid_data_passes_validation],
    )


def test_the_service_keeps_its_contract_across_calls(base_url: str, broker: MockKafka) -> None:
    """The stateful phase: operations chained by the document's links (a created table
    read, dropped, then read again), with every check."""

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: Any) -> None:
            _prepare(case, broker)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": base_url, "headers": auth_header("admin")}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            super().validate_response(
                response, case, additional_checks=[valid_data_passes_validation], **kwargs
            )

    Workflow.run(
        settings=hypothesis.settings(
            max_examples=EXAMPLES,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
    )


def _prepare(case: Any, broker: MockKafka) -> None:
    _nothing_that_waits(case)
    if case.path == "/v1/sources" and case.method == "POST" and isinstance(case.body, dict):
        kafka = case.body.get("kafka")
        if isinstance(kafka, dict) and isinstance(kafka.get("bootstrap_servers"), str):
            # the real broker: an address that does not answer costs a 5 s timeout
            kafka["bootstrap_servers"] = broker.bootstrap


def _nothing_that_waits(case: Any) -> None:
    if case.query and str(case.query.get("wait")).lower() in ("true", "1", "yes", "on"):
        case.query["wait"] = "false"  # waits for a commit (up to 30 s)
    if case.path.endswith("/events") and case.method == "GET":
        query = case.query if isinstance(case.query, dict) else {}
        if str(query.get("follow", "true")).lower() in ("true", "1", "yes", "on"):
            case.query = {**query, "follow": "false"}  # a followed stream never ends
    body = case.body if case.path == "/v1/jobs" else None
    if isinstance(body, dict) and body.get("background") is False:
        body["background"] = True  # waits for the backfill (up to 600 s)
