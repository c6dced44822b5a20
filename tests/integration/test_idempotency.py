"""Idempotency-Key on the creates: a retry creates nothing and gets the first answer."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.api import idempotency as idempotency_api
from service.db import Database
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import ORDERS, create
from tests.kit.e2e import wait_for
from tests.kit.kafka import MockKafka

JOB = {"name": "mv", "upstream": {"table": "orders"}, "backfill": "arrangement"}


def key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def count(db: Database, sql: str, **params: Any) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def relations(db: Database) -> int:
    return count(db, "SELECT count(*) FROM relations")


def test_a_retried_create_replays_the_first_answer_and_creates_nothing(
    client: TestClient, db: Database
) -> None:
    k = key()
    first = client.post("/v1/tables", json=ORDERS, headers=k)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    # the same document serialized otherwise (key order, spaces) is the same request
    reordered = json.dumps(dict(reversed(ORDERS.items())), indent=2).encode()
    for again in (
        client.post("/v1/tables", json=ORDERS, headers=k),
        client.post(
            "/v1/tables", content=reordered, headers=k | {"content-type": "application/json"}
        ),
    ):
        assert again.status_code == 201
        assert again.content == first.content  # byte for byte
        assert again.headers["Idempotent-Replayed"] == "true"
    assert relations(db) == 1
    assert count(db, "SELECT count(*) FROM idempotency_keys") == 1
    # without a key, a second create is the usual conflict
    assert_error(client.post("/v1/tables", json=ORDERS), 409, "conflict")


def test_jobs_are_idempotent_too(client: TestClient, db: Database) -> None:
    create(client)
    k = key()
    first = client.post("/v1/jobs", json=JOB, headers=k)
    assert first.status_code == 202, first.text
    again = client.post("/v1/jobs", json=JOB, headers=k)
    assert (again.status_code, again.content) == (202, first.content)
    assert count(db, "SELECT count(*) FROM jobs") == 1
    assert count(db, "SELECT resource->>'job' FROM idempotency_keys") == first.json()["id"]


@pytest.mark.kafka
def test_sources_are_idempotent_too(client: TestClient, db: Database, kafka: MockKafka) -> None:
    kafka.produce("clicks", [(0, {"user_id": 1})])
    spec = {
        "name": "clicks",
        "kafka": {"bootstrap_servers": kafka.bootstrap, "topic": "clicks"},
        "columns": [{"name": "user_id", "type": "bigint"}],
    }
    k = key()
    first = client.post("/v1/sources", json=spec, headers=k)
    assert first.status_code == 201, first.text
    again = client.post("/v1/sources", json=spec, headers=k)
    assert (again.status_code, again.content) == (201, first.content)
    assert count(db, "SELECT count(*) FROM sources") == 1


def test_the_same_key_with_another_request_is_refused(client: TestClient, db: Database) -> None:
    k = key()
    assert client.post("/v1/tables", json=ORDERS, headers=k).status_code == 201
    other = ORDERS | {"name": "orders2"}
    assert_error(client.post("/v1/tables", json=other, headers=k), 422, "idempotency_key_reused")
    # another path is another request as well
    job = JOB | {"name": "mv_x"}
    assert_error(client.post("/v1/jobs", json=job, headers=k), 422, "idempotency_key_reused")
    assert relations(db) == 1


def test_errors_are_not_remembered(client: TestClient, db: Database) -> None:
    create(client)
    k = key()
    missing = JOB | {"upstream": {"table": "nope"}}
    assert_error(client.post("/v1/jobs", json=missing, headers=k), 404, "not_found")
    assert_error(client.post("/v1/jobs", json=JOB | {"name": "Bad"}, headers=k), 422, "invalid")
    # fixed, and retried with the same key
    assert client.post("/v1/jobs", json=JOB, headers=k).status_code == 202
    assert count(db, "SELECT count(*) FROM idempotency_keys") == 1


@pytest.mark.parametrize("bad", ["", "has space", "x" * 201, "tab\there"])
def test_bad_keys_are_422(client: TestClient, db: Database, bad: str) -> None:
    err = assert_error(
        client.post("/v1/tables", json=ORDERS, headers={"Idempotency-Key": bad}),
        422,
        "validation_error",
    )
    assert err["details"][0]["loc"] == ["header", "Idempotency-Key"]
    assert relations(db) == 0


def test_a_200_character_key_is_fine(client: TestClient) -> None:
    k = {"Idempotency-Key": "~" * 200}
    assert client.post("/v1/tables", json=ORDERS, headers=k).status_code == 201
    assert client.post("/v1/tables", json=ORDERS, headers=k).status_code == 201


def test_keys_expire_and_are_cleaned_up_lazily(client: TestClient, db: Database) -> None:
    old, k = key(), key()
    assert client.post("/v1/tables", json=ORDERS | {"name": "a"}, headers=old).status_code == 201
    assert client.post("/v1/tables", json=ORDERS | {"name": "b"}, headers=k).status_code == 201
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE idempotency_keys SET expires_at = now() - interval '1 s'"))
    # an expired key is forgotten: the request runs again (and the name is taken now)
    assert_error(client.post("/v1/tables", json=ORDERS | {"name": "b"}, headers=k), 409, "conflict")
    # and may be reused for another request; the other expired key was swept meanwhile
    assert client.post("/v1/tables", json=ORDERS | {"name": "c"}, headers=k).status_code == 201
    assert count(db, "SELECT count(*) FROM idempotency_keys") == 1


def test_a_retry_while_the_first_request_runs_gets_the_first_answer(
    manual: tuple[TestClient, Any], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request claimed the key and waits (here: on a lock we hold); the retry
    waits on the key, then gets the first answer, never a second create. (A first request
    that committed but does not answer within IN_PROGRESS_WAIT_S makes the retry a 409:
    ``test_an_answer_lost_in_a_crash_is_given_from_what_the_key_created``.)"""
    monkeypatch.setattr(idempotency_api, "IN_PROGRESS_WAIT_S", 120.0)  # not a race with time
    client = manual[0]  # no barrier loop: nothing else waits on locks
    k = key()
    answers: dict[str, Any] = {}
    with db.engine.connect() as blocker:
        blocker.execute(text("LOCK TABLE relations IN SHARE ROW EXCLUSIVE MODE"))
        first = threading.Thread(
            target=lambda: answers.update(first=client.post("/v1/tables", json=ORDERS, headers=k))
        )
        first.start()
        wait_for(lambda: _waiting(db) == 1, 30, "the first request waiting on the lock")
        second = threading.Thread(
            target=lambda: answers.update(second=client.post("/v1/tables", json=ORDERS, headers=k))
        )
        second.start()
        wait_for(lambda: _waiting(db) == 2, 30, "the retry waiting on the key")
        blocker.rollback()
    first.join(60)
    second.join(60)
    assert answers["first"].status_code == 201
    retry = answers["second"]
    assert (retry.status_code, retry.content) == (201, answers["first"].content)
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert relations(db) == 1
    later = client.post("/v1/tables", json=ORDERS, headers=k)
    assert (later.status_code, later.content) == (201, answers["first"].content)


