"""A source's ``on_error`` end to end: messages that are not rows, in the backlog and
while the job follows the topic. ``skip`` leaves them out (the view is exact without
them) and counts them per partition in progress, a metric and events; ``fail`` fails the
job reading them, naming the partition and the offset, and only that job.

A live control plane and worker over librdkafka's mock cluster; the worker reads in its
driver (the Spark tasks' side of the policy: ``tests/integration/test_source_policy.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.db import Database
from spark_workers.settings import WorkerSettings
from tests.kit.e2e import assert_exact, running_cluster, wait_created, wait_for
from tests.kit.kafka import MOCK_PARTITIONS, MockKafka

pytestmark = pytest.mark.kafka

TOPIC = "orders_feed"
COLUMNS = [{"name": "id", "type": "bigint"}, {"name": "note", "type": "text"}]


def docs(start: int, n: int) -> list[tuple[int, Any]]:
    return [(i % MOCK_PARTITIONS, {"id": i, "note": f"n{i}"}) for i in range(start, start + n)]


@pytest.fixture
def cluster(db: Database, fresh_db_url: str, kafka: MockKafka) -> Iterator[httpx.Client]:
    with running_cluster(
        db, fresh_db_url, WorkerSettings(spark_mode="never"), "on-error", **FAST_FAILURES
    ) as (http, _):
        yield http


FAST_FAILURES = {"failure_backoff_initial_ms": 10, "failure_backoff_max_ms": 10}


def create_source(http: httpx.Client, kafka: MockKafka, name: str, **extra: Any) -> None:
    body = {
        "name": name,
        "kafka": {"bootstrap_servers": kafka.bootstrap, "topic": TOPIC},
        "columns": COLUMNS,
    } | extra
    r = http.post("/v1/sources", json=body)
    assert r.status_code == 201, r.text


def create_job(http: httpx.Client, name: str, source: str) -> int:
    body = {"name": name, "upstream": {"source": source}, "parallelism": 2}
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def skipped_by_partition(http: httpx.Client, job: int) -> dict[str, tuple[int, int | None]]:
    splits = http.get(f"/v1/jobs/{job}/progress").json()["splits"]
    return {s["split"]: (s["skipped"], s["last_skipped_offset"]) for s in splits if s["skipped"]}


def test_skip_counts_invalid_messages_and_fail_fails_the_job_naming_them(
    cluster: httpx.Client, kafka: MockKafka, caplog: pytest.LogCaptureFixture
) -> None:
    http = cluster
    # the backlog: 40 rows, then in partition 1 a message that is not JSON (offset 10)
    kafka.load(TOPIC, [*docs(0, 40), (1, b"not json")])
    create_source(http, kafka, "feed")  # on_error: skip, the default
    assert http.get("/v1/sources/feed").json()["on_error"] == "skip"
    job = create_job(http, "feed_view", "feed")
    wait_created(http, job)
    # while it runs: a field of the wrong type in partition 2 (offset 12), then more rows
    kafka.produce(TOPIC, [*docs(40, 8), (2, {"id": "not a number"}), *docs(48, 4)])

    def caught_up() -> bool:
        v = http.get(f"/v1/jobs/{job}/verify").json()
        assert v["equal"], v
        return bool(v["expected_rows"] == 52)  # every row, without the two invalid ones

    wait_for(caught_up, 60, "the view caught up with the topic")
    assert_exact(http, job)
    wait_for(lambda: len(skipped_by_partition(http, job)) == 2, 30, "both skips committed")
    assert skipped_by_partition(http, job) == {"1": (1, 10), "2": (1, 12)}
    rows = http.get("/v1/tables/feed_view/rows", params={"limit": 1000}).json()["rows"]
    assert len(rows) == 52 and all(r["id"] is not None for r in rows)
    events = http.get(f"/v1/jobs/{job}/events", params={"follow": "false"}).text
    assert events.count("event: messages_skipped") == 2
    assert '"last_offset": 10' in events and '"last_offset": 12' in events
    metrics = http.get("/metrics").text
    assert f'backfill_job_messages_skipped_total{{job_id="{job}",' in metrics

    # a second source of the topic that fails on them: its job fails at the first one
    # it reads, naming it; the job of the first source goes on
    create_source(http, kafka, "strict_feed", on_error="fail")
    strict = create_job(http, "strict_view", "strict_feed")

    def failed() -> dict[str, Any] | None:
        body: dict[str, Any] = http.get(f"/v1/jobs/{strict}").json()
        return body if body["state"] == "failed" else None

    body = wait_for(failed, 60, "the strict job failed")
    assert "partition 1 offset 10" in body["error"] or "partition 2 offset 12" in body["error"]
    assert "poison message" in body["error"]
    events = http.get(f"/v1/jobs/{strict}/events", params={"follow": "false"}).text
    assert "event: job_failed" in events
    # the worker's line about it names the actor (and, like all its lines, the worker)
    strict_actors = {
        a["id"]
        for w in http.get("/v1/workers", params={"include_gone": "true"}).json()["workers"]
        for a in w["actors"]
        if a["job_id"] == strict
    } or None
    lines = [r for r in caplog.records if r.getMessage().startswith("failure of actor")]
    assert lines and all(getattr(r, "worker_id", None) is not None for r in lines)
    assert all(getattr(r, "actor_id", None) is not None for r in lines)
    if strict_actors is not None:  # still placed: the line names one of them
        assert any(r.actor_id in strict_actors for r in lines)
    kafka.produce(TOPIC, docs(52, 4))
    wait_for(lambda: http.get(f"/v1/jobs/{job}/verify").json()["expected_rows"] == 56, 60)
    assert_exact(http, job)
    assert http.get(f"/v1/jobs/{strict}").json()["state"] == "failed"
