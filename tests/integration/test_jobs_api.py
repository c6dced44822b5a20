"""Every 4xx of the jobs API, and that a rejected create leaves nothing behind."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.db import Database
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import ORDERS, create
from tests.kit.e2e import wait_for
from tests.kit.meta import scalar

GOOD = {
    "name": "mv",
    "upstream": {"table": "orders"},
    "columns": ["id", "amount"],
    "backfill": "arrangement",
}


def _counts(db: Database) -> tuple[int, int, int]:
    with db.engine.connect() as conn:
        return (
            conn.execute(text("SELECT count(*) FROM jobs")).scalar_one(),
            conn.execute(text("SELECT count(*) FROM relations WHERE kind = 'mv'")).scalar_one(),
            conn.execute(text("SELECT count(*) FROM actors")).scalar_one(),
        )


@pytest.mark.parametrize(
    ("patch", "status", "field"),
    [
        ({"backfill": "source"}, 422, "backfill"),
        ({"backfill": "magic"}, 422, None),
        ({"columns": ["amount"]}, 422, "columns"),
        ({"columns": ["id", "nope"]}, 422, "columns[1]"),
        ({"columns": ["id", "id"]}, 422, "columns[1]"),
        ({"filter": {"col": "nope", "op": "=", "value": 1}}, 422, "filter.col"),
        ({"filter": {"col": "amount", "op": "~", "value": 1}}, 422, "filter.op"),
        ({"filter": {"col": "amount", "op": ">", "value": "x"}}, 422, "filter.value"),
        ({"filter": {"and": []}}, 422, "filter"),
        ({"filter": {"col": "amount", "op": "in", "value": []}}, 422, "filter.value"),
        ({"name": "Bad Name"}, 422, "name"),
        ({"parallelism": 0}, 422, None),
        ({"rate_limit": -1}, 422, None),
        ({"upstream": {"table": "missing"}}, 404, None),
        ({"name": "orders"}, 409, None),
    ],
)
def test_bad_creates(
    client: TestClient, db: Database, patch: dict[str, Any], status: int, field: str | None
) -> None:
    create(client, ORDERS)
    r = client.post("/v1/jobs", json=GOOD | patch)
    assert r.status_code == status, r.text
    if field is not None:
        assert r.json()["error"]["details"]["field"] == field
    assert _counts(db) == (0, 0, 0)


def test_create_read_list_drop(client: TestClient, db: Database) -> None:
    create(client, ORDERS)
    r = client.post(
        "/v1/jobs",
        json=GOOD | {"parallelism": 3, "filter": {"col": "amount", "op": ">=", "value": "1"}},
    )
    assert r.status_code == 202, r.text
    job = r.json()
    assert (
        job["state"] == "creating"
        and job["mv_table"] == "mv"
        and job["upstream"] == {"table": "orders"}
    )
    assert _counts(db) == (1, 1, 3)
    assert client.get(f"/v1/jobs/{job['id']}").json()["name"] == "mv"
    assert [
        j["id"] for j in client.get("/v1/jobs", params={"state": "creating"}).json()["jobs"]
    ] == [job["id"]]
    assert client.get("/v1/jobs", params={"state": "created"}).json()["jobs"] == []
    assert client.get("/v1/tables/mv").json()["kind"] == "mv"
    assert_error(client.post("/v1/jobs", json=GOOD), 409, "conflict")
    assert_error(client.delete("/v1/tables/orders"), 409, "conflict")
    assert_error(client.delete("/v1/tables/mv"), 409, "conflict")
    assert_error(
        client.post("/v1/tables/mv/dml", json={"ops": [{"op": "delete", "row": {"id": 1}}]}),
        409,
        "conflict",
    )
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 204
    assert _counts(db) == (0, 0, 0)
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('store.mv')")).scalar() is None
    assert client.delete("/v1/tables/orders").status_code == 204


def test_unknown_jobs_and_bad_parameters(client: TestClient) -> None:
    assert_error(client.get("/v1/jobs/999"), 404, "not_found")
    assert_error(client.get("/v1/jobs/999/progress"), 404, "not_found")
    assert_error(client.get("/v1/jobs/999/verify"), 404, "not_found")
    assert_error(client.post("/v1/jobs/999/pause"), 404, "not_found")
    assert_error(client.post("/v1/jobs/999/resume"), 404, "not_found")
    assert_error(client.patch("/v1/jobs/999", json={"rate_limit": 5}), 404, "not_found")
    assert_error(client.delete("/v1/jobs/999"), 404, "not_found")
    assert_error(client.get("/v1/jobs", params={"state": "weird"}), 422, "validation_error")
    assert_error(client.get("/v1/jobs/abc"), 422, "validation_error")


def test_bad_patches_and_verify_epochs(client: TestClient) -> None:
    create(client, ORDERS)
    job = client.post("/v1/jobs", json=GOOD).json()["id"]
    assert_error(client.patch(f"/v1/jobs/{job}", json={"parallelism": 0}), 422, "validation_error")
    assert_error(client.patch(f"/v1/jobs/{job}", json={"rate_limit": -5}), 422, "validation_error")
    assert_error(client.patch(f"/v1/jobs/{job}", json={"colour": "red"}), 422, "validation_error")
    # an hour past the committed epoch, once there is one (before the first commit it
    # reads 0, and an hour past 0 lies long before the epoch of any commit)
    wait_for(
        lambda: int(client.get(f"/v1/jobs/{job}").json()["committed_epoch"]) > 0,
        what="a committed epoch",
    )
    committed = int(client.get(f"/v1/jobs/{job}").json()["committed_epoch"])
    far = committed + (3_600_000 << 16)
    assert_error(client.get(f"/v1/jobs/{job}/verify", params={"epoch": far}), 409, "conflict")
    assert_error(client.get(f"/v1/jobs/{job}/verify", params={"epoch": 0}), 422, "validation_error")


@pytest.mark.parametrize("call", ["pause", "rate", "drop"])
def test_api_calls_and_the_barrier_commit_never_deadlock(
    client: TestClient, db: Database, call: str
) -> None:
    """The commit holds the graph and then touches a job (finishing it); an API call on
    that job meanwhile must queue behind the graph, not take the job first."""
    create(client, ORDERS)
    job_id = client.post("/v1/jobs", json=GOOD).json()["id"]
    graph_id = scalar(db, "SELECT graph_id FROM jobs WHERE id = :j", j=job_id)
    with db.engine.connect() as commit:
        commit.execute(text("SELECT 1 FROM graphs WHERE id = :g FOR UPDATE"), {"g": graph_id})
        results: list[int] = []
        requests = {
            "pause": lambda: client.post(f"/v1/jobs/{job_id}/pause"),
            "rate": lambda: client.patch(f"/v1/jobs/{job_id}", json={"rate_limit": 5}),
            "drop": lambda: client.delete(f"/v1/jobs/{job_id}"),
        }
        thread = threading.Thread(target=lambda: results.append(requests[call]().status_code))
        thread.start()
        # the API call waits on a lock (the barrier loop's own wait is the FOR UPDATE one)
        wait_for(
            lambda: scalar(
                db,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND query NOT LIKE '%FOR UPDATE%'",
            ),
            timeout=30,
            what="the API call waiting on a lock",
        )
        # the commit goes on to the job row, as finishing it does
        commit.execute(text("UPDATE jobs SET updated_at = now() WHERE id = :j"), {"j": job_id})
        commit.commit()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert results == [204 if call == "drop" else 200]


def test_a_page_of_jobs_costs_the_same_queries_whatever_its_size(
    db: Database, fresh_db_url: str
) -> None:
    """The list reads each job's names, graph and workers for the whole page at once,
    not once per job (``jobs.facts_of``). No barrier loop runs: every statement counted
    is the request's."""
    from tests.kit.meta import make_job, manual_api, statements

    with manual_api(db, fresh_db_url) as (client, _):

        def listed(n: int) -> int:
            with statements(db) as seen:
                page = client.get("/v1/jobs", params={"limit": 100}).json()["jobs"]
            assert len(page) == n and all(j["mv_table"] for j in page)
            return len(seen["engine"])

        make_job(db, "first", parallelism=1)
        listed(1)  # the first request also reads what the app caches (tokens, settings)
        one = listed(1)
        for i in range(6):
            make_job(db, f"more_{i}", parallelism=1)
        assert listed(7) == one


def test_the_progress_of_a_job_is_one_statement(db: Database, fresh_db_url: str) -> None:
    """Dashboards poll the progress route: a job that is no CDC table's is read in one
    statement (the CDC section's read is for CDC jobs only; it doubled p50 under polling,
    bench/HISTORY.md)."""
    from tests.kit.meta import make_job, manual_api, statements

    with manual_api(db, fresh_db_url) as (client, _):
        job = make_job(db, "polled", parallelism=2)
        client.get(f"/v1/jobs/{job}/progress")  # the first request reads what the app caches
        with statements(db) as seen:
            r = client.get(f"/v1/jobs/{job}/progress")
        # transactions, and single reads (first_alone)
        sent = seen["engine"] + seen["readers"]
        assert r.status_code == 200 and r.json()["cdc"] is None, r.text
        assert len(sent) == 1, sent
