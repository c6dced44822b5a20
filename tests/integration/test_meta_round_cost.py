"""What the barrier loop's rounds cost Postgres: at 100 ms barriers they run ten times a
second for as long as the service runs, beside every backfill (bench/HISTORY.md,
2026-11-28 19:30). Round trips are counted on every engine (``tests.kit.meta.statements``)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg2
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import DBAPIError

from service.db import Database
from service.meta.loop import MAIN, MetaLoop
from tests.integration.test_meta_creating import TABLE
from tests.kit.e2e import wait_for
from tests.kit.meta import (
    FakeWorker,
    barriers_of,
    committed_epoch,
    make_job,
    manual_api,
    statements,
)


def test_an_idle_main_round_without_creating_graphs_asks_nothing_about_them(
    db: Database, fresh_db_url: str
) -> None:
    """Without a creating graph, the main graph's round looks for no merge, no lag cap
    and no merge hold (a creating graph made since the round listed the graphs has no
    barrier yet: only the loop injects), and lists the graphs outside a transaction."""
    with manual_api(db, fresh_db_url) as (client, loop):
        assert client.post("/v1/tables", json=TABLE).status_code == 201
        loop.tick()
        with statements(db) as seen:
            loop.tick(MAIN)
        sent = seen["loop"] + seen["readers"] + seen["engine"]
        about_creating = [s for s in sent if "graphs.kind = " in s or "lag_ms" in s]
        assert about_creating == [] and not any("min(g.current_epoch)" in s for s in sent)
        assert [s for s in seen["readers"] if "EXECUTE loop_graphs_" in s], "listed alone"
        assert not [s for s in seen["loop"] if "loop_graphs_" in s]
        # one transaction for the main graph's round, its barrier committed in it: the
        # graph locked, the barrier injected, the commit (three round trips; twelve
        # through the ORM before), each running statements the loop's connection
        # prepared in an earlier round (Postgres neither parses nor plans them again)
        assert any("EXECUTE barrier_inject_" in s for s in seen["loop"])
        assert len(seen["loop"]) == 3, seen["loop"]
        for sent_once in seen["loop"]:
            assert all(q.strip().startswith("EXECUTE ") for q in sent_once.split(";")), sent_once
        assert {b.state for b in barriers_of(db)} == {"committed"}


def test_a_regular_creating_round_after_a_main_round_that_listed_none_sends_nothing(
    db: Database, fresh_db_url: str
) -> None:
    """A regular creating round half an interval after a main round that listed no
    creating graph sends nothing; a creating graph made since (as by another replica,
    whose ask does not reach this loop) is listed by the next main round and gets its
    first barrier in the creating round after it."""
    from service.meta.loop import CREATING
    from tests.integration.test_meta_creating import graph_of_job, snapshot_job

    with manual_api(db, fresh_db_url) as (client, loop):
        FakeWorker(client).register()
        job = snapshot_job(client, loop, parallelism=1)  # its graph made after the lists
        loop.tick(MAIN, regular=True)
        g = graph_of_job(db, job["id"])
        assert g is not None and barriers_of(db, g.id) == []
        loop.tick(CREATING, regular=True)
        assert len(barriers_of(db, g.id)) == 1  # listed by the main round: ticked
        client.delete(f"/v1/jobs/{job['id']}")
        loop.tick()
        loop.tick()
        assert graph_of_job(db, job["id"]) is None
        loop.tick(MAIN, regular=True)  # lists no creating graph
        with statements(db) as seen:
            loop.tick(CREATING, regular=True)
        assert seen == {"engine": [], "loop": [], "readers": []}, seen


def looks(sent: list[str]) -> list[str]:
    """A long poll's looks for a barrier ready for its worker (``_ANY_READY``)."""
    return [x for x in sent if x.startswith("EXECUTE poll_any_ready_")]


def test_a_waiting_long_poll_looks_in_one_statement_outside_a_transaction(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """A long poll looks for its barriers at every wake and every ``RECHECK_S``, as long
    as it waits: one statement each, no transaction (no BEGIN, COMMIT or pre-ping);
    the assignments are read in one once a barrier is there."""
    client, loop = manual
    w = FakeWorker(client).register()
    make_job(db, "j", parallelism=1)
    answers: list[list[dict[str, Any]]] = []
    with statements(db) as seen:
        poller = threading.Thread(
            target=lambda: answers.append(w.poll(timeout_ms=20_000)), daemon=True
        )
        poller.start()
        wait_for(lambda: len(looks(seen["readers"])) >= 3, timeout=30, what="three looks")
        waiting = list(seen["engine"])
        loop.tick()  # the barrier that adds the job's actor
        client.app.state.ctx.signal.notify()  # type: ignore[attr-defined]
        poller.join(timeout=30)
    assert looks(waiting) == [], "a look in a transaction"
    assert answers and [len(a["barriers"]) for a in answers[0]] == [1]


def test_the_loop_connects_anew_after_its_connection_died(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """The loop's connections have no pre-ping: a round on a dead one fails (``run``
    recovers as after any failed round) and the round after it connects anew."""
    _client, loop = manual
    loop.tick()
    with db.loop_engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    admin = psycopg2.connect(db.libpq_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
        before = committed_epoch(db)
        with pytest.raises(DBAPIError):
            loop.tick(MAIN)
        loop.tick(MAIN)
        assert committed_epoch(db) > before
    finally:
        admin.close()
