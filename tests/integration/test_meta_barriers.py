"""The meta with scripted fake workers: ordering, commit, idempotency, recovery.

The barrier loop is driven by hand (``tick``) so each scenario is exact.
"""

from __future__ import annotations

import datetime as dt
import threading

from fastapi.testclient import TestClient
from sqlalchemy import text, update

from backfill_core.changes import Version
from backfill_core.executors.flow import apply_flow_mutation
from backfill_core.executors.messages import Mutation
from backfill_core.protocol import CollectRequest, ErrorCode
from service.api.app import create_app
from service.catalog.models import Worker
from service.catalog.queries import get_relation, storage_of
from service.db import Database, raw_cursor
from service.errors import Conflict
from service.meta import barriers, workers
from service.meta.loop import MetaLoop
from service.settings import Settings
from tests.integration.test_health_and_errors import assert_error
from tests.kit.auth import api_client
from tests.kit.e2e import wait_for
from tests.kit.meta import FakeWorker, actors_of, barriers_of, committed_epoch, make_job


def test_barriers_commit_only_when_every_actor_collected(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    w = FakeWorker(client).register()
    job = make_job(db, "j", parallelism=3)
    loop.tick()  # the barrier that adds the 3 actors
    loop.tick()
    assignments = w.poll()
    assert sorted(a["actor_id"] for a in assignments) == [a.id for a in actors_of(db, job)]
    for a in assignments:
        epochs = [(b["prev"], b["curr"]) for b in a["barriers"]]
        assert len(epochs) == 2 and epochs[0][1] == epochs[1][0]  # in order, chained
        assert a["restore"] == {"vnodes": [], "finished": False}
    before = committed_epoch(db)
    held = assignments[0]["actor_id"]
    w.collect_all(skip_actor=held)
    assert committed_epoch(db) == before  # one missing collect holds the commit
    w.collect_all()
    first, second = barriers_of(db)[-2:]
    assert committed_epoch(db) == second.prev_epoch == first.curr_epoch
    assert {b.state for b in barriers_of(db)} == {"committed"}
    with db.engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*), min(epoch) FROM vnode_progress")).one()
    assert rows == (16, second.prev_epoch)  # progress of all 16 vnodes committed with the epoch


