"""The worker's HTTP client against a real server: retries never double-apply a collect."""

from __future__ import annotations

import random
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import text

from backfill_core.protocol import CollectRequest, ErrorCode
from service.db import Database
from service.meta.loop import MetaLoop
from service.settings import Settings
from spark_workers.client import ControlPlaneClient, ProtocolError, RetryPolicy, WorkerGone
from tests.kit.auth import TOKENS
from tests.kit.live import live_server
from tests.kit.meta import committed_epoch, make_job


class LosesFirstResponse(httpx.HTTPTransport):
    """Delivers the request, then pretends the response was lost (once per path)."""

    def __init__(self, path_part: str) -> None:
        super().__init__()
        self.path_part = path_part
        self.dropped = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self.path_part in request.url.path and not self.dropped:
            response.read()
            self.dropped += 1
            raise httpx.ReadTimeout("response lost", request=request)
        return response


class Unavailable(httpx.HTTPTransport):
    def __init__(self, times: int) -> None:
        super().__init__()
        self.left = times

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.left:
            self.left -= 1
            return httpx.Response(
                503, json={"error": {"code": "unavailable", "message": "", "details": None}}
            )
        return super().handle_request(request)


FAST = RetryPolicy(attempts=5, base_delay_s=0.001, max_delay_s=0.01)


def test_a_retried_collect_is_applied_once(db: Database, fresh_db_url: str) -> None:
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    loop = MetaLoop(settings, db)
    with live_server(settings, db) as url:
        lossy = LosesFirstResponse("/collect")
        client = ControlPlaneClient(
            url, token=TOKENS["worker"], retry=FAST, rng=random.Random(1), transport=lossy
        )
        client.register("w", 4)
        make_job(db, "j", parallelism=1)
        loop.tick()
        [a] = client.poll(timeout_ms=0).assignments
        [b] = a.barriers
        result = client.collect(a.actor_id, b.prev, b.curr, recovery_seq=a.recovery_seq, rows=5)
        assert lossy.dropped == 1
        assert result.status == "duplicate"  # the first attempt was applied
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM barrier_collects")).scalar() == 1
        assert committed_epoch(db) == b.prev
        client.close()


def test_503_is_retried_and_a_dead_worker_is_told_to_register_again(
    db: Database, fresh_db_url: str
) -> None:
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    with live_server(settings, db) as url:
        client = ControlPlaneClient(
            url, token=TOKENS["worker"], retry=FAST, transport=Unavailable(times=2)
        )
        client.register("w", 4)
        client.heartbeat()
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE workers SET state = 'dead'"))
        try:
            client.heartbeat()
            raise AssertionError("expected WorkerGone")
        except WorkerGone as e:
            assert e.status == 410
        client.close()


def test_long_poll_returns_when_a_barrier_arrives(db: Database, fresh_db_url: str) -> None:
    settings = Settings(database_url=fresh_db_url, barrier_interval_ms=50)
    with live_server(settings, db) as url:
        client = ControlPlaneClient(url, token=TOKENS["worker"], retry=FAST)
        client.register("w", 4)
        make_job(db, "j", parallelism=2)
        seen = 0
        for _ in range(20):
            for a in client.poll(timeout_ms=5000).assignments:
                for b in a.barriers:
                    client.collect(a.actor_id, b.prev, b.curr, recovery_seq=a.recovery_seq)
                    seen += 1
            if seen >= 10:
                break
        assert seen >= 10
        client.close()


def test_each_error_code_reaches_the_worker_as_its_typed_error(
    db: Database, fresh_db_url: str
) -> None:
    """The worker branches on the code its client decoded, never on the message: every
    code of the protocol comes back as a ``ProtocolError`` carrying it (and the actor it
    is about), a dead worker's as ``WorkerGone``."""
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False)
    loop = MetaLoop(settings, db)
    with live_server(settings, db) as url:
        client = ControlPlaneClient(url, token=TOKENS["worker"], retry=FAST)
        client.register("w", 4)
        make_job(db, "j", parallelism=1)
        loop.tick()
        [a] = client.poll(timeout_ms=0).assignments
        [b] = a.barriers
        actor, seq = a.actor_id, a.recovery_seq
        assert a.job.name == "j" and a.restore is not None  # decoded once, typed

        def refused(call: Callable[[], object]) -> ProtocolError:
            with pytest.raises(ProtocolError) as e:
                call()
            return e.value

        def as_worker(worker_id: int) -> ControlPlaneClient:
            other = ControlPlaneClient(url, token=TOKENS["worker"], retry=FAST)
            other.worker_id = worker_id
            return other

        def stale_collect() -> object:
            return client.collect(actor, b.prev, b.curr, recovery_seq=seq + 1)

        def stale_barrier() -> object:
            return client.collect(actor, b.prev, b.curr + 1, recovery_seq=seq)

        def not_assigned() -> object:
            return client.collect(actor + 1000, b.prev, b.curr, recovery_seq=seq)

        def unknown_worker() -> object:
            return as_worker(424242).heartbeat()

        def gone() -> object:
            dead = ControlPlaneClient(url, token=TOKENS["worker"], retry=FAST)
            dead.register("w2", 1)
            with db.engine.begin() as conn:
                declare = text("UPDATE workers SET state = 'dead' WHERE id = :w")
                conn.execute(declare, {"w": dead.worker_id})
            return dead.poll(timeout_ms=0)

        provoked = {
            ErrorCode.STALE_COLLECT: (stale_collect, actor),
            ErrorCode.STALE_BARRIER: (stale_barrier, actor),
            ErrorCode.ACTOR_NOT_ASSIGNED: (not_assigned, actor + 1000),
            ErrorCode.UNKNOWN_WORKER: (unknown_worker, None),
            ErrorCode.WORKER_GONE: (gone, None),
        }
        assert set(provoked) == set(ErrorCode), "every code is provoked here"
        for code, (call, about) in provoked.items():
            error = refused(call)
            assert error.code is code, (code, error)
            assert error.actor_id == about, (code, error)
            assert isinstance(error, WorkerGone) == (code is ErrorCode.WORKER_GONE), code
        # a refusal outside the protocol's codes (a malformed body) decodes to no code
        malformed = CollectRequest(-1, seq, b.prev, b.curr)  # no actor id is negative
        error = refused(lambda: client.collect_many([malformed]))
        assert error.status == 422 and error.code is None
        client.close()