def _waiting(db: Database) -> int:
    return count(
        db,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()",
    )


def test_many_concurrent_retries_create_once(client: TestClient, db: Database) -> None:
    k = key()
    start = threading.Barrier(8)
    answers: list[Any] = []

    def post() -> None:
        start.wait()
        answers.append(client.post("/v1/tables", json=ORDERS, headers=k))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ok = [a for a in answers if a.status_code == 201]
    assert len(answers) == 8 and ok
    assert len({a.content for a in ok}) == 1
    for a in answers:
        if a.status_code != 201:
            assert_error(a, 409, "idempotency_key_in_progress")
    assert relations(db) == 1


def test_an_answer_lost_in_a_crash_is_given_from_what_the_key_created(
    client: TestClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key commits with the create; if the process died before recording its
    answer, a retry is 409 while the first could still answer, then the current view."""
    monkeypatch.setattr(idempotency_api, "IN_PROGRESS_WAIT_S", 0.1)
    k = key()
    first = client.post("/v1/tables", json=ORDERS, headers=k)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE idempotency_keys SET status_code = NULL, response = NULL"))
    assert_error(
        client.post("/v1/tables", json=ORDERS, headers=k), 409, "idempotency_key_in_progress"
    )
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE idempotency_keys SET respond_by = now() - interval '1 s'"))
    again = client.post("/v1/tables", json=ORDERS, headers=k)
    assert again.status_code == 201 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert count(db, "SELECT count(*) FROM idempotency_keys WHERE status_code = 201") == 1
    assert relations(db) == 1