def test_committed_history_kept_for_a_replay_is_never_handed_out_again(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """Trimming keeps the committed barriers a snapshot backfill may still replay but
    drops their collects: a poll must not take them for barriers still to collect."""
    client, loop = manual
    w = FakeWorker(client).register()
    make_job(db, "j", parallelism=1)
    for _ in range(6):
        loop.tick()
        w.collect_all()
    history = barriers_of(db)
    assert {b.state for b in history} == {"committed"}
    with db.transaction() as s:  # as while a snapshot job's replay floor is the first
        barriers.trim_history(s, 1, keep=1, keep_after=history[0].prev_epoch)
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM barrier_collects")).scalar() == 1
    assert len(barriers_of(db)) == len(history) - 1  # kept but the first, without collects
    [a] = w.poll()
    assert a["barriers"] == []
    loop.tick()
    [a] = w.poll()
    assert [b["curr"] for b in a["barriers"]] == [barriers_of(db)[-1].curr_epoch]


def test_collects_are_idempotent_and_stale_or_unknown_ones_change_nothing(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    w = FakeWorker(client).register()
    make_job(db, "j", parallelism=1)
    loop.tick()
    loop.tick()
    [a] = w.poll()
    b0, b1 = a["barriers"]
    assert w.collect(a["actor_id"], b0).json()["status"] == "accepted"
    assert w.collect(a["actor_id"], b0).json()["status"] == "duplicate"
    assert w.collect(a["actor_id"], b1).json()["status"] == "accepted"
    assert w.collect(a["actor_id"], b1).json()["status"] == "duplicate"  # also after the commit
    committed = committed_epoch(db)
    stale = ErrorCode.STALE_BARRIER
    assert_error(w.collect(a["actor_id"], {"prev": b1["prev"], "curr": b1["curr"] + 1}), 409, stale)
    assert_error(w.collect(a["actor_id"], {"prev": b0["curr"] - 5, "curr": b1["curr"]}), 409, stale)
    assert_error(w.collect(99999, b1), 409, ErrorCode.ACTOR_NOT_ASSIGNED)
    other = FakeWorker(client, name="other").register()
    assert_error(other.collect(a["actor_id"], b1), 409, ErrorCode.ACTOR_NOT_ASSIGNED)
    assert committed_epoch(db) == committed
    assert_error(
        client.post(
            "/v1/workers/424242/collect",
            json={"actor_id": 1, "recovery_seq": 0, "prev_epoch": 0, "curr_epoch": 1},
        ),
        404,
        ErrorCode.UNKNOWN_WORKER,
    )


def test_graph_without_actors_commits_every_barrier(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    _, loop = manual
    for _ in range(3):
        loop.tick()
    bs = barriers_of(db)
    assert [b.kind for b in bs] == ["initial", "checkpoint", "checkpoint"]
    assert committed_epoch(db) == bs[-1].prev_epoch
    assert all(b.prev_epoch == a.curr_epoch for a, b in zip(bs, bs[1:], strict=False))


def test_non_checkpoint_barriers_commit_with_the_next_checkpoint(
    db: Database, fresh_db_url: str
) -> None:
    settings = Settings(database_url=fresh_db_url, run_barrier_loop=False, checkpoint_frequency=3)
    loop = MetaLoop(settings, db)
    with api_client(create_app(settings, db)) as client:
        w = FakeWorker(client).register()
        make_job(db, "j", parallelism=2)
        for _ in range(4):
            loop.tick()
        w.collect_all()
        kinds = [b.kind for b in barriers_of(db)]
        assert kinds == ["initial", "barrier", "checkpoint", "barrier"]
        assert committed_epoch(db) == barriers_of(db)[2].prev_epoch
        assert barriers_of(db)[3].state == "collected"


def test_dead_worker_triggers_recovery_rollback_and_the_graph_goes_on(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    w1 = FakeWorker(client, name="w1").register()
    job = make_job(db, "j", parallelism=2)
    loop.tick()
    loop.tick()
    w1.collect_all()
    committed = committed_epoch(db)
    # w1 writes MV rows for the open epoch, then dies before collecting it
    loop.tick()
    open_epoch = barriers_of(db)[-1].curr_epoch
    with db.transaction() as s:
        mv = get_relation(s, "j_mv")
        storage_of(mv).write(raw_cursor(s), open_epoch, [Version((1, "uncommitted"))])
        storage_of(mv).write(raw_cursor(s), committed, [Version((2, "committed"))])
    w2 = FakeWorker(client, name="w2").register()
    with db.transaction() as s:
        s.execute(
            update(Worker)
            .where(Worker.id == w1.worker_id)
            .values(lease_expires_at=dt.datetime.now(dt.UTC))
        )
    loop.tick()  # expires w1, recovers the graph onto w2
    assert w1.heartbeat() == 410
    assert {a.worker_id for a in actors_of(db, job)} == {w2.worker_id}
    initial = barriers_of(db)[-1]
    assert initial.kind == "initial" and initial.prev_epoch == committed
    with db.engine.connect() as conn:
        mv_rows = conn.execute(text("SELECT id, _epoch FROM store.j_mv")).all()
    assert mv_rows == [(2, committed)]  # rolled back to the committed epoch
    assignments = w2.poll()
    assert all(a["barriers"][0]["kind"] == "initial" for a in assignments)
    assert all(a["restore"] is not None and len(a["restore"]["vnodes"]) == 8 for a in assignments)
    loop.tick()
    w2.collect_all()
    assert committed_epoch(db) == initial.curr_epoch  # continues from the committed epoch
    metrics = client.get("/metrics").text
    assert 'backfill_recoveries_total{graph_id="1",reason="worker lease expired"}' in metrics


def test_failure_report_and_restart_recover(
    manual: tuple[TestClient, MetaLoop], db: Database, fresh_db_url: str
) -> None:
    client, loop = manual
    w = FakeWorker(client).register()
    make_job(db, "j", parallelism=1)
    loop.tick()
    loop.tick()
    w.collect_all()
    assert (
        client.post(f"/v1/workers/{w.worker_id}/failures", json={"message": "boom"}).status_code
        == 202
    )
    loop.tick()
    assert barriers_of(db)[-1].kind == "initial"
    [a] = w.poll()
    assert a["recovery_seq"] == 1
    w.collect_all()
    loop.tick()  # an uncollected barrier in flight when the leader changes
    successor = MetaLoop(Settings(database_url=fresh_db_url, run_barrier_loop=False), db)
    assert successor._try_lead()
    successor.tick()
    assert barriers_of(db)[-1].kind == "initial"
    [a] = w.poll()
    assert a["recovery_seq"] == 2
    successor._drop_lock_conn()


def test_actors_placed_while_no_worker_is_live_wait_for_one_without_a_recovery(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """A job created before any worker registered (the embedded one still starting): its
    actors are not started orphaned (a recovery at once) but wait, with the mutation
    that adds them, while the graph's barriers go on; the first worker to register gets
    them at the next barrier."""
    client, loop = manual
    job = make_job(db, "j", parallelism=2)  # nobody to run it
    loop.tick()
    loop.tick()
    state = "SELECT state, recovery_seq FROM graphs WHERE id = 1"
    with db.engine.connect() as conn:
        assert tuple(conn.execute(text(state)).one()) == ("running", 0)
    assert len(barriers_of(db)) >= 2
    assert not any((b.mutation or {}).get("add") for b in barriers_of(db))
    assert all(a.worker_id is None and a.first_epoch is None for a in actors_of(db, job))
    w = FakeWorker(client).register()
    loop.tick()
    loop.tick()
    assert w.collect_all() >= 2
    with db.engine.connect() as conn:
        assert tuple(conn.execute(text(state)).one()) == ("running", 0)
    assert {a.worker_id for a in actors_of(db, job)} == {w.worker_id}


def test_batched_collects_are_all_or_nothing(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    client, loop = manual
    w = FakeWorker(client).register()
    make_job(db, "j", parallelism=2)
    loop.tick()
    a1, a2 = w.poll()
    [b1], [b2] = a1["barriers"], a2["barriers"]
    good = [
        {
            "actor_id": a["actor_id"],
            "recovery_seq": 0,
            "prev_epoch": b["prev"],
            "curr_epoch": b["curr"],
        }
        for a, b in ((a1, b1), (a2, b2))
    ]
    bad = good[:1] + [good[1] | {"actor_id": 4242, "prev_epoch": 0}]
    url = f"/v1/workers/{w.worker_id}/collects"
    assert_error(client.post(url, json={"collects": bad}), 409, ErrorCode.ACTOR_NOT_ASSIGNED)
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM barrier_collects")).scalar() == 0
    r = client.post(url, json={"collects": good})
    assert [x["status"] for x in r.json()["results"]] == ["accepted", "accepted"]
    assert r.json()["results"][-1]["committed_epoch"] == committed_epoch(db)
    assert barriers_of(db)[0].state == "committed"


def test_a_graph_waiting_for_its_recovery_commits_nothing(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """A rescale replaces a job's actors and asks for a recovery of the graph. Until it
    runs, another job's collect must not commit the epoch the rescaled job never
    finished: its old actors are gone, and its new ones, not started yet, count among
    the barrier's required actors (were they left out, the epoch would be complete)."""
    client, loop = manual
    w = FakeWorker(client).register()
    rescaled = make_job(db, "a", parallelism=2)
    other = make_job(db, "b", parallelism=1)
    for _ in range(2):  # the barriers that add the actors
        loop.tick()
        w.collect_all()
    loop.tick()
    before = committed_epoch(db)
    [b_actor] = [a.id for a in actors_of(db, other)]
    [open_barrier] = next(a for a in w.poll() if a["actor_id"] == b_actor)["barriers"]
    r = client.patch(f"/v1/jobs/{rescaled}", json={"parallelism": 1})
    assert r.status_code == 200, r.text
    assert w.collect(b_actor, open_barrier).status_code == 200
    assert committed_epoch(db) == before
    loop.tick()  # the recovery, from the committed epoch
    assert committed_epoch(db) == before
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM graphs WHERE id = 1")).scalar() == "running"


def test_actors_of_a_rescale_get_no_barrier_before_their_recovery(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """A rescale places the new actors at once, started by the recovery it asks for.
    Until that runs, the barriers in flight belong to the old incarnation: handed to a
    new actor (which has no state to run them with) they made its worker fail, and that
    failure recovered every graph the worker had actors in."""
    client, loop = manual
    w = FakeWorker(client).register()
    job = make_job(db, "j", parallelism=2)
    loop.tick()
    w.collect_all()
    loop.tick()  # a barrier in flight
    r = client.patch(f"/v1/jobs/{job}", json={"parallelism": 3})
    assert r.status_code == 200, r.text
    waiting = w.poll()
    assert sorted(a["actor_id"] for a in waiting) == sorted(a.id for a in actors_of(db, job))
    assert all(a["barriers"] == [] for a in waiting), waiting
    loop.tick()  # the recovery
    started = w.poll()
    assert len(started) == 3
    for a in started:
        assert [b["kind"] for b in a["barriers"]] == ["initial"]
        assert a["restore"] is not None


def test_a_collect_racing_the_deletion_of_its_actor_is_a_409(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """A rescale or a drop deletes actors while a worker collects for them: the collect
    found its actor, then its insert met the deleted row. That was a 500 (a failure of
    the worker, and a recovery of its graphs); it is the 409 a collect for an actor no
    longer there gets, which the worker answers by forgetting the actor."""
    client, loop = manual
    w = FakeWorker(client).register()
    make_job(db, "j", parallelism=1)
    loop.tick()
    w.collect_all()
    loop.tick()
    [a] = w.poll()
    [b] = a["barriers"]
    item = CollectRequest(a["actor_id"], a["recovery_seq"], b["prev"], b["curr"])
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(workers.collect(db, w.worker_id, [item]))
        except Exception as e:  # reported to the test, not lost in the thread
            outcome.append(e)

    with db.engine.connect() as holder:
        # the graph is taken: the collect finds its actor, then waits for the graph
        holder.execute(text("SELECT 1 FROM graphs WHERE id = 1 FOR UPDATE"))
        collecting = threading.Thread(target=run)
        collecting.start()
        wait_for(lambda: _waiting_for_a_lock(db), timeout=30, what="the collect waiting")
        holder.execute(text("DELETE FROM actors WHERE id = :a"), {"a": a["actor_id"]})
        holder.commit()
    collecting.join(timeout=30)
    [error] = outcome
    assert isinstance(error, Conflict), error
    assert error.code == ErrorCode.ACTOR_NOT_ASSIGNED
    assert error.details == {"actor_id": a["actor_id"]}


def _waiting_for_a_lock(db: Database) -> bool:
    with db.engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_pause_and_resume_reach_the_actors_of_their_job_only(
    manual: tuple[TestClient, MetaLoop], db: Database
) -> None:
    """Two jobs of the main graph (issue 30): a pause or a resume names its job's actors,
    and actors a rescale places start from their job's flag in the catalog. The fake
    worker keeps each actor's flag as the executors do (from the job's row when the actor
    starts, then the barriers' mutations): after every barrier it is its job's."""
    client, loop = manual
    w = FakeWorker(client).register()
    jobs = [make_job(db, "a", parallelism=2), make_job(db, "b", parallelism=2)]
    paused: dict[int, bool] = {}  # actor -> its flag on the worker
    job_of: dict[int, int] = {}

    def barrier() -> None:
        loop.tick()
        for a in w.poll():
            actor = a["actor_id"]
            for b in a["barriers"]:
                if b["kind"] == "initial" or actor not in paused:  # (re)started
                    paused[actor], job_of[actor] = a["job"]["paused"], a["job_id"]
                mutation = Mutation.from_json(b["mutation"])
                paused[actor], _ = apply_flow_mutation(actor, mutation, paused[actor], None)
                r = w.collect(actor, b, progress=None)
                assert r.status_code == 200, r.text
        live = {a.id for j in jobs for a in actors_of(db, j)}
        flags = {j: client.get(f"/v1/jobs/{j}").json()["paused"] for j in jobs}
        got = {x: p for x, p in paused.items() if x in live}
        assert got == {x: flags[job_of[x]] for x in got}, flags

    def ask(job: int, what: str) -> None:
        assert client.post(f"/v1/jobs/{job}/{what}").status_code == 200
        barrier()

    barrier()
    barrier()  # each job's actors added by a barrier of their own
    assert set(job_of.values()) == set(jobs)
    a, b = jobs
    ask(a, "pause")
    ask(b, "pause")
    ask(a, "resume")  # b stays paused
    ask(a, "pause")
    # a paused job rescaled: its new actors start paused, then resume with it
    assert client.patch(f"/v1/jobs/{a}", json={"parallelism": 3}).status_code == 200
    barrier()
    assert len([x for x in paused if job_of[x] == a]) == 5  # two before, three now
    ask(a, "resume")
    assert client.patch(f"/v1/jobs/{b}", json={"parallelism": 1}).status_code == 200
    barrier()
    ask(b, "resume")
