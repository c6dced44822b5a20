"""Job events as Server-Sent Events: what is recorded, and reconnecting with Last-Event-ID."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient

from service.api import app as app_module
from service.api import events as events_route
from service.api.event_hub import EventHub
from service.catalog import events as catalog_events
from service.db import Database
from service.settings import Settings
from tests.integration.test_health_and_errors import assert_error
from tests.integration.test_tables_api import ORDERS, create
from tests.kit.auth import http_client
from tests.kit.e2e import wait_for
from tests.kit.live import live_server


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Events of an SSE body as {id, event, data}; comments and retry lines skipped."""
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        if "id" in fields:
            out.append(
                {
                    "id": int(fields["id"]),
                    "event": fields["event"],
                    "data": json.loads(fields["data"]),
                }
            )
    return out


def _job(client: Any, name: str = "mv") -> int:
    r = client.post(
        "/v1/jobs",
        json={
            "name": name,
            "upstream": {"table": "orders"},
            "columns": ["id"],
            "backfill": "arrangement",
        },
    )
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def test_a_jobs_life_is_recorded_in_order(client: TestClient) -> None:
    create(client, ORDERS)
    job = _job(client)
    other = _job(client, "other")
    assert client.post(f"/v1/jobs/{job}/pause").status_code == 200
    assert client.post(f"/v1/jobs/{job}/resume").status_code == 200
    assert client.patch(f"/v1/jobs/{job}", json={"rate_limit": 500}).status_code == 200
    assert client.delete(f"/v1/jobs/{other}").status_code == 204

    r = client.get(f"/v1/jobs/{job}/events", params={"follow": "false"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    got = parse_sse(r.text)
    assert [e["event"] for e in got] == ["job_created", "paused", "resumed", "throttled"]
    assert all(e["data"]["job_id"] == job for e in got)
    assert got[3]["data"]["rate_limit"] == 500
    ids = [e["id"] for e in got]
    assert ids == sorted(ids)

    everything = parse_sse(client.get("/v1/events", params={"follow": "false"}).text)
    assert {"job_created", "cancelled"} <= {
        e["event"] for e in everything if e["data"]["job_id"] == other
    }


def test_reconnecting_with_last_event_id_gets_exactly_the_missed_events(
    db: Database, settings: Settings
) -> None:
    with live_server(settings, db) as url, http_client(url, timeout=30) as http:
        create(http, ORDERS)  # type: ignore[arg-type]
        job = _job(http)
        http.post(f"/v1/jobs/{job}/pause")
        http.post(f"/v1/jobs/{job}/resume")
        seen: list[dict[str, Any]] = []
        with http.stream("GET", "/v1/events") as stream:  # follows: only closing ends it
            buf = ""
            for chunk in stream.iter_text():
                buf += chunk
                seen = parse_sse(buf[: buf.rfind("\n\n") + 2])
                if len(seen) >= 2:
                    break
        last = seen[1]["id"]
        # while disconnected
        http.post(f"/v1/jobs/{job}/pause")
        http.patch(f"/v1/jobs/{job}", json={"rate_limit": 7})
        all_now = parse_sse(http.get("/v1/events", params={"follow": "false"}).text)
        missed = [e for e in all_now if e["id"] > last]
        r = http.get("/v1/events", params={"follow": "false"}, headers={"Last-Event-ID": str(last)})
        assert parse_sse(r.text) == missed
        assert [e["event"] for e in missed][-3:] == ["resumed", "paused", "throttled"]


def test_bad_event_requests(client: TestClient) -> None:
    assert_error(client.get("/v1/jobs/999/events", params={"follow": "false"}), 404, "not_found")
    r = client.get("/v1/events", params={"follow": "false"}, headers={"Last-Event-ID": "x1"})
    assert_error(r, 400, "bad_request")
    assert_error(client.get("/v1/events", params={"after": -1}), 422, "validation_error")


def test_following_streams_share_one_reader_each_gets_every_event_once_and_are_capped(
    db: Database, settings: Settings, monkeypatch: Any
) -> None:
    """Streams that follow take new events from the process's one reader (the hub), not
    from polls of their own; each gets every event once; a token past its cap of open
    streams gets 429 with Retry-After."""
    hubs: list[EventHub] = []

    class Recorded(EventHub):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            hubs.append(self)

    monkeypatch.setattr(app_module, "EventHub", Recorded)
    stream_reads = [0]

    def counted_after(*args: Any, **kwargs: Any) -> Any:
        stream_reads[0] += 1
        return catalog_events.after(*args, **kwargs)

    routes_events = SimpleNamespace(**(vars(catalog_events) | {"after": counted_after}))
    monkeypatch.setattr(events_route, "events", routes_events)
    # a stream learns that its client went from the response, not from a keep-alive
    monkeypatch.setattr(events_route, "KEEPALIVE_S", 3600.0)
    n = 12
    capped = settings.model_copy(update={"max_event_streams_per_token": n})
    with live_server(capped, db) as url, http_client(url, timeout=60) as http:
        create(http, ORDERS)  # type: ignore[arg-type]
        job = _job(http)
        start = parse_sse(http.get("/v1/events", params={"follow": "false"}).text)[-1]["id"]
        (hub,) = hubs
        received: list[list[dict[str, Any]]] = [[] for _ in range(n)]

        def follow(i: int) -> None:
            with (
                http_client(url, timeout=60) as own,
                own.stream("GET", "/v1/events", params={"after": start}) as stream,
            ):
                buf = ""
                for chunk in stream.iter_text():
                    buf += chunk
                    received[i] = parse_sse(buf[: buf.rfind("\n\n") + 2])
                    if len(received[i]) >= 6:
                        return

        threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        wait_for(lambda: hub.followers == n, what=f"{n} streams following")
        r = http.get("/v1/events")
        assert_error(r, 429, "too_many_streams")
        assert r.headers["Retry-After"] == "5"
        assert http.get("/v1/events", params={"follow": "false"}).status_code == 200
        # once the hub reads, and every stream looked at it since, no stream reads alone
        first = hub.reads
        wait_for(lambda: hub.reads >= first + 6, what="the hub polling")
        before = stream_reads[0]
        for _ in range(3):
            assert http.post(f"/v1/jobs/{job}/pause").status_code == 200
            assert http.post(f"/v1/jobs/{job}/resume").status_code == 200
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        wait_for(lambda: hub.followers == 0, what="closed streams no longer counted")
        assert stream_reads[0] == before
        kinds = [[e["event"] for e in got] for got in received]
        assert kinds == [["paused", "resumed"] * 3] * n
        ids = {tuple(e["id"] for e in got) for got in received}
        assert len(ids) == 1 and len(set(next(iter(ids)))) == 6


def test_recent_starts_with_the_latest_events(client: TestClient) -> None:
    """A dashboard's first load asks for the latest events, not every one since id 0."""
    create(client, ORDERS)
    job = _job(client)
    other = _job(client, "other")
    for _ in range(3):
        assert client.post(f"/v1/jobs/{job}/pause").status_code == 200
        assert client.post(f"/v1/jobs/{job}/resume").status_code == 200
    every = parse_sse(client.get("/v1/events", params={"follow": "false"}).text)
    recent = parse_sse(client.get("/v1/events", params={"follow": "false", "recent": 3}).text)
    assert recent == every[-3:]
    mine = parse_sse(client.get(f"/v1/jobs/{other}/events?follow=false&recent=5").text)
    assert [e["event"] for e in mine] == ["job_created"]  # fewer than asked: all of them
    # after (or Last-Event-ID) wins
    r = client.get("/v1/events", params={"follow": "false", "recent": 1, "after": every[0]["id"]})
    assert parse_sse(r.text) == every[1:]
    assert_error(client.get("/v1/events", params={"recent": 0}), 422, "validation_error")
